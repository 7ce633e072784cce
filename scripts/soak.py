#!/usr/bin/env python3
"""Reliability soak: real jobs, real faults, counted.

1. ``kill``: N trials per launcher (``ringleader launch`` and torchrun), 4
   ranks of scripts/soak_worker.py looping over mixed collectives; after a
   random moment one random rank (rank 0 included) gets SIGKILL. A trial
   passes when every survivor reports ``peer-died`` naming the dead rank
   within 2 s of the kill; a trial in which a survivor says nothing within
   30 s is a hang.
2. ``stop``: N trials of SIGSTOP on a random rank, with a 5 s collective
   timeout: every other rank must report ``peer-stalled`` naming it, within
   the timeout + 3 s.
3. ``long``: 4 ranks loop for SECONDS; each samples its RSS, open fds and
   /dev/shm every 15 s. Passes with 0 errors, RSS within 10% (or 8 MiB) of
   its value after the first minute, and the same fds and /dev/shm at the
   end as after the first minute.

Usage: scripts/soak.py [--kill N] [--stop N] [--long SECONDS] [--out FILE]
(defaults: 100, 20, 600). Needs the venv of scripts/lib.sh with this
checkout's package installed, and target/release/ringleader. Prints one line
per trial and a summary; exits 1 if anything failed.
"""

import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "scripts" / "soak_worker.py"
VENV = Path(os.environ.get("RINGLEADER_VENV", Path.home() / ".cache/ringleader/venv"))
PY = VENV / "bin" / "python"
TORCHRUN = VENV / "bin" / "torchrun"
RL = ROOT / "target" / "release" / "ringleader"
WORLD = 4
LINE = re.compile(r"^(?:\[rank\d+\]: )?R(\d+) ([A-Z]+)(?: (.*))?$")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """A launcher and its ranks, in a process group of their own, output collected."""

    def __init__(self, launcher, mode_args, env=None):
        if launcher == "torchrun":
            argv = [str(TORCHRUN), f"--nproc_per_node={WORLD}", f"--master_port={free_port()}",
                    "--monitor-interval=30", str(WORKER), *mode_args]
        else:
            argv = [str(RL), "launch", "--nproc-per-node", str(WORLD), "--", str(PY), str(WORKER), *mode_args]
        e = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(env or {}))
        for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RINGLEADER_STORE_ADDR"):
            e.pop(k, None)
        e["PATH"] = f"{VENV / 'bin'}:{e['PATH']}"
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  errors="replace", start_new_session=True, env=e)
        self.lines = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def tagged(self, tag):
        """{rank: [rest, ...]} of the lines `R<rank> <tag> <rest>` (ringleader
        launch prefixes each line with `[rankN]: `)."""
        out = {}
        for line in list(self.lines):
            m = LINE.match(line)
            if m and m.group(2) == tag:
                out.setdefault(int(m.group(1)), []).append(m.group(3) or "")
        return out

    def wait_for(self, cond, limit):
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if cond():
                return True
            if self.p.poll() is not None and not cond():
                time.sleep(0.2)
                return cond()
            time.sleep(0.02)
        return False

    def kill(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        # Ranks of torchrun and ringleader launch are in process groups of their own.
        for pids in self.tagged("PID").values():
            try:
                os.kill(int(pids[0]), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        self.p.wait()
        self.t.join(timeout=5)

    def tail(self, n=30):
        return "\n".join(self.lines[-n:])


def fault_trial(launcher, sig, rng):
    """One trial; returns (ok, what happened)."""
    timeout = "5" if sig == signal.SIGSTOP else "60"
    job = Job(launcher, ["until-failure"], env={"SOAK_TIMEOUT": timeout})
    try:
        if not job.wait_for(lambda: len(job.tagged("READY")) == WORLD, 120):
            return False, f"the job did not start\n{job.tail()}"
        victim = rng.randrange(WORLD)
        time.sleep(rng.uniform(0, 1.5))
        pid = int(job.tagged("PID")[victim][0])
        t0 = time.time()
        os.kill(pid, sig)
        survivors = set(range(WORLD)) - {victim}
        limit = 30 if sig == signal.SIGKILL else float(timeout) + 30
        if not job.wait_for(lambda: survivors <= set(job.tagged("ERROR")), limit):
            return False, f"HANG: rank {victim} got {sig.name}; reports from {sorted(job.tagged('ERROR'))}\n{job.tail()}"
        want_kind, bound = ("peer-died", 2.0) if sig == signal.SIGKILL else ("peer-stalled", float(timeout) + 3)
        worst = 0.0
        for r in sorted(survivors):
            e = json.loads(job.tagged("ERROR")[r][0])
            delay = e["time"] - t0
            worst = max(worst, delay)
            if e["kind"] != want_kind or e["ranks"] != [victim] or delay > bound:
                return False, f"rank {r} after {sig.name} of rank {victim}: {e['kind']} {e['ranks']} in {delay:.2f} s: {e['headline']}"
        return True, f"rank {victim} {sig.name}: named by every survivor, slowest {worst:.2f} s"
    finally:
        if sig == signal.SIGSTOP:
            for pids in job.tagged("PID").values():
                try:
                    os.kill(int(pids[0]), signal.SIGCONT)
                except (ProcessLookupError, ValueError):
                    pass
        job.kill()


def long_run(seconds):
    job = Job("ringleader", ["for", str(seconds)])
    ok = job.wait_for(lambda: len(job.tagged("DONE")) == WORLD or job.tagged("ERROR"), seconds + 180)
    job.p.wait(timeout=60) if ok else None
    job.kill()
    errors = job.tagged("ERROR")
    report = []
    passed = ok and not errors and len(job.tagged("DONE")) == WORLD
    for r, samples in sorted(job.tagged("SAMPLE").items()):
        s = [json.loads(x) for x in samples]
        base = next((x for x in s if x["time"] - s[0]["time"] >= 60), s[0])
        last = s[-1]
        growth = last["rss_kb"] - base["rss_kb"]
        rss_ok = growth <= max(0.10 * base["rss_kb"], 8192)
        same = (last["fds"], last["shm_files"], last["shm_bytes"]) == (base["fds"], base["shm_files"], base["shm_bytes"])
        passed &= rss_ok and same
        report.append(
            f"rank {r}: {last['steps']} steps; RSS {base['rss_kb'] / 1024:.1f} -> {last['rss_kb'] / 1024:.1f} MiB "
            f"(after 1 min -> end), fds {base['fds']} -> {last['fds']}, /dev/shm {base['shm_files']} files "
            f"{base['shm_bytes'] >> 20} MiB -> {last['shm_files']} files {last['shm_bytes'] >> 20} MiB"
        )
    if errors:
        report.append(f"errors: {errors}")
    if not ok:
        report.append(f"did not finish\n{job.tail()}")
    return passed, report


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kill", type=int, default=100, help="SIGKILL trials per launcher")
    ap.add_argument("--stop", type=int, default=20, help="SIGSTOP trials")
    ap.add_argument("--long", type=int, default=600, help="seconds of the long run (0: skip)")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--out", type=Path, help="also append every line to this file")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    out = open(args.out, "a") if args.out else None

    def log(line):
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    log(f"# soak at {time.strftime('%Y-%m-%d %H:%M:%S')}, seed {args.seed}, {WORLD} ranks")
    failed = 0
    for launcher in ("ringleader", "torchrun"):
        good = 0
        for i in range(args.kill):
            ok, what = fault_trial(launcher, signal.SIGKILL, rng)
            good += ok
            log(f"kill {launcher} {i + 1}/{args.kill}: {'ok' if ok else 'FAIL'}: {what}")
        failed += args.kill - good
        log(f"## kill -9 under {launcher}: {good}/{args.kill} named within 2 s")
    good = 0
    for i in range(args.stop):
        launcher = ("ringleader", "torchrun")[i % 2]
        ok, what = fault_trial(launcher, signal.SIGSTOP, rng)
        good += ok
        log(f"stop {launcher} {i + 1}/{args.stop}: {'ok' if ok else 'FAIL'}: {what}")
    failed += args.stop - good
    log(f"## SIGSTOP: {good}/{args.stop} named at the timeout")
    if args.long:
        ok, report = long_run(args.long)
        for line in report:
            log(f"long: {line}")
        log(f"## {args.long} s of mixed collectives: {'ok' if ok else 'FAIL'}")
        failed += not ok
    log(f"# {'all passed' if not failed else f'{failed} failed'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
