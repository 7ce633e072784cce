"""backend="ringleader" in torch.distributed: every dispatched collective
(env:// and explicit store), the timeout argument, and DDP training ending
in identical replicas."""

import ast

import pytest

from conftest import SCRIPTS, parse_checks, run

pytest.importorskip("torch")


def _check_names():
    tree = ast.parse((SCRIPTS / "torch_api.py").read_text())
    return [f.name for f in tree.body if isinstance(f, ast.FunctionDef)
            and any(getattr(d, "id", None) == "check" for d in f.decorator_list)]


JOBS = {
    "env-world2": dict(world=2, args=["env"], env={"EXPECT_TIMEOUT": "42"}),
    "explicit-world3": dict(world=3, args=["explicit"], env={}),
}


@pytest.fixture(scope="module", params=list(JOBS), ids=list(JOBS))
def job(request):
    return run("torch_api.py", limit=180, **JOBS[request.param])


@pytest.mark.parametrize("name", _check_names())
def test_torch_check(job, name):
    for p in job.procs:
        results = parse_checks(p)
        assert name in results, f"{p.label} did not run {name}:\n{job.report()}"
        assert results[name] == "", f"{p.label}: {name}: {results[name]}\n{job.report()}"


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
    assert finals[0] == finals[1], f"replicas differ: {finals}\n{job.report()}"
