"""torch.distributed with backend="ringleader": every collective torch
dispatches to the backend, dtypes, async work and futures, sub-groups and
object collectives, checked on every rank. argv[1]: "env" (env://) or
"explicit" (rank, world_size and a TCPStore passed in code)."""

import datetime
import os
import sys

import torch
import torch.distributed as dist

import ringleader
import ringleader.torch  # noqa: F401  registers backend="ringleader"
from _checks import check, run_all

R = N = 0
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
          torch.int64]


def same(a, b, what=""):
    assert torch.equal(a, b), f"{what}: {a} != {b}"


@check
def backend_is_ringleader():
    assert dist.get_backend() == "ringleader", dist.get_backend()
    assert (dist.get_rank(), dist.get_world_size()) == (R, N)
    assert isinstance(ringleader.torch.communicator(), ringleader.ProcessGroup)


@check
def all_reduce_dtypes_and_ops():
    for dt in DTYPES:
        t = torch.full((5,), R + 1, dtype=dt)
        dist.all_reduce(t)
        same(t, torch.full((5,), N * (N + 1) // 2, dtype=dt), str(dt))
    for op, want in ((dist.ReduceOp.MIN, 1), (dist.ReduceOp.MAX, N), (dist.ReduceOp.PRODUCT, 2 if N == 2 else 6)):
        t = torch.full((3,), float(R + 1))
        dist.all_reduce(t, op=op)
        same(t, torch.full((3,), float(want)), str(op))
    t = torch.full((3,), 2.0 * (R + 1))
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    same(t, torch.full((3,), N + 1.0), "avg")


@check
def all_reduce_async_and_future():
    t = torch.ones(1000)
    w = dist.all_reduce(t, async_op=True)
    assert w.wait()
    # (torch wraps a Python work in a holder that forwards only wait() and
    # get_future(), so w.is_completed() stays False: ask the future.)
    assert w.get_future().done()
    same(t, torch.full((1000,), float(N)))
    t = torch.ones(10)
    fut = dist.all_reduce(t, async_op=True).get_future()
    res = fut.then(lambda f: f.value()[0] * 2).wait()
    same(res, torch.full((10,), 2.0 * N))
    works = [dist.all_reduce(torch.full((4,), float(i)), async_op=True) for i in range(8)]
    for w in works:
        w.wait()


@check
def blocking_calls_complete_in_the_caller_async_ones_in_the_background():
    # torch says which calls it waits for at once (opts.asyncOp False: the
    # blocking dist.* functions); those run in the calling thread and return
    # completed work, the others (DDP's buckets) are queued.
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    t = torch.ones(3)
    w = backend.allreduce([t], opts)
    assert type(w).__name__ == "_DoneWork" and w.is_completed() and w.get_future().done(), w
    same(t, torch.full((3,), float(N)), "blocking")
    same(w.get_future().value()[0], t, "blocking future")
    opts.asyncOp = True
    w = backend.allreduce([t], opts)
    assert type(w).__name__ == "_TorchWork", w
    assert w.get_future().wait()[0] is t
    same(t, torch.full((3,), float(N * N)), "async")
    # Bool and a non-contiguous tensor leave the latency lane for the general path.
    b = torch.tensor([R == 0, True, False])
    dist.all_reduce(b, op=dist.ReduceOp.MAX)
    same(b, torch.tensor([True, True, False]), "bool max")
    try:
        dist.all_reduce(b)
        raise AssertionError("a bool sum was accepted")
    except (ValueError, TypeError, RuntimeError) as e:
        assert "bool" in str(e), e


@check
def the_cpp_lane_serves_blocking_calls_with_call_sites_and_errors():
    # EXPECT_NATIVE: "1" where the package was built with its C++ lane (the
    # tests' install), "0" under RINGLEADER_TORCH_NATIVE=0.
    want = os.environ.get("EXPECT_NATIVE", "1") == "1"
    assert ringleader.torch.NATIVE is want, (ringleader.torch.NATIVE, ringleader.torch.NATIVE_MISSING)
    fr = ringleader.torch.communicator().flight_recorder
    before = len(fr())
    t = torch.full((3,), float(R + 1))
    dist.all_reduce(t)  # LANE-ALL-REDUCE
    same(t, torch.full((3,), float(N * (N + 1) // 2)), "lane all_reduce")
    t = torch.full((2,), float(R), dtype=torch.float64)
    dist.broadcast(t, src=N - 1)  # LANE-BROADCAST
    same(t, torch.full((2,), float(N - 1), dtype=torch.float64), "lane broadcast")
    out = torch.empty(N, dtype=torch.int32)
    dist.all_gather_into_tensor(out, torch.tensor([R], dtype=torch.int32))  # LANE-ALL-GATHER
    same(out, torch.arange(N, dtype=torch.int32), "lane all_gather")
    out = torch.empty(1)
    dist.reduce_scatter_tensor(out, torch.arange(N, dtype=torch.float32))  # LANE-REDUCE-SCATTER
    same(out, torch.tensor([float(N * R)]), "lane reduce_scatter")
    dist.barrier()  # LANE-BARRIER
    # The user's own line is every record's call site.
    src = open(__file__, encoding="utf-8").read().splitlines()
    lines = {tag: i + 1 for i, l in enumerate(src) for tag in ("LANE-ALL-REDUCE", "LANE-BROADCAST",
             "LANE-ALL-GATHER", "LANE-REDUCE-SCATTER", "LANE-BARRIER") if l.rstrip().endswith("# " + tag)}
    recs = fr()[before:][-5:]
    sites = [r["call_site"] for r in recs]
    want_sites = [f"torch_api.py:{lines[t]} in the_cpp_lane_serves_blocking_calls_with_call_sites_and_errors"
                  for t in ("LANE-ALL-REDUCE", "LANE-BROADCAST", "LANE-ALL-GATHER", "LANE-REDUCE-SCATTER",
                            "LANE-BARRIER")]
    assert [s.rsplit("/", 1)[-1] for s in sites] == want_sites, (sites, want_sites)
    # Through torch's C++ ProcessGroup a blocking call returns completed work
    # (the lane's own; torch's holder of a Python work forwards only wait()
    # and get_future(), so is_completed() is asked of the lane's alone).
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    t = torch.ones(2)
    w = dist.group.WORLD.allreduce([t], opts)
    assert w.wait() and w.get_future().done(), w
    assert w.is_completed() or not want, w
    same(w.get_future().value()[0], torch.full((2,), float(N)), "lane work's future")
    # A call the C ABI refuses (an output that does not hold N inputs) raises
    # the package's typed error, and leaves the group usable.
    try:
        dist.all_gather_into_tensor(torch.empty(N + 1), torch.ones(1))
        raise AssertionError("a short all_gather output was accepted")
    except ringleader.Error as e:
        assert isinstance(e, ValueError) and isinstance(e, dist.DistError), (type(e), e)
        assert e.kind == "invalid-argument", (e.kind, e)
    t = torch.ones(1)
    dist.all_reduce(t)
    same(t, torch.full((1,), float(N)), "all_reduce after a refused call")


@check
def all_reduce_non_contiguous_is_staged():
    t = torch.ones(4, 6).t()[:, :3]
    assert not t.is_contiguous()
    dist.all_reduce(t)
    same(t, torch.full((6, 3), float(N)))


@check
def all_gather_list_and_into_tensor():
    outs = [torch.empty(3, dtype=torch.int64) for _ in range(N)]
    dist.all_gather(outs, torch.full((3,), R, dtype=torch.int64))
    for r, o in enumerate(outs):
        same(o, torch.full((3,), r, dtype=torch.int64))
    out = torch.empty(N * 2, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(out, torch.full((2,), float(R), dtype=torch.bfloat16))
    same(out, torch.arange(N, dtype=torch.bfloat16).repeat_interleave(2))
    out = torch.empty(N, 2)
    dist.all_gather_into_tensor(out, torch.full((2,), float(R)), async_op=True).wait()
    same(out[:, 0], torch.arange(N, dtype=torch.float32))


@check
def reduce_scatter_list_and_tensor():
    out = torch.empty(2)
    dist.reduce_scatter(out, [torch.full((2,), float(i + R)) for i in range(N)])
    same(out, torch.full((2,), float(N * R + sum(range(N)))))
    out = torch.empty(3, dtype=torch.int32)
    dist.reduce_scatter_tensor(out, torch.arange(3 * N, dtype=torch.int32))
    same(out, N * torch.arange(3 * R, 3 * R + 3, dtype=torch.int32))
    out = torch.empty(1)
    dist.reduce_scatter_tensor(out, torch.full((N,), float(R + 1)), op=dist.ReduceOp.MAX)
    same(out, torch.tensor([float(N)]))


@check
def broadcast_and_reduce():
    t = torch.full((4,), float(R))
    dist.broadcast(t, src=N - 1)
    same(t, torch.full((4,), float(N - 1)))
    t = torch.full((4,), R + 1, dtype=torch.int64)
    dist.reduce(t, dst=0)
    same(t, torch.full((4,), N * (N + 1) // 2 if R == 0 else R + 1, dtype=torch.int64))


@check
def all_to_all_single_and_list():
    inp = torch.arange(2 * N) + 100 * R
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    want = torch.cat([torch.arange(2 * R, 2 * R + 2) + 100 * j for j in range(N)])
    same(out, want)
    outs = [torch.empty(2) for _ in range(N)]
    dist.all_to_all(outs, [torch.full((2,), float(10 * R + j)) for j in range(N)])
    for j, o in enumerate(outs):
        same(o, torch.full((2,), float(10 * j + R)))


@check
def gather_and_scatter():
    outs = [torch.empty(2) for _ in range(N)] if R == 0 else None
    dist.gather(torch.full((2,), float(R)), outs, dst=0)
    if R == 0:
        for r, o in enumerate(outs):
            same(o, torch.full((2,), float(r)))
    out = torch.empty(3)
    dist.scatter(out, [torch.full((3,), float(r * 7)) for r in range(N)] if R == 0 else None, src=0)
    same(out, torch.full((3,), float(R * 7)))


@check
def the_cpp_lane_serves_send_and_recv():
    # Sends and receives of one dense CPU tensor go through the C ABI from
    # C++ (completed work when they completed before returning, else work
    # over the queued handle), with the user's line as the call site.
    fr = ringleader.torch.communicator().flight_recorder
    before = len(fr())
    if R == 0:
        dist.send(torch.arange(4, dtype=torch.float32), dst=1)  # LANE-SEND
        dist.barrier()
        dist.send(torch.full((3,), 7, dtype=torch.int32), dst=1)
    elif R == 1:
        t = torch.empty(4)
        dist.recv(t, src=0)  # LANE-RECV
        same(t, torch.arange(4, dtype=torch.float32), "lane recv")
        # Posted before its data exists (rank 0 sends after the barrier):
        # queued, then waited for through the handle.
        t2 = torch.empty(3, dtype=torch.int32)
        w = dist.irecv(t2, src=0)
        dist.barrier()
        assert w.wait(), w
        # (torch's holder of a Python work forwards only wait() and
        # get_future(): is_completed() is asked of the C++ lane's alone.)
        assert w.is_completed() or os.environ.get("EXPECT_NATIVE", "1") != "1", w
        same(t2, torch.full((3,), 7, dtype=torch.int32), "queued lane recv")
    else:
        dist.barrier()
    if R < 2:
        tag = "LANE-SEND" if R == 0 else "LANE-RECV"
        src = open(__file__, encoding="utf-8").read().splitlines()
        line = next(i + 1 for i, l in enumerate(src) if l.rstrip().endswith("# " + tag))
        sites = [r["call_site"].rsplit("/", 1)[-1] for r in fr()[before:] if r["p2p_seq_id"]]
        want = f"torch_api.py:{line} in the_cpp_lane_serves_send_and_recv"
        assert sites and sites[0] == want, (sites, want)
    dist.barrier()


@check
def send_recv_isend_irecv():
    if R == 0:
        dist.send(torch.arange(5, dtype=torch.float32), dst=1)
        w = dist.isend(torch.full((2,), 9, dtype=torch.int64), dst=1)
        w.wait()
    elif R == 1:
        t = torch.empty(5)
        dist.recv(t, src=0)
        same(t, torch.arange(5, dtype=torch.float32))
        t2 = torch.empty(2, dtype=torch.int64)
        dist.irecv(t2, src=0).wait()
        same(t2, torch.full((2,), 9, dtype=torch.int64))
    dist.barrier()


@check
def batch_isend_irecv_ring():
    nxt, prv = (R + 1) % N, (R - 1) % N
    send, recv = torch.full((3,), float(R)), torch.empty(3)
    ops = [dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    same(recv, torch.full((3,), float(prv)))


@check
def barrier_and_monitored_barrier():
    dist.barrier()
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=10))
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=10), wait_all_ranks=True)


@check
def object_collectives():
    objs = [None] * N
    dist.all_gather_object(objs, {"rank": R, "name": f"r{R}"})
    assert objs == [{"rank": r, "name": f"r{r}"} for r in range(N)], objs
    lst = [f"from {R}", R] if R == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == ["from 0", 0], lst


@check
def sub_group_has_its_own_communicator():
    g = dist.new_group(list(range(N)))
    t = torch.ones(2)
    dist.all_reduce(t, group=g)
    same(t, torch.full((2,), float(N)))
    assert ringleader.torch.communicator(g) is not ringleader.torch.communicator()
    if N >= 3:
        sub = dist.new_group([0, 1])
        if R in (0, 1):
            t = torch.full((1,), float(R + 1))
            dist.all_reduce(t, group=sub)
            same(t, torch.tensor([3.0]))
    dist.destroy_process_group(g)


@check
def unsupported_ops_raise_clearly():
    try:
        dist.all_reduce(torch.ones(1, dtype=torch.int32), op=dist.ReduceOp.BAND)
        raise AssertionError("BAND accepted")
    except (ValueError, RuntimeError) as e:
        assert "not supported" in str(e), e


@check
def cuda_tensors_run_on_the_device_or_say_why_not():
    why = ringleader.cuda_support()
    if not torch.cuda.is_available():
        # This machine: no driver. The reason names it, the backend serves
        # CPU tensors only, and a tensor on another device is refused by name.
        assert why is not None and "libcuda.so.1" in why, why
        assert dist.Backend.backend_capability["ringleader"] == ["cpu"], dist.Backend.backend_capability
        try:
            ringleader.torch.communicator().all_reduce(torch.ones(3, device="meta"))
            raise AssertionError("a meta tensor was accepted")
        except TypeError as e:
            assert "meta" in str(e) and "CPU and CUDA" in str(e), e
        return
    assert why is None, why
    dev = torch.device("cuda", R % torch.cuda.device_count())
    x = torch.full((1 << 20,), float(R + 1), device=dev)
    dist.all_reduce(x)
    same(x.cpu(), torch.full((1 << 20,), N * (N + 1) / 2), "cuda all_reduce")
    outs = [torch.empty(5, device=dev) for _ in range(N)]
    dist.all_gather(outs, torch.full((5,), float(R), device=dev))
    for r, o in enumerate(outs):
        same(o.cpu(), torch.full((5,), float(r)), "cuda all_gather")
    b = torch.full((7,), float(R), device=dev)
    dist.broadcast(b, src=N - 1)
    same(b.cpu(), torch.full((7,), float(N - 1)), "cuda broadcast")
    if N >= 2 and R < 2:
        t = torch.arange(4.0, device=dev) if R == 0 else torch.zeros(4, device=dev)
        (dist.send if R == 0 else dist.recv)(t, 1 - R)
        same(t.cpu(), torch.arange(4.0), "cuda send/recv")
    dist.barrier()


@check
def timeout_argument_sets_ringleader_timeout():
    want = float(os.environ.get("EXPECT_TIMEOUT", "0") or 0)
    if want:
        got = ringleader.torch.communicator().timeout
        assert abs(got - want) < 1e-6, (got, want)


@check
def flight_recorder_sees_torch_calls():
    fr = ringleader.torch.communicator().flight_recorder()
    names = {e["profiling_name"] for e in fr}
    assert "ringleader:all_reduce" in names and "ringleader:all_gather" in names, names


def main():
    global R, N
    mode = sys.argv[1] if len(sys.argv) > 1 else "env"
    timeout = datetime.timedelta(seconds=float(os.environ.get("EXPECT_TIMEOUT", "0") or 1800))
    if mode == "explicit":
        rank, world = int(os.environ.pop("RANK")), int(os.environ.pop("WORLD_SIZE"))
        host, port = os.environ.pop("MASTER_ADDR"), int(os.environ.pop("MASTER_PORT"))
        store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=datetime.timedelta(seconds=60))
        dist.init_process_group("ringleader", store=store, rank=rank, world_size=world, timeout=timeout)
    else:
        dist.init_process_group("ringleader", timeout=timeout)
    R, N = dist.get_rank(), dist.get_world_size()
    failed = run_all()
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
