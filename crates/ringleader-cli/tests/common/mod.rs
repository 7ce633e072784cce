//! Running the built `ringleader` binary under a hard time limit, shared by
//! the analyze, status and perf tests.

#![allow(dead_code)]

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
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
}

/// A started run whose output is being collected.
pub(crate) struct Running {
    child: Child,
    started: Instant,
    stdout: JoinHandle<String>,
    stderr: JoinHandle<String>,
}

/// Starts `ringleader ARGS` in its own process group.
pub(crate) fn start(args: &[&str]) -> Running {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("RINGLEADER_TOKEN")
        .process_group(0)
        .spawn()
        .expect("start ringleader");
    let collect = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let stdout = collect(Box::new(child.stdout.take().unwrap()));
    let stderr = collect(Box::new(child.stderr.take().unwrap()));
    Running { child, started: Instant::now(), stdout, stderr }
}

impl Running {
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
        let f = Finished {
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
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
