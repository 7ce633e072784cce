"""Loads libringleader through ctypes and declares the C ABI (ffi/include/ringleader.h).

The library is looked for, in order: ``$RINGLEADER_LIBRARY`` (a path), then
``libringleader.so`` inside this package (where ``pip install`` puts it).
ctypes releases the GIL around every call, so other Python threads run while
a collective blocks.
"""

import ctypes
import os
from ctypes import POINTER, c_bool, c_char_p, c_double, c_int, c_int64, c_size_t, c_void_p
from pathlib import Path

LIB_NAME = "libringleader.so"


def _find() -> str:
    explicit = os.environ.get("RINGLEADER_LIBRARY")
    if explicit:
        if not Path(explicit).exists():
            raise ImportError(f"RINGLEADER_LIBRARY={explicit} does not exist")
        return explicit
    here = Path(__file__).resolve().parent / LIB_NAME
    if here.exists():
        return str(here)
    raise ImportError(
        f"{LIB_NAME} is not in {here.parent}; install the package with `pip install ./ffi/python` "
        "(which builds it with cargo) or point RINGLEADER_LIBRARY at a built libringleader.so"
    )


class Config(ctypes.Structure):
    """``rl_config``: explicit init parameters; unset fields come from the environment."""

    _fields_ = [
        ("rank", c_int64),
        ("world_size", c_int64),
        ("master_addr", c_char_p),
        ("master_port", c_int),
        ("store_addr", c_char_p),
        ("run_id", c_char_p),
        ("token", c_char_p),
        ("timeout_s", c_double),
        ("init_timeout_s", c_double),
        ("stall_warn_s", c_double),
        ("interrupt_on_sigint", c_int),
        ("group_ranks", POINTER(c_int64)),
        ("group_ranks_count", c_size_t),
        ("group_name", c_char_p),
    ]


lib = ctypes.CDLL(_find())
path = lib._name

_P = c_void_p
_PP = POINTER(c_void_p)
_SIGNATURES = {
    "rl_init_env": (c_int, [_PP]),
    "rl_init": (c_int, [POINTER(Config), _PP]),
    "rl_config_init": (None, [POINTER(Config)]),
    "rl_comm_rank": (c_int64, [_P]),
    "rl_comm_world_size": (c_int64, [_P]),
    "rl_comm_timeout": (c_double, [_P]),
    "rl_all_reduce": (c_int, [_P, _P, c_size_t, c_int, c_int, _PP]),
    "rl_all_gather": (c_int, [_P, _P, c_size_t, _P, c_size_t, c_int, _PP]),
    "rl_reduce_scatter": (c_int, [_P, _P, c_size_t, _P, c_size_t, c_int, c_int, _PP]),
    "rl_broadcast": (c_int, [_P, _P, c_size_t, c_int, c_int64, _PP]),
    "rl_reduce": (c_int, [_P, _P, c_size_t, c_int, c_int64, c_int, _PP]),
    "rl_all_to_all": (c_int, [_P, _P, c_size_t, _P, c_size_t, c_int, _PP]),
    "rl_cuda_check": (c_int, []),
    "rl_all_reduce_device": (c_int, [_P, _P, c_size_t, c_int, c_int, _P]),
    "rl_all_gather_device": (c_int, [_P, _P, c_size_t, _P, c_size_t, c_int, _P]),
    "rl_reduce_scatter_device": (c_int, [_P, _P, c_size_t, _P, c_size_t, c_int, c_int, _P]),
    "rl_broadcast_device": (c_int, [_P, _P, c_size_t, c_int, c_int64, _P]),
    "rl_reduce_device": (c_int, [_P, _P, c_size_t, c_int, c_int64, c_int, _P]),
    "rl_all_to_all_device": (c_int, [_P, _P, c_size_t, _P, c_size_t, c_int, _P]),
    "rl_send": (c_int, [_P, _P, c_size_t, c_int, c_int64, _PP]),
    "rl_recv": (c_int, [_P, _P, c_size_t, c_int, c_int64, _PP]),
    "rl_barrier": (c_int, [_P, _PP]),
    "rl_monitored_barrier": (c_int, [_P, c_double, c_int, _PP]),
    "rl_work_wait": (c_int, [_P, c_double]),
    "rl_work_test": (c_int, [_P, POINTER(c_bool)]),
    "rl_work_free": (None, [_P]),
    "rl_comm_dump": (c_int, [_P, c_char_p, _PP]),
    "rl_comm_flight_recorder_json": (c_int, [_P, _PP]),
    "rl_string_free": (None, [_P]),
    "rl_abort": (c_int, [_P, c_char_p]),
    "rl_destroy": (c_int, [_P]),
    "rl_version": (c_char_p, []),
    "rl_error_kind_name": (c_char_p, [c_int]),
    "rl_last_error_code": (c_int, []),
    "rl_last_error_kind": (c_char_p, []),
    "rl_last_error_message": (c_char_p, []),
    "rl_last_error_ranks": (c_size_t, [POINTER(c_int64), c_size_t]),
    "rl_last_error_seq": (c_int64, []),
    "rl_last_error_op": (c_int, []),
    "rl_op_name": (c_char_p, [c_int]),
    "rl_store_start": (c_int, [c_char_p, c_char_p, c_char_p, _PP]),
    "rl_store_port": (c_int, [_P]),
    "rl_store_addr": (c_int, [_P, _PP]),
    "rl_store_wait_idle": (c_int, [_P, c_double]),
    "rl_store_serve_job": (c_int, [_P, c_double]),
    "rl_store_free": (None, [_P]),
    "rl_set_call_site": (c_int, [c_char_p]),
    "rl_set_stack_dump": (c_int, [c_int, c_int, ctypes.c_uint64, c_char_p]),
}
for _name, (_res, _args) in _SIGNATURES.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args


# The calls every collective makes, declared a second time for speed (the
# declarations above stay the exact ones, held to the header by
# tests/test_abi.py). ctypes converts an argument through its argtype's
# from_param: for c_void_p a direct check for an int (about 20 ns), for
# c_int, c_int64 and c_size_t a generic path with an isinstance check on the
# metaclass (about 100 ns each, 0.3 us of an 8-byte all_reduce's 1.2 us). So
# here every integer argument is passed as a machine word (c_void_p). That is
# the same call on the LP64 ABIs this guards for (x86-64 System V, AArch64):
# pointers, size_t and int64_t are 64-bit words in the same registers or
# 8-byte stack slots, and an int argument is the low half of its register or
# slot, the rest of which the callee ignores. Elsewhere the hot prototypes
# are the exact ones. Only ringleader's own code calls them, always with ints
# it checked or computed (c_void_p takes any int modulo 2**64, as ctypes'
# integer types do, and would take bytes as a pointer).
def _word_sized() -> bool:
    import platform
    import sys

    return (
        sys.platform.startswith("linux")
        and ctypes.sizeof(c_void_p) == ctypes.sizeof(c_size_t) == ctypes.sizeof(c_int64) == 8
        and platform.machine().lower() in ("x86_64", "amd64", "aarch64", "arm64")
    )


_WORD_ARGS = (c_int, c_int64, c_size_t, c_void_p)
WORD_ARGS = _word_sized()


def _hot(name: str):
    """A second function object for ``name``, its integer arguments passed as words (see above)."""
    res, args = _SIGNATURES[name]
    f = lib._FuncPtr((name, lib))  # same symbol, own argtypes; releases the GIL like every CDLL function
    f.restype = res
    f.argtypes = [c_void_p if WORD_ARGS and a in _WORD_ARGS else a for a in args]
    return f


class _Hot:
    """The collectives' entry points with word-sized arguments: ``hot.rl_all_reduce(...)``."""

    def __init__(self, names):
        for n in names:
            setattr(self, n, _hot(n))


hot = _Hot(
    [
        "rl_all_reduce",
        "rl_all_gather",
        "rl_reduce_scatter",
        "rl_broadcast",
        "rl_reduce",
        "rl_all_to_all",
        "rl_send",
        "rl_recv",
        "rl_barrier",
    ]
)


def take_string(p: c_void_p) -> str:
    """Copies a string returned by the library and frees it."""
    if not p:
        return ""
    try:
        return ctypes.string_at(p).decode("utf-8", "replace")
    finally:
        lib.rl_string_free(p)


# Codes shared with the C header (rl_dtype, rl_reduce_op).
F32, F64, F16, BF16, I8, U8, I32, I64 = range(8)
REDUCE_OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}


def _load_native():
    """``(module, None)``: ringleader._native (setup.py compiles it from
    _native.c) bound to this library's entry points; ``(None, why)`` where it
    is missing or does not load. ``RINGLEADER_NATIVE=0`` leaves it unused
    (every call then goes through ctypes, as without it)."""
    if os.environ.get("RINGLEADER_NATIVE", "1") == "0":
        return None, "RINGLEADER_NATIVE=0"
    try:
        from . import _native
    except ImportError as e:
        return None, f"ringleader._native did not load: {e}"
    addr = lambda f: ctypes.cast(f, c_void_p).value  # noqa: E731
    _native.bind_calls(
        addr(lib.rl_all_reduce),
        addr(lib.rl_broadcast),
        addr(lib.rl_all_gather),
        addr(lib.rl_reduce_scatter),
        addr(lib.rl_barrier),
        addr(lib.rl_set_call_site),
    )
    return _native, None


# The C lane (see _native.c), or None and why not.
native, NATIVE_MISSING = _load_native()
