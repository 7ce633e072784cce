# Shared helpers for scripts/*.sh: install what is missing, quietly.

# Installs Debian packages that are not installed yet (needs root or sudo).
ensure_apt() {
    local missing=()
    for p in "$@"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

# The Python virtual environment the tests and benchmarks share (torch is
# about 5 GB, so it is created once and reused).
RINGLEADER_VENV="${RINGLEADER_VENV:-$HOME/.cache/ringleader/venv}"

ensure_venv() {
    if [ ! -x "$RINGLEADER_VENV/bin/python" ]; then
        echo "creating the Python venv $RINGLEADER_VENV (torch, numpy, pytest; a few minutes once)"
        mkdir -p "$(dirname "$RINGLEADER_VENV")"
        python3 -m venv "$RINGLEADER_VENV"
        "$RINGLEADER_VENV/bin/pip" install -q --upgrade pip
    fi
    if ! "$RINGLEADER_VENV/bin/python" -c "import torch, numpy, pytest" >/dev/null 2>&1; then
        "$RINGLEADER_VENV/bin/pip" install -q torch numpy pytest
    fi
    # mpi4py (built against the machine's Open MPI): the Python table of the
    # benchmark comparison and its test. Without Open MPI that test skips,
    # saying so; a failed build is said and leaves the rest of the suite.
    if command -v mpicc >/dev/null 2>&1 && ! "$RINGLEADER_VENV/bin/python" -c "import mpi4py" >/dev/null 2>&1; then
        echo "installing mpi4py into $RINGLEADER_VENV (built against Open MPI; a minute once)"
        "$RINGLEADER_VENV/bin/pip" install -q mpi4py || echo "warning: mpi4py did not install; test_bench_like's Python table will skip" >&2
    fi
}

# Installs ./ffi/python (which builds libringleader with cargo) into the venv,
# replacing whatever an earlier checkout installed there. No build isolation:
# the venv's setuptools builds the wheel, without the network once it is there
# (venvs of Python >= 3.12 come without it).
install_python_package() {
    ensure_venv
    if ! "$RINGLEADER_VENV/bin/python" -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 77)' 2>/dev/null; then
        "$RINGLEADER_VENV/bin/pip" install -q "setuptools>=77"
    fi
    "$RINGLEADER_VENV/bin/pip" install -q --no-build-isolation --force-reinstall --no-deps ./ffi/python
}

# Debian packages that building with `--features rdma` needs (ibverbs-sys runs
# cmake and bindgen over rdma-core's headers and links the system's
# libibverbs): scripts/test.sh does `ensure_apt ... "${RINGLEADER_RDMA_APT[@]}"`.
RINGLEADER_RDMA_APT=(cmake libnl-3-dev libnl-route-3-dev libclang-dev pkg-config libibverbs-dev)
