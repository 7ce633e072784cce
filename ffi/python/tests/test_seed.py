"""The two scripts of the seed (shared/seeds/000_0a088d86c93a4673.txt) with
backend="ringleader": (a) the rank-conditional second all_reduce, started
three ways (plain env://, torchrun, ringleader launch); (b) the monitored
barrier with a sleeping rank."""

import pytest

from conftest import PYTHON, SCRIPTS, launch, free_port, ringleader_bin, run, torchrun_bin

pytest.importorskip("torch")

TORCH_TIMEOUT = 10  # the seed's timedelta(seconds=10)


def assert_hang_explained(proc_text, lines_of_rank0):
    """Rank 0's error names rank 1 and all_reduce, within the torch timeout + 2 s."""
    assert "[missed-collective]" in proc_text, proc_text
    assert "rank 1" in proc_text and "all_reduce #2" in proc_text, proc_text
    assert "RuntimeError" in proc_text or "MissedCollectiveError" in proc_text, proc_text
    t_first = next((t for t, l in lines_of_rank0 if "rank 0: first all_reduce done" in l), None)
    t_err = next((t for t, l in lines_of_rank0 if "[missed-collective]" in l), None)
    assert t_first is not None and t_err is not None, proc_text
    assert t_err - t_first < TORCH_TIMEOUT + 2, f"error after {t_err - t_first:.1f} s"
    return t_err - t_first


def test_seed_hang_env():
    job = run("seed_hang.py", world=2, limit=90)
    assert job[1].code == 0 and job[0].code != 0, job.report()
    assert "rank 1: reached the end" in job[1].text
    waited = assert_hang_explained(job[0].text, job[0].lines)
    assert waited < 5, f"ringleader should know at once, took {waited:.1f} s"
    assert "rank 0: reached the end" not in job[0].text


def test_seed_hang_names_the_scripts_own_line_through_torch_distributed():
    # The call site is the first frame outside ringleader and torch: the
    # script's `dist.all_reduce(t)` under `if rank == 0:`, not torch's wrappers.
    lines = (SCRIPTS / "seed_hang.py").read_text().splitlines()
    second = next(i + 1 for i, l in enumerate(lines) if l.startswith("    dist.all_reduce(t)"))
    job = run("seed_hang.py", world=2, limit=90)
    assert job[0].code != 0, job.report()
    assert "rank 0 waits in it (called at " in job[0].text, job[0].text
    assert f"seed_hang.py:{second} in <module>)" in job[0].text, job[0].text
    assert "torch/distributed" not in job[0].text.split("called at ")[1].split(")")[0], job[0].text


def test_seed_hang_torchrun():
    tr = torchrun_bin()
    if tr is None:
        pytest.skip("torchrun not found")
    argv = [tr, "--nproc_per_node=2", f"--master_port={free_port()}", str(SCRIPTS / "seed_hang.py")]
    job = launch(argv, limit=90).finish()
    text = job[0].text
    assert job[0].code != 0, text
    assert_hang_explained(text, job[0].lines)


def test_seed_hang_ringleader_launch():
    rl = ringleader_bin()
    if rl is None:
        pytest.skip("the ringleader CLI was not found (set RINGLEADER_BIN)")
    argv = [rl, "launch", "--nproc-per-node", "2", "--", PYTHON,
            str(SCRIPTS / "seed_hang.py")]
    job = launch(argv, limit=90).finish()
    text = job[0].text
    assert job[0].code != 0, text
    assert_hang_explained(text, job[0].lines)
    assert "rank 0" in text  # the launcher names the failed rank


def test_seed_monitored_barrier_names_the_sleeping_rank():
    job = run("seed_monitored.py", world=2, limit=120)
    line = next((l for _, l in job[0].lines if l.startswith("rank 0:")), None)
    assert line is not None, job.report()
    assert "Rank 1 failed to pass monitored_barrier in 5000 ms" in line, line
    t = job[0].first("rank 0:")
    assert t is not None and t < 5 + 15, f"rank 0 reported after {t:.1f} s"  # 5 s barrier timeout + startup
    # Rank 1, late, is told what rank 0 reported rather than hanging.
    line1 = next((l for _, l in job[1].lines if l.startswith("rank 1:")), "")
    assert "Rank 1 failed to pass monitored_barrier" in line1, job.report()
