"""scripts/bench_compare.py end to end, small: ringleader over both
transports and gloo, real processes, one table, every result checked. The
performance numbers themselves are not asserted (a 2-core VM is too noisy
for that); what is asserted is that the comparison runs, measures every lib
at every size asked for, and verifies ringleader's results."""

import json
import subprocess
from pathlib import Path

import pytest

from conftest import PYTHON, ringleader_bin

pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[3] / "scripts" / "bench_compare.py"
LIBS = ["rl-shm", "rl-tcp", "gloo"]


def bench(*args, limit=150):
    rl = ringleader_bin()
    if rl is None:
        pytest.skip("no ringleader binary (RINGLEADER_BIN)")
    return subprocess.run([PYTHON, str(BENCH), "--ringleader", rl, *args], capture_output=True,
                          text=True, timeout=limit)


def test_a_size_list_is_measured_by_every_lib_and_checked(tmp_path):
    out = tmp_path / "rows.json"
    p = bench("--libs", *LIBS, "--nproc", "2", "--ops", "all_reduce", "all_gather",
              "--sizes", "64K,8", "1K", "--repeats", "1", "--warmup", "1", "--iters", "5", "--json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads(out.read_text())["rows"]
    got = sorted((r["op"], r["bytes"]) for r in rows)
    assert got == sorted((op, b) for op in ("all_reduce", "all_gather") for b in (8, 1024, 65536)), got
    for r in rows:
        for lib in LIBS:
            assert r[lib] and r[lib]["time_us"] > 0, (r["op"], r["bytes"], lib, r[lib])
        assert r["rl-shm"]["wrong"] == 0 and r["rl-tcp"]["wrong"] == 0, r
    table = [line for line in p.stdout.splitlines() if line.startswith(("all_reduce", "all_gather"))]
    assert len(table) == 6 and all(line.endswith("  ok") for line in table), p.stdout


def test_a_size_list_and_a_sweep_together_are_refused():
    p = bench("--sizes", "8", "1M", "-e", "64M", limit=60)
    assert p.returncode == 2 and "--sizes replaces -b/-e/-f" in p.stderr, p.stdout + p.stderr
