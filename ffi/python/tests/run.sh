#!/usr/bin/env bash
# The Python package's tests: installs ./ffi/python (which builds
# libringleader with cargo) into the shared venv, builds the `ringleader` CLI
# for the launcher tests, and runs pytest. Every multi-process job has its
# own hard limit; `timeout` here is the last line of defence.
# Usage: ffi/python/tests/run.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/../../.."
source scripts/lib.sh
ensure_venv

start=$(date +%s)
echo "== building libringleader and the ringleader CLI (release)"
cargo build --release -q -p ringleader-ffi -p ringleader-cli
target_dir=$(cargo metadata --format-version 1 --no-deps | "$RINGLEADER_VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')

echo "== pip install ./ffi/python"
install_python_package

echo "== pytest ffi/python/tests"
cd ffi/python/tests
# Run against the installed package, not the source tree next to the tests.
RINGLEADER_BIN="$target_dir/release/ringleader" PYTHONPATH= \
    timeout 1500 "$RINGLEADER_VENV/bin/python" -m pytest -q -p no:cacheprovider --rootdir . "$@" .
echo "== python tests passed in $(( $(date +%s) - start )) s"
