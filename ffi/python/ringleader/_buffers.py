"""Turns numpy arrays and torch tensors into (pointer, count, dtype) without
copying. Anything else, a non-contiguous buffer, a read-only output or an
unsupported dtype is a TypeError or ValueError naming the argument. A CUDA
tensor's code carries :data:`DEVICE`: its pointer is device memory and goes
only to the library's ``rl_*_device`` functions.

This sits on every call's path, so the common case (a plain, contiguous
numpy array or CPU tensor) is kept to a few attribute reads: the target is
well under 10 us added per collective.
"""

import ctypes
import sys

from . import _lib

try:
    import numpy as _np
except ImportError:  # numpy is optional: torch tensors work without it
    _np = None

BOOL = 0x100  # flag on a dtype code: bool data (bytes 0/1), reduces only with min/max
DEVICE = 0x200  # flag on a dtype code: a CUDA device pointer
CODE = 0xFF

_SUPPORTED = "float32, float64, float16, bfloat16, int8, uint8, int32, int64, bool"

# numpy: dtype -> rl_dtype (| BOOL); native byte order only (others are not in the table).
_NP_CODES = {}


class _NoNumpy:
    """Stands for numpy.ndarray when numpy is missing: a type nothing passed in is exactly."""


_ndarray = _NoNumpy
if _np is not None:
    _ndarray = _np.ndarray
    for _t, _c in ((_np.float32, _lib.F32), (_np.float64, _lib.F64), (_np.float16, _lib.F16), (_np.int8, _lib.I8),
                   (_np.uint8, _lib.U8), (_np.int32, _lib.I32), (_np.int64, _lib.I64), (_np.bool_, _lib.U8 | BOOL)):
        _NP_CODES[_np.dtype(_t)] = _c
        if _np.dtype(_t).byteorder not in ("=", "|"):  # pragma: no cover
            raise ImportError("unexpected numpy dtype byte order")

_C_CONTIGUOUS, _WRITEABLE = 0x0001, 0x0400  # NPY_ARRAY_C_CONTIGUOUS, NPY_ARRAY_WRITEABLE
_C_WRITE = _C_CONTIGUOUS | _WRITEABLE
_from_address = ctypes.c_void_p.from_address


def _interface_ptr(a) -> int:
    return a.__array_interface__["data"][0]


def _pick_ptr_reader():
    """numpy's PyArrayObject keeps `char *data` right after the object header,
    a layout numpy's C API has kept for decades; reading it directly is ten
    times faster than __array_interface__. Used only if it checks out here."""
    if _np is None or hasattr(sys, "_is_gil_enabled"):  # free-threaded builds: other header size
        return _interface_ptr
    offset = object.__basicsize__  # PyObject_HEAD: refcount and type

    def fast(a) -> int:
        return _from_address(id(a) + offset).value or 0

    try:
        probes = [_np.arange(7, dtype=_np.float32), _np.zeros((3, 5))[1:], _np.ones(0, dtype=_np.int8)]
        if all(fast(p) == _interface_ptr(p) for p in probes):
            return fast
    except Exception:  # pragma: no cover
        pass
    return _interface_ptr  # pragma: no cover


_np_ptr = _pick_ptr_reader()
# Where an ndarray keeps its data pointer, for callers that read it inline
# (``c_void_p.from_address(id(a) + NP_DATA_AT).value``, None for NULL), or
# None where _pick_ptr_reader fell back to __array_interface__.
NP_DATA_AT = object.__basicsize__ if _np_ptr is not _interface_ptr else None

# torch: dtype -> rl_dtype (| BOOL), filled on first use.
_TORCH_CODES = None
_Tensor = None
_STRIDED = None


def _torch_tables():
    global _TORCH_CODES, _Tensor, _STRIDED
    import torch

    _TORCH_CODES = {
        torch.float32: _lib.F32,
        torch.float64: _lib.F64,
        torch.float16: _lib.F16,
        torch.bfloat16: _lib.BF16,
        torch.int8: _lib.I8,
        torch.uint8: _lib.U8,
        torch.int32: _lib.I32,
        torch.int64: _lib.I64,
        torch.bool: _lib.U8 | BOOL,
    }
    _STRIDED = torch.strided
    _Tensor = torch.Tensor  # last: resolve() takes a tensor for ready once this is set


def resolve(obj, name: str, writable: bool):
    """``(pointer, element count, dtype code)`` of ``obj``; the code may carry :data:`BOOL`."""
    tp = type(obj)
    if tp is _ndarray:
        code = _NP_CODES.get(obj.dtype)
        need = _C_WRITE if writable else _C_CONTIGUOUS
        if code is not None and obj.flags.num & need == need:
            return _np_ptr(obj), obj.size, code
        return _numpy_slow(obj, name, writable)
    if tp is _Tensor:
        return _torch(obj, name)
    if _np is not None and isinstance(obj, _ndarray):
        return _numpy_slow(obj, name, writable)
    if tp.__module__.startswith("torch"):
        return _torch(obj, name)
    raise TypeError(
        f"{name}: expected a numpy array or a torch tensor, got {tp.__module__}.{tp.__qualname__}"
    )


def _numpy_slow(a, name, writable):
    """Subclasses, unusual dtypes, and the error messages."""
    flags = a.flags
    if not flags.c_contiguous:
        raise ValueError(
            f"{name}: the array is not contiguous (strides {a.strides}); "
            "pass numpy.ascontiguousarray(...) and copy the result back"
        )
    if writable and not flags.writeable:
        raise ValueError(f"{name}: the array is read-only, but this operation writes into it")
    code = _NP_CODES.get(a.dtype)
    if code is None:
        if a.dtype.name == "bfloat16" and a.dtype.isnative:  # ml_dtypes
            code = _lib.BF16
        else:
            raise TypeError(f"{name}: dtype {a.dtype} is not supported (supported: {_SUPPORTED}, native byte order)")
    return _interface_ptr(a), a.size, code


def _torch(t, name):
    if _Tensor is None:
        _torch_tables()
    if not isinstance(t, _Tensor):
        raise TypeError(f"{name}: expected a numpy array or a torch tensor, got {type(t).__qualname__}")
    # is_cpu / is_cuda rather than t.device.type: reading .device makes a
    # torch.device object each time (0.4 us); they are the same test.
    if t.is_cpu:
        device = 0
    elif t.is_cuda:
        device = DEVICE
    else:
        raise TypeError(f"{name}: the tensor is on {t.device}; ringleader works on CPU and CUDA tensors")
    layout = t.layout
    if layout is not _STRIDED and (t.is_sparse or layout != _STRIDED):
        raise TypeError(f"{name}: {t.layout} tensors are not supported; pass a dense tensor")
    if not t.is_contiguous():
        raise ValueError(
            f"{name}: the tensor is not contiguous (strides {tuple(t.stride())}); "
            "pass tensor.contiguous() and copy the result back"
        )
    code = _TORCH_CODES.get(t.dtype)
    if code is None:
        raise TypeError(f"{name}: dtype {t.dtype} is not supported (supported: {_SUPPORTED})")
    return t.data_ptr(), t.numel(), code | device


def same_dtype(a: int, b: int, an: str, bn: str):
    if a != b:
        raise TypeError(f"{an} and {bn} must have the same dtype")


def same_place(a: int, b: int, an: str, bn: str):
    """Both buffers in host memory or both on the GPU."""
    if (a ^ b) & DEVICE:
        where = {0: "in host memory", DEVICE: "on a CUDA device"}
        raise TypeError(f"{an} is {where[a & DEVICE]} but {bn} is {where[b & DEVICE]}; pass both on one side")


def cuda_stream(t) -> int:
    """The current CUDA stream of ``t``'s device (a ``CUstream``): device
    collectives follow the work queued on it and later work waits for them."""
    import torch

    return torch.cuda.current_stream(t.device).cuda_stream


def check_bool_op(code: int, op: str, name: str):
    if code & BOOL and str(op).lower() not in ("min", "max"):
        raise TypeError(f"{name}: bool buffers reduce only with op='min' or op='max', not {op!r}")
