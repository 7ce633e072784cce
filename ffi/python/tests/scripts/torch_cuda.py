"""backend="ringleader" on CUDA tensors, on a machine with a GPU: every
dtype and reduce op, messages large enough to be chunked and reduced on the
GPU, ordering on the caller's stream (a collective waits for the kernels
queued before it, and kernels queued after it see its result), async work,
CPU and CUDA collectives interleaved in one group, and the ringleader group
behind torch's CUDA backend called directly. Ranks share GPUs when there are
fewer GPUs than ranks. Exits 3 without running anything where CUDA cannot
be used (the pytest side skips before starting it there)."""

import os
import sys

import torch
import torch.distributed as dist

import ringleader
import ringleader.torch  # noqa: F401  registers backend="ringleader"
from _checks import check, run_all

R = N = 0
DEV = None
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
          torch.int64]
BIG = (16 << 20) + 5  # 64 MiB of f32 and 5 more: several staging chunks, a ragged last one


def same(got, want, what=""):
    got = got.cpu()
    want = want.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{tuple(got.shape)}"
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        i = int(bad[0][0]) if bad.numel() else -1
        raise AssertionError(f"{what}: {bad.shape[0]} of {got.numel()} elements differ, first at {i}: "
                             f"{got.flatten()[i].item()} != {want.flatten()[i].item()}")


def pattern(n, scale, dtype=torch.float32):
    """Small integers (exact in every float type's sums), different per element."""
    return ((torch.arange(n, device=DEV) % 61) * scale).to(dtype)


@check
def cuda_is_usable_and_served():
    assert ringleader.cuda_support() is None, ringleader.cuda_support()
    assert "cuda" in dist.Backend.backend_capability["ringleader"], dist.Backend.backend_capability


@check
def all_reduce_every_dtype_and_op():
    tri = N * (N + 1) // 2
    for dt in DTYPES:
        t = torch.full((1003,), R + 1, dtype=dt, device=DEV)
        dist.all_reduce(t)
        same(t, torch.full((1003,), tri, dtype=dt), f"sum {dt}")
    for op, want in ((dist.ReduceOp.MIN, 1.0), (dist.ReduceOp.MAX, float(N)),
                     (dist.ReduceOp.PRODUCT, float(torch.arange(1, N + 1).prod()))):
        t = torch.full((1003,), float(R + 1), device=DEV)
        dist.all_reduce(t, op=op)
        same(t, torch.full((1003,), want), str(op))
    t = torch.full((1003,), 2.0 * (R + 1), device=DEV)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    same(t, torch.full((1003,), N + 1.0), "avg")


@check
def large_all_reduce_is_exact():
    tri = N * (N + 1) // 2
    for dt in (torch.float32, torch.bfloat16, torch.int32):
        t = pattern(BIG, R + 1, dt)
        dist.all_reduce(t)
        same(t, pattern(BIG, tri, dt), f"64 MiB all_reduce {dt}")


@check
def collectives_wait_for_the_stream_and_later_kernels_see_the_result():
    s = torch.cuda.Stream(device=DEV)
    with torch.cuda.stream(s):
        x = torch.zeros(BIG, device=DEV)
        torch.cuda._sleep(100_000_000)  # the fill below lands well after the call was made
        x.fill_(R + 1.0)
        dist.all_reduce(x)
        y = x * 2  # queued after the collective on the same stream
    s.synchronize()
    same(y, torch.full((BIG,), N * (N + 1.0)), "all_reduce on a side stream")
    out = torch.empty(N * 1000, device=DEV)
    inp = torch.empty(1000, device=DEV)
    torch.cuda._sleep(50_000_000)
    inp.fill_(float(R))
    dist.all_gather_into_tensor(out, inp)
    z = out + 1
    same(z, torch.arange(N, device=DEV).repeat_interleave(1000).float() + 1, "all_gather on the current stream")


@check
def all_gather_reduce_scatter_broadcast_reduce_all_to_all():
    n = (1 << 20) + 3
    out = torch.empty(N * n, device=DEV)
    dist.all_gather_into_tensor(out, pattern(n, R + 1))
    same(out, torch.cat([pattern(n, r + 1) for r in range(N)]), "all_gather_into_tensor")
    outs = [torch.empty(7, device=DEV) for _ in range(N)]
    dist.all_gather(outs, torch.full((7,), float(R), device=DEV))
    for r, o in enumerate(outs):
        same(o, torch.full((7,), float(r)), "all_gather list")

    inp = torch.cat([pattern(n, (R + 1) * (j + 1)) for j in range(N)])
    got = torch.empty(n, device=DEV)
    dist.reduce_scatter_tensor(got, inp)
    same(got, pattern(n, N * (N + 1) // 2 * (R + 1)), "reduce_scatter_tensor")

    for root in range(N):
        b = pattern(n, R + 7)
        dist.broadcast(b, src=root)
        same(b, pattern(n, root + 7), f"broadcast from {root}")
    r = pattern(n, R + 1)
    dist.reduce(r, dst=N - 1)
    want = pattern(n, N * (N + 1) // 2) if R == N - 1 else pattern(n, R + 1)
    same(r, want, "reduce")

    a2a_in = torch.cat([torch.full((5,), float(10 * R + j), device=DEV) for j in range(N)])
    a2a_out = torch.empty(5 * N, device=DEV)
    dist.all_to_all_single(a2a_out, a2a_in)
    same(a2a_out, torch.cat([torch.full((5,), float(10 * j + R)) for j in range(N)]), "all_to_all_single")


@check
def async_work_and_send_recv():
    t = torch.full((4096,), float(R + 1), device=DEV)
    w = dist.all_reduce(t, async_op=True)
    assert w.wait()
    same(t, torch.full((4096,), N * (N + 1) / 2), "async all_reduce")
    if R < 2 and N >= 2:
        t = pattern(1000, 3) if R == 0 else torch.zeros(1000, device=DEV)
        (dist.send if R == 0 else dist.recv)(t, 1 - R)
        same(t, pattern(1000, 3), "send/recv")
    dist.barrier()


@check
def cpu_and_cuda_collectives_interleave():
    for i in range(20):
        c = torch.full((33,), float(R + i))
        g = torch.full((33,), float(R - i), device=DEV)
        dist.all_reduce(c)
        dist.all_reduce(g)
        same(c, torch.full((33,), float(N * (N - 1) // 2 + N * i)), f"cpu round {i}")
        same(g, torch.full((33,), float(N * (N - 1) // 2 - N * i)), f"cuda round {i}")


@check
def the_cuda_backend_is_a_ringleader_group():
    backend = dist.group.WORLD._get_backend(torch.device("cuda"))
    assert isinstance(backend, ringleader.torch.RingleaderBackend), type(backend)
    t = torch.full((9,), float(R), device=DEV)
    backend.group.all_reduce(t)
    same(t, torch.full((9,), float(N * (N - 1) // 2)), "direct ringleader all_reduce")
    names = {e["profiling_name"] for e in backend.group.flight_recorder()}
    assert "ringleader:all_reduce" in names, names


def main():
    global R, N, DEV
    if not torch.cuda.is_available() or ringleader.cuda_support() is not None:
        print(f"no CUDA here: {ringleader.cuda_support()}", flush=True)
        sys.exit(3)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    DEV = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(DEV)
    dist.init_process_group("ringleader")
    R, N = dist.get_rank(), dist.get_world_size()
    failed = run_all()
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
