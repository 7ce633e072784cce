# The seed's "finding the culprit by name" (shared/seeds/000_0a088d86c93a4673.txt),
# with backend="ringleader": rank 1 sleeps through the monitored barrier.
from datetime import timedelta
import time
import torch.distributed as dist
import ringleader.torch  # noqa: F401  registers backend="ringleader"

dist.init_process_group(backend="ringleader", timeout=timedelta(seconds=30))
rank = dist.get_rank()

if rank == 1:
    time.sleep(25)          # pretend rank 1 is stuck in a slow dataloader

try:
    dist.monitored_barrier(timeout=timedelta(seconds=5))   # gloo only
except RuntimeError as e:
    print(f"rank {rank}:", str(e).splitlines()[0])
