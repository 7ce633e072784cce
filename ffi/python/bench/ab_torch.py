#!/usr/bin/env python3
"""Variants of the torch backend side by side in one process (world size 1):
what ``dist.all_reduce`` and the backend's own part cost per call.

As ffi/python/bench/ab_layers.py does for the numpy API: each variant's
package is imported under its own name (a copy of ``PATH/ringleader`` as
``rl_<NAME>``; the library is loaded once), its backend registered with
torch as ``rl_<NAME>``, and one torch group made per variant
(``dist.new_group(backend="rl_<NAME>")`` over the single rank), so that
``dist.all_reduce(t, group=g)`` goes through torch's own path into that
variant's backend. A column ``torch`` is a backend that does nothing (its
allreduce returns a completed Work): torch's own cost. Each layer is timed
in rounds, one block of ``--block`` calls per column per round, the order
rotating; a column's figure is the median over rounds, ``[paired]`` the
median of the per-round differences to the first variant.

    PYTHONPATH=ffi/python RINGLEADER_LIBRARY=target/release/libringleader.so \\
        ~/.cache/ringleader/venv/bin/python ffi/python/bench/ab_torch.py \\
        before=/tmp/old/ffi/python after=ffi/python --rounds 30

Each variant's backend connects through the ``ringleader`` package found on
PYTHONPATH (its ``init``; the variant's own code is the backend's methods,
buffers, call sites and prototypes: what runs per call).
"""

import argparse
import datetime
import os
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_layers import load  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", nargs="+", metavar="NAME=PATH")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--block", type=int, default=1000, help="calls per block")
    args = ap.parse_args()
    import tempfile

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))
    for k in ("RINGLEADER_STORE_ADDR", "RINGLEADER_RUN_ID"):
        os.environ.pop(k, None)
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import Backend as CBackend

    import ringleader.torch  # noqa: F401  (the default group's backend; variants connect through it)

    torch.set_num_threads(1)

    class Done(dist._Work):
        __slots__ = ("_result",)

        def wait(self, timeout=None) -> bool:
            return True

        def result(self):
            return self._result

    class Idle(CBackend):
        def allreduce(self, tensors, opts=None):
            w = Done()
            w._result = tensors
            return w

        def getBackendName(self) -> str:  # noqa: N802
            return "idle"

    dist.Backend.register_backend("idle", lambda store, rank, size, timeout: Idle(rank, size), devices=["cpu"])
    names = []
    with tempfile.TemporaryDirectory(prefix="rl-ab-torch-") as tmp:
        for v in args.variants:
            name, sep, path = v.partition("=")
            if not sep or not name.isidentifier():
                raise SystemExit(f"{v!r}: expected NAME=PATH, NAME an identifier")
            load(name, os.path.abspath(path), tmp)
            mod = __import__(f"rl_{name}.torch", fromlist=["_create"])
            dist.Backend.register_backend(f"rl_{name}", mod._create, extended_api=True, devices=["cpu"])
            names.append(name)
        dist.init_process_group("ringleader", timeout=datetime.timedelta(seconds=60))
        groups = {n: dist.new_group([0], backend=f"rl_{n}") for n in names}
        groups["torch"] = dist.new_group([0], backend="idle")
    cols = names + ["torch"]
    backends = {c: groups[c]._get_backend(torch.device("cpu")) for c in cols}
    t8, t4k = torch.ones(2), torch.ones(1024)
    blocking = dist.AllreduceOptions()
    blocking.asyncOp = False
    rows = {
        "dist.all_reduce(t), 8 B": lambda g, b: (lambda: dist.all_reduce(t8, group=g)),
        "dist.all_reduce(t), 4 KiB": lambda g, b: (lambda: dist.all_reduce(t4k, group=g)),
        "backend.allreduce([t], blocking opts), 8 B": lambda g, b: (lambda: b.allreduce([t8], blocking)),
        "dist.all_reduce(t, async_op=True).wait(), 8 B": lambda g, b: (
            lambda: dist.all_reduce(t8, group=g, async_op=True).wait()),
    }
    now = time.perf_counter
    got = {}
    start = now()
    for k, make in rows.items():
        fns = {c: make(groups[c], backends[c]) for c in cols}
        if "async" in k or "backend." in k:
            fns.pop("torch")  # the idle backend's Work is not a real asynchronous one; no backend row
        cs = list(fns)
        for c in cs:
            for _ in range(args.block):
                fns[c]()
        got[k] = {c: [] for c in cs}
        for r in range(args.rounds):
            for c in cs[r % len(cs):] + cs[:r % len(cs)]:
                fn = fns[c]
                t0 = now()
                for _ in range(args.block):
                    fn()
                got[k][c].append((now() - t0) / args.block * 1e6)
    secs = now() - start
    dist.destroy_process_group()
    print(f"# torch backend, world size 1, us per call, one process, {args.rounds} rounds x {args.block} calls per "
          f"column and layer, order rotating; median over rounds; [paired]: median of the per-round differences "
          f"to {names[0]}; torch: a backend that does nothing; {secs:.0f} s, load average "
          f"{os.getloadavg()[0]:.2f} at the end, {os.cpu_count()} CPUs")
    width = max(len(k) for k in got)
    print(f"{'layer':<{width}}" + "".join(f"{c:>22}" for c in cols))
    for k, per in got.items():
        row = f"{k:<{width}}"
        base = per[names[0]]
        for c in cols:
            if c not in per:
                row += "-".rjust(22)
                continue
            med = statistics.median(per[c])
            if c == names[0]:
                row += f"{med:>22.3f}"
            else:
                d = statistics.median(a - b for a, b in zip(per[c], base))
                row += f"{med:.3f} [{d:+.3f}]".rjust(22)
        print(row)


if __name__ == "__main__":
    main()
