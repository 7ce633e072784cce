"""backend="ringleader" on CUDA tensors (tests/scripts/torch_cuda.py), run
where torch sees a GPU and libringleader can use it; skipped elsewhere with
the reason. scripts/gpu_check.sh runs it on a GPU machine."""

import ast

import pytest

from conftest import SCRIPTS, parse_checks, run

torch = pytest.importorskip("torch")
import ringleader  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device here", allow_module_level=True)
if ringleader.cuda_support() is not None:
    pytest.skip(f"libringleader cannot use CUDA here: {ringleader.cuda_support()}", allow_module_level=True)


def _check_names():
    tree = ast.parse((SCRIPTS / "torch_cuda.py").read_text())
    return [f.name for f in tree.body if isinstance(f, ast.FunctionDef)
            and any(getattr(d, "id", None) == "check" for d in f.decorator_list)]


@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def job(request):
    return run("torch_cuda.py", world=request.param, limit=240)


@pytest.mark.parametrize("name", _check_names())
def test_cuda_check(job, name):
    for p in job.procs:
        results = parse_checks(p)
        assert name in results, f"{p.label} did not run {name}:\n{job.report()}"
        assert results[name] == "", f"{p.label}: {name}: {results[name]}\n{job.report()}"


def test_cuda_job_exits_cleanly(job):
    job.assert_ok()
