//! Requests that wait: for keys to appear, or for the next job event.
//!
//! Waiters are indexed by the keys they still miss, by connection (to drop
//! them when it closes) and by deadline (so the next timeout is the first
//! entry of an ordered set). A waiter on several keys is indexed only under
//! the keys it misses; when one of them is written the state re-checks it
//! and re-indexes what is still missing, which also covers a key deleted
//! after it was seen.

use super::ConnId;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Instant;

/// Identifies one waiter; ascending in arrival order.
pub(super) type WaiterId = u64;

/// What a waiter answers once it completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WaitKind {
    /// The value of its one key.
    Get,
    /// Just that every key is there.
    Wait,
    /// The values of all its keys.
    MultiGet,
    /// The job status, once the generation is past `since`.
    Status { since: u64 },
    /// The changes after `since`, once there is one.
    Changes { since: u64 },
}

impl WaitKind {
    /// The generation a job-event wait waits to pass.
    fn since(self) -> Option<u64> {
        match self {
            WaitKind::Status { since } | WaitKind::Changes { since } => Some(since),
            _ => None,
        }
    }
}

/// One parked request.
#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) conn: ConnId,
    /// The request id to answer.
    pub(super) id: u64,
    pub(super) kind: WaitKind,
    pub(super) keys: Vec<String>,
    /// `None` when the timeout is too large to represent: it never expires.
    pub(super) deadline: Option<Instant>,
    /// Bytes charged to the run's budget while it is parked.
    pub(super) cost: u64,
}

#[derive(Debug, Default)]
pub(super) struct Waiters {
    next: WaiterId,
    all: HashMap<WaiterId, Waiter>,
    by_key: HashMap<String, HashSet<WaiterId>>,
    by_conn: HashMap<ConnId, HashSet<WaiterId>>,
    on_status: BTreeSet<WaiterId>,
    deadlines: BTreeSet<(Instant, WaiterId)>,
}

impl Waiters {
    /// Parks `w`, indexed under the keys it still misses.
    pub(super) fn add(&mut self, w: Waiter, missing: &[String]) {
        let wid = self.next;
        self.next += 1;
        for key in missing {
            self.index_key(wid, key);
        }
        if w.kind.since().is_some() {
            self.on_status.insert(wid);
        }
        self.by_conn.entry(w.conn).or_default().insert(wid);
        if let Some(d) = w.deadline {
            self.deadlines.insert((d, wid));
        }
        self.all.insert(wid, w);
    }

    /// (Re-)indexes waiter `wid` under `key`.
    pub(super) fn index_key(&mut self, wid: WaiterId, key: &str) {
        match self.by_key.get_mut(key) {
            Some(set) => {
                set.insert(wid);
            }
            None => {
                self.by_key.insert(key.to_string(), HashSet::from([wid]));
            }
        }
    }

    pub(super) fn get(&self, wid: WaiterId) -> Option<&Waiter> {
        self.all.get(&wid)
    }

    /// Unparks `wid`, dropping it from every index.
    pub(super) fn remove(&mut self, wid: WaiterId) -> Option<Waiter> {
        let w = self.all.remove(&wid)?;
        for key in &w.keys {
            if let Some(set) = self.by_key.get_mut(key) {
                set.remove(&wid);
                if set.is_empty() {
                    self.by_key.remove(key);
                }
            }
        }
        self.on_status.remove(&wid);
        if let Some(set) = self.by_conn.get_mut(&w.conn) {
            set.remove(&wid);
            if set.is_empty() {
                self.by_conn.remove(&w.conn);
            }
        }
        if let Some(d) = w.deadline {
            self.deadlines.remove(&(d, wid));
        }
        Some(w)
    }

    /// Takes the waiters indexed under any of `keys`, in arrival order. The
    /// caller re-indexes those that still miss something.
    pub(super) fn take_for_keys<'k>(&mut self, keys: impl IntoIterator<Item = &'k str>) -> Vec<WaiterId> {
        let mut woken = BTreeSet::new();
        for key in keys {
            woken.extend(self.by_key.remove(key).into_iter().flatten());
        }
        woken.into_iter().collect()
    }

    /// The job-event waiters (status and changes) whose `since` is below
    /// `generation`.
    pub(super) fn status_due(&self, generation: u64) -> Vec<WaiterId> {
        self.on_status
            .iter()
            .copied()
            .filter(|wid| self.all.get(wid).and_then(|w| w.kind.since()).is_some_and(|since| since < generation))
            .collect()
    }

    /// Unparks every waiter whose deadline is at or before `now`.
    pub(super) fn take_expired(&mut self, now: Instant) -> Vec<Waiter> {
        let due: Vec<WaiterId> = self.deadlines.iter().take_while(|(d, _)| *d <= now).map(|(_, wid)| *wid).collect();
        due.into_iter().filter_map(|wid| self.remove(wid)).collect()
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(d, _)| *d)
    }

    /// Drops every waiter of a closed connection (nobody would read the
    /// answer) and answers them, so that their cost is released.
    pub(super) fn remove_conn(&mut self, conn: ConnId) -> Vec<Waiter> {
        let wids = self.by_conn.remove(&conn).unwrap_or_default();
        wids.into_iter().filter_map(|wid| self.remove(wid)).collect()
    }

    /// How many waits `conn` has parked.
    pub(super) fn count_for(&self, conn: ConnId) -> usize {
        self.by_conn.get(&conn).map_or(0, HashSet::len)
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.all.len()
    }

    /// Every parked waiter, in no particular order (for invariant checks).
    pub(super) fn iter(&self) -> impl Iterator<Item = &Waiter> {
        self.all.values()
    }
}
