//! The communicator: the public face of a rank in a job.

use crate::call::{describe, describe_p2p, Call, Dispatch, P2pRequest, RawOp};
use crate::engine::{EngineParts, Shared};
use crate::log;
use crate::monitor::{self, Stop};
use crate::p2p::{self, Here, P2p, P2pOp};
use crate::pidwatch::PidWatch;
use crate::rendezvous::{self, hostname};
use crate::work::Completion;
use crate::work::Work;
use parking_lot::Mutex;
use ringleader_core::{AbortSignal, Config, Element, Error, OpKind, Rank, ReduceOp, Result};
use ringleader_diag::Entry;
use ringleader_store::{Presence, StoreServer};
use ringleader_transport::driver::spin_budget::SpinBudget;
use ringleader_transport::driver::Driver;
use ringleader_transport::plane::{attach_shm, Lanes, PeerHost};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the rank hosting the store waits, when it is destroyed, for the
/// other ranks to leave before closing the store under them.
const STORE_LINGER: Duration = Duration::from_secs(10);

/// One rank's membership in a job, and the collectives it can run.
///
/// Every collective is numbered and fingerprinted; a hang ends in an
/// [`Error`] whose message names the culprit ranks, the collective and the
/// cause (see [`crate::ErrorKind`]). Methods take `&self`: several threads
/// may submit, and operations run in submission order.
///
/// ```no_run
/// use ringleader::{Communicator, ReduceOp};
/// # fn main() -> ringleader::Result<()> {
/// // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as torchrun or `ringleader launch` set them.
/// let comm = Communicator::from_env()?;
/// let mut grads = vec![comm.rank() as f32; 1024];
/// comm.all_reduce(&mut grads, ReduceOp::Sum)?;
/// comm.destroy()?;
/// # Ok(()) }
/// ```
pub struct Communicator {
    shared: Arc<Shared>,
    engine: Mutex<Option<JoinHandle<()>>>,
    monitor: Mutex<Option<JoinHandle<()>>>,
    stop: Arc<Stop>,
    server: Mutex<Option<StoreServer>>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.shared.rank)
            .field("world_size", &self.shared.world)
            .field("store", &self.shared.store_addr)
            .finish()
    }
}

impl Communicator {
    /// Joins the job described by the environment (`RANK`, `WORLD_SIZE`,
    /// `MASTER_ADDR`, `MASTER_PORT`, or Slurm's / Open MPI's variables).
    pub fn from_env() -> Result<Communicator> {
        Communicator::init(Config::from_env()?)
    }

    /// Joins the job described by `cfg`: rendezvous at the store, then a
    /// data connection to every peer. Fails within `cfg.init_timeout` with
    /// an error naming what is missing.
    pub fn init(cfg: Config) -> Result<Communicator> {
        // Rendezvous speaks in this communicator's ranks; its errors name global ones.
        let group = cfg.group.clone();
        Communicator::join(cfg).map_err(|e| match &group {
            Some(g) => e.to_global(g),
            None => e,
        })
    }

    fn join(cfg: Config) -> Result<Communicator> {
        log::init_from_env();
        if cfg.world_size == 0 || cfg.rank >= cfg.world_size {
            return Err(Error::invalid("rank", format!("rank {} of a world of {}", cfg.rank, cfg.world_size)));
        }
        ringleader_core::config::check_run_id("RINGLEADER_RUN_ID", &cfg.run_id)?;
        let abort = AbortSignal::new().map_err(|e| Error::invalid("init", format!("cannot create an eventfd: {e}")))?;
        // One more link per pair than the collectives use: the last is the
        // lane for sends and receives.
        let links = cfg.streams + 1;
        let mut joined = rendezvous::join(&cfg, links, &abort)?;
        let mut driver = Driver::new();
        let hosts: Vec<PeerHost<'_>> = joined
            .peers
            .iter()
            .map(|p| PeerHost { rank: p.rank, host: &p.host, boot_id: &p.boot_id, pid: p.pid })
            .collect();
        let (plane, waiter) = attach_shm(&cfg, &hosts, &mut joined.mesh.links, links, &mut driver, &abort)?;
        #[allow(unused_mut)]
        let mut plane_name = plane.name();
        #[cfg(feature = "rdma")]
        if let Some(name) =
            crate::rdma::attach(&cfg, &joined.peers, &mut joined.mesh.links, &mut joined.aux, &abort, plane)?
        {
            plane_name = name;
        }
        let lanes = Lanes::split(joined.mesh.links);
        let p2p = P2p::new(lanes.send_recv, waiter)
            .map_err(|e| Error::invalid("init", format!("cannot create an eventfd: {e}")))?;
        let store_in_rank0 = cfg.store_addr.is_none();
        let mut shared = Shared::new(EngineParts {
            cfg,
            host: hostname(),
            abort,
            links: lanes.collectives,
            driver,
            p2p,
            store: joined.aux,
            store_addr: joined.store_addr,
            store_in_rank0,
            peers: joined.peers,
        });
        shared.plane = plane_name;
        let me = &shared.peers[shared.rank];
        let local = shared.peers.iter().filter(|p| p.same_host(me)).count();
        shared.poll = crate::work::poll_budget(local);
        shared.p2p.budget = SpinBudget::new(ringleader_transport::Idle::for_local_ranks(local));
        tracing::debug!(
            rank = shared.rank,
            poll_us = shared.poll.as_micros() as u64,
            "waits poll this long before they sleep"
        );
        let shared = Arc::new(shared);
        let engine_shared = shared.clone();
        let engine = std::thread::Builder::new()
            .name(format!("ringleader-engine-{}", shared.rank))
            .spawn(move || engine_shared.engine_loop())
            .map_err(|e| Error::invalid("init", format!("cannot start the engine thread: {e}")))?;
        let stop = Arc::new(Stop::default());
        let watch = match shared.peers.get(shared.rank) {
            Some(me) => PidWatch::new(me, &shared.peers),
            None => PidWatch::default(),
        };
        tracing::debug!(rank = shared.rank, peers = watch.len(), "watching same-host peers through pidfds");
        let monitor = monitor::spawn(shared.clone(), joined.member, watch, stop.clone());
        tracing::debug!(rank = shared.rank, world = shared.world, "communicator ready");
        Ok(Communicator {
            shared,
            engine: Mutex::new(Some(engine)),
            monitor: Mutex::new(Some(monitor)),
            stop,
            server: Mutex::new(joined.server),
        })
    }

    /// This process's rank in this communicator (its group rank, in a
    /// sub-group; see [`Communicator::global_rank`]).
    pub fn rank(&self) -> Rank {
        self.shared.rank
    }

    /// This process's rank in the job: what messages name it by.
    pub fn global_rank(&self) -> Rank {
        self.shared.cfg.global_rank()
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.shared.world
    }

    /// The data-plane transport in use: `tcp`, `shm` (every peer on this
    /// host), or `shm+tcp`; with the `rdma` feature also `rdma`, `shm+rdma`,
    /// `rdma+tcp` (some pairs had no device).
    pub fn transport_name(&self) -> &'static str {
        self.shared.plane
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.shared.cfg
    }

    fn sync(&self, call: Call) -> Result<()> {
        let sh = &self.shared;
        // A collective on an idle communicator runs here, as worked out
        // the first time its shape was called.
        if let Some(key) = call.key() {
            if sh.try_claim() {
                return sh.run_claimed(&call, key);
            }
        }
        let _call = sh.enter()?;
        // Sends and receives first, described without the collectives'
        // dispatch: the path of every small message.
        if let Some(req) = describe_p2p(&call, sh.rank, sh.world) {
            return self.p2p_sync(req?);
        }
        match describe(&call, sh.rank, sh.world)? {
            Dispatch::P2p(req) => self.p2p_sync(req),
            Dispatch::Engine(req) => sh.run_sync(&req),
        }
    }

    /// Blocking send or receive `req`: on this thread when it may (see
    /// `p2p.rs`), else on the lane.
    #[inline]
    fn p2p_sync(&self, req: P2pRequest) -> Result<()> {
        let sh = &self.shared;
        match p2p::run_here(sh, self.p2p_op(req)?, true, sh.poll)? {
            Here::Ran(r) => r,
            Here::Queued(done, began) => {
                let r = sh.wait_bounded(&done);
                sh.p2p.waited(began);
                r
            }
        }
    }

    fn queue<B>(&self, call: Call, buf: B) -> Result<Work<B>> {
        let sh = &self.shared;
        let _call = sh.enter()?;
        if let Some(req) = describe_p2p(&call, sh.rank, sh.world) {
            return self.p2p_queue(req?, buf);
        }
        match describe(&call, sh.rank, sh.world)? {
            Dispatch::P2p(req) => self.p2p_queue(req, buf),
            Dispatch::Engine(req) => {
                let (done, seq) = sh.enqueue(&req)?;
                Ok(Work { done, buf: Some(buf), op: req.fp.op, seq, limit: sh.wait_limit() })
            }
        }
    }

    /// Background send or receive `req`, moved here as far as it goes
    /// without waiting (see `p2p.rs`).
    fn p2p_queue<B>(&self, req: P2pRequest, buf: B) -> Result<Work<B>> {
        let sh = &self.shared;
        let op = self.p2p_op(req)?;
        let done = match p2p::run_here(sh, op, false, sh.poll)? {
            Here::Ran(r) => {
                let done = Completion::new(sh.poll);
                done.complete(r);
                done
            }
            Here::Queued(done, _) => done,
        };
        Ok(Work { done, buf: Some(buf), op: op.fp.op, seq: op.seq, limit: sh.wait_limit() })
    }

    /// Send or receive `req`, numbered and recorded, on a communicator
    /// that has not failed.
    fn p2p_op(&self, req: P2pRequest) -> Result<P2pOp> {
        let sh = &self.shared;
        if sh.destroyed.load(Ordering::Acquire) {
            return Err(Error::aborted("the communicator was destroyed"));
        }
        if let Some(f) = sh.failure.get() {
            return Err(f);
        }
        let seq = sh.p2p.next_seq(req.fp.op == OpKind::Send, req.peer);
        let (record, at) = sh.fr.record_stamped(req.fp, 0, seq, req.site);
        Ok(P2pOp { peer: req.peer, seq, fp: req.fp, record, at, buf: req.buf })
    }

    /// Runs a collective on raw buffers, for language bindings (the C ABI,
    /// Python). In-place operations (all_reduce, broadcast, reduce, recv)
    /// work on `output`; the others read `input` and write `output`.
    ///
    /// # Safety
    /// `input` must be valid for reads of `input_count` elements and
    /// `output` for reads and writes of `output_count` elements of `dtype`,
    /// the two must not overlap, and nothing else may write them until the
    /// call returns.
    #[doc(hidden)]
    #[allow(unsafe_code)]
    pub unsafe fn call_raw(&self, call: Call) -> Result<()> {
        self.sync(call)
    }

    /// Like [`Communicator::call_raw`], in the background.
    ///
    /// # Safety
    /// As for [`Communicator::call_raw`], until the returned [`Work`]
    /// completes (the `Work` does not keep the buffers alive).
    #[doc(hidden)]
    #[allow(unsafe_code)]
    pub unsafe fn submit_raw(&self, call: Call) -> Result<Work<()>> {
        self.queue(call, ())
    }

    /// Reduces `buf` across all ranks, in place: every rank ends with the
    /// same result.
    #[track_caller]
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.sync(Call::inplace(RawOp::AllReduce { op }, buf))
    }

    /// Background [`Communicator::all_reduce`]; the [`Work`] gives the buffer back.
    #[track_caller]
    pub fn all_reduce_async<T: Element>(&self, mut buf: Vec<T>, op: ReduceOp) -> Result<Work<Vec<T>>> {
        let call = Call::inplace(RawOp::AllReduce { op }, &mut buf);
        self.queue(call, buf)
    }

    /// Concatenates every rank's `input`, in rank order, into `output`
    /// (`world_size * input.len()` elements).
    #[track_caller]
    pub fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.sync(Call::outofplace(RawOp::AllGather, input, output))
    }

    /// Background [`Communicator::all_gather`]; gives `(input, output)` back.
    #[track_caller]
    pub fn all_gather_async<T: Element>(&self, input: Vec<T>, mut output: Vec<T>) -> Result<Work<(Vec<T>, Vec<T>)>> {
        let call = Call::outofplace(RawOp::AllGather, &input, &mut output);
        self.queue(call, (input, output))
    }

    /// Reduces `input` (`world_size * output.len()` elements) across ranks
    /// and leaves segment `rank` of the result in `output`.
    #[track_caller]
    pub fn reduce_scatter<T: Element>(&self, input: &[T], output: &mut [T], op: ReduceOp) -> Result<()> {
        self.sync(Call::outofplace(RawOp::ReduceScatter { op }, input, output))
    }

    /// Background [`Communicator::reduce_scatter`]; gives `(input, output)` back.
    #[track_caller]
    pub fn reduce_scatter_async<T: Element>(
        &self,
        input: Vec<T>,
        mut output: Vec<T>,
        op: ReduceOp,
    ) -> Result<Work<(Vec<T>, Vec<T>)>> {
        let call = Call::outofplace(RawOp::ReduceScatter { op }, &input, &mut output);
        self.queue(call, (input, output))
    }

    /// Copies `root`'s `buf` into every rank's `buf`.
    #[track_caller]
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: Rank) -> Result<()> {
        self.sync(Call::inplace(RawOp::Broadcast { root }, buf))
    }

    /// Background [`Communicator::broadcast`].
    #[track_caller]
    pub fn broadcast_async<T: Element>(&self, mut buf: Vec<T>, root: Rank) -> Result<Work<Vec<T>>> {
        let call = Call::inplace(RawOp::Broadcast { root }, &mut buf);
        self.queue(call, buf)
    }

    /// Reduces `buf` across ranks into `root`'s `buf`; other ranks' buffers
    /// are left unchanged.
    #[track_caller]
    pub fn reduce<T: Element>(&self, buf: &mut [T], root: Rank, op: ReduceOp) -> Result<()> {
        self.sync(Call::inplace(RawOp::Reduce { root, op }, buf))
    }

    /// Background [`Communicator::reduce`].
    #[track_caller]
    pub fn reduce_async<T: Element>(&self, mut buf: Vec<T>, root: Rank, op: ReduceOp) -> Result<Work<Vec<T>>> {
        let call = Call::inplace(RawOp::Reduce { root, op }, &mut buf);
        self.queue(call, buf)
    }

    /// Sends segment `j` of `input` to rank `j` and receives rank `j`'s
    /// segment for us into segment `j` of `output` (both `world_size`
    /// equal segments).
    #[track_caller]
    pub fn all_to_all<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.sync(Call::outofplace(RawOp::AllToAll, input, output))
    }

    /// Background [`Communicator::all_to_all`]; gives `(input, output)` back.
    #[track_caller]
    pub fn all_to_all_async<T: Element>(&self, input: Vec<T>, mut output: Vec<T>) -> Result<Work<(Vec<T>, Vec<T>)>> {
        let call = Call::outofplace(RawOp::AllToAll, &input, &mut output);
        self.queue(call, (input, output))
    }

    /// Sends `buf` to rank `dst`, which must call [`Communicator::recv`]
    /// with the same element count. Returns once the data is on its way.
    #[track_caller]
    pub fn send<T: Element>(&self, buf: &[T], dst: Rank) -> Result<()> {
        self.sync(Call::outofplace(RawOp::Send { peer: dst }, buf, &mut []))
    }

    /// Background [`Communicator::send`]. What can move without waiting
    /// moves before this returns (a small send then usually completes
    /// here); the rest moves on the send/recv lane's thread.
    #[track_caller]
    pub fn send_async<T: Element>(&self, buf: Vec<T>, dst: Rank) -> Result<Work<Vec<T>>> {
        let call = Call::outofplace(RawOp::Send { peer: dst }, &buf, &mut []);
        self.queue(call, buf)
    }

    /// Receives `buf.len()` elements from rank `src`.
    #[track_caller]
    pub fn recv<T: Element>(&self, buf: &mut [T], src: Rank) -> Result<()> {
        self.sync(Call::inplace(RawOp::Recv { peer: src }, buf))
    }

    /// Background [`Communicator::recv`]: as [`Communicator::send_async`],
    /// a frame already there is taken before this returns.
    #[track_caller]
    pub fn recv_async<T: Element>(&self, mut buf: Vec<T>, src: Rank) -> Result<Work<Vec<T>>> {
        let call = Call::inplace(RawOp::Recv { peer: src }, &mut buf);
        self.queue(call, buf)
    }

    /// Returns once every rank has entered the barrier.
    #[track_caller]
    pub fn barrier(&self) -> Result<()> {
        self.sync(Call::inplace::<u8>(RawOp::Barrier, &mut []))
    }

    /// Background [`Communicator::barrier`].
    #[track_caller]
    pub fn barrier_async(&self) -> Result<Work<()>> {
        self.queue(Call::inplace::<u8>(RawOp::Barrier, &mut []), ())
    }

    /// A barrier in which rank 0 waits at most `timeout` for the others and
    /// then fails naming the ranks that did not arrive ("Ranks 1, 3 failed to
    /// pass monitored_barrier in 4000 ms"): all of them with
    /// `wait_all_ranks`, else the first. The other ranks fail pointing at
    /// rank 0's report. The communicator stays usable afterwards.
    #[track_caller]
    pub fn monitored_barrier(&self, timeout: Duration, wait_all_ranks: bool) -> Result<()> {
        self.sync(Call::inplace::<u8>(RawOp::MonitoredBarrier { timeout, wait_all: wait_all_ranks }, &mut []))
    }

    /// The flight recorder: the last `RINGLEADER_FR_SIZE` operations, oldest first.
    pub fn flight_recorder(&self) -> Vec<Entry> {
        self.shared.fr.entries()
    }

    /// Writes this rank's flight-recorder dump (docs/DESIGN.md §3) to `path`, or
    /// to `RINGLEADER_DUMP_DIR/<run>/ringleader-rank{R}.json` when `None` (`R`
    /// the global rank; `ringleader-rank{R}-group{NAME}.json` in a sub-group;
    /// `<run>` see [`Config::run_dump_dir`]; the default folder is
    /// `$TMPDIR/ringleader-dumps-$UID`). The file appears whole (written
    /// aside, then renamed), and a symbolic link in its place is replaced,
    /// never followed.
    pub fn dump(&self, path: Option<&Path>) -> Result<PathBuf> {
        let snap = self.shared.snapshot(None);
        self.shared
            .dump_to(&snap, path.map(Path::to_path_buf))
            .ok_or_else(|| Error::invalid("dump path", "cannot write the dump (see the warning above)"))
    }

    /// Aborts the communicator: the running operation and every later one
    /// fail, and the other ranks learn why.
    pub fn abort(&self, reason: &str) {
        self.shared.user_aborted.store(true, Ordering::Release);
        self.shared
            .abort
            .abort(Error::aborted(format!("rank {} called abort: {reason}", self.shared.cfg.global_rank())));
    }

    /// Leaves the job cleanly: the other ranks will read "left" rather than
    /// "died". Dropping the communicator does the same.
    pub fn destroy(self) -> Result<()> {
        self.shutdown();
        Ok(())
    }

    /// [`Communicator::destroy`] through a shared reference, for a
    /// communicator that other threads may be using (an `Arc`, a binding's
    /// handle): an operation still running is aborted (it fails with
    /// `aborted`), calls in flight on other threads are waited for (at most
    /// the communicator's timeout plus 5 s), and every later call fails
    /// with `aborted`. Idempotent; dropping the communicator afterwards
    /// does nothing more.
    pub fn close(&self) -> Result<()> {
        self.shutdown();
        Ok(())
    }

    fn shutdown(&self) {
        let sh = &self.shared;
        if sh.destroyed.swap(true, Ordering::SeqCst) {
            return;
        }
        let running = sh.shutdown();
        let pending = !sh.p2p.pending.is_empty();
        if running || pending || sh.calls_in_flight() > 0 {
            sh.abort.abort(Error::aborted("the communicator was destroyed while an operation ran"));
        }
        // Calls on other threads still use the caller's buffers and this
        // communicator: let them end (the abort ends them promptly).
        let limit = sh.cfg.timeout + crate::watchdog::BACKSTOP;
        if !sh.wait_calls_done(limit) {
            crate::log::warn(
                &sh.cfg,
                &format!(
                    "destroy: {} call(s) on other threads still running {:.0} s after the abort; tearing down                      anyway (they keep the communicator alive until they return)",
                    sh.calls_in_flight(),
                    limit.as_secs_f64()
                ),
            );
        }
        sh.p2p.shutdown();
        if let Some(h) = self.engine.lock().take() {
            let _ = h.join();
        }
        // Leave at the store first, then tell the peers: whoever reads the
        // goodbye frame then finds this rank "left" at the store too.
        self.stop.stop();
        if let Some(h) = self.monitor.lock().take() {
            let _ = h.join();
        }
        if !sh.abort.is_aborted() {
            self.say_goodbye();
        }
        if let Some(server) = self.server.lock().take() {
            self.linger(server);
        }
    }

    /// Tells every peer, on every collective link, that no more frames will
    /// come (the driver writes the goodbye frames).
    fn say_goodbye(&self) {
        let sh = &self.shared;
        sh.say_goodbye(sh.fr.progress().last_started.load(Ordering::Relaxed));
    }

    /// Keeps the store this rank hosts open until the others left.
    fn linger(&self, server: StoreServer) {
        let sh = &self.shared;
        let deadline = Instant::now() + STORE_LINGER;
        let mut store = sh.store.lock();
        while Instant::now() < deadline {
            match store.status(None, Duration::from_millis(200)).map(|s| crate::failure::ours(s, sh.world)) {
                Ok(s) if s.ranks.iter().filter(|r| r.rank != sh.rank).all(|r| r.liveness != Presence::Connected) => {
                    break
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        server.shutdown();
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        self.shutdown();
    }
}
