"""The numpy (and plain-tensor) API of ringleader, checked on every rank."""

import datetime
import json
import os
import sys
import tempfile
import threading
import time

import numpy as np

import ringleader
from _checks import check, expect, run_all

pg = None
R = N = 0
DTYPES = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64]


def eq(a, b, what=""):
    assert np.array_equal(np.asarray(a), np.asarray(b)), f"{what}: {a} != {b}"


@check
def identity():
    assert (pg.rank, pg.world_size) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    assert pg.timeout > 0
    assert ringleader.version() == ringleader.__version__


@check
def all_reduce_every_op_and_dtype():
    for dt in DTYPES:
        x = np.full(5, R + 1, dtype=dt)
        pg.all_reduce(x)
        eq(x, np.full(5, N * (N + 1) // 2, dtype=dt), f"sum {dt}")
        for op, want in (("min", 1), ("max", N), ("prod", np.prod(np.arange(1, N + 1)))):
            x = np.full(3, R + 1, dtype=dt)
            pg.all_reduce(x, op=op)
            eq(x, np.full(3, want, dtype=dt), f"{op} {dt}")
    x = np.full(4, 2.0 * (R + 1), dtype=np.float64)
    pg.all_reduce(x, op="avg")
    eq(x, np.full(4, N + 1.0), "avg")
    x = np.full(4, R + 1, dtype=np.float32)
    pg.all_reduce(x, op="SUM")  # names are case-insensitive
    eq(x, np.full(4, N * (N + 1) // 2, dtype=np.float32), "SUM")


@check
def all_reduce_bool_min_max():
    x = np.array([True, R == 0, False])
    pg.all_reduce(x, op="max")
    eq(x, [True, True, False])
    x = np.array([True, R == 0, False])
    pg.all_reduce(x, op="min")
    eq(x, [True, N == 1, False])
    try:
        pg.all_reduce(np.array([True]), op="sum")
        raise AssertionError("bool sum accepted")
    except TypeError as e:
        assert "min" in str(e)


@check
def all_reduce_large_and_multidimensional():
    x = np.full((64, 1024), float(R), dtype=np.float32)  # 256 KiB
    pg.all_reduce(x)
    eq(x, np.full((64, 1024), float(sum(range(N))), dtype=np.float32))


@check
def all_reduce_async_wait_and_is_completed():
    x = np.full(1000, 1.0, dtype=np.float32)
    w = pg.all_reduce(x, async_op=True)
    assert isinstance(w, ringleader.Work)
    w.wait(timeout=datetime.timedelta(seconds=30))
    assert w.is_completed() and w.is_success() and w.exception() is None
    eq(x, np.full(1000, float(N), dtype=np.float32))
    works = [pg.all_reduce(np.full(8, float(i), dtype=np.float64), async_op=True) for i in range(10)]
    for w in works:
        w.wait(5.0)
    assert all(w.is_completed() for w in works)


@check
def async_keeps_buffers_alive():
    w = pg.all_reduce(np.ones(1 << 16, dtype=np.float32), async_op=True)  # no reference kept by the caller
    w.wait()


@check
def work_wait_timeout_leaves_the_call_running():
    # Rank 0 waits briefly for a receive whose send comes a second later: its
    # wait times out (ringleader.TimeoutError) while the call goes on.
    if N < 2:
        return
    if R == 0:
        got = np.zeros(3, dtype=np.float32)
        w = pg.recv(got, 1, async_op=True)
        try:
            w.wait(timeout=0.2)
            raise AssertionError("the wait did not time out")
        except ringleader.TimeoutError as e:
            assert e.kind == "timeout" and "recv" in str(e), e
        assert not w.is_completed()
        w.wait(timeout=20)
        eq(got, [5, 5, 5])
    elif R == 1:
        time.sleep(1.0)
        pg.send(np.full(3, 5, dtype=np.float32), 0)


@check
def reduce_scatter():
    for dt in (np.float32, np.int64):
        inp = np.arange(N * 3, dtype=dt) + R
        out = np.zeros(3, dtype=dt)
        pg.reduce_scatter(out, inp)
        want = N * (np.arange(N * 3, dtype=dt)[R * 3 : R * 3 + 3]) + sum(range(N))
        eq(out, want, str(dt))
    out = np.zeros(2, dtype=np.float32)
    pg.reduce_scatter(out, np.full(2 * N, float(R + 1), dtype=np.float32), op="max", async_op=True).wait()
    eq(out, [N, N])


@check
def all_gather():
    for dt in DTYPES:
        inp = np.full(3, R, dtype=dt)
        out = np.zeros(3 * N, dtype=dt)
        pg.all_gather(out, inp)
        eq(out, np.repeat(np.arange(N, dtype=dt), 3), str(dt))
    out = np.zeros((N, 2), dtype=np.float32)
    pg.all_gather(out, np.array([R, -R], dtype=np.float32), async_op=True).wait()
    eq(out[:, 0], np.arange(N))


@check
def broadcast():
    root = N - 1
    x = np.full(7, R, dtype=np.int32)
    pg.broadcast(x, root=root)
    eq(x, np.full(7, root, dtype=np.int32))
    x = np.full(7, float(R), dtype=np.float64)
    pg.broadcast(x, root=0, async_op=True).wait()
    eq(x, np.zeros(7))


@check
def reduce():
    for root in (0, N - 1):
        x = np.full(4, R + 1, dtype=np.int64)
        pg.reduce(x, root=root)
        eq(x, np.full(4, N * (N + 1) // 2 if R == root else R + 1), f"root {root}")


@check
def all_to_all():
    inp = np.array([100 * R + j for j in range(N) for _ in range(2)], dtype=np.int32)
    out = np.zeros_like(inp)
    pg.all_to_all(out, inp)
    eq(out, np.array([100 * j + R for j in range(N) for _ in range(2)], dtype=np.int32))


@check
def send_recv_ring():
    if N < 2:
        return
    nxt, prv = (R + 1) % N, (R - 1) % N
    got = np.zeros(5, dtype=np.float32)
    if R % 2 == 0:
        pg.send(np.full(5, float(R), dtype=np.float32), nxt)
        pg.recv(got, prv)
    else:
        pg.recv(got, prv)
        pg.send(np.full(5, float(R), dtype=np.float32), nxt)
    eq(got, np.full(5, float(prv), dtype=np.float32))
    w = pg.send(np.full(2, 7, dtype=np.int64), nxt, async_op=True)
    got2 = np.zeros(2, dtype=np.int64)
    pg.recv(got2, prv, async_op=True).wait()
    w.wait()
    eq(got2, [7, 7])


@check
def barriers():
    pg.barrier()
    pg.barrier(async_op=True).wait()
    pg.monitored_barrier(timeout=10)
    pg.monitored_barrier(timeout=datetime.timedelta(seconds=10), wait_all_ranks=True)


@check
def torch_tensors_through_the_core_api():
    try:
        import torch
    except ImportError:
        return
    t = torch.full((3, 2), float(R + 1))
    pg.all_reduce(t)
    assert torch.equal(t, torch.full((3, 2), float(N * (N + 1) // 2)))
    b = torch.full((4,), R + 1.0, dtype=torch.bfloat16)
    pg.all_reduce(b, op="max")
    assert torch.equal(b, torch.full((4,), float(N), dtype=torch.bfloat16))
    out = torch.zeros(2 * N, dtype=torch.int64)
    pg.all_gather(out, torch.tensor([R, R]))
    assert out.tolist() == [r for r in range(N) for _ in range(2)]
    try:
        pg.all_reduce(torch.ones(4, 4).t())
        raise AssertionError("non-contiguous tensor accepted")
    except ValueError as e:
        assert "buf" in str(e) and "contiguous" in str(e)
    try:
        pg.all_reduce(torch.ones(2, dtype=torch.complex64))
        raise AssertionError("complex accepted")
    except TypeError as e:
        assert "complex" in str(e)


@check
def argument_errors_name_the_argument():
    expect(ValueError, lambda: pg.all_reduce(np.zeros((4, 4))[:, 1]), "buf", "contiguous")
    expect(TypeError, lambda: pg.all_reduce(np.zeros(3, dtype=np.complex64)), "buf", "complex64")
    expect(TypeError, lambda: pg.all_reduce([1.0, 2.0]), "buf", "list")
    ro = np.zeros(3, dtype=np.float32)
    ro.flags.writeable = False
    expect(ValueError, lambda: pg.all_reduce(ro), "buf", "read-only")
    expect(TypeError, lambda: pg.all_gather(np.zeros(2 * N, np.float32), np.zeros(2, np.float64)), "dtype")
    expect(ValueError, lambda: pg.all_reduce(np.zeros(2, np.float32), op="mean-ish"), "op")
    expect(TypeError, lambda: pg.broadcast(np.zeros(2, np.float32), root="0"), "root")
    e = expect(ringleader.InvalidArgumentError, lambda: pg.all_gather(np.zeros(1, np.float32), np.zeros(2, np.float32)),
               "world_size")
    assert isinstance(e, ValueError) and isinstance(e, RuntimeError) and e.kind == "invalid-argument"
    expect(ringleader.InvalidArgumentError, lambda: pg.broadcast(np.zeros(2, np.float32), root=N), "root")
    expect(ValueError, lambda: pg.monitored_barrier(timeout=-1), "timeout")
    expect(TypeError, lambda: pg.monitored_barrier(timeout="5"), "timeout")
    x = np.zeros(2 * N, dtype=np.float32)
    expect(ringleader.InvalidArgumentError, lambda: pg.all_gather(x, x[:2]), "overlap")


@check
def flight_recorder_and_dump():
    fr = pg.flight_recorder()
    assert isinstance(fr, list) and fr, fr
    last = fr[-1]
    for k in ("record_id", "collective_seq_id", "profiling_name", "state", "input_sizes", "input_dtypes"):
        assert k in last, k
    assert last["state"] == "completed", last
    path = os.path.join(tempfile.mkdtemp(), f"dump-{R}.json")
    written = pg.dump(path)
    assert written == path
    with open(path) as f:
        data = json.load(f)
    assert "version" in data, list(data)


@check
def gil_is_released_during_a_collective():
    # Rank 0 blocks in a barrier for about 1 s while rank 1 sleeps; a Python thread must keep counting meanwhile.
    ticks = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    th = threading.Thread(target=count)
    th.start()
    if R == N - 1:
        time.sleep(1.0)
    t0 = time.monotonic()
    pg.barrier()
    blocked = time.monotonic() - t0
    stop.set()
    th.join()
    if R == 0 and N > 1:
        assert blocked > 0.5, blocked
        assert ticks[0] > 100, ticks[0]


@check
def error_classes():
    assert issubclass(ringleader.Error, RuntimeError)
    for name in ("MissedCollectiveError", "MismatchError", "PeerDiedError", "PeerStalledError", "TimeoutError",
                 "RendezvousIncompleteError", "StoreUnreachableError", "PortInUseError", "AbortedError",
                 "InvalidArgumentError", "ForeignRunError", "AuthFailedError", "VersionMismatchError",
                 "DataPortUnreachableError", "WorldSizeMismatchError", "DuplicateRankError", "StragglerError"):
        cls = getattr(ringleader, name)
        assert issubclass(cls, ringleader.Error) and cls.kind != "unknown", name


def main():
    global pg, R, N
    with ringleader.init(timeout=30) as g:
        pg, R, N = g, g.rank, g.world_size
        failed = run_all()
    try:
        pg.barrier()
        raise AssertionError("a destroyed group still ran a barrier")
    except ringleader.AbortedError:
        print("PASS destroyed_group_refuses_calls", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
