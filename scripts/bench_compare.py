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

Under each table, one `# stable (LIB)` line per library: how many of its
cells from 1 MiB up have every launch within 1.5x of the fastest, and the
spread of those that do not (issue 20's third item; with --from-raw
--state, within one VM state).

Two more like-for-like tables measure the same ops and sizes the same way
(written buffers, warm-up, a barrier, adaptive iterations agreed through an
all_reduce(MAX) of the estimate, each rank's mean per call in a Python loop,
the slowest rank's reported, one checked call on fresh inputs: the method of
scripts/bench_py_worker.py's measure(), which both use), with Python on both
sides of each:

  --python  ringleader's Python API on numpy arrays
            (scripts/bench_py_worker.py --lib ringleader, under `ringleader
            launch --nproc-per-node N`; rl-py-shm, rl-py-tcp:
            RINGLEADER_TRANSPORT=shm / tcp) against Open MPI through mpi4py
            (--lib mpi4py, the calls of this script's mpi4py table, under
            mpirun with the native table's options; ompi-py-sm, ompi-py-tcp).
            Calls: pg.all_reduce(buf) / Allreduce(IN_PLACE, buf, SUM),
            pg.all_gather(out, inp) / Allgather(inp, out),
            pg.broadcast(buf, root) / Bcast(buf, root),
            pg.reduce_scatter(out, inp) / Reduce_scatter_block(inp, out, SUM),
            pg.barrier() / Barrier().
                shm = ompi-py-sm / rl-py-shm, tcp = ompi-py-tcp / rl-py-tcp
  --torch   torch.distributed on CPU tensors under `torchrun --nproc-per-node
            N` (scripts/bench_torch_worker.py), backend "ringleader"
            (rl-torch-shm, rl-torch-tcp) against "gloo" (gloo-torch), the
            same calls for both: dist.all_reduce(buf),
            dist.all_gather_into_tensor(out, inp), dist.broadcast(buf, src),
            dist.reduce_scatter_tensor(out, inp), dist.barrier().
                shm = gloo-torch / rl-torch-shm, tcp = gloo-torch / rl-torch-tcp

The ringleader side of both runs the source tree's package (ffi/python, put
first on PYTHONPATH) with $RINGLEADER_LIBRARY, else the built
target/release/libringleader.so: no install needed. --native, --python and
--torch combine: one invocation runs every table asked for, each repeat
running each table's launches in turn, and prints the tables one after the
other, in the same format.

Every repeat's row (and a header line and each cell's summary, each with
its table's name) is appended to
docs/perf/bench_native-<UTC date>-<commit>.jsonl (--raw PATH elsewhere,
--no-raw not at all). The C program is compiled with `mpicc -O2` on first use
(and again when its source is newer) into target/rl_mpi_bench/. --native
needs no Python package; it needs mpicc and mpirun (apt-get install
openmpi-bin libopenmpi-dev) for the ompi-c libraries. --python needs numpy
and mpi4py (pip install mpi4py) in the venv, --torch torch and torchrun;
both run their workers on the venv's python.

Examples:
    scripts/bench_compare.py --nproc 2 4 --ops all_reduce all_gather broadcast -e 64M --repeats 5
    scripts/bench_compare.py --libs rl-shm ompi-sm --nproc 2 -e 1M
    scripts/bench_compare.py --nproc 2 4 --sizes 8 1M 64M --repeats 7   # the issue's target points
    scripts/bench_compare.py --native --nproc 2 4 -b 8 -e 64M -f 2 --repeats 5   # the native comparison
    scripts/bench_compare.py --native --nproc 2 --sizes 8 1M --ops all_reduce --repeats 1 --no-raw   # a smoke test
    scripts/bench_compare.py --native --python --torch --nproc 2 4 --sizes 8 4K 1M 64M --repeats 5   # all three tables
    scripts/bench_compare.py --python --torch --nproc 2 --sizes 8 4K --repeats 1 --interleave sweep --no-raw   # smoke
    scripts/bench_compare.py --from-raw docs/perf/bench_native-2026-12-02-53fb81f.jsonl   # a kept run's tables again
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


def mpi_call(comm, MPI, op, inp, out, root):
    """One call of `op` through mpi4py on numpy arrays, as a function: the
    calls of this script's mpi4py table and of the Python table's mpi4py
    side (scripts/bench_py_worker.py)."""
    rank = comm.Get_rank()
    calls = {
        # In place, as ringleader's and gloo's all_reduce and reduce are.
        "all_reduce": lambda: comm.Allreduce(MPI.IN_PLACE, inp, op=MPI.SUM),
        "all_gather": lambda: comm.Allgather(inp, out),
        "reduce_scatter": lambda: comm.Reduce_scatter_block(inp, out, op=MPI.SUM),
        "broadcast": lambda: comm.Bcast(inp, root=root),
        "reduce": lambda: (comm.Reduce(MPI.IN_PLACE, inp, op=MPI.SUM, root=root) if rank == root
                           else comm.Reduce(inp, None, op=MPI.SUM, root=root)),
        "all_to_all": lambda: comm.Alltoall(inp, out),
        "barrier": lambda: comm.Barrier(),
    }
    return calls[op]


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
        call = mpi_call(comm, MPI, op, inp, out, args.root)
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
    target = base.target_dir()
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


# ---------------------------------------------------------------- Python and torch tables


PY_LIBS = ["rl-py-shm", "rl-py-tcp", "ompi-py-sm", "ompi-py-tcp"]
TORCH_LIBS = ["rl-torch-shm", "rl-torch-tcp", "gloo-torch"]
PY_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_py_worker.py")
TORCH_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_torch_worker.py")
# The like-for-like tables: their libraries, in column order, and their
# ratio columns (name, the other library, ringleader).
TABLES = {
    "native": {"libs": NATIVE_LIBS, "ratios": (("shm", "ompi-c-sm", "rl-perf-shm"), ("tcp", "ompi-c-tcp", "rl-perf-tcp")),
               "what": "ringleader perf (Rust) against bench/mpi/rl_mpi_bench.c (C) on Open MPI, under mpirun"},
    "python": {"libs": PY_LIBS, "ratios": (("shm", "ompi-py-sm", "rl-py-shm"), ("tcp", "ompi-py-tcp", "rl-py-tcp")),
               "what": "ringleader's Python API (ringleader launch) against mpi4py on Open MPI (mpirun), "
                       "numpy arrays"},
    "torch": {"libs": TORCH_LIBS, "ratios": (("shm", "gloo-torch", "rl-torch-shm"), ("tcp", "gloo-torch", "rl-torch-tcp")),
              "what": "torch.distributed, backend \"ringleader\" against \"gloo\" (torchrun), CPU tensors"},
}
# What a launched Python rank must not inherit from this process's
# environment (were it started by a launcher itself).
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
               "RINGLEADER_STORE_ADDR", "RINGLEADER_RUN_ID", "TORCHELASTIC_RUN_ID")


def worker_env(extra=None):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def ringleader_python(ap):
    """Where the ringleader package and its library come from: the source
    tree's package (ffi/python, put first on PYTHONPATH, so that it wins over
    a copy installed in the venv, whose commit nobody recorded) with
    $RINGLEADER_LIBRARY, else the built target/release/libringleader.so, else
    a library next to the package; no build or install is needed. Returns
    (the environment to add, the package's folder, the library)."""
    root = os.path.join(base.REPO, "ffi", "python")
    pkg = os.path.join(root, "ringleader")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    library = os.environ.get("RINGLEADER_LIBRARY")
    if library:
        if not os.path.exists(library):
            ap.error(f"RINGLEADER_LIBRARY={library} does not exist")
    else:
        target = base.target_dir()
        built = os.path.join(target, "release", "libringleader.so")
        library = built if os.path.exists(built) else os.path.join(pkg, "libringleader.so")
        if not os.path.exists(library):
            ap.error(f"no libringleader.so at {built} nor in {pkg}: `cargo build --release -p ringleader-ffi`, "
                     "or set RINGLEADER_LIBRARY")
    env["RINGLEADER_LIBRARY"] = library
    return env, pkg, library


def run_launched(cmd, label, args, env, out_json):
    """One launch of a worker whose rank 0 appends rows to `out_json`: rows
    by bytes, or raises RuntimeError with the launch's output."""
    code, out, err = base.run_bounded(cmd, label, args.timeout, env=env)
    rows = read_json_lines(out_json)
    # A nonzero exit with rows that counted wrong elements: the workers exit
    # 1 on a wrong result, which the rows carry (the check column).
    if code != 0 and not (rows and any(r.get("wrong") for r in rows.values())):
        tail = "\n    ".join((err.strip() + "\n" + out.strip()).strip().splitlines()[-16:])
        raise RuntimeError(f"{label}: exited with {code}:\n    {tail}")
    return rows


def worker_args(args, op, lib, out_json):
    return ["--op", op, "--root", str(args.root), "--json", out_json, "--name", lib] + base.size_args(args)


def run_py(args, op, n, lib):
    """One launch of scripts/bench_py_worker.py for `lib` (PY_LIBS)."""
    with tempfile.TemporaryDirectory(prefix="rl-bench-py-") as tmp:
        out_json = os.path.join(tmp, "rows.jsonl")
        if lib.startswith("rl-py"):
            cmd = [args.ringleader, "launch", "--nproc-per-node", str(n), "--",
                   sys.executable, PY_WORKER, "--lib", "ringleader"]
            env = worker_env(dict(args.rl_python_env, RINGLEADER_TRANSPORT=lib.rsplit("-", 1)[1]))
        else:
            cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(n)]
            if os.geteuid() == 0:
                cmd.insert(1, "--allow-run-as-root")
            cmd += MPI_BTL_ARGS[lib.rsplit("-", 1)[1]] + [sys.executable, PY_WORKER, "--lib", "mpi4py"]
            env = worker_env()
        return run_launched(cmd + worker_args(args, op, lib, out_json), f"{lib} {op} x{n}", args, env, out_json)


def run_torch(args, op, n, lib):
    """One torchrun launch of scripts/bench_torch_worker.py for `lib` (TORCH_LIBS)."""
    with tempfile.TemporaryDirectory(prefix="rl-bench-torch-") as tmp:
        out_json = os.path.join(tmp, "rows.jsonl")
        backend = "gloo" if lib == "gloo-torch" else "ringleader"
        env = worker_env() if backend == "gloo" else worker_env(
            dict(args.rl_python_env, RINGLEADER_TRANSPORT=lib.rsplit("-", 1)[1]))
        cmd = [args.torchrun, "--nproc-per-node", str(n), "--master-addr", "127.0.0.1",
               "--master-port", str(base.free_port()), TORCH_WORKER, "--backend", backend,
               "--timeout", str(max(10.0, args.timeout - 10))]
        return run_launched(cmd + worker_args(args, op, lib, out_json), f"{lib} {op} x{n}", args, env, out_json)


def like_runner(lib):
    if lib in NATIVE_LIBS:
        return native_runner(lib)
    if lib in PY_LIBS:
        return lambda a, op, n: run_py(a, op, n, lib)
    return lambda a, op, n: run_torch(a, op, n, lib)


def importable(name):
    import importlib.util

    return importlib.util.find_spec(name) is not None


def find_ringleader(ap, args):
    """The ringleader binary: --ringleader as given, else this tree's, built
    first with its library (as the Python tests build them), so that the
    rows labelled with this tree's commit were measured with its code and
    not with an older build left in target/."""
    if args.ringleader:
        if not os.access(args.ringleader, os.X_OK):
            ap.error(f"no ringleader binary at {args.ringleader}")
        return
    target = base.target_dir()
    args.ringleader = os.path.join(target, "release", "ringleader")
    if shutil.which("cargo"):
        # The library too: the Python and torch tables load target/release's
        # libringleader.so.
        base.build_ringleader(["ringleader-ffi", "ringleader-cli"])
    if not os.access(args.ringleader, os.X_OK):
        ap.error(f"no ringleader binary at {args.ringleader}: `cargo build --release -p ringleader-cli`")


def prepare_tables(ap, args, tables):
    """Checks what the tables' libraries need and finds it (binaries, the C
    program, the Python packages); exits naming what is missing."""
    libs = [lib for t in tables.values() for lib in t]
    if any(lib.startswith("rl-") for lib in libs):
        find_ringleader(ap, args)
    if any(lib.startswith("ompi-") for lib in libs) and not shutil.which("mpirun"):
        sys.exit("error: mpirun not found: the ompi libraries need Open MPI "
                 "(apt-get install openmpi-bin libopenmpi-dev), or --libs without ompi-*")
    if any(lib.startswith("ompi-c") for lib in libs):
        args.mpi_bench_path = mpi_c_binary(args)
    if "python" in tables or "torch" in tables:
        if not importable("numpy"):
            sys.exit(f"error: numpy is not importable in {sys.executable} (the venv: pip install numpy)")
    if any(lib.startswith("ompi-py") for lib in libs) and not importable("mpi4py"):
        sys.exit(f"error: mpi4py is not importable in {sys.executable}: `{sys.executable} -m pip install mpi4py` "
                 "(needs mpicc), or --libs without ompi-py-*")
    if "torch" in tables:
        if not importable("torch"):
            sys.exit(f"error: torch is not importable in {sys.executable} (set RINGLEADER_VENV)")
        args.torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        if not os.access(args.torchrun, os.X_OK):
            args.torchrun = shutil.which("torchrun")
            if not args.torchrun:
                sys.exit(f"error: no torchrun next to {sys.executable} nor on PATH")
    args.rl_python_env, args.rl_python = {}, None
    if any(lib.startswith(("rl-py", "rl-torch")) for lib in libs):
        env, pkg, library = ringleader_python(ap)
        args.rl_python_env = env
        args.rl_python = {"package": pkg, "library": library, "env": env}
        print(f"# ringleader's Python package: {pkg}, library {library}", file=sys.stderr, flush=True)
        compiled_lanes(pkg, any(lib.startswith("rl-torch") for lib in libs))


# The VM's state per launch: on the 2-vCPU development VM a cache line's
# round trip between the two vCPUs is about 35-190 ns in some minutes and
# 290-570 ns in others (docs/perf/by-state-2026-12-07.md), and small-message
# times follow it. --vcpu-probe measures it (docs/perf/core_pair_latency.c,
# vCPUs 0 and 1) right before and right after every launch and keeps both
# in the launch's raw rows; --from-raw --state picks the launches of one
# state.
APART_NS = 200.0
PROBE_SOURCE = os.path.join(base.REPO, "docs", "perf", "core_pair_latency.c")


def build_probe():
    """The round-trip probe, built into target/ when missing or older than its source."""
    out = os.path.join(base.target_dir(), "core_pair_latency", "core_pair_latency")
    if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(PROBE_SOURCE):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        subprocess.run(["gcc", "-O2", "-o", out, PROBE_SOURCE, "-lpthread"], check=True)
    return out


def probe(binary):
    """vCPU 0 <-> 1 round trip now, ns (mean of 100,000)."""
    return float(subprocess.run([binary, "100000"], capture_output=True, text=True, check=True, timeout=60).stdout)


def state_of(before_ns, after_ns):
    """"near" (both probes under APART_NS), "apart" (both over), or None: the
    state changed around the launch, or it was not probed."""
    if before_ns is None or after_ns is None:
        return None
    lo, hi = min(before_ns, after_ns), max(before_ns, after_ns)
    return "near" if hi < APART_NS else "apart" if lo >= APART_NS else None


def compiled_lanes(pkg, torch):
    """Builds the package's compiled lanes into the source tree's package
    when one is missing or older than its source (an installed package has
    them from pip; the tree has them only once built in place): the numpy
    API's C lane (_native.c) and, with ``torch``, the torch backend's C++
    lane. A failed build is said and those rows then run the ctypes or
    Python path, which each row's version names."""
    import glob

    wanted = [("_native.c", "_native*.so")] + ([("_torch_native.cpp", "_torch_native*.so")] if torch else [])
    stale = [name for name, pattern in wanted
             if not [p for p in glob.glob(os.path.join(pkg, pattern))
                     if os.path.getmtime(p) >= os.path.getmtime(os.path.join(pkg, name))]]
    if not stale:
        return
    print(f"# building {', '.join(stale)} in place (the C++ lane about 35 s)", file=sys.stderr, flush=True)
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=os.path.dirname(pkg),
                       capture_output=True, text=True)
    missing = [name for name, pattern in wanted if not glob.glob(os.path.join(pkg, pattern))]
    if r.returncode != 0 or missing:
        print(f"# warning: {', '.join(missing) or 'a lane'} did not build; those rows run the ctypes or Python path:\n"
              f"{r.stdout[-2000:]}{r.stderr[-2000:]}", file=sys.stderr, flush=True)


def like_main(ap, args):
    """The like-for-like tables asked for (--native, --python, --torch), in
    one invocation: their launches interleaved, one raw file."""
    names = [t for t in TABLES if getattr(args, t)]
    every = [lib for t in names for lib in TABLES[t]["libs"]]
    if args.libs:
        stray = [lib for lib in args.libs if lib not in every]
        if stray:
            ap.error(f"--libs {' '.join(stray)}: not in the tables asked for ({', '.join(names)}: {' '.join(every)})")
    tables = {t: [lib for lib in TABLES[t]["libs"] if not args.libs or lib in args.libs] for t in names}
    for t, libs in tables.items():
        if not libs:
            ap.error(f"--libs leaves the {t} table nothing to run (its libraries: {' '.join(TABLES[t]['libs'])})")
    ops = args.ops or NATIVE_OPS
    if any(op not in NATIVE_OPS for op in ops):
        ap.error(f"--{'/--'.join(names)} measure{'s' if len(names) == 1 else ''} {', '.join(NATIVE_OPS)}")
    if args.repeats < 1 or any(n < 1 for n in args.nproc):
        ap.error("--repeats and --nproc must be at least 1")
    prepare_tables(ap, args, tables)

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
            "cpus": os.cpu_count(), "tables": tables, "libs": [lib for t in tables.values() for lib in t],
            "ops": ops, "nproc": args.nproc, "sizes": base.sizes_of(args), "repeats": args.repeats,
            "interleave": args.interleave, "ringleader": args.ringleader,
            "mpi_bench": getattr(args, "mpi_bench_path", None), "mpi_btl_args": MPI_BTL_ARGS,
            "python": sys.executable if set(tables) - {"native"} else None,
            "torchrun": getattr(args, "torchrun", None), "rl_python": args.rl_python,
            "vcpu_probe": bool(args.vcpu_probe)})

    # The launches, in order: each repeat runs every table; in a table the
    # libraries are interleaved per (op, nproc, size) (or per (op, nproc)
    # with --interleave sweep), their order rotated each repeat so that
    # none always runs first after a switch.
    runs, failures = {}, set()  # (table, lib, op, n, bytes requested) -> [row per repeat]
    probe_bin = build_probe() if args.vcpu_probe else None
    all_sizes = base.sizes_of(args)
    for rep in range(args.repeats):
        for t, libs in tables.items():
            order = libs[rep % len(libs):] + libs[:rep % len(libs)]
            for op in ops:
                for n in args.nproc:
                    # barrier has no size: every program runs its one row of
                    # size 0 whatever sizes it is given, so one launch each.
                    groups = [[0]] if op == "barrier" else (
                        [[b] for b in all_sizes] if args.interleave == "size" else [all_sizes])
                    for sizes in groups:
                        for lib in order:
                            key = (t, lib, op, n, tuple(sizes))
                            if key in failures:
                                continue
                            a = argparse.Namespace(**vars(args))
                            a.sizes = sizes
                            what = f"{lib} {op} x{n}" + (f" {sizes[0]} B" if len(sizes) == 1 else "")
                            print(f"# repeat {rep + 1}/{args.repeats}: {what}", file=sys.stderr, flush=True)
                            before = probe(probe_bin) if probe_bin else None
                            try:
                                rows = base.run_once(like_runner(lib), a, op, n)
                            except RuntimeError as e:
                                print(f"error: {e}", file=sys.stderr, flush=True)
                                failures.add(key)
                                record({"kind": "failed", "table": t, "lib": lib, "op": op, "nproc": n,
                                        "sizes": sizes, "repeat": rep + 1, "error": str(e)})
                                continue
                            if probe_bin:
                                after = probe(probe_bin)
                                for row in rows.values():
                                    row.update(probe_before_ns=before, probe_after_ns=after)
                            for b, row in sorted(rows.items()):
                                runs.setdefault((t, lib, op, n, b), []).append(row)
                                record(dict({"kind": "repeat", "table": t, "lib_name": lib, "repeat": rep + 1}, **row))

    return summarize(args, ops, tables, runs, failures, commit, run_id, raw_path, record)


def summarize(args, ops, tables, runs, failures, commit, run_id, raw_path, record):
    """Per table, one row per (op, nproc, bytes): each library's median and
    spread over the repeats in ``runs``; prints the tables and returns the
    exit code (1 if a launch failed or a result was wrong)."""
    out_tables, bad = {}, 0
    for t, libs in tables.items():
        table = []
        for op in ops:
            for n in args.nproc:
                for b in sorted({k[4] for k in runs if k[0] == t and k[2] == op and k[3] == n}):
                    row = {"table": t, "op": op, "nproc": n, "bytes": b}
                    for lib in libs:
                        reps = runs.get((t, lib, op, n, b))
                        if not reps:
                            row[lib] = None
                            continue
                        times = [r["time_us"] for r in reps]
                        med, lo, hi, q1, q3 = spread(times)
                        algbw = b / (med * 1e-6) / 1e9 if med > 0 and b else 0.0
                        row[lib] = {"time_us": med, "min_us": lo, "max_us": hi, "q1_us": q1, "q3_us": q3,
                                    "times_us": times, "busbw_GBps": algbw * base.bus_factor(op, n),
                                    "wrong": sum(r.get("wrong") or 0 for r in reps),
                                    "checks": [r.get("check") for r in reps],
                                    "lib_version": reps[0].get("lib_version")}
                    for name, slow, fast in TABLES[t]["ratios"]:
                        a, f = row.get(slow), row.get(fast)
                        row[name] = a["time_us"] / f["time_us"] if a and f and f["time_us"] > 0 else None
                    table.append(row)
                    record(dict({"kind": "cell"}, **row))
        out_tables[t] = table
        bad += print_table(t, libs, table, args.repeats, commit, run_id)
        print_stability(libs, table)
    if failures:
        print(f"# failed launches (not repeated): {', '.join(' '.join(map(str, k[1:4])) for k in sorted(failures))}")
    if raw_path:
        shown = os.path.relpath(raw_path)
        print(f"# every repeat: {raw_path if shown.startswith('..') else shown}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"rows": [r for t in out_tables.values() for r in t], "tables": out_tables,
                       "repeats": args.repeats, "commit": commit, "run": run_id,
                       "failed": [list(k) for k in sorted(failures)]}, f, indent=1)
    return 1 if failures or bad else 0


# Issue 20's third item: the launches of one size should be within this
# of each other (slowest over fastest), from STABLE_FROM bytes up.
STABLE_RATIO = 1.5
STABLE_FROM = 1 << 20


def stability(libs, table):
    """Per library: (cells from STABLE_FROM bytes up with two or more
    launches, those whose slowest launch is within STABLE_RATIO of the
    fastest, [(op, nproc, bytes, slowest / fastest) of the others])."""
    out = {}
    for lib in libs:
        cells, held, over = 0, 0, []
        for row in table:
            c = row.get(lib)
            if row["bytes"] < STABLE_FROM or not c or len(c["times_us"]) < 2 or c["min_us"] <= 0:
                continue
            cells += 1
            ratio = c["max_us"] / c["min_us"]
            if ratio <= STABLE_RATIO:
                held += 1
            else:
                over.append((row["op"], row["nproc"], row["bytes"], ratio))
        if cells:
            out[lib] = (cells, held, over)
    return out


def print_stability(libs, table):
    """One line per library: how many of its large cells' launches are
    within STABLE_RATIO of each other, and the spread of those that are not."""
    counts = stability(libs, table)
    for lib, (cells, held, over) in counts.items():
        worst = ", ".join(f"{op} {n}r {fmt_bytes(b)} {r:.2f}x" for op, n, b, r in over)
        print(f"# stable ({lib}): {held} of {cells} cells from {fmt_bytes(STABLE_FROM)} up have every launch within "
              f"{STABLE_RATIO}x of the fastest" + (f"; over: {worst}" if over else ""))
    if counts:
        print()


def fmt_bytes(b):
    """1048576 -> 1M, 4096 -> 4K, 8 -> 8."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return str(b)


def from_raw(ap, args):
    """--from-raw: the tables of one run in a raw file, from its repeat lines
    (nothing is launched or written)."""
    try:
        with open(args.from_raw) as f:
            lines = [json.loads(x) for x in f if x.strip()]
    except (OSError, ValueError) as e:
        ap.error(f"--from-raw {args.from_raw}: {e}")
    heads = [x for x in lines if x.get("kind") == "run" and (args.run_id is None or x.get("run") == args.run_id)]
    if not heads:
        ap.error(f"--from-raw {args.from_raw}: no run" + (f" {args.run_id}" if args.run_id else "") + " in it")
    head = heads[-1]
    run_id = head["run"]
    tables = head.get("tables") or {"native": head["libs"]}
    if args.state and not head.get("vcpu_probe"):
        ap.error(f"--state: run {run_id} was made without --vcpu-probe (its launches have no state)")
    runs, failures, reps, skipped = {}, set(), set(), 0
    for x in lines:
        if x.get("run") != run_id:
            continue
        if x.get("kind") == "repeat":
            if args.state and state_of(x.get("probe_before_ns"), x.get("probe_after_ns")) != args.state:
                skipped += 1
                continue
            t = x.get("table", "native")
            runs.setdefault((t, x["lib_name"], x["op"], x["nproc"], x["bytes"]), []).append(x)
            reps.add(x["repeat"])
        elif x.get("kind") == "failed":
            failures.add((x["table"], x["lib"], x["op"], x["nproc"], tuple(x["sizes"])))
    done = len(reps)
    print(f"# from {args.from_raw}: run {run_id}, {sum(map(len, runs.values()))} launches' rows, "
          f"repeats {min(reps) if reps else 0}-{max(reps) if reps else 0} of {head['repeats']}"
          + (f"; --state {args.state}: {skipped} rows of other or changing states left out (the medians are over "
             "each cell's launches in that state, so fewer than the repeats)" if args.state else ""))
    a = argparse.Namespace(**vars(args))
    a.nproc, a.repeats = head["nproc"], done
    return summarize(a, head["ops"], tables, runs, failures, head["commit"], run_id, None, lambda obj: None)


def print_table(name, libs, table, repeats, commit, run_id):
    """Prints one like-for-like table; returns its wrong elements."""
    def cell(c):
        if not c:
            return "-"
        return f"{fmt_us(c['time_us'])} [{fmt_us(c['min_us'])}-{fmt_us(c['max_us'])}]"

    ratios = [r for r in TABLES[name]["ratios"] if r[1] in libs and r[2] in libs]
    print(f"# {name}: median [min-max] of {repeats} launch(es) per cell, microseconds (m: ms, s: s); "
          f"float32; time per call on the slowest rank; {commit}, {run_id}")
    print(f"# {name}: {TABLES[name]['what']}")
    print("# " + ", ".join(f"{r} = {slow} / {fast}" for r, slow, fast in ratios)
          + " (above 1: ringleader is faster)")
    head = f"{'op':<15}{'n':>3}{'bytes':>10}" + "".join(f"{lib:>24}" for lib in libs)
    head += "".join(f"{r:>7}" for r, _, _ in TABLES[name]["ratios"]) + "  check"
    print(head)
    bad = 0
    for row in table:
        wrong = sum((row.get(lib) or {}).get("wrong", 0) for lib in libs)
        bad += wrong
        line = f"{row['op']:<15}{row['nproc']:>3}{row['bytes']:>10}"
        line += "".join(f"{cell(row.get(lib)):>24}" for lib in libs)
        for r, _, _ in TABLES[name]["ratios"]:
            line += f"{'-' if row[r] is None else format(row[r], '.2f'):>7}"
        line += "  " + ("ok" if wrong == 0 else f"FAIL ({wrong} wrong)")
        print(line)
    print()
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--ringleader", help="the ringleader binary, run as given [default: target/release/ringleader, "
                                         "built from this tree first]")
    ap.add_argument("--native", action="store_true",
                    help="the native table: ringleader perf against the C program over Open MPI (above)")
    ap.add_argument("--python", action="store_true",
                    help="the Python table: ringleader's Python API against mpi4py (above); combines with --native")
    ap.add_argument("--torch", action="store_true",
                    help="the torch table: torch.distributed, ringleader against gloo (above); combines with --native")
    ap.add_argument("--libs", nargs="+", choices=LIBS + NATIVE_LIBS + PY_LIBS + TORCH_LIBS, metavar="LIB",
                    help=f"[default: {' '.join(LIBS)}; with --native: {' '.join(NATIVE_LIBS)}; with --python: "
                         f"{' '.join(PY_LIBS)}; with --torch: {' '.join(TORCH_LIBS)}]")
    ap.add_argument("--ops", nargs="+", choices=base.OPS + ["barrier"],
                    help="[default: all_reduce all_gather broadcast; with --native, --python, --torch: "
                         + " ".join(NATIVE_OPS) + "]")
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
                    help="--native/--python/--torch: one launch per (lib, op, nproc, size), or per (lib, op, nproc) "
                         "[default: size]")
    ap.add_argument("--raw", help="--native/--python/--torch: append every repeat here "
                    "[default: docs/perf/bench_native-<UTC date>-<commit>.jsonl]")
    ap.add_argument("--no-raw", action="store_true", help="--native/--python/--torch: keep no raw file (smoke tests)")
    ap.add_argument("--mpicc", default="mpicc", help="--native: the compiler for the C program [default: mpicc]")
    ap.add_argument("--mpi-bench", help="--native: a built rl_mpi_bench instead of target/rl_mpi_bench/")
    ap.add_argument("--from-raw", metavar="FILE",
                    help="launch nothing: print the tables of a raw file's last run (or --run ID) from the repeats "
                         "it holds, as the run would have (a run cut short gives the repeats it finished)")
    ap.add_argument("--run", dest="run_id", help="--from-raw: the run to print, by its id (the raw lines' \"run\")")
    ap.add_argument("--vcpu-probe", action="store_true",
                    help="--native/--python/--torch: time a cache line's round trip between vCPUs 0 and 1 "
                         "(docs/perf/core_pair_latency.c) right before and after every launch and keep both in its "
                         "raw rows (probe_before_ns, probe_after_ns), for --from-raw --state")
    ap.add_argument("--state", choices=["near", "apart"],
                    help=f"--from-raw: only the launches whose two probes were both under {APART_NS:.0f} ns (near) "
                         "or both over (apart), from a run made with --vcpu-probe")
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
    if args.state and not args.from_raw:
        ap.error("--state reads a kept run: give --from-raw FILE (made with --vcpu-probe)")
    if args.from_raw:
        return from_raw(ap, args)
    if args.native or args.python or args.torch:
        return like_main(ap, args)
    args.libs = args.libs or LIBS
    args.ops = args.ops or ["all_reduce", "all_gather", "broadcast"]
    if any(lib not in LIBS for lib in args.libs) or "barrier" in args.ops:
        ap.error(f"without --native, --python or --torch: --libs from {', '.join(LIBS)}, and no barrier")
    libs = list(args.libs)
    why = mpi_available()
    if why and any(lib.startswith("ompi") for lib in libs):
        print(f"note: skipping Open MPI: {why}", file=sys.stderr)
        libs = [lib for lib in libs if not lib.startswith("ompi")]
    if any(lib.startswith("rl") for lib in libs):
        find_ringleader(ap, args)

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
    # --native alone needs no Python package; the other modes need the
    # venv's (torch, numpy, mpi4py), and their workers run on this python.
    if "--mpi-worker" not in sys.argv and not ("--native" in sys.argv and not {"--python", "--torch"} & set(sys.argv)):
        ensure_venv_python()
    sys.exit(main())
