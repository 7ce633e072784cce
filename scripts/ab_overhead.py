#!/usr/bin/env python3
"""Interleaved A/B of the recorder's paired overhead: two (or more) builds of
examples/recorder_overhead, launch by launch.

`scripts/overhead.py --paired` measures one build; this runs several in
turn (the order and which communicator is made first alternating), and
prints per build the median of every block's on/off ratio, and the launches
split by the VM's state: a launch counts as slow when its off side took
SLOW_US (default 0.28) µs or more per call, where cross-core transfers cost
about twice as much and the recorder's share is about its share of the
instructions.

    scripts/ab_overhead.py LAUNCHES WHAT EXAMPLE...
    scripts/ab_overhead.py 12 both /tmp/ro-before /tmp/ro-after

WHAT is the example's fourth argument (both, recorder, checks, none).
Builds: `cargo build --release -p ringleader --example recorder_overhead`,
then copy target/release/examples/recorder_overhead aside.
"""

import collections
import os
import statistics
import sys

from overhead import REPO, paired_launch


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    launches, what, bins = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    slow_us = float(os.environ.get("SLOW_US", "0.28"))
    rl = os.path.join(REPO, "target", "release", "ringleader")
    ratios = collections.defaultdict(list)
    for i in range(launches):
        order = "on-first" if i % 2 == 0 else "off-first"
        for b in bins if i % 2 == 0 else bins[::-1]:
            d = paired_launch(rl, b, 8, 500, 200, what, order, dict(os.environ, RINGLEADER_TRANSPORT="shm"))
            r = [a / c for a, c in zip(d["on_us"], d["off_us"])]
            state = "slow" if statistics.median(d["off_us"]) >= slow_us else "fast"
            print(f"# launch {i + 1} {os.path.basename(b)} {order} {state}: {100 * (statistics.median(r) - 1):+.2f}% "
                  f"at {statistics.median(d['on_us']):.3f} us", file=sys.stderr, flush=True)
            ratios[(b, "all")].extend(r)
            ratios[(b, state)].append(statistics.median(r))
    for b in bins:
        line = f"{os.path.basename(b):<20} every block {100 * (statistics.median(ratios[(b, 'all')]) - 1):+.2f}% |"
        for state in ("fast", "slow"):
            v = ratios[(b, state)]
            if v:
                line += (f" {state} launches n={len(v)} median {100 * (statistics.median(v) - 1):+.2f}% "
                         f"[{100 * (min(v) - 1):+.1f}..{100 * (max(v) - 1):+.1f}] |")
        print(line)


if __name__ == "__main__":
    main()
