"""The numpy API on 2 and 3 ranks: every op, several dtypes, async work,
argument errors, the flight recorder, the GIL released during calls. One
job per world size runs every check; each check is its own test."""

import pytest

from conftest import assert_check_passed, check_names, run

SCRIPT = "numpy_api.py"


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"world{w}")
def job(request):
    return run(SCRIPT, world=request.param, limit=120, env={"RINGLEADER_TIMEOUT": "30"})


@pytest.mark.parametrize("name", check_names(SCRIPT) + ["destroyed_group_refuses_calls"])
def test_numpy_check(job, name):
    assert_check_passed(job, name)


def test_every_rank_exits_cleanly(job):
    job.assert_ok()
