#!/usr/bin/env python3
"""ringleader's numpy API against mpi4py on 2 ranks, small messages,
launches interleaved (for before/after comparisons of the Python package).

Each launch runs scripts/bench_py_worker.py (the worker of
``scripts/bench_compare.py --python``, so the method is that table's: written
buffers, warm-up, a barrier, adaptive iterations of about 0.3 s, the slowest
rank's mean per call) for one column and one op: a ringleader column under
``ringleader launch --nproc-per-node N`` with PYTHONPATH set to the column's
package, or Open MPI through mpi4py under ``mpirun`` (shared memory, the vader
BTL). Columns alternate launch by launch (a, b, c, then c, b, a, ...). The
table gives per (op, size) the median over ``--launches`` launches [min-max].

    PYTHONPATH=ffi/python RINGLEADER_LIBRARY=target/release/libringleader.so \\
        ~/.cache/ringleader/venv/bin/python ffi/python/bench/two_ranks.py --launches 7 \\
        --variant before=/tmp/old/ffi/python

The ringleader columns: ``current`` (ffi/python of this checkout) and each
``--variant NAME=PATH``; ``mpi4py`` unless ``--no-mpi``.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
WORKER = os.path.join(REPO, "scripts", "bench_py_worker.py")
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
               "RINGLEADER_STORE_ADDR", "RINGLEADER_RUN_ID", "TORCHELASTIC_RUN_ID")


def launch(args, column, op, path, out_json):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    sizes = [] if op == "barrier" else ["--sizes", ",".join(args.sizes)]  # barrier: one row of size 0
    tail = [sys.executable, WORKER, "--op", op, "--json", out_json, "--name", column, "--warmup", "3"] + sizes
    if column == "mpi4py":
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(args.nproc),
               "--mca", "pml", "ob1", "--mca", "btl", "self,vader"]
        if os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
        cmd += tail[:2] + ["--lib", "mpi4py"] + tail[2:]
    else:
        env["PYTHONPATH"] = path
        env["RINGLEADER_TRANSPORT"] = "shm"
        cmd = [args.ringleader, "launch", "--nproc-per-node", str(args.nproc), "--"] + tail[:2] + \
            ["--lib", "ringleader"] + tail[2:]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise SystemExit(f"{column} {op}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    rows = [json.loads(line) for line in open(out_json) if line.strip()]
    return {(op, r["bytes"]): r["time_us"] for r in rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=7)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--ops", nargs="+", default=["all_reduce", "barrier"])
    ap.add_argument("--sizes", nargs="+", default=["8", "4K"])
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--no-mpi", action="store_true")
    ap.add_argument("--ringleader", default=os.environ.get("RINGLEADER_BIN")
                    or os.path.join(REPO, "target", "release", "ringleader"))
    ap.add_argument("--json", help="write every launch's figures here")
    args = ap.parse_args()
    if not os.path.exists(args.ringleader):
        raise SystemExit(f"no ringleader CLI at {args.ringleader} (--ringleader or RINGLEADER_BIN)")
    columns = {"current": os.path.join(REPO, "ffi", "python")}
    for v in args.variant:
        name, sep, path = v.partition("=")
        if not sep:
            raise SystemExit(f"--variant {v!r}: expected NAME=PATH")
        columns[name] = path
    if not args.no_mpi and shutil.which("mpirun"):
        columns["mpi4py"] = None
    names = list(columns)
    runs = []
    with tempfile.TemporaryDirectory(prefix="rl-two-ranks-") as tmp:
        for i in range(args.launches):
            for c in (names if i % 2 == 0 else names[::-1]):
                for op in args.ops:
                    out = os.path.join(tmp, f"{c}-{op}-{i}.jsonl")
                    load = os.getloadavg()[0]
                    got = launch(args, c, op, columns[c], out)
                    for (o, b), us in got.items():
                        runs.append({"launch": i, "column": c, "op": o, "bytes": b, "us": us, "load1": load})
                    print(f"# launch {i + 1}/{args.launches} {c} {op}: load {load:.2f}, "
                          + ", ".join(f"{b} B {us:.2f} us" for (_, b), us in got.items()), file=sys.stderr, flush=True)
    loads = [r["load1"] for r in runs]
    print(f"# numpy API on {args.nproc} ranks (bench_py_worker.py: mean per call of the slowest rank); "
          f"median of {args.launches} interleaved launches [min-max], us; load average {min(loads):.2f}-"
          f"{max(loads):.2f}, {os.cpu_count()} CPUs")
    keys = list(dict.fromkeys((r["op"], r["bytes"]) for r in runs))
    print(f"{'op':<16}{'bytes':>8}" + "".join(f"{c:>24}" for c in names))
    for op, b in keys:
        row = f"{op:<16}{b:>8}"
        for c in names:
            v = [r["us"] for r in runs if r["column"] == c and r["op"] == op and r["bytes"] == b]
            row += (f"{statistics.median(v):>8.2f} [{min(v):.2f}-{max(v):.2f}]" if v else "-").rjust(24)
        print(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
