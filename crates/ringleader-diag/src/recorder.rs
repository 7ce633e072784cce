//! The flight recorder: the last N operations of a communicator, always on.
//!
//! A fixed ring of entries that overwrites the oldest, as crossbeam's
//! bounded queue can: recording never allocates after start-up and never
//! waits for a reader for longer than one entry copy. The progress of the
//! operation in flight (what the watchdog and the heartbeat read every
//! second) sits in atomics beside the ring, so reading it takes no lock and
//! works with the ring turned off (`RINGLEADER_FR_SIZE=0`).

use crate::callsite::CallSite;
use crate::clock;
use parking_lot::Mutex;
use ringleader_core::{Fingerprint, OpKind, Rank};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Lifecycle of one recorded operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Submitted, not started (queued behind another operation).
    Scheduled,
    /// Running.
    Started,
    /// Finished successfully.
    Completed,
    /// Finished with an error.
    Failed,
}

/// One recorded operation. Field names follow PyTorch's flight recorder
/// where they mean the same thing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Position in this communicator's history, from 0.
    pub record_id: u64,
    /// Collective sequence number (0 for send/recv, which use `p2p_seq_id`).
    pub collective_seq_id: u64,
    /// Per-peer sequence number of a send or receive.
    pub p2p_seq_id: u64,
    /// e.g. `ringleader:all_reduce`.
    pub profiling_name: String,
    /// The call.
    pub fingerprint: Fingerprint,
    /// Element counts of the inputs.
    pub input_sizes: Vec<Vec<u64>>,
    /// PyTorch dtype names of the inputs.
    pub input_dtypes: Vec<String>,
    /// Lifecycle state.
    pub state: State,
    /// Wall clock, ns since the Unix epoch.
    pub time_created_ns: u64,
    /// When it started running.
    pub time_discovered_started_ns: Option<u64>,
    /// When it finished.
    pub time_discovered_completed_ns: Option<u64>,
    /// The hard timeout in force.
    pub timeout_ms: u64,
    /// Peers it was still waiting for when last observed (or when it failed).
    pub awaited_peers: Vec<Rank>,
    /// The error it failed with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Where the user's code made the call (`train.py:24 in step`,
    /// `src/main.rs:12`), when the caller said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_site: Option<String>,
}

impl Entry {
    /// `all_reduce #7`, or `send #3 (to rank 1)` for point-to-point.
    pub fn label(&self) -> String {
        let fp = &self.fingerprint;
        if fp.op.is_p2p() {
            let dir = if fp.op == OpKind::Send { "to" } else { "from" };
            format!("{} #{} ({dir} rank {})", fp.op, self.p2p_seq_id, fp.root.unwrap_or(0))
        } else {
            format!("{} #{}", fp.op, self.collective_seq_id)
        }
    }
}

/// Wall clock now, ns since the Unix epoch.
pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Lock-free progress counters of a communicator.
#[derive(Debug)]
pub struct Progress {
    /// Highest collective sequence number started (0 = none yet).
    pub last_started: AtomicU64,
    /// Highest collective sequence number completed.
    pub last_completed: AtomicU64,
    /// Record id + 1 of the operation running now (0 = idle).
    pub running: AtomicU64,
    /// When the running operation started (a [`clock`] stamp; read its
    /// age with [`clock::Reader::age_ns`]).
    pub running_since: AtomicU64,
    /// Record id + 1 of the collective that completed last (0 = none).
    pub last_completed_record: AtomicU64,
}

/// A communicator's flight recorder.
///
/// ```
/// use ringleader_core::{DType, Fingerprint, OpKind};
/// use ringleader_diag::recorder::{FlightRecorder, State};
/// let fr = FlightRecorder::new(2, 600_000);
/// for seq in 1..=3 {
///     let id = fr.record(Fingerprint::new(OpKind::Barrier, DType::U8, 0), seq, 0);
///     fr.started(id);
///     fr.completed(id);
/// }
/// let e = fr.entries();
/// assert_eq!(e.len(), 2); // the oldest was overwritten
/// assert_eq!((e[0].collective_seq_id, e[1].state), (2, State::Completed));
/// ```
#[derive(Debug)]
pub struct FlightRecorder {
    ring: Mutex<Ring>,
    capacity: usize,
    timeout_ms: u64,
    progress: Progress,
}

#[derive(Debug)]
struct Ring {
    slots: Vec<Slot>,
    next_id: u64,
}

/// What the ring keeps per operation: fixed-size, so recording one
/// allocates nothing. [`Entry`] (with its strings and lists, for dumps) is
/// built from it when someone reads the recorder.
#[derive(Debug, Clone)]
struct Slot {
    record_id: u64,
    seq: u64,
    p2p_seq: u64,
    fp: Fingerprint,
    state: State,
    /// [`clock`] stamps; 0: not yet.
    created: u64,
    started: u64,
    completed: u64,
    /// Set only when the operation failed (allocating is fine then).
    failure: Option<Box<(String, Vec<Rank>)>>,
    site: Option<CallSite>,
}

impl Slot {
    fn entry(&self, timeout_ms: u64, clock: &clock::Reader) -> Entry {
        let stamp = |t: u64| (t != 0).then(|| clock.wall_ns(t));
        let (error, awaited) = match &self.failure {
            Some(f) => (Some(f.0.clone()), f.1.clone()),
            None => (None, Vec::new()),
        };
        Entry {
            record_id: self.record_id,
            collective_seq_id: self.seq,
            p2p_seq_id: self.p2p_seq,
            profiling_name: format!("ringleader:{}", self.fp.op),
            fingerprint: self.fp,
            input_sizes: vec![vec![self.fp.count]],
            input_dtypes: vec![self.fp.dtype.torch_name().to_string()],
            state: self.state,
            time_created_ns: clock.wall_ns(self.created),
            time_discovered_started_ns: stamp(self.started),
            time_discovered_completed_ns: stamp(self.completed),
            timeout_ms,
            awaited_peers: awaited,
            error,
            call_site: self.site.map(|s| s.to_string()),
        }
    }
}

impl FlightRecorder {
    /// A recorder keeping `capacity` entries (0 keeps only the progress
    /// counters), stamping `timeout_ms` on each.
    pub fn new(capacity: usize, timeout_ms: u64) -> FlightRecorder {
        FlightRecorder {
            ring: Mutex::new(Ring { slots: Vec::with_capacity(capacity), next_id: 0 }),
            capacity,
            timeout_ms,
            progress: Progress {
                last_started: AtomicU64::new(0),
                last_completed: AtomicU64::new(0),
                running: AtomicU64::new(0),
                running_since: AtomicU64::new(0),
                last_completed_record: AtomicU64::new(0),
            },
        }
    }

    /// The lock-free progress counters.
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// Records a newly submitted operation; returns its record id.
    pub fn record(&self, fp: Fingerprint, seq: u64, p2p_seq: u64) -> u64 {
        self.insert(fp, seq, p2p_seq, None, None)
    }

    /// [`record`](Self::record), keeping where the call was made.
    pub fn record_at(&self, fp: Fingerprint, seq: u64, p2p_seq: u64, site: Option<CallSite>) -> u64 {
        self.insert(fp, seq, p2p_seq, None, site)
    }

    /// Records an operation that starts at once (a blocking call run on the
    /// caller's thread): [`record`](Self::record) and
    /// [`started_seq`](Self::started_seq) in one step, under one lock and one
    /// timestamp, which matters at sub-microsecond collectives.
    pub fn record_started(&self, fp: Fingerprint, seq: u64, p2p_seq: u64) -> u64 {
        self.record_started_at(fp, seq, p2p_seq, None)
    }

    /// [`record_started`](Self::record_started), keeping where the call
    /// was made.
    pub fn record_started_at(&self, fp: Fingerprint, seq: u64, p2p_seq: u64, site: Option<CallSite>) -> u64 {
        let t = clock::now();
        let id = self.insert(fp, seq, p2p_seq, Some(t), site);
        self.mark_running(id, seq, t);
        id
    }

    fn mark_running(&self, id: u64, seq: u64, t: u64) {
        let p = &self.progress;
        p.running_since.store(t, Ordering::Relaxed);
        p.running.store(id + 1, Ordering::Release);
        if seq > 0 {
            p.last_started.fetch_max(seq, Ordering::Relaxed);
        }
    }

    fn insert(&self, fp: Fingerprint, seq: u64, p2p_seq: u64, started: Option<u64>, site: Option<CallSite>) -> u64 {
        let mut ring = self.ring.lock();
        let id = ring.next_id;
        ring.next_id += 1;
        if self.capacity == 0 {
            return id;
        }
        let created = started.unwrap_or_else(clock::now);
        let entry = Slot {
            record_id: id,
            seq,
            p2p_seq,
            fp,
            state: if started.is_some() { State::Started } else { State::Scheduled },
            created,
            started: started.unwrap_or(0),
            completed: 0,
            failure: None,
            site,
        };
        let slot = (id % self.capacity as u64) as usize;
        if slot < ring.slots.len() {
            ring.slots[slot] = entry;
        } else {
            if ring.slots.capacity() == 0 {
                // One allocation up front rather than doublings later.
                ring.slots.reserve_exact(self.capacity.min(4096));
            }
            ring.slots.push(entry);
        }
        id
    }

    fn update(&self, id: u64, f: impl FnOnce(&mut Slot)) {
        if self.capacity == 0 {
            return;
        }
        let mut ring = self.ring.lock();
        let slot = (id % self.capacity as u64) as usize;
        if let Some(e) = ring.slots.get_mut(slot).filter(|e| e.record_id == id) {
            f(e);
        }
    }

    fn seq_of(&self, id: u64) -> Option<u64> {
        if self.capacity == 0 {
            return None;
        }
        let ring = self.ring.lock();
        ring.slots
            .get((id % self.capacity as u64) as usize)
            .filter(|e| e.record_id == id && !e.fp.op.is_p2p())
            .map(|e| e.seq)
    }

    /// Marks `id` running (collective `seq`, 0 for point-to-point).
    pub fn started_seq(&self, id: u64, seq: u64) {
        let t = clock::now();
        self.mark_running(id, seq, t);
        self.update(id, |e| {
            e.state = State::Started;
            e.started = t;
        });
    }

    /// Marks `id` running, reading its sequence number from the ring.
    pub fn started(&self, id: u64) {
        let seq = self.seq_of(id).unwrap_or(0);
        self.started_seq(id, seq);
    }

    /// Marks `id` (collective `seq`, 0 for point-to-point) completed.
    pub fn completed_seq(&self, id: u64, seq: u64) {
        let p = &self.progress;
        if seq > 0 {
            p.last_completed.fetch_max(seq, Ordering::Relaxed);
            p.last_completed_record.fetch_max(id + 1, Ordering::Relaxed);
        }
        p.running.store(0, Ordering::Release);
        self.update(id, |e| {
            e.state = State::Completed;
            e.completed = clock::now();
        });
    }

    /// Marks `id` completed, reading its sequence number from the ring.
    pub fn completed(&self, id: u64) {
        let seq = self.seq_of(id).unwrap_or(0);
        self.completed_seq(id, seq);
    }

    /// Marks `id` failed with `error`, keeping the peers it still awaited.
    pub fn failed(&self, id: u64, error: &str, awaited: Vec<Rank>) {
        self.progress.running.store(0, Ordering::Release);
        self.update(id, |e| {
            e.state = State::Failed;
            e.completed = clock::now();
            e.failure = Some(Box::new((error.to_string(), awaited)));
        });
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> Vec<Entry> {
        let ring = self.ring.lock();
        let mut v = ring.slots.clone();
        drop(ring);
        v.sort_by_key(|e| e.record_id);
        let clock = clock::Reader::new();
        v.iter().map(|s| s.entry(self.timeout_ms, &clock)).collect()
    }

    /// Where operation `id` was called from, if still in the ring and known.
    pub fn site_of(&self, id: u64) -> Option<CallSite> {
        if self.capacity == 0 {
            return None;
        }
        let ring = self.ring.lock();
        ring.slots.get((id % self.capacity as u64) as usize).filter(|e| e.record_id == id).and_then(|e| e.site)
    }

    /// The entry with record id `id`, if still in the ring.
    pub fn entry(&self, id: u64) -> Option<Entry> {
        if self.capacity == 0 {
            return None;
        }
        let ring = self.ring.lock();
        ring.slots
            .get((id % self.capacity as u64) as usize)
            .filter(|e| e.record_id == id)
            .map(|s| s.entry(self.timeout_ms, &clock::Reader::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringleader_core::DType;

    #[test]
    fn progress_tracks_running_and_completed() {
        let fr = FlightRecorder::new(4, 1000);
        let fp = Fingerprint::new(OpKind::AllReduce, DType::F32, 3);
        let a = fr.record(fp, 1, 0);
        fr.started(a);
        assert_eq!(fr.progress().running.load(Ordering::Relaxed), a + 1);
        assert_eq!(fr.progress().last_started.load(Ordering::Relaxed), 1);
        fr.completed(a);
        assert_eq!(fr.progress().running.load(Ordering::Relaxed), 0);
        assert_eq!(fr.progress().last_completed.load(Ordering::Relaxed), 1);
        let b = fr.record(fp, 2, 0);
        fr.started(b);
        fr.failed(b, "boom", vec![1]);
        let e = fr.entry(b).unwrap();
        assert_eq!((e.state, e.awaited_peers.clone()), (State::Failed, vec![1]));
        assert_eq!(e.label(), "all_reduce #2");
    }

    #[test]
    fn off_keeps_counters_only() {
        let fr = FlightRecorder::new(0, 1000);
        let fp = Fingerprint::new(OpKind::Barrier, DType::U8, 0);
        let a = fr.record(fp, 1, 0);
        fr.started_seq(a, 1);
        fr.completed_seq(a, 1);
        assert!(fr.entries().is_empty());
        assert_eq!(fr.progress().last_completed.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn concurrent_readers_see_whole_entries() {
        let fr = std::sync::Arc::new(FlightRecorder::new(16, 1000));
        let fp = Fingerprint::new(OpKind::AllReduce, DType::F32, 3);
        let r = fr.clone();
        let reader = std::thread::spawn(move || {
            for _ in 0..200 {
                for e in r.entries() {
                    assert_eq!(e.input_sizes, vec![vec![3]]);
                }
            }
        });
        for seq in 1..=2000 {
            let id = fr.record(fp, seq, 0);
            fr.started(id);
            fr.completed(id);
        }
        reader.join().unwrap();
        assert_eq!(fr.entries().len(), 16);
    }
}
