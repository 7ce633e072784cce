#!/usr/bin/env python3
"""One rank of scripts/bench_compare.py's torch table (--torch): a
collective timed through torch.distributed on CPU tensors, started by
`torchrun --nproc-per-node N this.py --backend B ...`, with backend
"ringleader" (the package's torch backend, ffi/python/ringleader/torch.py)
or "gloo", the same calls for both (float32, sum):

    all_reduce      dist.all_reduce(buf)                    in place
    all_gather      dist.all_gather_into_tensor(out, inp)   out of place
    broadcast       dist.broadcast(buf, src=root)           in place
    reduce_scatter  dist.reduce_scatter_tensor(out, inp)    out of place
    barrier         dist.barrier()

Buffers are torch.empty(n).zero_() (allocated, then written); the ranks
agree on the iteration count and report the slowest rank through
dist.all_reduce(MAX) of a float64 tensor; everything else (warm-up, barrier,
adaptive count, the checked call on fresh inputs, the JSON rows) is
scripts/bench_py_worker.py's measure(), which the Python table uses too.
torch.set_num_threads(1), as OMP_NUM_THREADS=1 for every other worker.
"""

import argparse
import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_py_worker as common  # noqa: E402
import bench_vs_gloo as base  # noqa: E402


class TorchDist:
    """torch.distributed on CPU float32 tensors, one backend."""

    api = "torch"

    def __init__(self, backend, name, timeout_s):
        import torch
        import torch.distributed as dist

        version = f"torch {torch.__version__}"
        if backend == "ringleader":
            import ringleader
            import ringleader.torch  # noqa: F401  registers backend="ringleader"

            lane = "C++ lane" if ringleader.torch.NATIVE else f"Python path: {ringleader.torch.NATIVE_MISSING}"
            version = f"ringleader {ringleader.version()} ({version}, {lane})"
        else:
            version = f"{backend} ({version})"
        torch.set_num_threads(1)
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        self.torch, self.dist = torch, dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.name, self.version = name, version

    def zeros(self, n):
        return self.torch.empty(n, dtype=self.torch.float32).zero_()

    def view(self, buf):
        return buf.numpy()

    def call(self, op, inp, out, root):
        dist = self.dist
        return {
            "all_reduce": lambda: dist.all_reduce(inp),
            "all_gather": lambda: dist.all_gather_into_tensor(out, inp),
            "broadcast": lambda: dist.broadcast(inp, src=root),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(out, inp),
            "barrier": lambda: dist.barrier(),
        }[op]

    def _combined(self, v, how):
        t = self.torch.tensor([v], dtype=self.torch.float64)
        self.dist.all_reduce(t, op=how)
        return float(t[0])

    def slowest(self, v):
        return self._combined(v, self.dist.ReduceOp.MAX)

    def total(self, v):
        return self._combined(v, self.dist.ReduceOp.SUM)

    def barrier(self):
        self.dist.barrier()

    def close(self):
        self.dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["ringleader", "gloo"], required=True)
    ap.add_argument("--timeout", type=float, default=300.0, help="init_process_group's timeout, seconds")
    common.add_args(ap)
    args = ap.parse_args()
    base.settle_sizes(ap, args)
    lib = TorchDist(args.backend, args.name or args.backend, args.timeout)
    try:
        wrong = common.measure(lib, args)
    finally:
        lib.close()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
