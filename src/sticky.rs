//! The communicator's permanent failure: once an operation has failed,
//! every later one returns the same verdict.
//!
//! Every call asks whether the communicator has failed, so the answer for
//! a healthy one is a flag read, not a lock taken (two atomic
//! read-modify-writes each time, on the path of a sub-microsecond
//! collective); the error itself sits behind the lock, read only once the
//! flag is up.

use parking_lot::Mutex;
use ringleader_core::Error;
use std::sync::atomic::{AtomicBool, Ordering};

/// The first failure, kept (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Sticky {
    set: AtomicBool,
    error: Mutex<Option<Error>>,
}

impl Sticky {
    /// The failure, if there is one.
    #[inline]
    pub(crate) fn get(&self) -> Option<Error> {
        if !self.set.load(Ordering::Acquire) {
            return None;
        }
        self.error.lock().clone()
    }

    /// Whether there is one.
    #[inline]
    pub(crate) fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    /// Makes `e` the failure, replacing any before it.
    pub(crate) fn set(&self, e: Error) {
        let mut g = self.error.lock();
        *g = Some(e);
        self.set.store(true, Ordering::Release);
    }

    /// The failure: the one already kept, else `e`, kept from now on.
    pub(crate) fn get_or_set(&self, e: Error) -> Error {
        let mut g = self.error.lock();
        let kept = g.get_or_insert(e).clone();
        self.set.store(true, Ordering::Release);
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_stays() {
        let s = Sticky::default();
        assert!(s.get().is_none() && !s.is_set());
        assert_eq!(s.get_or_set(Error::aborted("one")).to_string(), Error::aborted("one").to_string());
        assert_eq!(s.get_or_set(Error::aborted("two")).to_string(), Error::aborted("one").to_string());
        assert!(s.is_set());
        s.set(Error::aborted("three"));
        assert_eq!(s.get().unwrap().to_string(), Error::aborted("three").to_string());
    }
}
