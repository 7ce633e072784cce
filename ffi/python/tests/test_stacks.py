"""The culprit's own line in the verdict, from its stacks: rank 1 of 2 stays
in its own code (time.sleep, a native call with the GIL released, one with
the GIL held while another thread wants it) instead of making the second
all_reduce. Through `ringleader launch` (the numpy API) and torchrun
(backend="ringleader"), the verdict must show where rank 1 is
(`rank 1 is at stacks.py:NN in load_batch: time.sleep(HOLD)`), the call sites
of both ranks, and the job must end within the timeout + 3 s of the first
all_reduce. The dumps hold the whole stacks and `ringleader analyze` prints
them."""

import json
import os
import subprocess
import time

import pytest

from conftest import PYTHON, SCRIPTS, free_port, launch, ringleader_bin, torchrun_bin

TIMEOUT = 4
SCRIPT = SCRIPTS / "stacks.py"
# Where rank 1 stays, by scenario: its function and the line's text.
CULPRIT = {
    "sleep": ("load_batch", "time.sleep(HOLD)"),
    "native": ("read_shard", "ctypes.CDLL(None).sleep(HOLD)"),
    "native_gil": ("decode_batch", "ctypes.PyDLL(None).sleep(HOLD)"),
}


def line_of(marker):
    lines = SCRIPT.read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if line.rstrip().endswith(marker))


def tagged(job, tag):
    """{rank: rest of line} for the ranks' `R<rank> <tag> ...` lines (a
    launcher may prefix them)."""
    out = {}
    for _, line in job[0].lines:
        for r in (0, 1):
            head = f"R{r} {tag} "
            if head in line:
                out[r] = line.split(head, 1)[1]
    return out


def gone(pid):
    """Whether process `pid` has ended (a zombie not yet reaped counts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def run_job(argv, tmp_path):
    """Runs the job; returns it, when its ranks had all ended and when the
    launcher exited (wall-clock times, as the ranks print theirs)."""
    env = {"TEST_TIMEOUT": str(TIMEOUT), "RINGLEADER_DUMP_DIR": str(tmp_path)}
    job = launch(argv, limit=60, env=env)
    ranks_ended = None
    while job[0].popen.poll() is None and time.monotonic() < job.start + 60:
        pids = [int(v.split()[1]) for v in tagged(job, "READY").values()]
        if ranks_ended is None and len(pids) == 2 and all(gone(p) for p in pids):
            ranks_ended = time.time()
        time.sleep(0.02)
    launcher_ended = time.time()
    job.finish()
    return job, ranks_ended or launcher_ended, launcher_ended


def check_verdict(job, where, ended):
    """The verdict shows where rank 1 is and both ranks' call sites; the
    ranks had all ended (`ended`) within the timeout + 3 s."""
    errs = {r: json.loads(v) for r, v in tagged(job, "ERROR").items()}
    assert 0 in errs, job.report()
    err = errs[0]
    msg = err["message"]
    assert err["kind"] == "missed-collective" and err["ranks"] == [1], msg
    function, text = CULPRIT[where]
    at = f"stacks.py:{line_of(f'# CULPRIT {where}')} in {function}: {text}"
    assert "\n  rank 1 is at " in msg and at in msg.split("\n  rank 1 is at ", 1)[1].splitlines()[0], msg
    # The call sites of the waiting rank and of the culprit's last call.
    assert f"rank 0 waits in it (called at " in msg, msg
    assert f"stacks.py:{line_of('# SECOND CALL')} in main)" in msg, msg
    assert f"rank 1 last completed all_reduce #1 at " in msg, msg
    assert f"stacks.py:{line_of('# FIRST CALL')} in main" in msg, msg
    ready = max(float(v.split()[0]) for v in tagged(job, "READY").values())
    took = ended - ready
    assert took < TIMEOUT + 3, f"the ranks ended {took:.1f} s after the first all_reduce\n{job.report()}"
    return msg


@pytest.mark.parametrize("where", ["sleep", "native", "native_gil"])
def test_ringleader_launch_shows_where_the_culprit_is(where, tmp_path):
    rl = ringleader_bin()
    if rl is None:
        pytest.skip("the ringleader CLI was not found (set RINGLEADER_BIN)")
    argv = [rl, "launch", "--nproc-per-node", "2", "--", PYTHON, str(SCRIPT), "numpy", where]
    job, ended, launcher_ended = run_job(argv, tmp_path)
    check_verdict(job, where, ended)
    assert launcher_ended - ended < 1, f"the launcher exited {launcher_ended - ended:.1f} s after its ranks"
    # The culprit's dump holds its whole stacks: every Python thread (the
    # GIL-waiting one too) and the native threads.
    dumps = list(tmp_path.glob("*/ringleader-rank1.json"))
    assert len(dumps) == 1, list(tmp_path.rglob("*"))
    stacks = json.loads(dumps[0].read_text())["stacks"]
    function = CULPRIT[where][0]
    main = [t for t in stacks["python"] if t["main"]]
    assert main and main[0]["frames"][0]["function"] == function, stacks
    assert stacks["native"] and any(t["main"] and t["frames"] for t in stacks["native"]), stacks
    if where == "native_gil":
        assert any(f["function"] == "wants_the_gil" for t in stacks["python"] for f in t["frames"]), stacks
    if where == "sleep":
        out = subprocess.run([rl, "analyze", str(dumps[0].parent)], capture_output=True, text=True, timeout=30)
        assert "Stacks when each rank learned that the job failed" in out.stdout, out.stdout + out.stderr
        assert f"in {function}: time.sleep(HOLD)" in out.stdout, out.stdout
        assert "native thread" in out.stdout, out.stdout


@pytest.mark.parametrize("where", ["sleep", "native", "native_gil"])
def test_torchrun_shows_where_the_culprit_is(where, tmp_path):
    pytest.importorskip("torch")
    tr = torchrun_bin()
    if tr is None:
        pytest.skip("torchrun not found")
    argv = [tr, "--nproc_per_node=2", f"--master_port={free_port()}", str(SCRIPT), "torch", where]
    job, ended, _ = run_job(argv, tmp_path)
    # torchrun's own teardown (its report of the failure) comes after the
    # ranks' end and is not ringleader's: the ranks' end is what is checked.
    msg = check_verdict(job, where, ended)
    assert "torch/" not in msg.split("rank 1 is at ", 1)[1].splitlines()[0], msg


def test_stacks_off_leaves_the_verdict_as_it_was(tmp_path):
    rl = ringleader_bin()
    if rl is None:
        pytest.skip("the ringleader CLI was not found (set RINGLEADER_BIN)")
    argv = [rl, "launch", "--nproc-per-node", "2", "--", PYTHON, str(SCRIPT), "numpy", "sleep"]
    env = {"TEST_TIMEOUT": str(TIMEOUT), "RINGLEADER_DUMP_DIR": str(tmp_path),
           "RINGLEADER_STACK_SIGNAL": "0", "RINGLEADER_NATIVE_STACK_SIGNAL": "0"}
    job = launch(argv, limit=60, env=env).finish()
    err = json.loads(tagged(job, "ERROR")[0])
    assert err["ranks"] == [1] and " is at " not in err["message"], err["message"]
    assert "py-spy dump --pid" in err["message"], err["message"]


def test_the_dump_file_is_private_and_has_no_name(monkeypatch):
    # Without memfds, the fallback: a file made with O_EXCL and mode 0600 in
    # a fresh private folder, both removed at once; only the descriptor lives.
    import stat
    import tempfile

    from ringleader import _stacks

    monkeypatch.delattr(os, "memfd_create", raising=False)
    def ours():
        return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("ringleader-stacks-")}

    before = ours()
    fd = _stacks._private_file()
    try:
        st = os.fstat(fd)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_nlink == 0, st
        assert ours() - before == set()
        os.write(fd, b"x")
        assert os.pread(fd, 1, 0) == b"x"
    finally:
        os.close(fd)


def test_a_malformed_stack_signal_names_the_variable(monkeypatch):
    from ringleader import _stacks

    for bad in ("soon", "9", "-1"):
        monkeypatch.setenv("RINGLEADER_STACK_SIGNAL", bad)
        with pytest.raises(ValueError, match="RINGLEADER_STACK_SIGNAL"):
            _stacks._signal_number()
    monkeypatch.setenv("RINGLEADER_STACK_SIGNAL", "0")
    assert _stacks._signal_number() == 0
