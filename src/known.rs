//! The collective calls a communicator has seen, each worked out once.
//!
//! A training loop repeats a few calls thousands of times (a loss's
//! all_reduce, a barrier, the same gradient buckets), and working out each
//! one again, checking it, fingerprinting it, building its plan, costs as
//! much as running a small one. So the engine keeps, per call shape
//! ([`CallKey`]), what that work produced: the fingerprint, the task, the
//! plan and what to do around it, and, where every frame of the plan fits
//! a fastbox, the plan compiled for an express run (the transport's
//! [`Express`]). A repeated call then only has its buffers' addresses
//! checked (see `call.rs`).
//!
//! The engine owns this: only the operation running now touches it. A few
//! shapes are kept; a new one replaces the oldest.

use crate::algo::{Coll, Prep};
use crate::call::CallKey;
use ringleader_core::{Fingerprint, OpKind};
use ringleader_transport::{Express, Plan};

/// How many call shapes are kept.
const KEPT: usize = 8;

/// One call shape, worked out (see the module docs).
#[derive(Debug)]
pub(crate) struct Known {
    /// Its shape (`None`: one that is never looked up, kept only while
    /// it runs).
    pub key: Option<CallKey>,
    pub coll: Coll,
    pub fp: Fingerprint,
    /// `fp`'s [`Fingerprint::words`].
    pub words: [u64; 2],
    pub prep: Prep,
    pub plan: Plan,
    /// The plan compiled for express runs, when every frame fits a fastbox.
    pub express: Option<Express>,
}

impl Known {
    /// The operation.
    #[inline]
    pub(crate) fn op(&self) -> OpKind {
        self.fp.op
    }
}

/// The shapes kept (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct KnownCalls {
    entries: Vec<Known>,
    /// The entry the next new shape replaces, once full.
    next: usize,
}

impl KnownCalls {
    /// The entry of shape `key`, if kept.
    #[inline]
    pub(crate) fn find(&self, key: CallKey) -> Option<usize> {
        self.entries.iter().position(|k| k.key == Some(key))
    }

    /// Entry `i` (as [`KnownCalls::find`] or [`KnownCalls::insert`] gave it).
    #[inline]
    pub(crate) fn get(&self, i: usize) -> &Known {
        &self.entries[i]
    }

    /// Keeps `k`, replacing the oldest entry once full, and forgets any
    /// other entry of its shape; its index.
    pub(crate) fn insert(&mut self, k: Known) -> usize {
        if let Some(i) = k.key.and_then(|key| self.find(key)) {
            self.entries[i] = k;
            return i;
        }
        if self.entries.len() < KEPT {
            self.entries.push(k);
            return self.entries.len() - 1;
        }
        let i = self.next;
        self.next = (self.next + 1) % KEPT;
        self.entries[i] = k;
        i
    }

    /// Forgets every shape (a build that panicked may have left one half
    /// made).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.next = 0;
    }
}
