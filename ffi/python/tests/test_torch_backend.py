"""backend="ringleader" in torch.distributed: every dispatched collective
(env:// and explicit store; with the C++ lane and without it), the timeout
argument, and DDP training ending in identical replicas."""

import pytest

from conftest import assert_check_passed, check_names, run

pytest.importorskip("torch")


JOBS = {
    "env-world2": dict(world=2, args=["env"], env={"EXPECT_TIMEOUT": "42"}),
    "explicit-world3": dict(world=3, args=["explicit"], env={}),
    # The backend without its C++ lane: every call through the Python methods.
    "python-lane-world2": dict(world=2, args=["env"],
                               env={"EXPECT_TIMEOUT": "42", "RINGLEADER_TORCH_NATIVE": "0", "EXPECT_NATIVE": "0"}),
}


@pytest.fixture(scope="module", params=list(JOBS), ids=list(JOBS))
def job(request):
    return run("torch_api.py", limit=180, **JOBS[request.param])


@pytest.mark.parametrize("name", check_names("torch_api.py"))
def test_torch_check(job, name):
    assert_check_passed(job, name)


def test_torch_job_exits_cleanly(job):
    job.assert_ok()


def test_ddp_training_ends_in_identical_replicas():
    job = run("ddp_train.py", world=2, limit=180)
    job.assert_ok()
    finals = []
    for p in job.procs:
        line = next((l for _, l in p.lines if l.startswith("PARAMS ")), None)
        assert line, job.report()
        _, digest, _, moved, _, identical = line.split()
        assert float(moved) > 0, line  # training changed the weights
        assert identical == "True", line
        finals.append(digest)
        # DDP's buckets reach the backend as asynchronous calls, which run on
        # the engine thread while backward goes on (blocking ones run inline).
        line = next((l for _, l in p.lines if l.startswith("DDP_ALLREDUCES ")), None)
        assert line, job.report()
        _, _, n_async, _, n_blocking = line.split()
        assert int(n_async) > 0 and int(n_blocking) == 0, line
    assert finals[0] == finals[1], f"replicas differ: {finals}\n{job.report()}"
