#!/usr/bin/env python3
"""ringleader vs gloo, same machine, same run, same definitions.

Runs `ringleader perf` (this tree's, built first unless --ringleader names
one) and PyTorch's `gloo` backend (CPU) over the same sizes for each op and
world size, each (lib, op, nproc) run --repeats times, interleaved so that a
noisy neighbour hurts both alike, and prints one table of MEDIAN times per
size side by side:

    op  nproc  bytes  ringleader time_us  gloo time_us  ringleader busbw  gloo busbw  ratio

ratio = gloo time / ringleader time (above 1: ringleader is faster).

Both sides measure alike (docs/DESIGN.md section 4, nccl-tests' method): per size,
warm-up calls, a barrier, `iters` timed calls (adaptive: about 0.3 s per
size, 5 to 1000, ranks agreeing through an all_reduce(max) of the estimate),
this rank's mean per call, and the slowest rank's mean via all_reduce(MAX).
Sizes and bandwidths follow nccl-tests: algbw = bytes / time; busbw = algbw
x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather, reduce_scatter and
all_to_all (bytes = total output of all_gather, total input of
reduce_scatter), x 1 for broadcast and reduce. float32 throughout.

The gloo side starts N copies of this script in worker mode (`--gloo-worker`)
with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set, as torchrun would; each
calls dist.init_process_group("gloo"). Every subprocess runs under a timeout.

Python: torch and numpy come from the venv at
${RINGLEADER_VENV:-$HOME/.cache/ringleader/venv}; started with another
interpreter, the script re-runs itself with that one.

Examples:
    scripts/bench_vs_gloo.py --nproc 2 4 -e 64M
    scripts/bench_vs_gloo.py --ops all_reduce --nproc 2 -e 1M --repeats 5 --json out.json
    scripts/bench_vs_gloo.py --gloo-only --nproc 2 -e 64K
"""

import argparse
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

OPS = ["all_reduce", "all_gather", "broadcast", "reduce_scatter", "reduce", "all_to_all"]
DEFAULT_OPS = ["all_reduce", "all_gather", "broadcast", "reduce_scatter"]
TARGET_SECS = 0.3
MIN_ITERS, MAX_ITERS = 5, 1000
ELEM = 4  # float32
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def target_dir():
    """Cargo's target folder for this tree."""
    return os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))


def build_ringleader(packages):
    """Builds this tree's `packages` (release), so that rows labelled with
    this tree were measured with its code, not with an older build left in
    target/; exits naming the failure."""
    print(f"# building ringleader (cargo build --release -p {' -p '.join(packages)})", file=sys.stderr, flush=True)
    cmd = ["cargo", "build", "--release", "-q"] + [a for p in packages for a in ("-p", p)]
    r = subprocess.run(cmd, cwd=REPO)
    if r.returncode != 0:
        sys.exit(f"error: building ringleader failed (exit {r.returncode}); --ringleader PATH runs a given one")


# ---------------------------------------------------------------- definitions


def parse_size(s):
    """nccl-tests sizes: 8, 64K, 64M, 1G (powers of 1024)."""
    t = s.strip()
    for suffix in ("iB", "B", "b"):
        if t.endswith(suffix):
            t = t[: -len(suffix)]
            break
    shift = {"K": 10, "M": 20, "G": 30, "T": 40}.get(t[-1:].upper(), 0)
    if shift:
        t = t[:-1]
    if not t.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{s!r} is not a size (examples: 8, 64K, 64M, 1G)")
    return int(t) << shift


def size_steps(lo, hi, factor):
    out, s = [], lo
    while s <= hi:
        out.append(s)
        if factor < 2 or s == 0:
            break
        s *= factor
    return out


def add_size_args(ap, stepfactor):
    """-b/-e/-f (nccl-tests' sweep) and --sizes (a list instead)."""
    ap.add_argument("-b", "--minbytes", type=parse_size, default=None, help="smallest size [default: 8]")
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=None, help="largest size [default: 64M]")
    ap.add_argument("-f", "--stepfactor", type=int, default=None,
                    help=f"each size is this many times the one before [default: {stepfactor}]")
    ap.add_argument("--sizes", nargs="+", default=None, metavar="SIZE",
                    help="these sizes instead of -b/-e/-f (8 1M 64M, or 8,1M,64M)")
    ap.set_defaults(default_stepfactor=stepfactor)


def settle_sizes(ap, args):
    """Fills in -b/-e/-f defaults, parses --sizes into args.sizes (sorted, each
    once), and refuses the two ways together."""
    sweep = (args.minbytes, args.maxbytes, args.stepfactor)
    if args.sizes is not None:
        if any(v is not None for v in sweep):
            ap.error("--sizes replaces -b/-e/-f; give one or the other")
        try:
            args.sizes = sorted({parse_size(x) for item in args.sizes for x in item.split(",") if x})
        except argparse.ArgumentTypeError as e:
            ap.error(f"--sizes: {e}")
        if not args.sizes:
            ap.error("--sizes: no size given")
    args.minbytes = parse_size("8") if args.minbytes is None else args.minbytes
    args.maxbytes = parse_size("64M") if args.maxbytes is None else args.maxbytes
    args.stepfactor = args.default_stepfactor if args.stepfactor is None else args.stepfactor


def sizes_of(args):
    """The sizes this run measures, smallest first."""
    return args.sizes if args.sizes else size_steps(args.minbytes, args.maxbytes, args.stepfactor)


def shape_of(op, nbytes, n):
    """(in_len, out_len, count, bytes) as `ringleader perf` computes them, or None.

    count is nccl-tests' count column, per rank: each rank's input of
    all_gather, each rank's output of reduce_scatter, what each rank sends
    each peer in all_to_all, the buffer of the others; bytes is the larger
    buffer (the size column, what algbw divides by).
    """
    elems = nbytes // ELEM
    per = elems // n
    if op == "all_gather":
        in_len, out_len, count = per, per * n, per
    elif op == "reduce_scatter":
        in_len, out_len, count = per * n, per, per
    elif op == "all_to_all":
        in_len, out_len, count = per * n, per * n, per
    else:
        in_len, out_len, count = elems, 0, elems
    total = max(in_len, out_len)
    if total == 0:
        return None
    return in_len, out_len, count, total * ELEM


def bus_factor(op, n):
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def adaptive_iters(per_call):
    if not per_call or per_call <= 0 or per_call != per_call:
        return MAX_ITERS
    n = math.ceil(TARGET_SECS / per_call)
    return MAX_ITERS if n >= MAX_ITERS else max(n, MIN_ITERS)


# ---------------------------------------------------------------- gloo worker


def gloo_worker(args):
    """One rank of the gloo benchmark; rank 0 prints one JSON line per size."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    op, root = args.op, args.root

    def slowest(v):
        t = torch.tensor([v], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t[0])

    for nbytes in sizes_of(args):
        shape = shape_of(op, nbytes, world)
        if shape is None:
            continue
        in_len, out_len, count, real_bytes = shape
        # Written, not just allocated: untouched pages read as the kernel's
        # shared zero page, which costs no memory bandwidth and would flatter
        # any copy out of them (ringleader perf fills its buffers too).
        inp = torch.ones(in_len, dtype=torch.float32)
        out = torch.ones(out_len, dtype=torch.float32)
        if op == "all_reduce":
            call = lambda: dist.all_reduce(inp, op=dist.ReduceOp.SUM)  # noqa: E731
        elif op == "all_gather":
            call = lambda: dist.all_gather_into_tensor(out, inp)  # noqa: E731
        elif op == "reduce_scatter":
            call = lambda: dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.SUM)  # noqa: E731
        elif op == "broadcast":
            call = lambda: dist.broadcast(inp, src=root)  # noqa: E731
        elif op == "reduce":
            call = lambda: dist.reduce(inp, dst=root, op=dist.ReduceOp.SUM)  # noqa: E731
        else:
            call = lambda: dist.all_to_all_single(out, inp)  # noqa: E731
        try:
            calls = args.warmup if args.iters else max(args.warmup, 1)
            t = time.perf_counter()
            for _ in range(calls):
                call()
            est = (time.perf_counter() - t) / max(calls, 1)
            iters = args.iters or adaptive_iters(slowest(est))
            dist.barrier()
            t = time.perf_counter()
            for _ in range(iters):
                call()
            mine = (time.perf_counter() - t) / iters
            time_s = slowest(mine)
        except (RuntimeError, NotImplementedError, ValueError) as e:
            if rank == 0:
                print(json.dumps({"unsupported": f"{op}: {e}".splitlines()[0]}), flush=True)
            break
        if rank == 0:
            algbw = real_bytes / time_s / 1e9
            print(
                json.dumps(
                    {
                        "op": op,
                        "nproc": world,
                        "bytes": real_bytes,
                        "count": count,
                        "dtype": "f32",
                        "time_us": time_s * 1e6,
                        "algbw_GBps": algbw,
                        "busbw_GBps": algbw * bus_factor(op, world),
                        "iters": iters,
                        "lib": "gloo",
                        "lib_version": f"(torch {torch.__version__})",
                    }
                ),
                flush=True,
            )
    dist.destroy_process_group()


# ---------------------------------------------------------------- runners


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_bounded(cmd, label, timeout, env=None):
    """Runs `cmd` in a session of its own, at most `timeout` s (then kills
    the whole group and raises, naming `label`); returns (code, out, err)."""
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True, env=env)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(p)
        p.wait()
        raise RuntimeError(f"{label}: still running after {timeout:.0f} s; killed")
    return p.returncode, out, err


def size_args(args):
    if args.sizes:
        out = ["--sizes", ",".join(map(str, args.sizes))]
    else:
        out = ["-b", str(args.minbytes), "-e", str(args.maxbytes), "-f", str(args.stepfactor)]
    out += ["--warmup", str(args.warmup)]
    if args.iters:
        out += ["--iters", str(args.iters)]
    return out


def run_gloo(args, op, n):
    """One gloo run: rows by bytes, or raises RuntimeError naming the failed rank."""
    port = free_port()
    cmd = [sys.executable, os.path.abspath(__file__), "--gloo-worker", "--op", op,
           "--root", str(args.root)] + size_args(args)
    procs = []
    for rank in range(n):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.setdefault("OMP_NUM_THREADS", "1")
        procs.append(subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True))
    deadline = time.monotonic() + args.timeout
    outputs = []
    try:
        for rank, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    kill_group(q)
                raise RuntimeError(f"gloo {op} x{n}: rank {rank} still running after "
                                   f"{args.timeout:.0f} s; killed every rank")
            outputs.append((p.returncode, out, err))
    finally:
        for q in procs:
            kill_group(q)
            q.wait()
    for rank, (code, _, err) in enumerate(outputs):
        if code != 0:
            tail = "\n    ".join(err.strip().splitlines()[-8:])
            raise RuntimeError(f"gloo {op} x{n}: rank {rank} exited with {code}:\n    {tail}")
    rows = {}
    for line in outputs[0][1].splitlines():
        row = json.loads(line)
        if "unsupported" in row:
            print(f"note: gloo does not run {row['unsupported']}", file=sys.stderr)
            break
        rows[row["bytes"]] = row
    return rows


def run_ringleader(args, op, n):
    """One `ringleader perf` run: rows by bytes, or raises RuntimeError with its stderr."""
    with tempfile.TemporaryDirectory(prefix="rl-bench-") as tmp:
        out_json = os.path.join(tmp, "perf.jsonl")
        cmd = [args.ringleader, "perf", "--op", op, "--nproc", str(n), "--root", str(args.root),
               "--transport", args.transport, "--json", out_json,
               "--time-limit", str(max(5, args.timeout - 5))] + size_args(args)
        code, out, err = run_bounded(cmd, f"ringleader {op} x{n}", args.timeout)
        if code != 0:
            tail = "\n    ".join((err.strip() or out.strip()).splitlines()[-12:])
            raise RuntimeError(f"ringleader {op} x{n}: exited with {code}:\n    {tail}")
        rows = {}
        with open(out_json) as f:
            for line in f:
                row = json.loads(line)
                rows[row["bytes"]] = row
        return rows


# ---------------------------------------------------------------- driver


def median_row(runs, op, n):
    """Median time over repeats, and the bandwidths of that median."""
    times = [r["time_us"] for r in runs]
    t = statistics.median(times)
    first = runs[0]
    algbw = first["bytes"] / (t * 1e-6) / 1e9 if t > 0 else 0.0
    return {
        "time_us": t,
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * bus_factor(op, n),
        "times_us": times,
        "lib": first.get("lib"),
        "lib_version": first.get("lib_version"),
        "wrong": sum(r.get("wrong", 0) for r in runs),
    }


def fmt_time(t):
    if t is None:
        return "-"
    return f"{t:.2f}" if t < 1e4 else f"{t:.1f}" if t < 1e6 else f"{t:.0f}"


def fmt_bw(b):
    return "-" if b is None else f"{b:.3f}"


def run_once(runner, args, op, n, tries=3):
    """One run; again (up to `tries` in all) when it lost a race for its
    rendezvous port (picked free, taken by another process before the
    library bound it): that says nothing about the library measured."""
    for attempt in range(1, tries + 1):
        try:
            return runner(args, op, n)
        except RuntimeError as e:
            if attempt == tries or not any(m in str(e).lower() for m in ("eaddrinuse", "address already in use")):
                raise
            print(f"# port race ({attempt}/{tries}), running again: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)


def run_and_collect(args, libs, runners):
    """Runs every (lib, op, nproc) --repeats times, interleaved, and returns
    (rows, failures): one row per (op, nproc, bytes) with its element count
    and each lib's median row (None where it has none), and the (lib, op, nproc) runs that failed
    (not retried in later repeats)."""
    runs, failures = {}, []  # (lib, op, n) -> [rows by bytes, one per repeat]
    for rep in range(args.repeats):
        for op in args.ops:
            for n in args.nproc:
                for lib in libs:
                    key = (lib, op, n)
                    if key in failures:
                        continue
                    print(f"# repeat {rep + 1}/{args.repeats}: {lib} {op} x{n}", file=sys.stderr, flush=True)
                    try:
                        runs.setdefault(key, []).append(run_once(runners[lib], args, op, n))
                    except RuntimeError as e:
                        print(f"error: {e}", file=sys.stderr, flush=True)
                        failures.append(key)
    rows = []
    for op in args.ops:
        for n in args.nproc:
            sizes = sorted({b for lib in libs for r in runs.get((lib, op, n), []) for b in r})
            for b in sizes:
                row = {"op": op, "nproc": n, "bytes": b}
                for lib in libs:
                    reps = [r[b] for r in runs.get((lib, op, n), []) if b in r]
                    row[lib] = median_row(reps, op, n) if reps else None
                    if reps:
                        row["count"] = reps[0]["count"]
                rows.append(row)
    return rows, failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--ringleader", help="the ringleader binary [default: target/release/ringleader, built first]")
    ap.add_argument("--ops", nargs="+", choices=OPS, default=DEFAULT_OPS)
    ap.add_argument("--op", choices=OPS, help=argparse.SUPPRESS)
    ap.add_argument("--nproc", nargs="+", type=int, default=[2])
    add_size_args(ap, stepfactor=2)
    ap.add_argument("--iters", type=int, default=None,
                    help="timed calls per size [default: adaptive, about 0.3 s per size, 5 to 1000]")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--root", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="runs per (lib, op, nproc); medians reported")
    ap.add_argument("--transport", default="auto", choices=["auto", "tcp", "shm"])
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run before it is killed")
    ap.add_argument("--json", dest="json_out", help="write every row (with each repeat's time) here")
    ap.add_argument("--gloo-only", action="store_true")
    ap.add_argument("--ringleader-only", action="store_true")
    ap.add_argument("--gloo-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    settle_sizes(ap, args)

    if args.gloo_worker:
        gloo_worker(args)
        return 0
    if args.gloo_only and args.ringleader_only:
        ap.error("--gloo-only and --ringleader-only exclude each other")
    if args.repeats < 1 or any(n < 1 for n in args.nproc) or args.minbytes > args.maxbytes:
        ap.error("--repeats and --nproc must be at least 1, and -b at most -e")
    if not args.gloo_only:
        if not args.ringleader:
            args.ringleader = os.path.join(target_dir(), "release", "ringleader")
            build_ringleader(["ringleader-cli"])
        if not os.access(args.ringleader, os.X_OK):
            ap.error(f"no ringleader binary at {args.ringleader}: build it with "
                     "`cargo build --release -p ringleader-cli` or pass --ringleader PATH")

    libs = ([] if args.gloo_only else ["ringleader"]) + ([] if args.ringleader_only else ["gloo"])
    runners = {"ringleader": run_ringleader, "gloo": run_gloo}
    rows, failures = run_and_collect(args, libs, runners)
    for row in rows:
        rl, gl = row.get("ringleader"), row.get("gloo")
        row["ratio"] = (gl["time_us"] / rl["time_us"]) if rl and gl and rl["time_us"] > 0 else None

    libs_seen = {}
    for row in rows:
        for lib in libs:
            if row.get(lib):
                libs_seen[lib] = f"{row[lib]['lib']} {row[lib]['lib_version']}"
    print("# " + "; ".join(f"{k}: {v}" for k, v in libs_seen.items())
          + f"; median of {args.repeats} run(s); float32; time = mean per call on the slowest rank")
    print("# ratio = gloo time / ringleader time (above 1: ringleader is faster)")
    head = f"{'op':<15}{'nproc':>6}{'bytes':>12}{'rl time_us':>13}{'gloo time_us':>14}" \
           f"{'rl busbw':>10}{'gloo busbw':>12}{'ratio':>8}  check"
    print(head)
    for row in rows:
        rl, gl = row.get("ringleader"), row.get("gloo")
        check = "" if rl is None else ("ok" if rl["wrong"] == 0 else f"FAIL ({rl['wrong']} wrong)")
        print(f"{row['op']:<15}{row['nproc']:>6}{row['bytes']:>12}"
              f"{fmt_time(rl and rl['time_us']):>13}{fmt_time(gl and gl['time_us']):>14}"
              f"{fmt_bw(rl and rl['busbw_GBps']):>10}{fmt_bw(gl and gl['busbw_GBps']):>12}"
              f"{('-' if row['ratio'] is None else format(row['ratio'], '.2f')):>8}  {check}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"rows": rows, "repeats": args.repeats, "libs": libs_seen,
                       "failed": [list(k) for k in failures]}, f, indent=1)
    bad = any(r.get("ringleader") and r["ringleader"]["wrong"] for r in rows)
    return 1 if failures or bad else 0


def ensure_venv_python():
    """Re-runs this script with the venv's python when torch is missing here."""
    if "--ringleader-only" in sys.argv:
        return
    try:
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    venv = os.environ.get("RINGLEADER_VENV", os.path.expanduser("~/.cache/ringleader/venv"))
    py = os.path.join(venv, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv) or not os.access(py, os.X_OK):
        sys.exit(f"error: torch is not importable and no venv python at {py} "
                 "(set RINGLEADER_VENV, or use --ringleader-only)")
    os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])


if __name__ == "__main__":
    ensure_venv_python()
    sys.exit(main())
