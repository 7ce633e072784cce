#!/usr/bin/env python3
"""ringleader (shared memory and TCP) vs gloo vs Open MPI, one run, one table.

Extends scripts/bench_vs_gloo.py (whose definitions and runners it reuses)
with ringleader over both of its transports and with Open MPI through
mpi4py, over shared memory (its default `vader`/`sm` BTL) and over TCP
(`--mca btl tcp,self`), where mpirun and mpi4py are installed. Every
(lib, op, nproc) runs --repeats times, interleaved; the table shows MEDIAN
times per call (slowest rank), busbw by nccl-tests' definitions, and ratios:

    shm/gloo  = gloo time / ringleader-shm time
    shm/ompi  = ompi-sm time / ringleader-shm time
    tcp/gloo  = gloo time / ringleader-tcp time
    tcp/ompi  = ompi-tcp time / ringleader-tcp time       (above 1: ringleader is faster)

The MPI side measures like the others: warm-up calls, a barrier, adaptive
iterations agreed through an Allreduce(MAX), this rank's mean per call, the
slowest rank's mean. Float32 numpy arrays; all_reduce, reduce and broadcast
in place (as ringleader and gloo run them), the others out of place.

Examples:
    scripts/bench_compare.py --nproc 2 4 --ops all_reduce all_gather broadcast -e 64M --repeats 5
    scripts/bench_compare.py --libs rl-shm ompi-sm --nproc 2 -e 1M
    scripts/bench_compare.py --nproc 2 4 --sizes 8 1M 64M --repeats 7   # the issue's target points
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_vs_gloo as base  # noqa: E402

LIBS = ["rl-shm", "rl-tcp", "gloo", "ompi-sm", "ompi-tcp"]


def mpi_worker(args):
    """One rank under mpirun; rank 0 prints one JSON line per size."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, world, op = comm.Get_rank(), comm.Get_size(), args.op

    def slowest(v):
        out = np.zeros(1)
        comm.Allreduce(np.array([v]), out, op=MPI.MAX)
        return float(out[0])

    for nbytes in base.sizes_of(args):
        shape = base.shape_of(op, nbytes, world)
        if shape is None:
            continue
        in_len, out_len, count, real_bytes = shape
        # Written, not just allocated: an untouched array reads as the shared
        # zero page, which costs no memory bandwidth (see bench_vs_gloo.py).
        inp = np.ones(in_len, dtype=np.float32)
        out = np.ones(out_len, dtype=np.float32)
        calls = {
            # In place, as ringleader's and gloo's all_reduce and reduce are.
            "all_reduce": lambda: comm.Allreduce(MPI.IN_PLACE, inp, op=MPI.SUM),
            "all_gather": lambda: comm.Allgather(inp, out),
            "reduce_scatter": lambda: comm.Reduce_scatter_block(inp, out, op=MPI.SUM),
            "broadcast": lambda: comm.Bcast(inp, root=args.root),
            "reduce": lambda: (comm.Reduce(MPI.IN_PLACE, inp, op=MPI.SUM, root=args.root) if rank == args.root
                               else comm.Reduce(inp, None, op=MPI.SUM, root=args.root)),
            "all_to_all": lambda: comm.Alltoall(inp, out),
        }
        call = calls[op]
        warm = max(args.warmup, 1)
        t = time.perf_counter()
        for _ in range(warm):
            call()
        est = (time.perf_counter() - t) / warm
        iters = args.iters or base.adaptive_iters(slowest(est))
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(iters):
            call()
        time_s = slowest((time.perf_counter() - t) / iters)
        if rank == 0:
            algbw = real_bytes / time_s / 1e9
            print(json.dumps({
                "op": op, "nproc": world, "bytes": real_bytes, "count": count, "dtype": "f32",
                "time_us": time_s * 1e6, "algbw_GBps": algbw, "busbw_GBps": algbw * base.bus_factor(op, world),
                "iters": iters, "lib": "openmpi", "lib_version": MPI.Get_library_version().splitlines()[0][:40],
            }), flush=True)


def run_mpi(args, op, n, btl):
    """One mpirun: rows by bytes, or raises RuntimeError with its output."""
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n)]
    if btl == "tcp":
        cmd += ["--mca", "btl", "tcp,self"]
    cmd += [sys.executable, os.path.abspath(__file__), "--mpi-worker", "--op", op,
            "--root", str(args.root)] + base.size_args(args)
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        out, err = p.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        base.kill_group(p)
        p.wait()
        raise RuntimeError(f"openmpi-{btl} {op} x{n}: still running after {args.timeout:.0f} s; killed")
    if p.returncode != 0:
        tail = "\n    ".join((err.strip() or out.strip()).splitlines()[-8:])
        raise RuntimeError(f"openmpi-{btl} {op} x{n}: exited with {p.returncode}:\n    {tail}")
    return {r["bytes"]: r for r in map(json.loads, filter(None, out.splitlines()))}


def runner(lib):
    def rl(transport):
        def run(args, op, n):
            args.transport = transport
            return base.run_ringleader(args, op, n)
        return run
    return {
        "rl-shm": rl("shm"),
        "rl-tcp": rl("tcp"),
        "gloo": base.run_gloo,
        "ompi-sm": lambda a, op, n: run_mpi(a, op, n, "sm"),
        "ompi-tcp": lambda a, op, n: run_mpi(a, op, n, "tcp"),
    }[lib]


def mpi_available():
    if not shutil.which("mpirun"):
        return "mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev; pip install mpi4py)"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed in this python (pip install mpi4py)"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--ringleader", help="the ringleader binary [default: target/release/ringleader]")
    ap.add_argument("--libs", nargs="+", choices=LIBS, default=LIBS)
    ap.add_argument("--ops", nargs="+", choices=base.OPS, default=["all_reduce", "all_gather", "broadcast"])
    ap.add_argument("--op", choices=base.OPS, help=argparse.SUPPRESS)
    ap.add_argument("--nproc", nargs="+", type=int, default=[2, 4])
    base.add_size_args(ap, stepfactor=8)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--root", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=5, help="runs per (lib, op, nproc); medians reported")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run before it is killed")
    ap.add_argument("--json", dest="json_out", help="write every row (with each repeat's time) here")
    ap.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gloo-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    base.settle_sizes(ap, args)
    args.transport = "auto"
    if args.mpi_worker:
        mpi_worker(args)
        return 0
    if args.gloo_worker:
        base.gloo_worker(args)
        return 0
    libs = list(args.libs)
    why = mpi_available()
    if why and any(lib.startswith("ompi") for lib in libs):
        print(f"note: skipping Open MPI: {why}", file=sys.stderr)
        libs = [lib for lib in libs if not lib.startswith("ompi")]
    if any(lib.startswith("rl") for lib in libs):
        if not args.ringleader:
            target = os.environ.get("CARGO_TARGET_DIR", os.path.join(base.REPO, "target"))
            args.ringleader = os.path.join(target, "release", "ringleader")
        if not os.access(args.ringleader, os.X_OK):
            ap.error(f"no ringleader binary at {args.ringleader}: `cargo build --release -p ringleader-cli`")

    rows, failures = base.run_and_collect(args, libs, {lib: runner(lib) for lib in libs})

    def t(row, lib):
        return row[lib]["time_us"] if row.get(lib) else None

    def ratio(row, slow, fast):
        a, b = t(row, slow), t(row, fast)
        return None if a is None or not b else a / b

    shown = [lib for lib in LIBS if lib in libs]
    print(f"# median of {args.repeats} run(s); float32; time_us = mean per call on the slowest rank; "
          "ratios above 1: ringleader is faster")
    head = f"{'op':<15}{'n':>3}{'bytes':>10}" + "".join(f"{lib + ' us':>13}" for lib in shown)
    head += "".join(f"{lib + ' bw':>12}" for lib in shown)
    head += f"{'shm/gloo':>10}{'shm/ompi':>10}{'tcp/gloo':>10}{'tcp/ompi':>10}  check"
    print(head)
    for row in rows:
        wrong = sum((row.get(lib) or {}).get("wrong", 0) for lib in ("rl-shm", "rl-tcp"))
        line = f"{row['op']:<15}{row['nproc']:>3}{row['bytes']:>10}"
        line += "".join(f"{base.fmt_time(t(row, lib)):>13}" for lib in shown)
        line += "".join(f"{base.fmt_bw(row[lib] and row[lib]['busbw_GBps']):>12}" for lib in shown)
        for slow, fast in (("gloo", "rl-shm"), ("ompi-sm", "rl-shm"), ("gloo", "rl-tcp"), ("ompi-tcp", "rl-tcp")):
            r = ratio(row, slow, fast) if slow in libs and fast in libs else None
            line += f"{'-' if r is None else format(r, '.2f'):>10}"
        line += "  " + ("ok" if wrong == 0 else f"FAIL ({wrong} wrong)")
        print(line)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"rows": rows, "repeats": args.repeats, "failed": [list(k) for k in failures]}, f, indent=1)
    bad = any((row.get(lib) or {}).get("wrong") for row in rows for lib in ("rl-shm", "rl-tcp"))
    return 1 if failures or bad else 0


def ensure_venv_python():
    """Re-runs this script with the shared venv's python (torch, mpi4py) when
    they are missing here."""
    try:
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    venv = os.environ.get("RINGLEADER_VENV", os.path.expanduser("~/.cache/ringleader/venv"))
    py = os.path.join(venv, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv) or not os.access(py, os.X_OK):
        sys.exit(f"error: torch is not importable and no venv python at {py} (set RINGLEADER_VENV)")
    os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])


if __name__ == "__main__":
    if "--mpi-worker" not in sys.argv:
        ensure_venv_python()
    sys.exit(main())
