"""Sub-groups under torchrun, 4 ranks, backend="ringleader": hangs inside
``new_group([1, 2, 3])`` name global ranks and the group (the culprit is
global rank 3, group rank 2), arrive as PyTorch's ``DistBackendError``, and
two overlapping groups run collectives concurrently with their own
sequence numbers."""

import json

import pytest

from conftest import SCRIPTS, free_port, launch, torchrun_bin

pytest.importorskip("torch")

GROUP = "of group 1 (ranks 1-3)"


def torchrun(scenario, limit=120, monitor_interval=3, env=None):
    tr = torchrun_bin()
    if tr is None:
        pytest.skip("torchrun not found")
    # torchrun tears the job down up to this long after a rank fails; its
    # default (0.1 s) can kill the survivors of the killed rank before they
    # report. (Ranks that report an error then exit 0, so that their
    # reports never race the teardown: see scripts/subgroups.py.)
    argv = [tr, "--nproc_per_node=4", f"--master_port={free_port()}", f"--monitor-interval={monitor_interval}"]
    argv += [str(SCRIPTS / "subgroups.py"), scenario]
    return launch(argv, limit=limit, env=env).finish()


def errors(job):
    """{global rank: the error it caught} from the ranks' ERROR lines."""
    out = {}
    for _, line in job[0].lines:
        head, _, rest = line.partition(" ERROR ")
        if rest and head.startswith("R") and head[1:].isdigit():
            out[int(head[1:])] = json.loads(rest)
    return out


def assert_one_line_pointing_to_rank_1(err, op="all_reduce #2"):
    """The whole verdict is printed by one rank per host (here global rank 1,
    the lowest rank of the group on this host not to blame); the others show
    one line that points there."""
    msg = err["message"]
    assert msg.count("\n") == 0, msg
    head, _, pointer = msg.partition("; the whole verdict: ")
    name, seq = op.split()
    # A mismatch's headline reads "collective #2 ... rank 3 called all_reduce(...)".
    assert "rank 3" in head and name in head and seq in head and GROUP in head, msg
    assert pointer.startswith("rank 1's output"), msg


def assert_names_rank_3(err, job):
    msg = err["message"]
    assert err["ranks"] == [3], f"{err}\n{job[0].text}"
    assert "rank 3" in msg and GROUP in msg, msg
    # Group rank 2 is global rank 3: the headline must not blame "rank 2".
    assert "rank 2 (" not in msg.splitlines()[0], msg
    assert err["torch_types"][:1] in (["DistBackendError"], ["DistNetworkError"]), err
    assert "DistBackendError" in err["torch_types"] or "DistNetworkError" in err["torch_types"], err
    assert err["is_ringleader_error"], err


def test_skipped_collective_in_a_sub_group_names_global_rank_3():
    job = torchrun("skip")
    errs = errors(job)
    assert set(errs) == {1, 2}, job[0].text
    for r, e in errs.items():
        assert e["kind"] == "missed-collective" and e["op"] == "all_reduce", e
        assert_names_rank_3(e, job)
        assert e["elapsed"] < 10, e
    assert "ranks 1, 2 wait in it" in errs[1]["message"], errs[1]["message"]
    assert_one_line_pointing_to_rank_1(errs[2])
    assert "R3 DONE" in job[0].text and "R0 DONE" in job[0].text, job[0].text


def test_skipped_collective_of_a_live_rank_is_named_at_the_timeout():
    job = torchrun("skip_alive", env={"TEST_TIMEOUT": "5"})
    errs = errors(job)
    assert set(errs) == {1, 2}, job[0].text
    for e in errs.values():
        assert e["kind"] == "missed-collective", e
        assert_names_rank_3(e, job)
        assert 4 < e["elapsed"] < 12, e


def test_mismatch_in_a_sub_group_names_global_rank_3():
    job = torchrun("mismatch")
    errs = errors(job)
    assert set(errs) == {1, 2, 3}, job[0].text
    for e in errs.values():
        assert e["kind"] == "mismatch", e
        assert e["ranks"] == [3], e
        assert GROUP in e["message"], e["message"]
    full = errs[1]["message"]
    assert "rank 3 called all_reduce(f32 x 5" in full and "ranks 1, 2 called all_reduce(f32 x 4" in full, full
    assert_one_line_pointing_to_rank_1(errs[2])
    assert_one_line_pointing_to_rank_1(errs[3])


def test_killed_rank_in_a_sub_group_is_peer_died_naming_global_rank_3():
    job = torchrun("killed", monitor_interval=10)
    errs = errors(job)
    assert set(errs) == {1, 2}, job[0].text
    for e in errs.values():
        assert e["kind"] == "peer-died", e
        assert_names_rank_3(e, job)
        assert e["elapsed"] < 5, e


def test_monitored_barrier_in_a_sub_group_names_global_rank_3():
    job = torchrun("monitored")
    errs = errors(job)
    assert {1, 2} <= set(errs), job[0].text
    first = errs[1]["message"]
    assert "Rank 3 failed to pass monitored_barrier in 4000 ms" in first and GROUP in first, first
    assert errs[1]["ranks"] == [3], errs[1]
    assert "rank 1 reports" in errs[2]["message"], errs[2]


def test_split_group_names_global_ranks():
    job = torchrun("split")
    text = job[0].text
    for r, want in ((0, 1), (1, 1), (2, 5), (3, 5)):
        assert f"R{r} SUM {want}" in text, text
    errs = errors(job)
    assert set(errs) == {2}, text
    e = errs[2]
    assert e["kind"] == "missed-collective" and e["ranks"] == [3], e
    first = e["message"].splitlines()[0]
    assert first.startswith("[missed-collective] rank 3 (") and "(ranks 2, 3)" in first, first
    assert "rank 2 waits in it" in first, first
    assert "R0 DONE" in text and "R1 DONE" in text, text


def test_overlapping_sub_groups_run_concurrently_with_their_own_sequence_numbers():
    job = torchrun("concurrent")
    assert job[0].code == 0, job[0].text
    seqs = {}
    for _, line in job[0].lines:
        head, _, rest = line.partition(" SEQS ")
        if rest:
            seqs[int(head[1:])] = json.loads(rest)
    assert seqs == {0: {"g1": 20}, 1: {"g1": 20, "g2": 20}, 2: {"g1": 20, "g2": 20}, 3: {"g2": 20}}, job[0].text
