"""The seed's classic hang, unchanged but for the backend name.

Run with `ringleader launch --nproc-per-node 2 -- python examples/python/hang_demo.py`
(or torchrun). With gloo, rank 0 waits 30 minutes (or the timeout) and then
reads "Timed out waiting ... for recv operation to complete"; with ringleader it
is told at once that rank 1 never entered all_reduce #2.
"""

from datetime import timedelta

import torch
import torch.distributed as dist

import ringleader.torch  # noqa: F401  (registers backend="ringleader")

dist.init_process_group(backend="ringleader", timeout=timedelta(seconds=10))
rank = dist.get_rank()

t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {rank}: first all_reduce done")

if rank == 0:  # THE BUG: only rank 0 makes this call
    dist.all_reduce(t)
    print("rank 0: second all_reduce done")

print(f"rank {rank}: reached the end")
dist.destroy_process_group()
