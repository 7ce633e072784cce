"""The numpy API on 2 and 3 ranks: every op, several dtypes, async work,
argument errors, the flight recorder, the GIL released during calls. One
job per world size runs every check; each check is its own test."""

import ast

import pytest

from conftest import SCRIPTS, parse_checks, run

SCRIPT = "numpy_api.py"


def _check_names():
    """Names of the @check functions in the script (read without importing it)."""
    tree = ast.parse((SCRIPTS / SCRIPT).read_text())
    names = [f.name for f in tree.body if isinstance(f, ast.FunctionDef)
             and any(getattr(d, "id", None) == "check" for d in f.decorator_list)]
    return names + ["destroyed_group_refuses_calls"]


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"world{w}")
def job(request):
    return run(SCRIPT, world=request.param, limit=120, env={"RINGLEADER_TIMEOUT": "30"})


@pytest.mark.parametrize("name", _check_names())
def test_numpy_check(job, name):
    for p in job.procs:
        results = parse_checks(p)
        assert name in results, f"{p.label} did not run {name}:\n{job.report()}"
        assert results[name] == "", f"{p.label}: {name}: {results[name]}\n{job.report()}"


def test_every_rank_exits_cleanly(job):
    job.assert_ok()
