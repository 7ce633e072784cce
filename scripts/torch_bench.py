#!/usr/bin/env python3
"""The torch path: backend="ringleader" against gloo through torch.distributed.

Each launch starts `torchrun --nproc-per-node N` on this script in worker
mode for one backend; launches alternate between the backends (ringleader,
gloo, gloo, ringleader, ...) so that a noisy neighbour hurts both alike.
Every worker measures, in one process group:

- ``dist.all_reduce`` (blocking, float32 sum) at each size: as many warm-up
  calls as timed ones, a barrier, then ``--calls`` calls each timed on its
  own; the worker keeps the 10th percentile, median, 90th percentile and
  mean per call. The launch's figure is the slowest rank's. For ringleader
  the same calls through its own Python API (``ProcessGroup.all_reduce`` on
  the backend's communicator) are timed too, up to 64 KiB: the difference is
  what the torch path adds.
- a DDP training step of a small MLP (``--ddp-width``; the default has 1.7 M
  parameters, 6.8 MB of float32 gradients, so DDP's default buckets make two
  all_reduces per step, the first while backward still runs): zero_grad,
  forward, backward, SGD step, ``--ddp-steps`` steps after warm-up, median
  per step. For reference, the same step without DDP (compute alone, no
  communication) and a blocking all_reduce of all gradients in one tensor
  are timed too: a DDP step shorter than their sum is communication
  overlapped with backward.

The table gives, per backend and measure, the median over launches and the
range (min-max) of the launches' figures; every launch's figures and the
load average before it are kept in the JSON (``--json``) and printed with
``--every``.

``--breakdown`` measures instead where one blocking call's time goes, in one
process (world size 1, so no peer's timing enters): torch's dispatch of a
Python backend that does nothing, then each layer of the ringleader backend
down to the raw C call, blocking and asynchronous. ``--variant NAME=PATH`` adds a column NAME: backend
"ringleader" with the package found on PATH (PYTHONPATH), to compare two
versions of the backend in one run.

    scripts/torch_bench.py --launches 5
    scripts/torch_bench.py --launches 7 --sizes 8 4K 1M --json out.json --every
    scripts/torch_bench.py --variant before=/tmp/old-package --backends ringleader before gloo
    scripts/torch_bench.py --breakdown --variant before=/tmp/old-package

Python comes from ${RINGLEADER_VENV:-$HOME/.cache/ringleader/venv}; the
ringleader package from the environment (PYTHONPATH, or the venv), its
library as the package finds it (RINGLEADER_LIBRARY honoured).
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.environ.get("RINGLEADER_VENV", os.path.expanduser("~/.cache/ringleader/venv"))
# A launch that takes longer than this is stuck (a real launch takes well under a minute).
LAUNCH_LIMIT_S = 300


def parse_size(s: str) -> int:
    """8, 4K, 1M (powers of 1024)."""
    t = s.strip().upper().rstrip("B").rstrip("I")
    shift = {"K": 10, "M": 20, "G": 30}.get(t[-1:], 0)
    if shift:
        t = t[:-1]
    if not t.isdigit():
        raise argparse.ArgumentTypeError(f"{s!r} is not a size (8, 4K, 1M)")
    return int(t) << shift


def label(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


# ------------------------------------------------------------------- worker


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    rl_torch = None
    if args.backend == "ringleader":
        import ringleader.torch as rl_torch  # registers backend="ringleader"

    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    out = {"backend": args.backend, "rank": rank, "world": dist.get_world_size(), "all_reduce": {}, "api": {}, "ddp": {}}
    now = time.perf_counter

    def timed(call, calls: int) -> dict:
        # As many warm-up calls as timed ones, so that the first size is not
        # the one measured while the job settles after start-up.
        for _ in range(calls):
            call()
        dist.barrier()
        per = []
        start = now()
        for _ in range(calls):
            t0 = now()
            call()
            per.append(now() - t0)
        total = now() - start
        per.sort()
        return {
            "p10_us": per[len(per) // 10] * 1e6,
            "median_us": statistics.median(per) * 1e6,
            "p90_us": per[len(per) * 9 // 10] * 1e6,
            "mean_us": total / calls * 1e6,
            "calls": calls,
        }

    for nbytes in args.sizes:
        t = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        calls = args.calls if nbytes <= 64 << 10 else max(50, args.calls // 10)
        out["all_reduce"][str(nbytes)] = timed(lambda: dist.all_reduce(t), calls)
        if rl_torch is not None and nbytes <= 64 << 10:
            # The same call through ringleader's own Python API on the same
            # communicator: what the torch path adds at 2 ranks, in one launch.
            pg = rl_torch.communicator()
            out["api"][str(nbytes)] = timed(lambda: pg.all_reduce(t), calls)

    torch.manual_seed(0)
    w = args.ddp_width

    def model():
        return nn.Sequential(nn.Linear(w // 2, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w // 8))

    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(args.ddp_batch, w // 2, generator=gen)
    y = torch.randn(args.ddp_batch, w // 8, generator=gen)

    def steps(m, n):
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        per = []
        for _ in range(n):
            t0 = now()
            opt.zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            opt.step()
            per.append(now() - t0)
        return per

    local = model()
    grads = sum(p.numel() for p in local.parameters())
    steps(local, args.ddp_warmup)
    local_ms = statistics.median(steps(local, args.ddp_steps)) * 1e3
    ddp = nn.parallel.DistributedDataParallel(model())
    steps(ddp, args.ddp_warmup)
    dist.barrier()
    ddp_ms = statistics.median(steps(ddp, args.ddp_steps)) * 1e3
    flat = torch.ones(grads)
    dist.all_reduce(flat)
    dist.barrier()
    per = []
    for _ in range(args.ddp_steps):
        t0 = now()
        dist.all_reduce(flat)
        per.append(now() - t0)
    out["ddp"] = {
        "params": grads,
        "grad_bytes": grads * 4,
        "step_ms": ddp_ms,
        "local_step_ms": local_ms,
        "grads_all_reduce_ms": statistics.median(per) * 1e3,
    }
    dist.barrier()
    dist.destroy_process_group()
    with open(f"{args.out}.rank{rank}", "w") as f:
        json.dump(out, f)


# ---------------------------------------------------------------- breakdown


def breakdown_worker(args) -> None:
    """One process, world size 1: each layer of one 8-byte all_reduce (and the whole call at 4 KiB)."""
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import Backend as CBackend

    import ringleader.torch as rt
    from ringleader import _callsite, _lib

    class Done(dist._Work):
        """The cheapest completed Work a Python backend can return (no
        Python __init__), the same in every column."""

        __slots__ = ("_result",)

        def wait(self, timeout=None) -> bool:
            return True

        def result(self):
            return self._result

    class Idle(CBackend):
        """A backend that does nothing: what torch itself costs per call."""

        def allreduce(self, tensors, opts=None):
            w = Done()
            w._result = tensors
            return w

        def getBackendName(self) -> str:  # noqa: N802 (torch's name)
            return "idle"

    dist.Backend.register_backend("idle", lambda store, rank, size, timeout: Idle(rank, size), devices=["cpu"])
    calls = args.calls * 10
    now = time.perf_counter

    def per_call(fn) -> float:
        for _ in range(calls // 10):
            fn()
        best = []
        for _ in range(5):
            t0 = now()
            for _ in range(calls):
                fn()
            best.append((now() - t0) / calls * 1e6)
        return statistics.median(best)

    t = torch.ones(2)
    t4k = torch.ones(1024)
    out = {}
    dist.init_process_group("ringleader")
    blocking = dist.AllreduceOptions()
    blocking.asyncOp = False
    asynchronous = dist.AllreduceOptions()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    pg = rt.communicator()
    h = pg._h
    out["dist.all_reduce(t)"] = per_call(lambda: dist.all_reduce(t))
    out["dist.all_reduce(t), 4 KiB"] = per_call(lambda: dist.all_reduce(t4k))
    out["dist.all_reduce(t, async_op=True).wait()"] = per_call(lambda: dist.all_reduce(t, async_op=True).wait())
    out["backend.allreduce (blocking opts)"] = per_call(lambda: backend.allreduce([t], blocking))
    out["backend.allreduce (blocking opts), 4 KiB"] = per_call(lambda: backend.allreduce([t4k], blocking))
    out["backend.allreduce (async opts).wait()"] = per_call(lambda: backend.allreduce([t], asynchronous).wait())
    out["ringleader ProcessGroup.all_reduce(t)"] = per_call(lambda: pg.all_reduce(t))
    out["ringleader ProcessGroup.all_reduce(t, async_op=True).wait()"] = per_call(
        lambda: pg.all_reduce(t, async_op=True).wait())
    out["call-site capture (_callsite.note)"] = per_call(_callsite.note)
    done = getattr(rt, "_done", None) or rt._DoneWork
    out["the completed Work the backend returns"] = per_call(lambda: done([t]))
    out["hash(opts.reduceOp) (torch's options, read)"] = per_call(lambda: hash(blocking.reduceOp))
    out["raw rl_all_reduce through ctypes"] = per_call(lambda: _lib.lib.rl_all_reduce(h, t.data_ptr(), 2, 0, 0, None))
    fast = getattr(getattr(_lib, "hot", None), "rl_all_reduce", _lib.lib.rl_all_reduce)
    out["raw rl_all_reduce, word-typed prototype (_lib.hot)"] = per_call(lambda: fast(h, t.data_ptr(), 2, 0, 0, None))
    dist.destroy_process_group()
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group("idle")
    out["dist.all_reduce(t), a backend that does nothing"] = per_call(lambda: dist.all_reduce(t))
    out["dist.all_reduce(t), 4 KiB, a backend that does nothing"] = per_call(lambda: dist.all_reduce(t4k))
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump(out, f)


def breakdown(args) -> None:
    """Runs breakdown_worker for each ringleader column, interleaved, and prints medians."""
    columns = [c for c in args.backends if c == "ringleader" or c in args.variants]
    got = {c: [] for c in columns}
    with tempfile.TemporaryDirectory(prefix="rl-torch-breakdown-") as tmp:
        for i in range(args.launches):
            for c in (columns if i % 2 == 0 else list(reversed(columns))):
                env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
                if c in args.variants:
                    env.update(args.variants[c])
                out = os.path.join(tmp, f"{c}-{i}.json")
                cmd = [os.path.join(VENV, "bin", "python"), os.path.abspath(__file__), "--breakdown-worker",
                       "--out", out, "--calls", str(args.calls)]
                subprocess.run(cmd, env=env, check=True, timeout=LAUNCH_LIMIT_S, stdout=subprocess.DEVNULL)
                with open(out) as f:
                    got[c].append({"load1": os.getloadavg()[0], "us": json.load(f)})
    keys = list(got[columns[0]][0]["us"])
    width = max(len(k) for k in keys)
    loads = [r["load1"] for c in columns for r in got[c]]
    print(f"# one 8-byte all_reduce, world size 1, us per call: median of {args.launches} processes [min-max]; "
          f"load average {min(loads):.2f}-{max(loads):.2f}, {os.cpu_count()} CPUs")
    print(f"{'layer':<{width}}" + "".join(f"{c:>26}" for c in columns))
    for k in keys:
        row = f"{k:<{width}}"
        for c in columns:
            v = [r["us"][k] for r in got[c]]
            row += f"{statistics.median(v):>9.2f} [{min(v):.2f}-{max(v):.2f}]".rjust(26)
        print(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"breakdown": got, "cpus": os.cpu_count()}, f, indent=1)


# ------------------------------------------------------------------- driver


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, column: str, out: str) -> list:
    """One torchrun launch of the workers for ``column`` (a backend or a
    --variant); each rank's figures."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    backend = column
    if column in args.variants:
        backend = "ringleader"
        env.update(args.variants[column])
    torchrun = os.path.join(VENV, "bin", "torchrun")
    cmd = [torchrun, "--nproc-per-node", str(args.nproc), "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), os.path.abspath(__file__), "--worker", "--backend", backend,
           "--out", out, "--calls", str(args.calls), "--ddp-steps", str(args.ddp_steps),
           "--ddp-warmup", str(args.ddp_warmup), "--ddp-width", str(args.ddp_width),
           "--ddp-batch", str(args.ddp_batch), "--sizes", *[str(s) for s in args.sizes]]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        text, _ = p.communicate(timeout=LAUNCH_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise SystemExit(f"{column}: the launch did not end within {LAUNCH_LIMIT_S} s")
    if p.returncode != 0:
        raise SystemExit(f"{column}: torchrun failed ({p.returncode}):\n{text.decode(errors='replace')[-3000:]}")
    ranks = []
    for r in range(args.nproc):
        with open(f"{out}.rank{r}") as f:
            ranks.append(json.load(f))
    return ranks


def slowest(ranks: list) -> dict:
    """A launch's figures: each measure's slowest rank."""
    fig = {}
    for key in ranks[0]["all_reduce"]:
        for m in ("p10_us", "median_us", "p90_us", "mean_us"):
            fig[f"all_reduce {label(int(key))} {m}"] = max(r["all_reduce"][key][m] for r in ranks)
    for key in ranks[0].get("api", {}):
        for m in ("p10_us", "median_us", "mean_us"):
            fig[f"ringleader API {label(int(key))} {m}"] = max(r["api"][key][m] for r in ranks)
    for m in ("step_ms", "local_step_ms", "grads_all_reduce_ms"):
        fig[f"ddp {m}"] = max(r["ddp"][m] for r in ranks)
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--launches", type=int, default=5, help="launches per backend (interleaved)")
    ap.add_argument("--backends", nargs="+", default=["ringleader", "gloo"])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--sizes", nargs="+", type=parse_size, default=[8, 4 << 10, 1 << 20])
    ap.add_argument("--calls", type=int, default=2000, help="timed calls per size up to 64 KiB (a tenth above)")
    ap.add_argument("--ddp-steps", type=int, default=30)
    ap.add_argument("--ddp-warmup", type=int, default=5)
    ap.add_argument("--ddp-width", type=int, default=1024)
    ap.add_argument("--ddp-batch", type=int, default=64)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=PATH[,LIBRARY]",
                    help="a column NAME: backend ringleader with PYTHONPATH=PATH (and RINGLEADER_LIBRARY=LIBRARY)")
    ap.add_argument("--json", help="write every launch's figures here")
    ap.add_argument("--every", action="store_true", help="print every launch's figures too")
    ap.add_argument("--breakdown", action="store_true", help="where one call's time goes (world size 1)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--breakdown-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if args.breakdown_worker:
        breakdown_worker(args)
        return
    args.variants = {}
    for v in args.variant:
        name, sep, path = v.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"--variant {v!r}: expected NAME=PATH or NAME=PATH,LIBRARY")
        pythonpath, _, library = path.partition(",")
        args.variants[name] = {"PYTHONPATH": pythonpath, **({"RINGLEADER_LIBRARY": library} if library else {})}
        if name not in args.backends:
            args.backends.append(name)
    if not os.path.exists(os.path.join(VENV, "bin", "torchrun")):
        raise SystemExit(f"no torchrun in {VENV} (set RINGLEADER_VENV)")
    if args.breakdown:
        breakdown(args)
        return

    runs = []
    with tempfile.TemporaryDirectory(prefix="rl-torch-bench-") as tmp:
        for i in range(args.launches):
            order = args.backends if i % 2 == 0 else list(reversed(args.backends))
            for b in order:
                load = os.getloadavg()[0]
                fig = slowest(launch(args, b, os.path.join(tmp, f"{b}-{i}")))
                runs.append({"launch": i, "backend": b, "load1": load, "figures": fig})
                print(f"# launch {i + 1}/{args.launches} {b}: load {load:.2f}, all_reduce 8 B "
                      f"{fig.get('all_reduce 8 B median_us', float('nan')):.1f} us, ddp step {fig['ddp step_ms']:.1f} ms",
                      file=sys.stderr, flush=True)

    loads = [r["load1"] for r in runs]
    print(f"# torch.distributed, {args.nproc} ranks (torchrun), {args.launches} interleaved launches per backend; "
          f"1-min load average before the launches {min(loads):.2f}-{max(loads):.2f}, {os.cpu_count()} CPUs")
    print("# each launch's figure is its slowest rank's; the table gives the median over launches [min-max]")
    keys = list(dict.fromkeys(k for r in runs for k in r["figures"]))
    width = max(len(k) for k in keys)
    print(f"{'measure':<{width}}" + "".join(f"{b:>28}" for b in args.backends))
    for k in keys:
        row = f"{k:<{width}}"
        for b in args.backends:
            v = [r["figures"][k] for r in runs if r["backend"] == b and k in r["figures"]]
            row += (f"{statistics.median(v):>11.2f} [{min(v):.2f}-{max(v):.2f}]" if v else "-").rjust(28)
        print(row)
    if args.every:
        for r in runs:
            print(f"launch {r['launch']} {r['backend']} load {r['load1']:.2f}: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in r["figures"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k not in ("worker", "backend", "out", "variant", "breakdown_worker")},
                       "cpus": os.cpu_count(), "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
