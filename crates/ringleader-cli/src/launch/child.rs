//! Starting one rank: its process, its output threads and its exit watcher.
//!
//! Each rank runs
//! - in its own process group, so a signal to the group reaches whatever the
//!   rank started;
//! - with stdin from `/dev/null`: a rank outside the terminal's foreground
//!   group that read the terminal would be stopped by SIGTTIN, a silent hang;
//! - with no signal blocked (the launcher blocks SIGINT, SIGTERM and SIGHUP);
//! - with stdout and stderr piped to two [`output`](super::output) threads;
//! - with SIGKILL as its parent-death signal, so that ranks do not outlive a
//!   launcher that was itself killed. (It fires when the thread that spawned
//!   the rank ends; ranks are spawned from the main thread, which lives
//!   until the launcher exits.)
//!
//! A third thread waits for the process to end with `waitid(WEXITED |
//! WNOWAIT)`: that reports the ending but leaves the process a zombie, which
//! keeps its pid, and so its process group id, from being reused until the
//! supervisor reaps it at the very end. Signalling the group of a rank that
//! has already ended is therefore always safe.

use super::ending::Ending;
use super::event::Event;
use super::output::{forward_lines, Repeats, Sink};
use crate::error::{CliError, Result};
use rustix::process::{Pid, WaitId, WaitIdOptions};
use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Sender;
use std::sync::Arc;

/// A started rank.
#[derive(Debug)]
pub(crate) struct RankProcess {
    /// Its global rank.
    pub(crate) rank: usize,
    /// Its process id, which is also its process group id.
    pub(crate) pid: Pid,
    /// CLOCK_MONOTONIC microseconds when it was started.
    pub(crate) started_us: u64,
    /// The handle, kept to reap the process at the end.
    pub(crate) child: Child,
}

impl RankProcess {
    /// The pid as a number, for messages.
    pub(crate) fn pid_u32(&self) -> u32 {
        self.child.id()
    }
}

/// Starts `command` as rank `rank` (index `index` in the supervisor's list)
/// with `env` added to the launcher's environment; its output and its end
/// are reported on `events`; its library lines go through `repeats`.
pub(crate) fn spawn_rank(
    index: usize,
    rank: usize,
    command: &[OsString],
    env: &[(&'static str, String)],
    events: &Sender<Event>,
    repeats: &Arc<Repeats>,
) -> Result<RankProcess> {
    let (program, args) = command.split_first().expect("the plan has checked that a command is given");
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        // An outer torchrun's error file is not ours to write.
        .env_remove("TORCHELASTIC_ERROR_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let launcher = rustix::process::getpid();
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: it calls sigemptyset and
    // sigprocmask, makes two raw system calls (prctl, getppid) through
    // rustix, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            // The launcher blocks SIGINT, SIGTERM and SIGHUP; the rank must not.
            crate::signals::clear_mask_in_child()?;
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            // The launcher may have died before the line above took effect.
            if rustix::process::getppid() != Some(launcher) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let started_us = super::oom::monotonic_us();
    let mut child =
        cmd.spawn().map_err(|source| CliError::Spawn { program: program.to_string_lossy().into_owned(), source })?;
    let pid = Pid::from_child(&child);

    let prefix = format!("[rank{rank}]: ");
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    for (name, sink, pipe) in [
        ("stdout", Sink::Stdout, Box::new(stdout) as Box<dyn io::Read + Send>),
        ("stderr", Sink::Stderr, Box::new(stderr)),
    ] {
        let (prefix, events, repeats) = (prefix.clone(), events.clone(), repeats.clone());
        spawn_thread(format!("rank{rank}-{name}"), move || {
            // The library writes its lines to stderr.
            let repeats = (sink == Sink::Stderr).then_some((&*repeats, rank));
            forward_lines(pipe, &prefix, sink, repeats);
            let _ = events.send(Event::OutputClosed);
        })?;
    }
    let events = events.clone();
    spawn_thread(format!("rank{rank}-wait"), move || {
        let ending = wait_without_reaping(pid);
        let _ = events.send(Event::Ended { index, ending });
    })?;
    Ok(RankProcess { rank, pid, started_us, child })
}

/// Blocks until `pid` ends and returns how, leaving it a zombie.
fn wait_without_reaping(pid: Pid) -> Ending {
    loop {
        match rustix::process::waitid(WaitId::Pid(pid), WaitIdOptions::EXITED | WaitIdOptions::NOWAIT) {
            Ok(Some(status)) => return Ending::from_waitid(&status),
            Ok(None) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Ending::Unknown(format!("waitid failed: {e}")),
        }
    }
}

fn spawn_thread(name: String, f: impl FnOnce() + Send + 'static) -> Result<()> {
    std::thread::Builder::new().name(name).spawn(f).map(drop).map_err(|e| CliError::io("starting a thread", e))
}
