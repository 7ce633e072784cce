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

That table times ringleader natively (`ringleader perf`) but Open MPI and
gloo through Python (mpi4py, torch), whose per-call cost then counts against
them alone. The native table (--native) has compiled code on every side and
no Python in any timed loop: ringleader through `ringleader perf`
(rl-perf-shm, rl-perf-tcp: --transport shm / tcp) against Open MPI through bench/mpi/rl_mpi_bench.c
under mpirun (ompi-c-sm: `--mca pml ob1 --mca btl self,vader`; ompi-c-tcp:
`--mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo`; ranks not
bound to cores, as ringleader perf's are not). The C program measures as
`ringleader perf` does (written buffers, warm-up, barrier, adaptive
iterations, the slowest rank's mean per call, a checked call on fresh
inputs) and writes the same JSON fields; the size of all_gather is its
output, of reduce_scatter its input. Ops: all_reduce, all_gather, broadcast,
reduce_scatter and barrier (`ringleader perf --op barrier` against
MPI_Barrier: one row of size 0, nothing to check, its time alone compared).
Every (op, nproc, size) is one launch per library, the libraries interleaved
(their order rotated each repeat), --repeats launches each (--interleave
sweep: one launch per (op, nproc) covering every size, fewer launches). The
table shows per cell the median and the [min-max] over the repeats, and

    shm = ompi-c-sm time / rl-perf-shm time
    tcp = ompi-c-tcp time / rl-perf-tcp time      (above 1: ringleader is faster)

Every repeat's row (and a header line and each cell's summary) is appended to
docs/perf/bench_native-<UTC date>-<commit>.jsonl (--raw PATH elsewhere,
--no-raw not at all). The C program is compiled with `mpicc -O2` on first use
(and again when its source is newer) into target/rl_mpi_bench/. Needs no
Python package; needs mpicc and mpirun (apt-get install openmpi-bin
libopenmpi-dev) for the ompi-c libraries.

Examples:
    scripts/bench_compare.py --nproc 2 4 --ops all_reduce all_gather broadcast -e 64M --repeats 5
    scripts/bench_compare.py --libs rl-shm ompi-sm --nproc 2 -e 1M
    scripts/bench_compare.py --nproc 2 4 --sizes 8 1M 64M --repeats 7   # the issue's target points
    scripts/bench_compare.py --native --nproc 2 4 -b 8 -e 64M -f 2 --repeats 5   # the native comparison
    scripts/bench_compare.py --native --nproc 2 --sizes 8 1M --ops all_reduce --repeats 1 --no-raw   # a smoke test
"""

import argparse
import datetime
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_vs_gloo as base  # noqa: E402

LIBS = ["rl-shm", "rl-tcp", "gloo", "ompi-sm", "ompi-tcp"]
NATIVE_LIBS = ["rl-perf-shm", "rl-perf-tcp", "ompi-c-sm", "ompi-c-tcp"]
NATIVE_OPS = ["all_reduce", "all_gather", "broadcast", "reduce_scatter", "barrier"]
MPI_C_SOURCE = os.path.join(base.REPO, "bench", "mpi", "rl_mpi_bench.c")
# Open MPI's transports for the C program. pml ob1 is forced: with UCX
# installed, Open MPI may pick pml ucx, which ignores the btl list.
MPI_BTL_ARGS = {
    "sm": ["--mca", "pml", "ob1", "--mca", "btl", "self,vader"],
    "tcp": ["--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"],
}


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
    code, out, err = base.run_bounded(cmd, f"openmpi-{btl} {op} x{n}", args.timeout,
                                      env=dict(os.environ, OMP_NUM_THREADS="1"))
    if code != 0:
        tail = "\n    ".join((err.strip() or out.strip()).splitlines()[-8:])
        raise RuntimeError(f"openmpi-{btl} {op} x{n}: exited with {code}:\n    {tail}")
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


# ---------------------------------------------------------------- native table


def mpi_c_binary(args):
    """The compiled C benchmark: --mpi-bench, or target/rl_mpi_bench/rl_mpi_bench,
    (re)built with mpicc -O2 when missing or older than its source."""
    if args.mpi_bench:
        if not os.access(args.mpi_bench, os.X_OK):
            sys.exit(f"error: --mpi-bench {args.mpi_bench} is not an executable")
        return args.mpi_bench
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(base.REPO, "target"))
    out = os.path.join(target, "rl_mpi_bench", "rl_mpi_bench")
    if os.access(out, os.X_OK) and os.path.getmtime(out) >= os.path.getmtime(MPI_C_SOURCE):
        return out
    mpicc = shutil.which(args.mpicc)
    if not mpicc:
        sys.exit(f"error: {args.mpicc} not found: the ompi-c libraries need Open MPI's compiler wrapper "
                 "(apt-get install openmpi-bin libopenmpi-dev; or --mpicc PATH, or --libs without ompi-c-*)")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    cmd = [mpicc, "-O2", "-o", out + ".tmp", MPI_C_SOURCE, "-lm"]
    print(f"# building {os.path.relpath(out, base.REPO)}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited with {p.returncode}:\n{p.stderr.strip()}")
    os.replace(out + ".tmp", out)
    return out


def read_json_lines(path):
    rows = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    rows[row["bytes"]] = row
    return rows


def run_mpi_c(args, op, n, btl):
    """One mpirun of the C benchmark: rows by bytes, or raises RuntimeError with its output."""
    with tempfile.TemporaryDirectory(prefix="rl-mpi-c-") as tmp:
        out_json = os.path.join(tmp, "mpi.jsonl")
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(n)]
        if os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
        cmd += MPI_BTL_ARGS[btl] + [args.mpi_bench_path, "--op", op, "--root", str(args.root),
                                    "--json", out_json, "--lib", f"openmpi-c-{btl}"] + base.size_args(args)
        code, out, err = base.run_bounded(cmd, f"ompi-c-{btl} {op} x{n}", args.timeout)
        rows = read_json_lines(out_json)
        # Exit status 1 with rows: a wrong result, counted in the rows.
        if code != 0 and not (code == 1 and rows):
            tail = "\n    ".join((err.strip() or out.strip()).splitlines()[-12:])
            raise RuntimeError(f"ompi-c-{btl} {op} x{n}: exited with {code}:\n    {tail}")
        return rows


def native_runner(lib):
    def rl(transport):
        def run(args, op, n):
            a = argparse.Namespace(**vars(args))
            a.transport = transport
            return base.run_ringleader(a, op, n)
        return run
    return {
        "rl-perf-shm": rl("shm"),
        "rl-perf-tcp": rl("tcp"),
        "ompi-c-sm": lambda a, op, n: run_mpi_c(a, op, n, "sm"),
        "ompi-c-tcp": lambda a, op, n: run_mpi_c(a, op, n, "tcp"),
    }[lib]


def git_commit():
    """The short commit of this tree, with -dirty when tracked files differ from it."""
    def git(*a):
        p = subprocess.run(["git", "-C", base.REPO] + list(a), capture_output=True, text=True)
        return p.stdout.strip() if p.returncode == 0 else None
    commit = git("rev-parse", "--short", "HEAD") or "nogit"
    return commit + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def spread(times):
    """(median, min, max, q1, q3) of one cell's repeats."""
    t = sorted(times)
    q = statistics.quantiles(t, n=4, method="inclusive") if len(t) > 1 else [t[0]] * 3
    return statistics.median(t), t[0], t[-1], q[0], q[2]


def fmt_us(t):
    """A time in microseconds, three digits: 1.49, 13.0, 132, 16.5m (ms), 1.20s."""
    if t is None:
        return "-"
    if t < 1:
        return f"{t:.2f}"
    for scale, unit in ((1, ""), (1e3, "m"), (1e6, "s")):
        if t / scale < 999.5 or unit == "s":
            return format(t / scale, "#.3g").rstrip(".") + unit


def native_main(ap, args):
    libs = args.libs or NATIVE_LIBS
    ops = args.ops or NATIVE_OPS
    if any(lib not in NATIVE_LIBS for lib in libs):
        ap.error(f"--native compares {', '.join(NATIVE_LIBS)}")
    if any(op not in NATIVE_OPS for op in ops):
        ap.error(f"--native measures {', '.join(NATIVE_OPS)}")
    if args.repeats < 1 or any(n < 1 for n in args.nproc):
        ap.error("--repeats and --nproc must be at least 1")
    if any(lib.startswith("ompi-c") for lib in libs):
        if not shutil.which("mpirun"):
            sys.exit("error: mpirun not found: the ompi-c libraries need Open MPI "
                     "(apt-get install openmpi-bin libopenmpi-dev), or --libs without ompi-c-*")
        args.mpi_bench_path = mpi_c_binary(args)
    if any(lib.startswith("rl-perf") for lib in libs):
        if not args.ringleader:
            target = os.environ.get("CARGO_TARGET_DIR", os.path.join(base.REPO, "target"))
            args.ringleader = os.path.join(target, "release", "ringleader")
        if not os.access(args.ringleader, os.X_OK):
            ap.error(f"no ringleader binary at {args.ringleader}: `cargo build --release -p ringleader-cli`")

    start = datetime.datetime.now(datetime.timezone.utc)
    commit = git_commit()
    raw_path = None
    if not args.no_raw:
        raw_path = args.raw or os.path.join(base.REPO, "docs", "perf",
                                            f"bench_native-{start:%Y-%m-%d}-{commit}.jsonl")
        os.makedirs(os.path.dirname(os.path.abspath(raw_path)), exist_ok=True)
    run_id = start.strftime("%Y-%m-%dT%H:%M:%SZ")

    def record(obj):
        if raw_path:
            with open(raw_path, "a") as f:
                f.write(json.dumps(dict(obj, run=run_id), sort_keys=False) + "\n")

    record({"kind": "run", "commit": commit, "argv": sys.argv[1:], "host": socket.gethostname(),
            "cpus": os.cpu_count(), "libs": libs, "ops": ops, "nproc": args.nproc,
            "sizes": base.sizes_of(args), "repeats": args.repeats, "interleave": args.interleave,
            "ringleader": args.ringleader, "mpi_bench": getattr(args, "mpi_bench_path", None),
            "mpi_btl_args": MPI_BTL_ARGS})

    # The launches, in order: libraries interleaved per (op, nproc, size)
    # (or per (op, nproc) with --interleave sweep), their order rotated
    # each repeat so that none always runs first after a switch.
    runs, failures = {}, set()  # (lib, op, n, bytes requested) -> [row per repeat]
    all_sizes = base.sizes_of(args)
    for rep in range(args.repeats):
        order = libs[rep % len(libs):] + libs[:rep % len(libs)]
        for op in ops:
            for n in args.nproc:
                # barrier has no size: both programs run their one row of
                # size 0 whatever sizes they are given, so one launch each.
                groups = [[0]] if op == "barrier" else (
                    [[b] for b in all_sizes] if args.interleave == "size" else [all_sizes])
                for sizes in groups:
                    for lib in order:
                        key = (lib, op, n, tuple(sizes))
                        if key in failures:
                            continue
                        a = argparse.Namespace(**vars(args))
                        a.sizes = sizes
                        what = f"{lib} {op} x{n}" + (f" {sizes[0]} B" if len(sizes) == 1 else "")
                        print(f"# repeat {rep + 1}/{args.repeats}: {what}", file=sys.stderr, flush=True)
                        try:
                            rows = base.run_once(native_runner(lib), a, op, n)
                        except RuntimeError as e:
                            print(f"error: {e}", file=sys.stderr, flush=True)
                            failures.add(key)
                            record({"kind": "failed", "lib": lib, "op": op, "nproc": n, "sizes": sizes,
                                    "repeat": rep + 1, "error": str(e)})
                            continue
                        for b, row in sorted(rows.items()):
                            runs.setdefault((lib, op, n, b), []).append(row)
                            record(dict({"kind": "repeat", "lib_name": lib, "repeat": rep + 1}, **row))

    # One row per (op, nproc, bytes): each library's median and spread.
    table = []
    for op in ops:
        for n in args.nproc:
            for b in sorted({k[3] for k in runs if k[1] == op and k[2] == n}):
                row = {"op": op, "nproc": n, "bytes": b}
                for lib in libs:
                    reps = runs.get((lib, op, n, b))
                    if not reps:
                        row[lib] = None
                        continue
                    times = [r["time_us"] for r in reps]
                    med, lo, hi, q1, q3 = spread(times)
                    algbw = b / (med * 1e-6) / 1e9 if med > 0 and b else 0.0
                    row[lib] = {"time_us": med, "min_us": lo, "max_us": hi, "q1_us": q1, "q3_us": q3,
                                "times_us": times, "busbw_GBps": algbw * base.bus_factor(op, n),
                                "wrong": sum(r.get("wrong") or 0 for r in reps),
                                "lib_version": reps[0].get("lib_version")}
                for name, slow, fast in (("shm", "ompi-c-sm", "rl-perf-shm"), ("tcp", "ompi-c-tcp", "rl-perf-tcp")):
                    a, f = row.get(slow), row.get(fast)
                    row[name] = a["time_us"] / f["time_us"] if a and f and f["time_us"] > 0 else None
                table.append(row)
                record(dict({"kind": "cell"}, **row))

    def cell(c):
        if not c:
            return "-"
        return f"{fmt_us(c['time_us'])} [{fmt_us(c['min_us'])}-{fmt_us(c['max_us'])}]"

    print(f"# native: median [min-max] of {args.repeats} launch(es) per cell, microseconds (m: ms, s: s); "
          f"float32; time per call on the slowest rank; {commit}, {run_id}")
    print("# shm = ompi-c-sm / rl-perf-shm, tcp = ompi-c-tcp / rl-perf-tcp (above 1: ringleader is faster)")
    head = f"{'op':<15}{'n':>3}{'bytes':>10}" + "".join(f"{lib:>24}" for lib in libs)
    head += f"{'shm':>7}{'tcp':>7}  check"
    print(head)
    bad = 0
    for row in table:
        wrong = sum((row.get(lib) or {}).get("wrong", 0) for lib in libs)
        bad += wrong
        line = f"{row['op']:<15}{row['nproc']:>3}{row['bytes']:>10}"
        line += "".join(f"{cell(row.get(lib)):>24}" for lib in libs)
        for name in ("shm", "tcp"):
            line += f"{'-' if row[name] is None else format(row[name], '.2f'):>7}"
        line += "  " + ("ok" if wrong == 0 else f"FAIL ({wrong} wrong)")
        print(line)
    if failures:
        print(f"# failed launches (not repeated): {', '.join(' '.join(map(str, k[:3])) for k in sorted(failures))}")
    if raw_path:
        shown = os.path.relpath(raw_path)
        print(f"# every repeat: {raw_path if shown.startswith('..') else shown}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"rows": table, "repeats": args.repeats, "commit": commit, "run": run_id,
                       "failed": [list(k) for k in sorted(failures)]}, f, indent=1)
    return 1 if failures or bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--ringleader", help="the ringleader binary [default: target/release/ringleader]")
    ap.add_argument("--native", action="store_true",
                    help="the native table: ringleader perf against the C program over Open MPI (above)")
    ap.add_argument("--libs", nargs="+", choices=LIBS + NATIVE_LIBS,
                    help=f"[default: {' '.join(LIBS)}; with --native: {' '.join(NATIVE_LIBS)}]")
    ap.add_argument("--ops", nargs="+", choices=base.OPS + ["barrier"],
                    help="[default: all_reduce all_gather broadcast; with --native: " + " ".join(NATIVE_OPS) + "]")
    ap.add_argument("--op", choices=base.OPS + ["barrier"], help=argparse.SUPPRESS)
    ap.add_argument("--nproc", nargs="+", type=int, default=[2, 4])
    base.add_size_args(ap, stepfactor=8)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--root", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=5, help="runs per (lib, op, nproc); medians reported")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run before it is killed")
    ap.add_argument("--json", dest="json_out", help="write every row (with each repeat's time) here")
    ap.add_argument("--interleave", choices=["size", "sweep"], default="size",
                    help="--native: one launch per (lib, op, nproc, size), or per (lib, op, nproc) [default: size]")
    ap.add_argument("--raw", help="--native: append every repeat here "
                    "[default: docs/perf/bench_native-<UTC date>-<commit>.jsonl]")
    ap.add_argument("--no-raw", action="store_true", help="--native: keep no raw file (smoke tests)")
    ap.add_argument("--mpicc", default="mpicc", help="--native: the compiler for the C program [default: mpicc]")
    ap.add_argument("--mpi-bench", help="--native: a built rl_mpi_bench instead of target/rl_mpi_bench/")
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
    if args.native:
        return native_main(ap, args)
    args.libs = args.libs or LIBS
    args.ops = args.ops or ["all_reduce", "all_gather", "broadcast"]
    if any(lib not in LIBS for lib in args.libs) or "barrier" in args.ops:
        ap.error(f"without --native: --libs from {', '.join(LIBS)}, and no barrier")
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
    if "--mpi-worker" not in sys.argv and "--native" not in sys.argv:
        ensure_venv_python()
    sys.exit(main())
