"""Helpers of fast_paths_numpy.py and fast_paths_torch.py."""

import os
import sys


def line():
    """The caller's line number (``n = line(); pg.all_reduce(x)``: the call's line)."""
    return sys._getframe(1).f_lineno


def site_is(rec, lineno, func):
    """The flight record ``rec`` names the caller's line ``lineno`` in ``func`` (of the calling script)."""
    script = os.path.basename(sys._getframe(1).f_code.co_filename)
    want = f"{script}:{lineno} in {func}"
    assert rec["call_site"].endswith(want), (rec["call_site"], want)


def expected(op, values, minimum, maximum):
    """What reducing ``values`` (one array per rank) with ``op`` gives
    (``minimum``/``maximum``: numpy's or torch's elementwise functions)."""
    out = values[0]
    for v in values[1:]:
        if op == "sum":
            out = out + v
        elif op == "prod":
            out = out * v
        elif op == "min":
            out = minimum(out, v)
        elif op == "max":
            out = maximum(out, v)
        else:
            raise AssertionError(op)
    return out
