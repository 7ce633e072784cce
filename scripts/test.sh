#!/usr/bin/env bash
# The whole test suite: formatting, lints, docs, and every test (unit,
# simulator, multi-process over real sockets, launcher, store). Installs what
# it needs. Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

ensure_apt pkg-config iproute2 procps
start=$(date +%s)

echo "== cargo fmt"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --release -q -- -D warnings

echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -q

echo "== cargo test"
# Release mode: the multi-process tests move hundreds of MB. Every test that
# spawns processes has its own hard limit; this is the last line of defence.
timeout 900 cargo test --workspace --release

echo "== all tests passed in $(( $(date +%s) - start )) s"
