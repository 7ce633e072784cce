//! The transfer driver: runs one collective's [`Plan`] over the links.
//!
//! An algorithm does not touch sockets. It describes its transfers as a plan,
//! "send this byte range to rank r", "receive the next frame from rank s into
//! this range (or reduce it into this range)", with dependencies between them
//! ("send chunk k of step 2 once chunk k of step 1 has been received"), and
//! the driver runs every transfer it can, on every link at once, from one
//! thread with nonblocking IO. Sends and receives overlap (full duplex), a
//! reduction of one chunk overlaps the arrival of the next, and a link that
//! would block costs a wait that also watches the abort signal.
//!
//! Frames on one link arrive in order, so the n-th receive planned from a
//! peer matches the n-th send that peer planned toward us; the frame tag
//! records that position and the header check catches any disagreement.
//!
//! Where each part lives (files under `src/driver/`):
//! - `mod.rs`: the scheduler (which channel moves next, when a plan is
//!   done, what a failed plan leaves behind);
//! - `chan.rs`: each channel's run state, reset in one assignment per plan;
//! - `send.rs` and `recv.rs`: moving one frame at a time, and choosing how
//!   each payload travels;
//! - `strategy.rs`: where a received payload lands (copied, streamed,
//!   reduced);
//! - `frame_io.rs`: frames on a link, header checks, and the errors they
//!   turn into; the goodbye frames a rank that leaves writes
//!   ([`say_goodbye`]);
//! - `single_copy.rs` and `splice.rs`: the two zero-copy protocols;
//! - `fastbox.rs`: small frames whole in a link's fastbox;
//! - `boxed.rs`: plans whose every frame fits a fastbox: which qualify,
//!   and the scheduler's state when their run hands over to it;
//! - `express.rs`: such plans compiled once into a straight line of
//!   sends and receives ([`Express`]) and run without the per-channel
//!   machinery (handing over to the scheduler when they must wait long or
//!   a frame takes the stream);
//! - `wait.rs` ([`wait`]): how a rank waits when nothing can move;
//! - `spin_budget.rs` ([`spin_budget`]): a polling budget that grows while
//!   waits end shortly after it ran out (the send/recv calls' waits);
//! - `lane.rs` ([`lane`]): the send/recv lane's IO, for the runtime's lane
//!   thread: one point-to-point frame moved a piece at a time
//!   ([`lane::Transfer`]) and the lane's sleep ([`lane::LaneWait`]). The
//!   lane's sends and receives arrive one by one and move independently,
//!   so they are not a plan; they use the same framing, header checks,
//!   errors and waiting policy.
//!
//! Nothing outside the driver writes to or reads from a link once the data
//! plane is set up: collectives, sends and receives, and goodbyes all go
//! through here.

mod boxed;
mod chan;
mod express;
mod fastbox;
mod frame_io;
pub mod lane;
mod recv;
mod send;
mod single_copy;
pub mod spin_budget;
mod splice;
mod strategy;
pub mod wait;

#[cfg(test)]
mod tests;

pub use express::Express;
pub use frame_io::say_goodbye;
pub use wait::Idle;
use wait::{Doorbells, IdleSpan, Sockets, Whereabouts};

use crate::link::{AnyLink, Wake};
use crate::plan::{Buf, Chan, OpInfo, Plan};
use crate::shm::Waiter;
use chan::ChanRun;
use ringleader_core::{AbortSignal, Rank, RankSet, Result};
use send::SendPolicy;
use std::time::Instant;

/// The links a driver runs over: `links[peer][stream]`.
pub type Links = [Vec<AnyLink>];

/// What bounds and watches a run: the abort signal that ends it, the
/// deadline past which it times out, where it publishes the peers it
/// waits for, and what the caller does while the first frames travel.
#[derive(Clone, Copy)]
pub struct Watch<'a> {
    /// Ends the run at once when raised.
    pub abort: &'a AbortSignal,
    /// When the run times out.
    pub deadline: Deadline,
    /// While blocked, the ranks the run waits for are published here.
    pub awaited: &'a RankSet,
    /// Called at most once per run, after its first pass over its links:
    /// its first frames are then on their way, and the peers' answers take
    /// a while. Bookkeeping done here (the runtime writes the call's flight
    /// record) is off the critical path of a small collective, where done
    /// before the run it would delay every peer by as much. An express run
    /// ([`Driver::run_express`]) calls it when its sends before the first
    /// receive are out, before it polls for that receive (or earlier, when
    /// a send waits for a free cell, or when it hands over); one that only
    /// sends and never waits does not call it, and the caller does that
    /// bookkeeping after the run, at once with the rest.
    pub under_way: Option<&'a dyn Fn()>,
}

impl std::fmt::Debug for Watch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("abort", &self.abort)
            .field("deadline", &self.deadline)
            .field("awaited", &self.awaited)
            .field("under_way", &self.under_way.is_some())
            .finish()
    }
}

/// When a run times out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// Never: the caller bounds the run some other way.
    Never,
    /// Past this instant.
    At(Instant),
    /// This long after the run first has to sleep. A run that never sleeps
    /// (its spinning and yielding are bounded by the [`Idle`] policy) then
    /// reads no clock for its deadline, which at small messages is a
    /// noticeable part of the whole call.
    AfterFirstSleep(std::time::Duration),
}

impl Deadline {
    /// The instant it names, for a run that first sleeps at `now`.
    fn resolve(self, now: Instant) -> Option<Instant> {
        match self {
            Deadline::Never => None,
            Deadline::At(t) => Some(t),
            Deadline::AfterFirstSleep(d) => now.checked_add(d),
        }
    }
}

/// A rank publishes the CPU it runs on at the start of one run in this
/// many (and whenever it waits, see `wait.rs`): a peer waiting for it
/// reads it to tell whether they share a core, and a rank that never
/// waits moves between CPUs rarely, where reading the CPU on every run is
/// a noticeable part of a small collective.
const CPU_EVERY: u32 = 16;

/// Runs plans. Holds per-link scratch that is reused between collectives,
/// so the steady state allocates nothing.
#[derive(Debug, Default)]
pub struct Driver {
    chans: Vec<ChanRun>,
    /// The channels the current plan uses.
    active: Vec<usize>,
    send_done: Vec<bool>,
    recv_done: Vec<bool>,
    /// Receives a send of this rank waits for (`after`): what they bring is
    /// read again soon, so it is copied into the cache, never around it.
    forwarded: Vec<bool>,
    /// How the current plan's sends travel.
    policy: SendPolicy,
    /// This rank's shared-memory doorbell, when it has local peers.
    waiter: Option<Waiter>,
    /// The other ranks on this host, sorted: where they run tells whether
    /// a wait shares its core with them (see `wait.rs`).
    local: Vec<Rank>,
    /// What to do before sleeping when no link can move.
    idle: Idle,
    /// The current or last run's idle time while it has not slept (see
    /// [`Driver::spun_ns`]).
    spun: Option<u64>,
    /// When this rank may next try to move itself off a core it shares
    /// with a peer (see `wait.rs`).
    moved: std::cell::Cell<wait::MoveGaps>,
    /// Answers in a row, one per asking wait, that a peer shares this
    /// rank's core (see `wait.rs`).
    seen_near: std::cell::Cell<u8>,
    /// Runs so far (wrapping), for publishing this rank's CPU on one run
    /// in [`CPU_EVERY`].
    runs: u32,
    /// The peers last published as awaited (what `awaited` holds from us).
    published: smallvec::SmallVec<[Rank; 8]>,
    /// The last plan compiled for express runs (see `boxed.rs`), and the
    /// run's fingerprint as fastbox
    /// frames carry it.
    boxed: boxed::Boxed,
    /// The largest plan the scratch above is sized for: (channels, sends,
    /// receives). See [`Driver::fit`].
    fitted: (usize, usize, usize),
}

impl Driver {
    /// A driver with no scratch yet.
    pub fn new() -> Driver {
        Driver::default()
    }

    /// What the driver does before it sleeps when no link can move: poll
    /// the links for a while ([`Idle`]). Sockets are polled too: on a host
    /// where each rank has a core, the next frame often arrives within
    /// microseconds, and a sleep costs a wake-up that a virtual machine
    /// makes expensive.
    ///
    /// ```
    /// use ringleader_transport::{Driver, Idle};
    /// use std::time::Duration;
    /// let mut d = Driver::new();
    /// d.set_idle(Idle::Spin(Duration::from_micros(50)));
    /// ```
    pub fn set_idle(&mut self, idle: Idle) {
        self.idle = idle;
    }

    /// Sends socket frames of `min` bytes and more from the sender's pages,
    /// where the source is safe to lend (see [`crate::frame`]): the
    /// receiver's kernel then makes the only copy (`None`: always copy them
    /// into the socket).
    ///
    /// ```
    /// use ringleader_core::config::DEFAULT_TCP_SPLICE;
    /// use ringleader_transport::Driver;
    /// let mut d = Driver::new();
    /// d.set_splice_min(Some(DEFAULT_TCP_SPLICE));
    /// ```
    pub fn set_splice_min(&mut self, min: Option<usize>) {
        self.policy.splice_min = min;
    }

    /// How long the last run waited for its peers, in nanoseconds, if it
    /// never slept: its idle stretches as of their last clock reads, so a
    /// little less than it waited (see `wait::CLOCK_EVERY`). A run that
    /// never waited: zero. Lets the caller tell when a short run ended
    /// without reading the clock itself; `None` after a run that slept (or
    /// failed). (Nanoseconds, not a `Duration`: the common answer, zero,
    /// then costs the caller no conversion.)
    pub fn spun_ns(&self) -> Option<u64> {
        self.spun
    }

    /// What a run does once, after its first pass over its links, while its
    /// first frames travel: the caller's bookkeeping ([`Watch::under_way`]),
    /// and, one run in [`CPU_EVERY`], where this rank runs, published for a
    /// peer that waits for it to tell whether they share a core (see
    /// `wait.rs`). Done before that pass, either would delay every peer's
    /// first frame by as much.
    #[inline]
    fn under_way(&self, pending: &mut Option<&dyn Fn()>) {
        if let Some(f) = pending.take() {
            self.publish_cpu();
            f();
        }
    }

    /// One run in [`CPU_EVERY`]: where this rank runs, for a peer that
    /// waits for it (see [`Driver::under_way`]).
    #[inline]
    fn publish_cpu(&self) {
        if self.runs % CPU_EVERY == 1 {
            if let Some(w) = &self.waiter {
                w.note_cpu();
            }
        }
    }

    fn add_spun(&mut self, span: &IdleSpan) {
        if let Some(t) = &mut self.spun {
            *t = t.saturating_add(u64::try_from(span.lasted().as_nanos()).unwrap_or(u64::MAX));
        }
    }

    /// The ranks on this host (this rank, `me`, among them or not): a
    /// rank that waits for one of them over a socket checks whether they
    /// share a core (see [`Idle`]), as it does over shared memory.
    ///
    /// ```
    /// let mut d = ringleader_transport::Driver::new();
    /// d.set_local(1, &[0, 1, 2, 3]);
    /// ```
    pub fn set_local(&mut self, me: Rank, ranks: &[Rank]) {
        self.local = ranks.iter().copied().filter(|&r| r != me).collect();
        self.local.sort_unstable();
        self.local.dedup();
    }

    /// Lets the driver wait on shared-memory links: [`Idle`] a while, then
    /// sleep on `waiter` (this rank's doorbell).
    pub fn set_shm(&mut self, waiter: Waiter, idle: Idle) {
        self.waiter = Some(waiter);
        self.idle = idle;
    }

    /// Runs `plan`, whose frames belong to `op`, to completion, or until an
    /// error, the abort signal, or the deadline (see [`Watch`]).
    pub fn run(
        &mut self,
        links: &mut Links,
        bufs: &mut [Buf<'_>],
        plan: &Plan,
        op: &OpInfo,
        watch: &Watch<'_>,
    ) -> Result<()> {
        self.boxed.encode(&op.fingerprint);
        // A plan whose frames all fit fastboxes runs as an express run
        // (see `boxed.rs`).
        if let Some(x) = self.compiled(links, plan) {
            let result = self.run_express(links, bufs, plan, &x, op, watch);
            self.keep_compiled(x);
            return result;
        }
        ringleader_core::fault::check(ringleader_core::fault::Point::Driver, op.seq);
        let streams = links.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let nchans = links.len() * streams;
        self.runs = self.runs.wrapping_add(1);
        self.spun = Some(0);
        self.active.clear();
        self.prepare(nchans, streams, plan);
        let result = self.drive(links, bufs, plan, op, watch, streams);
        self.finish(links, streams, watch, result)
    }

    /// What ends every run that used the general loop: its channels
    /// closed for the next plan, and, on success, no peer published as
    /// awaited any more (on failure they stay: they are evidence).
    fn finish(&mut self, links: &mut Links, streams: usize, watch: &Watch<'_>, result: Result<()>) -> Result<()> {
        for &ci in &self.active {
            let c = &mut self.chans[ci];
            c.st.active = false;
            // We may fail while the peer still copies from our buffers.
            single_copy::abandon(c, &*links[ci / streams][ci % streams]);
        }
        if result.is_ok() && !self.published.is_empty() {
            watch.awaited.replace(&self.published, &[]);
            self.published.clear();
        }
        result
    }

    /// Sizes the general loop's scratch for `plan` the first time a plan
    /// this large runs. A boxed run hands over to the general loop only
    /// when it waits long, which a warm-up may never see; sized here, the
    /// hand-over allocates nothing either.
    fn fit(&mut self, nchans: usize, plan: &Plan) {
        let (c, s, r) = self.fitted;
        if nchans <= c && plan.sends.len() <= s && plan.recvs.len() <= r {
            return;
        }
        let (c, s, r) = (c.max(nchans), s.max(plan.sends.len()), r.max(plan.recvs.len()));
        self.fitted = (c, s, r);
        if self.chans.len() < c {
            self.chans.resize_with(c, ChanRun::default);
        }
        for ch in &mut self.chans {
            ch.sends.reserve(s.saturating_sub(ch.sends.len()));
            ch.recvs.reserve(r.saturating_sub(ch.recvs.len()));
        }
        self.active.reserve(c.saturating_sub(self.active.len()));
        for (v, n) in [(&mut self.send_done, s), (&mut self.recv_done, r), (&mut self.forwarded, r)] {
            v.reserve(n.saturating_sub(v.len()));
        }
        self.policy.fit(s);
    }

    fn prepare(&mut self, nchans: usize, streams: usize, plan: &Plan) {
        if self.chans.len() < nchans {
            self.chans.resize_with(nchans, ChanRun::default);
        }
        self.active.clear();
        self.send_done.clear();
        self.send_done.resize(plan.sends.len(), false);
        self.recv_done.clear();
        self.recv_done.resize(plan.recvs.len(), false);
        self.policy.prepare(plan);
        self.forwarded.clear();
        self.forwarded.resize(plan.recvs.len(), false);
        for s in &plan.sends {
            if let Some(r) = s.after {
                self.forwarded[r as usize] = true;
            }
        }
        let flat = |c: Chan| c.peer * streams + c.stream as usize;
        for (i, s) in plan.sends.iter().enumerate() {
            self.activate(flat(s.chan)).sends.push(i as u32);
        }
        for (i, r) in plan.recvs.iter().enumerate() {
            self.activate(flat(r.chan)).recvs.push(i as u32);
        }
    }

    /// Channel `idx`, begun for this plan on first use.
    fn activate(&mut self, idx: usize) -> &mut ChanRun {
        let c = &mut self.chans[idx];
        if !c.st.active {
            c.begin();
            self.active.push(idx);
        }
        &mut self.chans[idx]
    }

    /// Moves every channel as far as it goes, round after round, and waits
    /// when none can move, until the plan is done.
    fn drive(
        &mut self,
        links: &mut Links,
        bufs: &mut [Buf<'_>],
        plan: &Plan,
        op: &OpInfo,
        watch: &Watch<'_>,
        streams: usize,
    ) -> Result<()> {
        let mut idle = IdleSpan::default();
        // Resolved when the run first sleeps (see `Deadline`).
        let mut due: Option<Option<Instant>> = None;
        let shm_only = self.active.iter().all(|&ci| matches!(links[ci / streams][ci % streams].wake(), Wake::Doorbell));
        let ask_sockets = !shm_only && !self.local.is_empty() && wait::sockets_tell(plan);
        let mut under_way = watch.under_way;
        loop {
            let mut progressed = false;
            let mut finished = true;
            for ai in 0..self.active.len() {
                let ci = self.active[ai];
                let link = &mut *links[ci / streams][ci % streams];
                progressed |= self.pump_sends(ci, link, bufs, plan, op)?;
                progressed |= self.pump_recvs(ci, link, bufs, plan, op)?;
                finished &= self.chans[ci].finished();
            }
            self.under_way(&mut under_way);
            if finished {
                self.add_spun(&idle);
                return Ok(());
            }
            if progressed {
                self.add_spun(&std::mem::take(&mut idle));
                continue;
            }
            watch.abort.check()?;
            let awaited = |waiter: &Waiter, cpu: u32| {
                self.active.iter().any(|&ci| !self.chans[ci].finished() && waiter.peer_on(ci / streams, cpu))
            };
            let (bells, sockets);
            let near: Option<&dyn Whereabouts> = match &self.waiter {
                Some(waiter) if shm_only => {
                    bells = Doorbells { waiter, awaited };
                    Some(&bells)
                }
                _ if ask_sockets => {
                    sockets = Sockets { driver: self, links, streams };
                    Some(&sockets)
                }
                _ => None,
            };
            if self.idle(&mut idle, near) {
                continue;
            }
            self.spun = None;
            self.wait(links, plan, watch, op, streams, &mut due)?;
            idle = IdleSpan::default();
        }
    }
}
