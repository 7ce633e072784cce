"""Sub-groups under torchrun (4 ranks, backend="ringleader"); argv[1] names
the scenario. Global rank 3 is the culprit wherever there is one, inside
``g = new_group([1, 2, 3])``, where it is group rank 2: every message must
name it as rank 3.

Every rank prints its lines prefixed ``R<rank> `` (torchrun merges the
ranks' output). A rank whose call fails prints ``R<rank> ERROR <json>``,
having caught ``torch.distributed.DistBackendError`` (the type code written
for gloo or NCCL catches), and exits 3.
"""

import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import ringleader.torch  # noqa: F401  (registers backend="ringleader")

TIMEOUT = float(os.environ.get("TEST_TIMEOUT", "20"))


def say(rank, text):
    # One write per line: torchrun's ranks share one stdout, and print()
    # writes the text and the newline separately.
    sys.stdout.flush()
    os.write(1, f"R{rank} {text}\n".encode())


def report(rank, e, t0):
    fields = {
        "cls": type(e).__name__,
        "torch_types": [c.__name__ for c in type(e).__mro__ if c.__module__.startswith("torch")],
        "is_ringleader_error": isinstance(e, ringleader.Error),
        "kind": getattr(e, "kind", None),
        "ranks": getattr(e, "ranks", None),
        "seq": getattr(e, "seq", None),
        "op": getattr(e, "op", None),
        "message": str(e),
        "elapsed": time.monotonic() - t0,
    }
    say(rank, "ERROR " + json.dumps(fields))
    # Exit status 0, not a failure's: torchrun tears the whole job down as
    # soon as one rank fails, which can kill a rank between its verdict and
    # its report (seen in CI under load, even with --monitor-interval=3).
    # The tests read the reports, never the status; the job still ends,
    # every rank leaving on its own.
    os._exit(0)


def concurrent(rank):
    """Two overlapping groups, async collectives in both at once, 20 rounds."""
    g1 = dist.new_group([0, 1, 2])
    g2 = dist.new_group([1, 2, 3])
    rounds = 20
    for i in range(rounds):
        works = []
        if rank in (0, 1, 2):
            t1 = torch.full((1000,), float(rank + i))
            works.append((t1, sum(r + i for r in (0, 1, 2)), dist.all_reduce(t1, group=g1, async_op=True)))
        if rank in (1, 2, 3):
            t2 = torch.full((1000,), float(10 * rank + i))
            works.append((t2, sum(10 * r + i for r in (1, 2, 3)), dist.all_reduce(t2, group=g2, async_op=True)))
        for t, want, w in works:
            w.wait()
            assert torch.all(t == want), f"round {i}: {t[0].item()} != {want}"
    seqs = {}
    for name, g, members in (("g1", g1, (0, 1, 2)), ("g2", g2, (1, 2, 3))):
        if rank in members:
            fr = ringleader.torch.communicator(g).flight_recorder()
            seqs[name] = max(e["collective_seq_id"] for e in fr)
    say(rank, "SEQS " + json.dumps(seqs))


def main():
    scenario = sys.argv[1]
    dist.init_process_group(backend="ringleader", timeout=timedelta(seconds=TIMEOUT))
    rank = dist.get_rank()
    if scenario == "concurrent":
        concurrent(rank)
        dist.destroy_process_group()
        say(rank, "DONE")
        return
    if scenario == "split":
        # split_group: {0, 1} and {2, 3}; global rank 3 (group rank 1 of the
        # second) skips the second all_reduce and leaves.
        g = dist.split_group(split_ranks=[[0, 1], [2, 3]])
        t = torch.full((4,), float(rank))
        dist.all_reduce(t, group=g)
        say(rank, f"SUM {t[0].item():g}")
        t0 = time.monotonic()
        try:
            if rank != 3:
                dist.all_reduce(t, group=g)
        except dist.DistBackendError as e:
            report(rank, e, t0)
        say(rank, "DONE")
        dist.destroy_process_group()
        return
    g = dist.new_group([1, 2, 3])
    t = torch.ones(4)
    if rank in (1, 2, 3):
        dist.all_reduce(t, group=g)
    say(rank, "READY")
    t0 = time.monotonic()
    try:
        if rank == 0:
            pass  # not in the group: nothing to do
        elif scenario == "skip":
            if rank != 3:  # THE BUG: global rank 3 skips this call and leaves
                dist.all_reduce(t, group=g)
        elif scenario == "skip_alive":
            if rank != 3:
                dist.all_reduce(t, group=g)
            else:
                time.sleep(TIMEOUT + 6)  # alive, in its own code
        elif scenario == "mismatch":
            dist.all_reduce(torch.ones(4 if rank != 3 else 5), group=g)
            dist.barrier(group=g)
        elif scenario == "killed":
            if rank == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(t, group=g)
        elif scenario == "monitored":
            if rank == 3:
                time.sleep(8)
            dist.monitored_barrier(group=g, timeout=timedelta(seconds=4), wait_all_ranks=True)
    except dist.DistBackendError as e:
        report(rank, e, t0)
    say(rank, "DONE")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
