//! Who runs a communicator's next operation: operations run one at a time,
//! in sequence-number order, either on the calling thread (a synchronous
//! call made while nothing runs and nothing waits) or on the engine thread
//! (everything queued).
//!
//! The state every submission reads is one word: whether an operation runs
//! (`BUSY`), whether the communicator is closed (`CLOSED`), and how many
//! operations are queued. A synchronous call on an idle communicator
//! claims it with one compare-and-swap from zero, numbers its operation
//! and runs it on its own thread, without taking a lock: on the path of a
//! sub-microsecond collective each lock costs two atomic
//! read-modify-writes, and the inline path used to take three.
//!
//! The queue itself sits behind a mutex that only queueing, the engine
//! thread and closing take. The order argument, in short:
//!
//! - a claim needs the word at zero, so nothing is queued when it
//!   succeeds, and nothing else can claim until it is released;
//! - queueing counts the operation in the word, then numbers it, then
//!   inserts it, all under the queue's lock; a claimed operation is
//!   numbered after its claim and then reads the count: when it sees
//!   nothing queued, every operation numbered before it has run, and the
//!   ones numbered after wait behind its claim; when it sees some queued,
//!   it queues itself in its number's place instead ([`Sched::queue_claimed`]);
//! - the engine thread takes the front of the queue only when nothing runs
//!   (a claim cannot race it: the queue is not empty), so operations run in
//!   number order.
//!
//! Sequence numbers are handed out here too; they must be the same on
//! every rank for the same collective, so they count calls, in order.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// An operation runs (on some thread).
const BUSY: u64 = 1;
/// The communicator is closed: nothing new runs or queues.
const CLOSED: u64 = 2;
/// One queued operation, counted from this bit up.
const QUEUED: u64 = 4;

/// What the queue holds: an operation with its sequence number.
pub(crate) trait Numbered {
    /// The operation's collective sequence number.
    fn seq(&self) -> u64;
}

/// The scheduling state of one communicator (see the module docs).
#[derive(Debug)]
pub(crate) struct Sched<J> {
    state: AtomicU64,
    /// The last sequence number handed out.
    seq: AtomicU64,
    queue: Mutex<VecDeque<J>>,
    cv: Condvar,
}

/// The state a release left behind.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Released {
    /// The communicator was closed meanwhile (someone may wait for the
    /// running operation to end).
    pub closed: bool,
}

impl<J: Numbered> Default for Sched<J> {
    fn default() -> Self {
        Sched {
            state: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            queue: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
        }
    }
}

impl<J: Numbered> Sched<J> {
    /// Claims the communicator for an operation on this thread: only when
    /// nothing runs, nothing is queued and it is open. The caller then
    /// numbers its operation ([`Sched::number`]) and runs it, or queues it
    /// ([`Sched::queue_claimed`]), and releases ([`Sched::release`]).
    #[inline]
    pub(crate) fn try_claim(&self) -> bool {
        self.state.compare_exchange(0, BUSY, Ordering::SeqCst, Ordering::Relaxed).is_ok()
    }

    /// Numbers the claimed operation: its sequence number, and whether it
    /// may run now (`false`: an operation was queued since the claim, which
    /// may hold an earlier number; queue this one in its place with
    /// [`Sched::queue_claimed`]).
    #[inline]
    pub(crate) fn number(&self) -> (u64, bool) {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        (seq, self.state.load(Ordering::SeqCst) < QUEUED)
    }

    /// Gives up the claim (after an inline run, or the engine thread's
    /// job), waking the engine thread if something was queued meanwhile.
    #[inline]
    pub(crate) fn release(&self) -> Released {
        let old = self.state.fetch_and(!BUSY, Ordering::SeqCst);
        if old >= QUEUED {
            // Under the lock: the engine thread checks the state under it
            // before it waits, so this cannot fall between the two.
            let _q = self.queue.lock();
            self.cv.notify_all();
        }
        Released { closed: old & CLOSED != 0 }
    }

    /// Queues an operation, numbered by `make` under the queue's lock so
    /// that numbers and queue order agree; its number. `None`: the
    /// communicator is closed (nothing was numbered).
    pub(crate) fn enqueue(&self, make: impl FnOnce(u64) -> J) -> Option<u64> {
        let mut q = self.queue.lock();
        if self.state.load(Ordering::SeqCst) & CLOSED != 0 {
            return None;
        }
        self.state.fetch_add(QUEUED, Ordering::SeqCst);
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        insert(&mut q, make(seq));
        self.cv.notify_all();
        Some(seq)
    }

    /// Queues the claimed operation `job` in its number's place and gives
    /// the claim up (see [`Sched::number`]). `Err(job)`: the communicator
    /// was closed meanwhile; the job did not queue.
    pub(crate) fn queue_claimed(&self, job: J) -> Result<Released, J> {
        let mut q = self.queue.lock();
        if self.state.load(Ordering::SeqCst) & CLOSED != 0 {
            drop(q);
            self.release();
            return Err(job);
        }
        self.state.fetch_add(QUEUED, Ordering::SeqCst);
        insert(&mut q, job);
        let old = self.state.fetch_and(!BUSY, Ordering::SeqCst);
        self.cv.notify_all();
        Ok(Released { closed: old & CLOSED != 0 })
    }

    /// The engine thread's next operation, claimed for it: waits until one
    /// is queued and nothing runs, polling for `poll` first when the last
    /// one ended at `ran` (a wake-up costs tens of microseconds). `None`
    /// once the communicator is closed and nothing is queued.
    pub(crate) fn next(&self, poll: Duration, ran: Option<Instant>) -> Option<J> {
        let mut ran = ran.filter(|_| !poll.is_zero());
        let mut q = self.queue.lock();
        loop {
            let s = self.state.load(Ordering::SeqCst);
            if s & BUSY == 0 && !q.is_empty() {
                // Nothing claims while the queue is not empty (a claim
                // needs the count at zero): this cannot race.
                self.state.fetch_sub(QUEUED - BUSY, Ordering::SeqCst);
                return q.pop_front();
            }
            if s & CLOSED != 0 && q.is_empty() {
                return None;
            }
            if let Some(t) = ran.take() {
                parking_lot::MutexGuard::unlocked(&mut q, || {
                    crate::work::poll_until(t, poll, || self.state.load(Ordering::Acquire) >= QUEUED)
                });
                continue;
            }
            self.cv.wait(&mut q);
        }
    }

    /// Closes the communicator: nothing new runs or queues. Returns the
    /// operations still queued (they will never run) and whether one runs
    /// now.
    pub(crate) fn close(&self) -> (Vec<J>, bool) {
        let mut q = self.queue.lock();
        let jobs: Vec<J> = q.drain(..).collect();
        self.state.fetch_or(CLOSED, Ordering::SeqCst);
        let old = self.state.fetch_sub(QUEUED * jobs.len() as u64, Ordering::SeqCst);
        self.cv.notify_all();
        (jobs, old & BUSY != 0)
    }

    /// Claims the closed communicator for its last words (a rank that
    /// leaves says goodbye on its links): only when it is closed and
    /// nothing runs or is queued. Released with [`Sched::release`].
    pub(crate) fn claim_closed(&self) -> bool {
        self.state.compare_exchange(CLOSED, CLOSED | BUSY, Ordering::SeqCst, Ordering::Relaxed).is_ok()
    }

    /// Whether an operation runs now.
    pub(crate) fn busy(&self) -> bool {
        self.state.load(Ordering::SeqCst) & BUSY != 0
    }
}

/// Inserts `job` in number order (almost always at the back: only a
/// claimed operation that found the queue busy can come in earlier).
fn insert<J: Numbered>(q: &mut VecDeque<J>, job: J) {
    let at = q.iter().rposition(|j| j.seq() < job.seq()).map_or(0, |i| i + 1);
    q.insert(at, job);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[derive(Debug, PartialEq)]
    struct Op(u64);

    impl Numbered for Op {
        fn seq(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn a_claim_needs_an_idle_open_empty_communicator() {
        let s: Sched<Op> = Sched::default();
        assert!(s.try_claim());
        assert!(!s.try_claim(), "claimed twice");
        assert_eq!(s.number(), (1, true));
        s.release();
        assert_eq!(s.enqueue(Op), Some(2));
        assert!(!s.try_claim(), "claimed past a queued operation");
        assert_eq!(s.next(Duration::ZERO, None), Some(Op(2)));
        assert!(!s.try_claim(), "claimed while the engine runs");
        s.release();
        assert!(s.try_claim());
        s.release();
        assert_eq!(s.close(), (vec![], false));
        assert!(!s.try_claim(), "claimed a closed communicator");
        assert!(s.claim_closed());
        assert!(!s.claim_closed(), "claimed twice");
        assert!(s.release().closed);
        assert_eq!(s.enqueue(Op), None);
        assert_eq!(s.next(Duration::ZERO, None), None);
    }

    #[test]
    fn a_claimed_operation_behind_a_queued_one_queues_in_its_place() {
        let s: Sched<Op> = Sched::default();
        assert!(s.try_claim());
        // Another thread queues while the claim is held, before it numbers.
        assert_eq!(s.enqueue(Op), Some(1));
        let (seq, now) = s.number();
        assert_eq!((seq, now), (2, false));
        assert!(s.queue_claimed(Op(seq)).is_ok());
        assert_eq!(s.next(Duration::ZERO, None), Some(Op(1)));
        s.release();
        assert_eq!(s.next(Duration::ZERO, None), Some(Op(2)));
        s.release();
    }

    #[test]
    fn a_claimed_operation_numbered_first_still_runs_first() {
        let s: Sched<Op> = Sched::default();
        assert!(s.try_claim());
        let (seq, _) = s.number();
        // Queued after the number was taken: it sees the count and queues
        // behind (here by hand, as the runtime would on `false`).
        assert_eq!(s.enqueue(Op), Some(2));
        assert!(s.queue_claimed(Op(seq)).is_ok());
        assert_eq!(s.next(Duration::ZERO, None), Some(Op(1)));
        s.release();
        assert_eq!(s.next(Duration::ZERO, None), Some(Op(2)));
        s.release();
    }

    #[test]
    fn closing_returns_the_queue_and_says_what_runs() {
        let s: Sched<Op> = Sched::default();
        assert!(s.try_claim());
        s.number();
        assert_eq!(s.enqueue(Op), Some(2));
        assert_eq!(s.enqueue(Op), Some(3));
        assert_eq!(s.close(), (vec![Op(2), Op(3)], true));
        assert!(s.release().closed);
        assert!(!s.busy());
        assert!(s.queue_claimed(Op(4)).is_err());
    }

    #[test]
    fn threads_racing_claims_and_queues_run_every_operation_once_in_order() {
        // Four threads submit 2,000 operations each, claiming where they
        // can and queueing otherwise; an engine thread runs the queue. The
        // order operations run in must be their numbers' order.
        let s: Arc<Sched<Op>> = Arc::new(Sched::default());
        let ran = Arc::new(Mutex::new(Vec::new()));
        let engine = {
            let (s, ran) = (s.clone(), ran.clone());
            std::thread::spawn(move || {
                while let Some(op) = s.next(Duration::ZERO, None) {
                    ran.lock().push(op.0);
                    s.release();
                }
            })
        };
        let submitters: Vec<_> = (0..4)
            .map(|t| {
                let (s, ran) = (s.clone(), ran.clone());
                std::thread::spawn(move || {
                    for i in 0..2000 {
                        if (i + t) % 3 != 0 && s.try_claim() {
                            let (seq, now) = s.number();
                            if now {
                                ran.lock().push(seq);
                                s.release();
                            } else {
                                assert!(s.queue_claimed(Op(seq)).is_ok());
                            }
                        } else {
                            s.enqueue(Op).unwrap();
                        }
                    }
                })
            })
            .collect();
        for t in submitters {
            t.join().unwrap();
        }
        // Drain, then stop the engine thread.
        let deadline = Instant::now() + Duration::from_secs(30);
        while ran.lock().len() < 8000 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        s.close();
        engine.join().unwrap();
        let ran = ran.lock();
        assert_eq!(ran.len(), 8000);
        assert!(ran.windows(2).all(|w| w[1] == w[0] + 1), "ran out of order");
    }
}
