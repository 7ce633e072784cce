"""Where the user's code made a call, for the flight recorder and verdicts.

Before each operation the binding finds the first frame outside ringleader
and torch (the user's line that called ``all_reduce``, directly or through
``torch.distributed``) and hands it to the library as the thread's call site
(``rl_set_call_site``), so that a verdict says ``all_reduce #2 called at
train.py:24 in step``.

Cheap by construction: whether a code object belongs to ringleader or torch
is decided once per code object, the tag text once per code location (keyed
by the frame's instruction offset, which unlike its line number costs
nothing to read), and the library is told only when a thread's call site
changes. What is left per call is a few frame hops and dictionary lookups.

``RINGLEADER_CALL_SITES=0`` turns it off (for measuring what it costs).
"""

import os
import sys
import threading

from . import _lib

_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Keyed by id(code), not by the code object: hashing a code object hashes
# its contents every time (hundreds of ns); the ids stay valid because
# _pinned keeps every code object seen alive.
_internal = {}  # id(code) -> whether it belongs to ringleader or torch
_pinned = []
_tags = {}  # (id(code), instruction offset) -> the tag, as bytes
_last = {}  # thread id -> the tag last handed to the library on that thread
_ident = threading.get_ident
_set = _lib.lib.rl_set_call_site
_getframe = sys._getframe
_torch_dir = None
ENABLED = os.environ.get("RINGLEADER_CALL_SITES", "1") != "0"


def _torch_prefix():
    global _torch_dir
    if _torch_dir is None:
        t = sys.modules.get("torch")
        f = getattr(t, "__file__", None)
        if f is None:
            return None
        _torch_dir = os.path.dirname(os.path.abspath(f)) + os.sep
    return _torch_dir


def _is_internal(code) -> bool:
    v = _internal.get(id(code))
    if v is None:
        path = os.path.abspath(code.co_filename)
        torch = _torch_prefix()
        v = path.startswith(_HERE) or (torch is not None and path.startswith(torch))
        _pinned.append(code)
        _internal[id(code)] = v
    return v


def _tag(frame) -> bytes:
    code = frame.f_code
    key = (id(code), frame.f_lasti)
    t = _tags.get(key)
    if t is None:
        line = frame.f_lineno
        path = code.co_filename
        try:
            rel = os.path.relpath(path)
            if not rel.startswith(".."):
                path = rel
        except ValueError:
            pass
        t = f"{path}:{line} in {code.co_name}".encode("utf-8", "replace")
        _tags[key] = t
    return t


def note() -> None:
    """Sets this thread's call site to the caller's first frame outside
    ringleader and torch (nothing when there is none)."""
    if not ENABLED:
        return
    f = _getframe(1)
    internal = _internal
    while f is not None:
        v = internal.get(id(f.f_code))
        if v is None:
            v = _is_internal(f.f_code)
        if not v:
            break
        f = f.f_back
    if f is None:
        return
    t = _tags.get((id(f.f_code), f.f_lasti)) or _tag(f)
    me = _ident()
    if _last.get(me) is not t:
        _last[me] = t
        _set(t)
