//! The flight recorder: the last N operations of a communicator, always on.
//!
//! A fixed ring of entries that overwrites the oldest. Recording sits on
//! the path of every collective, which over shared memory takes well under
//! a microsecond, so it takes no lock and no atomic read-modify-write beyond
//! the one that numbers the record: each slot is a seqlock (a version that
//! is odd while its writer fills the slot, the fields as relaxed atomic
//! words), written by the one thread that records the operation and then by
//! the one that runs it, and read by whoever dumps the recorder, who retries
//! a slot that changed under it. Failures, which are rare and carry text,
//! go to a small side table under a lock.
//!
//! The progress of the operation in flight (what the watchdog and the
//! heartbeat read every second) sits in atomics beside the ring, so reading
//! it takes no lock and works with the ring turned off
//! (`RINGLEADER_FR_SIZE=0`).
//!
//! One limit, accepted for the speed: an operation still in flight after the
//! ring has wrapped past it (more than `RINGLEADER_FR_SIZE` later operations
//! recorded meanwhile) has lost its slot; its late "started" or "completed"
//! is dropped, and in the nanoseconds between checking that the slot is
//! still its own and writing, it could land in the newer record (whose
//! stamps a reader then finds out of order and drops).

use crate::callsite::{CallSite, Tag, TagText};
use crate::clock;
use parking_lot::Mutex;
use ringleader_core::config::MAX_FR_SIZE;
use ringleader_core::{Fingerprint, OpKind, Rank};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::panic::Location;
use std::sync::atomic::{fence, AtomicPtr, AtomicU64, Ordering};
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
    /// A power of two of slots (at least the capacity asked for), so that
    /// finding an id's slot is a mask, not a division.
    slots: Box<[Slot]>,
    /// `slots.len() - 1` (0 with no slots): an id's slot is `id & mask`.
    mask: u64,
    /// How many entries a reader gets: the capacity asked for.
    capacity: usize,
    next_id: AtomicU64,
    /// Why recent operations failed, by record id (at most [`FAILURES_KEPT`]).
    failures: Mutex<VecDeque<(u64, Failure)>>,
    timeout_ms: u64,
    progress: Progress,
}

/// Failures whose text is kept (older ones still show as failed, without
/// the text).
const FAILURES_KEPT: usize = 64;

/// How a failed operation ended: the error and the peers it still awaited.
#[derive(Debug, Clone)]
struct Failure {
    error: String,
    awaited: Vec<Rank>,
}

/// One operation in the ring: words only, so that recording allocates
/// nothing and a reader never sees a half-written value of one field; one
/// cache line, so that recording an operation costs one line's worth of
/// memory traffic (a ring larger than the caches costs a miss per line on
/// the collective's path, and the next atomic instruction waits for it).
/// [`Entry`] (with its strings and lists, for dumps) is built from it when
/// someone reads the recorder.
#[derive(Debug, Default)]
#[repr(C, align(64))]
struct Slot {
    /// Seqlock version and record id in one word: `2 * (id + 1)` once the
    /// record is written, odd while it is being written, 0 never used.
    version: AtomicU64,
    /// The collective sequence number, or the send/recv one for those.
    seq: AtomicU64,
    /// [`Fingerprint::encode`], as two words.
    fp: [AtomicU64; 2],
    /// [`clock`] stamps; 0: not yet.
    created: AtomicU64,
    started: AtomicU64,
    /// When it ended, with [`FAILED`] set if it failed (0: not yet): set
    /// outside the seqlock, by the thread that ran it, in one store.
    done: AtomicU64,
    /// The call site, packed by [`pack_site`] (0: none).
    site: AtomicPtr<()>,
}

/// The bit of `done` that says the operation failed (stamps never reach it).
const FAILED: u64 = 1 << 63;
/// Set in [`Slot::done`] when the rest is not a stamp but the nanoseconds
/// the operation ran after it started ([`FlightRecorder::completed_after`]).
/// A stamp never has it: the counter would need decades to reach it.
const AFTER: u64 = 1 << 62;

/// What a reader copies out of a slot.
#[derive(Debug, Clone, Copy)]
struct Record {
    id: u64,
    seq: u64,
    fp: Fingerprint,
    created: u64,
    started: u64,
    done: u64,
    failed: bool,
    site: Option<CallSite>,
}

/// What [`FlightRecorder::write_started`] writes of an operation begun
/// with [`FlightRecorder::begin_started`].
#[derive(Debug, Clone, Copy)]
pub struct Started {
    /// The call.
    pub fp: Fingerprint,
    /// `fp`'s [`Fingerprint::words`], as the record stores them: a caller
    /// that has them at hand (once per call) saves computing them again.
    pub words: [u64; 2],
    /// Its collective sequence number (0 for send/recv).
    pub seq: u64,
    /// Its send/recv sequence number (0 for collectives).
    pub p2p_seq: u64,
    /// The start stamp `begin_started` returned.
    pub at: u64,
    /// Where the user's code made the call.
    pub site: Option<CallSite>,
}

/// A call site as one word: the address of its `Location` or of its
/// interned text, the low bit telling which (both are 8-aligned).
#[inline]
fn pack_site(site: Option<CallSite>) -> *mut () {
    match site {
        None => std::ptr::null_mut(),
        Some(CallSite::Rust(l)) => (l as *const Location<'static>).cast_mut().cast(),
        Some(CallSite::Tag(t)) => (t.text() as *const TagText).cast_mut().cast::<()>().map_addr(|a| a | 1),
    }
}

#[allow(unsafe_code)]
fn unpack_site(p: *mut ()) -> Option<CallSite> {
    if p.is_null() {
        return None;
    }
    if p.addr() & 1 == 0 {
        // SAFETY: a slot's site word is only ever written by `pack_site`,
        // in one atomic store, and an even non-null word is the address of
        // a `&'static Location`.
        return Some(CallSite::Rust(unsafe { &*p.cast::<Location<'static>>() }));
    }
    // SAFETY: as above; an odd word is the address of a leaked, never
    // freed `TagText` with its low bit set.
    let text = unsafe { &*p.map_addr(|a| a & !1).cast::<TagText>() };
    Some(CallSite::Tag(Tag::from_text(text)))
}

/// Asks the CPU to bring `slot`'s line into the cache ahead of its write,
/// off the critical path: a prefetch is a hint, which no fence or atomic
/// instruction waits for, where a load would be.
#[inline]
#[allow(unsafe_code)]
fn prefetch(slot: &Slot) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing into the program, cannot fault and
    // has no effect but on the caches; SSE is part of x86-64.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((slot as *const Slot).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = slot;
}

impl Slot {
    /// Fills the slot with record `id`: operation `seq` (the collective or
    /// send/recv number), fingerprint `words` ([`Fingerprint::words`]),
    /// its stamps (`done` 0 while it has not ended) and call site. Only the thread that numbered the record
    /// writes it, so plain stores bracket the fields.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn write(&self, id: u64, seq: u64, words: [u64; 2], created: u64, started: u64, done: u64, site: Option<CallSite>) {
        // Any odd value marks the slot as being written; this one needs no
        // load of the slot's old version first.
        self.version.store(2 * id + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        let [w0, w1] = words;
        self.seq.store(seq, Ordering::Relaxed);
        self.fp[0].store(w0, Ordering::Relaxed);
        self.fp[1].store(w1, Ordering::Relaxed);
        self.created.store(created, Ordering::Relaxed);
        self.started.store(started, Ordering::Relaxed);
        self.done.store(done, Ordering::Relaxed);
        self.site.store(pack_site(site), Ordering::Relaxed);
        self.version.store(2 * (id + 1), Ordering::Release);
    }

    /// A consistent copy of the record, if the slot holds one and it held
    /// still long enough to be read (a few tries).
    fn read(&self) -> Option<Record> {
        for _ in 0..64 {
            let v1 = self.version.load(Ordering::Acquire);
            if v1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let seq = self.seq.load(Ordering::Relaxed);
            let fp = [self.fp[0].load(Ordering::Relaxed), self.fp[1].load(Ordering::Relaxed)];
            let created = self.created.load(Ordering::Relaxed);
            let started = self.started.load(Ordering::Relaxed);
            let site = self.site.load(Ordering::Relaxed);
            let done = self.done.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if self.version.load(Ordering::Relaxed) != v1 {
                continue;
            }
            if v1 == 0 {
                return None;
            }
            let mut bytes = [0u8; Fingerprint::ENCODED_LEN];
            bytes[..8].copy_from_slice(&fp[0].to_le_bytes());
            bytes[8..].copy_from_slice(&fp[1].to_le_bytes());
            // Stamps out of order came from an operation that lost this
            // slot (see the module docs): unknown rather than wrong.
            let started = if started >= created { started } else { 0 };
            let ended = match done & !FAILED {
                0 => false,
                d if d & AFTER != 0 => started != 0,
                d => d >= started.max(created),
            };
            return Some(Record {
                id: v1 / 2 - 1,
                seq,
                fp: Fingerprint::decode(&bytes)?,
                created,
                started,
                done: if ended { done & !FAILED } else { 0 },
                failed: ended && done & FAILED != 0,
                site: unpack_site(site),
            });
        }
        None
    }

    /// Whether the slot still holds record `id`.
    #[inline]
    fn holds(&self, id: u64) -> bool {
        self.version.load(Ordering::Relaxed) == 2 * (id + 1)
    }

    #[inline]
    fn finish(&self, id: u64, at: u64, failed: bool) {
        if self.holds(id) {
            self.done.store(at | if failed { FAILED } else { 0 }, Ordering::Relaxed);
        }
    }
}

impl Record {
    fn entry(&self, timeout_ms: u64, clock: &clock::Reader, failure: Option<&Failure>) -> Entry {
        let stamp = |t: u64| (t != 0).then(|| clock.wall_ns(t));
        let p2p = self.fp.op.is_p2p();
        let state = match (self.failed, self.done, self.started) {
            (true, _, _) => State::Failed,
            (false, d, _) if d != 0 => State::Completed,
            (false, _, s) if s != 0 => State::Started,
            _ => State::Scheduled,
        };
        Entry {
            record_id: self.id,
            collective_seq_id: if p2p { 0 } else { self.seq },
            p2p_seq_id: if p2p { self.seq } else { 0 },
            profiling_name: format!("ringleader:{}", self.fp.op),
            fingerprint: self.fp,
            input_sizes: vec![vec![self.fp.count]],
            input_dtypes: vec![self.fp.dtype.torch_name().to_string()],
            state,
            time_created_ns: clock.wall_ns(self.created),
            time_discovered_started_ns: stamp(self.started),
            time_discovered_completed_ns: match self.done {
                d if d & AFTER != 0 => stamp(self.started).map(|t| t.saturating_add(d & !AFTER)),
                d => stamp(d),
            },
            timeout_ms,
            awaited_peers: failure.map(|f| f.awaited.clone()).unwrap_or_default(),
            error: failure.map(|f| f.error.clone()),
            call_site: self.site.map(|s| s.to_string()),
        }
    }
}

impl FlightRecorder {
    /// A recorder keeping `capacity` entries (0 keeps only the progress
    /// counters; at most [`MAX_FR_SIZE`]), stamping `timeout_ms` on each.
    pub fn new(capacity: usize, timeout_ms: u64) -> FlightRecorder {
        let capacity = capacity.min(MAX_FR_SIZE);
        let slots: Box<[Slot]> = match capacity {
            0 => Box::default(),
            n => (0..n.next_power_of_two()).map(|_| Slot::default()).collect(),
        };
        FlightRecorder {
            mask: (slots.len() as u64).saturating_sub(1),
            slots,
            capacity,
            next_id: AtomicU64::new(0),
            failures: Mutex::new(VecDeque::new()),
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
        self.record_stamped(fp, seq, p2p_seq, site).0
    }

    /// [`record_at`](Self::record_at), returning the record's id and its
    /// creation stamp: an operation that then starts at once passes the
    /// stamp to [`started_at`](Self::started_at) instead of reading the
    /// clock again (a send or receive run on the caller's thread).
    #[inline]
    pub fn record_stamped(&self, fp: Fingerprint, seq: u64, p2p_seq: u64, site: Option<CallSite>) -> (u64, u64) {
        let t = clock::now();
        (self.insert(fp, seq, p2p_seq, Some((t, 0)), site), t)
    }

    /// Records an operation that starts at once (a blocking call run on the
    /// caller's thread): [`record`](Self::record) and
    /// [`started_seq`](Self::started_seq) in one step, under one timestamp,
    /// which matters at sub-microsecond collectives.
    pub fn record_started(&self, fp: Fingerprint, seq: u64, p2p_seq: u64) -> u64 {
        self.record_started_at(fp, seq, p2p_seq, None)
    }

    /// [`record_started`](Self::record_started), keeping where the call
    /// was made.
    pub fn record_started_at(&self, fp: Fingerprint, seq: u64, p2p_seq: u64, site: Option<CallSite>) -> u64 {
        let (id, t) = self.begin_started(seq);
        self.write_started(id, Started { fp, words: fp.words(), seq, p2p_seq, at: t, site });
        id
    }

    /// The first half of [`record_started_at`](Self::record_started_at):
    /// numbers an operation that starts at once and marks it running (the
    /// watchdog and the heartbeat see it from here on), without writing
    /// its record; returns its id and start stamp. The caller writes the
    /// record with [`write_started`](Self::write_started) before anything
    /// else is recorded of it. Split so that a blocking call can write its
    /// record while its first frames travel, off the latency of the call.
    #[inline]
    pub fn begin_started(&self, seq: u64) -> (u64, u64) {
        let t = clock::now();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.mark_running(id, seq, t);
        (id, t)
    }

    /// The second half of [`record_started_at`](Self::record_started_at):
    /// writes the record of operation `id`, begun with
    /// [`begin_started`](Self::begin_started).
    #[inline]
    pub fn write_started(&self, id: u64, s: Started) {
        let seq = if s.fp.op.is_p2p() { s.p2p_seq } else { s.seq };
        self.put(id, seq, s.words, [s.at, s.at, 0], s.site);
    }

    /// [`write_started`](Self::write_started) and
    /// [`completed_after`](Self::completed_after) in one step, for a
    /// collective that ended before anything else was recorded of it (a
    /// small one that never waited): one write of its slot instead of two.
    #[inline]
    pub fn write_completed(&self, id: u64, s: Started, ran_ns: Option<u64>) {
        let done = self.complete(id, s.seq, ran_ns);
        let seq = if s.fp.op.is_p2p() { s.p2p_seq } else { s.seq };
        self.put(id, seq, s.words, [s.at, s.at, done], s.site);
    }

    /// Collectives of one communicator start and end one at a time (the
    /// engine runs them in sequence order), so their counters only grow
    /// and need no read-modify-write; send/recv (sequence 0) leaves them.
    #[inline]
    fn raise(counter: &AtomicU64, to: u64) {
        if counter.load(Ordering::Relaxed) < to {
            counter.store(to, Ordering::Relaxed);
        }
    }

    #[inline]
    fn mark_running(&self, id: u64, seq: u64, t: u64) {
        let p = &self.progress;
        p.running_since.store(t, Ordering::Relaxed);
        p.running.store(id + 1, Ordering::Release);
        if seq > 0 {
            Self::raise(&p.last_started, seq);
        }
    }

    #[inline]
    fn slot(&self, id: u64) -> Option<&Slot> {
        // (With no slots, `get` on the empty slice is `None`.)
        self.slots.get((id & self.mask) as usize)
    }

    /// Writes a new record; `stamps`: when it was created and when it
    /// started (0: not yet).
    fn insert(
        &self,
        fp: Fingerprint,
        seq: u64,
        p2p_seq: u64,
        stamps: Option<(u64, u64)>,
        site: Option<CallSite>,
    ) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let seq = if fp.op.is_p2p() { p2p_seq } else { seq };
        let (created, started) = stamps.unwrap_or_else(|| (clock::now(), 0));
        self.put(id, seq, fp.words(), [created, started, 0], site);
        id
    }

    /// Writes record `id` into its slot (see [`Slot::write`]; `stamps`:
    /// created, started, done), and brings the next slot's line into the
    /// cache for the next record.
    #[inline]
    fn put(&self, id: u64, seq: u64, words: [u64; 2], stamps: [u64; 3], site: Option<CallSite>) {
        if let Some(slot) = self.slot(id) {
            let [created, started, done] = stamps;
            slot.write(id, seq, words, created, started, done, site);
            if let Some(next) = self.slot(id + 1) {
                prefetch(next);
            }
        }
    }

    /// Marks `id` running (collective `seq`, 0 for point-to-point).
    pub fn started_seq(&self, id: u64, seq: u64) {
        self.started_at(id, seq, clock::now());
    }

    /// [`started_seq`](Self::started_seq) at stamp `t` (the record's own,
    /// from [`record_stamped`](Self::record_stamped)).
    #[inline]
    pub fn started_at(&self, id: u64, seq: u64, t: u64) {
        self.mark_running(id, seq, t);
        if let Some(slot) = self.slot(id).filter(|s| s.holds(id)) {
            slot.started.store(t, Ordering::Relaxed);
        }
    }

    /// Marks `id` running, reading its sequence number from the ring.
    pub fn started(&self, id: u64) {
        let seq = self.seq_of(id).unwrap_or(0);
        self.started_seq(id, seq);
    }

    fn seq_of(&self, id: u64) -> Option<u64> {
        let r = self.slot(id)?.read().filter(|r| r.id == id)?;
        (!r.fp.op.is_p2p()).then_some(r.seq)
    }

    /// Marks `id` (collective `seq`, 0 for point-to-point) completed.
    pub fn completed_seq(&self, id: u64, seq: u64) {
        self.completed_after(id, seq, None);
    }

    /// [`completed_seq`](Self::completed_seq), `ran_ns` nanoseconds after
    /// it started when the caller knows that without reading the clock: a
    /// clock read at the end of a sub-microsecond collective costs a few
    /// percent of it, on every call.
    #[inline]
    pub fn completed_after(&self, id: u64, seq: u64, ran_ns: Option<u64>) {
        let done = self.complete(id, seq, ran_ns);
        if let Some(slot) = self.slot(id) {
            slot.finish(id, done, false);
        }
    }

    /// Counts record `id` (collective `seq`, 0 for point-to-point)
    /// completed, and returns its done stamp (see
    /// [`completed_after`](Self::completed_after)).
    #[inline]
    fn complete(&self, id: u64, seq: u64, ran_ns: Option<u64>) -> u64 {
        let p = &self.progress;
        if seq > 0 {
            Self::raise(&p.last_completed, seq);
            // Collectives complete in sequence order, but their records
            // need not be numbered in it: two threads submitting at once
            // may record in the other order (see `FlightRecorder::entries`).
            p.last_completed_record.store(id + 1, Ordering::Relaxed);
        }
        p.running.store(0, Ordering::Release);
        match ran_ns {
            Some(ns) => AFTER | ns.min(AFTER - 1),
            None if self.slots.is_empty() => 0,
            None => clock::now(),
        }
    }

    /// Marks `id` completed, reading its sequence number from the ring.
    pub fn completed(&self, id: u64) {
        let seq = self.seq_of(id).unwrap_or(0);
        self.completed_seq(id, seq);
    }

    /// Marks `id` failed with `error`, keeping the peers it still awaited.
    pub fn failed(&self, id: u64, error: &str, awaited: Vec<Rank>) {
        self.progress.running.store(0, Ordering::Release);
        let Some(slot) = self.slot(id) else { return };
        {
            let mut f = self.failures.lock();
            f.retain(|(i, _)| *i != id);
            if f.len() >= FAILURES_KEPT {
                f.pop_front();
            }
            f.push_back((id, Failure { error: error.to_string(), awaited }));
        }
        slot.finish(id, clock::now(), true);
    }

    /// The entries, oldest first: in the order they were recorded, which
    /// for collectives is their sequence numbers' order, except between
    /// calls that two threads submit at the same moment (one numbers its
    /// call, the other numbers and records its own, then the first
    /// records): their records may swap places. They still run, and
    /// their sequence numbers still count, in order.
    pub fn entries(&self) -> Vec<Entry> {
        let mut v: Vec<Record> = self.slots.iter().filter_map(Slot::read).collect();
        v.sort_by_key(|r| r.id);
        let v = &v[v.len().saturating_sub(self.capacity)..];
        let clock = clock::Reader::new();
        let failures = self.failures.lock().clone();
        let failure = |id: u64| failures.iter().find(|(i, _)| *i == id).map(|(_, f)| f);
        v.iter().map(|r| r.entry(self.timeout_ms, &clock, failure(r.id))).collect()
    }

    /// Where operation `id` was called from, if still in the ring and known.
    pub fn site_of(&self, id: u64) -> Option<CallSite> {
        self.slot(id)?.read().filter(|r| r.id == id)?.site
    }

    /// The entry with record id `id`, if still in the ring.
    pub fn entry(&self, id: u64) -> Option<Entry> {
        let r = self.slot(id)?.read().filter(|r| r.id == id)?;
        let failures = self.failures.lock();
        let failure = failures.iter().find(|(i, _)| *i == id).map(|(_, f)| f);
        Some(r.entry(self.timeout_ms, &clock::Reader::new(), failure))
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
    fn a_record_written_under_way_and_ended_by_its_length_reads_whole() {
        let fr = FlightRecorder::new(4, 1000);
        let fp = Fingerprint::new(OpKind::AllReduce, DType::F32, 2);
        let (id, at) = fr.begin_started(7);
        // Running before its record is written: the watchdog sees it.
        assert_eq!(fr.progress().running.load(Ordering::Relaxed), id + 1);
        fr.write_started(id, Started { fp, words: fp.words(), seq: 7, p2p_seq: 0, at, site: None });
        fr.completed_after(id, 7, Some(3_000));
        let e = fr.entry(id).unwrap();
        assert_eq!((e.state, e.label()), (State::Completed, "all_reduce #7".to_string()));
        let (start, end) = (e.time_discovered_started_ns.unwrap(), e.time_discovered_completed_ns.unwrap());
        assert_eq!(end - start, 3000);
        // A length as long as the flag allows stays a length, not a stamp.
        let (id, at) = fr.begin_started(8);
        fr.write_started(id, Started { fp, words: fp.words(), seq: 8, p2p_seq: 0, at, site: None });
        fr.completed_after(id, 8, Some(u64::MAX));
        assert_eq!(fr.entry(id).unwrap().state, State::Completed);
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
        // The writer records call `seq` with `seq` elements, so a record
        // torn between two writes shows as a count that is not its seq.
        let fr = std::sync::Arc::new(FlightRecorder::new(16, 1000));
        let r = fr.clone();
        let reader = std::thread::spawn(move || {
            let mut seen = 0;
            for _ in 0..2000 {
                for e in r.entries() {
                    assert_eq!(e.fingerprint.count, e.collective_seq_id, "{e:?}");
                    assert_eq!(e.input_sizes, vec![vec![e.collective_seq_id]]);
                    seen += 1;
                }
            }
            seen
        });
        for seq in 1..=200_000 {
            let id = fr.record(Fingerprint::new(OpKind::AllReduce, DType::F32, seq), seq, 0);
            fr.started(id);
            fr.completed(id);
        }
        assert!(reader.join().unwrap() > 0);
        let e = fr.entries();
        assert_eq!(e.len(), 16);
        assert!(e.iter().all(|e| e.state == State::Completed));
        assert_eq!(e.last().unwrap().collective_seq_id, 200_000);
    }

    #[test]
    fn capacity_is_what_a_reader_gets_and_failures_stay_failed() {
        let fr = FlightRecorder::new(3, 1000); // four slots underneath
        let fp = Fingerprint::new(OpKind::Broadcast, DType::U8, 1);
        let ids: Vec<u64> = (1..=5).map(|seq| fr.record_started(fp, seq, 0)).collect();
        for &id in &ids[..4] {
            fr.completed_seq(id, id + 1);
        }
        fr.failed(ids[4], "boom", vec![3]);
        let e = fr.entries();
        assert_eq!(e.iter().map(|e| e.collective_seq_id).collect::<Vec<_>>(), vec![3, 4, 5]);
        assert_eq!(
            (e[2].state, e[2].error.as_deref(), e[2].awaited_peers.clone()),
            (State::Failed, Some("boom"), vec![3])
        );
        // More failures than are kept with their text: still failed.
        for seq in 6..6 + FAILURES_KEPT as u64 + 2 {
            let id = fr.record_started(fp, seq, 0);
            fr.failed(id, "again", vec![]);
        }
        let first = fr.failures.lock().front().map(|f| f.0).unwrap();
        assert!(first > ids[4]);
        let fr2 = FlightRecorder::new(2, 1000);
        let a = fr2.record_started(fp, 1, 0);
        fr2.failed(a, "x", vec![]);
        fr2.failures.lock().clear();
        assert_eq!((fr2.entry(a).unwrap().state, fr2.entry(a).unwrap().error), (State::Failed, None));
    }

    #[test]
    fn an_operation_that_lost_its_slot_leaves_the_newer_record_alone() {
        let fr = FlightRecorder::new(2, 1000);
        let fp = Fingerprint::new(OpKind::Recv, DType::U8, 4).with_root(1);
        let old = fr.record(fp, 0, 1);
        let newer: Vec<u64> = (2..=3).map(|s| fr.record(fp, 0, s)).collect();
        fr.started(old);
        fr.completed(old);
        let e = fr.entries();
        assert_eq!(e.iter().map(|e| e.p2p_seq_id).collect::<Vec<_>>(), vec![2, 3]);
        assert!(e.iter().all(|e| e.state == State::Scheduled && e.collective_seq_id == 0), "{e:?}");
        assert!(fr.entry(old).is_none() && fr.entry(newer[1]).is_some());
    }

    #[test]
    fn call_sites_of_both_kinds_come_back() {
        let fr = FlightRecorder::new(4, 1000);
        let fp = Fingerprint::new(OpKind::Barrier, DType::U8, 0);
        let here = CallSite::Rust(Location::caller());
        let tag = CallSite::Tag(crate::callsite::intern("train.py:9 in step"));
        let a = fr.record_at(fp, 1, 0, Some(here));
        let b = fr.record_at(fp, 2, 0, Some(tag));
        let c = fr.record_at(fp, 3, 0, None);
        assert_eq!((fr.site_of(a), fr.site_of(b), fr.site_of(c)), (Some(here), Some(tag), None));
        assert_eq!(fr.entry(b).unwrap().call_site.as_deref(), Some("train.py:9 in step"));
    }
}
