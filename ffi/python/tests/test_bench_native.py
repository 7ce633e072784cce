"""scripts/bench_compare.py --native end to end, small: `ringleader perf`
over both transports against bench/mpi/rl_mpi_bench.c under mpirun over
both of Open MPI's, real processes, one table, every result checked. As in
test_bench.py the numbers are not asserted; what is asserted is that every
lib measures every size asked for (barrier: its one row of size 0, on both
sides), with the same sizes, and that the raw file gets a line per repeat."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import PYTHON, ringleader_bin

BENCH = Path(__file__).resolve().parents[3] / "scripts" / "bench_compare.py"
LIBS = ["rl-perf-shm", "rl-perf-tcp", "ompi-c-sm", "ompi-c-tcp"]


def test_native_table_measures_every_lib_at_every_size(tmp_path):
    rl = ringleader_bin()
    if rl is None:
        pytest.skip("no ringleader binary (RINGLEADER_BIN)")
    if not (shutil.which("mpicc") and shutil.which("mpirun")):
        pytest.skip("no Open MPI (mpicc, mpirun)")
    out, raw = tmp_path / "rows.json", tmp_path / "raw.jsonl"
    p = subprocess.run([PYTHON, str(BENCH), "--native", "--ringleader", rl, "--nproc", "2",
                        "--ops", "all_gather", "barrier", "--sizes", "8", "1K", "--repeats", "1",
                        "--warmup", "1", "--iters", "5", "--json", str(out), "--raw", str(raw)],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads(out.read_text())["rows"]
    got = sorted((r["op"], r["bytes"]) for r in rows)
    assert got == [("all_gather", 8), ("all_gather", 1024), ("barrier", 0)], got
    for r in rows:
        for lib in LIBS:
            assert r[lib] and r[lib]["time_us"] > 0 and r[lib]["wrong"] == 0, (r["op"], r["bytes"], lib, r[lib])
        # Every lib measured it, so both ratios are there.
        assert r["shm"] and r["tcp"], r
    lines = [json.loads(line) for line in raw.read_text().splitlines()]
    repeats = [x for x in lines if x["kind"] == "repeat"]
    assert len(repeats) == 3 * 4, lines
    barrier = [x for x in repeats if x["op"] == "barrier"]
    assert sorted(x["lib_name"] for x in barrier) == sorted(LIBS), barrier
    assert all(x["bytes"] == 0 and x["check"] == "unchecked" for x in barrier), barrier
    assert lines[0]["kind"] == "run" and lines[0]["repeats"] == 1
    table = [line for line in p.stdout.splitlines() if line.startswith(("all_gather", "barrier"))]
    assert len(table) == 3 and all(line.endswith("  ok") for line in table), p.stdout
