"""The PyTorch backend ``"ringleader"``.

``import ringleader.torch`` registers it, after which unchanged PyTorch code
runs on ringleader::

    import ringleader.torch  # noqa: F401
    import torch.distributed as dist
    dist.init_process_group(backend="ringleader")   # env://: torchrun or `ringleader launch`

and a hang ends in PyTorch's own exception type, ``DistBackendError`` (or
``DistNetworkError`` / ``DistStoreError`` where they fit), whose message is
the verdict ("[missed-collective] rank 1 ... all_reduce #2"), so code
written against gloo or NCCL catches it unchanged. Each is also the
matching :class:`ringleader.Error` subclass (``ringleader.torch.PeerDiedError``
is a ``DistBackendError`` and a ``ringleader.PeerDiedError``), carrying
``.kind``, ``.ranks`` (global ranks), ``.seq`` and ``.op``.

Where ringleader's store lives: under ``ringleader launch`` (which hosts a
store and sets ``RINGLEADER_STORE_ADDR``) the default group joins that
store. Otherwise, and for every sub-group (``dist.new_group``), the group's
rank 0 starts a ringleader store in a process of its own
(``ringleader._store_daemon``, detached in its own session), so that the
death of any rank, rank 0 included, is still seen and named by the others;
it ends by itself once every rank has left or vanished. Rank 0 publishes
``host:port`` and a fresh run id under the key ``ringleader/store`` in the
store torch hands to the backend (the group's PrefixStore over torch's
TCPStore); the other ranks read it from there. The store listens on
loopback when the whole job runs on this host (``LOCAL_WORLD_SIZE ==
WORLD_SIZE``), else on the one address this process uses to reach
``MASTER_ADDR``; never on ``MASTER_PORT``, where torch's own TCPStore lives.

Secrets: without ``RINGLEADER_TOKEN``, rank 0 makes a random token for the
group's store. On one host it passes it in a file only this user can read
(under ``$TMPDIR/ringleader-$UID``, removed once every rank has joined);
across hosts, through torch's store, which anyone who can reach
``MASTER_PORT`` can read: that case is said once in the log, and setting
``RINGLEADER_TOKEN`` on every node closes it.

Ranks in messages: a sub-group's communicator (``new_group``, ``split_group``)
numbers its ranks 0..n-1, as
torch does; the backend hands ringleader each one's global rank and torch's
group name, so verdicts, warnings and dumps name global ranks and the group
(``rank 3 ... did not enter all_reduce #2 of group 1 (ranks 1-3)``).

Blocking and asynchronous calls: a call torch waits for at once (the
``torch.distributed`` functions without ``async_op=True``) runs in the
calling thread and returns completed work; the others (``async_op=True``,
DDP's gradient buckets) run on ringleader's engine thread, so DDP overlaps
communication with backward. Both are recorded, checked and tagged with
their call site alike.

Timeouts: the ``timeout`` of ``init_process_group`` becomes ringleader's hard
collective timeout, except torch's default of 30 minutes, which means "not
given": then ``RINGLEADER_TIMEOUT`` or ringleader's default (600 s) applies.
"""

import atexit
import ctypes
import datetime
import json
import os
import secrets
import select
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import uuid
from typing import List, Optional

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _CBackend

import ringleader

from . import Work as _RLWork
from . import _buffers, _callsite, _lib


def _native_base():
    """(base class, why not native): the C++ base of RingleaderBackend
    (_torch_native.cpp, built at install time) when it loads, else torch's
    Backend and the reason. ``RINGLEADER_TORCH_NATIVE=0`` asks for the
    Python path alone (to measure, or to rule the C++ lane out)."""
    if os.environ.get("RINGLEADER_TORCH_NATIVE", "1") == "0":
        return _CBackend, "RINGLEADER_TORCH_NATIVE=0"
    try:
        from . import _torch_native
    except ImportError as e:  # not built (no compiler at install time), or built for another torch
        return _CBackend, f"ringleader._torch_native did not load: {e}"
    return _torch_native.FastBackend, None


_Base, NATIVE_MISSING = _native_base()
NATIVE = NATIVE_MISSING is None

__all__ = ["RingleaderBackend", "communicator", "BACKEND", "NATIVE", "torch_error"]

BACKEND = "ringleader"
STORE_KEY = "ringleader/store"
# How long group rank 0 waits for its store process to report its port.
_STORE_START_S = 30.0
_warned_open_token = False

try:
    from torch.distributed.constants import default_pg_timeout as _TORCH_DEFAULT_TIMEOUT
except ImportError:  # pragma: no cover
    _TORCH_DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)

_launcher_store_taken = False
_backends: "set[RingleaderBackend]" = set()
_lock = threading.Lock()


# Which of PyTorch's exception types each kind raises as: the store's own
# failures are DistStoreError, the data network's DistNetworkError, and every
# other failure of a collective DistBackendError, as gloo's and NCCL's are.
_TORCH_BASE = {
    "store-unreachable": dist.DistStoreError,
    "rendezvous-incomplete": dist.DistStoreError,
    "data-port-unreachable": dist.DistNetworkError,
    "port-in-use": dist.DistNetworkError,
}


def _torch_class(cls):
    """``cls`` (a ringleader.Error subclass) made a subclass of PyTorch's type too."""
    base = _TORCH_BASE.get(cls.kind, dist.DistBackendError)
    made = type(cls.__name__, (base, cls), {"__module__": __name__, "__doc__": cls.__doc__})
    made.__qualname__ = cls.__name__
    return made


_TORCH_ERRORS = {cls: _torch_class(cls) for cls in set(ringleader.errors.BY_CODE.values())}
globals().update({cls.__name__: made for cls, made in _TORCH_ERRORS.items()})


def torch_error(e: "ringleader.Error") -> BaseException:
    """The same failure as PyTorch's exception type (see the module docs)."""
    cls = _TORCH_ERRORS.get(type(e))
    if cls is None:
        return e
    return cls(str(e), kind=e.kind, ranks=e.ranks, seq=e.seq, op=e.op)


def _raises_torch_errors(fn):
    """Wraps a backend method so ringleader's errors leave as PyTorch's types
    (a method that converts its own errors, marked ``_converts_errors``, is
    left as it is: see RingleaderBackend.allreduce)."""

    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ringleader.Error as e:
            converted = torch_error(e)
            if converted is e:
                raise
            raise converted from None

    wrapped.__name__, wrapped.__qualname__, wrapped.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    return wrapped


def _raise_as_torch(e: "ringleader.Error"):
    """Raises ``e`` as _raises_torch_errors' wrapper would have, for the
    methods that convert their own errors (one Python frame fewer per call)."""
    converted = torch_error(e)
    if converted is e:
        raise e
    raise converted from None


def _raise_code(rc: int):
    """The C++ lane's failures: raises the failure of the call on this
    thread that returned ``rc`` as torch's exception type."""
    _raise_as_torch(ringleader.last_error(rc))


def _reduce_op(red) -> str:
    """torch's ReduceOp (or RedOpType) to ringleader's op name."""
    R = dist.ReduceOp
    for name, value in (("sum", R.SUM), ("prod", R.PRODUCT), ("min", R.MIN), ("max", R.MAX), ("avg", R.AVG)):
        if red == value:
            return name
    raise ValueError(f"reduce op {red} is not supported by ringleader (SUM, PRODUCT, MIN, MAX, AVG are)")


# The blocking all_reduce's lane (RingleaderBackend.allreduce): what it
# checks and converts per call is looked up in these tables, because at 8
# bytes torch's own dispatch and this Python are most of the call's time.
# Bool is left out: it reduces only with min and max, which the general
# path checks.
_ALL_REDUCE = _lib.hot.rl_all_reduce  # integer arguments as machine words (see _lib.hot)
# Called from RingleaderBackend.allreduce only: the walk to the user's frame
# starts at its caller (torch's dist.all_reduce, or whoever called the backend).
_NOTE_SITE = _callsite.note_caller
_STRIDED = torch.strided
_buffers._torch_tables()
# The buffers module's dtype table, less bool (see above).
_CPU_CODES = {dtype: code for dtype, code in _buffers._TORCH_CODES.items() if dtype is not torch.bool}
# Keyed by the hash of torch's ReduceOp, which is its operation's number
# (RedOpType): hashing opts.reduceOp costs a third of reading its .op, and a
# dict keyed by ReduceOp objects would call their pybind11 __eq__ on every
# lookup, slower still. Built from torch's own objects, so the numbers are
# torch's. PREMUL_SUM and the bitwise ops find nothing here and take the
# general path, which names them.
_REDUCE_CODES = {
    hash(dist.ReduceOp(dist.ReduceOp.SUM)): _lib.REDUCE_OPS["sum"],
    hash(dist.ReduceOp(dist.ReduceOp.PRODUCT)): _lib.REDUCE_OPS["prod"],
    hash(dist.ReduceOp(dist.ReduceOp.MIN)): _lib.REDUCE_OPS["min"],
    hash(dist.ReduceOp(dist.ReduceOp.MAX)): _lib.REDUCE_OPS["max"],
    hash(dist.ReduceOp(dist.ReduceOp.AVG)): _lib.REDUCE_OPS["avg"],
}
if len(_REDUCE_CODES) != 5:  # a torch whose ops hash alike: every op takes the general path
    _REDUCE_CODES = {}


def _route_host(host: str, port: int) -> Optional[str]:
    """The local address on the route to host:port (no packet is sent)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family[0], socket.SOCK_DGRAM) as s:
            s.connect(family[4])
            return s.getsockname()[0]
    except OSError:
        return None


def _reachable_host(store) -> str:
    """An address of this process that the group's other ranks can reach."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "29500")
    if not host:
        s = store
        while hasattr(s, "underlying_store"):
            s = s.underlying_store
        if isinstance(s, dist.TCPStore):
            host, port = s.host, s.port
    if host:
        local = _route_host(host, int(port or 29500))
        if local:
            return local
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _is_world(rank: int, size: int) -> bool:
    env = os.environ
    return env.get("WORLD_SIZE") == str(size) and env.get("RANK") == str(rank)


def _ringleader_timeout(timeout) -> Optional[datetime.timedelta]:
    if timeout is None or timeout == _TORCH_DEFAULT_TIMEOUT or timeout.total_seconds() <= 0:
        return None
    return timeout


def _group_args(global_ranks, group_name) -> dict:
    """ringleader.init's group arguments: none for the default group, which
    torch creates before it counts as initialized."""
    ranks = [int(r) for r in (global_ranks or [])]
    if not ranks or not dist.is_initialized():
        return {}
    return {"group_ranks": ranks, "group_name": str(group_name) if group_name not in (None, "") else None}


def _single_host() -> bool:
    """Whether every rank of the job runs on this host, as far as the launch says."""
    env = os.environ
    if env.get("LOCAL_WORLD_SIZE") and env.get("LOCAL_WORLD_SIZE") == env.get("WORLD_SIZE"):
        return True
    addr = env.get("MASTER_ADDR", "")
    return addr in ("127.0.0.1", "localhost", "::1")


def _private_dir() -> str:
    """This user's private directory for ringleader's secrets (0700, owned by
    us, not a symlink), under the temporary directory."""
    path = os.path.join(tempfile.gettempdir(), f"ringleader-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ringleader.Error(
            f"[invalid-argument] {path} is not a private directory of this user (a symlink, another owner, "
            "or open to others): remove it, or set RINGLEADER_TOKEN",
            kind="invalid-argument",
        )
    return path


def _token_file(run_id: str) -> str:
    return os.path.join(_private_dir(), f"{run_id}.token")


def _new_token(run_id: str, single_host: bool) -> dict:
    """A token for this group's store, and how the other ranks find it: on one
    host, in a file only this user can read; across hosts, in torch's store."""
    token = secrets.token_hex(16)
    if single_host:
        path = _token_file(run_id)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        return {"token": token, "token_in": "file"}
    global _warned_open_token
    if not _warned_open_token:
        _warned_open_token = True
        print(
            "[ringleader] warning: RINGLEADER_TOKEN is not set, so ringleader made a secret for this multi-host job "
            "and passed it through torch's store on MASTER_PORT, which anyone who can reach that port can read; "
            "set RINGLEADER_TOKEN to the same secret on every node to close that",
            file=sys.stderr,
            flush=True,
        )
    return {"token": token, "token_in": "store"}


def _start_store(host: str, run_id: str, token: str, join_timeout: float) -> int:
    """Starts the group's store as a detached process (ringleader._store_daemon)
    listening on ``host``; returns its port."""
    env = dict(os.environ, RINGLEADER_TOKEN=token)
    argv = [sys.executable, "-m", "ringleader._store_daemon", "--bind", f"{host}:0", "--run-id", run_id,
            "--join-timeout", str(join_timeout)]
    # Its own session: rank 0's death, or a signal to rank 0's process group
    # (a launcher tearing the job down), must not take the store along.
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    line = ""
    ready, _, _ = select.select([proc.stdout], [], [], _STORE_START_S)
    if ready:
        line = proc.stdout.readline().decode(errors="replace").strip()
    proc.stdout.close()
    if line.startswith("PORT "):
        return int(line.split()[1])
    proc.kill()
    detail = line[6:] if line.startswith("ERROR ") else f"no answer within {_STORE_START_S:.0f} s"
    raise ringleader.Error(f"[store-unreachable] cannot start ringleader's store on {host}: {detail}",
                           kind="store-unreachable")


def _connect(store, rank: int, size: int, timeout, group: dict):
    """Joins the group's ringleader store (started by group rank 0, detached);
    returns the ringleader group."""
    global _launcher_store_taken
    t = _ringleader_timeout(timeout)
    with _lock:
        use_launcher = bool(os.environ.get("RINGLEADER_STORE_ADDR")) and not _launcher_store_taken
        use_launcher = use_launcher and _is_world(rank, size)
        if use_launcher:
            _launcher_store_taken = True
    if use_launcher:
        # `ringleader launch` hosts the job's store and tracks every rank's liveness there.
        return ringleader.init(rank=rank, world_size=size, timeout=t, **group)
    single = _single_host()
    if rank == 0:
        run_id = f"torch-{uuid.uuid4().hex[:16]}"
        secret = {"token": os.environ["RINGLEADER_TOKEN"], "token_in": "env"} if os.environ.get(
            "RINGLEADER_TOKEN") else _new_token(run_id, single)
        # Nothing listens wider than it must: loopback for a one-host job,
        # else the one address the other hosts reach us by.
        host = "127.0.0.1" if single else _reachable_host(store)
        init_timeout = float(os.environ.get("RINGLEADER_INIT_TIMEOUT") or 300)
        port = _start_store(host, run_id, secret["token"], init_timeout + 30)
        if ":" in host:
            host = f"[{host}]"
        info = {"addr": f"{host}:{port}", "run_id": run_id, "token_in": secret["token_in"]}
        if secret["token_in"] == "store":
            info["token"] = secret["token"]
        store.set(STORE_KEY, json.dumps(info))
    info = json.loads(store.get(STORE_KEY))
    token = {"env": os.environ.get("RINGLEADER_TOKEN"), "store": info.get("token")}.get(info.get("token_in"))
    if info.get("token_in") == "file":
        with open(_token_file(info["run_id"]), encoding="utf-8") as f:
            token = f.read().strip()
    try:
        pg = ringleader.init(rank=rank, world_size=size, timeout=t, store_addr=info["addr"],
                             run_id=info["run_id"], token=token, **group)
    finally:
        if rank == 0:
            # Once init returns every rank has joined, so every rank has read
            # the key and the token: a later group under the same prefix (init
            # after destroy) must not find them.
            for cleanup in (lambda: store.delete_key(STORE_KEY), lambda: os.unlink(_token_file(info["run_id"]))):
                try:
                    cleanup()
                except Exception:
                    pass
    return pg


class _Completer:
    """One thread per backend that completes futures in order (operations end in submission order)."""

    def __init__(self):
        import queue

        self._q = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="ringleader-futures", daemon=True)
        self._thread.start()

    def add(self, work: "_TorchWork"):
        self._q.put(work)

    def _run(self):
        while True:
            w = self._q.get()
            w._complete_future()


class _TorchWork(dist._Work):
    """torch's Work over a ringleader work (``wait``, ``is_completed``, ``get_future``)."""

    def __init__(self, work: Optional[_RLWork], result: List[torch.Tensor], backend: "RingleaderBackend"):
        super().__init__()
        self._w = work
        self._result = result
        self._backend = backend
        self._fut = None
        self._fut_lock = threading.Lock()

    @_raises_torch_errors
    def wait(self, timeout=None) -> bool:
        limit = None
        if isinstance(timeout, datetime.timedelta) and timeout.total_seconds() > 0:
            limit = timeout
        if self._w is not None:
            self._w.wait(limit)
        return True

    def is_completed(self) -> bool:
        return self._w is None or self._w.is_completed()

    def is_success(self) -> bool:
        return self._w is None or self._w.is_success()

    def exception(self):
        e = None if self._w is None else self._w.exception()
        return torch_error(e) if isinstance(e, ringleader.Error) else e

    def result(self) -> List[torch.Tensor]:
        return self._result

    def synchronize(self):
        pass

    def get_future(self) -> torch.futures.Future:
        with self._fut_lock:
            if self._fut is None:
                self._fut = torch.futures.Future()
                if self.is_completed():
                    self._complete_future()
                else:
                    self._backend._completer().add(self)
            return self._fut

    def _complete_future(self):
        fut = self._fut
        if fut is None or fut.done():
            return
        try:
            self.wait()
        except BaseException as e:  # noqa: B902 - handed to the future's waiter
            fut.set_exception(e)
            return
        fut.set_result(self._result)


class _DoneWork(dist._Work):
    """torch's Work for a call that already ran to completion in the calling
    thread (a blocking call: see :func:`_blocking`). Nothing is left to wait
    for, so it holds only the result; failures never get here (they were
    raised by the call itself).

    Made by :func:`_done`. It has no ``__init__`` of its own, so that making
    one is the C++ base's constructor alone: a Python ``__init__`` calling
    ``super().__init__()`` cost 0.4 us more per blocking call. ``_result``
    is a slot (``__dict__`` stays, for anyone who sets attributes on works;
    the weakref slot is the base's)."""

    __slots__ = ("_result", "__dict__")

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self) -> List[torch.Tensor]:
        return self._result

    def synchronize(self):
        pass

    def get_future(self) -> torch.futures.Future:
        fut = torch.futures.Future()
        fut.set_result(self._result)
        return fut


def _done(result: List[torch.Tensor]) -> _DoneWork:
    """A completed :class:`_DoneWork` holding ``result``."""
    w = _DoneWork()
    w._result = result
    return w


def _blocking(opts) -> bool:
    """Whether torch waits for this call at once: ``torch.distributed``'s
    functions set ``opts.asyncOp`` to their ``async_op`` argument, and torch's
    other callers (DDP's reducer, the comm hooks) leave it at its default,
    True. A blocking call runs in the calling thread (on ringleader's
    synchronous path: at once when the engine is idle, else after the work
    queued before it, so order is kept); handing it to the engine thread
    and waking the caller when it ended cost more than the collective: an
    8-byte dist.all_reduce at 2 ranks took 47-178 us that way and 15-55 us
    this way (medians of five launches in each of four runs, on a shared
    two-core VM: docs/perf/torch-path-2026-12-02.md).
    Calls torch does not wait for stay asynchronous, so DDP's buckets still
    overlap with backward."""
    return opts is not None and opts.asyncOp is False


def _merge(works: List[Optional[_RLWork]]) -> Optional[_RLWork]:
    """One ringleader Work over several (coalesced calls); None when the
    calls already ran (a blocking call)."""
    if works and works[0] is None:
        return None
    if len(works) == 1:
        return works[0]
    thens = [w._then for w in works if w._then is not None]

    def then():
        for t in thens:
            t()

    merged = _RLWork([h for w in works for h in w._handles], [w._keep for w in works], then if thens else None)
    for w in works:  # the merged work owns the handles now
        w._handles, w._then, w._done = [], None, True
    return merged


def _staged(t: torch.Tensor):
    """(buffer to operate on, copy-back or None): a contiguous stand-in for a non-contiguous tensor."""
    if t.is_contiguous():
        return t, None
    tmp = t.contiguous()
    return tmp, (lambda: t.copy_(tmp))


def _then(work: Optional[_RLWork], fn) -> Optional[_RLWork]:
    """Runs ``fn`` after ``work`` succeeds (and after any copy-back it has);
    at once when ``work`` is None, a blocking call that already ran."""
    if work is None:
        fn()
        return None
    prev = work._then

    def both():
        if prev is not None:
            prev()
        fn()

    work._then = both
    return work


class RingleaderBackend(_Base):
    """A torch ``Backend`` whose collectives run on a ringleader process group.

    Created by torch through :func:`torch.distributed.init_process_group` or
    ``new_group`` with ``backend="ringleader"``; not meant to be built by hand.

    Where the C++ lane is built (``NATIVE``), calls torch waits for at once on
    dense CPU tensors (all_reduce, broadcast, all_gather_into_tensor,
    reduce_scatter_tensor, barrier) run in C++ on the C ABI and never enter
    this class; every other call reaches the methods below.
    """

    def __init__(self, store, rank: int, size: int, timeout, global_ranks=None, group_name=None):
        super().__init__(rank, size)
        # The global rank of each of this group's ranks (split() maps through it).
        self._global_ranks = [int(r) for r in global_ranks] if global_ranks else list(range(size))
        self._timeout = timeout
        self._rl = _connect(store, rank, size, timeout, _group_args(global_ranks, group_name))
        self._futures: Optional[_Completer] = None
        self._closed = False
        if NATIVE:
            self._bind_native()
        with _lock:
            # Strong references: torch holds the C++ object only, and its
            # virtual calls find these Python methods through this object.
            _backends.add(self)

    def _bind_native(self):
        """Hands the C++ lane the communicator and the C ABI's entry points;
        the communicator unbinds it before it is destroyed, however that
        happens (shutdown, abort, exit, ``communicator(g).destroy()``)."""
        addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
        L = _lib.lib
        self._fast_bind(
            self._rl._h,
            addr(L.rl_all_reduce),
            addr(L.rl_all_gather),
            addr(L.rl_reduce_scatter),
            addr(L.rl_broadcast),
            addr(L.rl_barrier),
            addr(L.rl_send),
            addr(L.rl_recv),
            addr(L.rl_work_wait),
            addr(L.rl_work_test),
            addr(L.rl_work_free),
            _callsite.note if _callsite.ENABLED else None,
            _raise_code,
        )
        self._rl._before_destroy.append(self._fast_unbind)

    # -- identity and capabilities ------------------------------------------
    # torch reads these through Python attribute lookup; left to the C++
    # base class, the lookup recurses (torch 2.15), so each is spelled out.

    supports_coalescing = property(lambda self: False)
    supports_splitting = property(lambda self: True)
    supports_shrinking = property(lambda self: False)
    supports_reconfigure = property(lambda self: False)
    supports_window = property(lambda self: False)
    _supports_time_estimate = property(lambda self: False)

    @property
    def options(self):
        """The backend's options (torch's split_group copies them); without
        this the lookup falls through to the C++ base class and recurses."""
        opts = _CBackend.Options(BACKEND, self._timeout)
        return opts

    def split(self, store, ranks, opts):
        """``dist.split_group``: a new backend over ``ranks`` (this group's
        ranks), on the store torch namespaced for the child group."""
        ranks = [int(r) for r in ranks]
        if self.rank() not in ranks:
            return None
        timeout = getattr(opts, "_timeout", None) or self._timeout
        name = getattr(opts, "group_name", None) or None
        if name and len(name) > 12:  # torch hashes split groups' names; a prefix tells them apart
            name = name[:8]
        return RingleaderBackend(
            store,
            ranks.index(self.rank()),
            len(ranks),
            timeout,
            global_ranks=[self._global_ranks[r] for r in ranks],
            group_name=name,
        )

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND

    def name(self) -> str:
        return BACKEND

    @property
    def group(self) -> ringleader.ProcessGroup:
        """The ringleader process group behind this backend (flight_recorder(), dump())."""
        return self._rl

    def _completer(self) -> _Completer:
        with _lock:
            if self._futures is None:
                self._futures = _Completer()
            return self._futures

    def _wrap(self, work: Optional[_RLWork], result: List[torch.Tensor]) -> dist._Work:
        """torch's Work for an operation: completed already when ``work`` is
        None (a blocking call that ran in this thread), else over ``work``."""
        if work is None:
            return _done(result)
        return _TorchWork(work, result, self)

    # -- in-place collectives -------------------------------------------------
    # Each method passes ``async_op=not _blocking(opts)`` to ringleader: a
    # blocking call returns None once it has run, and _then/_merge/_wrap
    # then finish it at once.

    def _inplace(self, tensors, run, async_op: bool) -> dist._Work:
        works = []
        for t in tensors:
            buf, back = _staged(t)
            w = run(buf, async_op)
            if back is not None:
                w = _then(w, back)
            works.append(w)
        return self._wrap(_merge(works), list(tensors))

    def allreduce(self, tensors, opts=None):
        if opts is not None and opts.asyncOp is False and len(tensors) == 1:
            # The latency lane: a blocking dist.all_reduce of one dense,
            # contiguous CPU tensor goes straight to the C ABI from here
            # (what ProcessGroup.all_reduce would do, minus its generic
            # checks); anything else takes the general path below. This
            # method converts its own errors (no wrapper frame per call).
            t = tensors[0]
            code, opc, h = _CPU_CODES.get(t.dtype), _REDUCE_CODES.get(hash(opts.reduceOp)), self._rl._h
            if code is not None and opc is not None and h is not None and t.is_cpu and t.layout is _STRIDED \
                    and t.is_contiguous():
                _NOTE_SITE()
                rc = _ALL_REDUCE(h, t.data_ptr(), t.numel(), code, opc, None)
                if rc:
                    _raise_as_torch(ringleader.last_error(rc))
                w = _DoneWork()  # _done(tensors), inline
                w._result = tensors
                return w
        return self._allreduce(tensors, opts)

    allreduce._converts_errors = True

    @_raises_torch_errors
    def _allreduce(self, tensors, opts):
        """allreduce's general path: any tensors and options."""
        op = _reduce_op(opts.reduceOp) if opts is not None else "sum"
        return self._inplace(tensors, lambda b, a: self._rl.all_reduce(b, op=op, async_op=a), not _blocking(opts))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts):
        root = opts.rootRank
        return self._inplace(tensors, lambda b, a: self._rl.broadcast(b, root=root, async_op=a), not _blocking(opts))

    def reduce(self, tensors, opts):
        root, op = opts.rootRank, _reduce_op(opts.reduceOp)
        run = lambda b, a: self._rl.reduce(b, root=root, op=op, async_op=a)  # noqa: E731
        return self._inplace(tensors, run, not _blocking(opts))

    # -- gathers and scatters -------------------------------------------------

    def _gather_into(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool) -> Optional[_RLWork]:
        buf, back = _staged(out)
        w = self._rl.all_gather(buf, inp.contiguous(), async_op=async_op)
        return _then(w, back) if back is not None else w

    def all_gather_single(self, output, input, opts=None):
        return self._wrap(self._gather_into(output, input, not _blocking(opts)), [output])

    def _allgather_base(self, output, input, opts=None):
        return self.all_gather_single(output, input, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        a = not _blocking(opts)
        return self._wrap(_merge([self._gather_into(o, i, a) for o, i in zip(outputs, inputs)]), list(outputs))

    def _gather_list(self, outs: List[torch.Tensor], inp: torch.Tensor, async_op: bool) -> Optional[_RLWork]:
        flat = torch.empty((len(outs), inp.numel()), dtype=inp.dtype, device=inp.device)
        w = self._rl.all_gather(flat, inp.contiguous(), async_op=async_op)

        def scatter_back():
            for r, o in enumerate(outs):
                o.copy_(flat[r].view_as(o))

        return _then(w, scatter_back)

    def allgather(self, output_lists, inputs, opts=None):
        a = not _blocking(opts)
        works = [self._gather_list(outs, inp, a) for outs, inp in zip(output_lists, inputs)]
        return self._wrap(_merge(works), [t for outs in output_lists for t in outs])

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        return self.allgather(output_lists, inputs, opts)

    def _reduce_scatter_into(self, out, inp, op, async_op: bool) -> Optional[_RLWork]:
        buf, back = _staged(out)
        w = self._rl.reduce_scatter(buf, inp.contiguous(), op=op, async_op=async_op)
        return _then(w, back) if back is not None else w

    def reduce_scatter_single(self, output, input, opts=None):
        op = _reduce_op(opts.reduceOp) if opts is not None else "sum"
        return self._wrap(self._reduce_scatter_into(output, input, op, not _blocking(opts)), [output])

    def _reduce_scatter_base(self, output, input, opts=None):
        return self.reduce_scatter_single(output, input, opts)

    def reduce_scatter_tensor(self, output, input, opts=None):
        return self.reduce_scatter_single(output, input, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        op = _reduce_op(opts.reduceOp) if opts is not None else "sum"
        a = not _blocking(opts)
        works = [self._reduce_scatter_into(o, i, op, a) for o, i in zip(outputs, inputs)]
        return self._wrap(_merge(works), list(outputs))

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = _reduce_op(opts.reduceOp) if opts is not None else "sum"
        a = not _blocking(opts)
        works = []
        for out, ins in zip(outputs, input_lists):
            flat = torch.cat([t.reshape(-1) for t in ins])
            works.append(self._reduce_scatter_into(out, flat, op, a))
        return self._wrap(_merge(works), list(outputs))

    def alltoall(self, outputs, inputs, opts=None):
        sizes = {t.numel() for t in list(outputs) + list(inputs)}
        if len(sizes) > 1:
            raise ValueError("ringleader's all_to_all needs equal-sized tensors for every rank")
        flat_in = torch.cat([t.reshape(-1) for t in inputs])
        flat_out = torch.empty_like(flat_in)
        w = self._rl.all_to_all(flat_out, flat_in, async_op=not _blocking(opts))
        n = flat_in.numel() // max(1, len(outputs))

        def split_back():
            for r, o in enumerate(outputs):
                o.copy_(flat_out[r * n : (r + 1) * n].view_as(o))

        return self._wrap(_then(w, split_back), list(outputs))

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        world = self.size()
        for name, splits, t in (("output", output_split_sizes, output), ("input", input_split_sizes, input)):
            if splits and len(set(splits)) > 1:
                raise ValueError(f"ringleader's all_to_all needs equal {name} splits, got {list(splits)}")
            if splits and sum(splits) != t.size(0):
                raise ValueError(f"{name} splits {list(splits)} do not add up to {t.size(0)}")
        if input.numel() % world:
            raise ValueError(f"all_to_all: {input.numel()} elements do not split evenly over {world} ranks")
        buf, back = _staged(output)
        w = self._rl.all_to_all(buf, input.contiguous(), async_op=not _blocking(opts))
        return self._wrap(_then(w, back) if back is not None else w, [output])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self.all_to_all_single(output, input, output_split_sizes, input_split_sizes, opts)

    def gather(self, output_lists, inputs, opts):
        root = opts.rootRank
        inp = inputs[0]
        flat = torch.empty((self.size(), inp.numel()), dtype=inp.dtype, device=inp.device)
        w = self._rl.all_gather(flat, inp.contiguous(), async_op=not _blocking(opts))
        outs = output_lists[0] if output_lists else []

        def copy_out():
            if self.rank() == root:
                for r, o in enumerate(outs):
                    o.copy_(flat[r].view_as(o))

        return self._wrap(_then(w, copy_out), list(outs))

    def scatter(self, outputs, input_lists, opts):
        root, out = opts.rootRank, outputs[0]
        if self.rank() == root:
            flat = torch.cat([t.reshape(-1) for t in input_lists[0]])
        else:
            flat = torch.empty(self.size() * out.numel(), dtype=out.dtype, device=out.device)
        w = self._rl.broadcast(flat, root=root, async_op=not _blocking(opts))
        n, r = out.numel(), self.rank()
        return self._wrap(_then(w, lambda: out.copy_(flat[r * n : (r + 1) * n].view_as(out))), [out])

    # -- point to point and barriers -------------------------------------------
    # torch passes no asyncOp to send and recv (dist.send waits on an
    # asynchronous call), so they stay asynchronous.

    def send(self, tensors, dst_rank, tag=0):
        works = [self._rl.send(t.contiguous(), dst_rank, async_op=True) for t in tensors]
        return self._wrap(_merge(works), list(tensors))

    def recv(self, tensors, src_rank, tag=0):
        return self._inplace(tensors, lambda b, a: self._rl.recv(b, src_rank, async_op=a), True)

    def recv_anysource(self, tensors, tag=0):
        raise ValueError("ringleader does not support recv from any source; name the source rank")

    def barrier(self, opts=None):
        return self._wrap(self._rl.barrier(async_op=not _blocking(opts)), [])

    def monitored_barrier(self, opts=None, wait_all_ranks=False):
        timeout = getattr(opts, "timeout", None)
        if not isinstance(timeout, datetime.timedelta) or timeout.total_seconds() <= 0:
            timeout = None
        self._rl.monitored_barrier(timeout=timeout, wait_all_ranks=bool(wait_all_ranks))

    # -- lifetime ---------------------------------------------------------------

    def abort(self):
        try:
            self._rl.abort("torch aborted the process group")
        finally:
            self.shutdown()

    def shutdown(self):
        """Leaves the job cleanly (the others read "left"). The group's store
        runs in a process of its own, which ends once every rank has left."""
        if self._closed:
            return
        self._closed = True
        try:
            self._rl.destroy()
        finally:
            with _lock:
                _backends.discard(self)


# Every operation torch calls raises PyTorch's exception types.
for _name, _fn in list(vars(RingleaderBackend).items()):
    if callable(_fn) and not _name.startswith("_") and _name not in ("getBackendName", "name") \
            and not getattr(_fn, "_converts_errors", False):
        setattr(RingleaderBackend, _name, _raises_torch_errors(_fn))


@_raises_torch_errors
def _create(opts, backend_options=None):
    """torch's extended creator: ``opts`` carries the store, the group rank and
    size, the timeout, the group's name and its ranks' global numbers."""
    return RingleaderBackend(
        opts.store,
        opts.group_rank,
        opts.group_size,
        opts.timeout,
        global_ranks=list(getattr(opts, "global_ranks_in_group", None) or []),
        group_name=getattr(opts, "group_id", None),
    )


def communicator(group=None) -> ringleader.ProcessGroup:
    """The ringleader process group behind a torch group (default: the world),
    for ``flight_recorder()`` and ``dump()``."""
    pg = group if group is not None else dist.group.WORLD
    backend = pg._get_backend(torch.device("cpu"))
    if not isinstance(backend, RingleaderBackend):
        raise ValueError(f"the group's CPU backend is {type(backend).__name__}, not ringleader")
    return backend.group


@atexit.register
def _shutdown_live_backends():
    """Backends still alive at exit leave cleanly (peers read "left"), and store hosts linger for the others."""
    with _lock:
        live = list(_backends)
    for b in live:
        try:
            b.shutdown()
        except Exception:
            pass


def _devices() -> List[str]:
    """CUDA tensors are served too where CUDA is usable. torch then creates
    one backend (one ringleader communicator) per device type, as it does
    for "cpu:gloo,cuda:nccl"; on machines without CUDA only the CPU one."""
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=_devices())

# ringleader records every collective itself (flight_recorder(), dumps,
# verdicts). torch attaches its own flight-recorder hook to every group of a
# backend it does not know to record itself, and that hook captures a Python
# traceback and reads the thread's name (a system call) on every collective:
# 3-4 us of an 8-byte all_reduce's 8 us here. gloo and NCCL are spared it the
# same way, by being in this set (torch 2.15; absent elsewhere, then nothing
# changes).
_self_recording = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
if isinstance(_self_recording, set):
    _self_recording.add(BACKEND)
