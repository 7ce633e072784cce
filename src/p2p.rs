//! Point-to-point operations (send, recv) on a lane of their own.
//!
//! Every pair of ranks has one link reserved for sends and receives (an
//! extra TCP connection, or an extra ring in shared memory). A thread of its
//! own, started on first use, moves every queued send and receive at once,
//! each peer's sends in submission order and its receives in submission
//! order, but sends and receives, and different peers, independently of one
//! another. So a rank that posts a send and then a receive while its peer
//! does the same never deadlocks, however large the messages; and since the
//! lane carries no collective frames, point-to-point traffic can never
//! interleave with a collective's.
//!
//! Frames are the collectives' frames (header, payload, padding); the
//! sequence number is per pair and direction, and the fingerprint (dtype and
//! count) is checked like any other. The transport's driver moves them and
//! puts the thread to sleep (`ringleader_transport::driver::lane`): this
//! file keeps the queues, their order, the flight recorder's entries, what
//! the monitor and heartbeat read (`pending`, `waits`), the timeouts and
//! the failures, and never touches a link itself.
//!
//! A send or receive runs on the caller's thread instead when its direction
//! to that peer has nothing queued ahead of it and the lane is not using
//! the peer's link ([`run_here`]): the thread hop each way (a wake-up, tens
//! of microseconds on a busy host) was most of a small message's time. A
//! blocking call polls within a budget that starts at the collectives'
//! ([`Idle`](ringleader_transport::Idle)) and grows while waits end soon after it ran out
//! ([`SpinBudget`]: with a fixed one, a ping-pong whose one side slept once
//! stayed in wake-ups on both sides); a background one moves what it can
//! without waiting (a small send then usually completes before the call
//! returns). Frames that fit travel whole in the link's fastbox where it
//! has one (shared memory), as the collectives' small frames do. A frame
//! still moving is then handed to the lane, part-moved, in its place in
//! the order, and the caller waits for it as before. Each
//! peer's link sits behind a lock with the sequence numbers of the last
//! send and receive that completed on it: whoever moves an operation (the
//! lane or an inline caller) holds the lock, and only the operation after
//! the last completed one of its direction may move, so frames leave and
//! are taken in sequence order whichever thread moves them.
//!
//! A panic on the lane thread is caught: the operation it happened in fails
//! with an `internal` error naming it, the communicator is aborted, and
//! every other queued send and receive fails with the verdict. A panic in an
//! inline run ends that call the same way.

use crate::rawbuf::RawBuf;
use crate::work::Completion;
use parking_lot::Mutex;
use ringleader_core::fault::{self, Point};
use ringleader_core::{AbortSignal, Config, Error, Fingerprint, OpKind, Rank, RankSet, Result};
use ringleader_diag::snapshot::P2pWait;
use ringleader_diag::FlightRecorder;
use ringleader_transport::driver::lane::{LaneWait, Moved, Transfer};
use ringleader_transport::driver::spin_budget::SpinBudget;
use ringleader_transport::shm::Waiter;
use ringleader_transport::{AnyLink, Buf, Link, OpInfo};
use rustix::event::{eventfd, EventfdFlags};
use rustix::fd::{AsFd, OwnedFd};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// What the lane needs of the communicator it serves. The engine's shared
/// state implements it: the engine holds the lane ([`P2p`]), and the lane
/// reaches the communicator only through this, never through the engine.
pub(crate) trait Host: Send + Sync {
    /// This rank.
    fn rank(&self) -> Rank;
    /// The configuration in force (checks, timeout).
    fn config(&self) -> &Config;
    /// The lane's shared half: submissions, wake-ups, what it publishes.
    fn lane(&self) -> &P2p;
    /// Where every operation is recorded.
    fn recorder(&self) -> &FlightRecorder;
    /// The communicator's abort signal.
    fn abort_signal(&self) -> &AbortSignal;
    /// The verdict for `e`, the failure of the operation recorded as
    /// `record` (which becomes the communicator's failure; see
    /// `failure.rs`).
    fn verdict(&self, record: u64, e: Error) -> Error;
    /// [`Host::verdict`] for an internal error (a caught panic): should
    /// forming the verdict panic too, `e` itself, with the communicator
    /// aborted.
    fn internal_verdict(&self, record: u64, e: Error) -> Error;
}

/// One queued send or receive.
#[derive(Debug)]
struct P2pJob {
    peer: Rank,
    seq: u64,
    fp: Fingerprint,
    record: u64,
    buf: RawBuf,
    done: Arc<Completion>,
    /// How far its frame has moved (part of it, when a call that began it
    /// handed it over; see [`run_here`]).
    transfer: Transfer,
    /// Whether its record was marked started (by an inline run).
    started: bool,
}

impl P2pJob {
    /// A send or receive not yet moved.
    fn new(op: P2pOp, done: Arc<Completion>) -> P2pJob {
        let P2pOp { peer, seq, fp, record, buf, .. } = op;
        P2pJob { peer, seq, fp, record, buf, done, transfer: Transfer::new(), started: false }
    }
}

/// A send or receive, numbered and recorded ([`run_here`] takes it before
/// anything waits for it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct P2pOp {
    pub peer: Rank,
    pub seq: u64,
    pub fp: Fingerprint,
    pub record: u64,
    /// The record's creation stamp: an inline run starts at it.
    pub at: u64,
    pub buf: RawBuf,
}

/// A peer's send/recv link, and the sequence numbers of the last send and
/// receive that completed on it (see the module docs).
#[derive(Debug, Default)]
struct PeerLink {
    link: Option<AnyLink>,
    sent: u64,
    received: u64,
}

impl PeerLink {
    /// The number of the last completed operation of a direction.
    fn last(&mut self, send: bool) -> &mut u64 {
        if send {
            &mut self.sent
        } else {
            &mut self.received
        }
    }
}

impl P2pJob {
    fn is_send(&self) -> bool {
        self.fp.op == OpKind::Send
    }
}

#[derive(Debug, Default)]
struct Queue {
    jobs: Vec<P2pJob>,
    shutdown: bool,
    started: bool,
}

/// The lane: the links, the submission queue, and what wakes the thread.
pub(crate) struct P2p {
    queue: Mutex<Queue>,
    /// Each peer's link (`None`: this rank's own slot), see [`PeerLink`].
    peers: Vec<Mutex<PeerLink>>,
    /// The last sequence number given to a send to, and a receive from,
    /// each peer.
    send_seq: Vec<AtomicU64>,
    recv_seq: Vec<AtomicU64>,
    /// How long a blocking inline run polls before it hands over: learned
    /// from the waits that outlast it (see the module docs).
    pub budget: SpinBudget,
    kick: OwnedFd,
    waiter: Option<Waiter>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Peers with a send or receive in flight, for the monitor, which aborts
    /// them when such a peer dies or leaves.
    pub pending: RankSet,
    /// The head send and receive of each peer, oldest first: what this rank
    /// waits in, for its heartbeat and snapshot (the verdict's wait-for
    /// graph).
    pub waits: Mutex<Vec<P2pWait>>,
}

impl std::fmt::Debug for P2p {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("P2p").field("pending", &self.pending.ranks()).finish()
    }
}

impl P2p {
    pub(crate) fn new(links: Vec<Option<AnyLink>>, waiter: Option<Waiter>) -> std::io::Result<P2p> {
        let world = links.len();
        Ok(P2p {
            queue: Mutex::new(Queue::default()),
            send_seq: (0..world).map(|_| AtomicU64::new(0)).collect(),
            recv_seq: (0..world).map(|_| AtomicU64::new(0)).collect(),
            peers: links.into_iter().map(|link| Mutex::new(PeerLink { link, sent: 0, received: 0 })).collect(),
            budget: SpinBudget::default(),
            kick: eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?,
            waiter,
            thread: Mutex::new(None),
            pending: RankSet::new(world),
            waits: Mutex::new(Vec::new()),
        })
    }

    fn wake(&self) {
        let _ = rustix::io::write(&self.kick, &1u64.to_ne_bytes());
        if let Some(w) = &self.waiter {
            w.ring();
        }
    }

    /// The next sequence number of a send to (or receive from) `peer`.
    pub(crate) fn next_seq(&self, send: bool, peer: Rank) -> u64 {
        let c = if send { &self.send_seq[peer] } else { &self.recv_seq[peer] };
        c.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Stops the lane thread: queued operations fail.
    pub(crate) fn shutdown(&self) {
        {
            let mut q = self.queue.lock();
            q.shutdown = true;
            for j in q.jobs.drain(..) {
                j.done.complete(Err(Error::aborted(format!(
                    "the communicator was destroyed before {} #{} ran",
                    j.fp.op, j.seq
                ))));
            }
        }
        self.wake();
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
    }
}

/// Queues `job` on `host`'s lane, starting the lane thread on first use.
fn queue<H: Host + 'static>(host: &Arc<H>, job: P2pJob) -> Result<()> {
    let p = host.lane();
    let mut q = p.queue.lock();
    if q.shutdown {
        return Err(Error::aborted("the communicator was destroyed"));
    }
    q.jobs.push(job);
    if !q.started {
        q.started = true;
        let h: Arc<dyn Host> = host.clone();
        let h = std::thread::Builder::new()
            .name(format!("ringleader-p2p-{}", host.rank()))
            .spawn(move || Lane::run(h))
            .map_err(|e| Error::invalid("send/recv", format!("cannot start the point-to-point thread: {e}")))?;
        *p.thread.lock() = Some(h);
    }
    drop(q);
    p.wake();
    Ok(())
}

/// What [`run_here`] did with a send or receive.
pub(crate) enum Here {
    /// It ran here, to the end (or to its failure's verdict).
    Ran(Result<()>),
    /// It is queued on the lane (handed over part-moved, or not begun):
    /// wait for this. With when a blocking call began waiting here, if it
    /// handed over because its polling budget ran out: tell the budget
    /// how long the wait lasted in all ([`P2p::waited`]).
    Queued(Arc<Completion>, Option<Instant>),
}

impl P2p {
    /// A blocking call that began waiting at `began`, polled its whole
    /// budget and handed over, has completed: the budget learns how long
    /// it waited (see `spin_budget.rs` in the transport: a ping-pong whose
    /// waits outlast a fixed budget stays in wake-ups).
    pub(crate) fn waited(&self, began: Option<Instant>) {
        if let Some(b) = began {
            self.budget.slept(b.elapsed());
        }
    }
}

/// Runs send or receive `op` on the caller's thread when it may (see the
/// module docs), else queues it: `blocking`, polling for a while when its
/// link cannot move; else only while it moves. A queued one's completion
/// polls for `poll`, at least [`QUEUED_POLL`], before it sleeps.
pub(crate) fn run_here<H: Host + 'static>(
    host: &Arc<H>,
    op: P2pOp,
    blocking: bool,
    poll: std::time::Duration,
) -> Result<Here> {
    crate::stacks::note_caller();
    let p = host.lane();
    let send = op.fp.op == OpKind::Send;
    let Some(mut peer) = p.peers.get(op.peer).and_then(|m| m.try_lock()) else {
        return queued(host, op, poll, None, None);
    };
    if op.seq != *peer.last(send) + 1 || peer.link.is_none() {
        drop(peer);
        return queued(host, op, poll, None, None);
    }
    // Numbered, recorded and started in one go: one clock read.
    host.recorder().started_at(op.record, 0, op.at);
    let info = OpInfo { seq: op.seq, fingerprint: op.fp, checks: host.config().checks };
    let mut transfer = Transfer::new();
    let idle = p.budget.idle();
    let (mut began, mut waited) = (None, std::time::Duration::ZERO);
    let ran = catch_unwind(AssertUnwindSafe(|| -> Result<bool> {
        fault::check(Point::P2p, op.seq);
        let link = peer.link.as_deref_mut().expect("checked above");
        let mut polls = 0u32;
        loop {
            let moved = move_buf(&mut transfer, link, op.buf, &info, send)?;
            if moved == Moved::Done {
                return Ok(true);
            }
            if let Some(reason) = host.abort_signal().reason() {
                return Err(reason);
            }
            if !blocking {
                if moved == Moved::Blocked {
                    return Ok(false);
                }
                continue;
            }
            // The clock every few polls: reading it costs more than a poll.
            let start = *began.get_or_insert_with(Instant::now);
            polls = polls.wrapping_add(1);
            if polls % 8 == 0 {
                waited = start.elapsed();
            }
            if !idle.poll_again(waited) {
                return Ok(false);
            }
        }
    }));
    match ran {
        Ok(Ok(true)) => {
            *peer.last(send) = op.seq;
            drop(peer);
            // How long it waited, as of the loop's last clock read (none
            // when it moved at once): its end without another read.
            let ran = began.map_or(0, |_| u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX));
            host.recorder().completed_after(op.record, 0, Some(ran));
            Ok(Here::Ran(Ok(())))
        }
        // Still moving: the lane takes it from here, ahead of anything
        // queued behind it (queued while the link is still held, so that
        // the lane cannot move a later one first).
        Ok(Ok(false)) => {
            let r = queued(host, op, poll, Some(transfer), began.filter(|_| blocking));
            drop(peer);
            r
        }
        Ok(Err(e)) => {
            drop(peer);
            Ok(Here::Ran(Err(host.verdict(op.record, e))))
        }
        Err(payload) => {
            drop(peer);
            let place = format!(
                "thread '{}', running a {} inline",
                std::thread::current().name().unwrap_or("unnamed"),
                op.fp.op
            );
            let e = Error::from_panic(payload.as_ref(), &place, host.rank(), Some((op.fp.op, op.seq)));
            Ok(Here::Ran(Err(host.internal_verdict(op.record, e))))
        }
    }
}

/// How long a wait for a queued send or receive polls at least (spinning a
/// few times, then yielding its core between polls) before it sleeps, even
/// where the ranks' threads outnumber the cores, unlike a collective's
/// ([`crate::work::poll_budget`]): the operation completes on the lane's
/// thread, so a waiter asleep costs every message a second wake-up, the
/// lane's and then its own. Through torch, whose `recv` is an `irecv` and a
/// wait, a 2-rank 8-byte ping-pong on 2 cores took 143-226 µs a round trip
/// with waiters that slept at once and 67-110 µs with this (1 ms: 54-125).
const QUEUED_POLL: std::time::Duration = std::time::Duration::from_micros(200);

/// Queues `op` (part-moved as far as `transfer` says, if it was begun;
/// `began`: see [`Here::Queued`]).
fn queued<H: Host + 'static>(
    host: &Arc<H>,
    op: P2pOp,
    poll: std::time::Duration,
    transfer: Option<Transfer>,
    began: Option<Instant>,
) -> Result<Here> {
    let done = Completion::new(poll.max(QUEUED_POLL));
    let mut job = P2pJob::new(op, done.clone());
    if let Some(t) = transfer {
        job.transfer = t;
        job.started = true;
    }
    queue(host, job)?;
    Ok(Here::Queued(done, began))
}

/// One direction of one peer: its queued operations, in sequence order.
#[derive(Debug, Default)]
struct Flow {
    jobs: VecDeque<(P2pJob, Instant)>,
}

/// The lane thread's state.
struct Lane {
    host: Arc<dyn Host>,
    sends: Vec<Flow>,
    recvs: Vec<Flow>,
    /// The peers last published in `P2p::pending`.
    published: Vec<Rank>,
    /// The operation being moved (record, op, seq), for the error of a panic.
    moving: Option<(u64, OpKind, u64)>,
    /// The record ids of the heads last published in `P2p::waits`.
    heads: Vec<u64>,
}

impl Lane {
    fn run(host: Arc<dyn Host>) {
        let n = host.lane().peers.len();
        let mut lane = Lane {
            host,
            sends: (0..n).map(|_| Flow::default()).collect(),
            recvs: (0..n).map(|_| Flow::default()).collect(),
            published: Vec::new(),
            moving: None,
            heads: Vec::new(),
        };
        loop {
            match catch_unwind(AssertUnwindSafe(|| lane.take_new().then(|| lane.step()))) {
                Ok(None) => return,
                Ok(Some(Ok(()))) => {}
                Ok(Some(Err((record, e)))) => lane.fail_all(record, e, false),
                Err(payload) => {
                    // The head operation that was moving, else the oldest.
                    let (record, op) =
                        match lane.moving.take().or_else(|| lane.oldest().map(|(j, _)| (j.record, j.fp.op, j.seq))) {
                            Some((record, op, seq)) => (record, Some((op, seq))),
                            None => (0, None),
                        };
                    let place = format!("thread '{}'", std::thread::current().name().unwrap_or("unnamed"));
                    let e = Error::from_panic(payload.as_ref(), &place, lane.host.rank(), op);
                    lane.fail_all(record, e, true);
                }
            }
        }
    }

    /// Moves newly submitted jobs into the flows; false once shut down and idle.
    fn take_new(&mut self) -> bool {
        let mut q = self.host.lane().queue.lock();
        for j in q.jobs.drain(..) {
            if !j.started {
                self.host.recorder().started_seq(j.record, 0);
            }
            let flows = if j.is_send() { &mut self.sends } else { &mut self.recvs };
            // In sequence order: a blocking call handed over is queued after
            // the later operations of other threads may have been.
            let jobs = &mut flows[j.peer].jobs;
            let at = jobs.iter().position(|(q, _)| q.seq > j.seq).unwrap_or(jobs.len());
            jobs.insert(at, (j, Instant::now()));
        }
        let pending: Vec<Rank> = (self.sends.iter().zip(&self.recvs).enumerate())
            .filter(|(_, (s, r))| !s.jobs.is_empty() || !r.jobs.is_empty())
            .map(|(peer, _)| peer)
            .collect();
        if pending != self.published {
            self.host.lane().pending.replace(&self.published, &pending);
            self.published = pending;
        }
        let shutdown = q.shutdown;
        drop(q);
        self.publish_waits();
        !(shutdown && self.published.is_empty())
    }

    /// Publishes the head of every flow in `P2p::waits` when they changed
    /// (compared by record id, so an idle loop takes no lock).
    fn publish_waits(&mut self) {
        let mut heads: Vec<&(P2pJob, Instant)> =
            self.sends.iter().chain(&self.recvs).filter_map(|f| f.jobs.front()).collect();
        heads.sort_by_key(|(j, t)| (*t, j.record));
        if heads.len() == self.heads.len() && heads.iter().zip(&self.heads).all(|((j, _), r)| j.record == *r) {
            return;
        }
        self.heads = heads.iter().map(|(j, _)| j.record).collect();
        *self.host.lane().waits.lock() =
            heads.iter().map(|(j, _)| P2pWait { op: j.fp.op, peer: j.peer, seq: j.seq }).collect();
    }

    fn idle(&self) -> bool {
        self.sends.iter().chain(&self.recvs).all(|f| f.jobs.is_empty())
    }

    /// Moves what can move, or waits; an error names the operation it broke.
    fn step(&mut self) -> std::result::Result<(), (u64, Error)> {
        let host = self.host.clone();
        if let Some(reason) = host.abort_signal().reason().filter(|_| !self.idle()) {
            let record = self.oldest().map_or(0, |(j, _)| j.record);
            return Err((record, reason));
        }
        let mut moved = false;
        for peer in 0..self.sends.len() {
            moved |= self.pump(peer, true)?;
            moved |= self.pump(peer, false)?;
        }
        if moved {
            return Ok(());
        }
        if let Some((j, since)) = self.oldest() {
            let waited = since.elapsed();
            // The lane is the watchdog of its own operations (the monitor
            // watches the collective engine).
            if waited >= crate::watchdog::op_timeout(host.config().timeout, None) {
                let e = Error::Timeout { op: j.fp.op, seq: j.seq, waited, awaited: vec![j.peer] };
                return Err((j.record, e));
            }
        }
        self.wait();
        Ok(())
    }

    fn oldest(&self) -> Option<&(P2pJob, Instant)> {
        self.sends.iter().chain(&self.recvs).filter_map(|f| f.jobs.front()).min_by_key(|(_, t)| *t)
    }

    /// Moves the head send (or receive) of `peer`, if it is the next of
    /// its direction (an earlier one may be running inline); completes it
    /// when done. Returns whether any byte moved.
    fn pump(&mut self, peer: usize, send: bool) -> std::result::Result<bool, (u64, Error)> {
        let host = self.host.clone();
        let checks = host.config().checks;
        let flow = if send { &mut self.sends[peer] } else { &mut self.recvs[peer] };
        let Some((job, _)) = flow.jobs.front_mut() else { return Ok(false) };
        let mut pl = host.lane().peers[peer].lock();
        if job.seq != *pl.last(send) + 1 {
            return Ok(false);
        }
        let Some(link) = pl.link.as_deref_mut() else { return Ok(false) };
        let op = OpInfo { seq: job.seq, fingerprint: job.fp, checks };
        let record = job.record;
        self.moving = Some((record, job.fp.op, job.seq));
        fault::check(Point::P2p, job.seq);
        let r = move_buf(&mut job.transfer, link, job.buf, &op, send);
        self.moving = None;
        let progress = r.map_err(|e| (record, e))?;
        if progress == Moved::Done {
            *pl.last(send) = job.seq;
            drop(pl);
            let (job, _) = flow.jobs.pop_front().expect("head exists");
            host.recorder().completed_seq(job.record, 0);
            job.done.complete(Ok(()));
        }
        Ok(progress != Moved::Blocked)
    }

    /// Sleeps until a link, a submission or an abort may have something
    /// (the driver's sleep, over the links with an operation queued).
    fn wait(&self) {
        let p = self.host.lane();
        // The links of the peers with something queued, held while asleep
        // (an inline call finding one held queues instead).
        let held: Vec<(usize, parking_lot::MutexGuard<'_, PeerLink>)> = (0..self.sends.len())
            .filter(|&peer| !self.sends[peer].jobs.is_empty() || !self.recvs[peer].jobs.is_empty())
            .map(|peer| (peer, p.peers[peer].lock()))
            .collect();
        let mut wait = LaneWait::new(&[p.kick.as_fd(), self.host.abort_signal().fd()]);
        for (peer, pl) in &held {
            if let Some(link) = &pl.link {
                wait.link(link.as_ref(), !self.sends[*peer].jobs.is_empty(), !self.recvs[*peer].jobs.is_empty());
            }
        }
        wait.sleep(p.waiter.as_ref(), || !p.queue.lock().jobs.is_empty());
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&p.kick, &mut b);
    }

    /// The lane broke: the verdict fails every queued operation (`internal`:
    /// `e` is a caught panic).
    fn fail_all(&mut self, record: u64, e: Error, internal: bool) {
        self.moving = None;
        let host = &self.host;
        let verdict = match internal {
            true => host.internal_verdict(record, e),
            false => match catch_unwind(AssertUnwindSafe(|| host.verdict(record, e.clone()))) {
                Ok(v) => v,
                Err(p) => host.internal_verdict(
                    record,
                    Error::from_panic(p.as_ref(), "forming a verdict", host.rank(), e.op().zip(e.seq())),
                ),
            },
        };
        for f in self.sends.iter_mut().chain(self.recvs.iter_mut()) {
            for (j, _) in f.jobs.drain(..) {
                self.host.recorder().failed(j.record, &verdict.to_string(), vec![j.peer]);
                j.done.complete(Err(verdict.clone()));
            }
        }
        self.host.lane().pending.replace(&self.published, &[]);
        self.published.clear();
        self.publish_waits();
    }
}

/// Moves a send from (or a receive into) `buf` on `link` as far as it
/// goes, from where `transfer` left it (the driver moves the bytes).
#[allow(unsafe_code)] // the operation's buffer, as the submitter lent it
fn move_buf(transfer: &mut Transfer, link: &mut dyn Link, buf: RawBuf, op: &OpInfo, send: bool) -> Result<Moved> {
    if send {
        // SAFETY: the submitter keeps the buffer alive and unchanged until
        // the operation completes (a sync send blocks; an async one owns it
        // in its Work).
        let data = match unsafe { buf.buf(true) } {
            Buf::Ro(d) => d,
            Buf::Rw(d) => &*d,
        };
        transfer.send(link, data, op)
    } else {
        // SAFETY: the submitter keeps the buffer alive and unaliased until
        // the job completes.
        let Buf::Rw(dst) = (unsafe { buf.buf(false) }) else { unreachable!("receive buffers are writable") };
        transfer.recv(link, dst, op)
    }
}
