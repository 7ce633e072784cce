//! One run's share of the store: its keys, its ranks, its parked waits, its
//! job events, and what all of that costs.
//!
//! A store hosted by a job (rank 0, `ringleader launch`) serves one run; the
//! standalone `ringleader store` serves several side by side, each in a
//! [`Run`] of its own, so that one job's keys, ranks, abort record and
//! verdict are invisible to another.
//!
//! Costs are counted in bytes against the run's and the store's budget
//! ([`Limits`](super::Limits)): a key and its value cost their lengths plus
//! [`ENTRY`] bytes of bookkeeping, a rank record [`RANK`] bytes plus its
//! host, version and heartbeat, a parked wait [`WAITER`] bytes plus its keys.

use super::waiters::Waiters;
use super::ConnId;
use crate::job::{JobStatus, Liveness, RankStatus};
use std::collections::BTreeMap;
use std::time::Instant;

/// Bookkeeping charged per key, beside its bytes (the map's node, the
/// allocation headers).
pub(super) const ENTRY: u64 = 64;
/// Charged per rank record, beside its strings and heartbeat.
pub(super) const RANK: u64 = 64;
/// Charged per parked wait, beside its keys.
pub(super) const WAITER: u64 = 128;
/// Charged per key a parked wait names, beside the key's bytes.
pub(super) const WAIT_KEY: u64 = 8;

/// A stored value and the connection that created its key.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) value: Vec<u8>,
    pub(super) owner: ConnId,
}

/// What `key` holding `value` costs.
pub(super) fn entry_cost(key: &str, value: &[u8]) -> u64 {
    ENTRY + key.len() as u64 + value.len() as u64
}

/// One rank that connected as a member.
#[derive(Debug)]
pub(super) struct RankEntry {
    pub(super) liveness: Liveness,
    pub(super) host: String,
    pub(super) pid: u32,
    pub(super) version: String,
    pub(super) world_size: u32,
    /// When `liveness` last changed.
    pub(super) changed: Instant,
    /// When the last heartbeat arrived, and its payload.
    pub(super) heartbeat: Option<(Instant, Vec<u8>)>,
}

impl RankEntry {
    pub(super) fn status(&self, rank: u32, now: Instant) -> RankStatus {
        RankStatus {
            rank: rank as usize,
            liveness: self.liveness,
            host: self.host.clone(),
            pid: self.pid,
            version: self.version.clone(),
            world_size: Some(self.world_size as usize),
            since_change: now.saturating_duration_since(self.changed),
            heartbeat_age: self.heartbeat.as_ref().map(|(t, _)| now.saturating_duration_since(*t)),
            heartbeat: self.heartbeat.as_ref().map(|(_, p)| p.clone()).unwrap_or_default(),
        }
    }

    /// What the record costs; also what it adds to a status answer.
    pub(super) fn cost(&self) -> u64 {
        let beat = self.heartbeat.as_ref().map_or(0, |(_, p)| p.len());
        RANK + (self.host.len() + self.version.len() + beat) as u64
    }

    /// `node-b pid 42`, and how it ended when it did.
    pub(super) fn describe(&self, now: Instant) -> String {
        let who = format!("{} pid {}", self.host, self.pid);
        match self.liveness {
            Liveness::Connected => who,
            gone => format!(
                "{who}, which {gone} {:.1} s ago (a rank cannot rejoin a running job)",
                now.saturating_duration_since(self.changed).as_secs_f64()
            ),
        }
    }
}

/// One run: the keys, ranks, waits and events of one job.
#[derive(Debug, Default)]
pub(super) struct Run {
    pub(super) data: BTreeMap<String, Entry>,
    pub(super) ranks: BTreeMap<u32, RankEntry>,
    pub(super) waiters: Waiters,
    /// Counts job events; status long-polls wait for it to pass theirs.
    pub(super) generation: u64,
    pub(super) abort: Option<Vec<u8>>,
    /// Bytes charged to this run (see the module docs).
    pub(super) used: u64,
    /// The largest world size a member of this run declared.
    pub(super) world: u32,
    /// Connections admitted to this run and open now.
    pub(super) conns: usize,
    /// Helper connections open now, per rank.
    pub(super) helpers: BTreeMap<u32, usize>,
    /// Since when it has had no connection (`None` while it has some).
    pub(super) idle_since: Option<Instant>,
}

impl Run {
    /// The job as seen now.
    pub(super) fn status(&self, now: Instant) -> JobStatus {
        JobStatus {
            generation: self.generation,
            ranks: self.ranks.iter().map(|(r, e)| e.status(*r, now)).collect(),
            abort: self.abort.clone(),
        }
    }

    /// What its status answer weighs (see `weight`), before building it.
    pub(super) fn status_weight(&self) -> u64 {
        let ranks: u64 = self.ranks.values().map(RankEntry::cost).sum();
        super::BASE + ranks + self.abort.as_ref().map_or(0, |a| a.len() as u64)
    }

    /// Recomputes what the run should be charged, from scratch (for
    /// invariant checks).
    pub(super) fn recount(&self) -> u64 {
        let data: u64 = self.data.iter().map(|(k, e)| entry_cost(k, &e.value)).sum();
        let ranks: u64 = self.ranks.values().map(RankEntry::cost).sum();
        let waits: u64 = self.waiters.iter().map(|w| w.cost).sum();
        data + ranks + waits + self.abort.as_ref().map_or(0, |a| a.len() as u64)
    }
}
