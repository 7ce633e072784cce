"""DistributedDataParallel on backend="ringleader": a small model trained for
a few steps on per-rank data; prints a checksum of the final parameters
(every replica must end identical) and how much they moved, and how DDP's
all_reduces reached the backend (asynchronous ones overlap with backward;
blocking ones would run in the autograd thread)."""

import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn

import ringleader.torch

# Which all_reduces torch marks asynchronous (opts.asyncOp) during training.
calls = {"async": 0, "blocking": 0}
_allreduce = ringleader.torch.RingleaderBackend.allreduce


def counting_allreduce(self, tensors, opts=None):
    calls["blocking" if opts is not None and opts.asyncOp is False else "async"] += 1
    return _allreduce(self, tensors, opts)


ringleader.torch.RingleaderBackend.allreduce = counting_allreduce

dist.init_process_group("ringleader")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(1234 + rank)  # different initial weights per rank: DDP must broadcast rank 0's
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
initial = [p.detach().clone() for p in model.parameters()]
ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)  # several buckets
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(99 + rank)  # different data per rank
for step in range(8):
    x = torch.randn(32, 16, generator=gen)
    y = torch.randn(32, 4, generator=gen)
    opt.zero_grad()
    loss = nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
print(f"DDP_ALLREDUCES async {calls['async']} blocking {calls['blocking']}", flush=True)
ringleader.torch.RingleaderBackend.allreduce = _allreduce

params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
digest = hashlib.sha256(params.numpy().tobytes()).hexdigest()[:16]
moved = sum((p.detach() - q).abs().sum().item() for p, q in zip(model.parameters(), initial))
# Cross-check in-band too: the max and min of every parameter over ranks must agree.
hi, lo = params.clone(), params.clone()
dist.all_reduce(hi, op=dist.ReduceOp.MAX)
dist.all_reduce(lo, op=dist.ReduceOp.MIN)
print(f"PARAMS {digest} moved {moved:.4f} identical {bool(torch.equal(hi, lo))}", flush=True)
dist.destroy_process_group()
