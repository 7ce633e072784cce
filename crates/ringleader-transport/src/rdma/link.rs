//! The RDMA link protocol: one ordered byte stream over one reliable-connected
//! queue pair, written against the [`Qp`] trait so it runs the same over the
//! `ibverbs` binding and over the software model.
//!
//! **Chunking.** Bytes written are copied into send slots (registered
//! buffers of `chunk` bytes) and each slot goes out as one SEND-with-
//! immediate message; the receiver copies them out of its receive slots in
//! arrival order. Frames (header, payload, padding) are split across
//! messages however the slots fall; the stream is what matters.
//!
//! **Credits.** Each side posts `slots` receives before connecting, so each
//! starts with `slots` credits: one credit is one receive buffer the peer
//! has posted for us. A message costs one credit; without one the peer would
//! answer "receiver not ready". When the reader has copied a message out it
//! posts the slot again and owes the writer one credit. Owed credits travel
//! in the low 16 bits of the immediate data of every message going back,
//! and when no data goes back, in a credit-only message (zero bytes) once
//! half the slots are owed. A data message needs two credits, so the last
//! credit is always free for a credit-only message: two ranks that both
//! owe each other credits can never both be unable to say so. (Proof
//! sketch: a rank at zero credits spent its last on a credit-only message
//! carrying at least `slots / 2` credits, and the peer answers any message
//! with grants of its own.)
//!
//! **Ordering.** The high 16 bits of the immediate data number the messages
//! of each direction; a receiver that sees another number than the next
//! one fails at once instead of delivering a corrupt stream.
//!
//! **Errors.** A completion with an error status puts the link in a failed
//! state: every later call returns the same error, which says which request
//! failed (the n-th message sent or received) and what the status usually
//! means. The driver adds the peer rank, the collective and its sequence
//! number. Verbs have no end-of-stream: a peer that vanishes shows up as
//! failed sends (retries exceeded) or, for a pure reader, as silence that
//! the abort signal (the monitor sees the dead rank at the store) or the
//! deadline ends.
//!
//! **Waiting.** Every call polls the completion queue; when it finds it
//! empty it arms the completion channel and polls again, so the channel's
//! descriptor (see [`RdmaLink::fd`]) becomes readable at the next
//! completion and can be polled beside the abort eventfd.

use super::{Endpoint, Qp, Wc, WcKind, WcStatus};
use crate::link::{Link, ReadOutcome, Wake};
use ringleader_core::{AbortSignal, Error, Rank};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fd::BorrowedFd;
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::time::{Duration, Instant};

/// Credits owed back are carried in the low bits of the immediate data.
const CREDIT_BITS: u32 = 16;
const CREDIT_MASK: u32 = (1 << CREDIT_BITS) - 1;

/// Slots and their size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkParams {
    /// Send slots and receive slots, each (at least 4, at most 65535).
    pub slots: usize,
    /// Bytes per slot (a multiple of 8).
    pub chunk: usize,
}

impl Default for LinkParams {
    /// 16 slots of 64 KiB: 1 MiB in flight per direction.
    fn default() -> LinkParams {
        LinkParams { slots: 16, chunk: 64 << 10 }
    }
}

/// Packs a message number and a credit grant into immediate data.
///
/// ```
/// use ringleader_transport::rdma::link::{imm, unpack_imm};
/// assert_eq!(unpack_imm(imm(7, 3)), (7, 3));
/// ```
pub fn imm(seq: u16, credits: u16) -> u32 {
    (u32::from(seq) << CREDIT_BITS) | u32::from(credits)
}

/// Inverse of [`imm`]: `(message number, credits)`.
pub fn unpack_imm(imm: u32) -> (u16, u16) {
    ((imm >> CREDIT_BITS) as u16, (imm & CREDIT_MASK) as u16)
}

/// How a wait outside the driver ended badly.
#[derive(Debug)]
pub enum WaitError {
    /// The abort signal fired; its reason.
    Aborted(Error),
    /// The deadline passed; what the link was waiting for.
    TimedOut(String),
    /// The link failed.
    Failed(io::Error),
}

/// One ordered byte stream to one peer over a queue pair.
#[derive(Debug)]
pub struct RdmaLink {
    qp: Box<dyn Qp>,
    peer: Rank,
    params: LinkParams,
    /// Receive buffers the peer has posted for us that we have not used.
    credits: usize,
    /// Receive slots we posted again and have not told the peer about.
    owed: usize,
    /// Send slots not in flight.
    free_send: Vec<usize>,
    /// Number of the next message we send / expect.
    send_seq: u16,
    recv_seq: u16,
    /// Data messages arrived and not yet read, in order: (slot, length).
    ready: VecDeque<(usize, usize)>,
    /// Bytes of the first ready message already read.
    head_off: usize,
    /// Completions scratch.
    wcs: Vec<Wc>,
    /// Whether the completion channel is armed (an event may be pending).
    armed: bool,
    /// The first failure; sticky.
    failed: Option<(io::ErrorKind, String)>,
    /// Messages sent and received, for messages.
    sent: u64,
    received: u64,
}

impl RdmaLink {
    /// Wraps `qp` (not yet connected) as a link to `peer` and posts every
    /// receive slot, so the peer may send as soon as both are connected.
    pub fn new(mut qp: Box<dyn Qp>, peer: Rank, params: LinkParams) -> io::Result<RdmaLink> {
        if params.slots < 4 || params.slots > CREDIT_MASK as usize || params.chunk == 0 || params.chunk % 8 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("unusable RDMA link parameters {params:?}"),
            ));
        }
        for s in 0..params.slots {
            qp.post_recv(s)?;
        }
        Ok(RdmaLink {
            qp,
            peer,
            params,
            credits: params.slots,
            owed: 0,
            free_send: (0..params.slots).rev().collect(),
            send_seq: 0,
            recv_seq: 0,
            ready: VecDeque::new(),
            head_off: 0,
            wcs: Vec::with_capacity(params.slots * 2),
            armed: false,
            failed: None,
            sent: 0,
            received: 0,
        })
    }

    /// This end's address, for the peer.
    pub fn endpoint(&self) -> Endpoint {
        self.qp.endpoint()
    }

    /// Connects to the peer's queue pair at `remote`.
    pub fn connect(&mut self, remote: &Endpoint) -> io::Result<()> {
        self.qp.connect(remote)
    }

    /// The peer's rank.
    pub fn peer(&self) -> Rank {
        self.peer
    }

    /// The completion channel's descriptor; poll it for readability only
    /// (whatever direction the caller waits for, progress comes as
    /// completions).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.qp.fd()
    }

    fn fail(&mut self, kind: io::ErrorKind, msg: String) -> io::Error {
        self.failed.get_or_insert((kind, msg.clone()));
        io::Error::new(kind, msg)
    }

    fn check(&self) -> io::Result<()> {
        match &self.failed {
            Some((k, m)) => Err(io::Error::new(*k, m.clone())),
            None => Ok(()),
        }
    }

    /// Takes in every completion available; arms the channel when none is.
    fn progress(&mut self) -> io::Result<()> {
        self.check()?;
        if self.armed {
            self.armed = false;
            self.qp.ack_events()?;
        }
        // Arm after every drain, not only after an empty one: the caller
        // may go to sleep on the channel whatever this call found, and an
        // unarmed queue would let it sleep through the next completion.
        self.drain()?;
        self.qp.arm()?;
        self.armed = true;
        self.drain()?;
        self.return_credits()
    }

    /// Handles the completions available now.
    fn drain(&mut self) -> io::Result<()> {
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        let polled = self.qp.poll(&mut wcs);
        let r = polled.and_then(|()| wcs.iter().try_for_each(|wc| self.handle(wc)));
        self.wcs = wcs;
        r
    }

    fn handle(&mut self, wc: &Wc) -> io::Result<()> {
        if wc.status != WcStatus::Success {
            let what = match wc.kind {
                WcKind::Send => format!("sending message {} (of {} sent)", self.sent_of(wc), self.sent),
                WcKind::Recv => format!("receiving message {}", self.received + 1),
            };
            let kind = match wc.status {
                WcStatus::RetryExceeded | WcStatus::Flushed => io::ErrorKind::ConnectionReset,
                _ => io::ErrorKind::Other,
            };
            return Err(self.fail(kind, format!("RDMA error completion {what}: {}", wc.status.describe())));
        }
        match wc.kind {
            WcKind::Send => {
                self.free_send.push(wc.slot);
                Ok(())
            }
            WcKind::Recv => self.arrived(wc),
        }
    }

    /// The number of the message a failed send completion belongs to (sends
    /// complete in order, so it is the oldest one in flight).
    fn sent_of(&self, _wc: &Wc) -> u64 {
        let in_flight = (self.params.slots - self.free_send.len()) as u64;
        self.sent + 1 - in_flight.min(self.sent)
    }

    fn arrived(&mut self, wc: &Wc) -> io::Result<()> {
        let (seq, grant) = unpack_imm(wc.imm);
        if seq != self.recv_seq {
            return Err(self.fail(
                io::ErrorKind::InvalidData,
                format!(
                    "RDMA message number {seq} arrived where {} was expected: a message was lost or reordered",
                    self.recv_seq
                ),
            ));
        }
        self.recv_seq = self.recv_seq.wrapping_add(1);
        self.received += 1;
        self.credits += grant as usize;
        if self.credits > self.params.slots {
            let n = self.credits;
            return Err(self.fail(
                io::ErrorKind::InvalidData,
                format!(
                    "the peer granted {n} receive buffers but only {} exist: its credit count is corrupt",
                    self.params.slots
                ),
            ));
        }
        if wc.len > self.params.chunk {
            return Err(self.fail(
                io::ErrorKind::InvalidData,
                format!("an RDMA message of {} bytes exceeds the {}-byte slot", wc.len, self.params.chunk),
            ));
        }
        if wc.len == 0 {
            // A credit-only message: its slot is free again at once.
            self.repost(wc.slot)
        } else {
            self.ready.push_back((wc.slot, wc.len));
            Ok(())
        }
    }

    fn repost(&mut self, slot: usize) -> io::Result<()> {
        self.qp.post_recv(slot).map_err(|e| self.fail(e.kind(), format!("re-posting a receive failed: {e}")))?;
        self.owed += 1;
        Ok(())
    }

    /// Sends a credit-only message once half the slots are owed.
    fn return_credits(&mut self) -> io::Result<()> {
        if self.owed >= self.params.slots / 2 && self.credits >= 1 {
            if let Some(slot) = self.free_send.pop() {
                self.post(slot, 0)?;
            }
        }
        Ok(())
    }

    fn post(&mut self, slot: usize, len: usize) -> io::Result<()> {
        let imm = imm(self.send_seq, self.owed as u16);
        if let Err(e) = self.qp.post_send(slot, len, imm) {
            return Err(self.fail(e.kind(), format!("posting an RDMA send failed: {e}")));
        }
        self.owed = 0;
        self.credits -= 1;
        self.send_seq = self.send_seq.wrapping_add(1);
        self.sent += 1;
        Ok(())
    }

    /// Copies as much of `bufs` as credits and free slots allow into
    /// messages and posts them; `Ok(0)` when none could go.
    pub fn try_write(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.progress()?;
        let (mut bi, mut boff, mut total) = (0, 0, 0);
        while self.credits >= 2 {
            let Some(slot) = self.free_send.pop() else { break };
            let chunk = self.params.chunk;
            let dst = self.qp.send_buf(slot);
            let mut n = 0;
            while n < chunk && bi < bufs.len() {
                let src = &bufs[bi][boff..];
                let k = src.len().min(chunk - n);
                dst[n..n + k].copy_from_slice(&src[..k]);
                n += k;
                boff += k;
                if boff == bufs[bi].len() {
                    bi += 1;
                    boff = 0;
                }
            }
            if n == 0 {
                self.free_send.push(slot);
                break;
            }
            self.post(slot, n)?;
            total += n;
        }
        Ok(total)
    }

    /// Copies arrived bytes into `buf`.
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<ReadOutcome> {
        self.progress()?;
        let mut got = 0;
        while got < buf.len() {
            let Some(&(slot, len)) = self.ready.front() else { break };
            let k = (len - self.head_off).min(buf.len() - got);
            buf[got..got + k].copy_from_slice(&self.qp.recv_buf(slot)[self.head_off..self.head_off + k]);
            got += k;
            self.head_off += k;
            if self.head_off == len {
                self.ready.pop_front();
                self.head_off = 0;
                self.repost(slot)?;
            }
        }
        self.return_credits()?;
        Ok(if got == 0 { ReadOutcome::WouldBlock } else { ReadOutcome::Data(got) })
    }

    /// Whether a read (or a write, per `write`) could make progress now,
    /// after taking in the completions available.
    pub fn ready(&mut self, write: bool) -> io::Result<bool> {
        self.progress()?;
        Ok(if write { self.credits >= 2 && !self.free_send.is_empty() } else { !self.ready.is_empty() })
    }

    /// What the link waits for, for messages.
    pub fn describe(&self) -> String {
        format!(
            "rank {}: {} of {} receive buffers granted to us, {} sends unacknowledged, {} messages arrived unread, {} credits owed back",
            self.peer,
            self.credits,
            self.params.slots,
            self.params.slots - self.free_send.len(),
            self.ready.len(),
            self.owed
        )
    }

    /// Blocks until a read (when `read`) or a write (when `write`) could
    /// progress, the abort signal fires, or `deadline` passes. For callers
    /// outside the driver (tests, setup); the driver polls [`RdmaLink::fd`]
    /// itself.
    pub fn wait(&mut self, read: bool, write: bool, abort: &AbortSignal, deadline: Instant) -> Result<(), WaitError> {
        loop {
            if let Some(e) = abort.reason() {
                return Err(WaitError::Aborted(e));
            }
            self.progress().map_err(WaitError::Failed)?;
            let can_write = self.credits >= 2 && !self.free_send.is_empty();
            if (read && !self.ready.is_empty()) || (write && can_write) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(WaitError::TimedOut(format!("waited for {}", self.describe())));
            }
            let left = (deadline - now).min(Duration::from_millis(500));
            let ts = Timespec { tv_sec: left.as_secs() as i64, tv_nsec: left.subsec_nanos() as i64 };
            let mut fds = [
                PollFd::from_borrowed_fd(abort.fd(), PollFlags::IN),
                PollFd::from_borrowed_fd(self.qp.fd(), PollFlags::IN),
            ];
            match poll(&mut fds, Some(&ts)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(WaitError::Failed(e.into())),
            }
        }
    }
}

impl Link for RdmaLink {
    fn peer(&self) -> Rank {
        self.peer
    }

    #[inline]
    fn try_write(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        RdmaLink::try_write(self, bufs)
    }

    #[inline]
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<ReadOutcome> {
        RdmaLink::try_read(self, buf)
    }

    fn wake(&self) -> Wake<'_> {
        Wake::Completions(self.fd())
    }
}
