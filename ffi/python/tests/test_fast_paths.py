"""The latency lanes of the Python package (issue 20, small messages):
the word-typed ctypes prototypes held to the exact declarations, and the
lanes of the numpy API (its C lane, and with RINGLEADER_NATIVE=0 its ctypes
paths) and of the torch backend checked against their general paths on 2
ranks (tests/scripts/fast_paths_*.py)."""

import ctypes

import pytest

from conftest import assert_check_passed, check_names, run
from ringleader import _lib


def test_hot_prototypes_are_the_exact_ones_with_words_for_integers():
    exact_words = (ctypes.c_int, ctypes.c_int64, ctypes.c_size_t, ctypes.c_void_p)
    names = [n for n in vars(_lib.hot) if n.startswith("rl_")]
    assert "rl_all_reduce" in names and "rl_barrier" in names, names
    for name in names:
        f = getattr(_lib.hot, name)
        res, args = _lib._SIGNATURES[name]
        assert f is not getattr(_lib.lib, name), name  # its own function object: the exact one is untouched
        assert getattr(_lib.lib, name).argtypes == args, name
        assert f.restype is res, name
        assert len(f.argtypes) == len(args), name
        for i, (hot, exact) in enumerate(zip(f.argtypes, args)):
            if _lib.WORD_ARGS and exact in exact_words:
                assert hot is ctypes.c_void_p, (name, i, hot)
            else:
                assert hot is exact, (name, i, hot, exact)


def test_words_only_where_they_are_the_same_call():
    import platform
    import sys

    lp64 = ctypes.sizeof(ctypes.c_void_p) == ctypes.sizeof(ctypes.c_size_t) == 8
    if _lib.WORD_ARGS:
        assert sys.platform.startswith("linux") and lp64, (sys.platform, lp64)
        assert platform.machine().lower() in ("x86_64", "amd64", "aarch64", "arm64"), platform.machine()


@pytest.fixture(scope="module")
def numpy_job():
    return run("fast_paths_numpy.py", world=2, limit=120, env={"RINGLEADER_TIMEOUT": "30"})


@pytest.mark.parametrize("name", check_names("fast_paths_numpy.py") + ["destroyed_group_refuses_the_lane"])
def test_numpy_lane(numpy_job, name):
    assert_check_passed(numpy_job, name)


def test_numpy_lane_job_exits_cleanly(numpy_job):
    numpy_job.assert_ok()


@pytest.fixture(scope="module")
def numpy_ctypes_job():
    return run("fast_paths_numpy.py", world=2, limit=120, env={"RINGLEADER_TIMEOUT": "30", "RINGLEADER_NATIVE": "0"})


@pytest.mark.parametrize("name", check_names("fast_paths_numpy.py") + ["destroyed_group_refuses_the_lane"])
def test_numpy_ctypes_paths(numpy_ctypes_job, name):
    # The same checks with the C lane off: the ctypes paths it stands in for.
    assert_check_passed(numpy_ctypes_job, name)


def test_numpy_ctypes_job_exits_cleanly(numpy_ctypes_job):
    numpy_ctypes_job.assert_ok()


@pytest.fixture(scope="module")
def torch_job():
    pytest.importorskip("torch")
    return run("fast_paths_torch.py", world=2, limit=180, env={"RINGLEADER_TIMEOUT": "30"})


@pytest.mark.parametrize("name", check_names("fast_paths_torch.py"))
def test_torch_lane(torch_job, name):
    assert_check_passed(torch_job, name)


def test_torch_lane_job_exits_cleanly(torch_job):
    torch_job.assert_ok()
