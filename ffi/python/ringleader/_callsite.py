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
changes. What is left per call is a few frame hops and dictionary lookups:
one table, keyed by the code object's id, holds ``True`` for ringleader's and
torch's code and, for any other code, that code's own table of tags by
instruction offset, so that a user frame costs two lookups by int and no key
is built; the tag last told on this thread is a thread-local attribute.

Where the package's C lane loaded (``ringleader._native``), the same walk
runs in C over the same tables (calling :func:`_classify` and :func:`_tag`
for what it has not seen) and :func:`note` and :func:`note_caller` are its
``note``: one walk, and one record per thread of the tag last told, for
every caller (the numpy lane, the Python paths, the torch backend).

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
_codes = {}  # id(code) -> True (ringleader's or torch's code), or {instruction offset: tag as bytes}
_pinned = []
# .tag: the tag last handed to the library on this thread. A thread-local,
# not a dict keyed by thread id: ids are reused once a thread ends, and a
# new thread (whose call site the library does not know yet) must not be
# taken for the old one.
_local = threading.local()
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


def _classify(code):
    """``True`` when ``code`` belongs to ringleader or torch, else its (new) tag table."""
    v = _codes.get(id(code))
    if v is None:
        path = os.path.abspath(code.co_filename)
        torch = _torch_prefix()
        internal = path.startswith(_HERE) or (torch is not None and path.startswith(torch))
        v = True if internal else {}
        _pinned.append(code)
        _codes[id(code)] = v
    return v


def _is_internal(code) -> bool:
    return _classify(code) is True


def _tag(frame, tags, at=None) -> bytes:
    """The tag of ``frame``'s location, kept in ``tags`` under ``at`` (by
    default the frame's instruction offset; the C walk passes its own)."""
    code = frame.f_code
    line = frame.f_lineno
    path = code.co_filename
    try:
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            path = rel
    except ValueError:
        pass
    t = f"{path}:{line} in {code.co_name}".encode("utf-8", "replace")
    tags[frame.f_lasti if at is None else at] = t
    return t


def _walker(depth: int):
    """The call-site capture, starting ``depth`` frames up (one body for
    :func:`note` and :func:`note_caller`; a closure, not a parameter, so
    that neither pays an argument or a wrapper per call)."""

    def walk() -> None:
        if not ENABLED:
            return
        f = _getframe(depth)
        codes = _codes
        while f is not None:
            v = codes.get(id(f.f_code))
            if v is None:
                v = _classify(f.f_code)
            if v is not True:
                t = v.get(f.f_lasti) or _tag(f, v)
                try:
                    if _local.tag is t:
                        return
                except AttributeError:  # this thread's first call
                    pass
                _local.tag = t
                _set(t)
                return
            f = f.f_back

    return walk


note = _walker(1)
note.__doc__ = """Sets this thread's call site to the caller's first frame outside
ringleader and torch (nothing when there is none)."""

note_caller = _walker(2)
note_caller.__doc__ = """:func:`note` for ringleader's own functions, whose frame is
ringleader's by construction: the walk starts at their caller's frame, one
hop fewer."""

if _lib.native is not None and ENABLED:
    _lib.native.bind_sites(_codes, _classify, _tag, True)
    note = note_caller = _lib.native.note
