//! Handles to operations that run in the background.

use parking_lot::{Condvar, Mutex};
use ringleader_core::{Error, OpKind, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a wait for a background operation polls its flag before it
/// sleeps, and how long the engine thread polls for the next operation
/// once it ran one. A sleeping thread costs a wake-up when the other side
/// moves, and on a virtual machine whose CPU went idle that wake-up takes
/// tens of microseconds, more than a small operation itself: polling
/// (yielding the core between polls, so a thread that needs it gets it)
/// keeps the CPU awake for what comes soon, and bounds what a long wait
/// costs in polling.
pub(crate) const POLL: Duration = Duration::from_micros(50);
/// How long this rank's waits poll ([`POLL`] or nothing), for `local`
/// ranks on this host: only where every thread that runs then has a core
/// (a rank's caller waiting and its engine thread running, two per rank);
/// with fewer cores a polling waiter would take a core from the engine
/// threads it waits for.
pub(crate) fn poll_budget(local: usize) -> Duration {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if local.saturating_mul(2) <= cores {
        POLL
    } else {
        Duration::ZERO
    }
}

/// Polls that spin before the polls start to yield.
const SPINS: u32 = 64;

/// Polls `ready` until it holds or `budget` has passed since `start`.
pub(crate) fn poll_until(start: Instant, budget: Duration, ready: impl Fn() -> bool) {
    let mut polls = 0u32;
    while !ready() {
        polls += 1;
        if polls <= SPINS {
            std::hint::spin_loop();
            continue;
        }
        if start.elapsed() >= budget {
            return;
        }
        std::thread::yield_now();
    }
}

/// One-shot completion flag with the operation's result.
#[derive(Debug, Default)]
pub(crate) struct Completion {
    done: AtomicBool,
    result: Mutex<Option<Result<()>>>,
    cv: Condvar,
    /// How long a wait polls before it sleeps (see [`POLL`]).
    poll: Duration,
}

impl Completion {
    /// A pending completion whose waits poll for `poll` before they sleep
    /// ([`poll_budget`]).
    pub(crate) fn new(poll: Duration) -> Arc<Completion> {
        Arc::new(Completion { poll, ..Completion::default() })
    }

    pub(crate) fn complete(&self, r: Result<()>) {
        let mut g = self.result.lock();
        *g = Some(r);
        self.done.store(true, Ordering::Release);
        self.cv.notify_all();
    }

    /// Completes with `err()` unless already completed.
    pub(crate) fn complete_if_pending(&self, err: impl FnOnce() -> Error) {
        let mut g = self.result.lock();
        if g.is_none() {
            *g = Some(Err(err()));
            self.done.store(true, Ordering::Release);
            self.cv.notify_all();
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// The result, once done; `None` if `timeout` passed first. Polls for
    /// its budget (within `timeout`) before it sleeps.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> Option<Result<()>> {
        let start = Instant::now();
        let deadline = timeout.map(|t| start + t);
        if !self.poll.is_zero() {
            poll_until(start, timeout.map_or(self.poll, |t| t.min(self.poll)), || self.is_done());
        }
        let mut g = self.result.lock();
        loop {
            if let Some(r) = g.as_ref() {
                return Some(r.clone());
            }
            match deadline {
                Some(d) => {
                    if self.cv.wait_until(&mut g, d).timed_out() && g.is_none() {
                        return None;
                    }
                }
                None => self.cv.wait(&mut g),
            }
        }
    }
}

/// A collective running in the background, returned by the `*_async`
/// methods. It owns the buffers the operation works on and gives them back
/// from [`Work::into_inner`].
///
/// Dropping a `Work` whose operation still runs waits for it (the engine
/// writes into the buffers until then); the wait is bounded by twice the
/// communicator's timeout plus 30 s, past which (a bug: the watchdog ends
/// every operation sooner) the buffers are leaked rather than freed under
/// the engine.
///
/// ```no_run
/// # fn main() -> ringleader::Result<()> {
/// let comm = ringleader::Communicator::from_env()?;
/// let work = comm.all_reduce_async(vec![1.0f32; 1024], ringleader::ReduceOp::Sum)?;
/// // ... overlap other work ...
/// let summed = work.into_inner()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Work<B = ()> {
    pub(crate) done: Arc<Completion>,
    pub(crate) buf: Option<B>,
    pub(crate) op: OpKind,
    pub(crate) seq: u64,
    /// How long `wait(None)` and dropping wait at most.
    pub(crate) limit: Duration,
}

impl<B> Work<B> {
    /// Whether the operation finished (successfully or not).
    pub fn is_completed(&self) -> bool {
        self.done.is_done()
    }

    /// Waits for the operation, at most `timeout` (`None`: until it ends,
    /// which the communicator's own timeout bounds; this wait gives up at
    /// twice that plus 30 s). A timeout here leaves the operation running;
    /// wait again or drop the handle.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        let limit = timeout.unwrap_or(self.limit);
        match self.done.wait(Some(limit)) {
            Some(r) => r,
            None => Err(Error::Timeout { op: self.op, seq: self.seq, waited: limit, awaited: Vec::new() }),
        }
    }

    /// Waits for the operation and returns its buffers.
    pub fn into_inner(mut self) -> Result<B> {
        self.wait(None)?;
        Ok(self.buf.take().expect("buffer present until into_inner"))
    }
}

impl<B> Drop for Work<B> {
    fn drop(&mut self) {
        if self.buf.is_some() && self.done.wait(Some(self.limit)).is_none() {
            // The engine may still be writing into the buffer we own: never
            // free it under it.
            tracing::error!(
                "[internal] {} #{} has not ended {:.0} s after its handle was dropped; leaking its buffers                  (a bug in ringleader: please report it)",
                self.op,
                self.seq,
                self.limit.as_secs_f64()
            );
            std::mem::forget(self.buf.take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_poll_only_where_every_rank_has_a_core_for_its_caller_and_its_engine() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(poll_budget(cores / 2), if cores >= 2 { POLL } else { Duration::ZERO });
        assert_eq!(poll_budget(cores / 2 + 1), Duration::ZERO);
        assert_eq!(poll_budget(usize::MAX), Duration::ZERO);
    }

    #[test]
    fn a_polling_wait_returns_what_another_thread_completes_and_its_timeout_still_holds() {
        for poll in [Duration::ZERO, POLL] {
            for late in [Duration::ZERO, Duration::from_micros(20), Duration::from_millis(5)] {
                let c = Completion::new(poll);
                let c2 = c.clone();
                let t = std::thread::spawn(move || {
                    std::thread::sleep(late);
                    c2.complete(Err(Error::aborted("from the engine")));
                });
                let r = c.wait(Some(Duration::from_secs(10)));
                assert!(matches!(r, Some(Err(ref e)) if e.to_string().contains("from the engine")), "{r:?}");
                t.join().unwrap();
            }
            // Nobody completes it: the wait gives up at its timeout, polling
            // or not, shorter than the polling budget or longer.
            for timeout in [Duration::from_micros(10), Duration::from_millis(20)] {
                let c = Completion::new(poll);
                let start = Instant::now();
                assert!(c.wait(Some(timeout)).is_none());
                assert!(start.elapsed() >= timeout && start.elapsed() < timeout + Duration::from_secs(2));
            }
        }
    }
}
