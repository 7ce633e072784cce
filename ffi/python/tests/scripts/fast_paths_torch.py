"""The torch backend's latency lane (a blocking dist.all_reduce of one
dense contiguous CPU tensor, straight to the C ABI from the backend, errors
converted in the method itself, a completed Work made without a Python
__init__) against the general path: same results, records and errors."""

import sys

import torch
import torch.distributed as dist

import ringleader
import ringleader.torch as rt
from _checks import check, run_all
from _fast_common import expected, line, site_is

pg = None
R = N = 0
DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
          torch.int8: "i8", torch.uint8: "u8", torch.int32: "i32", torch.int64: "i64"}
OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


def last():
    return pg.flight_recorder()[-1]


@check
def lane_results_for_every_dtype_and_op():
    for dt, name in DTYPES.items():
        for op, red in OPS.items():
            vals = [(torch.arange(5) % 3 + r + 1).to(dt) for r in range(N)]
            want = expected(op, vals, torch.minimum, torch.maximum).to(dt)
            t = vals[R].clone()
            dist.all_reduce(t, op=red)
            assert torch.equal(t, want), (dt, op, t, want)
            fp = last()["fingerprint"]
            assert (fp["dtype"], fp["count"], fp["reduce_op"]) == (name, 5, op), fp
            u = vals[R].clone()
            dist.all_reduce(u, op=red, async_op=True).wait()  # the general path
            assert torch.equal(u, want), (dt, op, u, want)
    t = torch.full((3,), R + 1.0)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    assert torch.allclose(t, torch.full((3,), (N + 1) / 2)), t


@check
def lane_records_the_callers_line():
    t = torch.ones(2)
    mine = line(); dist.all_reduce(t)  # noqa: E702
    rec = last()
    site_is(rec, mine, "lane_records_the_callers_line")
    assert "torch/distributed" not in rec["call_site"], rec
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    mine = line(); backend.allreduce([t], opts)  # noqa: E702
    site_is(last(), mine, "lane_records_the_callers_line")


@check
def lane_returns_fresh_completed_work():
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    a, b = torch.ones(2), torch.ones(3)
    wa = backend.allreduce([a], opts)
    wb = backend.allreduce([b], opts)
    assert wa is not wb
    assert type(wa).__name__ == "_DoneWork" and wa.is_completed() and wa.is_success(), wa
    assert wa.result()[0] is a and wb.result()[0] is b
    assert wa.get_future().value()[0] is a and wa.wait() and wa.exception() is None
    assert torch.equal(a, torch.full((2,), float(N))) and torch.equal(b, torch.full((3,), float(N)))


@check
def lane_errors_leave_as_torch_errors():
    g = dist.new_group(list(range(N)))
    t = torch.ones(2)
    dist.all_reduce(t, group=g)
    dist.barrier(group=g)
    rt.communicator(g).abort("fast-paths test")
    for what, fn in (("lane", lambda: dist.all_reduce(torch.ones(2), group=g)),
                     ("general", lambda: dist.all_reduce(torch.ones(4, 2).t(), group=g))):
        try:
            fn()
        except dist.DistBackendError as e:
            assert isinstance(e, ringleader.AbortedError) and e.kind == "aborted", (what, type(e), e)
            assert type(e) is rt.AbortedError, (what, type(e))
            assert e.__cause__ is None and e.__suppress_context__, (what, e.__cause__)
            assert "aborted" in str(e), (what, e)
        else:
            raise AssertionError(f"{what}: no error after abort")


def main():
    global pg, R, N
    dist.init_process_group("ringleader")
    R, N = dist.get_rank(), dist.get_world_size()
    pg = rt.communicator()
    failed = run_all()
    dist.barrier()
    dist.destroy_process_group()
    return failed


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
