"""Multi-process harness: every rank is a real Python process running a
script from tests/scripts, with the environment torchrun would give it.
Every job has a hard time limit after which all its processes are killed
and the test fails. Output lines are timestamped as they arrive, so tests
can check how fast an error came."""

import ast
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import pytest

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    """One process of a job and what it printed (stdout and stderr merged)."""

    popen: subprocess.Popen
    label: str
    lines: List[tuple] = field(default_factory=list)  # (seconds since job start, line)
    reader: Optional[threading.Thread] = None

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    @property
    def code(self) -> Optional[int]:
        return self.popen.returncode

    def first(self, needle: str) -> Optional[float]:
        """When the first line containing ``needle`` arrived (seconds since the job started)."""
        for t, line in self.lines:
            if needle in line:
                return t
        return None


class Job:
    """Processes started together and finished under one hard limit."""

    def __init__(self, procs: List[Proc], limit: float, start: float):
        self.procs, self.limit, self.start = procs, limit, start

    def __getitem__(self, i) -> Proc:
        return self.procs[i]

    def finish(self) -> "Job":
        deadline = self.start + self.limit
        for p in self.procs:
            left = deadline - time.monotonic()
            try:
                p.popen.wait(timeout=max(0.0, left))
            except subprocess.TimeoutExpired:
                stacks = self.stacks()
                self.kill()
                pytest.fail(f"job exceeded its hard limit of {self.limit} s; killed every process\n{self.report()}"
                            f"{stacks}")
        for p in self.procs:
            p.reader.join(timeout=5)
        return self

    def stacks(self) -> str:
        """Where each process still running is, every thread's native stack
        (gdb, where installed: at most 20 s each), for a job about to be
        killed at its hard limit: a hang is then explained in the failure."""
        gdb = shutil.which("gdb")
        if gdb is None:
            return ""
        out = []
        for p in self.procs:
            if p.popen.poll() is not None:
                continue
            try:
                r = subprocess.run([gdb, "-p", str(p.popen.pid), "-batch", "-ex", "thread apply all bt 25"],
                                   capture_output=True, text=True, timeout=20)
                frames = [l for l in r.stdout.splitlines() if l.startswith(("#", "Thread "))]
                out.append(f"--- {p.label} (pid {p.popen.pid}), native stacks:\n" + "\n".join(frames[:200]))
            except (subprocess.TimeoutExpired, OSError) as e:
                out.append(f"--- {p.label}: no stacks ({e})")
        return ("\n" + "\n".join(out)) if out else ""

    def kill(self):
        for p in self.procs:
            if p.popen.poll() is None:
                try:
                    os.killpg(p.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            p.popen.wait()
            p.reader.join(timeout=5)

    def report(self) -> str:
        return "\n".join(f"--- {p.label} (exit {p.code}):\n{p.text}" for p in self.procs)

    def assert_ok(self):
        assert all(p.code == 0 for p in self.procs), f"some processes failed:\n{self.report()}"


def _start(argv, env, label, start) -> Proc:
    popen = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,  # its own process group: the hard limit kills launchers' children too
    )
    proc = Proc(popen, label)

    def read():
        for line in popen.stdout:
            proc.lines.append((time.monotonic() - start, line.rstrip("\n")))

    proc.reader = threading.Thread(target=read, daemon=True)
    proc.reader.start()
    return proc


def base_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "RINGLEADER_STORE_ADDR", "RINGLEADER_RUN_ID", "TORCHELASTIC_RUN_ID"):
        env.pop(k, None)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SCRIPTS), env.get("PYTHONPATH")]))
    env.setdefault("RINGLEADER_INIT_TIMEOUT", "60")
    env.setdefault("OMP_NUM_THREADS", "1")
    if extra:
        env.update(extra)
    return env


def spawn(script: str, world: int = 2, limit: float = 90, env=None, rank_env=None, args=()) -> Job:
    """Starts ``world`` ranks of tests/scripts/<script> with torchrun's variables (rank 0 hosts the stores)."""
    port = free_port()
    start = time.monotonic()
    procs = []
    for rank in range(world):
        e = base_env(env)
        e.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if rank_env:
            e.update(rank_env(rank))
        procs.append(_start([PYTHON, str(SCRIPTS / script), *args], e, f"rank {rank}", start))
    return Job(procs, limit, start)


def launch(argv: List[str], limit: float = 90, env=None) -> Job:
    """Runs one launcher command (torchrun, ringleader launch) as a job."""
    start = time.monotonic()
    return Job([_start(argv, base_env(env), "launcher", start)], limit, start)


def run(script: str, **kw) -> Job:
    return spawn(script, **kw).finish()


def ringleader_bin() -> Optional[str]:
    """The `ringleader` CLI: $RINGLEADER_BIN, else on PATH."""
    return os.environ.get("RINGLEADER_BIN") or shutil.which("ringleader")


def torchrun_bin() -> Optional[str]:
    cand = Path(PYTHON).parent / "torchrun"
    return str(cand) if cand.exists() else shutil.which("torchrun")


def parse_checks(proc: Proc) -> Dict[str, str]:
    """PASS/FAIL lines of a checks script: name -> '' (passed) or the failure text."""
    results: Dict[str, str] = {}
    for _, line in proc.lines:
        if line.startswith("PASS "):
            results[line[5:].strip()] = ""
        elif line.startswith("FAIL "):
            name, _, why = line[5:].partition(": ")
            results[name.strip()] = why or "failed"
    return results


def check_names(script: str) -> List[str]:
    """Names of the @check functions in tests/scripts/<script>, read without importing it."""
    tree = ast.parse((SCRIPTS / script).read_text())
    return [f.name for f in tree.body if isinstance(f, ast.FunctionDef)
            and any(getattr(d, "id", None) == "check" for d in f.decorator_list)]


def assert_check_passed(job: Job, name: str):
    """Every process of ``job`` ran check ``name`` and it passed."""
    for p in job.procs:
        results = parse_checks(p)
        assert name in results, f"{p.label} did not run {name}:\n{job.report()}"
        assert results[name] == "", f"{p.label}: {name}: {results[name]}\n{job.report()}"
