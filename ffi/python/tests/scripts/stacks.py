"""Where a culprit is: rank 1 stays in its own code instead of making the
second all_reduce, and the verdict must show the line it is at, taken from
its stacks. argv[1]: the API (``numpy`` through ``ringleader.init``, or
``torch`` through ``backend="ringleader"``); argv[2]: where rank 1 is:

- ``sleep``: ``time.sleep`` in ``load_batch`` (Python waits in C, the GIL
  released);
- ``native``: libc's ``sleep`` through ``ctypes.CDLL`` in ``read_shard``
  (a native call, the GIL released);
- ``native_gil``: libc's ``sleep`` through ``ctypes.PyDLL`` in
  ``decode_batch`` (a native call that holds the GIL), while a second
  Python thread waits for the GIL.

Every rank prints ``R<rank> READY <time> <pid>`` after the first all_reduce and, on an
error, ``R<rank> ERROR <json>``, then exits 3.
"""

import ctypes
import json
import os
import sys
import threading
import time
from datetime import timedelta

API, WHERE = sys.argv[1], sys.argv[2]
TIMEOUT = float(os.environ.get("TEST_TIMEOUT", "4"))
HOLD = 25  # seconds rank 1 stays away: far beyond the timeout


def say(rank, text):
    # One write per line: the ranks of a launcher share one stdout.
    sys.stdout.flush()
    os.write(1, f"R{rank} {text}\n".encode())


def load_batch():
    time.sleep(HOLD)  # CULPRIT sleep


def read_shard():
    ctypes.CDLL(None).sleep(HOLD)  # CULPRIT native


def decode_batch():
    ctypes.PyDLL(None).sleep(HOLD)  # CULPRIT native_gil


def wants_the_gil():
    # Runs Python: blocked on the GIL while the main thread holds it.
    end = time.monotonic() + HOLD
    while time.monotonic() < end:
        sum(range(100))


def main():
    if API == "torch":
        import torch
        import torch.distributed as dist

        import ringleader.torch  # noqa: F401  (registers backend="ringleader")

        dist.init_process_group("ringleader", timeout=timedelta(seconds=TIMEOUT))
        rank, x, all_reduce = dist.get_rank(), torch.ones(4), dist.all_reduce
    else:
        import numpy as np

        import ringleader

        pg = ringleader.init(timeout=TIMEOUT)
        rank, x, all_reduce = pg.rank, np.ones(4, dtype=np.float32), pg.all_reduce

    all_reduce(x)  # FIRST CALL
    say(rank, f"READY {time.time()} {os.getpid()}")
    try:
        if rank == 1:
            if WHERE == "sleep":
                load_batch()
            elif WHERE == "native":
                read_shard()
            elif WHERE == "native_gil":
                threading.Thread(target=wants_the_gil, daemon=True).start()
                decode_batch()
        all_reduce(x)  # SECOND CALL
    except Exception as e:
        fields = {"cls": type(e).__name__, "kind": getattr(e, "kind", None), "ranks": getattr(e, "ranks", None),
                  "message": str(e), "time": time.time()}
        say(rank, "ERROR " + json.dumps(fields))
        sys.exit(3)
    say(rank, "DONE")


if __name__ == "__main__":
    main()
