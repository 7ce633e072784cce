#!/usr/bin/env bash
# Instructions per call of small collectives, counted exactly: every rank of
# examples/call_loop under valgrind's callgrind, collecting only inside its
# timed loop (polling for the peer included, as in Open MPI's count in
# docs/perf/call-path-2026-12-04.md). Prints one line per op and counted
# rank. With ONLY=r, rank r alone runs under callgrind, the others natively:
# then r, about 50 times slower than its peers, finds their frames waiting
# and the count is the call path's alone, without polling, the same from
# run to run (the path's cost; rank 1 is a broadcast's receiver).
# (CALL_LOOP=path: that build of the example instead of this tree's.)
# Usage: [ONLY=r] [CALL_LOOP=path] scripts/call_instructions.sh [NPROC] [ITERS] [BYTES] [OPS...]
# (defaults: 2 ranks, 20000 calls, 8 B, barrier all_reduce broadcast all_gather reduce_scatter)
set -euo pipefail
cd "$(dirname "$0")/.."
nproc=${1:-2}
iters=${2:-20000}
bytes=${3:-8}
shift $(( $# < 3 ? $# : 3 ))
ops=("$@")
[ ${#ops[@]} -gt 0 ] || ops=(barrier all_reduce broadcast all_gather reduce_scatter)
command -v valgrind > /dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 2; }
[ -n "${CALL_LOOP:-}" ] || cargo build --release -q -p ringleader --example call_loop
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
bin="${CALL_LOOP:-$target_dir/release/examples/call_loop}"
out=$(mktemp -d)
[ -n "${KEEP:-}" ] && echo "callgrind files in $out" >&2 || trap 'rm -rf "$out"' EXIT
port=$(( 20000 + RANDOM % 20000 ))
for op in "${ops[@]}"; do
    port=$(( port + 1 ))
    pids=()
    for r in $(seq 0 $(( nproc - 1 ))); do
        vg=()
        if [ -z "${ONLY:-}" ] || [ "$ONLY" = "$r" ]; then
            vg=(valgrind --tool=callgrind --collect-atstart=no "--toggle-collect=*call_loop*timed*"
                "--callgrind-out-file=$out/$op.$r")
        fi
        RANK=$r WORLD_SIZE=$nproc LOCAL_RANK=$r LOCAL_WORLD_SIZE=$nproc MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            RINGLEADER_TRANSPORT=shm RINGLEADER_INIT_TIMEOUT=120 RINGLEADER_TIMEOUT=300 \
            timeout 600 "${vg[@]}" "$bin" "$op" "$iters" "$bytes" > "$out/$op.$r.stdout" 2> "$out/$op.$r.stderr" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do
        wait "$p" || { echo "$op: a rank failed; its stderr:" >&2; cat "$out/$op".*.stderr >&2; exit 1; }
    done
    for r in $(seq 0 $(( nproc - 1 ))); do
        [ -f "$out/$op.$r" ] || continue
        total=$(awk '/^(summary|totals):/ {print $2; exit}' "$out/$op.$r")
        python3 -c "import sys; t,n=int(sys.argv[1]),int(sys.argv[2]); print(f'$op ${bytes} B, rank $r of $nproc: {t/n:.0f} instructions per call ({n} calls)')" "$total" $(( iters + 200 ))
    done
done
