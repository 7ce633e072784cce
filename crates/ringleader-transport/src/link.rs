//! The transport seam: what the driver needs of a link, whatever carries it.
//!
//! A link is one ordered, reliable byte stream to one peer, driven without
//! blocking. Every transport implements the small core of [`Link`]: who the
//! peer is, write what fits, read what arrived, and how a waiting rank
//! learns that the link may move ([`Wake`]). What only some transports can
//! do is a capability the driver asks for, never a variant it matches:
//!
//! - [`Mapped`]: arrived bytes lie in memory this process maps (a
//!   shared-memory ring), so they can be reduced where they lie or copied
//!   out around the cache;
//! - [`SingleCopy`]: the peer can copy a payload straight out of this
//!   process's memory (shared memory with cross-memory attach);
//! - [`Splice`]: a payload can be sent by reference to the sender's pages
//!   (TCP with `vmsplice`);
//! - [`Fastbox`]: a small frame can travel whole in a fastbox beside the
//!   stream, in its place in the stream's order (shared memory: a cell of
//!   a cache line or two that the receiver polls; a plain type, not a
//!   trait, since a small frame cannot afford more indirect calls);
//! - [`Link::peer_cpu`]: the CPU the peer last sent from (a TCP
//!   connection over loopback, whose segments the kernel handles on the
//!   sender's CPU), so that a waiting rank can tell it shares a core with
//!   the peer it waits for (see [`crate::cpu`]).
//!
//! An algorithm sees none of this: it plans "send these bytes to rank r,
//! receive into this range from rank s" ([`crate::plan`]), the seam gloo
//! draws between algorithms and transports. Adding a transport is a type
//! that implements [`Link`] (and the capabilities it has), plus its set-up
//! (see the crate docs' map).

use crate::frame::{DecodeError, FrameHeader};
use ringleader_core::{Fingerprint, Rank};
use rustix::event::{PollFd, PollFlags};
use rustix::fd::BorrowedFd;
use std::fmt;
use std::io::{self, IoSlice};

/// Outcome of a nonblocking read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOutcome {
    /// This many bytes arrived (never 0).
    Data(usize),
    /// Nothing to read now.
    WouldBlock,
    /// The peer closed its end.
    Closed,
}

/// How a waiting rank learns that a link may move.
#[derive(Debug, Clone, Copy)]
pub enum Wake<'a> {
    /// Poll this descriptor for the directions waited for (a socket).
    Poll(BorrowedFd<'a>),
    /// Poll this descriptor for reading, whatever direction is waited for:
    /// a completion channel, where sends progress through completions too
    /// and which never reports writable (RDMA).
    Completions(BorrowedFd<'a>),
    /// This rank's doorbell rings when the link may move
    /// ([`crate::shm::Waiter`]); [`Link::ready`] says whether it can now.
    Doorbell,
}

impl<'a> Wake<'a> {
    /// What to poll for progress in the directions `want` (`IN`, `OUT`):
    /// `None` for a doorbell link, which a poll cannot watch.
    pub fn poll_fd(self, want: PollFlags) -> Option<PollFd<'a>> {
        match self {
            Wake::Poll(fd) => Some(PollFd::from_borrowed_fd(fd, want)),
            Wake::Completions(fd) => Some(PollFd::from_borrowed_fd(fd, PollFlags::IN)),
            Wake::Doorbell => None,
        }
    }
}

/// A link of any transport, as set-up returns them and the driver holds
/// them.
pub type AnyLink = Box<dyn Link>;

/// One stream to one peer (see the module docs).
pub trait Link: Send + fmt::Debug {
    /// The peer at the other end.
    fn peer(&self) -> Rank;

    /// Writes what it can of `bufs` without blocking; `Ok(0)` means full.
    fn try_write(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;

    /// Reads what has arrived into `buf` without blocking.
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<ReadOutcome>;

    /// How a waiting rank learns that this link may move.
    fn wake(&self) -> Wake<'_>;

    /// For a [`Wake::Doorbell`] link: whether a write (`write`) or a read
    /// could progress now, asked again after the waiter registered as a
    /// sleeper so no ring is lost. Links woken through a descriptor answer
    /// `false`: `poll(2)` tells for them.
    fn ready(&self, write: bool) -> bool {
        let _ = write;
        false
    }

    /// Whether bytes the link already took from its descriptor wait to be
    /// read: a read returns them at once, though `poll(2)` would not say
    /// the descriptor is readable, so a wait to read must not sleep.
    fn buffered(&self) -> bool {
        false
    }

    /// Capability: arrived bytes lie in memory this process maps.
    fn mapped(&mut self) -> Option<&mut dyn Mapped> {
        None
    }

    /// Capability: single-copy frames to and from the peer (queries).
    fn single_copy(&self) -> Option<&dyn SingleCopy> {
        None
    }

    /// Capability: single-copy frames to and from the peer.
    fn single_copy_mut(&mut self) -> Option<&mut dyn SingleCopy> {
        None
    }

    /// Capability: sends by reference to the sender's pages.
    fn splice(&mut self) -> Option<&mut dyn Splice> {
        None
    }

    /// Capability: small frames whole in a fastbox beside the stream
    /// (see [`Fastbox`]).
    fn fastbox(&mut self) -> Option<&mut Fastbox> {
        None
    }

    /// Capability: the CPU the peer last ran on as it sent on this link,
    /// where the transport can tell; `None` elsewhere. Meaningful only for
    /// a peer on this host (the driver asks for no other).
    fn peer_cpu(&self) -> Option<u32> {
        None
    }
}

/// Small frames whole in a fastbox beside the stream: the header's fields
/// and the payload written in one go where the receiver polls, so that a
/// frame costs the transfer of the cache lines it fills rather than a
/// ring's positions, header and payload. Shared memory has them (cells of
/// a cache line or more beside each ring, see [`crate::shm`]); the type is
/// that transport's, so that a small frame costs one indirect call (to
/// [`Link::fastbox`]) and no more.
///
/// A fastbox frame keeps its place in the stream's order: it follows
/// everything written to the stream before it, and the stream's reads stop
/// where it sits until it is taken. Both directions are used between
/// frames only (never with a frame half written or half read).
pub use crate::shm::Fastbox;

/// The largest payload a fastbox frame of any transport carries: a
/// small collective's whole message at the sizes where a frame's fixed
/// costs outweigh moving its bytes.
pub const FASTBOX_MAX: usize = 4112;

/// The header fields of a fastbox frame, as they travel: a data frame's
/// sequence number, fingerprint (encoded once per operation, not per
/// frame) and tag; its length goes with the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoxHead {
    /// The sender's sequence number.
    pub seq: u64,
    /// The sender's fingerprint, [`Fingerprint::encode`]d, as two
    /// little-endian words.
    pub fingerprint: [u64; 2],
    /// The frame's tag.
    pub tag: u32,
}

impl BoxHead {
    /// The header of a fastbox frame of `len` bytes, decoded as a stream
    /// frame's would be (a fingerprint that does not decode is the same
    /// error).
    pub fn header(&self, len: usize) -> Result<FrameHeader, DecodeError> {
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&self.fingerprint[0].to_le_bytes());
        raw[8..].copy_from_slice(&self.fingerprint[1].to_le_bytes());
        let fingerprint = Fingerprint::decode(&raw).ok_or(DecodeError::Malformed("unknown op, dtype or reduce op"))?;
        Ok(FrameHeader::data(self.seq, fingerprint, self.tag, len as u64))
    }
}

/// A link whose arrived bytes lie in memory this process maps (a
/// shared-memory ring).
pub trait Mapped {
    /// Hands up to `max` arrived bytes, where they lie, to `f`, which
    /// returns how many it used; those are consumed. `Ok(0)`: nothing used
    /// (or nothing there).
    fn read_in_place(&mut self, max: usize, f: &mut dyn FnMut(&[u8]) -> usize) -> io::Result<usize>;

    /// Copies what has arrived into `buf` with streaming stores (see
    /// [`crate::stream_copy`]), for destinations too large to stay in
    /// cache; 0 when nothing has.
    fn read_streaming(&mut self, buf: &mut [u8]) -> io::Result<usize>;
}

/// Single-copy frames: the sender writes a descriptor (the payload's
/// address in its memory) into the stream, the receiver copies the payload
/// straight out of the sender's process and acknowledges it (see
/// [`crate::shm`]). Sent descriptors are numbered by tickets, 1, 2, ...
pub trait SingleCopy {
    /// The size from which frames to the peer may go single-copy; `None`
    /// when the peer cannot read this process's memory or either side
    /// turned it off.
    fn min_len(&self) -> Option<usize>;

    /// Records that a descriptor went into the stream; returns its ticket:
    /// that send completes once [`SingleCopy::acked`] reaches it.
    fn sent(&mut self) -> u64;

    /// How many of our descriptors the peer has copied.
    fn acked(&self) -> u64;

    /// Gives up on every descriptor sent so far: the sender fails and may
    /// reuse the memory, so a peer still copying must not trust the bytes.
    fn abandon(&self);

    /// Copies part of a payload the peer left at `addr` in its memory into
    /// `dst`; returns how many bytes arrived (never 0 for a non-empty `dst`:
    /// that is an error).
    fn read_remote(&self, addr: u64, dst: &mut [u8]) -> io::Result<usize>;

    /// Acknowledges the payload just copied in full, unless its sender
    /// abandoned it meanwhile (then the bytes read cannot be trusted: an
    /// error).
    fn finish_remote(&mut self) -> io::Result<()>;
}

/// Sends by reference: the payload's pages go to the peer without a copy
/// into the link (see [`crate::tcp::TcpLink::try_splice`]).
pub trait Splice {
    /// Whether splicing works here now (what it needs is made on the first
    /// call; a link that cannot splice answers `false` from then on).
    fn available(&mut self) -> bool;

    /// Sends the start of `data` by reference to its pages; returns how
    /// many bytes reached the link. Bytes taken but not yet sent stay
    /// pending: the next call must pass the same data again from the
    /// returned offset, before any other write to the link.
    ///
    /// # Safety
    /// The bytes of `data` must not change until the peer has received
    /// them (over a network the kernel may even resend them from these
    /// pages): the caller waits for the peer's word that it has, and never
    /// writes to the link's stream again if it stops waiting.
    #[allow(unsafe_code)]
    unsafe fn try_splice(&mut self, data: &[u8]) -> io::Result<usize>;
}
