#!/usr/bin/env python3
"""ringleader against native Open MPI, launch by launch, split by the machine's state.

On the 2-vCPU development VM a cache line takes 35-190 ns from one vCPU to
the other and back in some launches and 290-570 ns in others (where the
hypervisor has put the two vCPUs), and the state changes between launches a
fraction of a second apart. Medians over a handful of launches then say
more about which state the launches met than about either library. This
runs each library in turn, launch after launch, measures that round trip
(docs/perf/core_pair_latency.c) right before and right after every launch,
and reports each cell per state: `near` (both probes under 200 ns), `apart`
(both over), and how many launches straddled a change (left out).

    scripts/by_state.py ROUNDS CELL... [--raw FILE]
    scripts/by_state.py 16 shm:all_reduce:64 shm:all_gather:512 tcp:broadcast:8

A cell is TRANSPORT:OP:BYTES (barrier: any size). Two ranks, 20,000 calls
per launch after 1,000 warm-up, run by bench_compare.py's native runners
(`ringleader perf`; `rl_mpi_bench` under mpirun with the native table's
options, built into target/ when missing). Needs a release build (`cargo
build --release -p ringleader-cli`), mpicc and mpirun; builds the probe
into target/ too. --raw appends one JSON line per launch (cell, library,
time, both probes).
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_compare  # noqa: E402
from bench_vs_gloo import target_dir  # noqa: E402

LIBS = {"ringleader": {"shm": "rl-perf-shm", "tcp": "rl-perf-tcp"},
        "openmpi": {"shm": "ompi-c-sm", "tcp": "ompi-c-tcp"}}
APART_NS = bench_compare.APART_NS


def launch(opts, lib, cell):
    transport, op, size = cell
    a = argparse.Namespace(**vars(opts))
    a.sizes = [size]
    rows = bench_compare.native_runner(LIBS[lib][transport])(a, op, 2)
    return next(iter(rows.values()))["time_us"]


def main():
    args = sys.argv[1:]
    raw = None
    if "--raw" in args:
        i = args.index("--raw")
        raw = args[i + 1]
        del args[i:i + 2]
    if len(args) < 2:
        sys.exit(__doc__)
    rounds = int(args[0])
    cells = [tuple(c.split(":")) for c in args[1:]]
    for c in cells:
        if len(c) != 3 or c[0] not in ("shm", "tcp"):
            sys.exit(f"by_state.py: a cell is TRANSPORT:OP:BYTES (shm or tcp), not {':'.join(c)}")
    rl = os.path.join(target_dir(), "release", "ringleader")
    if not os.path.exists(rl):
        sys.exit("by_state.py: build ringleader first: cargo build --release -p ringleader-cli")
    opts = argparse.Namespace(ringleader=rl, root=0, timeout=300.0, warmup=1000, iters=20000,
                              mpi_bench=None, mpicc="mpicc")
    opts.mpi_bench_path = bench_compare.mpi_c_binary(opts)
    cpl = bench_compare.build_probe()
    rows = []
    for r in range(rounds):
        for cell in cells:
            for lib in (["openmpi", "ringleader"] if r % 2 == 0 else ["ringleader", "openmpi"]):
                before = bench_compare.probe(cpl)
                t = launch(opts, lib, cell)
                after = bench_compare.probe(cpl)
                row = {"cell": ":".join(cell), "lib": lib, "round": r, "time_us": t,
                       "probe_before_ns": before, "probe_after_ns": after}
                rows.append(row)
                if raw:
                    with open(raw, "a") as f:
                        f.write(json.dumps(row) + "\n")
        print(f"# round {r + 1}/{rounds}", file=sys.stderr, flush=True)

    def state(row):
        return bench_compare.state_of(row["probe_before_ns"], row["probe_after_ns"])

    def summary(ts):
        if not ts:
            return "       -               "
        return f"{statistics.median(ts):7.3f} [{len(ts):2}]".ljust(23)

    print(f"# 2 ranks, us per call (slowest rank), median [launches] per state; {rounds} rounds, each library in turn;")
    print(f"# near / apart: the vCPU round trip under / over {APART_NS:.0f} ns before and after the launch; above 1: ringleader faster")
    print(f"{'cell':24} {'state':6} {'ringleader':23} {'Open MPI':23} ratio  (straddled)")
    for cell in cells:
        name = ":".join(cell)
        mine = [x for x in rows if x["cell"] == name]
        straddled = sum(1 for x in mine if state(x) is None)
        for st in ("near", "apart", "all"):
            pick = [x for x in mine if st == "all" or state(x) == st]
            a = [x["time_us"] for x in pick if x["lib"] == "ringleader"]
            b = [x["time_us"] for x in pick if x["lib"] == "openmpi"]
            ratio = f"{statistics.median(b) / statistics.median(a):5.2f}" if a and b else "    -"
            extra = f"  ({straddled})" if st == "all" else ""
            print(f"{name:24} {st:6} {summary(a)} {summary(b)} {ratio}{extra}")


if __name__ == "__main__":
    main()
