"""Python stacks of every thread for the verdict of a failed job.

When a job fails, every live rank tells the job where it is, and the
verdict shows a culprit's own line (``rank 2 is at train.py:45 in
load_batch: time.sleep(40)``). For that, :func:`arm` (called once by
``ringleader.init``, which the PyTorch backend goes through too) arms
:mod:`faulthandler` on a real-time signal with a private file and registers
both with the library (``rl_set_stack_dump``). On a failure the library
raises the signal on its own thread; faulthandler's handler writes every
thread's stack without taking the GIL, so a thread that holds the GIL in
native code (a ``ctypes.PyDLL`` call, a C extension) does not stop it.

``RINGLEADER_STACK_SIGNAL``: the signal number (default ``SIGRTMIN+6``);
``0`` turns it off. Native stacks have their own,
``RINGLEADER_NATIVE_STACK_SIGNAL`` (default ``SIGRTMIN+7``), read by the
library.

The file is never a path another user could redirect: a memfd where the
system has them, else a file created with ``O_EXCL`` and mode 0600 in a
fresh private (0700) folder, unlinked at once; only the descriptor lives on.
"""

import faulthandler
import os
import signal
import sys
import sysconfig
import threading

from . import _lib

_armed = False
_fd = -1  # kept open for the life of the process: faulthandler writes to it


def _signal_number() -> int:
    raw = os.environ.get("RINGLEADER_STACK_SIGNAL")
    if raw is None or raw.strip() == "":
        return int(signal.SIGRTMIN) + 6
    try:
        n = int(raw.strip())
    except ValueError:
        raise ValueError(f"RINGLEADER_STACK_SIGNAL: {raw!r} is not a signal number (0 turns stacks off)") from None
    if n != 0 and not int(signal.SIGRTMIN) <= n <= int(signal.SIGRTMAX):
        raise ValueError(
            f"RINGLEADER_STACK_SIGNAL: {n} is not a real-time signal "
            f"({int(signal.SIGRTMIN)}-{int(signal.SIGRTMAX)}; 0 turns stacks off)"
        )
    return n


def _private_file() -> int:
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None:
        try:
            return memfd("ringleader-stacks", os.MFD_CLOEXEC)
        except OSError:
            pass
    import tempfile

    folder = tempfile.mkdtemp(prefix="ringleader-stacks-")  # mode 0700, a fresh name
    path = os.path.join(folder, "stacks")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.unlink(path)
    finally:
        os.rmdir(folder)
    return fd


def _internal_prefixes():
    """Where code that is not the user's lives: this package, torch (when
    loaded), the standard library."""
    dirs = [os.path.dirname(os.path.abspath(__file__))]
    torch = sys.modules.get("torch")
    if getattr(torch, "__file__", None):
        dirs.append(os.path.dirname(os.path.abspath(torch.__file__)))
    for key in ("stdlib", "platstdlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            dirs.append(os.path.abspath(p))
    dirs.append(os.path.dirname(os.path.abspath(threading.__file__)))
    return sorted({d.rstrip(os.sep) + os.sep for d in dirs})


def arm() -> None:
    """Arms faulthandler and registers it with the library, once per
    process; a program that handles the chosen signal itself keeps it."""
    global _armed, _fd
    if _armed:
        return
    _armed = True
    signum = _signal_number()
    if signum == 0 or sys.platform != "linux":
        return
    if signal.getsignal(signum) not in (signal.SIG_DFL, None):
        return
    _fd = _private_file()
    # chain=False: the previous action of a fresh real-time signal is the
    # default one, which ends the process; chaining would call it.
    faulthandler.register(signum, file=_fd, all_threads=True, chain=False)
    prefixes = "\n".join(_internal_prefixes()).encode("utf-8", "replace")
    _lib.lib.rl_set_stack_dump(_fd, signum, threading.main_thread().ident or 0, prefixes)
