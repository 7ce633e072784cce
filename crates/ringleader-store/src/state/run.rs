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
use crate::job::{JobChanges, JobStatus, Presence, RankStatus};
use std::collections::{BTreeMap, BTreeSet};
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
    pub(super) liveness: Presence,
    pub(super) host: String,
    pub(super) pid: u32,
    pub(super) version: String,
    pub(super) world_size: u32,
    /// When `liveness` last changed.
    pub(super) changed: Instant,
    /// When the last heartbeat arrived, and its payload.
    pub(super) heartbeat: Option<(Instant, Vec<u8>)>,
    /// The job generation of its last liveness change (its key in
    /// [`Run::changed`]).
    pub(super) generation: u64,
    /// Connected, but no heartbeat for [`Limits::silent_after`](super::Limits):
    /// listed among the changes until it beats again.
    pub(super) silent: bool,
    /// Its key in [`Run::beats`] while it is connected and not silent.
    pub(super) beat_at: Instant,
    /// It went silent once: from then on each of its changes is listed,
    /// so that the ranks told it went silent also learn it beats again.
    pub(super) was_silent: bool,
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
            Presence::Connected => who,
            gone => format!(
                "{who}, which {gone} {:.1} s ago (a rank cannot rejoin a running job)",
                now.saturating_duration_since(self.changed).as_secs_f64()
            ),
        }
    }
}

/// Which changes an answer to a `changes` request carries (see
/// [`Run::changes_since`]).
#[derive(Debug)]
pub(super) struct ChangesPlan {
    pub(super) ranks: Vec<u32>,
    pub(super) upto: u64,
    pub(super) abort: bool,
    pub(super) more: bool,
    pub(super) weight: u64,
}

/// One run: the keys, ranks, waits and events of one job.
#[derive(Debug, Default)]
pub(super) struct Run {
    pub(super) data: BTreeMap<String, Entry>,
    pub(super) ranks: BTreeMap<u32, RankEntry>,
    pub(super) waiters: Waiters,
    /// Counts job events; status long-polls wait for it to pass theirs.
    pub(super) generation: u64,
    /// Every rank that left or vanished, under the generation of that
    /// change, so that the changes after a generation are a range, not a
    /// scan of every rank. Joins are not here: they advance the generation,
    /// but every rank joins before a job runs, so a reader starting from
    /// generation 0 reads only the departures (the status lists the rest).
    pub(super) changed: BTreeMap<u64, u32>,
    /// The connected ranks that are not silent, by their last heartbeat (or
    /// their arrival): the first ones are the next to go silent, found
    /// without a scan of every rank.
    pub(super) beats: BTreeSet<(Instant, u32)>,
    pub(super) abort: Option<Vec<u8>>,
    /// The generation at which the abort record was set.
    pub(super) abort_generation: u64,
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

    /// The changes after generation `since` for an answer of at most
    /// about `budget` bytes (at least one rank's change, so that a reader
    /// always advances): the ranks, the generation the answer brings the
    /// reader to, whether the abort record belongs in it, whether more
    /// remain, and what the answer weighs (see `weight`). A `since` ahead
    /// of this run (a reader of an earlier store) reads from the start.
    pub(super) fn changes_since(&self, since: u64, budget: u64) -> ChangesPlan {
        let since = if since > self.generation { 0 } else { since };
        let mut plan = ChangesPlan { ranks: Vec::new(), upto: self.generation, abort: false, more: false, weight: 0 };
        let mut weight = super::BASE;
        for (&generation, &rank) in self.changed.range(since + 1..) {
            let Some(entry) = self.ranks.get(&rank) else { continue };
            let cost = entry.cost();
            if !plan.ranks.is_empty() && weight.saturating_add(cost) > budget {
                plan.upto = generation - 1;
                plan.more = true;
                break;
            }
            weight = weight.saturating_add(cost);
            plan.ranks.push(rank);
        }
        plan.abort = self.abort.is_some() && self.abort_generation > since && self.abort_generation <= plan.upto;
        if plan.abort {
            weight = weight.saturating_add(self.abort.as_ref().map_or(0, |a| a.len() as u64));
        }
        plan.weight = weight;
        plan
    }

    /// The answer `plan` describes, as seen now.
    pub(super) fn changes(&self, plan: &ChangesPlan, now: Instant) -> JobChanges {
        JobChanges {
            generation: plan.upto,
            ranks: plan.ranks.iter().filter_map(|r| Some(self.ranks.get(r)?.status(*r, now))).collect(),
            abort: if plan.abort { self.abort.clone() } else { None },
            more: plan.more,
        }
    }

    /// A job event: the generation advances, and a rank's liveness change
    /// (`None`: the abort record) is filed under it.
    pub(super) fn record_event(&mut self, rank: Option<u32>) {
        self.generation += 1;
        let g = self.generation;
        match rank {
            Some(rank) => {
                if let Some(e) = self.ranks.get_mut(&rank) {
                    self.changed.remove(&e.generation);
                    e.generation = g;
                    if e.liveness != Presence::Connected || e.silent || e.was_silent {
                        self.changed.insert(g, rank);
                    }
                }
            }
            None => self.abort_generation = g,
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
