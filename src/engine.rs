//! The progress engine: runs a communicator's operations one at a time, in
//! submission order, like a stream.
//!
//! A synchronous call from an idle communicator runs on the caller's thread
//! (no hand-off, which would cost two context switches on a busy machine);
//! otherwise it queues behind the operations already submitted and waits.
//! Asynchronous calls always queue; the engine thread runs them. Either way
//! each operation gets its sequence number at submission, is recorded in the
//! flight recorder, and ends in exactly one completion.
//!
//! A panic while an operation runs (in the engine, the algorithm, or the
//! transport's driver), on either thread, is caught: the operation ends with
//! an `internal` error naming it, the communicator is aborted, and the other
//! ranks learn through the job-wide abort (see [`crate::failure`]). Every
//! waiter is completed; nothing waits on a thread that died.

use crate::algo::{self, Coll, Shape};
use crate::rawbuf::RawBuf;
use crate::rendezvous::PeerInfo;
use crate::watchdog;
use crate::work::Completion;
use parking_lot::{Condvar, Mutex};
use ringleader_core::fault::{self, Point};
use ringleader_core::reduce::finish_avg;
use ringleader_core::{AbortSignal, Config, Error, Fingerprint, Rank, RankSet, ReduceOp, Result};
use ringleader_diag::CallSite;
use ringleader_diag::{Beat, FlightRecorder, Observation, Snapshot, Started};
use ringleader_store::StoreClient;
use ringleader_transport::stream_copy::{copy_streaming, STREAM_MIN_BUFFER};
use ringleader_transport::{AnyLink, Buf, Deadline, Driver, OpInfo, Plan, Region, Watch};
use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What an engine operation does (sends and receives are the lane's:
/// `p2p.rs`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Task {
    Coll(Coll),
    MonitoredBarrier { timeout: Duration, wait_all: bool },
}

/// An operation as submitted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Submission {
    pub task: Task,
    pub fp: Fingerprint,
    pub io: RawBuf,
    pub io_ro: bool,
    pub out: RawBuf,
    /// Where the user's code made the call.
    pub site: Option<CallSite>,
}

/// The largest collective (bytes per rank) whose inline run, if it never
/// slept, is recorded as ending when its start stamp plus the time its
/// driver saw it wait ([`Driver::spun`]) says: the driver's clock reads
/// miss only the moving of a few kilobytes, and a clock read at the end of
/// a sub-microsecond call costs a few percent of it.
const AT_ONCE_MAX: u64 = 4096;

/// An operation with its number and its completion.
#[derive(Debug)]
pub(crate) struct Job {
    pub task: Task,
    pub fp: Fingerprint,
    /// `fp`'s [`Fingerprint::words`]: the running collective, its flight
    /// record and its plan's key each store or compare them.
    words: [u64; 2],
    /// Collective sequence number (sends and receives never reach the
    /// engine: they are the lane's, numbered per peer).
    pub seq: u64,
    pub record: u64,
    io: RawBuf,
    io_ro: bool,
    out: RawBuf,
    pub timeout: Duration,
    /// Where waiters learn the result (none for an inline run: its caller
    /// gets the result directly).
    pub done: Option<Arc<Completion>>,
    /// Already marked started in the flight recorder (an inline run is
    /// recorded and started in one step).
    started: bool,
    /// An inline run's flight record, until it is written: while the
    /// run's first frames travel (`Watch::under_way`), else before
    /// anything else is recorded of it (`Shared::write_record`).
    /// (Its start stamp and call site: the rest of the record is above.)
    unwritten: Cell<Option<(u64, Option<CallSite>)>>,
    /// How long an inline run of a small collective ran, when its driver
    /// can tell without a clock read (see `AT_ONCE_MAX`).
    ran: Cell<Option<Duration>>,
    /// This rank (for the error of a job dropped unfinished).
    owner: Rank,
}

impl Drop for Job {
    /// A job dropped before its completion was given (its runner unwound
    /// past it) still completes its waiters.
    fn drop(&mut self) {
        if let Some(d) = &self.done {
            d.complete_if_pending(|| Error::Internal {
                rank: self.owner,
                op: Some((self.fp.op, self.seq)),
                what: "the operation was dropped before it completed".into(),
            });
        }
    }
}

#[derive(Debug)]
struct Sched {
    queue: VecDeque<Job>,
    busy: bool,
    shutdown: bool,
    seq: u64,
}

/// What running an operation needs, used by one operation at a time.
#[derive(Debug)]
pub(crate) struct Exec {
    pub links: Vec<Vec<AnyLink>>,
    driver: Driver,
    plan: Plan,
    /// What `plan` was built for and what to do around it: a training loop
    /// repeats the same small calls, and rebuilding the same plan each
    /// time costs as much as sending it. The key is the call's fingerprint
    /// ([`Fingerprint::words`]), which names the collective and its element
    /// type (the rest of a schedule's inputs are the communicator's), and
    /// compares in two words.
    planned: Option<([u64; 2], algo::Prep)>,
    plan_scratch: algo::Scratch,
    scratch: Vec<u64>,
}

/// State shared by the communicator handle, the engine thread and the
/// monitor thread.
pub(crate) struct Shared {
    pub cfg: Config,
    /// The algorithm `cfg.algo` forces, parsed once here (`None`: each
    /// collective picks by size).
    algo: Option<algo::Algo>,
    pub rank: Rank,
    pub world: usize,
    pub host: String,
    pub abort: AbortSignal,
    pub fr: FlightRecorder,
    sched: Mutex<Sched>,
    sched_cv: Condvar,
    /// The queue's length as of its last change, read without the lock by
    /// the engine thread while it polls for work.
    queued: AtomicUsize,
    /// How long the engine thread polls for more work, and waits for
    /// queued operations poll, before they sleep (`work::poll_budget`).
    pub poll: Duration,
    pub exec: Mutex<Exec>,
    /// The verdict once an operation failed: every later one returns it.
    pub failure: crate::sticky::Sticky,
    /// The auxiliary store connection (failure handling, monitored barrier).
    pub store: Mutex<StoreClient>,
    pub store_addr: String,
    /// Whether the store lives in rank 0's process (it dies with rank 0).
    pub store_in_rank0: bool,
    pub peers: Vec<PeerInfo>,
    /// The operation running now: (collective seq, fingerprint).
    pub current: crate::running::Running,
    /// Hard timeout of the running operation, in ms.
    pub op_timeout_ms: AtomicU64,
    pub destroyed: AtomicBool,
    /// Calls in flight on the caller side (submitting, or waiting for a
    /// synchronous operation), which destroying waits for.
    inflight: std::sync::atomic::AtomicUsize,
    /// Guards the wake-up of a destroy waiting for `inflight` to drop to 0.
    inflight_lock: Mutex<()>,
    inflight_cv: Condvar,
    /// Set by [`crate::Communicator::abort`]: the caller knows why.
    pub user_aborted: AtomicBool,
    /// What the data plane is made of (`tcp`, `shm`, `shm+tcp`).
    pub plane: &'static str,
    /// This process's wall clock against the store's, measured by the
    /// monitor as it starts, so that timelines of several hosts line up.
    pub clock: std::sync::OnceLock<ringleader_store::ClockOffset>,
    /// Sends and receives, on their own lane.
    pub p2p: crate::p2p::P2p,
    /// Same-host peers whose process was seen ending (through a pidfd), for
    /// a verdict reached without the store.
    pub ended: Mutex<Vec<Rank>>,
    /// Where this process's threads were when this communicator first
    /// learned that the job failed (see [`crate::stacks`]): kept, so that
    /// every later snapshot and dump of this failure shows that moment.
    pub stacks: Mutex<Option<Arc<ringleader_diag::stacks::Stacks>>>,
    /// The peers the running collective waits for, as the data plane
    /// publishes them.
    pub awaited: RankSet,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("rank", &self.rank).field("world", &self.world).finish()
    }
}

/// A call in flight (see [`Shared::enter`]).
#[derive(Debug)]
pub(crate) struct CallGuard<'a>(&'a Shared);

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        if self.0.inflight.fetch_sub(1, Ordering::SeqCst) == 1 && self.0.destroyed.load(Ordering::SeqCst) {
            // Under the lock, so a destroy between its check and its wait
            // cannot miss this.
            let _g = self.0.inflight_lock.lock();
            self.0.inflight_cv.notify_all();
        }
    }
}

/// How a submission proceeds.
pub(crate) enum Enqueued {
    /// Run it now on this thread, as [`Shared::inline_job`] makes it from
    /// the submission and this, then call [`Shared::finish_inline`]. (The
    /// job is made where it runs: moving it costs as much as a small
    /// collective's bookkeeping.)
    Inline(Claimed),
    /// The engine thread will run it.
    Queued(Arc<Completion>, u64),
}

/// An inline run's number, flight record and start stamp.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claimed {
    seq: u64,
    record: u64,
    at: u64,
}

/// What a rank that joined its job hands the engine ([`Shared::new`]).
pub(crate) struct EngineParts {
    pub cfg: Config,
    pub host: String,
    pub abort: AbortSignal,
    /// The collectives' links (`links[peer][stream]`).
    pub links: Vec<Vec<AnyLink>>,
    pub driver: Driver,
    /// The send/recv lane.
    pub p2p: crate::p2p::P2p,
    /// The auxiliary store connection.
    pub store: StoreClient,
    pub store_addr: String,
    pub store_in_rank0: bool,
    pub peers: Vec<PeerInfo>,
}

impl Shared {
    pub(crate) fn new(parts: EngineParts) -> Shared {
        let EngineParts { cfg, host, abort, links, driver, p2p, store, store_addr, store_in_rank0, peers } = parts;
        let world = cfg.world_size;
        Shared {
            rank: cfg.rank,
            world,
            host,
            fr: FlightRecorder::new(cfg.fr_size, cfg.timeout.as_millis() as u64),
            abort,
            sched: Mutex::new(Sched { queue: VecDeque::new(), busy: false, shutdown: false, seq: 0 }),
            sched_cv: Condvar::new(),
            queued: AtomicUsize::new(0),
            poll: Duration::ZERO,
            exec: Mutex::new(Exec {
                links,
                driver,
                plan: Plan::default(),
                planned: None,
                plan_scratch: algo::Scratch::default(),
                scratch: Vec::new(),
            }),
            failure: crate::sticky::Sticky::default(),
            store: Mutex::new(store),
            store_addr,
            store_in_rank0,
            peers,
            current: crate::running::Running::default(),
            op_timeout_ms: AtomicU64::new(cfg.timeout.as_millis() as u64),
            destroyed: AtomicBool::new(false),
            inflight: std::sync::atomic::AtomicUsize::new(0),
            inflight_lock: Mutex::new(()),
            inflight_cv: Condvar::new(),
            user_aborted: AtomicBool::new(false),
            plane: "tcp",
            clock: std::sync::OnceLock::new(),
            p2p,
            ended: Mutex::new(Vec::new()),
            stacks: Mutex::new(None),
            awaited: RankSet::new(world),
            algo: algo::Algo::forced(cfg.algo),
            cfg,
        }
    }

    /// Registers a call in flight on the caller's thread; fails once the
    /// communicator is destroyed. Destroying waits (bounded) until every
    /// guard is dropped.
    pub(crate) fn enter(&self) -> Result<CallGuard<'_>> {
        self.inflight.fetch_add(1, Ordering::SeqCst);
        let guard = CallGuard(self);
        if self.destroyed.load(Ordering::SeqCst) {
            return Err(Error::aborted("the communicator was destroyed"));
        }
        Ok(guard)
    }

    /// How many calls are in flight on callers' threads.
    pub(crate) fn calls_in_flight(&self) -> usize {
        self.inflight.load(Ordering::SeqCst)
    }

    /// Waits until no call is in flight, at most `limit`; whether none is.
    pub(crate) fn wait_calls_done(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut g = self.inflight_lock.lock();
        while self.inflight.load(Ordering::SeqCst) > 0 {
            if self.inflight_cv.wait_until(&mut g, deadline).timed_out() {
                return self.inflight.load(Ordering::SeqCst) == 0;
            }
        }
        true
    }

    /// Numbers, records and queues an operation.
    #[inline(always)]
    pub(crate) fn enqueue(&self, req: &Submission, sync: bool) -> Result<Enqueued> {
        crate::stacks::note_caller();
        if self.destroyed.load(Ordering::Acquire) {
            return Err(Error::aborted("the communicator was destroyed"));
        }
        if let Some(f) = self.failure.get() {
            return Err(f);
        }
        let mut s = self.sched.lock();
        if s.shutdown {
            return Err(Error::aborted("the communicator was destroyed"));
        }
        s.seq += 1;
        let seq = s.seq;
        if sync && !s.busy && s.queue.is_empty() {
            let (record, at) = self.fr.begin_started(seq);
            s.busy = true;
            return Ok(Enqueued::Inline(Claimed { seq, record, at }));
        }
        let record = self.fr.record_at(req.fp, seq, 0, req.site);
        let mut job = self.job(req, seq, record, None);
        let done = Completion::new(self.poll);
        job.done = Some(done.clone());
        s.queue.push_back(job);
        self.queued.store(s.queue.len(), Ordering::Release);
        self.sched_cv.notify_all();
        Ok(Enqueued::Queued(done, seq))
    }

    /// The job of a submission numbered `seq`, recorded as `record`
    /// (started at `at` when it runs inline).
    #[inline(always)]
    fn job(&self, req: &Submission, seq: u64, record: u64, at: Option<u64>) -> Job {
        let timeout = match req.task {
            Task::MonitoredBarrier { timeout, .. } => watchdog::op_timeout(self.cfg.timeout, Some(timeout)),
            Task::Coll(_) => watchdog::op_timeout(self.cfg.timeout, None),
        };
        Job {
            task: req.task,
            fp: req.fp,
            words: req.fp.words(),
            seq,
            record,
            io: req.io,
            io_ro: req.io_ro,
            out: req.out,
            timeout,
            done: None,
            started: at.is_some(),
            unwritten: Cell::new(at.map(|at| (at, req.site))),
            ran: Cell::new(None),
            owner: self.rank,
        }
    }

    /// The job an inline claim runs.
    #[inline(always)]
    pub(crate) fn inline_job(&self, req: &Submission, c: Claimed) -> Job {
        self.job(req, c.seq, c.record, Some(c.at))
    }

    /// Marks the engine idle after an inline run.
    pub(crate) fn finish_inline(&self) {
        let mut s = self.sched.lock();
        s.busy = false;
        // Wake the engine thread only if work queued up meanwhile: waking an
        // idle engine after every call costs a context switch each time.
        if !s.queue.is_empty() {
            self.sched_cv.notify_all();
        }
    }

    /// Runs a synchronous operation to completion.
    pub(crate) fn run_sync(&self, req: &Submission) -> Result<()> {
        match self.enqueue(req, true)? {
            Enqueued::Inline(claim) => {
                let job = self.inline_job(req, claim);
                // Idle again however this ends (a panic is caught in
                // `execute`; this holds even if one escaped).
                struct Idle<'a>(&'a Shared);
                impl Drop for Idle<'_> {
                    fn drop(&mut self) {
                        self.0.finish_inline();
                    }
                }
                let _idle = Idle(self);
                self.execute(&job)
            }
            Enqueued::Queued(done, _) => self.wait_bounded(&done),
        }
    }

    /// How long a waiter gives a queued operation before it stops trusting
    /// the watchdog (which bounds every operation by its timeout).
    pub(crate) fn wait_limit(&self) -> Duration {
        let t = Duration::from_millis(self.op_timeout_ms.load(Ordering::Relaxed)).max(self.cfg.timeout);
        watchdog::completion_limit(t)
    }

    /// Waits for a queued operation whose buffers the caller lends. The
    /// watchdog bounds every operation; should it fail to (a bug), this
    /// aborts the communicator after the timeout plus a margin, which ends
    /// the operation. The caller's buffers stay in use until it has ended,
    /// so the wait goes on after that, saying so every few seconds.
    pub(crate) fn wait_bounded(&self, done: &Completion) -> Result<()> {
        if let Some(r) = done.wait(Some(self.wait_limit())) {
            return r;
        }
        self.abort.abort(Error::aborted("an operation outlived twice its timeout"));
        let since = Instant::now();
        loop {
            if let Some(r) = done.wait(Some(Duration::from_secs(10))) {
                return r;
            }
            crate::log::error(
                &self.cfg,
                &format!(
                    "[internal] an operation of rank {} has not ended {:.0} s after the abort; its buffers are still                      in use, so the call waits on (a bug in ringleader: please report it with a `py-spy dump` or                      `gdb -p {}` backtrace)",
                    self.cfg.global_rank(),
                    since.elapsed().as_secs_f64(),
                    std::process::id()
                ),
            );
        }
    }

    /// The engine thread's loop.
    pub(crate) fn engine_loop(self: Arc<Self>) {
        // Set once an operation ran: the loop polls for the next one a
        // while before it sleeps (see `work::POLL`).
        let mut ran: Option<Instant> = None;
        loop {
            let job = {
                let mut s = self.sched.lock();
                loop {
                    if !s.busy {
                        if let Some(j) = s.queue.pop_front() {
                            s.busy = true;
                            self.queued.store(s.queue.len(), Ordering::Release);
                            break j;
                        }
                    }
                    if s.shutdown && s.queue.is_empty() {
                        return;
                    }
                    if let Some(t) = ran.take().filter(|_| !self.poll.is_zero()) {
                        parking_lot::MutexGuard::unlocked(&mut s, || {
                            crate::work::poll_until(t, self.poll, || self.queued.load(Ordering::Acquire) > 0)
                        });
                        continue;
                    }
                    self.sched_cv.wait(&mut s);
                }
            };
            let r = self.execute(&job);
            if let Some(d) = &job.done {
                d.complete(r);
            }
            self.finish_inline();
            ran = Some(Instant::now());
        }
    }

    /// The error of an operation that panicked: the panic, named with the
    /// thread it happened on, made into the communicator's failure the way
    /// any failure is (abort, job-wide abort record, verdict).
    fn panicked(&self, job: &Job, payload: &(dyn std::any::Any + Send)) -> Error {
        let thread = std::thread::current();
        let place = format!("thread '{}'", thread.name().unwrap_or("unnamed"));
        let e = Error::from_panic(payload, &place, self.rank, Some((job.fp.op, job.seq)));
        self.write_record(job);
        let r = self.fail_internal(job.record, e);
        // This thread runs the collectives: the only one that says which.
        self.current.set(None);
        r
    }

    /// Makes `e` (an internal error of the operation recorded as `record`)
    /// the communicator's failure; should forming the verdict panic too,
    /// `e` itself, with the communicator aborted.
    pub(crate) fn fail_internal(&self, record: u64, e: Error) -> Error {
        match catch_unwind(AssertUnwindSafe(|| self.resolve(record, e.clone()))) {
            Ok(verdict) => verdict,
            Err(_) => {
                let shown = self.to_global(e);
                self.abort.abort(shown.clone());
                self.fr.failed(record, &shown.to_string(), Vec::new());
                self.failure.get_or_set(shown)
            }
        }
    }

    /// Stops the engine: queued operations fail, the running one (if any)
    /// is aborted. Returns whether one was running.
    pub(crate) fn shutdown(&self) -> bool {
        let mut s = self.sched.lock();
        s.shutdown = true;
        self.queued.store(0, Ordering::Release);
        for job in s.queue.drain(..) {
            let e = Error::aborted(format!("the communicator was destroyed before {} #{} ran", job.fp.op, job.seq));
            self.fr.failed(job.record, &e.to_string(), Vec::new());
            if let Some(d) = &job.done {
                d.complete(Err(e));
            }
        }
        self.sched_cv.notify_all();
        s.busy
    }

    /// Runs one operation and records how it ended. A panic on the way
    /// (here, in the algorithm, in the transport) ends it with an
    /// `internal` error and aborts the communicator.
    fn execute(&self, job: &Job) -> Result<()> {
        match catch_unwind(AssertUnwindSafe(|| self.execute_inner(job))) {
            Ok(r) => r,
            Err(payload) => Err(self.panicked(job, payload.as_ref())),
        }
    }

    /// Writes `job`'s flight record if it is still unwritten (see
    /// `Job::unwritten`).
    fn write_record(&self, job: &Job) {
        if let Some((at, site)) = job.unwritten.take() {
            let s = Started { fp: job.fp, words: job.words, seq: job.seq, p2p_seq: 0, at, site };
            self.fr.write_started(job.record, s);
        }
    }

    fn execute_inner(&self, job: &Job) -> Result<()> {
        if !matches!(job.task, Task::Coll(_)) {
            // Only a collective's run writes it under way.
            self.write_record(job);
        }
        if let Some(f) = self.failure.get() {
            self.write_record(job);
            self.fr.failed(job.record, &f.to_string(), Vec::new());
            return Err(f);
        }
        self.op_timeout_ms.store(job.timeout.as_millis() as u64, Ordering::Relaxed);
        self.current.set_words(Some((job.seq, job.words)));
        if !job.started {
            self.fr.started_seq(job.record, job.seq);
        }
        fault::check(Point::Engine, job.seq);
        // Started first, even when already aborted: this rank's snapshot
        // must show that it reached this collective, and with which call.
        let r = match (self.abort.reason(), job.task) {
            (Some(reason), _) => Err(reason),
            (None, Task::Coll(c)) => self.run_coll(job, c),
            (None, Task::MonitoredBarrier { timeout, wait_all }) => self.monitored_barrier(job, timeout, wait_all),
        };
        self.write_record(job);
        let r = match r {
            Ok(()) => {
                self.fr.completed_after(job.record, job.seq, job.ran.get());
                Ok(())
            }
            // A monitored barrier reports late ranks; it leaves the
            // communicator usable.
            Err(e) if matches!(job.task, Task::MonitoredBarrier { .. }) && !self.abort.is_aborted() => {
                self.fr.failed(job.record, &e.to_string(), Vec::new());
                Err(e)
            }
            // Still "running" while the verdict is formed: the snapshot must
            // say where this rank is stuck.
            Err(e) => Err(self.resolve(job.record, e)),
        };
        self.current.set(None);
        r
    }

    fn run_coll(&self, job: &Job, coll: Coll) -> Result<()> {
        let mut x = self.exec.lock();
        let Exec { links, driver, plan, planned, plan_scratch, scratch } = &mut *x;
        let dtype = job.fp.dtype;
        let sh = Shape { rank: self.rank, n: self.world, streams: self.cfg.streams, esz: dtype.size() };
        let key = job.words;
        let prep = match planned {
            Some((planned_key, prep)) if *planned_key == key => *prep,
            _ => {
                // Forgotten first: a build that panics leaves no stale key.
                *planned = None;
                let prep = algo::schedule(coll, sh, self.algo, plan, plan_scratch);
                *planned = Some((key, prep));
                prep
            }
        };
        let words = prep.scratch_bytes.div_ceil(8);
        if scratch.len() < words {
            scratch.resize(words, 0);
        }
        let scratch: &mut [u8] = bytemuck::cast_slice_mut(scratch.as_mut_slice());
        // SAFETY: the submitter keeps both buffers alive and unaliased (the
        // input may be shared, hence read only) until this job completes,
        // which happens after this function returns.
        #[allow(unsafe_code)]
        let (io, out) = unsafe { (job.io.buf(job.io_ro), job.out.buf(false)) };
        let mut bufs = [io, out, Buf::Rw(&mut scratch[..prep.scratch_bytes])];
        if let Some((from, to)) = prep.copy {
            copy_region(&mut bufs, from, to);
        }
        let op = OpInfo { seq: job.seq, fingerprint: job.fp, checks: self.cfg.checks };
        // Counted from the run's first sleep: the watchdog bounds the
        // operation by its timeout; this is the backstop should it not.
        let deadline = Deadline::AfterFirstSleep(job.timeout + watchdog::BACKSTOP);
        let inline = job.done.is_none();
        let write = || self.write_record(job);
        let watch = Watch { abort: &self.abort, deadline, awaited: &self.awaited, under_way: Some(&write) };
        driver.run(links, &mut bufs, plan, &op, &watch)?;
        if inline && job.fp.count.saturating_mul(dtype.size() as u64) <= AT_ONCE_MAX {
            job.ran.set(driver.spun());
        }
        if let Some(f) = prep.fold {
            fold(&mut bufs, &f, dtype, job.fp.reduce_op.unwrap_or(ReduceOp::Sum));
        }
        if let Some(a) = prep.avg {
            if let Buf::Rw(b) = &mut bufs[a.buf as usize] {
                finish_avg(dtype, &mut b[a.off..a.off + a.len], self.world);
            }
        }
        Ok(())
    }

    /// `e` as a person reads it: ranks named globally (see
    /// [`ringleader_core::group`]).
    pub(crate) fn to_global(&self, e: Error) -> Error {
        match &self.cfg.group {
            Some(g) => e.to_global(g),
            None => e,
        }
    }

    /// This rank's progress in a heartbeat.
    pub(crate) fn beat(&self) -> Beat {
        let mut b = Beat::of(&self.fr, self.current.get(), &self.awaited);
        b.p2p = self.p2p.waits.lock().clone();
        b
    }

    /// This process's stacks as of this communicator's failure: captured
    /// the first time it is asked, the same capture after that.
    pub(crate) fn failure_stacks(&self) -> Option<Arc<ringleader_diag::stacks::Stacks>> {
        if let Some(s) = self.stacks.lock().clone() {
            return Some(s);
        }
        let s = crate::stacks::capture()?;
        Some(self.stacks.lock().get_or_insert(s).clone())
    }

    /// This rank's snapshot.
    pub(crate) fn snapshot(&self, observation: Option<Observation>) -> Snapshot {
        let mut s = Snapshot::new(self.rank, self.world, &self.host, std::process::id(), &self.cfg.run_id)
            .in_group(self.cfg.group.clone());
        s.beat = self.beat();
        s.entries = self.fr.entries();
        s.observation = observation;
        s.destroyed = self.destroyed.load(Ordering::Relaxed);
        s.library_version = self.cfg.advertised_version.clone();
        s.clock_offset_ns = self.clock.get().map(|c| c.offset_ns);
        s.clock_rtt_ns = self.clock.get().map(|c| c.rtt_ns);
        s
    }
}

/// The send/recv lane serves this communicator through this (the lane
/// does not depend on the engine).
impl crate::p2p::Host for Shared {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn config(&self) -> &Config {
        &self.cfg
    }

    fn lane(&self) -> &crate::p2p::P2p {
        &self.p2p
    }

    fn recorder(&self) -> &FlightRecorder {
        &self.fr
    }

    fn abort_signal(&self) -> &AbortSignal {
        &self.abort
    }

    fn verdict(&self, record: u64, e: Error) -> Error {
        self.resolve(record, e)
    }

    fn internal_verdict(&self, record: u64, e: Error) -> Error {
        self.fail_internal(record, e)
    }
}

/// A flat reduction's last step ([`algo::flat::Fold`]): the operands in
/// the scratch buffer (2) and this rank's own reduced in rank order, into
/// the fold's output (buffer 0 or 1).
fn fold(bufs: &mut [Buf<'_>; 3], f: &algo::flat::Fold, dtype: ringleader_core::DType, op: ReduceOp) {
    let (front, back) = bufs.split_at_mut(2);
    let Buf::Rw(scratch) = &mut back[0] else { return };
    let own = &front[f.own.buf as usize].bytes()[f.own.off..f.own.off + f.own.len];
    f.reduce(own, scratch, dtype, op);
    if let Buf::Rw(out) = &mut front[f.out.buf as usize] {
        out[f.out.off..f.out.off + f.out.len].copy_from_slice(&scratch[..f.len]);
    }
}

/// Copies region `from` (in buffer 0) to `to` (buffer 1 or 2).
fn copy_region(bufs: &mut [Buf<'_>; 3], from: Region, to: Region) {
    let (src, rest) = bufs.split_at_mut(1);
    let src: &[u8] = match &src[0] {
        Buf::Ro(b) => b,
        Buf::Rw(b) => b,
    };
    if let Buf::Rw(dst) = &mut rest[to.buf as usize - 1] {
        let streaming = dst.len() >= STREAM_MIN_BUFFER;
        let (d, s) = (&mut dst[to.off..to.off + to.len], &src[from.off..from.off + from.len]);
        // An all-gather's own part of a large output: nothing reads it back
        // soon, so it bypasses the cache (measured: 64 MiB 2-rank all_gather
        // over shared memory 21.0 -> 18.0 ms, medians of 7).
        match streaming {
            true => copy_streaming(d, s),
            false => d.copy_from_slice(s),
        }
    }
}
