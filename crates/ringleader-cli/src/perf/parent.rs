//! The parent of `ringleader perf`: hosts the store, starts the workers,
//! watches them under the time limit, and says which failed and how.
//!
//! Workers run the parent's own executable with the same arguments plus
//! `--worker`, and the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK,
//! LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus RINGLEADER_STORE_ADDR,
//! RINGLEADER_RUN_ID and RINGLEADER_TRANSPORT. Rank 0's stdout is the
//! parent's own (it prints the table); the other ranks' stdout and every
//! rank's stderr are copied with a `[rankN]: ` prefix, and the last lines of
//! each rank's stderr are kept for the failure report. Each worker gets
//! SIGKILL as its parent-death signal, so none outlives a parent that was
//! killed.
//!
//! When a worker fails, the others get [`GRACE`] to fail on their own (the
//! runtime names the dead rank within about a second) before they are
//! killed; past the time limit, every worker still running is killed.

use super::{PerfArgs, WRONG_RESULTS};
use crate::error::{CliError, Result};
use crate::launch::ending::Ending;
use crate::launch::output::copy_lines;
use crate::secret;
use ringleader_core::error::fmt_ranks;
use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the other workers get after one fails.
const GRACE: Duration = Duration::from_secs(5);
/// stderr lines kept per worker for the failure report.
const TAIL_LINES: usize = 20;
/// How often the workers are polled.
const POLL: Duration = Duration::from_millis(20);
/// The runtime's hard collective and init timeouts in the workers, unless
/// the environment sets them: well inside the default time limit, so a hang
/// is diagnosed by the runtime before it is killed by us.
const WORKER_TIMEOUT_SECS: &str = "60";

/// Runs the parent; returns the exit code.
pub(crate) fn run(args: &PerfArgs) -> i32 {
    match start_and_watch(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ringleader perf: error: {e}");
            e.exit_code()
        }
    }
}

/// One started worker.
#[derive(Debug)]
struct Worker {
    rank: usize,
    child: Child,
    ending: Option<Ending>,
    /// In which poll round its ending was seen (orders the failures).
    ended_round: u64,
    /// Killed by us (time limit or teardown), not ended on its own.
    killed: bool,
    tail: Arc<Mutex<VecDeque<String>>>,
    copiers: Vec<JoinHandle<()>>,
}

fn start_and_watch(args: &PerfArgs) -> Result<i32> {
    if let Some(p) = &args.json {
        // Fail now, not after the benchmark, if the file cannot be written.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .map_err(|e| CliError::io(format!("opening {} for appending", p.display()), e))?;
    }
    let run_id = format!("perf-{}", crate::launch::random_run_id());
    let token = match std::env::var(secret::TOKEN_VAR).ok().filter(|t| !t.is_empty()) {
        Some(t) => t,
        None => secret::new_token().map_err(|e| CliError::io("making the job's token", e))?,
    };
    let store = crate::launch::host_store("127.0.0.1:0", &run_id, Some(token.clone()))?;
    let store_port = store.local_addr().port();
    // `ringleader status` from another terminal finds the secret.
    let _token_file = secret::publish(store_port, &token).ok();
    let master_port = crate::launch::free_port("127.0.0.1", Some(store_port))?;
    let exe = std::env::current_exe().map_err(|e| CliError::io("finding this program's own executable", e))?;
    let mut worker_args: Vec<OsString> = std::env::args_os().skip(1).collect();
    worker_args.push("--worker".into());

    let mut workers = Vec::with_capacity(args.nproc);
    for rank in 0..args.nproc {
        let env = [
            ("RANK", rank.to_string()),
            ("WORLD_SIZE", args.nproc.to_string()),
            ("LOCAL_RANK", rank.to_string()),
            ("LOCAL_WORLD_SIZE", args.nproc.to_string()),
            ("MASTER_ADDR", "127.0.0.1".to_string()),
            ("MASTER_PORT", master_port.to_string()),
            ("RINGLEADER_STORE_ADDR", format!("127.0.0.1:{store_port}")),
            ("RINGLEADER_RUN_ID", run_id.clone()),
            ("RINGLEADER_TRANSPORT", args.transport.clone()),
            (secret::TOKEN_VAR, token.clone()),
        ];
        match spawn(&exe, &worker_args, rank, &env) {
            Ok(w) => workers.push(w),
            Err(e) => {
                for w in &mut workers {
                    let _ = w.child.kill();
                    let _ = w.child.wait();
                }
                return Err(e);
            }
        }
    }
    let timed_out = watch(&mut workers, args.time_limit);
    for w in &mut workers {
        for c in w.copiers.drain(..) {
            let _ = c.join();
        }
    }
    store.shutdown();
    Ok(verdict(&workers, timed_out, args.time_limit))
}

/// Starts rank `rank` as a worker.
fn spawn(exe: &std::path::Path, args: &[OsString], rank: usize, env: &[(&str, String)]) -> Result<Worker> {
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(if rank == 0 { Stdio::inherit() } else { Stdio::piped() })
        .stderr(Stdio::piped());
    for (k, v) in [("RINGLEADER_TIMEOUT", WORKER_TIMEOUT_SECS), ("RINGLEADER_INIT_TIMEOUT", WORKER_TIMEOUT_SECS)] {
        if std::env::var_os(k).is_none() {
            cmd.env(k, v);
        }
    }
    let parent = rustix::process::getpid();
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: it makes two raw system calls
    // (prctl, getppid) through rustix and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            // The parent may have died before the line above took effect.
            if rustix::process::getppid() != Some(parent) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|source| CliError::Spawn { program: exe.display().to_string(), source })?;
    let tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_LINES)));
    let prefix = format!("[rank{rank}]: ");
    let mut copiers = Vec::new();
    if let Some(out) = child.stdout.take() {
        copiers.push(copy_thread(out, prefix.clone(), false, None)?);
    }
    if let Some(err) = child.stderr.take() {
        copiers.push(copy_thread(err, prefix, true, Some(tail.clone()))?);
    }
    Ok(Worker { rank, child, ending: None, ended_round: 0, killed: false, tail, copiers })
}

/// Copies a worker's pipe to our stdout or stderr, line by line with the
/// prefix, keeping the last lines in `tail`.
fn copy_thread(
    src: impl Read + Send + 'static,
    prefix: String,
    to_stderr: bool,
    tail: Option<Arc<Mutex<VecDeque<String>>>>,
) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("perf-output".into())
        .spawn(move || {
            copy_lines(src, &prefix, None, |line| {
                let _ =
                    if to_stderr { io::stderr().lock().write_all(line) } else { io::stdout().lock().write_all(line) };
                if let Some(t) = &tail {
                    let text = String::from_utf8_lossy(&line[prefix.len()..]);
                    let mut t = t.lock().unwrap_or_else(|p| p.into_inner());
                    if t.len() == TAIL_LINES {
                        t.pop_front();
                    }
                    t.push_back(text.trim_end().to_string());
                }
            })
        })
        .map_err(|e| CliError::io("starting a thread", e))
}

fn ending_of(st: ExitStatus) -> Ending {
    match (st.code(), st.signal()) {
        (Some(c), _) => Ending::Code(c),
        (None, Some(signal)) => Ending::Signal { signal, core_dumped: st.core_dumped() },
        _ => Ending::Unknown(format!("{st}")),
    }
}

/// Whether a worker ended in a way that is its own failure (not just
/// wrong results, which it reports in the table).
fn failed(e: &Ending) -> bool {
    !e.is_success() && *e != Ending::Code(WRONG_RESULTS)
}

/// Polls the workers until all have ended; after the first failure (the
/// culprit, usually: the others fail because of it, later), gives
/// the others [`GRACE`], then kills them; past `limit`, kills every one
/// still running. Returns whether the time limit struck.
fn watch(workers: &mut [Worker], limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut grace_end: Option<Instant> = None;
    let mut round = 0u64;
    loop {
        round += 1;
        for w in workers.iter_mut().filter(|w| w.ending.is_none()) {
            if let Ok(Some(st)) = w.child.try_wait() {
                let e = ending_of(st);
                if failed(&e) && grace_end.is_none() {
                    grace_end = Some(Instant::now() + GRACE);
                }
                w.ending = Some(e);
                w.ended_round = round;
            }
        }
        if workers.iter().all(|w| w.ending.is_some()) {
            return false;
        }
        let now = Instant::now();
        let timed_out = now >= deadline;
        if timed_out || grace_end.is_some_and(|g| now >= g) {
            for w in workers.iter_mut().filter(|w| w.ending.is_none()) {
                let _ = w.child.kill();
                w.killed = true;
                w.ending =
                    Some(w.child.wait().map_or_else(|e| Ending::Unknown(format!("wait failed: {e}")), ending_of));
            }
            return timed_out;
        }
        std::thread::sleep(POLL);
    }
}

/// Prints what went wrong, if anything; returns the exit code.
fn verdict(workers: &[Worker], timed_out: bool, limit: Duration) -> i32 {
    let killed: Vec<&Worker> = workers.iter().filter(|w| w.killed).collect();
    let killed_ranks: Vec<usize> = killed.iter().map(|w| w.rank).collect();
    if timed_out {
        eprintln!(
            "ringleader perf: the time limit of {} s passed; killed {} (still running)",
            limit.as_secs_f64(),
            fmt_ranks(&killed_ranks)
        );
        for w in &killed {
            print_tail(w);
        }
        return 1;
    }
    let first = workers
        .iter()
        .filter(|w| !w.killed && w.ending.as_ref().is_some_and(failed))
        .min_by_key(|w| (w.ended_round, w.rank));
    if let Some(w) = first {
        let ending = w.ending.as_ref().map_or(String::new(), |e| e.describe(None));
        eprintln!("ringleader perf: rank {} (pid {}) {ending}", w.rank, w.child.id());
        print_tail(w);
        for other in workers.iter().filter(|o| o.rank != w.rank && !o.killed) {
            if let Some(e) = other.ending.as_ref().filter(|e| failed(e)) {
                eprintln!("ringleader perf: rank {} (pid {}) {}", other.rank, other.child.id(), e.describe(None));
            }
        }
        if !killed_ranks.is_empty() {
            eprintln!(
                "ringleader perf: killed {} ({:.0} s after the failure, still running)",
                fmt_ranks(&killed_ranks),
                GRACE.as_secs_f64()
            );
        }
        return 1;
    }
    if workers.iter().any(|w| w.ending == Some(Ending::Code(WRONG_RESULTS))) {
        eprintln!("ringleader perf: some results were wrong (the #wrong column counts them)");
        return 1;
    }
    0
}

fn print_tail(w: &Worker) {
    let tail = w.tail.lock().unwrap_or_else(|p| p.into_inner());
    if tail.is_empty() {
        eprintln!("  rank {} printed nothing on stderr", w.rank);
        return;
    }
    eprintln!("  last lines rank {} printed on stderr:", w.rank);
    for line in tail.iter() {
        eprintln!("    {line}");
    }
}
