"""Hangs and failures through the Python API: the error class, its fields
(.kind, .ranks, .seq, .op) and how fast it arrives; Ctrl-C interrupting a
blocked collective; explicit init without torchrun's variables."""

import json
import os
import signal
import subprocess
import time

from conftest import PYTHON, SCRIPTS, Job, _start, base_env, free_port, run, spawn


def error_of(proc):
    for _, line in proc.lines:
        if line.startswith("ERROR "):
            return json.loads(line[6:])
    return None


def test_skipped_collective_names_rank_and_op():
    job = run("failures.py", args=["skip"], limit=60)
    err = error_of(job[0])
    assert err, job.report()
    assert err["cls"] == "MissedCollectiveError" and err["kind"] == "missed-collective", err
    assert err["ranks"] == [1] and err["op"] == "all_reduce" and err["seq"] == 2, err
    assert err["is_runtime_error"], err
    assert err["message"].startswith("[missed-collective]") and "rank 1" in err["message"], err
    assert err["elapsed"] < 5, f"took {err['elapsed']:.1f} s, the timeout is 20 s"
    assert job[0].code == 3 and job[1].code == 0, job.report()


def _line_of(marker):
    lines = (SCRIPTS / "failures.py").read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if line.rstrip().endswith(marker))


def test_the_verdict_names_the_call_sites_of_the_waiting_and_the_absent_rank():
    job = run("failures.py", args=["sleep_in_function"], env={"TEST_TIMEOUT": "3"}, limit=60)
    err = error_of(job[0])
    assert err and err["kind"] == "missed-collective" and err["ranks"] == [1], job.report()
    first, second = _line_of("# FIRST CALL"), _line_of("# SECOND CALL")
    msg = err["message"]
    assert "rank 1 last completed all_reduce #1 at " in msg and f"failures.py:{first} in main" in msg, msg
    assert "rank 0 waits in it (called at " in msg and f"failures.py:{second} in main)" in msg, msg


def test_async_wait_raises_the_verdict():
    job = run("failures.py", args=["async_skip"], limit=60)
    err = error_of(job[0])
    assert err and err["kind"] == "missed-collective" and err["ranks"] == [1], job.report()


def test_a_panic_in_the_engine_is_an_internal_error_on_every_rank():
    job = run("failures.py", args=["panic"], limit=60)
    for p in job.procs:
        err = error_of(p)
        assert err, job.report()
        assert err["cls"] == "InternalError" and err["kind"] == "internal", err
        assert err["ranks"] == [1] and err["op"] == "all_reduce" and err["seq"] == 3, err
        assert "injected fault" in err["message"], err
        assert any(l == "WAITED ok internal internal" for _, l in p.lines), job.report()
        assert any(l == "FREED" for _, l in p.lines), job.report()
        assert p.code == 3, job.report()


def test_destroy_while_another_thread_is_inside_all_reduce(tmp_path):
    job = run("failures.py", args=["destroy_race"], limit=60, env={"TEST_MARK": str(tmp_path / "done")})
    job.assert_ok()
    line = next((l for _, l in job[1].lines if l.startswith("DESTROYED ")), None)
    assert line, job.report()
    d = json.loads(line[len("DESTROYED "):])
    assert d["took"] < 10, d
    assert not d["alive_after_destroy"], d  # destroy returned only once the call had ended
    assert d["cls"] == "AbortedError" and "destroyed while an operation ran" in d["message"], d
    assert any(l == "LATER AbortedError" for _, l in job[1].lines), job.report()


def test_mismatched_shapes_fail_at_once():
    job = run("failures.py", args=["mismatch"], limit=60)
    errs = [error_of(p) for p in job.procs]
    assert all(errs), job.report()
    for e in errs:
        assert e["cls"] == "MismatchError" and e["kind"] == "mismatch" and e["op"] == "all_reduce", e
        assert e["elapsed"] < 5, e


def test_killed_rank_is_peer_died():
    job = run("failures.py", args=["killed"], limit=60)
    err = error_of(job[0])
    assert err, job.report()
    assert err["cls"] == "PeerDiedError" and err["ranks"] == [1], err
    assert err["elapsed"] < 5, err
    assert job[1].code == -signal.SIGKILL


def test_ctrl_c_interrupts_a_blocked_collective():
    job = spawn("failures.py", args=["sigint"], limit=60)
    deadline = time.monotonic() + 30
    while job[0].first("BLOCKING") is None:
        assert time.monotonic() < deadline, job.report()
        time.sleep(0.05)
    time.sleep(0.5)  # let it enter the all_reduce
    sent = time.monotonic() - job.start
    os.kill(job[0].popen.pid, signal.SIGINT)
    job.finish()
    got = job[0].first("KEYBOARD_INTERRUPT")
    assert got is not None, job.report()
    assert got - sent < 3, f"KeyboardInterrupt {got - sent:.1f} s after SIGINT"
    assert job[0].code == 4, job.report()


def test_explicit_init_with_a_python_hosted_store():
    port = free_port()
    start = time.monotonic()
    procs = [_start([PYTHON, str(SCRIPTS / "explicit_init.py"), str(r), "3", str(port)], base_env(), f"rank {r}", start)
             for r in range(3)]
    job = Job(procs, 60, start).finish()
    job.assert_ok()
    for r, p in enumerate(job.procs):
        assert f"OK rank {r} of 3" in p.text, job.report()


def test_init_errors_are_typed():
    env = base_env({"RANK": "0", "WORLD_SIZE": "two", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"})
    code = (
        "import ringleader\n"
        "try:\n"
        "    ringleader.init()\n"
        "except ringleader.InvalidArgumentError as e:\n"
        "    print('KIND', e.kind, 'WORLD_SIZE' in str(e), isinstance(e, ValueError))\n"
    )
    start = time.monotonic()
    job = Job([_start([PYTHON, "-c", code], env, "init", start)], 30, start).finish()
    assert "KIND invalid-argument True True" in job[0].text, job.report()


def test_a_group_collected_while_the_live_lock_is_held_does_not_deadlock():
    # The collector runs a garbage group's finalizer on whichever thread
    # allocates; at exit that thread holds the live-group lock while it
    # copies the set. A finalizer that took the lock too hung the process
    # (a group caught in an exception's reference cycle, at exit).
    code = (
        "import gc, ringleader\n"
        "pg = ringleader.init(rank=0, world_size=1, master_addr='127.0.0.1', master_port=int(__import__('sys').argv[1]))\n"
        "pg.cycle = pg\n"
        "del pg\n"
        "with ringleader._live_lock:\n"
        "    gc.collect()\n"
        "print('COLLECTED', flush=True)\n"
    )
    r = subprocess.run([PYTHON, "-c", code, str(free_port())], capture_output=True, text=True, timeout=60,
                       env=base_env())
    assert r.returncode == 0 and "COLLECTED" in r.stdout, (r.returncode, r.stdout, r.stderr)
