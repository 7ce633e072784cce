#!/usr/bin/env python3
"""What the flight recorder and the consistency checks cost a collective.

Runs `ringleader perf` (all_reduce, float32 sum, 2 ranks) with both on (the
default) and with both off (RINGLEADER_FR_SIZE=0 RINGLEADER_CHECKS=0),
interleaved, --repeats times per transport and size, and prints the medians
and the overhead. Each run times many calls (-n) so that one run is not one
scheduler hiccup; the spread between runs is printed too, because at 1 us a
difference of a few percent is a few tens of nanoseconds.

    scripts/overhead.py [--repeats 21] [--transports shm tcp]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (bytes, timed calls per run)
SIZES = [(8, 20000), (1 << 20, 500)]
OFF = {"RINGLEADER_FR_SIZE": "0", "RINGLEADER_CHECKS": "0"}


def run(binary, transport, nbytes, iters, env, out):
    cmd = [binary, "perf", "--op", "all_reduce", "--nproc", "2", "-b", str(nbytes), "-e", str(nbytes),
           "-n", str(iters), "--transport", transport, "--json", out, "--time-limit", "120"]
    subprocess.run(cmd, env=dict(os.environ, **env), stdout=subprocess.DEVNULL, check=True, timeout=150)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ringleader", default=os.path.join(REPO, "target", "release", "ringleader"))
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--transports", nargs="+", default=["shm", "tcp"])
    args = ap.parse_args()
    if not os.access(args.ringleader, os.X_OK):
        sys.exit(f"no ringleader binary at {args.ringleader}: cargo build --release -p ringleader-cli")
    with tempfile.TemporaryDirectory(prefix="rl-overhead-") as tmp:
        files = {}
        for rep in range(args.repeats):
            print(f"# repeat {rep + 1}/{args.repeats}", file=sys.stderr, flush=True)
            for t in args.transports:
                for nbytes, iters in SIZES:
                    for mode, env in (("on", {}), ("off", OFF)):
                        path = files.setdefault((t, nbytes, mode), os.path.join(tmp, f"{t}-{nbytes}-{mode}.jsonl"))
                        run(args.ringleader, t, nbytes, iters, env, path)
        print(f"# all_reduce, 2 ranks, median of {args.repeats} interleaved runs; time_us per call, slowest rank")
        print(f"{'transport':<10}{'bytes':>9}{'on us':>10}{'off us':>10}{'overhead':>10}"
              f"{'on q1-q3':>18}{'off q1-q3':>18}")
        for t in args.transports:
            for nbytes, _ in SIZES:
                v = {}
                for mode in ("on", "off"):
                    with open(files[(t, nbytes, mode)]) as f:
                        v[mode] = [json.loads(line)["time_us"] for line in f]
                on, off = statistics.median(v["on"]), statistics.median(v["off"])
                qs = {m: statistics.quantiles(v[m], n=4) for m in v}
                spread = {m: f"{qs[m][0]:.2f}-{qs[m][2]:.2f}" for m in v}
                print(f"{t:<10}{nbytes:>9}{on:>10.2f}{off:>10.2f}{100 * (on - off) / off:>+9.1f}%"
                      f"{spread['on']:>18}{spread['off']:>18}")


if __name__ == "__main__":
    main()
