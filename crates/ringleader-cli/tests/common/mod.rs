//! Running the built `ringleader` binary (or, for the multi-node tests, a
//! command that runs it inside a network namespace) under a hard time
//! limit, collecting what it prints: the one harness of every CLI test.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The binary under test.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_ringleader");

/// A finished run.
#[derive(Debug)]
pub(crate) struct Finished {
    /// Exit code (`None`: killed by a signal).
    pub(crate) code: Option<i32>,
    /// Everything it printed on stdout.
    pub(crate) stdout: String,
    /// Everything it printed on stderr.
    pub(crate) stderr: String,
    /// From its start to its end (or to its kill at the time limit).
    pub(crate) elapsed: Duration,
}

/// A started run whose output is being collected.
pub(crate) struct Running {
    child: Child,
    started: Instant,
    stdout: JoinHandle<String>,
    stderr: JoinHandle<String>,
    /// Each line of stdout as it comes.
    stdout_lines: Receiver<String>,
}

/// Starts `ringleader ARGS` in its own process group.
pub(crate) fn start(args: &[&str]) -> Running {
    start_env(args, &[])
}

/// Starts `ringleader ARGS` in its own process group, with the variables
/// `env` set. The settings the tests depend on (RINGLEADER_TOKEN,
/// RINGLEADER_STORE_ADDR, RINGLEADER_LOG, and the OMP_NUM_THREADS and
/// PYTHONUNBUFFERED a launcher passes on) are removed from what it
/// inherits, so only `env` sets them.
pub(crate) fn start_env(args: &[&str], env: &[(&str, &str)]) -> Running {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    for k in ["RINGLEADER_TOKEN", "RINGLEADER_STORE_ADDR", "RINGLEADER_LOG", "OMP_NUM_THREADS", "PYTHONUNBUFFERED"] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    Running::spawn(cmd)
}

impl Running {
    /// Starts `cmd` (as it is set up) in its own process group, stdin
    /// closed, collecting what it prints.
    pub(crate) fn spawn(mut cmd: Command) -> Running {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
        let mut child = cmd.spawn().expect("start a process under test");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let (tx, stdout_lines) = mpsc::channel();
        let stdout = std::thread::spawn(move || {
            let mut all = String::new();
            let mut line = String::new();
            while matches!(out.read_line(&mut line), Ok(n) if n > 0) {
                all += &line;
                let _ = tx.send(std::mem::take(&mut line));
            }
            all
        });
        let mut err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Running { child, started: Instant::now(), stdout, stderr, stdout_lines }
    }

    /// The next line it prints on stdout (without the newline), waiting at
    /// most `limit`; `None` past it or at the end of its output.
    pub(crate) fn stdout_line(&self, limit: Duration) -> Option<String> {
        self.stdout_lines.recv_timeout(limit).ok().map(|l| l.trim_end_matches('\n').to_string())
    }

    /// How long since it started.
    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` to it (not to its process group).
    pub(crate) fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    /// Stops a process that runs until told (SIGTERM to its process
    /// group), then waits for it as [`Running::finish`] does.
    pub(crate) fn terminate(self, limit: Duration) -> Finished {
        // SAFETY: kill(2) on our own child's process group.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGTERM) };
        self.finish(limit)
    }

    /// Waits at most `limit` from the start; past it, kills the process
    /// group and fails the test with what was printed so far.
    pub(crate) fn finish(self, limit: Duration) -> Finished {
        self.finish_or_stop(limit, false)
    }

    /// Lets it run for `period`, then kills its process group (for commands
    /// that run until stopped) and returns what it printed.
    pub(crate) fn stop_after(self, period: Duration) -> Finished {
        self.finish_or_stop(period, true)
    }

    fn finish_or_stop(mut self, limit: Duration, expected: bool) -> Finished {
        let deadline = self.started + limit;
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break Some(st);
            }
            if Instant::now() >= deadline {
                // SAFETY: kill(2) on our own child's process group.
                unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let elapsed = self.started.elapsed();
        let f = Finished {
            elapsed,
            code: status.and_then(|s| s.code()),
            stdout: self.stdout.join().unwrap(),
            stderr: self.stderr.join().unwrap(),
        };
        assert!(expected || status.is_some(), "still running after {limit:?}: {f:#?}");
        f
    }
}

/// Runs `ringleader ARGS` to its end, within `limit`.
pub(crate) fn run(args: &[&str], limit: Duration) -> Finished {
    start(args).finish(limit)
}

/// Runs `ringleader ARGS` with the variables `env` set (see [`start_env`])
/// to its end, within `limit`.
pub(crate) fn run_env(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Finished {
    start_env(args, env).finish(limit)
}

/// A scratch directory for one test, removed when dropped.
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Scratch {
    /// A fresh, empty directory named after the test.
    pub(crate) fn new(name: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("rl-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }

    /// The path as a string.
    pub(crate) fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }

    /// The pid a test process wrote into the file `name`.
    pub(crate) fn read_pid(&self, name: &str) -> i32 {
        std::fs::read_to_string(self.0.join(name)).unwrap_or_else(|e| panic!("{name}: {e}")).trim().parse().unwrap()
    }

    /// Waits (at most `limit`) until every file in `names` exists.
    pub(crate) fn wait_for(&self, names: &[&str], limit: Duration) {
        let deadline = Instant::now() + limit;
        while !names.iter().all(|n| self.0.join(n).exists()) {
            assert!(Instant::now() < deadline, "{names:?} did not appear");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether `pid` is a live process (a zombie counts as gone).
pub(crate) fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
    }
}

/// Waits (at most 2 s) for `pid` to be gone; its reaping can lag its death.
pub(crate) fn gone_soon(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    while alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}
