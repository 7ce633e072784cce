#!/usr/bin/env python3
"""Interleaved A/B of `ringleader perf` builds: which of two (or more) binaries is faster.

Launches of one binary differ from each other by more than most changes to
the small-message path (the VM's fast and slow states, where the ranks
land), so two builds are compared launch by launch: every round runs each
binary once per (ranks, op), in turn, the order reversed every other round,
and the table gives per cell the median [min-max] over the rounds and the
first binary's median over each other's (above 1: the other is faster).

    scripts/ab_perf.py ROUNDS "NPROCS" "OPS" SIZES BINARY...
    scripts/ab_perf.py 8 "2 4" "broadcast all_reduce" 8,64,4K /tmp/rl-before /tmp/rl-after

Binaries are `ringleader` builds copied aside (`cargo build --release -p
ringleader-cli`, then `cp target/release/ringleader /tmp/rl-NAME`).
TRANSPORT=tcp (default shm) picks the transport; PERF_ARGS adds options
to every launch (`PERF_ARGS="-n 20000 -w 1000"`: more calls per launch
than the adaptive count's 1000 at most). Barrier runs at size 0.
"""

import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile


def main():
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    rounds, nprocs, ops, sizes = int(sys.argv[1]), sys.argv[2].split(), sys.argv[3].split(), sys.argv[4]
    bins = sys.argv[5:]
    transport = os.environ.get("TRANSPORT", "shm")
    extra = os.environ.get("PERF_ARGS", "").split()
    times = collections.defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="rl-ab-") as tmp:
        out = os.path.join(tmp, "row.jsonl")
        for r in range(rounds):
            print(f"# round {r + 1}/{rounds}", file=sys.stderr, flush=True)
            for n in nprocs:
                for op in ops:
                    for b in bins if r % 2 == 0 else bins[::-1]:
                        if os.path.exists(out):
                            os.remove(out)
                        cmd = [b, "perf", "--op", op, "--nproc", n, "--transport", transport,
                               "--sizes", "0" if op == "barrier" else sizes, "--json", out, "--time-limit", "120"] + extra
                        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                        if p.returncode != 0:
                            print(f"# failed: {' '.join(cmd)}: {p.stderr[-300:]}", file=sys.stderr)
                            continue
                        with open(out) as f:
                            for line in f:
                                row = json.loads(line)
                                times[(int(n), op, row["bytes"], b)].append(row["time_us"])
    names = [os.path.basename(b) for b in bins]
    print(f"# {transport}, time per call (us, slowest rank), median [min-max] of {rounds} interleaved launches")
    for cell in sorted({k[:3] for k in times}):
        v = [times[cell + (b,)] for b in bins]
        if not all(v):
            continue
        meds = [statistics.median(x) for x in v]
        line = f"{cell[0]}r {cell[1]:<15}{cell[2]:>9} "
        line += "  ".join(f"{name}: {m:8.3f} [{min(x):.3f}-{max(x):.3f}]" for name, m, x in zip(names, meds, v))
        print(line + "  " + " ".join(f"{meds[0] / m:.2f}x" for m in meds[1:]))


if __name__ == "__main__":
    main()
