//! The supervisor: one loop over events (a rank ended, a rank's output
//! closed, the launcher got a signal) and deadlines, which escalates a
//! teardown in steps:
//!
//! ```text
//! Running --a rank fails---------> Grace (--grace, default 5 s: survivors
//!    |                               |    usually fail on their own with a
//!    |                               |    diagnosis; let them print it)
//!    +--SIGINT: forwarded--------->  +
//!    |                               | grace over: SIGTERM to each group
//!    +--SIGTERM: forwarded-------> Terminating (3 s)
//!                                    | SIGKILL to each group
//!                                  Killing (5 s, then stop waiting)
//! ```
//!
//! Once the ranks publish their verdict in the store, the job has failed
//! and the ranks that read it exit by themselves; the others (a rank
//! sleeping in the user's code never reads it) get [`VERDICT_GRACE`], then
//! SIGTERM and, [`VERDICT_KILL_AFTER`] later, SIGKILL: a failed job ends
//! within 2 s of its verdict (1.5 s and a kill), as torchrun ends one at
//! once.
//!
//! A second signal to the launcher (a second Ctrl-C) skips to SIGKILL.
//! SIGHUP (the terminal or the ssh session that started the launcher went
//! away) is ignored, with a line saying so: the job runs on. The loop ends
//! when every rank has ended; then every rank's process group gets a last
//! SIGKILL, so nothing a rank started (a grandchild in its group) outlives
//! the job.
//! The launcher's exit code is that of the first rank that failed on its own
//! (128 + signal for a signal), else 128 + the signal the launcher got, else
//! 1 if the ranks published a verdict, else 0.

use super::child::RankProcess;
use super::ending::Ending;
use super::event::Event;
use super::oom::OomWatch;
use super::store_link::ExitRecorder;
use crate::signals::signal_name;
use ringleader_core::error::fmt_ranks;
use ringleader_core::Rank;
use rustix::process::{kill_process_group, Signal};
use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// From SIGTERM to SIGKILL.
const KILL_AFTER: Duration = Duration::from_secs(3);
/// From SIGKILL to giving up on a process (one stuck in the kernel).
const GIVE_UP_AFTER: Duration = Duration::from_secs(5);
/// From the verdict to SIGTERM for the ranks still running (at most
/// `--grace`): long enough for the ranks that read it to print it and exit.
const VERDICT_GRACE: Duration = Duration::from_millis(500);
/// From SIGTERM to SIGKILL when the verdict is out: nothing is left to wait
/// for, and the job must end within 2 s of it.
const VERDICT_KILL_AFTER: Duration = Duration::from_secs(1);
/// The launcher's exit code when the ranks published a verdict but none
/// failed on its own before the launcher ended them.
const VERDICT_EXIT_CODE: i32 = 1;
/// How long output pipes may stay open once every rank has ended (a
/// background process of a rank can hold them).
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);
/// At most this many pids are spelled out in a line about ranks.
const PIDS_SHOWN: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    Grace(Instant),
    Terminating(Instant),
    Killing(Instant),
}

impl Phase {
    fn deadline(self) -> Option<Instant> {
        match self {
            Phase::Running => None,
            Phase::Grace(t) | Phase::Terminating(t) | Phase::Killing(t) => Some(t),
        }
    }
}

/// Supervises the ranks of this node until they have all ended.
#[derive(Debug)]
pub(crate) struct Supervisor {
    ranks: Vec<RankProcess>,
    ended: Vec<Option<Ending>>,
    /// The last signal the launcher sent to each rank's group.
    sent: Vec<Option<i32>>,
    events: Receiver<Event>,
    grace: Duration,
    oom: OomWatch,
    recorder: ExitRecorder,
    phase: Phase,
    first_failure: Option<i32>,
    launcher_signal: Option<i32>,
    signals_received: u32,
    open_outputs: usize,
    /// The verdict is out: the teardown is the short one.
    verdict: bool,
    /// Endings that followed the first failure, not yet printed: one line
    /// per way of ending (`ranks 0-127, 129-255 exited with code 1`), so the
    /// teardown of a big job does not print a line per rank.
    followers: Vec<(String, Rank)>,
}

impl Supervisor {
    /// A supervisor for `ranks`, whose events arrive on `events`.
    pub(crate) fn new(
        ranks: Vec<RankProcess>,
        events: Receiver<Event>,
        grace: Duration,
        oom: OomWatch,
        recorder: ExitRecorder,
    ) -> Supervisor {
        let n = ranks.len();
        Supervisor {
            ranks,
            ended: vec![None; n],
            sent: vec![None; n],
            events,
            grace,
            oom,
            recorder,
            phase: Phase::Running,
            first_failure: None,
            launcher_signal: None,
            signals_received: 0,
            open_outputs: 2 * n,
            verdict: false,
            followers: Vec::new(),
        }
    }

    /// Runs until every rank has ended (or been given up on); returns the
    /// launcher's exit code and the recorder, to be flushed.
    pub(crate) fn run(mut self) -> (i32, ExitRecorder) {
        while self.ended.iter().any(Option::is_none) {
            let event = match self.phase.deadline() {
                None => self.events.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(t) => self.events.recv_timeout(t.saturating_duration_since(Instant::now())),
            };
            match event {
                Ok(Event::Ended { index, ending }) => self.on_ended(index, ending),
                Ok(Event::OutputClosed) => self.open_outputs = self.open_outputs.saturating_sub(1),
                Ok(Event::Signal(sig)) => self.on_signal(sig),
                Ok(Event::Verdict(headline)) => self.on_verdict(&headline),
                Err(RecvTimeoutError::Timeout) => {
                    if !self.escalate() {
                        break;
                    }
                }
                // Every sender is gone: nothing more can happen.
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        // Whatever the ranks started and left behind in their groups goes
        // with them, however the job ended. (A rank that ended is a zombie
        // until reaped below: its group id cannot have been reused.)
        self.print_followers();
        for r in &self.ranks {
            let _ = kill_process_group(r.pid, Signal::KILL);
        }
        self.drain_output();
        self.reap();
        // A job with a verdict failed, even when every rank that read it
        // was still on its way out when the launcher ended it.
        let code = self
            .first_failure
            .or(self.launcher_signal.map(|s| 128 + s))
            .or(self.verdict.then_some(VERDICT_EXIT_CODE))
            .unwrap_or(0);
        (code, self.recorder)
    }

    fn on_ended(&mut self, index: usize, ending: Ending) {
        self.ended[index] = Some(ending.clone());
        if ending.is_success() {
            return;
        }
        let sent = self.sent[index];
        let (rank, pid, started) = {
            let r = &self.ranks[index];
            (r.rank, r.pid_u32(), r.started_us)
        };
        let oom = match ending.signal() {
            Some(libc::SIGKILL) if sent != Some(libc::SIGKILL) => self.oom.check(pid, started),
            _ => None,
        };
        let by_launcher = sent.is_some() && sent == ending.signal();
        let note = match (&oom, by_launcher) {
            (Some(line), _) => Some(format!("OOM killer: {line}")),
            (None, true) => Some("sent by the launcher".to_string()),
            (None, false) => None,
        };
        let mut how = ending.describe(note.as_deref());
        if let (Some(s), false) = (sent, by_launcher) {
            how += &format!(" after the launcher sent {}", signal_name(s));
        }
        let failed_before = self.phase != Phase::Running || self.verdict;
        if failed_before && oom.is_none() {
            // A consequence of the failure already reported: one line for
            // all the ranks that ended the same way, printed at the next step.
            self.followers.push((how, rank));
        } else {
            eprintln!("ringleader launch: rank {rank} (pid {pid}) {how}");
        }
        let store_note = match (&oom, by_launcher) {
            (Some(_), _) => Some("OOM killer"),
            (None, true) => Some("sent by the launcher"),
            (None, false) => None,
        };
        self.recorder.record(rank, ending.store_text(store_note));

        if sent.is_none() && self.first_failure.is_none() && self.launcher_signal.is_none() {
            self.first_failure = Some(ending.exit_code());
        }
        if self.phase == Phase::Running {
            let survivors = self.running();
            if !survivors.is_empty() {
                eprintln!(
                    "ringleader launch: giving {} {:.1} s to exit, then SIGTERM",
                    self.describe_ranks(&survivors),
                    self.grace.as_secs_f64()
                );
            }
            self.phase = Phase::Grace(Instant::now() + self.grace);
        }
    }

    /// The verdict is out: shortens the grace of the ranks still running.
    fn on_verdict(&mut self, headline: &str) {
        if self.verdict || matches!(self.phase, Phase::Terminating(_) | Phase::Killing(_)) {
            return;
        }
        self.verdict = true;
        let until = Instant::now() + self.grace.min(VERDICT_GRACE);
        self.phase = match self.phase {
            Phase::Grace(t) => Phase::Grace(t.min(until)),
            _ => Phase::Grace(until),
        };
        let survivors = self.running();
        if survivors.is_empty() {
            return;
        }
        let what = if headline.is_empty() { String::new() } else { format!(" ({headline})") };
        eprintln!(
            "ringleader launch: the job failed{what}; giving {} {:.1} s to exit, then SIGTERM",
            self.describe_ranks(&survivors),
            self.grace.min(VERDICT_GRACE).as_secs_f64()
        );
    }

    fn on_signal(&mut self, sig: i32) {
        if sig == libc::SIGHUP {
            eprintln!(
                "ringleader launch: got SIGHUP (the terminal or ssh session closed?); ignoring it, the job goes on \
                 (stop it with Ctrl-C, SIGINT or SIGTERM)"
            );
            return;
        }
        self.signals_received += 1;
        let survivors = self.running();
        if self.first_failure.is_none() && self.launcher_signal.is_none() {
            self.launcher_signal = Some(sig);
        }
        let impatient = self.signals_received > 1 || matches!(self.phase, Phase::Terminating(_) | Phase::Killing(_));
        if impatient {
            let when = if self.signals_received > 1 { "again" } else { "during the teardown" };
            eprintln!(
                "ringleader launch: got {} {when}; killing {}",
                signal_name(sig),
                self.describe_ranks(&survivors)
            );
            self.signal_all(&survivors, libc::SIGKILL);
            self.phase = Phase::Killing(Instant::now() + GIVE_UP_AFTER);
            return;
        }
        eprintln!(
            "ringleader launch: got {}; passing it to {} (send it again to kill them at once)",
            signal_name(sig),
            self.describe_ranks(&survivors)
        );
        self.signal_all(&survivors, sig);
        let now = Instant::now();
        self.phase = if sig == libc::SIGTERM {
            Phase::Terminating(now + KILL_AFTER)
        } else {
            let until = now + self.grace;
            match self.phase {
                Phase::Grace(t) => Phase::Grace(t.min(until)),
                _ => Phase::Grace(until),
            }
        };
    }

    /// The deadline of the current phase passed: take the next step.
    /// Returns false when there is nothing left to do but give up.
    fn escalate(&mut self) -> bool {
        self.print_followers();
        let survivors = self.running();
        let now = Instant::now();
        match self.phase {
            Phase::Running => {}
            Phase::Grace(_) => {
                let kill_after = if self.verdict { VERDICT_KILL_AFTER } else { KILL_AFTER };
                eprintln!(
                    "ringleader launch: sending SIGTERM to {} (SIGKILL follows in {:.0} s)",
                    self.describe_ranks(&survivors),
                    kill_after.as_secs_f64()
                );
                self.signal_all(&survivors, libc::SIGTERM);
                self.phase = Phase::Terminating(now + kill_after);
            }
            Phase::Terminating(_) => {
                eprintln!("ringleader launch: sending SIGKILL to {}", self.describe_ranks(&survivors));
                self.signal_all(&survivors, libc::SIGKILL);
                self.phase = Phase::Killing(now + GIVE_UP_AFTER);
            }
            Phase::Killing(_) => {
                eprintln!(
                    "ringleader launch: {} still running {:.0} s after SIGKILL (stuck in the \
                     kernel?); giving up on them",
                    self.describe_ranks(&survivors),
                    GIVE_UP_AFTER.as_secs_f64()
                );
                return false;
            }
        }
        true
    }

    /// Indices of the ranks that have not ended.
    fn running(&self) -> Vec<usize> {
        (0..self.ranks.len()).filter(|&i| self.ended[i].is_none()).collect()
    }

    /// `rank 0 (pid 12)` or `ranks 0, 2 (pids 12, 14)`; beyond
    /// [`PIDS_SHOWN`] ranks, the ranks alone (`ranks 0-255 (256 ranks)`), so
    /// that a line's length does not grow with the job.
    fn describe_ranks(&self, indices: &[usize]) -> String {
        let ranks: Vec<_> = indices.iter().map(|&i| self.ranks[i].rank).collect();
        if ranks.len() > PIDS_SHOWN {
            return fmt_ranks(&ranks);
        }
        let pids: Vec<_> = indices.iter().map(|&i| self.ranks[i].pid_u32().to_string()).collect();
        let label = if pids.len() == 1 { "pid" } else { "pids" };
        format!("{} ({label} {})", fmt_ranks(&ranks), pids.join(", "))
    }

    /// Prints the endings that followed the first failure, one line per way
    /// of ending, with the ranks (and their pids, when few).
    fn print_followers(&mut self) {
        let mut by_how: BTreeMap<String, Vec<Rank>> = BTreeMap::new();
        for (how, rank) in self.followers.drain(..) {
            by_how.entry(how).or_default().push(rank);
        }
        for (how, ranks) in by_how {
            let indices: Vec<usize> = (0..self.ranks.len()).filter(|&i| ranks.contains(&self.ranks[i].rank)).collect();
            let how = if indices.len() > 1 { how.replacen("was killed", "were killed", 1) } else { how };
            eprintln!("ringleader launch: {} {how}", self.describe_ranks(&indices));
        }
    }

    fn signal_all(&mut self, indices: &[usize], sig: i32) {
        let Some(signal) = Signal::from_named_raw(sig) else {
            return;
        };
        for &i in indices {
            // ESRCH: the group is already gone; nothing to do.
            let _ = kill_process_group(self.ranks[i].pid, signal);
            self.sent[i] = Some(sig);
        }
    }

    /// Lets the output threads print what is still in the pipes.
    fn drain_output(&mut self) {
        let until = Instant::now() + OUTPUT_DRAIN;
        while self.open_outputs > 0 {
            match self.events.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(Event::OutputClosed) => self.open_outputs = self.open_outputs.saturating_sub(1),
                Ok(_) => {}
                Err(_) => {
                    eprintln!(
                        "ringleader launch: not waiting for {} output pipe(s) still open \
                         (held by a process a rank left behind?)",
                        self.open_outputs
                    );
                    return;
                }
            }
        }
    }

    /// Reaps every rank that ended (the others were given up on).
    fn reap(&mut self) {
        for (r, ended) in self.ranks.iter_mut().zip(&self.ended) {
            if ended.is_some() {
                let _ = r.child.wait();
            }
        }
    }
}
