#!/usr/bin/env bash
# The whole test suite: formatting, lints, docs, and every test (unit,
# simulator, multi-process over real sockets, launcher, store). Installs what
# it needs. Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

# gcc: the C ABI example; nftables, unshare: tests/multinode.rs
ensure_apt pkg-config gcc iproute2 procps nftables util-linux
start=$(date +%s)

echo "== cargo fmt"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --release -q -- -D warnings

echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -q

echo "== cargo test"
# The C ABI tests link the C examples against libringleader.so, which
# `cargo test` does not build (tests link the crate as Rust).
cargo build --release -q -p ringleader-ffi
# Release mode: the multi-process tests move hundreds of MB. Every test that
# spawns processes has its own hard limit; this is the last line of defence.
timeout 900 cargo test --workspace --release

echo "== python (numpy, torch backend, seed scripts)"
ffi/python/tests/run.sh

echo "== all tests passed in $(( $(date +%s) - start )) s"
