"""scripts/bench_compare.py --python and --torch end to end, small: the
like-for-like tables next to --native's. --python: ringleader's Python API
under `ringleader launch` over both transports against mpi4py under mpirun
over both of Open MPI's; --torch: torch.distributed under torchrun, backend
"ringleader" over both transports against "gloo". Real processes, 2 ranks,
sizes 8 and 4096, one launch per (lib, op), every result checked. As in
test_bench_native.py the numbers are not asserted; what is asserted is that
every lib measured every op at every size asked for (barrier: its one row of
size 0), each result was checked and right, and the table says so."""

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import PYTHON, ringleader_bin, torchrun_bin

BENCH = Path(__file__).resolve().parents[3] / "scripts" / "bench_compare.py"
PY_LIBS = ["rl-py-shm", "rl-py-tcp", "ompi-py-sm", "ompi-py-tcp"]
TORCH_LIBS = ["rl-torch-shm", "rl-torch-tcp", "gloo-torch"]
# 2 ranks, sizes 8 and 4096: all_gather's 8 B is one element per rank, so
# every op has both sizes; barrier has its one row.
CELLS = sorted([(op, b) for op in ("all_reduce", "all_gather", "broadcast", "reduce_scatter") for b in (8, 4096)]
               + [("barrier", 0)])


def need(module, why):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed in {PYTHON} ({why})")


def run_table(tmp_path, flag, limit, extra=()):
    rl = ringleader_bin()
    if rl is None:
        pytest.skip("no ringleader binary (RINGLEADER_BIN)")
    out, raw = tmp_path / "rows.json", tmp_path / "raw.jsonl"
    p = subprocess.run([PYTHON, str(BENCH), flag, "--ringleader", rl, "--nproc", "2", "--sizes", "8", "4096",
                        "--repeats", "1", "--warmup", "1", "--iters", "5", "--interleave", "sweep",
                        "--timeout", "120", "--json", str(out), "--raw", str(raw), *extra],
                       capture_output=True, text=True, timeout=limit)
    assert p.returncode == 0, p.stdout + p.stderr
    assert_raw_reprints_the_table(raw, p.stdout)
    return json.loads(out.read_text()), p.stdout, raw


def assert_states_pick_their_launches(raw):
    """--vcpu-probe kept both probes in every launch's rows; --from-raw
    --state keeps exactly the rows whose two probes are on its side of
    200 ns, and says how many it left out."""
    rows = [json.loads(x) for x in raw.read_text().splitlines() if x.strip()]
    reps = [r for r in rows if r.get("kind") == "repeat"]
    assert reps and all(r["probe_before_ns"] > 0 and r["probe_after_ns"] > 0 for r in reps), reps
    assert next(r for r in rows if r.get("kind") == "run")["vcpu_probe"] is True
    near = [r for r in reps if max(r["probe_before_ns"], r["probe_after_ns"]) < 200]
    apart = [r for r in reps if min(r["probe_before_ns"], r["probe_after_ns"]) >= 200]
    for state, keep in (("near", near), ("apart", apart)):
        p = subprocess.run([PYTHON, str(BENCH), "--from-raw", str(raw), "--state", state],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
        assert f"--state {state}: {len(reps) - len(keep)} rows of other or changing states left out" in p.stdout, \
            (state, len(reps), len(keep), p.stdout)


def table_lines(stdout):
    return [line for line in stdout.splitlines() if line.split(" ", 1)[0] in {op for op, _ in CELLS}]


def assert_raw_reprints_the_table(raw, stdout):
    """--from-raw on the run's raw file prints the run's own rows, launching nothing."""
    p = subprocess.run([PYTHON, str(BENCH), "--from-raw", str(raw)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "repeats 1-1 of 1" in p.stdout, p.stdout
    assert table_lines(p.stdout) == table_lines(stdout), (p.stdout, stdout)


def assert_every_cell_checked(result, stdout, table, libs):
    rows = result["tables"][table]
    assert sorted((r["op"], r["bytes"]) for r in rows) == CELLS, rows
    assert not result["failed"], result["failed"]
    for r in rows:
        for lib in libs:
            c = r[lib]
            assert c and c["time_us"] > 0, (r["op"], r["bytes"], lib, c)
            assert c["wrong"] == 0, (r["op"], r["bytes"], lib, c)
            want = "unchecked" if r["op"] == "barrier" else "ok"
            assert c["checks"] == [want], (r["op"], r["bytes"], lib, c)
        # Every lib measured it, so both ratios are there.
        assert r["shm"] and r["tcp"], r
    lines = table_lines(stdout)
    assert len(lines) == len(CELLS) and all(line.endswith("  ok") for line in lines), stdout
    assert f"# {table}: median [min-max] of 1 launch(es)" in stdout, stdout


def test_python_table_measures_and_checks_every_cell(tmp_path):
    need("numpy", "the Python table's buffers")
    need("mpi4py", "pip install mpi4py: the Python table's Open MPI side")
    if not shutil.which("mpirun"):
        pytest.skip("no Open MPI (mpirun)")
    import os

    probe = ["--vcpu-probe"] if (os.cpu_count() or 1) >= 2 else []
    result, stdout, raw = run_table(tmp_path, "--python", limit=300, extra=probe)
    assert_every_cell_checked(result, stdout, "python", PY_LIBS)
    row = next(r for r in result["tables"]["python"] if r["op"] == "all_reduce")
    assert row["rl-py-shm"]["lib_version"].startswith("ringleader "), row
    # bench_compare builds the numpy API's C lane into the tree it runs.
    assert row["rl-py-shm"]["lib_version"].endswith(", C lane)"), row
    if probe:
        assert_states_pick_their_launches(raw)
    assert row["ompi-py-sm"]["lib_version"].startswith("Open MPI"), row


def test_torch_table_measures_and_checks_every_cell(tmp_path):
    need("torch", "the torch table")
    if torchrun_bin() is None:
        pytest.skip("no torchrun")
    result, stdout, _ = run_table(tmp_path, "--torch", limit=600)
    assert_every_cell_checked(result, stdout, "torch", TORCH_LIBS)
    row = next(r for r in result["tables"]["torch"] if r["op"] == "all_reduce")
    assert row["rl-torch-shm"]["lib_version"].startswith("ringleader "), row
    assert row["gloo-torch"]["lib_version"].startswith("gloo "), row
