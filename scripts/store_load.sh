#!/usr/bin/env bash
# Runs the store load simulator (crates/ringleader-store/examples/store_load.rs)
# over world sizes and modes, each run bounded, and prints every run's report
# with the machine's load before it. Usage:
#   scripts/store_load.sh [sizes...]          (default: 1024 4096 16384)
# Set MODES to a list of "liveness:verdict:poll-ms" (default: main's pattern
# and the pushed changes with one verdict) and RENDEZVOUS=main|poll|counter.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p ringleader-store --example store_load
sizes=("${@:-1024 4096 16384}")
modes=${MODES:-"poll:each:100 changes:once:100 changes:once:500"}
for n in ${sizes[@]}; do
  for m in $modes; do
    IFS=: read -r liveness verdict poll <<<"$m"
    echo "== $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg): --ranks $n --liveness $liveness --verdict $verdict --poll-ms $poll"
    timeout 900 target/release/examples/store_load --ranks "$n" --rendezvous "${RENDEZVOUS:-counter}" \
      --liveness "$liveness" --verdict "$verdict" --poll-ms "$poll" --steady 10 2>&1 | cut -c1-400 || echo "(exit $?)"
  done
done
