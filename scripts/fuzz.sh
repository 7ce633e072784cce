#!/usr/bin/env bash
# Bounded fuzzing of every fuzz target, as scripts/test.sh runs it on every
# push: the store's wire codec (decode) and server state machine (state),
# the data-plane frame header (frame) and handshake (hello) decoders. Each
# target runs for SECONDS (default 25, or RINGLEADER_FUZZ_SECS) from its
# committed seeds, with optimizations and debug assertions (overflow checks)
# on; a crash, a failed check or a leak past 2 GiB fails the script and
# leaves the input under target/fuzz-artifacts/. Needs a nightly toolchain
# (cargo-fuzz uses libFuzzer's instrumentation); installs cargo-fuzz if it
# is missing. Without nightly it says so and exits 0.
#
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
#   e.g. scripts/fuzz.sh 600 state   (a longer run of one target)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

secs=${1:-${RINGLEADER_FUZZ_SECS:-25}}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(decode state frame hello)

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz: SKIPPED: no nightly toolchain (cargo-fuzz needs one: rustup toolchain install nightly)"
    exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz"
    cargo +nightly install -q cargo-fuzz --locked
fi

dir_of() {
    case $1 in
    decode | state) echo crates/ringleader-store/fuzz ;;
    frame | hello) echo crates/ringleader-transport/fuzz ;;
    *) echo "fuzz: unknown target $1" >&2; exit 2 ;;
    esac
}

artifacts=$root/target/fuzz-artifacts
mkdir -p "$artifacts"
for t in "${targets[@]}"; do
    dir=$(dir_of "$t")
    work=$(mktemp -d)
    mkdir -p "$work/corpus"
    log=$work/log
    # New inputs go to the scratch corpus (first), the committed seeds stay as they are.
    if (cd "$dir" && cargo +nightly fuzz run -O -a "$t" "$work/corpus" "corpus/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$artifacts/$t-") >"$log" 2>&1; then
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
        rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
        echo "fuzz $t: ${runs:-?} inputs in $secs s, peak RSS ${rss:-?} MB, no failure"
        rm -rf "$work"
    else
        echo "fuzz $t: FAILED (log below; the input is under $artifacts)"
        tail -n 80 "$log"
        exit 1
    fi
done
