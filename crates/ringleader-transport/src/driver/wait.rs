//! How a rank waits when no link can move: the waiting policy, and every
//! spin, yield and tick constant of the data plane.
//!
//! A wake-up from a sleep costs tens of microseconds (more in a virtual
//! machine), and with more ranks than cores each hop of a collective can pay
//! it. So a rank first polls its links for a while ([`Idle`]: spinning when
//! each rank has a core, yielding the core between polls when they are
//! short), and only then sleeps: on its shared-memory doorbell (a futex its
//! peers ring) when every pending link is in shared memory, else in
//! `poll(2)` on the pending links' descriptors. The abort signal's
//! descriptor is always among them (and rings the doorbell), so an abort
//! ends any wait at once.
//!
//! Everything about waiting is in this file: the policy ([`Idle`]), its
//! constants, which links a blocked plan waits for, and the sleep itself
//! (which the send/recv lane's [`super::lane::LaneWait`] sleeps too).

use super::{Driver, Links, Watch};
use crate::link::Link;
use crate::plan::{OpInfo, Plan};
use crate::shm::Waiter;
use ringleader_core::{Error, Rank, Result};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fd::BorrowedFd;
use smallvec::SmallVec;
use std::time::{Duration, Instant};

/// How long a rank polls before it sleeps when every rank on its host has
/// a core of its own ([`Idle::Spin`]).
pub const SPIN: Duration = Duration::from_micros(50);
/// How long a rank polls, yielding its core between polls, before it
/// sleeps when the ranks on its host outnumber the cores ([`Idle::Yield`]).
/// Measured with 4 and 8 ranks on 2 cores: an 8-byte all_reduce went from
/// 60 us to 13 us (4 ranks) and from 5.6 ms to 48 us (8 ranks) against
/// sleeping at once; 1-16 MiB did not get slower.
pub const YIELD: Duration = Duration::from_micros(20);
/// How long an idle wait spins before it checks whether the peer it waits
/// for shares its core (see [`Driver::idle`]).
const SPIN_ALONE: Duration = Duration::from_micros(2);
/// How long an idle wait on sockets to peers on this host polls before it
/// asks the kernel where those peers last ran (see [`Driver::idle`]): a
/// loopback frame from a peer on another core arrives within a few
/// microseconds, and asking costs a system call per link, so only a wait
/// that outlasts this asks, and once.
const SOCKET_ALONE: Duration = Duration::from_micros(10);
/// How often a rank at most tries to move itself off a core it shares with
/// a peer it waits for (see [`Driver::idle`], [`MoveGaps`]): a move costs
/// a migration, tens of microseconds, so a scheduler that keeps putting the
/// two back together costs a bounded share of the time.
const MOVE_EVERY: Duration = Duration::from_millis(100);
/// How soon a rank may try again after a first try (the gap then doubles
/// up to [`MOVE_EVERY`]): a try can go wrong when what the peer last
/// published is stale (both ranks moved at once, just after start-up, and
/// landed on one core again), and waiting the whole [`MOVE_EVERY`] then
/// cost every call of the launch's first 100 ms several microseconds.
const MOVE_SOON: Duration = Duration::from_millis(1);
/// After this long without a try, the next try starts the gaps again from
/// [`MOVE_SOON`].
const MOVE_QUIET: Duration = Duration::from_secs(1);
/// Longest single sleep of a collective; the abort descriptor wakes it
/// sooner, and the deadline is checked after it.
const MAX_POLL: Duration = Duration::from_secs(1);
/// Longest sleep while shared-memory and descriptor links are both
/// pending: the poll on descriptors must not hide a ring that filled
/// meanwhile (the send/recv lane's waits too).
pub(crate) const MIXED_POLL: Duration = Duration::from_millis(1);
/// Longest sleep of the send/recv lane's thread (the runtime's `p2p.rs`,
/// through [`super::lane::LaneWait`]), which also checks its operations'
/// timeouts this often.
pub(crate) const LANE_TICK: Duration = Duration::from_millis(200);

/// When a rank may next try to move off a core it shares with a peer:
/// at once the first time, then after gaps that double from [`MOVE_SOON`]
/// to [`MOVE_EVERY`], and from [`MOVE_SOON`] again after [`MOVE_QUIET`]
/// without a try. Tries are counted, not only moves: where no core is free
/// (or the mask cannot be set) a try costs system calls on every wait.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct MoveGaps {
    last: Option<Instant>,
    gap: Duration,
}

impl MoveGaps {
    /// Whether a try may be made at `now`; counts it if so.
    pub(super) fn admit(&mut self, now: Instant) -> bool {
        let since = self.last.map(|t| now.saturating_duration_since(t));
        if since.is_some_and(|d| d < self.gap) {
            return false;
        }
        self.gap = match since {
            Some(d) if d < MOVE_QUIET => (self.gap * 2).clamp(MOVE_SOON, MOVE_EVERY),
            _ => MOVE_SOON,
        };
        self.last = Some(now);
        true
    }

    /// Whether a try was ever made.
    #[cfg(test)]
    pub(super) fn tried(&self) -> bool {
        self.last.is_some()
    }
}

/// How a rank that waits for its links passes the time before it sleeps on
/// its doorbell or in `poll(2)` (a wake-up costs tens of microseconds, and
/// with more ranks than cores each hop of a collective can pay it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// Poll for this long: for ranks that each have a core of their own.
    /// Over shared memory only the first microseconds spin; then the
    /// polls yield in between, in case the peer is waiting for our core.
    Spin(Duration),
    /// Poll for this long, yielding the core between polls: with more
    /// ranks than cores, the rank we wait for is likely the one waiting
    /// for our core, and yielding hands it over without a sleep.
    Yield(Duration),
}

impl Default for Idle {
    fn default() -> Idle {
        Idle::Spin(Duration::ZERO)
    }
}

impl Idle {
    /// The policy for a rank with `local` ranks on its host (itself
    /// included): spinning ([`SPIN`]) when each has a core of its own, else
    /// yielding ([`YIELD`]).
    ///
    /// ```
    /// use ringleader_transport::Idle;
    /// assert!(matches!(Idle::for_local_ranks(1), Idle::Spin(_)));
    /// assert!(matches!(Idle::for_local_ranks(100_000), Idle::Yield(_)));
    /// ```
    pub fn for_local_ranks(local: usize) -> Idle {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if local <= cores {
            Idle::Spin(SPIN)
        } else {
            Idle::Yield(YIELD)
        }
    }

    /// One pass of a wait outside the driver that polls as the driver's
    /// do: spins or yields once and returns `true` while a wait that has
    /// lasted `waited` is within this policy's budget, else returns `false`
    /// at once (sleep, or hand the wait over).
    pub fn poll_again(self, waited: Duration) -> bool {
        self.keep_polling(waited) != Pass::Sleep
    }

    /// Polls once more (spinning or yielding) instead of sleeping, when a
    /// wait has lasted `idle` so far.
    fn keep_polling(self, idle: Duration) -> Pass {
        match self {
            Idle::Spin(d) if idle < d => {
                std::hint::spin_loop();
                Pass::Spun
            }
            Idle::Yield(d) if idle < d => {
                std::thread::yield_now();
                Pass::Yielded
            }
            _ => Pass::Sleep,
        }
    }
}

impl IdleSpan {
    /// How long the stretch had lasted at its last clock read.
    pub(super) fn lasted(&self) -> Duration {
        self.lasted
    }

    /// Whether the stretch has begun (its first pass read the clock).
    #[inline]
    pub(super) fn began(&self) -> bool {
        self.since.is_some()
    }
}

/// What one idle pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    Spun,
    Yielded,
    /// Nothing: the polling budget is spent.
    Sleep,
}

/// Spinning passes between two clock reads. A read costs about as much as
/// a pass over a few links (tens of nanoseconds in a virtual machine), and
/// reading on every pass only delays noticing the peer; the spin budgets
/// are microseconds, so a few passes more do not matter.
const CLOCK_EVERY: u32 = 8;

/// One idle stretch of a run: when it began and how long it has lasted, as
/// of the last clock read (on its first pass, every [`CLOCK_EVERY`]
/// spinning passes, and after every yield, which may have lasted long).
#[derive(Debug, Default)]
pub(super) struct IdleSpan {
    since: Option<Instant>,
    lasted: Duration,
    /// Passes since the last read; `None`: read on the next pass.
    unread: Option<u32>,
    /// Whether the stretch has asked where its peers run, for waits that
    /// ask once (see [`Whereabouts::asks`]).
    asked: bool,
}

/// What a waiting rank sleeps on: the descriptors to poll (the first
/// `base` always: the abort signal, the lane's submissions) and whether
/// some pending link rings the doorbell instead.
pub(crate) struct Sleeper<'a> {
    // On the stack for up to 16 descriptors: waiting allocates nothing.
    fds: SmallVec<[PollFd<'a>; 16]>,
    base: usize,
    doorbell: bool,
    /// Whether a link waited for to read holds bytes already read from its
    /// descriptor ([`Link::buffered`]): nothing to sleep for.
    buffered: bool,
}

impl<'a> Sleeper<'a> {
    /// A sleeper that always wakes on these descriptors becoming readable.
    pub(crate) fn new(always: &[BorrowedFd<'a>]) -> Sleeper<'a> {
        let fds = always.iter().map(|fd| PollFd::from_borrowed_fd(*fd, PollFlags::IN)).collect();
        Sleeper { fds, base: always.len(), doorbell: false, buffered: false }
    }

    /// Also wakes when `link` can move in the directions `want`; `true`
    /// when the link rings the doorbell rather than a descriptor.
    pub(crate) fn link(&mut self, link: &'a dyn Link, want: PollFlags) -> bool {
        self.buffered |= want.contains(PollFlags::IN) && link.buffered();
        match link.wake().poll_fd(want) {
            Some(fd) => {
                self.fds.push(fd);
                false
            }
            None => {
                self.doorbell = true;
                true
            }
        }
    }

    /// Sleeps at most `left` (not at all when a link to read from holds
    /// bytes already read): on the doorbell when only doorbell links are
    /// pending (`ready` is checked after registering as a sleeper, so no
    /// ring is lost), else in `poll(2)`, at most [`MIXED_POLL`] while
    /// doorbell links are pending too (or there is no doorbell to sleep
    /// on): the poll cannot see them.
    pub(crate) fn sleep(mut self, mut left: Duration, waiter: Option<&Waiter>, ready: impl Fn() -> bool) -> Result<()> {
        if self.buffered {
            return Ok(());
        }
        if self.doorbell {
            match waiter {
                Some(w) if self.fds.len() == self.base => {
                    w.wait(left, ready);
                    return Ok(());
                }
                _ => left = left.min(MIXED_POLL),
            }
        }
        let ts = Timespec { tv_sec: left.as_secs() as i64, tv_nsec: left.subsec_nanos() as i64 };
        match poll(&mut self.fds, Some(&ts)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(e) => Err(Error::aborted(format!("poll failed: {e}"))),
        }
    }
}

/// Where the peers an idle wait is for last ran, as far as this rank can
/// tell (see [`Driver::idle`]).
pub(super) trait Whereabouts {
    /// How long a wait polls before it asks where its peers run, and
    /// whether it asks again at every later clock read (or once).
    fn asks(&self) -> (Duration, bool);
    /// How many answers in a row must say that a peer shares this rank's
    /// core before it moves: 1 where the answer is the peer's own word, 2
    /// where it may be stale (a peer that moved says so only with the next
    /// thing it sends, and the rank that waits for it must not follow it
    /// to its new core).
    fn confirmations(&self) -> u8;
    /// The CPU this rank runs on now, published where its peers read it
    /// if they do.
    fn here(&self) -> u32;
    /// Whether a peer the wait is for last ran on `cpu`.
    fn awaited_on(&self, cpu: u32) -> bool;
    /// Moves this rank off `cpu`, to a CPU no local rank last ran on;
    /// whether it moved.
    fn move_off(&self, cpu: u32) -> bool;
}

/// Peers in shared memory: each publishes its CPU beside its doorbell.
pub(super) struct Doorbells<'a, F: Fn(&Waiter, u32) -> bool> {
    pub(super) waiter: &'a Waiter,
    /// Whether a peer the wait is for last ran on the CPU.
    pub(super) awaited: F,
}

impl<F: Fn(&Waiter, u32) -> bool> Whereabouts for Doorbells<'_, F> {
    fn asks(&self) -> (Duration, bool) {
        // Two atomic loads: ask early, and at every clock read.
        (SPIN_ALONE, true)
    }

    fn confirmations(&self) -> u8 {
        // A rank claims its new core before it moves (`Waiter::move_off`).
        1
    }

    fn here(&self) -> u32 {
        self.waiter.note_cpu()
    }

    fn awaited_on(&self, cpu: u32) -> bool {
        (self.awaited)(self.waiter, cpu)
    }

    fn move_off(&self, cpu: u32) -> bool {
        self.waiter.move_off(cpu)
    }
}

/// Peers on this host behind sockets: the kernel says which CPU last sent
/// on each ([`Link::peer_cpu`]).
pub(super) struct Sockets<'a> {
    pub(super) driver: &'a Driver,
    pub(super) links: &'a Links,
    pub(super) streams: usize,
}

/// The largest frame of a plan whose waits ask sockets where their peers
/// run. A frame this small leaves in its sender's own `send` (one segment
/// over loopback, whose MSS is 64 KiB), so the kernel handles it on the
/// sender's CPU. Larger frames partly leave as the receiver's
/// acknowledgements come back, handled on the receiver's CPU, which would
/// make every peer seem to share the receiver's core: a 2-rank 1 MiB
/// all_reduce over TCP then moved both ranks back and forth, each once per
/// [`MOVE_EVERY`].
const ASK_MAX: usize = 64 << 10;

/// Whether the waits of `plan` may ask sockets where their peers run (its
/// frames are all small, see [`ASK_MAX`]).
pub(super) fn sockets_tell(plan: &Plan) -> bool {
    plan.sends.iter().all(|s| s.region.len <= ASK_MAX) && plan.recvs.iter().all(|r| r.region.len <= ASK_MAX)
}

impl Sockets<'_> {
    /// The CPU the link of channel `ci` (a flat index) last heard from,
    /// if its peer is on this host.
    fn peer_cpu(&self, ci: usize) -> Option<u32> {
        let peer = ci / self.streams;
        self.driver.local.binary_search(&peer).ok()?;
        self.links.get(peer)?.get(ci % self.streams)?.peer_cpu()
    }
}

impl Whereabouts for Sockets<'_> {
    fn asks(&self) -> (Duration, bool) {
        (SOCKET_ALONE, false)
    }

    fn confirmations(&self) -> u8 {
        2
    }

    fn here(&self) -> u32 {
        crate::cpu::current()
    }

    fn awaited_on(&self, cpu: u32) -> bool {
        let d = self.driver;
        d.active.iter().any(|&ci| !d.chans[ci].finished() && self.peer_cpu(ci) == Some(cpu))
    }

    fn move_off(&self, cpu: u32) -> bool {
        let streams = self.streams;
        let chans = || self.driver.local.iter().flat_map(move |&peer| (0..streams).map(move |s| peer * streams + s));
        crate::cpu::move_off(cpu, |c| chans().any(|ci| self.peer_cpu(ci) == Some(c as u32)), |_| {})
    }
}

impl Driver {
    /// Polls once more instead of sleeping, per the [`Idle`] policy, in
    /// the idle stretch `span` (begun on its first pass).
    ///
    /// Ranks that each have a core ([`Idle::Spin`]) also check, at every
    /// clock read, whether a peer they wait for last ran on their own core
    /// (`near`: published beside each doorbell in shared memory, or the
    /// kernel's word on a loopback socket; `None` where nothing tells,
    /// as for peers on other hosts): the scheduler now and then starts two
    /// ranks on one core, and leaves them there while both keep running.
    /// Spinning there costs each hop of a collective the peer's time
    /// slice; yielding hands the core over at once but keeps both ranks
    /// hot on it, so the load balancer never moves one (a whole launch of a
    /// 2-rank 8-byte all_gather then took 5.5 µs per call instead of 0.5
    /// over shared memory; over loopback TCP each call polled the whole
    /// budget, then slept, about 57 µs instead of 3.4, for the first
    /// hundreds of calls of a launch in two of three). So the rank moves
    /// itself to a core of its affinity mask that no local rank last ran
    /// on ([`crate::cpu::move_off`], as often as [`MoveGaps`] allows) and
    /// spins on there. Where there is none, it sleeps instead, which lets
    /// the peer run; but the peer's wake-up then lands on the peer's own
    /// core as often as not, and the two stay together, each call paying
    /// two wake-ups (10-15 µs per call in whole launches). A socket's word
    /// is trusted only for plans of small frames ([`ASK_MAX`]) and only
    /// when two waits in a row agree ([`Whereabouts::confirmations`]).
    pub(super) fn idle(&self, span: &mut IdleSpan, near: Option<&dyn Whereabouts>) -> bool {
        match span.unread {
            Some(n) if n < CLOCK_EVERY => span.unread = Some(n + 1),
            _ => {
                let now = Instant::now();
                span.lasted = now.saturating_duration_since(*span.since.get_or_insert(now));
                span.unread = Some(1);
                if let (Some(near), Idle::Spin(_), false) = (near, self.idle, span.asked) {
                    let (after, again) = near.asks();
                    let cpu = near.here();
                    let ask = span.lasted >= after;
                    span.asked = ask && !again;
                    if ask && near.awaited_on(cpu) {
                        let seen = self.seen_near.get().saturating_add(1);
                        self.seen_near.set(seen);
                        if seen >= near.confirmations() {
                            self.seen_near.set(0);
                            let mut gaps = self.moved.get();
                            let admitted = gaps.admit(now);
                            self.moved.set(gaps);
                            if !admitted || !near.move_off(cpu) {
                                return false;
                            }
                        }
                    } else if ask {
                        self.seen_near.set(0);
                    }
                }
            }
        }
        match self.idle.keep_polling(span.lasted) {
            Pass::Spun => true,
            Pass::Yielded => {
                span.unread = None;
                true
            }
            Pass::Sleep => false,
        }
    }

    /// Sleeps until some pending link may move, publishing the peers the
    /// plan now waits for; a timeout once the deadline has passed.
    pub(super) fn wait(
        &mut self,
        links: &Links,
        plan: &Plan,
        watch: &Watch<'_>,
        op: &OpInfo,
        streams: usize,
        due: &mut Option<Option<Instant>>,
    ) -> Result<()> {
        let mut sleeper = Sleeper::new(&[watch.abort.fd()]);
        let mut waiting_for: SmallVec<[Rank; 8]> = SmallVec::new();
        for &ci in &self.active {
            let c = &self.chans[ci];
            let mut flags = PollFlags::empty();
            if !c.acks.is_empty() {
                // Waiting for the peer to copy a single-copy frame.
                flags |= PollFlags::OUT;
                waiting_for.push(ci / streams);
            }
            if let Some(&si) = c.sends.get(c.st.send_pos) {
                if plan.sends[si as usize].after.is_none_or(|r| self.recv_done[r as usize]) {
                    flags |= PollFlags::OUT;
                }
            }
            if !c.owed.is_empty() {
                flags |= PollFlags::OUT;
            }
            if c.st.unacked > 0 && c.st.recv_pos == c.recvs.len() {
                // Waiting for the peer to say it has our spliced frames.
                flags |= PollFlags::IN;
                waiting_for.push(ci / streams);
            }
            if let Some(&ri) = c.recvs.get(c.st.recv_pos) {
                let item = &plan.recvs[ri as usize];
                if item.after.is_none_or(|r| self.recv_done[r as usize])
                    && item.after_send.is_none_or(|s| self.send_done[s as usize])
                {
                    flags |= PollFlags::IN;
                    waiting_for.push(ci / streams);
                }
            }
            if !flags.is_empty() {
                sleeper.link(&*links[ci / streams][ci % streams], flags);
            }
        }
        waiting_for.sort_unstable();
        waiting_for.dedup();
        if waiting_for != self.published {
            watch.awaited.replace(&self.published, &waiting_for);
            self.published = waiting_for;
        }
        let now = Instant::now();
        let mut left = MAX_POLL;
        if let Some(d) = *due.get_or_insert_with(|| watch.deadline.resolve(now)) {
            if now >= d {
                return Err(Error::Timeout {
                    op: op.fingerprint.op,
                    seq: op.seq,
                    waited: Duration::ZERO,
                    awaited: self.published.to_vec(),
                });
            }
            left = left.min(d - now);
        }
        sleeper.sleep(left, self.waiter.as_ref(), || self.doorbell_ready(links, plan, streams))
    }

    /// Whether some pending shared-memory link could move now (checked
    /// again after registering as a sleeper, so no wake-up is lost).
    fn doorbell_ready(&self, links: &Links, plan: &Plan, streams: usize) -> bool {
        self.active.iter().any(|&ci| {
            let c = &self.chans[ci];
            let link = &*links[ci / streams][ci % streams];
            let send = c.sends.get(c.st.send_pos).is_some_and(|&si| {
                plan.sends[si as usize].after.is_none_or(|r| self.recv_done[r as usize]) && link.ready(true)
            });
            let recv = c.recvs.get(c.st.recv_pos).is_some_and(|_| link.ready(false));
            send || recv || super::single_copy::acked(c, link)
        })
    }
}
