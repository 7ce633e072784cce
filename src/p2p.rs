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
//! A panic on the lane thread is caught: the operation it happened in fails
//! with an `internal` error naming it, the communicator is aborted, and
//! every other queued send and receive fails with the verdict.

use crate::rawbuf::RawBuf;
use crate::work::Completion;
use parking_lot::Mutex;
use ringleader_core::fault::{self, Point};
use ringleader_core::{AbortSignal, Config, Error, Fingerprint, OpKind, Rank, RankSet, Result};
use ringleader_diag::snapshot::P2pWait;
use ringleader_diag::FlightRecorder;
use ringleader_transport::driver::lane::{LaneWait, Moved, Transfer};
use ringleader_transport::shm::Waiter;
use ringleader_transport::{AnyLink, Buf, Link, OpInfo};
use rustix::event::{eventfd, EventfdFlags};
use rustix::fd::{AsFd, OwnedFd};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
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
pub(crate) struct P2pJob {
    pub peer: Rank,
    pub seq: u64,
    pub fp: Fingerprint,
    pub record: u64,
    pub buf: RawBuf,
    pub done: Arc<Completion>,
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
    send_seq: Vec<u64>,
    recv_seq: Vec<u64>,
}

/// The lane: its links (until the thread takes them), the submission
/// queue, and what wakes the thread.
pub(crate) struct P2p {
    queue: Mutex<Queue>,
    links: Mutex<Option<Vec<Option<AnyLink>>>>,
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
            queue: Mutex::new(Queue { send_seq: vec![0; world], recv_seq: vec![0; world], ..Queue::default() }),
            links: Mutex::new(Some(links)),
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
        let mut q = self.queue.lock();
        let c = if send { &mut q.send_seq[peer] } else { &mut q.recv_seq[peer] };
        *c += 1;
        *c
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
pub(crate) fn submit<H: Host + 'static>(host: &Arc<H>, job: P2pJob) -> Result<()> {
    crate::stacks::note_caller();
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

/// One direction of one peer: its queued operations, oldest first, and how
/// far the head one's frame has moved.
#[derive(Debug, Default)]
struct Flow {
    jobs: VecDeque<(P2pJob, Instant)>,
    transfer: Transfer,
}

/// The lane thread's state.
struct Lane {
    host: Arc<dyn Host>,
    links: Vec<Option<AnyLink>>,
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
        let links = host.lane().links.lock().take().unwrap_or_default();
        let n = links.len();
        let mut lane = Lane {
            host,
            links,
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
            self.host.recorder().started_seq(j.record, 0);
            let flows = if j.is_send() { &mut self.sends } else { &mut self.recvs };
            flows[j.peer].jobs.push_back((j, Instant::now()));
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
        for peer in 0..self.links.len() {
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

    /// Moves the head send (or receive) of `peer`; completes it when done.
    /// Returns whether any byte moved.
    fn pump(&mut self, peer: usize, send: bool) -> std::result::Result<bool, (u64, Error)> {
        let checks = self.host.config().checks;
        let flow = if send { &mut self.sends[peer] } else { &mut self.recvs[peer] };
        let Some((job, _)) = flow.jobs.front() else { return Ok(false) };
        let Some(link) = self.links[peer].as_deref_mut() else { return Ok(false) };
        let op = OpInfo { seq: job.seq, fingerprint: job.fp, checks };
        let record = job.record;
        self.moving = Some((record, job.fp.op, job.seq));
        fault::check(Point::P2p, job.seq);
        let r = move_head(flow, link, &op, send);
        self.moving = None;
        let progress = r.map_err(|e| (record, e))?;
        if progress == Moved::Done {
            let (job, _) = flow.jobs.pop_front().expect("head exists");
            self.host.recorder().completed_seq(job.record, 0);
            job.done.complete(Ok(()));
        }
        Ok(progress != Moved::Blocked)
    }

    /// Sleeps until a link, a submission or an abort may have something
    /// (the driver's sleep, over the links with an operation queued).
    fn wait(&self) {
        let p = self.host.lane();
        let mut wait = LaneWait::new(&[p.kick.as_fd(), self.host.abort_signal().fd()]);
        for (peer, link) in self.links.iter().enumerate() {
            if let Some(link) = link {
                wait.link(link.as_ref(), !self.sends[peer].jobs.is_empty(), !self.recvs[peer].jobs.is_empty());
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
            f.transfer.reset();
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

/// Moves the head operation of `flow` on `link` as far as it goes (the
/// driver moves the bytes).
#[allow(unsafe_code)] // the job's buffer, as the submitter lent it
fn move_head(flow: &mut Flow, link: &mut dyn Link, op: &OpInfo, send: bool) -> Result<Moved> {
    let Flow { jobs, transfer } = flow;
    let job = &jobs.front().expect("head exists").0;
    if send {
        // SAFETY: the submitter keeps the buffer alive and unchanged until
        // the job completes (a sync send blocks; an async one owns it in
        // its Work).
        let data = match unsafe { job.buf.buf(true) } {
            Buf::Ro(d) => d,
            Buf::Rw(d) => &*d,
        };
        transfer.send(link, data, op)
    } else {
        // SAFETY: the submitter keeps the buffer alive and unaliased until
        // the job completes.
        let Buf::Rw(dst) = (unsafe { job.buf.buf(false) }) else { unreachable!("receive buffers are writable") };
        transfer.recv(link, dst, op)
    }
}
