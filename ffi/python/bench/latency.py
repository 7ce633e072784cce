"""Measurements for ringleader's Python layer, on this host:

1. 8-byte all_reduce latency through Python (numpy, ``ringleader.ProcessGroup``)
   versus through the Rust API directly (``ringleader perf``), 2 ranks.
2. torch all_reduce through backend "ringleader" versus backend "gloo" at
   4 KiB, 1 MiB and 64 MiB on 2 ranks, in the same run.

Every number is the median of >= 5 repeats (these machines are shared and
noisy); each repeat times many calls on each rank and takes the slowest rank.

Usage (from the repository root, after `pip install ./ffi/python` and
`cargo build --release --example allreduce_latency -p ringleader`):
    python ffi/python/bench/latency.py [--ringleader target/release/ringleader] [--jobs 5] [--repeats 6]
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = [("4 KiB", 4 << 10), ("1 MiB", 1 << 20), ("64 MiB", 64 << 20)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(world, argv, extra_env=None, timeout=600):
    """Runs ``argv`` as ``world`` ranks with torchrun's variables; returns each rank's stdout."""
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        env.pop("RINGLEADER_STORE_ADDR", None)
        env.update(extra_env or {})
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise SystemExit(f"benchmark ranks exceeded {timeout} s")
        if p.returncode != 0:
            raise SystemExit(f"a benchmark rank failed:\n{out}\n{err}")
        outs.append(out)
    return outs


# ---------------------------------------------------------------------------
# worker side

def worker_python_latency(repeats, iters):
    import numpy as np

    import ringleader

    pg = ringleader.init()
    x = np.ones(2, dtype=np.float32)  # 8 bytes
    for _ in range(200):
        pg.all_reduce(x)
    res = []
    for _ in range(repeats):
        pg.barrier()
        t = time.perf_counter()
        for _ in range(iters):
            pg.all_reduce(x)
        us = np.array([(time.perf_counter() - t) / iters * 1e6])
        pg.all_reduce(us, op="max")
        res.append(float(us[0]))
    if pg.rank == 0:
        print(json.dumps({"python_us": res}))
    pg.destroy()


def worker_python_overhead(iters):
    """Time spent in Python before the C call: argument checks and ctypes marshalling, one rank."""
    import numpy as np

    import ringleader._buffers as B

    x = np.ones(2, dtype=np.float32)
    t = time.perf_counter()
    for _ in range(iters):
        B.resolve(x, "buf", True)
    print(json.dumps({"resolve_us": (time.perf_counter() - t) / iters * 1e6}))


def worker_torch(backend, repeats):
    import torch
    import torch.distributed as dist

    import ringleader.torch  # noqa: F401

    dist.init_process_group(backend)
    out = {}
    for label, nbytes in SIZES:
        t = torch.ones(nbytes // 4)
        iters = 200 if nbytes <= 4096 else (20 if nbytes <= 1 << 20 else 3)
        for _ in range(3 if nbytes < 1 << 26 else 1):
            dist.all_reduce(t)
        res = []
        for _ in range(repeats):
            dist.barrier()
            s = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            us = torch.tensor([(time.perf_counter() - s) / iters * 1e6], dtype=torch.float64)
            dist.all_reduce(us, op=dist.ReduceOp.MAX)
            res.append(us.item())
        out[label] = res
    if dist.get_rank() == 0:
        print(json.dumps(out))
    dist.destroy_process_group()


# ---------------------------------------------------------------------------
# driver side

def perf_latency(ringleader_bin, repeats):
    """8-byte all_reduce through `ringleader perf` (its mean per call, slowest rank), one run per repeat."""
    res = []
    for _ in range(repeats):
        with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
            subprocess.run([ringleader_bin, "perf", "--op", "all_reduce", "--nproc", "2", "-b", "8", "-e", "8",
                            "-n", "2000", "-w", "200", "--json", f.name], check=True, capture_output=True, text=True,
                           timeout=300)
            rows = [json.loads(line) for line in open(f.name) if line.strip()]
        res.append(float(rows[-1]["time_us"]))
    return res


def default_example():
    target = os.environ.get("CARGO_TARGET_DIR")
    if not target:
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        target = os.path.join(repo, "target")
    return os.path.join(target, "release", "examples", "allreduce_latency")


def stats(xs):
    return f"{statistics.median(xs):.1f} | {min(xs):.1f} | {max(xs):.1f}"


def latency_table(a, me):
    """Rust and Python jobs alternate, so drift on a shared machine hits both alike."""
    rows = {}
    for world in (2, 1):
        py, rs = [], []
        for _ in range(a.jobs):
            py += json.loads(spawn(world, me + ["--worker", "python", "--repeats", "3"])[0])["python_us"]
            if a.rust_example and os.path.exists(a.rust_example):
                rs += json.loads(spawn(world, [a.rust_example, "2000", "3"])[0])["rust_us"]
        rows[world] = (py, rs)
    print(f"## 8-byte all_reduce, us per call ({a.jobs} alternating jobs x 3 repeats x 2000 calls; slowest rank)")
    print()
    print("| ranks | path | median | min | max |")
    print("|---|---|---|---|---|")
    for world, (py, rs) in rows.items():
        if rs:
            print(f"| {world} | Rust API (examples/allreduce_latency) | {stats(rs)} |")
        print(f"| {world} | Python, numpy (ProcessGroup.all_reduce) | {stats(py)} |")
        if rs:
            print(f"| {world} | **added by Python** (difference of medians) | "
                  f"**{statistics.median(py) - statistics.median(rs):+.1f}** | | |")
    if a.ringleader:
        try:
            pf = perf_latency(a.ringleader, a.jobs)
            print(f"| 2 | `ringleader perf -b 8 -e 8` (mean per call) | {stats(pf)} |")
        except (subprocess.SubprocessError, OSError, KeyError, ValueError) as e:
            print(f"| 2 | `ringleader perf` failed: {e} | | | |")
    over = json.loads(subprocess.run(me + ["--worker", "overhead"], capture_output=True, text=True,
                                     check=True).stdout)["resolve_us"]
    print(f"\nPython-side buffer resolution alone (numpy array -> pointer, count, dtype): {over:.2f} us per call")


def torch_table(a, me):
    gl, rl = {}, {}
    for _ in range(2):  # alternate backends; each job does repeats/2 timed loops per size
        for name, acc in (("gloo", gl), ("ringleader", rl)):
            out = json.loads(spawn(2, me + ["--worker", name, "--repeats", str((a.repeats + 1) // 2)])[0])
            for k, v in out.items():
                acc.setdefault(k, []).extend(v)
    n = len(next(iter(rl.values())))
    print()
    print(f"## torch.distributed.all_reduce (float32, sum), 2 ranks on this host (median of {n}; us per call)")
    print()
    print("| size | gloo us | ringleader us | gloo busbw GB/s | ringleader busbw GB/s | gloo / ringleader time |")
    print("|---|---|---|---|---|---|")
    for label, nbytes in SIZES:
        g, r = statistics.median(gl[label]), statistics.median(rl[label])
        bw = lambda us: nbytes / us / 1e3  # noqa: E731  busbw = algbw x 2(n-1)/n = algbw for n = 2
        print(f"| {label} | {g:.1f} | {r:.1f} | {bw(g):.3f} | {bw(r):.3f} | {g / r:.2f}x |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ringleader", default=os.environ.get("RINGLEADER_BIN") or shutil.which("ringleader"),
                    help="the ringleader CLI, for `ringleader perf` (default: $RINGLEADER_BIN or PATH)")
    ap.add_argument("--rust-example", default=default_example(),
                    help="built examples/allreduce_latency (cargo build --release --example allreduce_latency)")
    ap.add_argument("--jobs", type=int, default=5, help="alternating Rust/Python jobs per world size")
    ap.add_argument("--repeats", type=int, default=6, help="timed loops per size and backend (torch)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-latency", action="store_true")
    a = ap.parse_args()
    me = [sys.executable, os.path.abspath(__file__)]
    if a.worker == "python":
        return worker_python_latency(a.repeats, 2000)
    if a.worker == "overhead":
        return worker_python_overhead(100000)
    if a.worker in ("ringleader", "gloo"):
        return worker_torch(a.worker, a.repeats)
    if not a.skip_latency:
        latency_table(a, me)
    if not a.skip_torch:
        torch_table(a, me)


if __name__ == "__main__":
    main()
