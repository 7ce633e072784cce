"""One rank of scripts/soak.py's jobs: a loop of mixed collectives through
``torch.distributed`` with ``backend="ringleader"`` (started by torchrun or
``ringleader launch``).

Modes (argv[1]):
- ``until-failure``: loops until a collective fails, then prints
  ``R<rank> ERROR <json>`` (kind, ranks, wall-clock time) and exits 3;
- ``for SECONDS``: loops for that long, printing ``R<rank> SAMPLE <json>``
  (RSS, open fds, /dev/shm files and bytes) every 15 s, then exits 0.
Every rank prints ``R<rank> PID <pid>`` and, after a warm-up,
``R<rank> READY``.
"""

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import ringleader.torch  # noqa: F401


def say(rank, text):
    sys.stdout.flush()
    os.write(1, f"R{rank} {text}\n".encode())


def sample():
    rss_kb = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    shm = [e for e in os.scandir("/dev/shm")]
    return {
        "rss_kb": rss_kb,
        "fds": len(os.listdir("/proc/self/fd")),
        "shm_files": len(shm),
        "shm_bytes": sum(e.stat().st_blocks * 512 for e in shm if e.is_file(follow_symlinks=False)),
        "time": time.time(),
    }


def main():
    mode = sys.argv[1]
    timeout = float(os.environ.get("SOAK_TIMEOUT", "60"))
    dist.init_process_group(backend="ringleader", timeout=timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    say(rank, f"PID {os.getpid()}")
    big = torch.ones(1 << 18)
    small = torch.ones(8)
    gathered = torch.empty(world * 1024)
    part = torch.empty(1024)
    steps = 0

    def step():
        dist.all_reduce(big)
        dist.all_reduce(small)
        dist.all_gather_into_tensor(gathered, torch.full((1024,), float(rank)))
        dist.broadcast(small, src=steps % world)
        dist.reduce_scatter_tensor(part, torch.ones(world * 1024))
        if steps % 10 == 0:
            dist.barrier()
        big.fill_(1.0)

    end = time.monotonic() + float(sys.argv[2]) if mode == "for" else None
    next_sample = time.monotonic()
    stop = torch.zeros(1)
    try:
        while True:
            if end is not None and steps % 50 == 0:
                # Every rank stops after the same step: rank 0's clock decides.
                stop.fill_(float(rank == 0 and time.monotonic() >= end))
                dist.all_reduce(stop, op=dist.ReduceOp.MAX)
                if stop.item() > 0:
                    break
            step()
            steps += 1
            if steps == 10:
                say(rank, "READY")
            if end is not None and time.monotonic() >= next_sample:
                say(rank, "SAMPLE " + json.dumps(dict(sample(), steps=steps)))
                next_sample += 15
    except dist.DistBackendError as e:
        fields = {"kind": getattr(e, "kind", None), "ranks": getattr(e, "ranks", None),
                  "headline": str(e).splitlines()[0], "time": time.time(), "steps": steps}
        say(rank, "ERROR " + json.dumps(fields))
        os._exit(3)
    say(rank, "SAMPLE " + json.dumps(dict(sample(), steps=steps)))
    say(rank, f"DONE {steps}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
