#!/usr/bin/env python3
"""What one call of ringleader's numpy API costs per layer, in one process
(world size 1, so no peer's scheduling enters the figures).

Each layer is timed over 5 x ``--calls`` calls after ``--calls / 10`` warm-up
calls; a process's figure is the median of the 5, and the table gives the
median over ``--launches`` processes [min-max]. ``--variant NAME=PATH`` adds a
column: the package found on PATH (PYTHONPATH), launched interleaved with the
others (a, b, b, a, ...), so that a noisy neighbour hurts every column alike.

Layers (8-byte float32 array unless named; in place, sum):

- ``pg.all_reduce(x)`` / 4 KiB / ``pg.barrier()`` / ``pg.broadcast(x)`` /
  ``pg.all_gather(out, x)``: the whole call, as user code makes it;
- ``pg.all_reduce(x, async_op=True).wait()``;
- ``_buffers.resolve``: the buffer's pointer, count and dtype code;
- ``_callsite.note``: the call-site capture (one frame above it is user code);
- raw ``rl_all_reduce`` / ``rl_barrier`` through ctypes, the pointer known:
  the C call and ctypes' own marshalling;
- ``rl_comm_rank`` through ctypes: ctypes' floor (a C function that only
  reads a field);
- an empty Python function: the interpreter's floor for one call.

Usage (from the repository root):

    PYTHONPATH=ffi/python RINGLEADER_LIBRARY=target/release/libringleader.so \\
        ~/.cache/ringleader/venv/bin/python ffi/python/bench/call_cost.py --launches 5 \\
        --variant before=/tmp/old/ffi/python
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(args) -> None:
    import numpy as np

    import ringleader
    from ringleader import _buffers, _callsite, _lib

    calls = args.calls
    now = time.perf_counter

    def per_call(fn) -> float:
        for _ in range(calls // 10):
            fn()
        got = []
        for _ in range(5):
            t0 = now()
            for _ in range(calls):
                fn()
            got.append((now() - t0) / calls * 1e6)
        return statistics.median(got)

    pg = ringleader.init(rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port(), timeout=60)
    x = np.ones(2, dtype=np.float32)
    x4k = np.ones(1024, dtype=np.float32)
    out = np.empty(2, dtype=np.float32)
    h = pg._h
    ptr = x.__array_interface__["data"][0]
    lib = _lib.lib
    resolve = _buffers.resolve
    note = _callsite.note

    def empty():
        pass

    res = {}
    res["pg.all_reduce(x), 8 B"] = per_call(lambda: pg.all_reduce(x))
    res["pg.all_reduce(x), 4 KiB"] = per_call(lambda: pg.all_reduce(x4k))
    res["pg.all_reduce(x, op='max'), 8 B"] = per_call(lambda: pg.all_reduce(x, op="max"))
    res["pg.barrier()"] = per_call(lambda: pg.barrier())
    res["pg.broadcast(x, 0), 8 B"] = per_call(lambda: pg.broadcast(x, 0))
    res["pg.all_gather(out, x), 8 B"] = per_call(lambda: pg.all_gather(out, x))
    res["pg.all_reduce(x, async_op=True).wait()"] = per_call(lambda: pg.all_reduce(x, async_op=True).wait())
    res["_buffers.resolve(x, 'buf', True)"] = per_call(lambda: resolve(x, "buf", True))
    res["_callsite.note()"] = per_call(lambda: note())
    res["raw rl_all_reduce via ctypes"] = per_call(lambda: lib.rl_all_reduce(h, ptr, 2, 0, 0, None))
    res["raw rl_barrier via ctypes"] = per_call(lambda: lib.rl_barrier(h, None))
    res["rl_comm_rank via ctypes (floor)"] = per_call(lambda: lib.rl_comm_rank(h))
    res["empty Python function"] = per_call(lambda: empty())
    pg.destroy()
    with open(args.out, "w") as f:
        json.dump(res, f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--json", help="write every process's figures here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    columns = {"current": {}}
    for v in args.variant:
        name, sep, path = v.partition("=")
        if not sep:
            raise SystemExit(f"--variant {v!r}: expected NAME=PATH")
        columns[name] = {"PYTHONPATH": path}
    got = {c: [] for c in columns}
    names = list(columns)
    with tempfile.TemporaryDirectory(prefix="rl-call-cost-") as tmp:
        for i in range(args.launches):
            for c in (names if i % 2 == 0 else names[::-1]):
                env = dict(os.environ, OMP_NUM_THREADS="1", **columns[c])
                for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RINGLEADER_STORE_ADDR"):
                    env.pop(k, None)
                out = os.path.join(tmp, f"{c}-{i}.json")
                load = os.getloadavg()[0]
                subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", "--out", out,
                                "--calls", str(args.calls)], env=env, check=True, timeout=600)
                with open(out) as f:
                    got[c].append({"load1": load, "us": json.load(f)})
    keys = list(got[names[0]][0]["us"])
    width = max(len(k) for k in keys)
    loads = [r["load1"] for c in names for r in got[c]]
    print(f"# numpy API, world size 1, us per call: median of {args.launches} processes [min-max]; "
          f"load average {min(loads):.2f}-{max(loads):.2f}, {os.cpu_count()} CPUs; {args.calls} calls x 5 per layer")
    print(f"{'layer':<{width}}" + "".join(f"{c:>24}" for c in names))
    for k in keys:
        row = f"{k:<{width}}"
        for c in names:
            v = [r["us"][k] for r in got[c] if k in r["us"]]
            row += f"{statistics.median(v):>8.2f} [{min(v):.2f}-{max(v):.2f}]".rjust(24)
        print(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(got, f, indent=1)


if __name__ == "__main__":
    main()
