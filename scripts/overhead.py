#!/usr/bin/env python3
"""What the flight recorder and the consistency checks cost a collective.

Runs `ringleader perf` (all_reduce, float32 sum, 2 ranks) with both on (the
default) and with both off (RINGLEADER_FR_SIZE=0 RINGLEADER_CHECKS=0),
interleaved, --repeats times per transport and size, and prints the medians
and the overhead. Each run times many calls (-n) so that one run is not one
scheduler hiccup; the spread between runs is printed too, because at 1 us a
difference of a few percent is a few tens of nanoseconds.

    scripts/overhead.py [--repeats 21] [--transports shm tcp]

At 8 bytes the difference is a few percent of a microsecond, and separate
launches differ by more than that (which cores the ranks land on, the host's
other tenants). `--paired` measures inside each launch instead: the example
`recorder_overhead` opens two communicators over the same ranks, one as
configured and one with the recorder and checks off, and times alternating
blocks of calls on each; the launches alternate which communicator is made
first, and a control (nothing turned off in the second) shows what is left
of that difference. It prints the median of the per-block ratios with a
bootstrap 95% interval.

    scripts/overhead.py --paired [--launches 10] [--transports shm]

`--fail-above PCT` (with --paired) makes it a test: it exits 1 when the
8-byte overhead's median is above PCT. A control farther than PCT/2 from
zero means the launches themselves differed by that much, not the
recorder: the measurement is run once more, then it fails. scripts/test.sh
runs it with a bound that catches a regression; the recorder's own target
is 2%, and docs/perf/small-messages-2026-12-03.md says where it stands.
"""

import argparse
import json
import os
import random
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


# (bytes, calls per block, blocks per launch) of the paired runs
PAIRED_SIZES = [(8, 500, 200), (1 << 20, 20, 60)]


def paired_launch(ringleader, example, nbytes, calls, blocks, what, order, env):
    """One launch of the paired example on 2 ranks: its JSON line (per-block
    `on_us` and `off_us`), or raises with the launch's output."""
    cmd = [ringleader, "launch", "--nproc-per-node", "2", "--", example, str(nbytes), str(calls), str(blocks), what, order]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=300).stdout
    line = next(x for x in out.splitlines() if "on_us" in x)
    return json.loads(line[line.index("{"):])


def paired(args):
    example = os.path.join(REPO, "target", "release", "examples", "recorder_overhead")
    if not os.access(example, os.X_OK):
        sys.exit(f"no example at {example}: cargo build --release -p ringleader --example recorder_overhead")
    print(f"# all_reduce, 2 ranks, {args.launches} launches each; per-block time on / off within one launch, "
          "median and bootstrap 95% interval; `none` is the control (nothing off)")
    print(f"{'transport':<10}{'bytes':>9}{'off':>9}{'blocks':>8}{'on us':>9}{'off us':>9}{'on/off':>9}{'95% interval':>18}")
    results = {}
    for t in args.transports:
        env = dict(os.environ, RINGLEADER_TRANSPORT=t)
        for nbytes, calls, blocks in PAIRED_SIZES:
            runs = {"both": ([], []), "none": ([], [])}
            for i in range(args.launches):
                order = "on-first" if i % 2 == 0 else "off-first"
                for what in runs:
                    d = paired_launch(args.ringleader, example, nbytes, calls, blocks, what, order, env)
                    print(f"# {t} {nbytes} {what} {order}: {json.dumps(d)}", file=sys.stderr, flush=True)
                    runs[what][0].extend(d["on_us"])
                    runs[what][1].extend(d["off_us"])
            for what, (on, off) in runs.items():
                ratios = [a / b for a, b in zip(on, off)]
                rnd = random.Random(0)
                boots = sorted(statistics.median(rnd.choices(ratios, k=len(ratios))) for _ in range(2000))
                lo, hi = boots[50], boots[1949]
                pct = 100 * (statistics.median(ratios) - 1)
                results[(t, nbytes, what)] = pct
                print(f"{t:<10}{nbytes:>9}{what:>9}{len(ratios):>8}{statistics.median(on):>9.3f}"
                      f"{statistics.median(off):>9.3f}{pct:>+8.1f}%"
                      f"{100 * (lo - 1):>+8.1f}%..{100 * (hi - 1):+.1f}%", flush=True)
    return results


def check(args):
    """--fail-above: the paired measurement as a test (see the module docs)."""
    for attempt in (1, 2):
        results = paired(args)
        noisy = [k for k, v in results.items() if k[2] == "none" and k[1] == 8 and abs(v) > args.fail_above / 2]
        if noisy:
            print(f"# attempt {attempt}: the control differs by more than {args.fail_above / 2}% "
                  f"({', '.join(f'{k[0]} {results[k]:+.1f}%' for k in noisy)}): the launches, not the recorder",
                  flush=True)
            continue
        over = [k for k, v in results.items() if k[2] == "both" and k[1] == 8 and v > args.fail_above]
        for k in over:
            print(f"FAIL: the recorder and checks cost {results[k]:+.1f}% at 8 B over {k[0]} "
                  f"(bound {args.fail_above}%)")
        return 1 if over else 0
    print("FAIL: the control stayed noisy in both attempts; the machine is too busy to measure this")
    return 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ringleader", default=os.path.join(REPO, "target", "release", "ringleader"))
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--transports", nargs="+", default=["shm", "tcp"])
    ap.add_argument("--paired", action="store_true", help="measure inside each launch (see above)")
    ap.add_argument("--launches", type=int, default=10, help="with --paired: launches per size and mode")
    ap.add_argument("--fail-above", type=float, metavar="PCT",
                    help="with --paired: exit 1 when the 8 B overhead is above PCT percent (see above)")
    args = ap.parse_args()
    if not os.access(args.ringleader, os.X_OK):
        sys.exit(f"no ringleader binary at {args.ringleader}: cargo build --release -p ringleader-cli")
    if args.fail_above is not None:
        if not args.paired:
            sys.exit("--fail-above needs --paired")
        return check(args)
    if args.paired:
        paired(args)
        return 0
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
    sys.exit(main())
