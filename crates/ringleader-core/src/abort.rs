//! A one-shot, process-local abort signal that every wait in ringleader
//! watches.
//!
//! Waits poll sockets together with the signal's eventfd, so an abort wakes a
//! thread blocked in `poll(2)` at once; memory-based waits (shared memory)
//! register a waker. The first reason given wins and every woken wait returns
//! it, never a bare "connection closed".

use crate::error::{Error, Result};
use parking_lot::Mutex;
use rustix::event::{eventfd, EventfdFlags};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

type Waker = Box<dyn Fn() + Send + Sync>;

struct Inner {
    aborted: AtomicBool,
    reason: Mutex<Option<Error>>,
    fd: OwnedFd,
    wakers: Mutex<Vec<Waker>>,
}

/// Cheaply clonable handle to one abort signal.
///
/// ```
/// use ringleader_core::{AbortSignal, Error, ErrorKind};
/// let sig = AbortSignal::new().unwrap();
/// assert!(sig.check().is_ok());
/// assert!(sig.abort(Error::aborted("user asked")));
/// assert!(!sig.abort(Error::aborted("second reason loses")));
/// assert_eq!(sig.check().unwrap_err().to_string(), "[aborted] user asked");
/// ```
#[derive(Clone)]
pub struct AbortSignal {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AbortSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbortSignal").field("aborted", &self.is_aborted()).finish()
    }
}

impl AbortSignal {
    /// A fresh, not yet aborted signal.
    pub fn new() -> std::io::Result<AbortSignal> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(AbortSignal {
            inner: Arc::new(Inner {
                aborted: AtomicBool::new(false),
                reason: Mutex::new(None),
                fd,
                wakers: Mutex::new(Vec::new()),
            }),
        })
    }

    /// Aborts with `reason`. Returns whether this call was the first.
    pub fn abort(&self, reason: Error) -> bool {
        {
            let mut r = self.inner.reason.lock();
            if r.is_some() {
                return false;
            }
            *r = Some(reason);
            self.inner.aborted.store(true, Ordering::Release);
        }
        // The counter never goes back to zero (nobody reads it), so the fd
        // stays readable: every later poll returns at once too.
        let _ = rustix::io::write(&self.inner.fd, &1u64.to_ne_bytes());
        for w in self.inner.wakers.lock().iter() {
            w();
        }
        true
    }

    /// Whether [`AbortSignal::abort`] was called.
    #[inline]
    pub fn is_aborted(&self) -> bool {
        self.inner.aborted.load(Ordering::Acquire)
    }

    /// The reason given to the first [`AbortSignal::abort`].
    #[inline]
    pub fn reason(&self) -> Option<Error> {
        // The flag is raised with the reason already in place: a signal
        // not raised yet has none, and says so without the lock.
        if !self.is_aborted() {
            return None;
        }
        self.inner.reason.lock().clone()
    }

    /// `Err(reason)` once aborted.
    #[inline]
    pub fn check(&self) -> Result<()> {
        if self.is_aborted() {
            Err(self.reason().unwrap_or_else(|| Error::aborted("aborted")))
        } else {
            Ok(())
        }
    }

    /// A descriptor that becomes readable when the signal fires; poll it
    /// beside sockets.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }

    /// Calls `waker` on abort (at once if already aborted). For waits that
    /// sleep on something other than a descriptor, such as a futex.
    pub fn on_abort(&self, waker: impl Fn() + Send + Sync + 'static) {
        let mut ws = self.inner.wakers.lock();
        if self.is_aborted() {
            drop(ws);
            waker();
            return;
        }
        ws.push(Box::new(waker));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::event::{poll, PollFd, PollFlags};
    use std::time::{Duration, Instant};

    #[test]
    fn abort_wakes_a_poller() {
        let sig = AbortSignal::new().unwrap();
        let s2 = sig.clone();
        let t = std::thread::spawn(move || {
            let start = Instant::now();
            let fd = s2.fd();
            let mut fds = [PollFd::new(&fd, PollFlags::IN)];
            let ts = rustix::event::Timespec { tv_sec: 10, tv_nsec: 0 };
            poll(&mut fds, Some(&ts)).unwrap();
            start.elapsed()
        });
        std::thread::sleep(Duration::from_millis(20));
        sig.abort(Error::aborted("stop"));
        assert!(t.join().unwrap() < Duration::from_secs(1));
    }

    #[test]
    fn wakers_run_once_and_late_ones_at_once() {
        use std::sync::atomic::AtomicUsize;
        let sig = AbortSignal::new().unwrap();
        let n = Arc::new(AtomicUsize::new(0));
        let n1 = n.clone();
        sig.on_abort(move || {
            n1.fetch_add(1, Ordering::SeqCst);
        });
        sig.abort(Error::aborted("x"));
        sig.abort(Error::aborted("y"));
        let n2 = n.clone();
        sig.on_abort(move || {
            n2.fetch_add(10, Ordering::SeqCst);
        });
        assert_eq!(n.load(Ordering::SeqCst), 11);
    }
}
