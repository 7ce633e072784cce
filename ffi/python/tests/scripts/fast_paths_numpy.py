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
