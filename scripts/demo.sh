#!/usr/bin/env bash
# The demo: a few ranks run collectives, then the classic hang (one rank makes
# an extra all_reduce) ends in an error that names the culprit, and
# `ringleader analyze` reads the flight-recorder dumps. Usage: scripts/demo.sh
# Exits non-zero when a step does not show what it should (CI runs it on a
# clean clone).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_apt pkg-config

echo "== building (release)"
# Two builds: `--examples` alone would build the examples without the binary.
cargo build --release -q -p ringleader-cli --bins || exit 1
cargo build --release -q -p ringleader --examples || exit 1
rl=target/release/ringleader
dumps=$(mktemp -d /tmp/ringleader-demo.XXXX)
log=$(mktemp /tmp/ringleader-demo-log.XXXX)
trap 'rm -f "$log"' EXIT
export RINGLEADER_DUMP_DIR=$dumps

# Fails the demo unless the last step's output holds the verdict.
expect_verdict() {
    if ! grep -q "\[missed-collective\] rank 1 .*did not enter all_reduce #2" "$log"; then
        echo "demo FAILED: $1 did not end in the missed-collective verdict naming rank 1" >&2
        exit 1
    fi
}

echo
echo "== 4 ranks: all_reduce, all_gather, broadcast"
$rl launch --nproc-per-node 4 -- target/release/examples/quickstart || exit 1

echo
echo "== the classic hang: only rank 0 makes a second all_reduce"
echo "   (gloo would wait 30 minutes in silence; RINGLEADER_TIMEOUT=10 is only a backstop here)"
RINGLEADER_TIMEOUT=10 $rl launch --nproc-per-node 2 -- target/release/examples/hang_demo 2>&1 | tee "$log"
echo "(launcher exit code ${PIPESTATUS[0]}: the job failed, and said why)"
expect_verdict "the Rust hang demo"

echo
echo "== ringleader analyze $dumps"
$rl analyze "$dumps" 2>&1 | tee "$log"
expect_verdict "ringleader analyze"

echo
echo "== the same bug in PyTorch, with init_process_group(backend=\"ringleader\")"
echo "installing the Python package (this checkout's build) into $RINGLEADER_VENV"
install_python_package || exit 1
PATH="$RINGLEADER_VENV/bin:$PATH" $rl launch --nproc-per-node 2 -- python examples/python/hang_demo.py 2>&1 | tee "$log"
echo "(launcher exit code ${PIPESTATUS[0]})"
expect_verdict "the PyTorch hang demo"
echo
echo "demo done"
