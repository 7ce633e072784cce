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

use crate::frame::{check, Expect, FrameHeader, Verdict, HEADER_LEN};
use crate::link::{Link, ReadOutcome};
use ringleader_core::reduce::{reduce3_bytes, reduce_bytes};
use ringleader_core::{AbortSignal, Error, Fingerprint, Rank, ReduceOp, Result};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use std::io::IoSlice;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes reduced per piece when a reduce-receive arrives: small enough to
/// stay in cache between the copy out of the socket and the reduction.
const STAGING: usize = 256 << 10;
/// Longest single poll; the abort descriptor wakes us sooner.
const MAX_POLL: Duration = Duration::from_secs(1);

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
        self.sends.push(SendItem { chan, region, after });
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
        self.recvs.push(RecvItem { chan, region, mode, after, after_send });
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
}

/// The links a driver runs over: `links[peer][stream]`.
pub type Links = [Vec<Link>];

impl Driver {
    /// A driver with no scratch yet.
    pub fn new() -> Driver {
        Driver::default()
    }

    /// Runs `plan` to completion, or until an error, the abort signal, or
    /// `deadline`. While blocked, the ranks it waits for are published in
    /// `awaited` (bit r = rank r, ranks below 64).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &mut self,
        links: &mut Links,
        bufs: &mut [Buf<'_>],
        plan: &Plan,
        op: &OpInfo,
        abort: &AbortSignal,
        deadline: Option<Instant>,
        awaited: &AtomicU64,
    ) -> Result<()> {
        let streams = links.iter().map(Vec::len).max().unwrap_or(1).max(1);
        self.prepare(links.len() * streams, streams, plan);
        let result = self.drive(links, bufs, plan, op, abort, deadline, awaited, streams);
        for &c in &self.active {
            self.chans[c].active = false;
        }
        // On failure the awaited peers stay published: they are evidence.
        if result.is_ok() {
            awaited.store(0, Ordering::Relaxed);
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
        op: &OpInfo,
        abort: &AbortSignal,
        deadline: Option<Instant>,
        awaited: &AtomicU64,
        streams: usize,
    ) -> Result<()> {
        loop {
            let mut progressed = false;
            let mut finished = true;
            for ai in 0..self.active.len() {
                let ci = self.active[ai];
                let (peer, stream) = (ci / streams, ci % streams);
                let link = &mut links[peer][stream];
                progressed |= self.pump_sends(ci, link, bufs, plan, op)?;
                progressed |= self.pump_recvs(ci, link, bufs, plan, op)?;
                let c = &self.chans[ci];
                finished &= c.send_pos == c.sends.len() && c.recv_pos == c.recvs.len();
            }
            if finished {
                return Ok(());
            }
            if !progressed {
                abort.check()?;
                self.wait(links, plan, abort, deadline, op, awaited, streams)?;
            }
        }
    }

    /// Writes queued sends on one link until it would block or the next send
    /// waits for a receive. Returns whether any byte moved.
    fn pump_sends(&mut self, ci: usize, link: &mut Link, bufs: &[Buf<'_>], plan: &Plan, op: &OpInfo) -> Result<bool> {
        let mut moved = false;
        let c = &mut self.chans[ci];
        while let Some(&si) = c.sends.get(c.send_pos) {
            let item = plan.sends[si as usize];
            if item.after.is_some_and(|r| !self.recv_done[r as usize]) {
                break;
            }
            if c.send_off == 0 {
                let tag = c.send_pos as u32;
                c.send_hdr = FrameHeader::data(op.seq, op.fingerprint, tag, item.region.len as u64).encode();
            }
            let data = &bufs[item.region.buf as usize].bytes()[item.region.range()];
            let n = if c.send_off < HEADER_LEN {
                link.try_write(&[IoSlice::new(&c.send_hdr[c.send_off..]), IoSlice::new(data)])
            } else {
                link.try_write(&[IoSlice::new(&data[c.send_off - HEADER_LEN..])])
            }
            .map_err(|e| lost(link.peer(), op, &format!("sending failed: {e}")))?;
            if n == 0 {
                break;
            }
            moved = true;
            c.send_off += n;
            if c.send_off == HEADER_LEN + data.len() {
                c.send_off = 0;
                c.send_pos += 1;
                self.send_done[si as usize] = true;
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
        op: &OpInfo,
    ) -> Result<bool> {
        let mut moved = false;
        loop {
            let c = &mut self.chans[ci];
            let Some(&ri) = c.recvs.get(c.recv_pos) else {
                break;
            };
            let item = plan.recvs[ri as usize];
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
                check_header(&c.recv_hdr, link.peer(), tag, item.region.len, op)?;
            }
            let done = match item.mode {
                RecvMode::Copy => recv_copy(c, link, bufs, &item, op, &mut moved)?,
                RecvMode::Reduce { with } => recv_reduce(c, link, bufs, &item, with, op, &mut moved)?,
            };
            if !done {
                break;
            }
            c.recv_off = 0;
            c.staged = 0;
            c.recv_pos += 1;
            self.recv_done[ri as usize] = true;
        }
        Ok(moved)
    }

    #[allow(clippy::too_many_arguments)]
    fn wait(
        &self,
        links: &Links,
        plan: &Plan,
        abort: &AbortSignal,
        deadline: Option<Instant>,
        op: &OpInfo,
        awaited: &AtomicU64,
        streams: usize,
    ) -> Result<()> {
        let mut fds = Vec::with_capacity(self.active.len() + 1);
        fds.push(PollFd::from_borrowed_fd(abort.fd(), PollFlags::IN));
        let mut waiting_for = 0u64;
        for &ci in &self.active {
            let c = &self.chans[ci];
            let mut flags = PollFlags::empty();
            if let Some(&si) = c.sends.get(c.send_pos) {
                if plan.sends[si as usize].after.is_none_or(|r| self.recv_done[r as usize]) {
                    flags |= PollFlags::OUT;
                }
            }
            if let Some(&ri) = c.recvs.get(c.recv_pos) {
                let item = &plan.recvs[ri as usize];
                if item.after.is_none_or(|r| self.recv_done[r as usize])
                    && item.after_send.is_none_or(|s| self.send_done[s as usize])
                {
                    flags |= PollFlags::IN;
                    let peer = ci / streams;
                    if peer < 64 {
                        waiting_for |= 1 << peer;
                    }
                }
            }
            if !flags.is_empty() {
                fds.push(PollFd::from_borrowed_fd(links[ci / streams][ci % streams].fd(), flags));
            }
        }
        awaited.store(waiting_for, Ordering::Relaxed);
        let now = Instant::now();
        let mut left = MAX_POLL;
        if let Some(d) = deadline {
            if now >= d {
                return Err(Error::Timeout {
                    op: op.fingerprint.op,
                    seq: op.seq,
                    waited: Duration::ZERO,
                    awaited: (0..64).filter(|r| waiting_for & (1 << r) != 0).collect(),
                });
            }
            left = left.min(d - now);
        }
        let ts = Timespec { tv_sec: left.as_secs() as i64, tv_nsec: left.subsec_nanos() as i64 };
        match poll(&mut fds, Some(&ts)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(e) => Err(Error::aborted(format!("poll failed: {e}"))),
        }
    }
}

fn lost(peer: Rank, op: &OpInfo, detail: &str) -> Error {
    Error::PeerLost { peer, op: op.fingerprint.op, seq: op.seq, detail: detail.to_string() }
}

/// Reads into `buf`; `0` when nothing is there. `at` (bytes of this frame
/// already read) only words the error when the peer hangs up.
fn read_some(link: &mut Link, buf: &mut [u8], op: &OpInfo, at: usize) -> Result<usize> {
    match link.try_read(buf) {
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

fn check_header(raw: &[u8; HEADER_LEN], peer: Rank, tag: u32, len: usize, op: &OpInfo) -> Result<()> {
    let h = FrameHeader::decode(raw).map_err(|e| Error::PeerProtocol { peer, detail: e.to_string() })?;
    let want = Expect { seq: op.seq, fingerprint: op.fingerprint, tag, len: len as u64 };
    match check(&h, &want, op.checks) {
        Verdict::Ok => Ok(()),
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

fn rw<'b>(bufs: &'b mut [Buf<'_>], i: u8) -> &'b mut [u8] {
    match &mut bufs[i as usize] {
        Buf::Rw(b) => b,
        // Plans are built by this crate's callers and never receive into an
        // input; reaching this is a bug in a plan builder.
        Buf::Ro(_) => panic!("plan receives into read-only buffer {i}"),
    }
}

fn recv_copy(
    c: &mut ChanRun,
    link: &mut Link,
    bufs: &mut [Buf<'_>],
    item: &RecvItem,
    op: &OpInfo,
    moved: &mut bool,
) -> Result<bool> {
    let got = c.recv_off - HEADER_LEN;
    if got < item.region.len {
        let dst = &mut rw(bufs, item.region.buf)[item.region.range()];
        let n = read_some(link, &mut dst[got..], op, c.recv_off)?;
        if n > 0 {
            *moved = true;
            c.recv_off += n;
        }
    }
    Ok(c.recv_off - HEADER_LEN == item.region.len)
}

/// Reads a frame piece by piece into staging and reduces each whole-element
/// piece into the region at once, while it is still in cache.
fn recv_reduce(
    c: &mut ChanRun,
    link: &mut Link,
    bufs: &mut [Buf<'_>],
    item: &RecvItem,
    with: Option<Region>,
    op: &OpInfo,
    moved: &mut bool,
) -> Result<bool> {
    let dtype = op.fingerprint.dtype;
    let esz = dtype.size();
    if c.staging.is_empty() {
        c.staging = vec![0u64; STAGING / 8];
    }
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
        let at = item.region.off + reduced;
        let op_ = op.reduce_op();
        match with {
            None => {
                let dst = &mut rw(bufs, item.region.buf)[at..at + whole];
                reduce_bytes(dtype, op_, dst, &stage[..whole]);
            }
            Some(w) => {
                let wat = w.off + reduced;
                if w.buf == item.region.buf {
                    let b = rw(bufs, w.buf);
                    debug_assert!(wat + whole <= at || at + whole <= wat, "overlapping reduce operands");
                    let (dst, src) = split_two(b, at, wat, whole);
                    reduce3_bytes(dtype, op_, dst, src, &stage[..whole]);
                } else {
                    let (d, s) = pair(bufs, item.region.buf, w.buf);
                    reduce3_bytes(dtype, op_, &mut d[at..at + whole], &s[wat..wat + whole], &stage[..whole]);
                }
            }
        }
        // Keep a partial trailing element for the next read.
        stage.copy_within(whole..c.staged, 0);
        c.staged -= whole;
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
