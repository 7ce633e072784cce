//! The watchdog: every operation ends, at the latest at its timeout.
//!
//! One hard timeout bounds each operation (`RINGLEADER_TIMEOUT`, or a
//! monitored barrier's own plus a margin: [`op_timeout`]). The monitor
//! thread enforces it: it feeds the [`Watchdog`] the operation running now
//! and its age, and carries out what comes back ([`Action`]): a stall
//! warning after `RINGLEADER_STALL_WARN` (then at doubling ages), a note when
//! a warned operation completes after all, and the abort at the timeout.
//! The state machine reads no clock and does no IO, so its decisions are
//! tested with synthetic ages.
//!
//! Behind the monitor stand backstops, for the case it cannot act (its
//! thread gone, a bug): the data plane's own deadline a [`BACKSTOP`] after
//! the timeout, and a waiter's limit on a completion ([`completion_limit`]).
//! Every margin of the runtime lives here, with the reason for its size.

use ringleader_core::Fingerprint;
use ringleader_transport::Deadline;
use std::time::Duration;

/// How long after an operation's timeout the data plane gives up on its
/// own: the watchdog aborts first (its tick is 100 ms); this ends the
/// operation should the monitor be unable to.
pub(crate) const BACKSTOP: Duration = Duration::from_secs(5);

/// What a monitored barrier adds to its own timeout for the operation's
/// hard timeout: rank 0 answers at the barrier's timeout, and the others
/// must still read its answer.
pub(crate) const BARRIER_MARGIN: Duration = Duration::from_secs(5);

/// The hard timeout of an operation: the communicator's, or for a monitored
/// barrier whose own timeout is longer, that plus [`BARRIER_MARGIN`].
pub(crate) fn op_timeout(timeout: Duration, barrier: Option<Duration>) -> Duration {
    match barrier {
        Some(b) => timeout.max(b + BARRIER_MARGIN),
        None => timeout,
    }
}

/// The data plane's deadline for an operation of hard timeout `timeout`:
/// a [`BACKSTOP`] after it, counted from the run's first sleep (a run that
/// never sleeps reads no clock for it).
pub(crate) fn deadline(timeout: Duration) -> Deadline {
    Deadline::AfterFirstSleep(timeout + BACKSTOP)
}

/// A collective's bounds, worked out once per communicator for the calls
/// that run inline: its hard timeout in ms (as the monitor reads it) and
/// the data plane's [`deadline`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct CollBounds {
    pub timeout_ms: u64,
    pub deadline: Deadline,
}

impl CollBounds {
    /// The bounds of a collective under the communicator's `timeout`.
    pub(crate) fn new(timeout: Duration) -> CollBounds {
        let t = op_timeout(timeout, None);
        CollBounds { timeout_ms: u64::try_from(t.as_millis()).unwrap_or(u64::MAX), deadline: deadline(t) }
    }
}

/// How long a waiter waits for an operation's completion before it takes
/// the engine for lost: twice the timeout plus half a minute, far beyond
/// the watchdog and the backstop, which end every operation before.
pub(crate) fn completion_limit(timeout: Duration) -> Duration {
    timeout * 2 + Duration::from_secs(30)
}

/// What the monitor must do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Warn that operation `seq` has waited `age` (and the timeout is `left` away).
    Stall { seq: u64, fp: Fingerprint, age: Duration, left: Duration },
    /// Operation `seq`, warned about, completed after all.
    Recovered { seq: u64, fp: Fingerprint },
    /// Operation `seq` ran `age`, past its timeout: abort it.
    Expire { seq: u64, fp: Fingerprint, age: Duration },
}

/// The watchdog's state: the operation watched and when to warn next.
#[derive(Debug)]
pub(crate) struct Watchdog {
    stall_warn: Duration,
    /// (collective seq, fingerprint) watched.
    op: Option<(u64, Fingerprint)>,
    next_warn: Duration,
    warned: bool,
}

impl Watchdog {
    /// A watchdog that first warns after `stall_warn`.
    pub(crate) fn new(stall_warn: Duration) -> Watchdog {
        Watchdog { stall_warn, op: None, next_warn: stall_warn, warned: false }
    }

    /// Whether the watched operation was warned about.
    #[cfg(test)]
    fn warned(&self) -> bool {
        self.warned
    }

    /// One tick: `running` is the operation running now (seq, call) and its
    /// age, `timeout` its hard timeout, `aborted` whether the communicator
    /// is already aborted (then nothing more is warned or aborted).
    pub(crate) fn poll(
        &mut self,
        running: Option<(u64, Fingerprint, Duration)>,
        timeout: Duration,
        aborted: bool,
    ) -> Option<Action> {
        let now = running.map(|(seq, fp, _)| (seq, fp));
        if now != self.op {
            let recovered = match (self.op, self.warned, aborted) {
                (Some((seq, fp)), true, false) => Some(Action::Recovered { seq, fp }),
                _ => None,
            };
            *self = Watchdog { op: now, ..Watchdog::new(self.stall_warn) };
            if recovered.is_some() {
                return recovered;
            }
        }
        let (seq, fp, age) = running?;
        if aborted {
            return None;
        }
        if age >= timeout {
            return Some(Action::Expire { seq, fp, age });
        }
        if age >= self.next_warn {
            self.warned = true;
            self.next_warn = age * 2;
            return Some(Action::Stall { seq, fp, age, left: timeout - age });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringleader_core::{DType, OpKind};

    fn fp() -> Fingerprint {
        Fingerprint::new(OpKind::AllReduce, DType::F32, 4)
    }

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    #[test]
    fn warns_at_doubling_ages_then_expires_at_the_timeout() {
        let mut w = Watchdog::new(s(1.0));
        let t = s(10.0);
        let mut seen = Vec::new();
        for tenth in 0..=105 {
            if let Some(a) = w.poll(Some((7, fp(), s(tenth as f64 / 10.0))), t, false) {
                seen.push(a);
            }
            if matches!(seen.last(), Some(Action::Expire { .. })) {
                break;
            }
        }
        let ages: Vec<f64> = seen
            .iter()
            .map(|a| match a {
                Action::Stall { age, .. } | Action::Expire { age, .. } => age.as_secs_f64(),
                Action::Recovered { .. } => -1.0,
            })
            .collect();
        assert_eq!(ages, vec![1.0, 2.0, 4.0, 8.0, 10.0], "{seen:?}");
        assert!(matches!(seen[0], Action::Stall { seq: 7, left, .. } if left == s(9.0)));
        assert!(matches!(seen[4], Action::Expire { seq: 7, .. }));
    }

    #[test]
    fn a_warned_operation_that_completes_is_reported_once() {
        let mut w = Watchdog::new(s(1.0));
        assert!(matches!(w.poll(Some((3, fp(), s(1.5))), s(60.0), false), Some(Action::Stall { .. })));
        assert!(w.warned());
        // The next operation starts: the stalled one completed.
        assert_eq!(w.poll(Some((4, fp(), s(0.0))), s(60.0), false), Some(Action::Recovered { seq: 3, fp: fp() }));
        assert!(!w.warned());
        assert_eq!(w.poll(Some((4, fp(), s(0.5))), s(60.0), false), None);
        assert_eq!(w.poll(None, s(60.0), false), None, "the quiet one is not reported");
    }

    #[test]
    fn nothing_more_once_aborted() {
        let mut w = Watchdog::new(s(1.0));
        assert_eq!(w.poll(Some((2, fp(), s(30.0))), s(10.0), true), None);
        assert!(matches!(w.poll(Some((2, fp(), s(2.0))), s(10.0), false), Some(Action::Stall { .. })));
        assert_eq!(w.poll(None, s(10.0), true), None, "no recovery note after an abort");
    }

    #[test]
    fn margins() {
        assert_eq!(op_timeout(s(600.0), None), s(600.0));
        assert_eq!(op_timeout(s(10.0), Some(s(30.0))), s(35.0));
        assert_eq!(op_timeout(s(600.0), Some(s(30.0))), s(600.0));
        assert_eq!(completion_limit(s(10.0)), s(50.0));
    }
}
