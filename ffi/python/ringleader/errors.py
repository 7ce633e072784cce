"""The error classes: one per error kind of docs/DESIGN.md §1.

Every error ringleader raises is a :class:`Error`, itself a ``RuntimeError``
(so code written for PyTorch's backends, which raise ``RuntimeError``,
catches it too). Each carries the structured fields of the verdict:

- ``kind``: the stable kind name (``"missed-collective"``, ``"peer-died"``, ...)
- ``ranks``: the ranks it names (culprits, missing or conflicting ranks)
- ``seq``: the sequence number of the collective concerned, or ``None``
- ``op``: the operation concerned (``"all_reduce"``, ...), or ``None``

and its message is the verdict text (``[missed-collective] rank 1 ...``).
"""

import ctypes
from typing import List, Optional

from . import _lib


class Error(RuntimeError):
    """A ringleader failure; ``str(e)`` is the verdict text."""

    __module__ = "ringleader"

    kind = "unknown"

    def __init__(self, message: str, kind: Optional[str] = None, ranks=(), seq=None, op=None):
        super().__init__(message)
        if kind is not None:
            self.kind = kind
        self.ranks: List[int] = list(ranks)
        self.seq: Optional[int] = seq
        self.op: Optional[str] = op

    def __reduce__(self):
        return (type(self), (str(self), self.kind, self.ranks, self.seq, self.op))


def _kind(name: str, doc: str, *bases):
    cls_name = "".join(p.capitalize() for p in name.split("-")) + "Error"
    return type(cls_name, (Error, *bases), {"kind": name, "__doc__": doc, "__module__": "ringleader"})


MissedCollectiveError = _kind("missed-collective", "A rank did not enter a collective the others are in.")
MismatchError = _kind("mismatch", "Ranks called a collective with different op, dtype, count, root or reduce op.")
PeerDiedError = _kind("peer-died", "A rank's process ended without leaving the job (killed, crashed).")
PeerStalledError = _kind("peer-stalled", "A rank is alive but makes no progress.")
StragglerError = _kind("straggler", "A rank is slow (a warning kind; calls do not raise it).")
TimeoutError = _kind("timeout", "A wait ran out and nothing better is known.")  # noqa: A001 (ringleader.TimeoutError)
RendezvousIncompleteError = _kind("rendezvous-incomplete", "Not every rank joined before the init timeout.")
WorldSizeMismatchError = _kind("world-size-mismatch", "Ranks were launched with different world sizes.")
DuplicateRankError = _kind("duplicate-rank", "Two processes claim the same rank.")
VersionMismatchError = _kind("version-mismatch", "Ranks run different ringleader versions.")
StoreUnreachableError = _kind("store-unreachable", "The store cannot be reached.")
PortInUseError = _kind("port-in-use", "The port to listen on is taken.")
DataPortUnreachableError = _kind("data-port-unreachable", "The store is reachable but a data port is not.")
ForeignRunError = _kind("foreign-run", "A peer or the store belongs to another run.")
AuthFailedError = _kind("auth-failed", "A peer failed the shared-secret check (RINGLEADER_TOKEN).")
AbortedError = _kind("aborted", "The communicator was aborted (by abort(), Ctrl-C, or an earlier failure).")
InvalidArgumentError = _kind("invalid-argument", "The caller passed something unusable.", ValueError)
InternalError = _kind(
    "internal", "A bug in ringleader: a panic (in the engine, a transport, or at the C boundary), caught and named."
)

# C error code -> class (codes are ErrorKind::code: 1..=18 in docs/DESIGN.md §1 order; -1 is internal's
# code in earlier builds).
BY_CODE = {
    1: MissedCollectiveError,
    2: MismatchError,
    3: PeerDiedError,
    4: PeerStalledError,
    5: StragglerError,
    6: TimeoutError,
    7: RendezvousIncompleteError,
    8: WorldSizeMismatchError,
    9: DuplicateRankError,
    10: VersionMismatchError,
    11: StoreUnreachableError,
    12: PortInUseError,
    13: DataPortUnreachableError,
    14: ForeignRunError,
    15: AuthFailedError,
    16: AbortedError,
    17: InvalidArgumentError,
    18: InternalError,
    -1: InternalError,
}
BY_KIND = {cls.kind: cls for cls in BY_CODE.values()}


def last_error(code: int) -> Error:
    """Builds the exception for a failed call from the thread's last error."""
    lib = _lib.lib
    msg = (lib.rl_last_error_message() or b"").decode("utf-8", "replace")
    n = lib.rl_last_error_ranks(None, 0)
    ranks: List[int] = []
    if n:
        arr = (ctypes.c_int64 * n)()
        lib.rl_last_error_ranks(arr, n)
        ranks = list(arr)
    seq = lib.rl_last_error_seq()
    op = lib.rl_last_error_op()
    cls = BY_CODE.get(code, Error)
    kind = (lib.rl_error_kind_name(code) or b"unknown").decode()
    return cls(
        msg or f"[{kind}] (no message)",
        kind=kind,
        ranks=ranks,
        seq=None if seq < 0 else seq,
        op=None if op < 0 else lib.rl_op_name(op).decode(),
    )
