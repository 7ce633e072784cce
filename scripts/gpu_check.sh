#!/usr/bin/env bash
# Device-buffer checks on a machine with NVIDIA GPU(s), all within 8 minutes:
#   1. every collective on device buffers (examples/cuda_check.rs `all`: f32,
#      i32, bf16; 1 to 5M elements, ragged chunks, the GPU-reduction path)
#      with 2 and with 4 ranks on the GPU(s) present (ranks share GPUs when
#      there are fewer GPUs than ranks);
#   2. a mismatch (rank 0 passes another count): every rank reports [mismatch];
#   3. a killed rank (rank 1 SIGKILLs itself mid-loop): rank 0 reports
#      [peer-died] naming rank 1 (the verdicts are those of host buffers);
#   4. `ringleader perf --device cuda`: all_reduce on device buffers, and
#      NCCL on the same sizes in the same run when there are >= 2 GPUs
#      (one rank per GPU); with one GPU it says why NCCL is skipped;
#   5. where python3 has torch with CUDA and pytest: the torch backend's
#      tests (ffi/python/tests test_torch_backend.py, whose CUDA check then
#      runs, and test_torch_cuda.py) against the prepared libringleader.so.
# Prints a summary; exits 0 when no check failed (skipped ones do not fail).
#
# The GPU machine cannot reach the internet: nothing here downloads. Prepare
# ONE of these where the network is (any Linux x86-64 machine with Rust; no
# CUDA is needed to build, the CUDA libraries are loaded at run time):
#   A. Prebuilt binaries (recommended; no Rust needed on the GPU machine):
#        scripts/gpu_check.sh --prepare
#      builds `ringleader` and `cuda_check` with --features cuda, strips them
#      and puts them in target/gpu-bin/ (about 8 MB). target/ is ignored by
#      git: carry it explicitly (the device tool: carry ["target/gpu-bin"]).
#      The GPU machine's glibc must be as new as the build machine's.
#   B. Build on the GPU machine, offline: it needs cargo, and the crates
#      vendored beforehand:
#        mkdir -p .cargo && cargo vendor --versioned-dirs target/vendor > .cargo/vendor.toml
#      then carry target/vendor and .cargo/vendor.toml; this script builds
#      with `cargo build --offline --config .cargo/vendor.toml`.
# Usage: scripts/gpu_check.sh [--prepare] [--bin-dir DIR]
# Libraries: libcuda.so.1 (the driver) is required. NVRTC (GPU reductions)
# and NCCL (the comparison) are optional; they are searched for in ldconfig,
# $CUDA_HOME, /usr/local/cuda*, and Python's nvidia-* wheels, and linked under
# the names cudarc loads (libnvrtc.so, libnccl.so) in a temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN_DIR=target/gpu-bin
PREPARE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --prepare) PREPARE=1 ;;
        --bin-dir) BIN_DIR=$2; shift ;;
        -h|--help) sed -n '2,39p' "$0"; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
START=$(date +%s)
TOTAL_LIMIT=${RINGLEADER_GPU_CHECK_LIMIT:-480}
die() { echo "gpu_check: FATAL: $*" >&2; exit 2; }
left() { echo $(( TOTAL_LIMIT - ($(date +%s) - START) )); }

build() { # $@: extra cargo flags
    command -v cargo >/dev/null || die "no cargo here and no prebuilt binaries in $BIN_DIR (see the header: option A or B)"
    echo "== building with --features cuda $*"
    CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target} cargo build --release "$@" -p ringleader-cli --features cuda
    CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target} cargo build --release "$@" -p ringleader --features cuda --example cuda_check
    local t=${CARGO_TARGET_DIR:-target}/release
    mkdir -p "$BIN_DIR"
    CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target} cargo build --release "$@" -p ringleader-ffi
    cp "$t/ringleader" "$t/examples/cuda_check" "$t/libringleader.so" "$BIN_DIR/"
    strip "$BIN_DIR/ringleader" "$BIN_DIR/cuda_check" "$BIN_DIR/libringleader.so" 2>/dev/null || true
}

if [ "$PREPARE" = 1 ]; then
    build
    ls -l "$BIN_DIR"
    echo "prepared: carry $BIN_DIR to the GPU machine and run scripts/gpu_check.sh there"
    exit 0
fi

if [ ! -x "$BIN_DIR/ringleader" ] || [ ! -x "$BIN_DIR/cuda_check" ] || [ ! -f "$BIN_DIR/libringleader.so" ]; then
    if [ -f .cargo/vendor.toml ]; then
        build --offline --config .cargo/vendor.toml
    else
        build --offline
    fi
fi
RL=$ROOT/$BIN_DIR/ringleader
CHECK=$ROOT/$BIN_DIR/cuda_check
[[ "$BIN_DIR" = /* ]] && RL=$BIN_DIR/ringleader && CHECK=$BIN_DIR/cuda_check
"$RL" --version >/dev/null 2>&1 || die "$RL does not run here: $("$RL" --version 2>&1 | head -2) (built against a newer glibc? rebuild on an older system)"

# --- CUDA libraries -----------------------------------------------------------
LIBS=$(mktemp -d /tmp/rl-gpu-libs.XXXXXX)
trap 'rm -rf "$LIBS"' EXIT
find_lib() { # $1: file name pattern (libnccl.so*); prints the first match
    local pat=$1 d
    ldconfig -p 2>/dev/null | awk -v p="${pat%\*}" '$1 ~ "^"p {print $NF; exit}' | head -1 | grep . && return 0
    for d in ${CUDA_HOME:-/nonexistent}/lib64 /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib /usr/lib/x86_64-linux-gnu; do
        ls $d/$pat 2>/dev/null | head -1 | grep . && return 0
    done
    if command -v python3 >/dev/null; then
        python3 - "$pat" <<'EOF' 2>/dev/null | head -1 | grep . && return 0
import glob, site, sys
dirs = site.getsitepackages() + [site.getusersitepackages()]
for d in dirs:
    for f in glob.glob(d + "/nvidia/*/lib/" + sys.argv[1]) + glob.glob(d + "/torch/lib/" + sys.argv[1]):
        print(f)
EOF
    fi
    return 1
}
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda.so.1' && ! find_lib 'libcuda.so.1' >/dev/null; then
    die "libcuda.so.1 (the NVIDIA driver) is not found: is this a GPU machine? (nvidia-smi: $(nvidia-smi -L 2>&1 | head -1))"
fi
NVRTC=$(find_lib 'libnvrtc.so.*' || true)
NCCL=$(find_lib 'libnccl.so*' || true)
[ -n "$NVRTC" ] && ln -sf "$NVRTC" "$LIBS/libnvrtc.so" && ln -sf "$NVRTC" "$LIBS/$(basename "$NVRTC")"
[ -n "$NCCL" ] && ln -sf "$NCCL" "$LIBS/libnccl.so"
# NVRTC loads its builtins library from beside itself.
export LD_LIBRARY_PATH="$LIBS${NVRTC:+:$(dirname "$NVRTC")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
echo "== $(nvidia-smi -L 2>/dev/null | head -4 | tr '\n' ';') GPUs: ${GPUS:-?}"
echo "== NVRTC: ${NVRTC:-not found (reductions stay on the host)}; NCCL: ${NCCL:-not found (comparison skipped)}"

# --- checks -------------------------------------------------------------------
declare -a NAMES RESULTS
record() { NAMES+=("$1"); RESULTS+=("$2"); echo "-- $1: $2"; }
LOGDIR=$(mktemp -d /tmp/rl-gpu-check.XXXXXX)
export RINGLEADER_TIMEOUT=60 RINGLEADER_INIT_TIMEOUT=60 RINGLEADER_DUMP_DIR=$LOGDIR/dumps

launch() { # $1 name, $2 ranks, $3 limit (s), $4 mode
    local name=$1 np=$2 limit=$3 mode=$4 port=$((20000 + RANDOM % 20000))
    [ "$(left)" -gt 20 ] || { record "$name" "SKIP (out of time)"; return 1; }
    [ "$limit" -gt "$(left)" ] && limit=$(left)
    echo "== $name: ringleader launch --nproc-per-node $np -- cuda_check $mode (limit ${limit}s)"
    set +e
    timeout -k 5 "$limit" "$RL" launch --nproc-per-node "$np" --master-port "$port" -- "$CHECK" "$mode" \
        > "$LOGDIR/$name.log" 2>&1
    local rc=$?
    set -e
    tail -n 25 "$LOGDIR/$name.log" | sed 's/^/   | /'
    [ $rc -eq 124 ] && echo "   (timed out after ${limit}s)"
    return $rc
}

for np in 2 4; do
    if launch "collectives-${np}ranks" "$np" 150 all; then
        record "every collective, device buffers, $np ranks" PASS
    else
        record "every collective, device buffers, $np ranks" FAIL
    fi
done

launch mismatch 2 60 mismatch || true
if [ "$(grep -c 'ok: rank [0-9] got the mismatch' "$LOGDIR/mismatch.log")" -eq 2 ] \
    && grep -q '\[mismatch\]' "$LOGDIR/mismatch.log"; then
    record "mismatch verdict on device buffers" PASS
else
    record "mismatch verdict on device buffers" FAIL
fi

launch killed-rank 2 60 kill || true  # the launcher exits non-zero: a rank was killed
if grep -q 'ok: rank 0 got the verdict: \[peer-died\].*rank 1' "$LOGDIR/killed-rank.log"; then
    record "killed rank: [peer-died] naming rank 1" PASS
else
    record "killed rank: [peer-died] naming rank 1" FAIL
fi

NP=2
[ "${GPUS:-0}" -ge 2 ] && NP=$(( GPUS < 4 ? GPUS : 4 ))
limit=$(left)
[ "$limit" -gt 150 ] && limit=150  # leave time for the Python checks
if [ "$limit" -gt 30 ]; then
    echo "== perf: ringleader perf --device cuda --op all_reduce --nproc $NP -b 1M -e 256M -f 4 -z 0 (limit ${limit}s)"
    set +e
    # -z 0: the stream is synchronized once after each timed loop, as this check measured before
    # `ringleader perf` had -z (its default, -z 1, synchronizes after every call).
    timeout -k 5 "$limit" "$RL" perf --device cuda --op all_reduce --nproc "$NP" -b 1M -e 256M -f 4 -n 10 -w 2 -z 0 \
        --json "$LOGDIR/perf.jsonl" > "$LOGDIR/perf.log" 2>&1
    rc=$?
    set -e
    sed 's/^/   | /' "$LOGDIR/perf.log" | tail -n 30
    if [ $rc -eq 0 ]; then
        if grep -q 'NCCL skipped' "$LOGDIR/perf.log"; then
            record "perf vs NCCL ($NP ranks)" "PASS (NCCL skipped: $(grep -o 'NCCL skipped: .*' "$LOGDIR/perf.log" | head -1 | cut -c15-))"
        else
            record "perf vs NCCL ($NP ranks)" PASS
        fi
    else
        record "perf vs NCCL ($NP ranks)" "FAIL (exit $rc)"
    fi
else
    record "perf vs NCCL" "SKIP (out of time)"
fi

# --- Python and the torch backend on CUDA tensors ------------------------------
LIBRL=$ROOT/$BIN_DIR/libringleader.so
[[ "$BIN_DIR" = /* ]] && LIBRL=$BIN_DIR/libringleader.so
if ! python3 -c 'import torch, pytest, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    record "torch backend on CUDA tensors" "SKIP (python3 here has no torch with CUDA, or no pytest)"
elif [ "$(left)" -lt 60 ]; then
    record "torch backend on CUDA tensors" "SKIP (out of time)"
else
    echo "== pytest test_torch_backend.py test_torch_cuda.py (torch $(python3 -c 'import torch; print(torch.__version__)'), limit $(left)s)"
    set +e
    (cd ffi/python/tests && RINGLEADER_LIBRARY=$LIBRL RINGLEADER_BIN=$RL PYTHONPATH=$ROOT/ffi/python \
        timeout -k 5 "$(left)" python3 -m pytest -q -p no:cacheprovider -rs --rootdir . \
        test_torch_backend.py test_torch_cuda.py) > "$LOGDIR/pytest.log" 2>&1
    rc=$?
    set -e
    tail -n 40 "$LOGDIR/pytest.log" | sed 's/^/   | /'
    if grep -q 'SKIPPED.*test_torch_cuda' "$LOGDIR/pytest.log"; then
        record "torch backend on CUDA tensors" "FAIL (the CUDA tests skipped on a machine with CUDA)"
    elif [ $rc -eq 0 ]; then
        record "torch backend on CUDA tensors" "PASS ($(tail -n 1 "$LOGDIR/pytest.log" | tr -d '=' | xargs))"
    else
        record "torch backend on CUDA tensors" "FAIL (pytest exit $rc)"
    fi
fi

echo
echo "== summary ($(( $(date +%s) - START )) s; logs in $LOGDIR)"
fail=0
for i in "${!NAMES[@]}"; do
    printf '  %-50s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}"
    [[ "${RESULTS[$i]}" == FAIL* ]] && fail=1
done
[ $fail -eq 0 ] && echo "== gpu_check: all checks passed" || echo "== gpu_check: FAILED"
exit $fail
