#!/usr/bin/env python3
"""Package variants side by side in one process: what each layer of the
numpy API costs per call, world size 1.

On a shared machine the speed of the same code drifts by 2x from second to
second (a neighbour on the host's other hyperthread, frequency), so
comparing processes run one after the other needs many of them. Here every
variant of the package is imported into the same process, under its own
name (a copy of ``PATH/ringleader`` as ``rl_<NAME>``; the library is loaded
once and shared), all wrap the same communicator, and each layer is timed
in rounds: per round one block of ``--block`` calls per variant, the order
rotating from round to round. A variant's figure is the median over
``--rounds`` rounds of its per-call time; the difference to the first
variant is the median of the per-round differences (paired, so drift that
lasts longer than one round cancels). Wall-clock time (perf_counter).

    PYTHONPATH=ffi/python RINGLEADER_LIBRARY=target/release/libringleader.so \\
        ~/.cache/ringleader/venv/bin/python ffi/python/bench/ab_layers.py \\
        before=/tmp/old/ffi/python after=ffi/python --rounds 40

Only the numpy API (``import ringleader``): the torch backend registers
itself with torch under one name, so variants of it are compared process by
process (scripts/torch_bench.py --breakdown --variant).
"""

import argparse
import importlib
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load(name: str, path: str, tmp: str):
    """The package at PATH/ringleader imported as rl_NAME."""
    src = os.path.join(path, "ringleader")
    if not os.path.isfile(os.path.join(src, "__init__.py")):
        raise SystemExit(f"{name}: no ringleader package in {path}")
    root = os.path.join(tmp, name)
    shutil.copytree(src, os.path.join(root, f"rl_{name}"), ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    sys.path.insert(0, root)
    return importlib.import_module(f"rl_{name}")


def layers(mod, pg, np):
    """name -> a function making one call of that layer through ``mod``."""
    x = np.ones(2, dtype=np.float32)
    x4k = np.ones(1024, dtype=np.float32)
    out = np.empty(2, dtype=np.float32)
    h = pg._h
    ptr = x.__array_interface__["data"][0]
    resolve = mod._buffers.resolve
    note = mod._callsite.note
    lib = mod._lib.lib
    hot = getattr(mod._lib, "hot", lib)  # the prototypes the API calls
    return {
        "pg.all_reduce(x), 8 B": lambda: pg.all_reduce(x),
        "pg.all_reduce(x), 4 KiB": lambda: pg.all_reduce(x4k),
        "pg.all_reduce(x, op='max'), 8 B": lambda: pg.all_reduce(x, op="max"),
        "pg.barrier()": lambda: pg.barrier(),
        "pg.broadcast(x, 0), 8 B": lambda: pg.broadcast(x, 0),
        "pg.all_gather(out, x), 8 B": lambda: pg.all_gather(out, x),
        "pg.all_reduce(x, async_op=True).wait()": lambda: pg.all_reduce(x, async_op=True).wait(),
        "_buffers.resolve(x, 'buf', True)": lambda: resolve(x, "buf", True),
        "_callsite.note()": lambda: note(),
        "rl_all_reduce through the API's prototype": lambda: hot.rl_all_reduce(h, ptr, 2, 0, 0, None),
        "rl_barrier through the API's prototype": lambda: hot.rl_barrier(h, None),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", nargs="+", metavar="NAME=PATH")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--block", type=int, default=2000, help="calls per block")
    ap.add_argument("--only", nargs="*", help="only the layers whose name contains one of these")
    ap.add_argument("--json", help="write every block's figure here")
    args = ap.parse_args()
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="rl-ab-") as tmp:
        mods = {}
        for v in args.variants:
            name, sep, path = v.partition("=")
            if not sep or not name.isidentifier():
                raise SystemExit(f"{v!r}: expected NAME=PATH, NAME an identifier")
            mods[name] = load(name, os.path.abspath(path), tmp)
    names = list(mods)
    first = mods[names[0]]
    owner = first.init(rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port(), timeout=60)
    pgs = {n: owner if n == names[0] else mods[n].ProcessGroup(owner._h) for n in names}
    table = {n: layers(mods[n], pgs[n], np) for n in names}
    keys = [k for k in table[names[0]] if not args.only or any(o in k for o in args.only)]
    now = time.perf_counter
    got = {k: {n: [] for n in names} for k in keys}
    start = now()
    for k in keys:
        for n in names:  # warm-up
            fn = table[n][k]
            for _ in range(args.block):
                fn()
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                fn = table[n][k]
                t0 = now()
                for _ in range(args.block):
                    fn()
                got[k][n].append((now() - t0) / args.block * 1e6)
    secs = now() - start
    for n in names[1:]:  # one communicator: only its owner destroys it
        pgs[n]._h = None
    owner.destroy()
    load1 = os.getloadavg()[0]
    print(f"# numpy API, world size 1, us per call, one process, {args.rounds} rounds x {args.block} calls per "
          f"variant and layer, order rotating; median over rounds; [paired]: median of the per-round "
          f"differences to {names[0]}; {secs:.0f} s, load average {load1:.2f} at the end, {os.cpu_count()} CPUs")
    width = max(len(k) for k in keys)
    print(f"{'layer':<{width}}" + "".join(f"{n:>22}" for n in names))
    for k in keys:
        row = f"{k:<{width}}"
        base = got[k][names[0]]
        for i, n in enumerate(names):
            med = statistics.median(got[k][n])
            if i == 0:
                row += f"{med:>22.3f}"
            else:
                d = statistics.median(a - b for a, b in zip(got[k][n], base))
                row += f"{med:.3f} [{d:+.3f}]".rjust(22)
        print(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"variants": args.variants, "rounds": args.rounds, "block": args.block, "us": got}, f)


if __name__ == "__main__":
    main()
