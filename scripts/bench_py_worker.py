#!/usr/bin/env python3
"""One rank of scripts/bench_compare.py's Python table (--python): a
collective timed through a Python API on numpy arrays, the way `ringleader
perf` and bench/mpi/rl_mpi_bench.c time it natively.

    --lib ringleader   ringleader's Python package (ffi/python), started by
                       `ringleader launch --nproc-per-node N -- python this.py ...`
    --lib mpi4py       Open MPI through mpi4py, started by `mpirun -np N python this.py ...`

The calls (the form each collective has in ringleader's API; float32, sum):

    op              ringleader (ProcessGroup)    mpi4py (COMM_WORLD)
    all_reduce      pg.all_reduce(buf)           Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    all_gather      pg.all_gather(out, inp)      Allgather(inp, out)
    broadcast       pg.broadcast(buf, root)      Bcast(buf, root=root)
    reduce_scatter  pg.reduce_scatter(out, inp)  Reduce_scatter_block(inp, out, op=MPI.SUM)
    barrier         pg.barrier()                 Barrier()

The method (measure(), shared with scripts/bench_torch_worker.py), per size,
as crates/ringleader-cli/src/perf/bench.rs and rl_mpi_bench.c have it:

 1. buffers allocated and written with zeros (an untouched buffer reads as
    the kernel's shared zero page, which costs no memory bandwidth);
 2. warm-up calls (at least one when the count is adaptive: they estimate
    one call, and the ranks agree on the count through an all_reduce(MAX)
    of the estimate, made with the library measured: about 0.3 s per size,
    5 to 1000);
 3. a barrier, then `iters` timed calls in a Python loop; this rank's mean
    per call, and the slowest rank's (all_reduce MAX) reported;
 4. one checked call on fresh inputs (rank r's element i is
    (r + 1) * 8 + i % 13, so that float sums are exact; broadcast's other
    ranks and every output start at -1), the wrong elements summed over the
    ranks. barrier: one row of size 0, unchecked.

Sizes as `ringleader perf` has them (bench_vs_gloo.shape_of): a size is the
larger buffer, all_gather's its output, reduce_scatter's its input. Rank 0
appends one JSON line per size to --json, with `ringleader perf --json`'s
field names (op, nproc, bytes, count, time_us, wrong, check, lib, ...).
Exit status 1 when a result was wrong (every rank knows: the count is
summed over them), else 0.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_vs_gloo as base  # noqa: E402

OPS = ["all_reduce", "all_gather", "broadcast", "reduce_scatter", "barrier"]
POISON = -1.0


def pattern(np, rank, index):
    """Rank `rank`'s input at `index` (an array of element indices)."""
    return ((rank + 1) * 8 + index % 13).astype(np.float32)


def check(np, op, world, rank, root, count, inp, out):
    """Wrong elements on this rank after the checked call (numpy views of the buffers)."""
    i = np.arange(count, dtype=np.int64)
    ranks_sum = 8 * world * (world + 1) // 2  # sum over r of (r + 1) * 8
    if op == "all_reduce":
        want = (ranks_sum + world * (i % 13)).astype(np.float32)
        return int(np.count_nonzero(inp[:count] != want))
    if op == "broadcast":
        return int(np.count_nonzero(inp[:count] != pattern(np, root, i)))
    if op == "all_gather":
        got = out[:world * count].reshape(world, count)
        return sum(int(np.count_nonzero(got[r] != pattern(np, r, i))) for r in range(world))
    if op == "reduce_scatter":
        want = (ranks_sum + world * ((rank * count + i) % 13)).astype(np.float32)
        return int(np.count_nonzero(out[:count] != want))
    return 0


def measure(lib, args):
    """Times `args.op` at every size through `lib`, rank 0 writing the rows;
    returns the wrong elements over every size and rank.

    `lib` has: rank, world, name (the table's column), version, and
    zeros(n) (a written float32 buffer), view(buf) (a numpy view of it),
    call(op, inp, out, root) (a function making one call), slowest(v) and
    total(v) (v combined over the ranks by MAX and SUM), barrier()."""
    import numpy as np

    op, rank, world = args.op, lib.rank, lib.world
    sizes = [0] if op == "barrier" else base.sizes_of(args)
    out_file = open(args.json, "a") if rank == 0 and args.json else None
    wrong_all = 0
    for nbytes in sizes:
        if op == "barrier":
            in_len = out_len = count = real_bytes = 0
        else:
            shape = base.shape_of(op, nbytes, world)
            if shape is None:
                continue  # no element per rank (all_gather, reduce_scatter of a few bytes on many ranks)
            in_len, out_len, count, real_bytes = shape
        inp, out = lib.zeros(in_len), lib.zeros(out_len)
        call = lib.call(op, inp, out, args.root)

        warm = args.warmup if args.iters else max(args.warmup, 1)
        t = time.perf_counter()
        for _ in range(warm):
            call()
        iters = args.iters or base.adaptive_iters(lib.slowest((time.perf_counter() - t) / max(warm, 1)))
        lib.barrier()
        t = time.perf_counter()
        for _ in range(iters):
            call()
        mine = (time.perf_counter() - t) / iters
        time_s = lib.slowest(mine)

        checked = op != "barrier"
        wrong = None
        if checked:
            vi, vo = lib.view(inp), lib.view(out)
            idx = np.arange(in_len, dtype=np.int64)
            vi[:] = POISON if op == "broadcast" and rank != args.root else pattern(np, rank, idx)
            vo[:] = POISON
            call()
            wrong = int(lib.total(float(check(np, op, world, rank, args.root, count, vi, vo))))
            wrong_all += wrong
        del call, inp, out

        if out_file:
            algbw = real_bytes / time_s / 1e9 if time_s > 0 else 0.0
            in_place = op in ("all_reduce", "broadcast", "barrier")
            out_file.write(json.dumps({
                "op": op, "nproc": world, "bytes": real_bytes, "count": count, "dtype": "f32", "type": "float",
                "redop": "sum" if op in ("all_reduce", "reduce_scatter") else None,
                "root": args.root if op == "broadcast" else None,
                "native": "in_place" if in_place else "out_of_place",
                "time_us": time_s * 1e6, "algbw_GBps": algbw, "busbw_GBps": algbw * base.bus_factor(op, world),
                "wrong": wrong, "check": "unchecked" if not checked else "FAIL" if wrong else "ok",
                "lib": lib.name, "lib_version": lib.version, "api": lib.api, "iters": iters,
                "warmup": args.warmup, "agg_iters": 1, "blocking": True, "average": "max",
            }) + "\n")
            out_file.flush()
    if out_file:
        out_file.close()
    return wrong_all


class NumpyBuffers:
    """numpy float32 buffers, written (np.empty, then filled) before use."""

    def zeros(self, n):
        import numpy as np

        a = np.empty(n, dtype=np.float32)
        a.fill(0.0)
        return a

    def view(self, buf):
        return buf


class Ringleader(NumpyBuffers):
    """ringleader's Python API on numpy arrays."""

    api = "python"

    def __init__(self, name):
        import numpy as np

        import ringleader

        self.np, self.pg = np, ringleader.init()
        self.rank, self.world = self.pg.rank, self.pg.world_size
        self.name = name
        lane = "C lane" if ringleader.NATIVE_LANE else f"ctypes: {ringleader.NATIVE_LANE_MISSING}"
        self.version = f"ringleader {ringleader.version()} (python {sys.version.split()[0]}, numpy {np.__version__}, {lane})"

    def call(self, op, inp, out, root):
        pg = self.pg
        return {
            "all_reduce": lambda: pg.all_reduce(inp),
            "all_gather": lambda: pg.all_gather(out, inp),
            "broadcast": lambda: pg.broadcast(inp, root),
            "reduce_scatter": lambda: pg.reduce_scatter(out, inp),
            "barrier": lambda: pg.barrier(),
        }[op]

    def _combined(self, v, how):
        a = self.np.array([v], dtype=self.np.float64)
        self.pg.all_reduce(a, op=how)
        return float(a[0])

    def slowest(self, v):
        return self._combined(v, "max")

    def total(self, v):
        return self._combined(v, "sum")

    def barrier(self):
        self.pg.barrier()

    def close(self):
        self.pg.destroy()


class Mpi4py(NumpyBuffers):
    """Open MPI through mpi4py on numpy arrays: bench_compare.py's calls
    (the ones its mpi4py table times)."""

    api = "python"

    def __init__(self, name):
        import numpy as np
        from mpi4py import MPI

        import bench_compare

        self.np, self.MPI, self.comm = np, MPI, MPI.COMM_WORLD
        self.rank, self.world = self.comm.Get_rank(), self.comm.Get_size()
        self.name = name
        self._calls = bench_compare.mpi_call
        lib = MPI.Get_library_version().splitlines()[0].split(",")[0].strip()
        self.version = f"{lib} (mpi4py {__import__('mpi4py').__version__}, numpy {np.__version__})"

    def call(self, op, inp, out, root):
        return self._calls(self.comm, self.MPI, op, inp, out, root)

    def _combined(self, v, how):
        out = self.np.zeros(1)
        self.comm.Allreduce(self.np.array([v], dtype=self.np.float64), out, op=how)
        return float(out[0])

    def slowest(self, v):
        return self._combined(v, self.MPI.MAX)

    def total(self, v):
        return self._combined(v, self.MPI.SUM)

    def barrier(self):
        self.comm.Barrier()

    def close(self):
        pass


def add_args(ap):
    """The options a worker takes (bench_compare.py passes them)."""
    ap.add_argument("--op", choices=OPS, required=True)
    ap.add_argument("--root", type=int, default=0)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", help="rank 0 appends one JSON line per size here")
    ap.add_argument("--name", help="the lib field of the rows [default: --lib]")
    base.add_size_args(ap, stepfactor=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", choices=["ringleader", "mpi4py"], required=True)
    add_args(ap)
    args = ap.parse_args()
    base.settle_sizes(ap, args)
    lib = (Ringleader if args.lib == "ringleader" else Mpi4py)(args.name or args.lib)
    try:
        wrong = measure(lib, args)
    finally:
        lib.close()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
