"""A tiny registry for per-rank checks: every rank runs every check in the
same order and prints "PASS name" or "FAIL name: why"; the pytest side
collects the lines (conftest.parse_checks) and turns each check into a test."""

import sys
import traceback

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def run_all(*args):
    failed = 0
    for fn in CHECKS:
        try:
            fn(*args)
            print(f"PASS {fn.__name__}", flush=True)
        except Exception as e:  # report and go on: the next checks still tell something
            failed += 1
            why = f"{type(e).__name__}: {e}".replace("\n", " | ")
            print(f"FAIL {fn.__name__}: {why}", flush=True)
            traceback.print_exc(file=sys.stdout)
    return failed


def names():
    return [fn.__name__ for fn in CHECKS]


def expect(exc, fn, *words):
    """``fn()`` raises ``exc`` whose message has every one of ``words``; the exception."""
    try:
        fn()
    except exc as e:
        for w in words:
            assert w in str(e), f"{w!r} not in {e!r}"
        return e
    raise AssertionError(f"no {exc.__name__}")
