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


def test_stability_lines_count_the_raw_launches(tmp_path):
    """Issue 20's third item, as the table reports it: for every library, how
    many cells from 1 MiB up have every launch within 1.5x of the fastest.
    The counts must be those of the raw rows (worked out here), the same
    live and from the raw file, and a cell over 1.5x must be named."""
    import re

    rl = ringleader_bin()
    if rl is None:
        pytest.skip("no ringleader binary (RINGLEADER_BIN)")
    if not (shutil.which("mpicc") and shutil.which("mpirun")):
        pytest.skip("no Open MPI (mpicc, mpirun)")
    raw = tmp_path / "raw.jsonl"
    p = subprocess.run([PYTHON, str(BENCH), "--native", "--ringleader", rl, "--nproc", "2",
                        "--ops", "all_gather", "--sizes", "8", "1M", "--repeats", "3",
                        "--warmup", "1", "--iters", "5", "--raw", str(raw)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    line = re.compile(r"# stable \((\S+)\): (\d+) of (\d+) cells from 1M up.*?(?:; over: (.*))?$")
    got = {m.group(1): m for m in map(line.match, p.stdout.splitlines()) if m}
    assert sorted(got) == sorted(LIBS), p.stdout
    repeats = [json.loads(x) for x in raw.read_text().splitlines()]
    for lib in LIBS:
        times = [x["time_us"] for x in repeats if x.get("kind") == "repeat" and x["lib_name"] == lib
                 and x["bytes"] == 1 << 20]
        assert len(times) == 3, (lib, times)
        within = max(times) / min(times) <= 1.5
        m = got[lib]
        # One cell from 1 MiB up (8 B is not counted).
        assert (int(m.group(2)), int(m.group(3))) == (int(within), 1), (lib, times, m.group(0))
        assert (m.group(4) is None) == within, (lib, times, m.group(0))
        if not within:
            assert f"all_gather 2r 1M {max(times) / min(times):.2f}x" in m.group(4), (times, m.group(0))
    again = subprocess.run([PYTHON, str(BENCH), "--from-raw", str(raw)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [x for x in again.stdout.splitlines() if x.startswith("# stable")] == \
        [x for x in p.stdout.splitlines() if x.startswith("# stable")], again.stdout
