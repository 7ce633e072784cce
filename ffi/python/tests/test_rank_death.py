"""No fate shared with rank 0: kill -9 of a rank (rank 0 included, whose
process started the job's store) during all_reduces ends, on every survivor,
in peer-died naming it within 2 s: under torchrun with backend="ringleader"
over shared memory and over TCP, and with ranks started by hand."""

import json
import os
import signal
import time

import pytest

from conftest import SCRIPTS, free_port, launch, spawn, torchrun_bin

pytest.importorskip("torch")

DEADLINE_S = 2.0


def wait_for(job, predicate, limit=60):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    job.kill()
    pytest.fail(f"timed out waiting\n{job.report()}")


def lines(job):
    return [l for p in job.procs for _, l in p.lines]


def pid_of(job, rank):
    for l in lines(job):
        if l.startswith(f"R{rank} PID "):
            return int(l.split()[2])
    return None


def ready(job, world):
    return sum(1 for l in lines(job) if l.endswith(" READY")) >= world


def errors(job):
    out = {}
    for l in lines(job):
        head, _, rest = l.partition(" ERROR ")
        if rest and head.startswith("R") and head[1:].isdigit():
            out[int(head[1:])] = json.loads(rest)
    return out


def kill_and_check(job, victim, world):
    wait_for(job, lambda: ready(job, world))
    pid = wait_for(job, lambda: pid_of(job, victim))
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)
    survivors = set(range(world)) - {victim}
    wait_for(job, lambda: set(errors(job)) >= survivors, limit=30)
    job.finish()
    for r, e in errors(job).items():
        assert e["kind"] == "peer-died", f"rank {r}: {e}\n{job.report()}"
        assert e["ranks"] == [victim], f"rank {r}: {e}"
        # One rank per host prints the whole verdict, the others one line.
        first = e["message"].splitlines()[0]
        assert f"rank {victim} (" in first, first
        delay = e["time"] - t_kill
        assert delay < DEADLINE_S, f"rank {r} named rank {victim} {delay:.2f} s after the kill\n{e['message']}"
    return max(e["time"] - t_kill for e in errors(job).values())


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_torchrun_kill_rank_0(transport):
    tr = torchrun_bin()
    if tr is None:
        pytest.skip("torchrun not found")
    # torchrun tears the job down --monitor-interval after a rank dies
    # (default 0.1 s): 30 s leaves the survivors time to report.
    argv = [tr, "--nproc_per_node=4", f"--master_port={free_port()}", "--monitor-interval=30",
            str(SCRIPTS / "rank_death.py"), "torch"]
    job = launch(argv, limit=120, env={"RINGLEADER_TRANSPORT": transport})
    kill_and_check(job, 0, 4)


@pytest.mark.parametrize("victim", [0, 2])
def test_hand_started_ranks_kill(victim):
    job = spawn("rank_death.py", world=4, limit=120, args=["torch"])
    kill_and_check(job, victim, 4)


def test_hand_started_numpy_ranks_kill_rank_0():
    # ringleader's own API without a launcher: rank 0 hosts the store in its
    # own process; its death is seen through the lost store and, over
    # shared memory, through the peers' pidfds.
    job = spawn("rank_death.py", world=4, limit=120, args=["numpy"])
    kill_and_check(job, 0, 4)
