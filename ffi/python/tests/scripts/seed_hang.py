# The seed's "classic hang" (shared/seeds/000_0a088d86c93a4673.txt), with
# backend="ringleader": only rank 0 makes the second all_reduce.
from datetime import timedelta
import torch
import torch.distributed as dist
import ringleader.torch  # noqa: F401  registers backend="ringleader"

# a short timeout turns a silent hang into a loud error you can read
dist.init_process_group(backend="ringleader", timeout=timedelta(seconds=10))
rank = dist.get_rank()

t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {rank}: first all_reduce done")

if rank == 0:                      # THE BUG: only rank 0 makes this call
    dist.all_reduce(t)
    print("rank 0: second all_reduce done")

print(f"rank {rank}: reached the end")
dist.destroy_process_group()
