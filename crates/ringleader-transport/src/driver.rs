//! The transfer driver: runs one collective's [`Plan`] over the links.
//!
//! An algorithm does not touch sockets. It describes its transfers as a plan,
//! "send this byte range to rank r", "receive the next frame from rank s into
//! this range (or reduce it into this range)", with dependencies between them
//! ("send chunk k of step 2 once chunk k of step 1 has been received"), and
//! the driver runs every transfer it can, on every link at once, from one
//! thread with nonblocking IO. Sends and receives overlap (full duplex), a
//! reduction of one chunk overlaps the arrival of the next, and a link that
//! would block costs a `poll(2)` that also watches the abort signal.
//!
//! Frames on one link arrive in order, so the n-th receive planned from a
//! peer matches the n-th send that peer planned toward us; the frame tag
//! records that position and the header check catches any disagreement.

use crate::frame::{check, Expect, FrameHeader, FrameKind, Verdict, HEADER_LEN};
use crate::link::{Link, ReadOutcome};
use crate::shm::Waiter;
use crate::stream_copy::{copy_streaming, STREAM_MIN_BUFFER};
use ringleader_core::reduce::{reduce3_bytes, reduce_bytes};
use ringleader_core::{AbortSignal, Error, Fingerprint, Rank, RankSet, ReduceOp, Result};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use std::collections::VecDeque;
use std::io::IoSlice;
use std::time::{Duration, Instant};

/// Bytes reduced per piece when a reduce-receive arrives: small enough to
/// stay in cache between the copy out of the socket and the reduction.
const STAGING: usize = 256 << 10;
/// Bytes copied per `process_vm_readv` of a single-copy frame: the driver
/// turns to its other links in between.
const REMOTE_PIECE: usize = 2 << 20;
/// Bytes of the address a single-copy descriptor carries.
const ADDR_LEN: usize = 8;
/// Longest single poll; the abort descriptor wakes us sooner.
const MAX_POLL: Duration = Duration::from_secs(1);
/// While shared-memory and TCP links are both pending, the poll on sockets
/// must not hide a ring that filled meanwhile.
const MIXED_POLL: Duration = Duration::from_millis(1);
/// Frames are padded to a multiple of this, so every header and payload
/// starts 8-byte aligned in a stream and ring slices can be reduced in place.
const ALIGN: usize = 8;
static PAD: [u8; ALIGN] = [0; ALIGN];

/// Bytes of padding after a payload of `len` bytes.
#[inline]
pub fn pad(len: usize) -> usize {
    (ALIGN - len % ALIGN) % ALIGN
}

/// A buffer an algorithm works on.
#[derive(Debug)]
pub enum Buf<'a> {
    /// Read only (an input that must not change).
    Ro(&'a [u8]),
    /// Read and written.
    Rw(&'a mut [u8]),
}

impl Buf<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Buf::Ro(b) => b,
            Buf::Rw(b) => b,
        }
    }
}

/// A byte range of one of the buffers passed to [`Driver::run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Index into the buffers.
    pub buf: u8,
    /// First byte.
    pub off: usize,
    /// Length in bytes.
    pub len: usize,
}

impl Region {
    /// A region of buffer `buf`.
    pub const fn new(buf: u8, off: usize, len: usize) -> Region {
        Region { buf, off, len }
    }

    fn range(&self) -> std::ops::Range<usize> {
        self.off..self.off + self.len
    }
}

/// A link: a peer and one of its streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Chan {
    /// The peer's rank.
    pub peer: Rank,
    /// Stream index, below the mesh's streams per peer.
    pub stream: u16,
}

/// Send `region` to `chan`, once receive `after` (if any) is complete.
#[derive(Debug, Clone, Copy)]
pub struct SendItem {
    /// Where to.
    pub chan: Chan,
    /// What.
    pub region: Region,
    /// Index of a receive that must complete first.
    pub after: Option<u32>,
    /// Which of the run's operations it belongs to (index into `ops`).
    pub op: u8,
}

/// What to do with a received frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvMode {
    /// Store it in the region.
    Copy,
    /// `region = with op frame`, or `region = region op frame` when `with`
    /// is `None`.
    Reduce {
        /// The other operand, if not the region itself.
        with: Option<Region>,
    },
}

/// Receive the next frame from `chan` into `region`.
#[derive(Debug, Clone, Copy)]
pub struct RecvItem {
    /// From where.
    pub chan: Chan,
    /// Into what.
    pub region: Region,
    /// Copy or reduce.
    pub mode: RecvMode,
    /// Index of a receive that must complete before this one starts.
    pub after: Option<u32>,
    /// Index of a send that must complete before this one starts (the send
    /// reads the bytes this receive will overwrite).
    pub after_send: Option<u32>,
    /// Which of the run's operations it belongs to (index into `ops`).
    pub op: u8,
}

/// The transfers of one collective on one rank. Reused between
/// collectives: [`Plan::clear`] keeps the capacity.
#[derive(Debug, Default)]
pub struct Plan {
    /// Sends, in the order they are written to each link.
    pub sends: Vec<SendItem>,
    /// Receives, in the order frames arrive on each link.
    pub recvs: Vec<RecvItem>,
}

impl Plan {
    /// Empties the plan, keeping its memory.
    pub fn clear(&mut self) {
        self.sends.clear();
        self.recvs.clear();
    }

    /// Adds a send; returns its index.
    pub fn send(&mut self, chan: Chan, region: Region, after: Option<u32>) -> u32 {
        self.sends.push(SendItem { chan, region, after, op: 0 });
        (self.sends.len() - 1) as u32
    }

    /// Adds a receive; returns its index.
    pub fn recv(
        &mut self,
        chan: Chan,
        region: Region,
        mode: RecvMode,
        after: Option<u32>,
        after_send: Option<u32>,
    ) -> u32 {
        self.recvs.push(RecvItem { chan, region, mode, after, after_send, op: 0 });
        (self.recvs.len() - 1) as u32
    }
}

/// The collective a plan belongs to.
#[derive(Debug, Clone, Copy)]
pub struct OpInfo {
    /// Sequence number (per peer pair for send/recv).
    pub seq: u64,
    /// This rank's call.
    pub fingerprint: Fingerprint,
    /// Compare peers' fingerprints (`RINGLEADER_CHECKS`).
    pub checks: bool,
}

impl OpInfo {
    fn reduce_op(&self) -> ReduceOp {
        self.fingerprint.reduce_op.unwrap_or(ReduceOp::Sum)
    }
}

#[derive(Debug)]
struct ChanRun {
    sends: Vec<u32>,
    recvs: Vec<u32>,
    send_pos: usize,
    recv_pos: usize,
    /// Bytes of the current send written, header included.
    send_off: usize,
    send_hdr: [u8; HEADER_LEN],
    /// Bytes of the current receive read, header included.
    recv_off: usize,
    recv_hdr: [u8; HEADER_LEN],
    /// Bytes of the current reduce-receive waiting in `staging`.
    staged: usize,
    staging: Vec<u64>,
    active: bool,
    /// The current send is a single-copy descriptor.
    send_remote: bool,
    /// Single-copy sends written but not yet copied by the peer: (ticket,
    /// send index), in order.
    acks: VecDeque<(u64, u32)>,
    /// The current receive is a single-copy descriptor...
    recv_remote: bool,
    /// ...of the payload at this address in the peer...
    recv_addr: [u8; ADDR_LEN],
    /// ...of which this many bytes are copied.
    remote_got: usize,
    /// The current send is spliced from our pages.
    send_spliced: bool,
    /// Spliced frames sent and not yet acknowledged by the peer.
    unacked: u32,
    /// The current receive is a spliced frame to acknowledge.
    recv_spliced: bool,
    /// Acknowledgements to write at the next frame boundary (headers)...
    owed: VecDeque<[u8; HEADER_LEN]>,
    /// ...of the first of which this many bytes are written.
    owed_off: usize,
}

impl ChanRun {
    /// Allocates the staging buffer on first use; it is kept for later plans.
    fn ensure_staging(&mut self) {
        if self.staging.is_empty() {
            self.staging = vec![0u64; STAGING / 8];
        }
    }
}

impl Default for ChanRun {
    fn default() -> ChanRun {
        ChanRun {
            sends: Vec::new(),
            recvs: Vec::new(),
            send_pos: 0,
            recv_pos: 0,
            send_off: 0,
            send_hdr: [0; HEADER_LEN],
            recv_off: 0,
            recv_hdr: [0; HEADER_LEN],
            staged: 0,
            staging: Vec::new(),
            active: false,
            send_remote: false,
            acks: VecDeque::new(),
            recv_remote: false,
            recv_addr: [0; ADDR_LEN],
            remote_got: 0,
            send_spliced: false,
            unacked: 0,
            recv_spliced: false,
            owed: VecDeque::new(),
            owed_off: 0,
        }
    }
}

/// Runs plans. Holds per-link scratch that is reused between collectives,
/// so the steady state allocates nothing.
#[derive(Debug, Default)]
pub struct Driver {
    chans: Vec<ChanRun>,
    active: Vec<usize>,
    send_done: Vec<bool>,
    recv_done: Vec<bool>,
    /// Sends a receive of this rank waits for (`after_send`): they always
    /// go through the ring, since a single-copy send completes only when
    /// the peer has received it, and two ranks each waiting for their own
    /// send before receiving the other's would wait forever.
    gates: Vec<bool>,
    /// Receives a send of this rank waits for (`after`): what they bring is
    /// read again soon, so it is copied into the cache, never around it.
    forwarded: Vec<bool>,
    /// This rank receives in the current plan. Only then may its sends go
    /// single-copy: a rank that only sends (a broadcast's root) is idle
    /// otherwise, so its copy into the ring is free and overlaps the
    /// reader's copy out, which beats one copy done by the reader alone.
    busy: bool,
    /// This rank's shared-memory doorbell, when it has local peers.
    waiter: Option<Waiter>,
    /// What to do before sleeping when no link can move.
    idle: Idle,
    /// The peers last published as awaited (what `awaited` holds from us).
    published: smallvec::SmallVec<[Rank; 8]>,
    /// Bit b: buffer b is written by some receive of the current plan, so
    /// its bytes may change before a peer has them and are never spliced.
    written: u64,
    /// Splice socket frames from this size on (`None`: never).
    splice_min: Option<usize>,
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

/// How long an idle shared-memory wait spins before it yields between
/// polls (see `Driver::drive`).
const SPIN_ALONE: Duration = Duration::from_micros(2);

/// The links a driver runs over: `links[peer][stream]`.
pub type Links = [Vec<Link>];

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
        self.splice_min = min;
    }

    /// Lets the driver wait on shared-memory links: [`Idle`] a while, then
    /// sleep on `waiter` (this rank's doorbell).
    pub fn set_shm(&mut self, waiter: Waiter, idle: Idle) {
        self.waiter = Some(waiter);
        self.idle = idle;
    }

    /// Runs `plan` to completion, or until an error, the abort signal, or
    /// `deadline`. While blocked, the ranks it waits for are published in
    /// `awaited`. Each item belongs to one
    /// of `ops` (several point-to-point operations can run as one plan).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &mut self,
        links: &mut Links,
        bufs: &mut [Buf<'_>],
        plan: &Plan,
        ops: &[OpInfo],
        abort: &AbortSignal,
        deadline: Option<Instant>,
        awaited: &RankSet,
    ) -> Result<()> {
        ringleader_core::fault::check(ringleader_core::fault::Point::Driver, ops.first().map_or(0, |o| o.seq));
        let streams = links.iter().map(Vec::len).max().unwrap_or(1).max(1);
        self.prepare(links.len() * streams, streams, plan);
        let result = self.drive(links, bufs, plan, ops, abort, deadline, awaited, streams);
        for &ci in &self.active {
            let c = &mut self.chans[ci];
            c.active = false;
            if !c.acks.is_empty() {
                // We fail while the peer may still copy from our buffers.
                links[ci / streams][ci % streams].abandon_remote();
                c.acks.clear();
            }
        }
        // On failure the awaited peers stay published: they are evidence.
        if result.is_ok() {
            awaited.replace(&self.published, &[]);
            self.published.clear();
        }
        result
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
        self.busy = plan.recvs.iter().any(|r| r.region.len > 0);
        self.gates.clear();
        self.gates.resize(plan.sends.len(), false);
        for r in &plan.recvs {
            if let Some(s) = r.after_send {
                self.gates[s as usize] = true;
            }
        }
        self.written = plan.recvs.iter().fold(0, |m, r| m | 1u64.checked_shl(r.region.buf as u32).unwrap_or(u64::MAX));
        self.forwarded.clear();
        self.forwarded.resize(plan.recvs.len(), false);
        for s in &plan.sends {
            if let Some(r) = s.after {
                self.forwarded[r as usize] = true;
            }
        }
        let flat = |c: Chan| c.peer * streams + c.stream as usize;
        for (i, s) in plan.sends.iter().enumerate() {
            let c = self.activate(flat(s.chan));
            c.sends.push(i as u32);
        }
        for (i, r) in plan.recvs.iter().enumerate() {
            let c = self.activate(flat(r.chan));
            c.recvs.push(i as u32);
        }
    }

    fn activate(&mut self, idx: usize) -> &mut ChanRun {
        let c = &mut self.chans[idx];
        if !c.active {
            c.active = true;
            c.sends.clear();
            c.recvs.clear();
            c.send_pos = 0;
            c.recv_pos = 0;
            c.send_off = 0;
            c.recv_off = 0;
            c.staged = 0;
            c.send_remote = false;
            c.recv_remote = false;
            c.remote_got = 0;
            c.acks.clear();
            c.send_spliced = false;
            c.unacked = 0;
            c.recv_spliced = false;
            c.owed.clear();
            c.owed_off = 0;
            self.active.push(idx);
        }
        &mut self.chans[idx]
    }

    #[allow(clippy::too_many_arguments)]
    fn drive(
        &mut self,
        links: &mut Links,
        bufs: &mut [Buf<'_>],
        plan: &Plan,
        ops: &[OpInfo],
        abort: &AbortSignal,
        deadline: Option<Instant>,
        awaited: &RankSet,
        streams: usize,
    ) -> Result<()> {
        let mut idle_since: Option<Instant> = None;
        let shm_only = self.active.iter().all(|&ci| links[ci / streams][ci % streams].is_shm());
        loop {
            let mut progressed = false;
            let mut finished = true;
            for ai in 0..self.active.len() {
                let ci = self.active[ai];
                let (peer, stream) = (ci / streams, ci % streams);
                let link = &mut links[peer][stream];
                progressed |= self.pump_sends(ci, link, bufs, plan, ops)?;
                progressed |= self.pump_recvs(ci, link, bufs, plan, ops)?;
                let c = &self.chans[ci];
                finished &= c.send_pos == c.sends.len()
                    && c.recv_pos == c.recvs.len()
                    && c.acks.is_empty()
                    && c.unacked == 0
                    && c.owed.is_empty();
            }
            if finished {
                return Ok(());
            }
            if progressed {
                idle_since = None;
                continue;
            }
            abort.check()?;
            // Poll a little (spinning, or yielding when cores are short)
            // before sleeping: a wake-up costs tens of microseconds.
            {
                let idle = idle_since.get_or_insert_with(Instant::now).elapsed();
                match self.idle {
                    // Over shared memory a peer answers within a few
                    // microseconds if it runs at all. Past that, it may be
                    // waiting for our core: the scheduler now and then puts
                    // two ranks on one core for a while, and spinning there
                    // made each step of an 8 B all_reduce cost the whole
                    // spin (30-60 µs, against 5-7 µs yielding). With a core
                    // each, the yield returns at once. (TCP answers take
                    // longer than this, and the yields slowed them by 5-8%.)
                    Idle::Spin(d) if shm_only && idle >= SPIN_ALONE && idle < d => {
                        std::thread::yield_now();
                        continue;
                    }
                    Idle::Spin(d) if idle < d => {
                        std::hint::spin_loop();
                        continue;
                    }
                    Idle::Yield(d) if idle < d => {
                        std::thread::yield_now();
                        continue;
                    }
                    _ => {}
                }
            }
            self.wait(links, plan, abort, deadline, &ops[0], awaited, streams)?;
            idle_since = None;
        }
    }

    /// Writes queued sends on one link until it would block or the next send
    /// waits for a receive. Returns whether any byte moved.
    fn pump_sends(
        &mut self,
        ci: usize,
        link: &mut Link,
        bufs: &[Buf<'_>],
        plan: &Plan,
        ops: &[OpInfo],
    ) -> Result<bool> {
        let c = &mut self.chans[ci];
        let mut moved = settle_acks(c, link, &mut self.send_done);
        if !write_owed(c, link, &mut moved).map_err(|e| lost(link.peer(), &ops[0], &format!("sending failed: {e}")))? {
            return Ok(moved);
        }
        while let Some(&si) = c.sends.get(c.send_pos) {
            let item = plan.sends[si as usize];
            if item.after.is_some_and(|r| !self.recv_done[r as usize]) {
                break;
            }
            let op = &ops[item.op as usize];
            let data = &bufs[item.region.buf as usize].bytes()[item.region.range()];
            if c.send_off == 0 {
                let (tag, len) = (c.send_pos as u32, item.region.len as u64);
                c.send_remote = self.busy && !self.gates[si as usize] && single_copy(link, data.len());
                c.send_spliced = !c.send_remote
                    && self.splice_min.is_some_and(|min| data.len() >= min)
                    && self.written & 1u64.checked_shl(item.region.buf as u32).unwrap_or(u64::MAX) == 0
                    && link.can_splice();
                let hdr = match (c.send_remote, c.send_spliced) {
                    (true, _) => FrameHeader::remote(op.seq, op.fingerprint, tag, len),
                    (false, true) => FrameHeader::spliced(op.seq, op.fingerprint, tag, len),
                    (false, false) => FrameHeader::data(op.seq, op.fingerprint, tag, len),
                };
                c.send_hdr = hdr.encode();
            }
            // A single-copy frame carries the payload's address instead.
            let addr = (data.as_ptr() as u64).to_le_bytes();
            let body: &[u8] = if c.send_remote { &addr } else { data };
            let total = HEADER_LEN + body.len() + pad(body.len());
            let n = match c.send_spliced {
                true => write_spliced(link, &c.send_hdr, body, c.send_off),
                false => write_frame(link, &c.send_hdr, body, c.send_off),
            }
            .map_err(|e| lost(link.peer(), op, &format!("sending failed: {e}")))?;
            if n == 0 {
                break;
            }
            moved = true;
            c.send_off += n;
            if c.send_off == total {
                c.send_off = 0;
                c.send_pos += 1;
                match (c.send_remote, &mut *link) {
                    (true, Link::Shm(l)) => c.acks.push_back((l.remote_sent(), si)),
                    _ => self.send_done[si as usize] = true,
                }
                // No receive of this plan writes a spliced frame's bytes, so
                // only the end of the plan waits for the peer to have them.
                c.unacked += u32::from(c.send_spliced);
                c.send_spliced = false;
            }
        }
        Ok(moved)
    }

    /// Reads queued receives on one link until it would block or the next
    /// receive waits for something. Returns whether any byte moved.
    fn pump_recvs(
        &mut self,
        ci: usize,
        link: &mut Link,
        bufs: &mut [Buf<'_>],
        plan: &Plan,
        ops: &[OpInfo],
    ) -> Result<bool> {
        let mut moved = false;
        loop {
            let c = &mut self.chans[ci];
            let Some(&ri) = c.recvs.get(c.recv_pos) else {
                if c.unacked > 0 {
                    read_trailing_acks(c, link, &ops[0], &mut moved)?;
                }
                break;
            };
            let item = plan.recvs[ri as usize];
            let op = &ops[item.op as usize];
            if item.after.is_some_and(|r| !self.recv_done[r as usize])
                || item.after_send.is_some_and(|s| !self.send_done[s as usize])
            {
                break;
            }
            if c.recv_off < HEADER_LEN {
                let tag = c.recv_pos as u32;
                match read_some(link, &mut c.recv_hdr[c.recv_off..], op, c.recv_off)? {
                    0 => break,
                    n => {
                        moved = true;
                        c.recv_off += n;
                    }
                }
                if c.recv_off < HEADER_LEN {
                    continue;
                }
                let h = decode_header(&c.recv_hdr, link.peer())?;
                if take_ack(c, &h, link.peer())? {
                    continue;
                }
                let kind = check_decoded(&h, link.peer(), tag, item.region.len, op)?;
                c.recv_remote = kind == FrameKind::Remote;
                c.recv_spliced = kind == FrameKind::Spliced;
            }
            if c.recv_remote {
                if !recv_single_copy(c, link, bufs, &item, op, &mut moved)? {
                    break;
                }
                c.recv_off = 0;
                c.remote_got = 0;
                c.recv_remote = false;
                c.recv_pos += 1;
                self.recv_done[ri as usize] = true;
                continue;
            }
            let payload_end = HEADER_LEN + item.region.len;
            if c.recv_off < payload_end {
                let done = match item.mode {
                    RecvMode::Copy => {
                        // A large destination that nothing reads again
                        // during the plan is written around the cache.
                        let streaming = !self.forwarded[ri as usize]
                            && bufs[item.region.buf as usize].bytes().len() >= STREAM_MIN_BUFFER;
                        recv_copy(c, link, bufs, &item, op, streaming, &mut moved)?
                    }
                    RecvMode::Reduce { with } => recv_reduce(c, link, bufs, &item, with, op, &mut moved)?,
                };
                if !done {
                    break;
                }
            }
            let frame_end = payload_end + pad(item.region.len);
            if c.recv_off < frame_end {
                let mut skip = [0u8; ALIGN];
                match read_some(link, &mut skip[..frame_end - c.recv_off], op, c.recv_off)? {
                    0 => break,
                    n => {
                        moved = true;
                        c.recv_off += n;
                    }
                }
                if c.recv_off < frame_end {
                    continue;
                }
            }
            c.recv_off = 0;
            c.staged = 0;
            c.recv_pos += 1;
            self.recv_done[ri as usize] = true;
            if c.recv_spliced {
                // Every byte is ours now: the sender may let its pages change.
                c.owed.push_back(FrameHeader::consumed(op.seq, op.fingerprint, (c.recv_pos - 1) as u32).encode());
                c.recv_spliced = false;
            }
        }
        Ok(moved)
    }

    #[allow(clippy::too_many_arguments)]
    fn wait(
        &mut self,
        links: &Links,
        plan: &Plan,
        abort: &AbortSignal,
        deadline: Option<Instant>,
        op: &OpInfo,
        awaited: &RankSet,
        streams: usize,
    ) -> Result<()> {
        // On the stack for up to 16 links: waiting allocates nothing.
        let mut fds: smallvec::SmallVec<[PollFd<'_>; 16]> = smallvec::SmallVec::new();
        fds.push(PollFd::from_borrowed_fd(abort.fd(), PollFlags::IN));
        let mut waiting_for: smallvec::SmallVec<[Rank; 8]> = smallvec::SmallVec::new();
        let mut shm_pending = false;
        for &ci in &self.active {
            let c = &self.chans[ci];
            let mut flags = PollFlags::empty();
            if !c.acks.is_empty() {
                // Waiting for the peer to copy a single-copy frame.
                flags |= PollFlags::OUT;
                waiting_for.push(ci / streams);
            }
            if let Some(&si) = c.sends.get(c.send_pos) {
                if plan.sends[si as usize].after.is_none_or(|r| self.recv_done[r as usize]) {
                    flags |= PollFlags::OUT;
                }
            }
            if !c.owed.is_empty() {
                flags |= PollFlags::OUT;
            }
            if c.unacked > 0 && c.recv_pos == c.recvs.len() {
                // Waiting for the peer to say it has our spliced frames.
                flags |= PollFlags::IN;
                waiting_for.push(ci / streams);
            }
            if let Some(&ri) = c.recvs.get(c.recv_pos) {
                let item = &plan.recvs[ri as usize];
                if item.after.is_none_or(|r| self.recv_done[r as usize])
                    && item.after_send.is_none_or(|s| self.send_done[s as usize])
                {
                    flags |= PollFlags::IN;
                    waiting_for.push(ci / streams);
                }
            }
            if flags.is_empty() {
                continue;
            }
            let link = &links[ci / streams][ci % streams];
            match link.fd() {
                Some(fd) => fds.push(PollFd::from_borrowed_fd(fd, link.poll_events(flags))),
                None => shm_pending = true,
            }
        }
        waiting_for.sort_unstable();
        waiting_for.dedup();
        if waiting_for != self.published {
            awaited.replace(&self.published, &waiting_for);
            self.published = waiting_for;
        }
        let now = Instant::now();
        let mut left = MAX_POLL;
        if let Some(d) = deadline {
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
        if shm_pending {
            if fds.len() > 1 {
                left = left.min(MIXED_POLL);
            } else if let Some(w) = &self.waiter {
                w.wait(left, || self.shm_ready(links, plan, streams));
                return Ok(());
            }
        }
        let ts = Timespec { tv_sec: left.as_secs() as i64, tv_nsec: left.subsec_nanos() as i64 };
        match poll(&mut fds, Some(&ts)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(e) => Err(Error::aborted(format!("poll failed: {e}"))),
        }
    }
}

impl Driver {
    /// Whether some pending shared-memory link could move now (checked
    /// again after registering as a sleeper, so no wake-up is lost).
    fn shm_ready(&self, links: &Links, plan: &Plan, streams: usize) -> bool {
        self.active.iter().any(|&ci| {
            let c = &self.chans[ci];
            let link = &links[ci / streams][ci % streams];
            let send = c.sends.get(c.send_pos).is_some_and(|&si| {
                plan.sends[si as usize].after.is_none_or(|r| self.recv_done[r as usize]) && link.shm_ready(true)
            });
            let recv = c.recvs.get(c.recv_pos).is_some_and(|_| link.shm_ready(false));
            let acked = c.acks.front().is_some_and(|&(ticket, _)| link.remote_acked() >= ticket);
            send || recv || acked
        })
    }
}

/// Writes what the link takes of a frame (header, payload, padding) from
/// byte `off` of the frame on; 0 when the link is full.
pub fn write_frame(link: &mut Link, hdr: &[u8; HEADER_LEN], data: &[u8], off: usize) -> std::io::Result<usize> {
    let tail = &PAD[..pad(data.len())];
    if off < HEADER_LEN {
        link.try_write(&[IoSlice::new(&hdr[off..]), IoSlice::new(data), IoSlice::new(tail)])
    } else if off < HEADER_LEN + data.len() {
        link.try_write(&[IoSlice::new(&data[off - HEADER_LEN..]), IoSlice::new(tail)])
    } else {
        link.try_write(&[IoSlice::new(&tail[off - HEADER_LEN - data.len()..])])
    }
}

/// [`write_frame`] for a spliced frame: the header and padding are copied
/// into the socket, the payload goes by reference (`TcpLink::try_splice`).
fn write_spliced(link: &mut Link, hdr: &[u8; HEADER_LEN], data: &[u8], off: usize) -> std::io::Result<usize> {
    if off < HEADER_LEN {
        link.try_write(&[IoSlice::new(&hdr[off..])])
    } else if off < HEADER_LEN + data.len() {
        link.try_splice(&data[off - HEADER_LEN..])
    } else {
        link.try_write(&[IoSlice::new(&PAD[off - HEADER_LEN - data.len()..pad(data.len())])])
    }
}

/// Writes the acknowledgements `c` owes its peer, between frames only.
/// Returns whether the channel may go on to its data frames (nothing owed
/// is left half written).
fn write_owed(c: &mut ChanRun, link: &mut Link, moved: &mut bool) -> std::io::Result<bool> {
    if c.send_off != 0 {
        return Ok(true);
    }
    while let Some(hdr) = c.owed.front() {
        let n = link.try_write(&[IoSlice::new(&hdr[c.owed_off..])])?;
        if n == 0 {
            return Ok(c.owed_off == 0);
        }
        *moved = true;
        c.owed_off += n;
        if c.owed_off == HEADER_LEN {
            c.owed.pop_front();
            c.owed_off = 0;
        }
    }
    Ok(true)
}

/// Takes the header just read as an acknowledgement, if it is one.
fn take_ack(c: &mut ChanRun, h: &FrameHeader, peer: Rank) -> Result<bool> {
    if h.kind != FrameKind::Consumed {
        return Ok(false);
    }
    if c.unacked == 0 {
        let detail =
            format!("rank {peer} acknowledged frame {} of collective {}, which was never spliced", h.tag, h.seq);
        return Err(Error::PeerProtocol { peer, detail });
    }
    c.unacked -= 1;
    c.recv_off = 0;
    Ok(true)
}

/// Reads acknowledgements once every receive of the channel is done: all
/// that can still come from the peer in this plan.
fn read_trailing_acks(c: &mut ChanRun, link: &mut Link, op: &OpInfo, moved: &mut bool) -> Result<()> {
    while c.unacked > 0 {
        let n = read_some(link, &mut c.recv_hdr[c.recv_off..], op, c.recv_off)?;
        if n == 0 {
            return Ok(());
        }
        *moved = true;
        c.recv_off += n;
        if c.recv_off == HEADER_LEN && !take_ack(c, &decode_header(&c.recv_hdr, link.peer())?, link.peer())? {
            let detail = "a frame arrived after the last one this collective expects from it".to_string();
            return Err(Error::PeerProtocol { peer: link.peer(), detail });
        }
    }
    Ok(())
}

/// The error for a link to `peer` that broke during `op`.
pub fn lost(peer: Rank, op: &OpInfo, detail: &str) -> Error {
    Error::PeerLost { peer, op: op.fingerprint.op, seq: op.seq, detail: detail.to_string() }
}

/// Reads into `buf`; `0` when nothing is there. `at` (bytes of this frame
/// already read) only words the error when the peer hangs up.
pub fn read_some(link: &mut Link, buf: &mut [u8], op: &OpInfo, at: usize) -> Result<usize> {
    read_into(link, buf, op, at, false)
}

/// [`read_some`], with streaming stores into `buf` when `streaming`.
fn read_into(link: &mut Link, buf: &mut [u8], op: &OpInfo, at: usize, streaming: bool) -> Result<usize> {
    let read = if streaming { link.try_read_streaming(buf) } else { link.try_read(buf) };
    match read {
        Ok(ReadOutcome::Data(n)) => Ok(n),
        Ok(ReadOutcome::WouldBlock) => Ok(0),
        Ok(ReadOutcome::Closed) if at == 0 => Err(lost(link.peer(), op, "the peer closed the connection")),
        Ok(ReadOutcome::Closed) => Err(lost(
            link.peer(),
            op,
            &format!("the peer closed the connection in the middle of a frame ({at} bytes in)"),
        )),
        Err(e) => Err(lost(link.peer(), op, &format!("receiving failed: {e}"))),
    }
}

/// Checks a received header against what `op` expects as frame `tag` of
/// `len` bytes: a different call is a mismatch naming both fingerprints.
/// Returns the frame's kind (data, spliced data or a single-copy descriptor).
pub fn check_header(raw: &[u8; HEADER_LEN], peer: Rank, tag: u32, len: usize, op: &OpInfo) -> Result<FrameKind> {
    check_decoded(&decode_header(raw, peer)?, peer, tag, len, op)
}

/// Decodes a header from `peer`; garbage is a protocol error naming it.
fn decode_header(raw: &[u8; HEADER_LEN], peer: Rank) -> Result<FrameHeader> {
    FrameHeader::decode(raw).map_err(|e| Error::PeerProtocol { peer, detail: e.to_string() })
}

/// [`check_header`] for a header already decoded.
fn check_decoded(h: &FrameHeader, peer: Rank, tag: u32, len: usize, op: &OpInfo) -> Result<FrameKind> {
    let want = Expect { seq: op.seq, fingerprint: op.fingerprint, tag, len: len as u64 };
    match check(h, &want, op.checks) {
        Verdict::Ok if h.kind == FrameKind::Consumed => Err(Error::PeerProtocol {
            peer,
            detail: format!("an acknowledgement arrived where frame {tag} of collective {} was expected", op.seq),
        }),
        Verdict::Ok => Ok(h.kind),
        Verdict::Goodbye { seq } => Err(Error::PeerLeft { peer, op: op.fingerprint.op, seq: op.seq, their_seq: seq }),
        Verdict::Mismatch { seq, fingerprint } => {
            Err(Error::FrameMismatch { peer, seq: op.seq, ours: op.fingerprint, their_seq: seq, theirs: fingerprint })
        }
        Verdict::Schedule { tag: t, len: l } => Err(Error::ScheduleMismatch {
            peer,
            op: op.fingerprint.op,
            seq: op.seq,
            detail: format!("it sent frame {t} of {l} bytes where frame {tag} of {len} bytes was expected"),
        }),
    }
}

/// Whether a frame of `len` bytes goes single-copy on `link`.
#[inline]
fn single_copy(link: &Link, len: usize) -> bool {
    link.single_copy_min().is_some_and(|min| len >= min.max(1))
}

/// Completes the single-copy sends the peer has copied. Returns whether any
/// did.
fn settle_acks(c: &mut ChanRun, link: &Link, send_done: &mut [bool]) -> bool {
    let Some(&(ticket, _)) = c.acks.front() else { return false };
    let acked = link.remote_acked();
    if acked < ticket {
        return false;
    }
    while let Some(&(t, si)) = c.acks.front() {
        if t > acked {
            break;
        }
        send_done[si as usize] = true;
        c.acks.pop_front();
    }
    true
}

/// Receives a single-copy frame whose header is read: its address, then its
/// payload, a piece per call, straight from the peer's memory into the
/// region (copy) or through the staging buffer (reduce); then acknowledges
/// it. Returns whether the frame is complete.
fn recv_single_copy(
    c: &mut ChanRun,
    link: &mut Link,
    bufs: &mut [Buf<'_>],
    item: &RecvItem,
    op: &OpInfo,
    moved: &mut bool,
) -> Result<bool> {
    let peer = link.peer();
    let Link::Shm(l) = link else {
        let detail = "a single-copy frame arrived on a link that is not shared memory".to_string();
        return Err(Error::PeerProtocol { peer, detail });
    };
    let addr_end = HEADER_LEN + ADDR_LEN;
    while c.recv_off < addr_end {
        let n = l.try_read(&mut c.recv_addr[c.recv_off - HEADER_LEN..]).map_err(|e| lost(peer, op, &e.to_string()))?;
        if n == 0 {
            return Ok(false);
        }
        *moved = true;
        c.recv_off += n;
    }
    let addr = u64::from_le_bytes(c.recv_addr);
    let failed = |e: std::io::Error| lost(peer, op, &format!("copying from its memory failed: {e}"));
    let left = item.region.len - c.remote_got;
    if left > 0 {
        let at = addr.wrapping_add(c.remote_got as u64);
        let n = match item.mode {
            RecvMode::Copy => {
                let dst = &mut rw(bufs, item.region.buf)[item.region.range()];
                l.read_remote(at, &mut dst[c.remote_got..c.remote_got + left.min(REMOTE_PIECE)]).map_err(failed)?
            }
            RecvMode::Reduce { with } => {
                c.ensure_staging();
                let stage: &mut [u8] = bytemuck::cast_slice_mut(&mut c.staging);
                let esz = op.fingerprint.dtype.size();
                // Whole elements only: a short read leaves the rest for the next call.
                let n = l.read_remote(at, &mut stage[..left.min(STAGING)]).map_err(failed)? / esz * esz;
                reduce_piece(bufs, item, with, c.remote_got, &stage[..n], op);
                n
            }
        };
        *moved = true;
        c.remote_got += n;
        if c.remote_got < item.region.len {
            return Ok(false);
        }
    }
    l.finish_remote().map_err(|e| lost(peer, op, &e.to_string()))?;
    Ok(true)
}

fn rw<'b>(bufs: &'b mut [Buf<'_>], i: u8) -> &'b mut [u8] {
    match &mut bufs[i as usize] {
        Buf::Rw(b) => b,
        // Plans are built by this crate's callers and never receive into an
        // input; reaching this is a bug in a plan builder.
        Buf::Ro(_) => panic!("plan receives into read-only buffer {i}"),
    }
}

#[allow(clippy::too_many_arguments)]
fn recv_copy(
    c: &mut ChanRun,
    link: &mut Link,
    bufs: &mut [Buf<'_>],
    item: &RecvItem,
    op: &OpInfo,
    streaming: bool,
    moved: &mut bool,
) -> Result<bool> {
    let got = c.recv_off - HEADER_LEN;
    if streaming && !link.is_shm() {
        return recv_copy_staged(c, link, bufs, item, op, moved);
    }
    if got < item.region.len {
        let dst = &mut rw(bufs, item.region.buf)[item.region.range()];
        let n = read_into(link, &mut dst[got..], op, c.recv_off, streaming)?;
        if n > 0 {
            *moved = true;
            c.recv_off += n;
        }
    }
    Ok(c.recv_off - HEADER_LEN == item.region.len)
}

/// Receives a socket's frame into a large destination through the staging
/// buffer: the kernel copies into memory that stays in cache, and streaming
/// stores move it on without reading the destination's lines first.
fn recv_copy_staged(
    c: &mut ChanRun,
    link: &mut Link,
    bufs: &mut [Buf<'_>],
    item: &RecvItem,
    op: &OpInfo,
    moved: &mut bool,
) -> Result<bool> {
    c.ensure_staging();
    loop {
        let got = c.recv_off - HEADER_LEN;
        if got == item.region.len {
            return Ok(true);
        }
        let stage: &mut [u8] = bytemuck::cast_slice_mut(&mut c.staging);
        let room = (item.region.len - got).min(STAGING);
        let n = read_some(link, &mut stage[..room], op, c.recv_off)?;
        if n == 0 {
            return Ok(false);
        }
        let dst = &mut rw(bufs, item.region.buf)[item.region.range()];
        copy_streaming(&mut dst[got..got + n], &stage[..n]);
        *moved = true;
        c.recv_off += n;
    }
}

/// Reduces a received frame into its region: straight out of the ring for
/// shared memory, else piece by piece through a staging buffer that stays in
/// cache between the copy out of the socket and the reduction.
fn recv_reduce(
    c: &mut ChanRun,
    link: &mut Link,
    bufs: &mut [Buf<'_>],
    item: &RecvItem,
    with: Option<Region>,
    op: &OpInfo,
    moved: &mut bool,
) -> Result<bool> {
    let esz = op.fingerprint.dtype.size();
    if link.is_shm() && c.staged == 0 {
        loop {
            let got = c.recv_off - HEADER_LEN;
            if got == item.region.len {
                return Ok(true);
            }
            // Only whole elements are taken; a half-written one waits.
            let r = link.read_in_place(item.region.len - got, &mut |data| {
                let whole = data.len() / esz * esz;
                if whole > 0 {
                    reduce_piece(bufs, item, with, got, &data[..whole], op);
                }
                whole
            });
            match r {
                Some(Ok(0)) => return Ok(false),
                Some(Ok(n)) => {
                    *moved = true;
                    c.recv_off += n;
                }
                Some(Err(e)) => return Err(lost(link.peer(), op, &format!("receiving failed: {e}"))),
                None => break,
            }
        }
    }
    c.ensure_staging();
    loop {
        let got = c.recv_off - HEADER_LEN;
        // Bytes already reduced: everything read except what is staged.
        let reduced = got - c.staged;
        if reduced == item.region.len {
            return Ok(true);
        }
        let stage: &mut [u8] = bytemuck::cast_slice_mut(&mut c.staging);
        let room = (item.region.len - got).min(STAGING - c.staged);
        let n = read_some(link, &mut stage[c.staged..c.staged + room], op, c.recv_off)?;
        if n == 0 {
            return Ok(false);
        }
        *moved = true;
        c.recv_off += n;
        c.staged += n;
        let whole = c.staged / esz * esz;
        if whole == 0 {
            continue;
        }
        reduce_piece(bufs, item, with, reduced, &stage[..whole], op);
        // Keep a partial trailing element for the next read.
        stage.copy_within(whole..c.staged, 0);
        c.staged -= whole;
    }
}

/// Reduces `data`, the bytes of a frame from offset `at` on, into the
/// receive's region: `region = (with or region) op data`.
fn reduce_piece(bufs: &mut [Buf<'_>], item: &RecvItem, with: Option<Region>, at: usize, data: &[u8], op: &OpInfo) {
    let (dtype, rop, len) = (op.fingerprint.dtype, op.reduce_op(), data.len());
    let dst_at = item.region.off + at;
    match with {
        None => reduce_bytes(dtype, rop, &mut rw(bufs, item.region.buf)[dst_at..dst_at + len], data),
        Some(w) if w.buf == item.region.buf => {
            let (dst, src) = split_two(rw(bufs, w.buf), dst_at, w.off + at, len);
            reduce3_bytes(dtype, rop, dst, src, data);
        }
        Some(w) => {
            let (d, s) = pair(bufs, item.region.buf, w.buf);
            reduce3_bytes(dtype, rop, &mut d[dst_at..dst_at + len], &s[w.off + at..w.off + at + len], data);
        }
    }
}

/// Disjoint `(&mut b[a..a+len], &b[w..w+len])`.
fn split_two(b: &mut [u8], a: usize, w: usize, len: usize) -> (&mut [u8], &[u8]) {
    if a < w {
        let (lo, hi) = b.split_at_mut(w);
        (&mut lo[a..a + len], &hi[..len])
    } else {
        let (lo, hi) = b.split_at_mut(a);
        (&mut hi[..len], &lo[w..w + len])
    }
}

/// `(&mut bufs[d], &bufs[s])` for `d != s`.
fn pair<'b>(bufs: &'b mut [Buf<'_>], d: u8, s: u8) -> (&'b mut [u8], &'b [u8]) {
    let (d, s) = (d as usize, s as usize);
    if d < s {
        let (lo, hi) = bufs.split_at_mut(s);
        (
            match &mut lo[d] {
                Buf::Rw(b) => b,
                Buf::Ro(_) => panic!("reduce into read-only buffer"),
            },
            hi[0].bytes(),
        )
    } else {
        let (lo, hi) = bufs.split_at_mut(d);
        (
            match &mut hi[0] {
                Buf::Rw(b) => b,
                Buf::Ro(_) => panic!("reduce into read-only buffer"),
            },
            lo[s].bytes(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::{test_pair, ShmLink, Waiter};
    use ringleader_core::{DType, OpKind};

    const MIB: usize = 1 << 20;

    fn op() -> OpInfo {
        OpInfo { seq: 1, fingerprint: Fingerprint::new(OpKind::AllReduce, DType::U8, 3), checks: true }
    }

    /// One rank of a shared-memory pair: its driver, links and buffers.
    struct Side {
        driver: Driver,
        links: Vec<Vec<Link>>,
        abort: AbortSignal,
    }

    fn side(me: Rank, link: ShmLink, waiter: Waiter) -> Side {
        let mut driver = Driver::new();
        let abort = AbortSignal::new().unwrap();
        waiter.wake_on(&abort);
        driver.set_shm(waiter, Idle::Spin(Duration::from_micros(20)));
        let mut links = vec![Vec::new(), Vec::new()];
        links[1 - me] = vec![Link::Shm(link)];
        Side { driver, links, abort }
    }

    impl Side {
        fn run(&mut self, bufs: &mut [Buf<'_>], plan: &Plan, within: Duration) -> Result<()> {
            let deadline = Some(Instant::now() + within);
            self.driver.run(&mut self.links, bufs, plan, &[op()], &self.abort, deadline, &RankSet::new(0))
        }

        fn acked(&self) -> u64 {
            match self.links.iter().flatten().next() {
                Some(Link::Shm(l)) => l.remote_acked(),
                _ => unreachable!(),
            }
        }
    }

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    /// Both ranks send `len` bytes of buffer 0 and receive the peer's into
    /// buffer 1, copied or reduced (u8 sum into the pattern already there).
    fn exchange(mode: RecvMode, len: usize) -> Plan {
        let chan = Chan { peer: 0, stream: 0 };
        let mut plan = Plan::default();
        plan.send(chan, Region::new(0, 0, len), None);
        plan.recv(chan, Region::new(1, 0, len), mode, None, None);
        plan
    }

    fn for_peer(mut plan: Plan, peer: Rank) -> Plan {
        plan.sends.iter_mut().for_each(|s| s.chan.peer = peer);
        plan.recvs.iter_mut().for_each(|r| r.chan.peer = peer);
        plan
    }

    /// One rank's half of [`exchange`]: sends `pattern(seed_in)`, receives
    /// into `pattern(seed_out)`; returns what it ends with and its acks.
    fn exchange_side(
        me: Rank,
        link: ShmLink,
        waiter: Waiter,
        mode: RecvMode,
        len: usize,
        seeds: (u8, u8),
    ) -> (Vec<u8>, u64) {
        let mut s = side(me, link, waiter);
        let input = pattern(seeds.0, len);
        let mut out = pattern(seeds.1, len);
        let plan = for_peer(exchange(mode, len), 1 - me);
        s.run(&mut [Buf::Ro(&input), Buf::Rw(&mut out)], &plan, Duration::from_secs(20)).unwrap();
        (out, s.acked())
    }

    #[test]
    fn large_frames_between_busy_ranks_go_single_copy_copied_and_reduced() {
        for (run, mode) in [("t-drv-copy", RecvMode::Copy), ("t-drv-red", RecvMode::Reduce { with: None })] {
            let (a, b, wa, wb) = test_pair(run);
            let len = 3 * MIB + 8;
            let t = std::thread::spawn(move || exchange_side(1, b, wb, mode, len, (1, 7)));
            let (out, acked) = exchange_side(0, a, wa, mode, len, (2, 9));
            let (out_b, acked_b) = t.join().unwrap();
            let want = |from: &[u8], had: &[u8]| -> Vec<u8> {
                match mode {
                    RecvMode::Copy => from.to_vec(),
                    RecvMode::Reduce { .. } => from.iter().zip(had).map(|(x, y)| x.wrapping_add(*y)).collect(),
                }
            };
            assert!(out == want(&pattern(1, len), &pattern(9, len)), "rank 0 got wrong bytes ({mode:?})");
            assert!(out_b == want(&pattern(2, len), &pattern(7, len)), "rank 1 got wrong bytes ({mode:?})");
            // Each side's one frame went single-copy and was acknowledged.
            assert_eq!((acked, acked_b), (1, 1), "{mode:?}");
        }
    }

    /// One rank of a TCP pair that splices frames from 64 KiB on.
    fn tcp_side(me: Rank, link: crate::tcp::TcpLink) -> Side {
        let mut driver = Driver::new();
        driver.set_splice_min(Some(64 << 10));
        let mut links = vec![Vec::new(), Vec::new()];
        links[1 - me] = vec![Link::Tcp(link)];
        Side { driver, links, abort: AbortSignal::new().unwrap() }
    }

    #[test]
    fn a_spliced_send_returns_only_once_the_receiver_has_the_bytes() {
        // The receiver starts late, so the whole frame waits in the
        // sockets, still in the sender's pages. The sender then reuses its
        // buffer as a caller would: the receiver must still get the bytes
        // of the call, which only the wait for its acknowledgement ensures.
        let (a, b) = crate::tcp::test_pair();
        let len = 3 * MIB + 8;
        let t = std::thread::spawn(move || {
            let mut s = tcp_side(1, b);
            std::thread::sleep(Duration::from_millis(300));
            let mut out = vec![0u8; len];
            let mut plan = Plan::default();
            plan.recv(Chan { peer: 0, stream: 0 }, Region::new(0, 0, len), RecvMode::Copy, None, None);
            s.run(&mut [Buf::Rw(&mut out)], &plan, Duration::from_secs(10)).unwrap();
            out
        });
        let mut s = tcp_side(0, a);
        let mut data = pattern(3, len);
        let mut plan = Plan::default();
        plan.send(Chan { peer: 1, stream: 0 }, Region::new(0, 0, len), None);
        s.run(&mut [Buf::Rw(&mut data)], &plan, Duration::from_secs(10)).unwrap();
        data.iter_mut().for_each(|x| *x = 0xff);
        assert!(t.join().unwrap() == pattern(3, len), "the receiver saw the buffer change");
    }

    #[test]
    fn spliced_frames_both_ways_interleave_their_acknowledgements() {
        // Four 1 MiB frames each way, copied and reduced: every frame is
        // spliced, and each side's acknowledgements come between the
        // other's data frames.
        for mode in [RecvMode::Copy, RecvMode::Reduce { with: None }] {
            let (a, b) = crate::tcp::test_pair();
            let plan = move |peer| {
                let chan = Chan { peer, stream: 0 };
                let mut plan = Plan::default();
                for k in 0..4 {
                    plan.send(chan, Region::new(0, k * MIB, MIB), None);
                    plan.recv(chan, Region::new(1, k * MIB, MIB), mode, None, None);
                }
                plan
            };
            let side_run = move |me: Rank, link, seeds: (u8, u8)| {
                let mut s = tcp_side(me, link);
                let input = pattern(seeds.0, 4 * MIB);
                let mut out = pattern(seeds.1, 4 * MIB);
                for _ in 0..3 {
                    out = pattern(seeds.1, 4 * MIB);
                    s.run(&mut [Buf::Ro(&input), Buf::Rw(&mut out)], &plan(1 - me), Duration::from_secs(20)).unwrap();
                }
                out
            };
            let t = std::thread::spawn(move || side_run(1, b, (1, 7)));
            let out = side_run(0, a, (2, 9));
            let out_b = t.join().unwrap();
            let want = |from: Vec<u8>, had: Vec<u8>| -> Vec<u8> {
                match mode {
                    RecvMode::Copy => from,
                    RecvMode::Reduce { .. } => from.iter().zip(&had).map(|(x, y)| x.wrapping_add(*y)).collect(),
                }
            };
            assert!(out == want(pattern(1, 4 * MIB), pattern(9, 4 * MIB)), "rank 0 got wrong bytes ({mode:?})");
            assert!(out_b == want(pattern(2, 4 * MIB), pattern(7, 4 * MIB)), "rank 1 got wrong bytes ({mode:?})");
        }
    }

    #[test]
    fn a_send_a_receive_waits_for_and_a_sender_that_only_sends_use_the_ring() {
        // Recursive doubling's swap: each rank reduces into the buffer it
        // sends, so its receive waits for its own send. Single copy would
        // wait for the peer's receive: both would wait forever.
        let (a, b, wa, wb) = test_pair("t-drv-gate");
        let len = MIB;
        let swap = move |peer| {
            let chan = Chan { peer, stream: 0 };
            let mut plan = Plan::default();
            let sent = plan.send(chan, Region::new(0, 0, len), None);
            plan.recv(chan, Region::new(0, 0, len), RecvMode::Reduce { with: None }, None, Some(sent));
            plan
        };
        let t = std::thread::spawn(move || {
            let mut s = side(1, b, wb);
            let mut buf = vec![1u8; len];
            s.run(&mut [Buf::Rw(&mut buf)], &swap(0), Duration::from_secs(10)).unwrap();
            // A rank that only receives...
            let mut got = vec![0u8; 2 * MIB];
            let mut plan = Plan::default();
            plan.recv(Chan { peer: 0, stream: 0 }, Region::new(0, 0, 2 * MIB), RecvMode::Copy, None, None);
            s.run(&mut [Buf::Rw(&mut got)], &plan, Duration::from_secs(10)).unwrap();
            (buf, got)
        });
        let mut s = side(0, a, wa);
        let mut buf = vec![2u8; len];
        s.run(&mut [Buf::Rw(&mut buf)], &swap(1), Duration::from_secs(10)).unwrap();
        // ...from one that only sends (a broadcast's root): through the ring.
        let data = pattern(5, 2 * MIB);
        let mut plan = Plan::default();
        plan.send(Chan { peer: 1, stream: 0 }, Region::new(0, 0, 2 * MIB), None);
        s.run(&mut [Buf::Ro(&data)], &plan, Duration::from_secs(10)).unwrap();
        let (buf_b, got) = t.join().unwrap();
        assert!(buf.iter().chain(&buf_b).all(|&x| x == 3));
        assert!(got == data);
        assert_eq!(s.acked(), 0, "nothing went single-copy");
    }

    #[test]
    fn a_sender_that_fails_abandons_its_single_copy_frames() {
        let (a, b, wa, wb) = test_pair("t-drv-abandon");
        let len = MIB;
        let mut s = side(0, a, wa);
        let input = pattern(3, len);
        let mut out = vec![0u8; len];
        // Rank 1 is not there yet: rank 0 posts its frame and times out.
        let e = s
            .run(
                &mut [Buf::Ro(&input), Buf::Rw(&mut out)],
                &for_peer(exchange(RecvMode::Copy, len), 1),
                Duration::from_millis(200),
            )
            .unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        // Rank 1 then finds the descriptor, but must not trust what it reads.
        let mut r = side(1, b, wb);
        let mut got = vec![0u8; len];
        let mut plan = Plan::default();
        plan.recv(Chan { peer: 0, stream: 0 }, Region::new(0, 0, len), RecvMode::Copy, None, None);
        let e = r.run(&mut [Buf::Rw(&mut got)], &plan, Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("gave up on the transfer"), "{e}");
    }
}
