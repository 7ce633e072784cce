#!/usr/bin/env bash
# The demo: a few ranks run collectives, then the classic hang (one rank makes
# an extra all_reduce) ends in an error that names the culprit, and
# `ringleader analyze` reads the flight-recorder dumps. Usage: scripts/demo.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_apt pkg-config

echo "== building (release)"
cargo build --release -q -p ringleader-cli -p ringleader --examples || exit 1
rl=target/release/ringleader
dumps=$(mktemp -d /tmp/ringleader-demo.XXXX)
export RINGLEADER_DUMP_DIR=$dumps

echo
echo "== 4 ranks: all_reduce, all_gather, broadcast"
$rl launch --nproc-per-node 4 -- target/release/examples/quickstart || exit 1

echo
echo "== the classic hang: only rank 0 makes a second all_reduce"
echo "   (gloo would wait 30 minutes in silence; RINGLEADER_TIMEOUT=10 is only a backstop here)"
RINGLEADER_TIMEOUT=10 $rl launch --nproc-per-node 2 -- target/release/examples/hang_demo
echo "(launcher exit code $?: the job failed, and said why)"

echo
echo "== ringleader analyze $dumps"
$rl analyze "$dumps"

echo
echo "== the same bug in PyTorch, with init_process_group(backend=\"ringleader\")"
ensure_venv
if ! "$RINGLEADER_VENV/bin/python" -c "import ringleader.torch" >/dev/null 2>&1; then
    echo "installing the Python package into $RINGLEADER_VENV"
    "$RINGLEADER_VENV/bin/pip" install -q ./ffi/python || exit 1
fi
PATH="$RINGLEADER_VENV/bin:$PATH" $rl launch --nproc-per-node 2 -- python examples/python/hang_demo.py
echo "(launcher exit code $?)"
echo
echo "demo done"
