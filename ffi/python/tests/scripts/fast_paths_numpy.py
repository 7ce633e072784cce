"""The numpy API's latency lane (ProcessGroup's blocking calls on plain
numpy arrays, word-typed ctypes prototypes, the call site taken from the
caller's frame) against the general path: same results, same records
(fingerprint, call site), same errors. Every rank runs every check."""

import os
import sys
import threading

import numpy as np

import ringleader
from _checks import check, expect, run_all
from _fast_common import expected, line, site_is

pg = None
R = N = 0
DTYPES = {np.float32: "f32", np.float64: "f64", np.float16: "f16", np.int8: "i8", np.uint8: "u8",
          np.int32: "i32", np.int64: "i64"}


def last():
    return pg.flight_recorder()[-1]


@check
def lane_and_general_path_agree_for_every_dtype_and_op():
    for dt, name in DTYPES.items():
        for op in ("sum", "prod", "min", "max"):
            vals = [np.arange(5, dtype=dt) % 3 + dt(r + 1) for r in range(N)]
            want = expected(op, vals, np.minimum, np.maximum).astype(dt)
            x = vals[R].copy()
            assert pg.all_reduce(x, op=op) is None  # the lane
            assert np.array_equal(x, want), (dt, op, x, want)
            fp = last()["fingerprint"]
            assert (fp["dtype"], fp["count"], fp["reduce_op"]) == (name, 5, op), fp
            y = vals[R].copy()
            pg.all_reduce(y, op=op, async_op=True).wait()  # the general path
            assert np.array_equal(y, want), (dt, op, y, want)
    x = np.full(3, R + 1.0, dtype=np.float64)
    pg.all_reduce(x, op="avg")
    assert np.allclose(x, (N + 1) / 2), x


@check
def lane_boundaries_take_the_general_path():
    b = np.array([R == 0, True, False])
    pg.all_reduce(b, op="max")  # bool is not the lane's
    assert b.tolist() == [True, True, False], b
    expect(TypeError, lambda: pg.all_reduce(np.array([True])), "bool", "op='min'")
    x = np.ones(4, dtype=np.float32)
    pg.all_reduce(x, op="MAX")  # not a name in the lane's table: the general path lowers it
    assert np.array_equal(x, np.ones(4)), x
    pg.all_reduce(x, async_op=0)  # falsy: blocking
    assert np.array_equal(x, np.full(4, float(N))), x

    class Sub(np.ndarray):
        pass

    s = np.ones(3, dtype=np.float32).view(Sub)
    pg.all_reduce(s)
    assert np.array_equal(s, np.full(3, float(N))), s
    expect(ValueError, lambda: pg.all_reduce(np.zeros((4, 4), np.float32)[:, 1]), "buf", "contiguous")
    ro = np.zeros(3, dtype=np.float32)
    ro.flags.writeable = False
    expect(ValueError, lambda: pg.all_reduce(ro), "buf", "read-only")
    expect(ValueError, lambda: pg.all_reduce(np.zeros(2, np.float32), op=None), "op", "None")
    expect(ValueError, lambda: pg.all_reduce(np.zeros(2, np.float32), op="mean"), "op", "mean")
    expect(TypeError, lambda: pg.all_reduce(np.zeros(2, ">f4")), "buf", "dtype")
    expect(TypeError, lambda: pg.all_reduce(None), "buf", "NoneType")
    expect(TypeError, lambda: pg.broadcast(np.zeros(2, np.float32), root=True), "root")
    expect(TypeError, lambda: pg.send(np.zeros(2, np.float32), dst=1.0), "dst")
    expect(TypeError, lambda: pg.all_gather(np.zeros(2 * N, np.float32), np.zeros(2, np.float64)), "dtype")


@check
def integer_arguments_arrive_whole():
    # Passed as machine words (ringleader._lib.hot): the library sees the
    # values themselves, as its messages show.
    for root in range(N):
        x = np.full(3, float(R), dtype=np.float32)
        pg.broadcast(x, root)
        assert np.array_equal(x, np.full(3, float(root))), (root, x)
        y = np.full(2, R + 1, dtype=np.int32)
        pg.reduce(y, root, op="max")
        if R == root:
            assert np.array_equal(y, np.full(2, N)), (root, y)
    x = np.zeros(2, np.float32)
    expect(ringleader.InvalidArgumentError, lambda: pg.broadcast(x, root=2 ** 40), str(2 ** 40))
    expect(ringleader.InvalidArgumentError, lambda: pg.broadcast(x, root=-1), "-1")
    expect(ringleader.InvalidArgumentError, lambda: pg.reduce(x, root=N + 3), str(N + 3))
    expect(ringleader.InvalidArgumentError, lambda: pg.send(x, 2 ** 33), str(2 ** 33))
    big = np.ones(70000, dtype=np.int64)
    pg.all_reduce(big)
    assert last()["fingerprint"]["count"] == 70000 and (big == N).all(), last()
    out = np.zeros(N * 3, np.float32)
    pg.all_gather(out, np.full(3, R + 1.0, np.float32))
    assert np.array_equal(out, np.repeat(np.arange(1, N + 1, dtype=np.float32), 3)), out
    inp = np.arange(N * 2, dtype=np.float64) + R
    seg = np.zeros(2, np.float64)
    pg.reduce_scatter(seg, inp, op="sum")
    want = np.arange(N * 2, dtype=np.float64)[R * 2:(R + 1) * 2] * N + sum(range(N))
    assert np.array_equal(seg, want), (seg, want)


@check
def the_c_lane_is_in_use_unless_turned_off():
    # Built by `pip install` wherever a C compiler is (setup.py); the tests
    # run where one is, so a package without it is a broken build here.
    # test_fast_paths.py runs this script a second time with
    # RINGLEADER_NATIVE=0, for the ctypes paths.
    from ringleader import _callsite, _native

    if os.environ.get("RINGLEADER_NATIVE") == "0":
        assert not ringleader.NATIVE_LANE and ringleader.NATIVE_LANE_MISSING == "RINGLEADER_NATIVE=0"
        assert _callsite.note is not _native.note, _callsite.note
        return
    assert ringleader.NATIVE_LANE, ringleader.NATIVE_LANE_MISSING
    assert _callsite.note is _native.note and _callsite.note_caller is _native.note, _callsite.note
    if sys.version_info[:2] == (3, 11):
        assert _native.quick_walk() == (True, True), _native.quick_walk()


@check
def the_c_lane_takes_plain_arrays_and_leaves_the_rest():
    from ringleader import _native

    h = pg._h
    if not ringleader.NATIVE_LANE:  # RINGLEADER_NATIVE=0: imported, never bound, it takes nothing
        assert _native.barrier(h) == -1 and _native.all_reduce(h, np.ones(2, np.float32), 0) == -1
        return
    x = np.full(3, R + 1.0, dtype=np.float32)
    assert _native.all_reduce(h, x, 0) == 0 and np.array_equal(x, np.full(3, N * (N + 1) / 2)), x
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False

    class Sub(np.ndarray):
        pass

    refused = {
        "strided": np.zeros((4, 4), np.float32)[:, 1],
        "read-only": ro,
        "bool": np.zeros(3, bool),
        "byte-swapped": np.zeros(3, ">f4"),
        "subclass": np.zeros(3, np.float32).view(Sub),
        "list": [1.0, 2.0],
        "memoryview": memoryview(bytearray(8)),
    }
    for what, buf in refused.items():
        assert _native.all_reduce(h, buf, 0) == -1, what
        assert _native.broadcast(h, buf, 0) == -1, what
    y = np.zeros(2, np.float32)
    assert _native.all_reduce(None, y, 0) == -1  # a destroyed group
    assert _native.broadcast(h, y, True) == -1 and _native.broadcast(h, y, 2 ** 70) == -1
    assert _native.all_reduce(h, y, "sum") == -1
    out = np.zeros(2 * N, np.float32)
    assert _native.all_gather(h, out, np.zeros(2, np.float64)) == -1  # dtypes differ
    assert _native.all_gather(h, ro, y) == -1 and _native.reduce_scatter(h, y, out[::2], 0) == -1
    # The library's own refusal comes back as its code, for the method to raise.
    rc = _native.all_gather(h, np.zeros(2 * N + 1, np.float32), y)
    assert rc > 0 and isinstance(ringleader.last_error(rc), ringleader.InvalidArgumentError), rc
    expect(ringleader.InvalidArgumentError, lambda: pg.all_gather(np.zeros(2 * N + 1, np.float32), y), "out")
    expect(TypeError, lambda: _native.all_reduce(h, y), "3 arguments")


@check
def every_lane_op_agrees_with_the_general_path():
    for dt in DTYPES:
        inp = (np.arange(3 * N, dtype=dt) % 5 + dt(R)).astype(dt)
        a, b = np.zeros(3 * N, dt), np.zeros(3 * N, dt)
        pg.all_gather(a, inp[:3])
        pg.all_gather(b, inp[:3], async_op=True).wait()
        assert np.array_equal(a, b) and np.array_equal(a[3 * R:3 * R + 3], inp[:3]), (dt, a, b)
        a, b = np.zeros(3, dt), np.zeros(3, dt)
        pg.reduce_scatter(a, inp, op="max")
        pg.reduce_scatter(b, inp, op="max", async_op=True).wait()
        assert np.array_equal(a, b), (dt, a, b)
        for root in range(N):
            a, b = inp.copy(), inp.copy()
            pg.broadcast(a, root)
            pg.broadcast(b, root, async_op=True).wait()
            want = (np.arange(3 * N, dtype=dt) % 5 + dt(root)).astype(dt)
            assert np.array_equal(a, want) and np.array_equal(b, want), (dt, root, a, b)


def two_sites(x):
    got = []
    for _ in range(3):
        got.append(line()); pg.all_reduce(x)  # noqa: E702
        got.append((last(), "two_sites"))
        got.append(line()); pg.barrier()  # noqa: E702
        got.append((last(), "two_sites"))
    return got


def from_a_generator(x):
    for _ in range(2):
        lineno = line(); pg.broadcast(x, 0)  # noqa: E702
        yield lineno, last()


@check
def the_site_follows_every_change_of_line_function_and_frame():
    # The quick check answers "the same place as last time" only: a new
    # line, another function, a generator's frame or the same line after
    # another's must each be told.
    x = np.ones(2, dtype=np.float32)
    got = two_sites(x)
    for lineno, (rec, func) in zip(got[::2], got[1::2]):
        site_is(rec, lineno, func)
    for lineno, rec in from_a_generator(x):
        site_is(rec, lineno, "from_a_generator")
    for _ in range(2):
        mine = line(); pg.all_reduce(x)  # noqa: E702
        site_is(last(), mine, "the_site_follows_every_change_of_line_function_and_frame")
        two_sites(x)
    site_is((lambda: (pg.all_gather(np.zeros(2 * N, np.float32), x), last())[1])(), line(), "<lambda>")


def every_op():
    """Each op once, each on its own line; their lines."""
    x = np.ones(2 * N, dtype=np.float32)
    y = np.ones(2, dtype=np.float32)
    out = np.zeros(2 * N, dtype=np.float32)
    got = []
    got.append(("all_reduce", line())); pg.all_reduce(y)  # noqa: E702
    got.append(("barrier", line())); pg.barrier()  # noqa: E702
    got.append(("broadcast", line())); pg.broadcast(y, 0)  # noqa: E702
    got.append(("reduce", line())); pg.reduce(y, 0)  # noqa: E702
    got.append(("all_gather", line())); pg.all_gather(out, y)  # noqa: E702
    got.append(("reduce_scatter", line())); pg.reduce_scatter(y, x)  # noqa: E702
    got.append(("all_to_all", line())); pg.all_to_all(out, x)  # noqa: E702
    got.append(("all_reduce", line())); w = pg.all_reduce(y, async_op=True)  # noqa: E702
    w.wait()
    got.append(("barrier", line())); pg.barrier(async_op=True).wait()  # noqa: E702
    return got


@check
def every_op_records_the_callers_line():
    lines = every_op()
    fr = pg.flight_recorder()[-len(lines):]
    for (op, lineno), rec in zip(lines, fr):
        assert rec["profiling_name"] == "ringleader:" + op, (op, rec)
        site_is(rec, lineno, "every_op")


@check
def call_sites_are_per_thread():
    x = np.ones(2, dtype=np.float32)
    seen = {}

    def other():
        seen["line"] = line(); pg.all_reduce(x)  # noqa: E702

    for _ in range(2):
        mine = line(); pg.all_reduce(x)  # noqa: E702
        site_is(last(), mine, "call_sites_are_per_thread")
        t = threading.Thread(target=other)
        t.start()
        t.join()
        site_is(last(), seen["line"], "other")
    # The main thread's site is still its own (the library keeps one per thread).
    mine = line(); pg.all_reduce(x)  # noqa: E702
    site_is(last(), mine, "call_sites_are_per_thread")


@check
def call_sites_survive_thread_id_reuse():
    # A thread that starts after another ended often gets its id; the new
    # thread's site must still be told to the library (it knows none yet).
    x = np.ones(2, dtype=np.float32)
    seen = []

    def worker():
        seen.append((threading.get_ident(), line())); pg.all_reduce(x)  # noqa: E702
        seen[-1] += (last(),)

    for _ in range(4):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    for ident, lineno, rec in seen:
        assert rec.get("call_site"), (ident, rec)
        site_is(rec, lineno, "worker")


def main():
    global pg, R, N
    pg = ringleader.init(timeout=30)
    R, N = pg.rank, pg.world_size
    failed = run_all()
    pg.barrier()
    pg.destroy()
    try:
        pg.all_reduce(np.ones(2, dtype=np.float32))
        why = "no error"
    except ringleader.AbortedError as e:
        why = "" if "destroyed" in str(e) else str(e)
    print(f"FAIL destroyed_group_refuses_the_lane: {why}" if why else "PASS destroyed_group_refuses_the_lane",
          flush=True)
    return failed + bool(why)


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
