#!/usr/bin/env bash
# Many local ranks, one failure (examples/scale_demo.rs) under `ringleader
# launch`: how long the job takes to start, when every rank learned of the
# failure, and how much the whole job wrote for it.
#
# Usage: scripts/scale_demo.sh [RANKS] [SCENARIO...]   (default 256, skip kill)
#   RINGLEADER_TIMEOUT (default 20) is the collective timeout of the skip run.
# Prints one block per scenario: the verdicts by kind and culprit, when they
# came (after the kill, or after the rank entered the collective), the job's
# wall time and its log size; leaves each job's stdout, stderr and per-rank
# lines under a temporary directory it names.
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-256}
shift || true
scenarios=("$@")
[ ${#scenarios[@]} -eq 0 ] && scenarios=(skip kill)

cargo build --release -q -p ringleader-cli -p ringleader --example scale_demo --bin ringleader
bin=target/release/ringleader
demo=target/release/examples/scale_demo
out=$(mktemp -d)

# Copies standard input to FILE, and each line with the Unix time it was
# read (microseconds) to FILE.t: when a rank printed its verdict, even if
# the launcher ended it before it could record that itself.
stamp() {
    python3 -u -c '
import sys, time
with open(sys.argv[1], "w") as plain, open(sys.argv[1] + ".t", "w") as timed:
    for line in sys.stdin:
        plain.write(line)
        timed.write(f"{int(time.time() * 1e6)} {line}")
' "$1"
}
echo "# $ranks ranks, load average before: $(cut -d' ' -f1-3 /proc/loadavg); files under $out"

for s in "${scenarios[@]}"; do
    dir=$out/$s
    mkdir -p "$dir/times"
    start=$(date +%s.%N)
    # TCP: the default shared-memory rings would ask for 2.1 MiB per local
    # peer and stream, far beyond /dev/shm at this many ranks on one host.
    SCALE_DEMO_TIMES=$dir/times RINGLEADER_TRANSPORT=tcp RINGLEADER_TIMEOUT=${RINGLEADER_TIMEOUT:-20} \
        timeout 300 "$bin" launch --nproc-per-node "$ranks" -- "$demo" "$s" 2>&1 >"$dir/stdout" | stamp "$dir/stderr" || true
    end=$(date +%s.%N)
    python3 - "$dir" "$s" "$ranks" "$start" "$end" <<'EOF'
import collections, os, pathlib, re, statistics, sys
d, scenario, ranks, start, end = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
lines = {int(p.name.split("-")[1]): p.read_text().strip() for p in (d / "times").iterdir()}
kinds = collections.Counter(l.split()[1] for l in lines.values() if l.startswith("failed "))
killed = [int(m.group(1)) for l in lines.values() if (m := re.match(r"victim killed at (\d+)", l))]
delays, printed = [], []
for l in (d / "stderr.t").read_text().splitlines():
    at, _, text = l.partition(" ")
    if "] error: [" in text and killed:
        printed.append((int(at) - killed[0]) / 1e6)
for l in lines.values():
    m = re.match(r"failed \S+ at (\d+) \(entered (\d+)\)", l)
    if m:
        at, entered = int(m.group(1)), int(m.group(2))
        delays.append((at - (killed[0] if killed else entered)) / 1e6)
out, err = (d / "stdout").read_text(), (d / "stderr").read_text()
first = re.search(r"first all_reduce done ([\d.]+) s", out)
verdict = next((l for l in err.splitlines() if "] error: [" in l), "")
print(f"## {scenario}: {len(lines)} of {ranks} ranks reported; failures by kind: {dict(kinds)}")
print(f"first all_reduce done {first.group(1) if first else '?'} s after rank 0 started; job {end - start:.1f} s end to end")
if delays:
    since = "the kill" if killed else "entering the collective"
    print(f"failure known {min(delays):.2f} s to {max(delays):.2f} s after {since} (median {statistics.median(delays):.2f} s)")
# The launcher prints each of the library's lines from 8 ranks and counts
# the others in one line at the end.
hidden = sum(int(m.group(1)) for m in re.finditer(r"ringleader launch: (\d+) more cop(?:y|ies) of the line rank \d+ printed above", err))
if printed:
    print(f"{len(printed)} ranks printed a verdict, {min(printed):.2f} s to {max(printed):.2f} s after the kill (median {statistics.median(printed):.2f} s; read off the launcher's output)")
if hidden:
    print(f"{hidden} more ranks printed the same line, counted by the launcher instead of repeated")
print(f"a rank's line: {verdict[:300]}")
print(f"whole job's log: {len(out.encode()) + len(err.encode())} bytes ({len(err.splitlines())} lines on stderr)")
EOF
done
