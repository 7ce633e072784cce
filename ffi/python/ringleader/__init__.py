"""ringleader: collective communication whose hangs explain themselves.

::

    import numpy as np
    import ringleader

    pg = ringleader.init()              # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun, ringleader launch)
    x = np.ones(4, dtype=np.float32)
    pg.all_reduce(x)                    # in place: x == world_size
    pg.destroy()

Buffers are numpy arrays or torch tensors (CPU or CUDA), used in place without
a copy (contiguous, a supported dtype). CUDA tensors follow the current
stream: a collective starts after the work queued on it, and later work on it
waits for the results. Every collective takes ``async_op=True`` and
then returns a :class:`Work`. A hang ends in a :class:`ringleader.Error`
subclass (a ``RuntimeError``) whose message is the verdict, naming the ranks,
the collective and the cause. ``import ringleader.torch`` registers the
PyTorch backend ``"ringleader"``.
"""

import atexit
import ctypes
import datetime
import json
import threading
import time
import weakref
from typing import List, Optional, Union

from . import _buffers, _callsite, _lib, _stacks
from .errors import (  # noqa: F401 (re-exported)
    AbortedError,
    AuthFailedError,
    DataPortUnreachableError,
    DuplicateRankError,
    Error,
    ForeignRunError,
    InternalError,
    InvalidArgumentError,
    MismatchError,
    MissedCollectiveError,
    PeerDiedError,
    PeerStalledError,
    PortInUseError,
    RendezvousIncompleteError,
    StoreUnreachableError,
    StragglerError,
    TimeoutError,
    VersionMismatchError,
    WorldSizeMismatchError,
    last_error,
)

__all__ = [
    "init",
    "ProcessGroup",
    "Work",
    "Store",
    "Error",
    "version",
    "cuda_support",
    "MissedCollectiveError",
    "MismatchError",
    "PeerDiedError",
    "PeerStalledError",
    "StragglerError",
    "TimeoutError",
    "RendezvousIncompleteError",
    "WorldSizeMismatchError",
    "DuplicateRankError",
    "VersionMismatchError",
    "StoreUnreachableError",
    "PortInUseError",
    "DataPortUnreachableError",
    "ForeignRunError",
    "AuthFailedError",
    "AbortedError",
    "InvalidArgumentError",
    "InternalError",
]

__version__ = "0.1.0"

_L = _lib.lib
_byref = ctypes.byref
_c_void_p = ctypes.c_void_p
_resolve = _buffers.resolve
Seconds = Union[float, int, datetime.timedelta]


def version() -> str:
    """The version of the loaded libringleader."""
    return _L.rl_version().decode()


def cuda_support() -> Optional[str]:
    """None when collectives on CUDA tensors can run here; otherwise why not
    (the library was built without its ``cuda`` feature, or the NVIDIA
    driver library cannot be loaded or initialized).

    Example::

        why = ringleader.cuda_support()
        if why is not None:
            print("CUDA tensors are not available:", why)
    """
    code = _L.rl_cuda_check()
    return None if code == 0 else last_error(code).args[0]


def _check(code: int):
    if code:
        raise last_error(code)


def _seconds(value: Optional[Seconds], name: str) -> Optional[float]:
    """Seconds from a number or a timedelta; None stays None."""
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        s = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        s = float(value)
    else:
        raise TypeError(f"{name}: expected seconds (a number) or a datetime.timedelta, got {type(value).__name__}")
    if not s > 0:
        raise ValueError(f"{name}: {value!r} is not a positive duration")
    return s


_OPS = dict(_lib.REDUCE_OPS)
_BOOL, _CODE, _DEVICE = _buffers.BOOL, _buffers.CODE, _buffers.DEVICE
# The blocking numpy lane of all_reduce: the buffers module's dtype table
# less bool (which reduces only with min and max: the general path checks).
# The lane reads the array's data pointer inline (see _buffers.NP_DATA_AT);
# where that is not possible every call takes the general path.
_NP_PLAIN = {dtype: code for dtype, code in _buffers._NP_CODES.items() if not code & _BOOL}
_NP_DATA_AT = _buffers.NP_DATA_AT
if _NP_DATA_AT is None:  # pragma: no cover
    _NP_PLAIN = {}
_ndarray, _C_WRITE = _buffers._ndarray, _buffers._C_WRITE
_from_address = ctypes.c_void_p.from_address
_hot = _lib.hot
_rl_all_reduce, _rl_all_gather, _rl_reduce_scatter = _hot.rl_all_reduce, _hot.rl_all_gather, _hot.rl_reduce_scatter
_rl_broadcast, _rl_reduce, _rl_all_to_all = _hot.rl_broadcast, _hot.rl_reduce, _hot.rl_all_to_all
_rl_send, _rl_recv, _rl_barrier = _hot.rl_send, _hot.rl_recv, _hot.rl_barrier
# Every caller of _note_site is one of this module's functions, so the walk
# to the user's frame starts at its caller.
_note_site = _callsite.note_caller


def _bind_lane():
    """ringleader._native (see _native.c) set up to take plain numpy arrays,
    or None: not built, not loaded, numpy missing, or numpy's array header
    not as the lane reads it (checked here on probe arrays against what numpy
    itself says of them)."""
    n = _lib.native
    if n is None or _ndarray is _buffers._NoNumpy or not _NP_PLAIN:
        return None
    import numpy as np

    probes = [np.arange(7, dtype=np.float32), np.zeros((3, 5))[1:], np.ones(0, dtype=np.int8),
              np.zeros((2, 3, 4), dtype=np.int64).T, np.arange(6, dtype=np.int32).reshape(2, 3)[:, ::2]]
    ro = np.ones(3, dtype=np.uint8)
    ro.flags.writeable = False
    probes.append(ro)
    rows = [(a, a.__array_interface__["data"][0], a.size, a.flags.num, a.dtype) for a in probes]
    return n if n.bind_numpy(np.ndarray, _NP_PLAIN, rows) else None


# The C lane for blocking calls on plain numpy arrays, or None. Each lane
# function answers 0 (done), the library's error code (> 0), or -1: not
# the lane's (another type, a strided, read-only or bool array, a destroyed
# group...), and then the method takes its general path.
_lane = _bind_lane()
NATIVE_LANE = _lane is not None
"""Whether blocking collectives on plain numpy arrays go through the package's
C lane (``ringleader._native``) rather than ctypes; why not, if not, in
:data:`NATIVE_LANE_MISSING`."""
NATIVE_LANE_MISSING = None if NATIVE_LANE else (_lib.NATIVE_MISSING or "numpy's array header is not as the lane reads it")
if _lane is not None:
    _lane_all_reduce, _lane_broadcast, _lane_barrier = _lane.all_reduce, _lane.broadcast, _lane.barrier
    _lane_all_gather, _lane_reduce_scatter = _lane.all_gather, _lane.reduce_scatter


def _destroyed() -> Error:
    return AbortedError("[aborted] the process group was destroyed", kind="aborted")


def _reduce_op(op) -> int:
    code = _lib.REDUCE_OPS.get(op.lower()) if isinstance(op, str) else None
    if code is None:
        raise ValueError(f"op: {op!r} is not one of 'sum', 'prod', 'min', 'max', 'avg'")
    return code


def _rank(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected a rank (int), got {type(value).__name__}")
    return value


class Work:
    """A collective running in the background (``async_op=True``).

    It keeps the buffers alive until the call completes. ``wait()`` raises the
    call's error, if any; ``is_completed()`` tells whether it ended.
    """

    __slots__ = ("_handles", "_keep", "_done", "_error", "_lock", "_then", "__weakref__")

    def __init__(self, handles, keep, then=None):
        self._handles = list(handles)
        self._keep = keep
        self._done = False
        self._error: Optional[Error] = None
        self._lock = threading.Lock()
        self._then = then

    def wait(self, timeout: Optional[Seconds] = None) -> None:
        """Waits for the call, at most ``timeout`` (seconds or timedelta; None:
        until it ends, which the communicator's own timeout bounds). Raises the
        call's error; :class:`ringleader.TimeoutError` if ``timeout`` passed
        first (the call keeps running: wait again)."""
        limit = _seconds(timeout, "timeout")
        self._finish(-1.0 if limit is None else limit)

    def is_completed(self) -> bool:
        """Whether the call ended (successfully or not)."""
        if self._done:
            return True
        done = ctypes.c_bool()
        for h in self._handles:
            _check(_L.rl_work_test(h, _byref(done)))
            if not done.value:
                return False
        self._finish(-1.0, raise_error=False)
        return True

    def is_success(self) -> bool:
        """Whether the call completed without error (False while it runs)."""
        return self.is_completed() and self._error is None

    def exception(self) -> Optional[Error]:
        """The call's error once it completed, else None."""
        return self._error if self.is_completed() else None

    def _finish(self, limit: float, raise_error: bool = True):
        with self._lock:
            if not self._done:
                deadline = None if limit < 0 else time.monotonic() + limit
                while self._handles:
                    left = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
                    h = self._handles[0]
                    code = _L.rl_work_wait(h, left)
                    if code:
                        err = last_error(code)
                        done = ctypes.c_bool()
                        _L.rl_work_test(h, _byref(done))
                        if not done.value:
                            raise err  # our wait ran out; the call still runs: wait again
                        if self._error is None:
                            self._error = err
                    _L.rl_work_free(self._handles.pop(0))
                if self._error is None and self._then is not None:
                    try:
                        self._then()
                    except Exception as e:  # a copy-back failed: report it as the call's error
                        self._error = e
                self._then = None
                self._keep = None
                self._done = True
        if raise_error and self._error is not None:
            raise self._error

    def __del__(self):
        try:
            for h in self._handles:
                _L.rl_work_free(h)  # waits for the call: it writes into buffers we keep alive
            self._handles = []
        except Exception:
            pass


_live: "weakref.WeakSet[ProcessGroup]" = weakref.WeakSet()
_live_lock = threading.Lock()


class ProcessGroup:
    """One rank's membership in a job, made by :func:`init`.

    Methods run collectives on numpy arrays or CPU torch tensors in place.
    ``async_op=True`` returns a :class:`Work` instead of blocking. Use it as a
    context manager, or call :meth:`destroy`, to leave the job cleanly; groups
    still alive when the interpreter exits are destroyed then.
    """

    def __init__(self, handle: int):
        self._h = handle
        # Run by destroy() before the handle is freed: holders of the raw
        # handle outside this object (the torch backend's C++ lane) let go.
        self._before_destroy: list = []
        self.rank: int = _L.rl_comm_rank(handle)
        self.world_size: int = _L.rl_comm_world_size(handle)
        self.timeout: float = _L.rl_comm_timeout(handle)
        with _live_lock:
            _live.add(self)

    def __repr__(self):
        state = "destroyed" if self._h is None else f"rank {self.rank} of {self.world_size}"
        return f"<ringleader.ProcessGroup {state}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def _handle(self):
        h = self._h
        if h is None:
            raise _destroyed()
        return h

    def _run(self, fn, args, async_op, keep):
        if not async_op:
            _note_site()
            _check(fn(*args, None))
            return None
        return self._submit(fn, args, keep)

    @staticmethod
    def _on_device(fn, args, async_op, tensor, keep):
        """Runs a collective on CUDA tensors, ordered on ``tensor``'s current
        stream. The call returns once the data went through the transport
        (later work on the stream waits for the copies back), so the Work of
        ``async_op=True`` is already complete."""
        _check(fn(*args, _buffers.cuda_stream(tensor)))
        return Work([], keep) if async_op else None

    @staticmethod
    def _submit(fn, args, keep) -> "Work":
        _note_site()
        w = _c_void_p()
        _check(fn(*args, _byref(w)))
        return Work([w.value], keep)

    # -- collectives -------------------------------------------------------
    # Each resolves its buffers to (pointer, count, dtype code) and calls the
    # C ABI (the word-typed prototypes of _lib.hot); the blocking path is
    # spelled out in each method, because at small sizes this Python is most
    # of a call's time. Checks run in the same order in every path, so that
    # the first thing wrong is the one named.

    def all_reduce(self, buf, op: str = "sum", async_op: bool = False) -> Optional[Work]:
        """Reduces ``buf`` across all ranks, in place."""
        if _lane is not None and not async_op:
            opc = _OPS.get(op) if op.__class__ is str else None
            if opc is not None:
                rc = _lane_all_reduce(self._h, buf, opc)
                if rc == 0:
                    return None
                if rc > 0:
                    raise last_error(rc)
        elif buf.__class__ is _ndarray and not async_op:
            # The latency lane: a blocking call on a writable, contiguous
            # numpy array of a plain dtype (not bool), op given by name.
            # Anything else, every error included, takes the general path.
            code = _NP_PLAIN.get(buf.dtype)
            opc = _OPS.get(op) if op.__class__ is str else None
            h = self._h
            if code is not None and opc is not None and h is not None and buf.flags.num & _C_WRITE == _C_WRITE:
                _note_site()
                rc = _rl_all_reduce(h, _from_address(id(buf) + _NP_DATA_AT).value, buf.size, code, opc, None)
                if rc:
                    raise last_error(rc)
                return None
        ptr, count, code = _resolve(buf, "buf", True)
        opc = _OPS.get(op) if op.__class__ is str else None
        if opc is None:
            opc = _reduce_op(op)
        if code & _BOOL:
            _buffers.check_bool_op(code, op, "buf")
        h = self._h
        if h is None:
            raise _destroyed()
        if code & _DEVICE:
            return self._on_device(_L.rl_all_reduce_device, (h, ptr, count, code & _CODE, opc), async_op, buf, buf)
        if not async_op:
            _note_site()
            rc = _rl_all_reduce(h, ptr, count, code & _CODE, opc, None)
            if rc:
                raise last_error(rc)
            return None
        return self._submit(_rl_all_reduce, (h, ptr, count, code & _CODE, opc), buf)

    def reduce_scatter(self, out, inp, op: str = "sum", async_op: bool = False) -> Optional[Work]:
        """Reduces ``inp`` (world_size x len(out) elements) across ranks; segment ``rank`` lands in ``out``."""
        if _lane is not None and not async_op:
            opc = _OPS.get(op) if op.__class__ is str else None
            if opc is not None:
                rc = _lane_reduce_scatter(self._h, out, inp, opc)
                if rc == 0:
                    return None
                if rc > 0:
                    raise last_error(rc)
        op_, oc, ocode = _resolve(out, "out", True)
        ip, ic, icode = _resolve(inp, "inp", False)
        if ocode != icode:
            _buffers.same_dtype(ocode, icode, "out", "inp")
            _buffers.same_place(ocode, icode, "out", "inp")
        if icode & _BOOL:
            _buffers.check_bool_op(icode, op, "inp")
        h = self._h
        if h is None:
            raise _destroyed()
        opc = _OPS.get(op) if op.__class__ is str else None
        if opc is None:
            opc = _reduce_op(op)
        args = (h, ip, ic, op_, oc, icode & _CODE, opc)
        if icode & _DEVICE:
            return self._on_device(_L.rl_reduce_scatter_device, args, async_op, out, (out, inp))
        if not async_op:
            _note_site()
            rc = _rl_reduce_scatter(*args, None)
            if rc:
                raise last_error(rc)
            return None
        return self._submit(_rl_reduce_scatter, args, (out, inp))

    def all_gather(self, out, inp, async_op: bool = False) -> Optional[Work]:
        """Concatenates every rank's ``inp`` in rank order into ``out`` (world_size x len(inp) elements)."""
        if _lane is not None and not async_op:
            rc = _lane_all_gather(self._h, out, inp)
            if rc == 0:
                return None
            if rc > 0:
                raise last_error(rc)
        op_, oc, ocode = _resolve(out, "out", True)
        ip, ic, icode = _resolve(inp, "inp", False)
        if ocode != icode:
            _buffers.same_dtype(ocode, icode, "out", "inp")
            _buffers.same_place(ocode, icode, "out", "inp")
        h = self._h
        if h is None:
            raise _destroyed()
        args = (h, ip, ic, op_, oc, icode & _CODE)
        if icode & _DEVICE:
            return self._on_device(_L.rl_all_gather_device, args, async_op, out, (out, inp))
        if not async_op:
            _note_site()
            rc = _rl_all_gather(*args, None)
            if rc:
                raise last_error(rc)
            return None
        return self._submit(_rl_all_gather, args, (out, inp))

    def broadcast(self, buf, root: int = 0, async_op: bool = False) -> Optional[Work]:
        """Copies rank ``root``'s ``buf`` into every rank's ``buf``."""
        if _lane is not None and not async_op:
            rc = _lane_broadcast(self._h, buf, root)
            if rc == 0:
                return None
            if rc > 0:
                raise last_error(rc)
        ptr, count, code = _resolve(buf, "buf", True)
        h = self._h
        if h is None:
            raise _destroyed()
        if root.__class__ is not int:
            root = _rank(root, "root")
        args = (h, ptr, count, code & _CODE, root)
        if code & _DEVICE:
            return self._on_device(_L.rl_broadcast_device, args, async_op, buf, buf)
        if not async_op:
            _note_site()
            rc = _rl_broadcast(*args, None)
            if rc:
                raise last_error(rc)
            return None
        return self._submit(_rl_broadcast, args, buf)

    def reduce(self, buf, root: int = 0, op: str = "sum", async_op: bool = False) -> Optional[Work]:
        """Reduces ``buf`` across ranks into rank ``root``'s ``buf`` (the others' stay unchanged)."""
        ptr, count, code = _resolve(buf, "buf", True)
        if code & _BOOL:
            _buffers.check_bool_op(code, op, "buf")
        h = self._h
        if h is None:
            raise _destroyed()
        if root.__class__ is not int:
            root = _rank(root, "root")
        opc = _OPS.get(op) if op.__class__ is str else None
        if opc is None:
            opc = _reduce_op(op)
        args = (h, ptr, count, code & _CODE, root, opc)
        if code & _DEVICE:
            return self._on_device(_L.rl_reduce_device, args, async_op, buf, buf)
        if not async_op:
            _note_site()
            rc = _rl_reduce(*args, None)
            if rc:
                raise last_error(rc)
            return None
        return self._submit(_rl_reduce, args, buf)

    def all_to_all(self, out, inp, async_op: bool = False) -> Optional[Work]:
        """Sends segment j of ``inp`` to rank j; segment j of ``out`` receives rank j's segment."""
        op_, oc, ocode = _resolve(out, "out", True)
        ip, ic, icode = _resolve(inp, "inp", False)
        if ocode != icode:
            _buffers.same_dtype(ocode, icode, "out", "inp")
            _buffers.same_place(ocode, icode, "out", "inp")
        args = (self._handle(), ip, ic, op_, oc, icode & _CODE)
        if icode & _DEVICE:
            return self._on_device(_L.rl_all_to_all_device, args, async_op, out, (out, inp))
        return self._run(_rl_all_to_all, args, async_op, (out, inp))

    def send(self, buf, dst: int, async_op: bool = False) -> Optional[Work]:
        """Sends ``buf`` to rank ``dst`` (which calls :meth:`recv` with the same size and dtype).
        A CUDA tensor is staged through a host copy."""
        ptr, count, code = _resolve(buf, "buf", False)
        if code & _DEVICE:
            return self.send(buf.cpu(), dst, async_op)
        h = self._h
        if h is None:
            raise _destroyed()
        if dst.__class__ is not int:
            dst = _rank(dst, "dst")
        return self._run(_rl_send, (h, ptr, count, code & _CODE, dst), async_op, buf)

    def recv(self, buf, src: int, async_op: bool = False) -> Optional[Work]:
        """Receives ``buf`` from rank ``src``. A CUDA tensor is staged through a host copy."""
        ptr, count, code = _resolve(buf, "buf", True)
        if code & _DEVICE:
            host = buf.new_empty(buf.shape, device="cpu")
            work = self.recv(host, src, async_op=True)
            work._then = lambda: buf.copy_(host)
            work._keep = (buf, host)
            return work if async_op else work.wait()
        h = self._h
        if h is None:
            raise _destroyed()
        if src.__class__ is not int:
            src = _rank(src, "src")
        return self._run(_rl_recv, (h, ptr, count, code & _CODE, src), async_op, buf)

    def barrier(self, async_op: bool = False) -> Optional[Work]:
        """Returns once every rank has entered the barrier."""
        if _lane is not None and not async_op:
            rc = _lane_barrier(self._h)
            if rc == 0:
                return None
            if rc > 0:
                raise last_error(rc)
        h = self._h
        if h is None:
            raise _destroyed()
        if not async_op:
            _note_site()
            rc = _rl_barrier(h, None)
            if rc:
                raise last_error(rc)
            return None
        return self._submit(_rl_barrier, (h,), None)

    def monitored_barrier(
        self, timeout: Optional[Seconds] = None, wait_all_ranks: bool = False, async_op: bool = False
    ) -> Optional[Work]:
        """A barrier in which rank 0 waits at most ``timeout`` (default: the
        group's timeout) and then raises naming the ranks that did not arrive
        ("Rank 1 failed to pass monitored_barrier in 5000 ms"): all of them with
        ``wait_all_ranks``, else the first. The group stays usable afterwards."""
        t = _seconds(timeout, "timeout") or self.timeout
        args = (self._handle(), t, 1 if wait_all_ranks else 0)
        return self._run(_L.rl_monitored_barrier, args, async_op, None)

    # -- diagnostics and lifetime -------------------------------------------

    def flight_recorder(self) -> List[dict]:
        """The last operations, oldest first, as dicts whose fields follow
        PyTorch's flight recorder (``record_id``, ``collective_seq_id``,
        ``profiling_name``, ``state``, ...)."""
        out = _c_void_p()
        _check(_L.rl_comm_flight_recorder_json(self._handle(), _byref(out)))
        return json.loads(_lib.take_string(out.value) or "[]")

    def dump(self, path=None) -> str:
        """Writes this rank's flight-recorder dump (JSON) to ``path``, or to
        ``$RINGLEADER_DUMP_DIR/<run>/ringleader-rank<R>.json`` (default folder
        ``$TMPDIR/ringleader-dumps-$UID``); returns the path written."""
        out = _c_void_p()
        p = None if path is None else str(path).encode()
        _check(_L.rl_comm_dump(self._handle(), p, _byref(out)))
        return _lib.take_string(out.value)

    def abort(self, reason: str = "aborted from Python") -> None:
        """Aborts: the running call and every later one fail, and the other ranks learn why."""
        _check(_L.rl_abort(self._handle(), reason.encode()))

    def destroy(self) -> None:
        """Leaves the job cleanly (the other ranks read "left", not "died"). Idempotent.

        Safe while another thread is inside a call on this group: that call
        is aborted (it raises :class:`AbortedError`) and waited for (at most
        the timeout plus 5 s) before anything is freed."""
        self._destroy(forget=True)

    def _destroy(self, forget: bool) -> None:
        """destroy(); ``forget`` False from the finalizer, which must not take
        ``_live_lock``: the collector runs finalizers on whichever thread
        allocates, and that thread may hold the lock (at exit,
        _destroy_live_groups does while it copies the set), so taking it
        there deadlocked (a group left in a reference cycle by an exception
        hung its process at exit). The weak set drops a finalized group by
        itself."""
        h, self._h = self._h, None
        if h is not None:
            if forget:
                with _live_lock:
                    _live.discard(self)
            for release in self._before_destroy:
                release()
            self._before_destroy = []
            _check(_L.rl_destroy(h))

    def __del__(self):
        try:
            self._destroy(forget=False)
        except Exception:
            pass


def init(
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    master_addr: Optional[str] = None,
    master_port: Optional[int] = None,
    timeout: Optional[Seconds] = None,
    *,
    store_addr: Optional[str] = None,
    run_id: Optional[str] = None,
    token: Optional[str] = None,
    init_timeout: Optional[Seconds] = None,
    stall_warn: Optional[Seconds] = None,
    interrupt_on_sigint: bool = True,
    group_ranks: Optional[List[int]] = None,
    group_name: Optional[str] = None,
) -> ProcessGroup:
    """Joins a job and returns its :class:`ProcessGroup`.

    Each argument left as None comes from the environment (docs/DESIGN.md §3):
    ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` (torchrun,
    ``ringleader launch``), Slurm's or Open MPI's variables; ``timeout`` from
    ``RINGLEADER_TIMEOUT`` (default 600 s), and so on. ``store_addr``
    (``host:port``) joins a store that already runs (``RINGLEADER_STORE_ADDR``);
    otherwise rank 0 hosts it on ``master_port``. Durations are seconds or
    ``datetime.timedelta``. With ``interrupt_on_sigint`` (the default), Ctrl-C
    aborts a blocked collective, so ``KeyboardInterrupt`` arrives at once.

    For a group over some of the job's ranks, ``group_ranks`` lists the global
    rank of each of its ranks (``group_ranks[r]`` is group rank ``r``'s) and
    ``group_name`` names it: every message then names global ranks and the
    group, as the PyTorch backend does for ``new_group``.
    """
    cfg = _lib.Config()
    _L.rl_config_init(_byref(cfg))
    if rank is not None:
        cfg.rank = _rank(rank, "rank")
    if world_size is not None:
        if _rank(world_size, "world_size") <= 0:
            raise ValueError(f"world_size: {world_size} is not a positive number")
        cfg.world_size = world_size
    if master_addr is not None:
        cfg.master_addr = str(master_addr).encode()
    if master_port is not None:
        if not isinstance(master_port, int) or not 0 < master_port < 65536:
            raise ValueError(f"master_port: {master_port!r} is not a port (1-65535)")
        cfg.master_port = master_port
    for field, value in (("store_addr", store_addr), ("run_id", run_id), ("token", token)):
        if value is not None:
            setattr(cfg, field, str(value).encode())
    cfg.timeout_s = _seconds(timeout, "timeout") or 0.0
    cfg.init_timeout_s = _seconds(init_timeout, "init_timeout") or 0.0
    cfg.stall_warn_s = _seconds(stall_warn, "stall_warn") or 0.0
    cfg.interrupt_on_sigint = 1 if interrupt_on_sigint else 0
    ranks_arr = None
    if group_ranks is not None:
        ranks = [_rank(r, "group_ranks") for r in group_ranks]
        ranks_arr = (ctypes.c_int64 * len(ranks))(*ranks)
        cfg.group_ranks = ctypes.cast(ranks_arr, ctypes.POINTER(ctypes.c_int64))
        cfg.group_ranks_count = len(ranks)
    if group_name is not None:
        cfg.group_name = str(group_name).encode()
    # Where this process's Python threads are, for the verdict of a failed
    # job (see _stacks); armed once per process.
    _stacks.arm()
    out = _c_void_p()
    _check(_L.rl_init(_byref(cfg), _byref(out)))
    return ProcessGroup(out.value)


class Store:
    """A ringleader store server hosted in this process (what rank 0 or a
    launcher runs for rendezvous). ``Store("0.0.0.0:0", run_id)`` picks a free
    port; pass ``f"{host}:{store.port}"`` to :func:`init` as ``store_addr``."""

    def __init__(self, bind_addr: str = "0.0.0.0:0", run_id: Optional[str] = None, token: Optional[str] = None):
        out = _c_void_p()
        enc = lambda s: None if s is None else str(s).encode()  # noqa: E731
        _check(_L.rl_store_start(enc(bind_addr), enc(run_id), enc(token), _byref(out)))
        self._h = out.value
        self.run_id = run_id
        self.port: int = _L.rl_store_port(self._h)

    def wait_idle(self, timeout: Seconds = 10.0) -> bool:
        """Waits until no rank is connected any more; False if some still were after ``timeout``."""
        if self._h is None:
            return True
        code = _L.rl_store_wait_idle(self._h, _seconds(timeout, "timeout"))
        if code == 6:
            last_error(code)
            return False
        _check(code)
        return True

    def close(self) -> None:
        """Stops the server. Idempotent."""
        h, self._h = self._h, None
        if h is not None:
            _L.rl_store_free(h)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


@atexit.register
def _destroy_live_groups():
    """Groups still alive at exit leave cleanly, so peers read "left" rather than "died"."""
    with _live_lock:
        groups = list(_live)
    for pg in groups:
        try:
            pg.destroy()
        except Exception:
            pass
