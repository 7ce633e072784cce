//! Handles to operations that run in the background.

use parking_lot::{Condvar, Mutex};
use ringleader_core::{Error, OpKind, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One-shot completion flag with the operation's result.
#[derive(Debug, Default)]
pub(crate) struct Completion {
    done: AtomicBool,
    result: Mutex<Option<Result<()>>>,
    cv: Condvar,
}

impl Completion {
    pub(crate) fn new() -> Arc<Completion> {
        Arc::new(Completion::default())
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

    /// The result, once done; `None` if `timeout` passed first.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> Option<Result<()>> {
        let deadline = timeout.map(|t| Instant::now() + t);
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
