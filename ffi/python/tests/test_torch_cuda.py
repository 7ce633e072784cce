"""backend="ringleader" on CUDA tensors (tests/scripts/torch_cuda.py), run
where torch sees a GPU and libringleader can use it; skipped elsewhere with
the reason. scripts/gpu_check.sh runs it on a GPU machine."""

import pytest

from conftest import assert_check_passed, check_names, run

torch = pytest.importorskip("torch")
import ringleader  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device here", allow_module_level=True)
if ringleader.cuda_support() is not None:
    pytest.skip(f"libringleader cannot use CUDA here: {ringleader.cuda_support()}", allow_module_level=True)


@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def job(request):
    return run("torch_cuda.py", world=request.param, limit=240)


@pytest.mark.parametrize("name", check_names("torch_cuda.py"))
def test_cuda_check(job, name):
    assert_check_passed(job, name)


def test_cuda_job_exits_cleanly(job):
    job.assert_ok()
