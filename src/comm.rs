//! The communicator: the public face of a rank in a job.

use crate::algo::Coll;
use crate::engine::{Enqueued, RawBuf, Request, Shared, Task};
use crate::log;
use crate::monitor::{self, Stop};
use crate::rendezvous::{self, hostname};
use crate::work::Work;
use parking_lot::Mutex;
use ringleader_core::{AbortSignal, Config, DType, Element, Error, Fingerprint, OpKind, Rank, ReduceOp, Result};
use ringleader_diag::Entry;
use ringleader_store::{Liveness, StoreServer};
use ringleader_transport::frame::FrameHeader;
use std::io::IoSlice;
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

fn raw<T: Element>(s: &[T]) -> RawBuf {
    RawBuf::new(s.as_ptr() as *mut u8, std::mem::size_of_val(s))
}

fn raw_mut<T: Element>(s: &mut [T]) -> RawBuf {
    RawBuf::new(s.as_mut_ptr() as *mut u8, std::mem::size_of_val(s))
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
        log::init_from_env();
        if cfg.world_size == 0 || cfg.rank >= cfg.world_size {
            return Err(Error::invalid("rank", format!("rank {} of a world of {}", cfg.rank, cfg.world_size)));
        }
        let abort = AbortSignal::new().map_err(|e| Error::invalid("init", format!("cannot create an eventfd: {e}")))?;
        let joined = rendezvous::join(&cfg, &abort)?;
        let store_in_rank0 = cfg.store_addr.is_none();
        let shared = Arc::new(Shared::new(
            cfg,
            hostname(),
            abort,
            joined.mesh.links,
            joined.aux,
            joined.store_addr,
            store_in_rank0,
            joined.peers,
        ));
        let engine_shared = shared.clone();
        let engine = std::thread::Builder::new()
            .name(format!("ringleader-engine-{}", shared.rank))
            .spawn(move || engine_shared.engine_loop())
            .map_err(|e| Error::invalid("init", format!("cannot start the engine thread: {e}")))?;
        let stop = Arc::new(Stop::default());
        let monitor = monitor::spawn(shared.clone(), joined.member, stop.clone());
        tracing::debug!(rank = shared.rank, world = shared.world, "communicator ready");
        Ok(Communicator {
            shared,
            engine: Mutex::new(Some(engine)),
            monitor: Mutex::new(Some(monitor)),
            stop,
            server: Mutex::new(joined.server),
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> Rank {
        self.shared.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.shared.world
    }

    /// The data-plane transport in use (`tcp`).
    pub fn transport_name(&self) -> &'static str {
        "tcp"
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.shared.cfg
    }

    fn sync(&self, task: Task, fp: Fingerprint, io: RawBuf, io_ro: bool, out: RawBuf) -> Result<()> {
        self.shared.run_sync(Request { task, fp, io, io_ro, out })
    }

    fn queue<B>(&self, task: Task, fp: Fingerprint, io: RawBuf, io_ro: bool, out: RawBuf, buf: B) -> Result<Work<B>> {
        match self.shared.enqueue(Request { task, fp, io, io_ro, out }, false)? {
            Enqueued::Queued(done, seq) => Ok(Work { done, buf: Some(buf), op: fp.op, seq }),
            Enqueued::Inline(_) => unreachable!("asynchronous submissions always queue"),
        }
    }

    fn check_root(&self, what: &str, root: Rank) -> Result<()> {
        if root >= self.shared.world {
            return Err(Error::invalid(
                what,
                format!("rank {root} does not exist in a world of {}", self.shared.world),
            ));
        }
        Ok(())
    }

    fn check_peer(&self, what: &str, peer: Rank) -> Result<()> {
        self.check_root(what, peer)?;
        if peer == self.shared.rank {
            return Err(Error::invalid(what, format!("rank {peer} is this rank itself")));
        }
        Ok(())
    }

    fn check_multiple(&self, what: &str, small: usize, big: usize, small_name: &str, big_name: &str) -> Result<()> {
        let n = self.shared.world;
        if small.checked_mul(n) != Some(big) {
            return Err(Error::invalid(
                what,
                format!(
                    "{big_name} holds {big} elements; it must hold world_size ({n}) x {small_name} ({small}) = {}",
                    small * n
                ),
            ));
        }
        Ok(())
    }

    /// Reduces `buf` across all ranks, in place: every rank ends with the
    /// same result.
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let fp = fp(OpKind::AllReduce, T::DTYPE, buf.len()).with_reduce_op(op);
        self.sync(Task::Coll(Coll::AllReduce { count: buf.len(), op }), fp, raw_mut(buf), false, RawBuf::EMPTY)
    }

    /// Background [`Communicator::all_reduce`]; the [`Work`] gives the buffer back.
    pub fn all_reduce_async<T: Element>(&self, mut buf: Vec<T>, op: ReduceOp) -> Result<Work<Vec<T>>> {
        let fp = fp(OpKind::AllReduce, T::DTYPE, buf.len()).with_reduce_op(op);
        let io = raw_mut(&mut buf);
        self.queue(Task::Coll(Coll::AllReduce { count: buf.len(), op }), fp, io, false, RawBuf::EMPTY, buf)
    }

    /// Concatenates every rank's `input`, in rank order, into `output`
    /// (`world_size * input.len()` elements).
    pub fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.check_multiple("all_gather", input.len(), output.len(), "input", "output")?;
        let fp = fp(OpKind::AllGather, T::DTYPE, input.len());
        self.sync(Task::Coll(Coll::AllGather { per_rank: input.len() }), fp, raw(input), true, raw_mut(output))
    }

    /// Background [`Communicator::all_gather`]; gives `(input, output)` back.
    pub fn all_gather_async<T: Element>(&self, input: Vec<T>, mut output: Vec<T>) -> Result<Work<(Vec<T>, Vec<T>)>> {
        self.check_multiple("all_gather", input.len(), output.len(), "input", "output")?;
        let fp = fp(OpKind::AllGather, T::DTYPE, input.len());
        let (i, o) = (raw(&input), raw_mut(&mut output));
        self.queue(Task::Coll(Coll::AllGather { per_rank: input.len() }), fp, i, true, o, (input, output))
    }

    /// Reduces `input` (`world_size * output.len()` elements) across ranks
    /// and leaves segment `rank` of the result in `output`.
    pub fn reduce_scatter<T: Element>(&self, input: &[T], output: &mut [T], op: ReduceOp) -> Result<()> {
        self.check_multiple("reduce_scatter", output.len(), input.len(), "output", "input")?;
        let fp = fp(OpKind::ReduceScatter, T::DTYPE, input.len()).with_reduce_op(op);
        let task = Task::Coll(Coll::ReduceScatter { per_rank: output.len(), op });
        self.sync(task, fp, raw(input), true, raw_mut(output))
    }

    /// Background [`Communicator::reduce_scatter`]; gives `(input, output)` back.
    pub fn reduce_scatter_async<T: Element>(
        &self,
        input: Vec<T>,
        mut output: Vec<T>,
        op: ReduceOp,
    ) -> Result<Work<(Vec<T>, Vec<T>)>> {
        self.check_multiple("reduce_scatter", output.len(), input.len(), "output", "input")?;
        let fp = fp(OpKind::ReduceScatter, T::DTYPE, input.len()).with_reduce_op(op);
        let task = Task::Coll(Coll::ReduceScatter { per_rank: output.len(), op });
        let (i, o) = (raw(&input), raw_mut(&mut output));
        self.queue(task, fp, i, true, o, (input, output))
    }

    /// Copies `root`'s `buf` into every rank's `buf`.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: Rank) -> Result<()> {
        self.check_root("broadcast root", root)?;
        let fp = fp(OpKind::Broadcast, T::DTYPE, buf.len()).with_root(root);
        self.sync(Task::Coll(Coll::Broadcast { count: buf.len(), root }), fp, raw_mut(buf), false, RawBuf::EMPTY)
    }

    /// Background [`Communicator::broadcast`].
    pub fn broadcast_async<T: Element>(&self, mut buf: Vec<T>, root: Rank) -> Result<Work<Vec<T>>> {
        self.check_root("broadcast root", root)?;
        let fp = fp(OpKind::Broadcast, T::DTYPE, buf.len()).with_root(root);
        let io = raw_mut(&mut buf);
        self.queue(Task::Coll(Coll::Broadcast { count: buf.len(), root }), fp, io, false, RawBuf::EMPTY, buf)
    }

    /// Reduces `buf` across ranks into `root`'s `buf`; other ranks' buffers
    /// are left unchanged.
    pub fn reduce<T: Element>(&self, buf: &mut [T], root: Rank, op: ReduceOp) -> Result<()> {
        self.check_root("reduce root", root)?;
        let fp = fp(OpKind::Reduce, T::DTYPE, buf.len()).with_root(root).with_reduce_op(op);
        self.sync(Task::Coll(Coll::Reduce { count: buf.len(), root, op }), fp, raw_mut(buf), false, RawBuf::EMPTY)
    }

    /// Background [`Communicator::reduce`].
    pub fn reduce_async<T: Element>(&self, mut buf: Vec<T>, root: Rank, op: ReduceOp) -> Result<Work<Vec<T>>> {
        self.check_root("reduce root", root)?;
        let fp = fp(OpKind::Reduce, T::DTYPE, buf.len()).with_root(root).with_reduce_op(op);
        let io = raw_mut(&mut buf);
        self.queue(Task::Coll(Coll::Reduce { count: buf.len(), root, op }), fp, io, false, RawBuf::EMPTY, buf)
    }

    /// Sends segment `j` of `input` to rank `j` and receives rank `j`'s
    /// segment for us into segment `j` of `output` (both `world_size`
    /// equal segments).
    pub fn all_to_all<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        let per = self.all_to_all_segment(input.len(), output.len())?;
        let fp = fp(OpKind::AllToAll, T::DTYPE, input.len());
        self.sync(Task::Coll(Coll::AllToAll { per_rank: per }), fp, raw(input), true, raw_mut(output))
    }

    /// Background [`Communicator::all_to_all`]; gives `(input, output)` back.
    pub fn all_to_all_async<T: Element>(&self, input: Vec<T>, mut output: Vec<T>) -> Result<Work<(Vec<T>, Vec<T>)>> {
        let per = self.all_to_all_segment(input.len(), output.len())?;
        let fp = fp(OpKind::AllToAll, T::DTYPE, input.len());
        let (i, o) = (raw(&input), raw_mut(&mut output));
        self.queue(Task::Coll(Coll::AllToAll { per_rank: per }), fp, i, true, o, (input, output))
    }

    fn all_to_all_segment(&self, input: usize, output: usize) -> Result<usize> {
        let n = self.shared.world;
        if input != output || input % n != 0 {
            return Err(Error::invalid(
                "all_to_all",
                format!("input ({input}) and output ({output}) must hold the same number of elements, a multiple of world_size ({n})"),
            ));
        }
        Ok(input / n)
    }

    /// Sends `buf` to rank `dst`, which must call [`Communicator::recv`]
    /// with the same element count. Returns once the data is on its way.
    pub fn send<T: Element>(&self, buf: &[T], dst: Rank) -> Result<()> {
        self.check_peer("send destination", dst)?;
        let fp = fp(OpKind::Send, T::DTYPE, buf.len()).with_root(dst);
        self.sync(Task::Coll(Coll::Send { count: buf.len(), peer: dst }), fp, raw(buf), true, RawBuf::EMPTY)
    }

    /// Background [`Communicator::send`].
    pub fn send_async<T: Element>(&self, buf: Vec<T>, dst: Rank) -> Result<Work<Vec<T>>> {
        self.check_peer("send destination", dst)?;
        let fp = fp(OpKind::Send, T::DTYPE, buf.len()).with_root(dst);
        let io = raw(&buf);
        self.queue(Task::Coll(Coll::Send { count: buf.len(), peer: dst }), fp, io, true, RawBuf::EMPTY, buf)
    }

    /// Receives `buf.len()` elements from rank `src`.
    pub fn recv<T: Element>(&self, buf: &mut [T], src: Rank) -> Result<()> {
        self.check_peer("recv source", src)?;
        let fp = fp(OpKind::Recv, T::DTYPE, buf.len()).with_root(src);
        self.sync(Task::Coll(Coll::Recv { count: buf.len(), peer: src }), fp, raw_mut(buf), false, RawBuf::EMPTY)
    }

    /// Background [`Communicator::recv`].
    pub fn recv_async<T: Element>(&self, mut buf: Vec<T>, src: Rank) -> Result<Work<Vec<T>>> {
        self.check_peer("recv source", src)?;
        let fp = fp(OpKind::Recv, T::DTYPE, buf.len()).with_root(src);
        let io = raw_mut(&mut buf);
        self.queue(Task::Coll(Coll::Recv { count: buf.len(), peer: src }), fp, io, false, RawBuf::EMPTY, buf)
    }

    /// Returns once every rank has entered the barrier.
    pub fn barrier(&self) -> Result<()> {
        self.sync(Task::Coll(Coll::Barrier), fp(OpKind::Barrier, DType::U8, 0), RawBuf::EMPTY, false, RawBuf::EMPTY)
    }

    /// Background [`Communicator::barrier`].
    pub fn barrier_async(&self) -> Result<Work<()>> {
        self.queue(
            Task::Coll(Coll::Barrier),
            fp(OpKind::Barrier, DType::U8, 0),
            RawBuf::EMPTY,
            false,
            RawBuf::EMPTY,
            (),
        )
    }

    /// A barrier in which rank 0 waits at most `timeout` for the others and
    /// then fails naming the ranks that did not arrive ("Ranks 1, 3 failed to
    /// pass monitored_barrier in 4000 ms"): all of them with
    /// `wait_all_ranks`, else the first. The other ranks fail pointing at
    /// rank 0's report. The communicator stays usable afterwards.
    pub fn monitored_barrier(&self, timeout: Duration, wait_all_ranks: bool) -> Result<()> {
        let task = Task::MonitoredBarrier { timeout, wait_all: wait_all_ranks };
        self.sync(task, fp(OpKind::MonitoredBarrier, DType::U8, 0), RawBuf::EMPTY, false, RawBuf::EMPTY)
    }

    /// The flight recorder: the last `RINGLEADER_FR_SIZE` operations, oldest first.
    pub fn flight_recorder(&self) -> Vec<Entry> {
        self.shared.fr.entries()
    }

    /// Writes this rank's flight-recorder dump (DESIGN.md §3) to `path`, or
    /// to `RINGLEADER_DUMP_DIR/ringleader-rank{R}.json` when `None`.
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
        self.shared.abort.abort(Error::aborted(format!("rank {} called abort: {reason}", self.shared.rank)));
    }

    /// Leaves the job cleanly: the other ranks will read "left" rather than
    /// "died". Dropping the communicator does the same.
    pub fn destroy(self) -> Result<()> {
        self.shutdown();
        Ok(())
    }

    fn shutdown(&self) {
        let sh = &self.shared;
        if sh.destroyed.swap(true, Ordering::AcqRel) {
            return;
        }
        if sh.shutdown() {
            sh.abort.abort(Error::aborted("the communicator was destroyed while an operation ran"));
        }
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

    /// Tells every peer, on every link, that no more frames will come.
    fn say_goodbye(&self) {
        let sh = &self.shared;
        let last = sh.fr.progress().last_started.load(Ordering::Relaxed);
        let hdr = FrameHeader::goodbye(last, fp(OpKind::Barrier, DType::U8, 0)).encode();
        let mut x = sh.exec.lock();
        for link in x.links.iter_mut().flatten() {
            let _ = link.try_write(&[IoSlice::new(&hdr)]);
        }
    }

    /// Keeps the store this rank hosts open until the others left.
    fn linger(&self, server: StoreServer) {
        let sh = &self.shared;
        let deadline = Instant::now() + STORE_LINGER;
        let mut store = sh.store.lock();
        while Instant::now() < deadline {
            match store.status(None, Duration::from_millis(200)) {
                Ok(s) if s.ranks.iter().filter(|r| r.rank != sh.rank).all(|r| r.liveness != Liveness::Connected) => {
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

fn fp(op: OpKind, dtype: DType, count: usize) -> Fingerprint {
    Fingerprint::new(op, dtype, count as u64)
}
