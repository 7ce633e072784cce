"""A job that runs all_reduces in a loop until a rank is killed from outside
(the test sends SIGKILL to the rank it reads from a ``PID`` line). Each
survivor catches the failure as torch.distributed.DistBackendError and prints
``R<rank> ERROR <json>`` with the wall-clock time it arrived, then exits 3.

Started by torchrun or by hand (RANK=... python rank_death.py); argv[1]:
``torch`` (backend="ringleader") or ``numpy`` (ringleader's own API).
"""

import json
import os
import sys
import time


def say(rank, text):
    sys.stdout.flush()
    os.write(1, f"R{rank} {text}\n".encode())


def main():
    api = sys.argv[1]
    if api == "torch":
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        import ringleader.torch  # noqa: F401

        dist.init_process_group(backend="ringleader", timeout=timedelta(seconds=60))
        rank = dist.get_rank()
        t = torch.ones(1 << 16)
        step = lambda: dist.all_reduce(t)  # noqa: E731
        caught = dist.DistBackendError
    else:
        import numpy as np

        import ringleader

        pg = ringleader.init(timeout=60)
        rank = pg.rank
        x = np.ones(1 << 16, dtype=np.float32)
        step = lambda: pg.all_reduce(x)  # noqa: E731
        caught = ringleader.Error
    say(rank, f"PID {os.getpid()}")
    n = 0
    try:
        while True:
            step()
            n += 1
            if n == 20:
                say(rank, "READY")
    except caught as e:
        fields = {"kind": getattr(e, "kind", None), "ranks": getattr(e, "ranks", None),
                  "message": str(e), "time": time.time(), "steps": n}
        say(rank, "ERROR " + json.dumps(fields))
        os._exit(3)


if __name__ == "__main__":
    main()
