//! A link is one ordered, reliable byte stream to one peer, driven without
//! blocking. The driver ([`crate::driver`]) multiplexes many links on one
//! thread; what a link is made of (a TCP socket, a shared-memory ring) stays
//! behind this enum.

#[cfg(feature = "rdma")]
use crate::rdma::RdmaLink;
use crate::shm::ShmLink;
use crate::tcp::TcpLink;
use ringleader_core::Rank;
use rustix::event::PollFlags;
use rustix::fd::BorrowedFd;
use std::io::IoSlice;

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

/// One stream to one peer.
#[derive(Debug)]
#[non_exhaustive]
pub enum Link {
    /// A TCP connection.
    Tcp(TcpLink),
    /// A pair of rings in shared memory (same host).
    Shm(ShmLink),
    /// A reliable-connected RDMA queue pair.
    #[cfg(feature = "rdma")]
    Rdma(RdmaLink),
}

impl Link {
    /// The peer at the other end.
    pub fn peer(&self) -> Rank {
        match self {
            Link::Tcp(t) => t.peer(),
            Link::Shm(s) => s.peer(),
            #[cfg(feature = "rdma")]
            Link::Rdma(r) => r.peer(),
        }
    }

    /// Whether this link lives in shared memory (waits spin, then sleep on
    /// the doorbell, instead of polling a descriptor).
    pub fn is_shm(&self) -> bool {
        matches!(self, Link::Shm(_))
    }

    /// Writes what it can of `bufs` without blocking; `Ok(0)` means full.
    #[inline]
    pub fn try_write(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Link::Tcp(t) => t.try_write(bufs),
            Link::Shm(s) => s.try_write(bufs),
            #[cfg(feature = "rdma")]
            Link::Rdma(r) => r.try_write(bufs),
        }
    }

    /// Reads what has arrived into `buf` without blocking.
    #[inline]
    pub fn try_read(&mut self, buf: &mut [u8]) -> std::io::Result<ReadOutcome> {
        match self {
            Link::Tcp(t) => t.try_read(buf),
            Link::Shm(s) => match s.try_read(buf)? {
                0 => Ok(ReadOutcome::WouldBlock),
                n => Ok(ReadOutcome::Data(n)),
            },
            #[cfg(feature = "rdma")]
            Link::Rdma(r) => r.try_read(buf),
        }
    }

    /// [`Link::try_read`] for a destination too large to stay in cache:
    /// shared memory copies it out with streaming stores
    /// ([`crate::stream_copy`]); other links read as usual.
    #[inline]
    pub fn try_read_streaming(&mut self, buf: &mut [u8]) -> std::io::Result<ReadOutcome> {
        match self {
            Link::Shm(s) => match s.try_read_streaming(buf)? {
                0 => Ok(ReadOutcome::WouldBlock),
                n => Ok(ReadOutcome::Data(n)),
            },
            other => other.try_read(buf),
        }
    }

    /// Whether [`Link::try_splice`] can send from the caller's pages here
    /// (TCP, where the kernel grants a pipe).
    pub fn can_splice(&mut self) -> bool {
        match self {
            Link::Tcp(t) => t.can_splice(),
            _ => false,
        }
    }

    /// Sends the start of `data` by reference to its pages (TCP; see
    /// [`crate::tcp::TcpLink::try_splice`]); other links copy it. The caller
    /// keeps `data` unchanged until the peer acknowledges it.
    #[allow(unsafe_code)]
    pub fn try_splice(&mut self, data: &[u8]) -> std::io::Result<usize> {
        match self {
            // SAFETY: the driver splices only buffers that no receive of the
            // plan writes, and ends the plan only once the peer has
            // acknowledged every spliced frame.
            Link::Tcp(t) => unsafe { t.try_splice(data) },
            other => other.try_write(&[std::io::IoSlice::new(data)]),
        }
    }

    /// Hands arrived bytes to `f` where they lie, if the link can (shared
    /// memory); `None` means read into a buffer instead.
    #[inline]
    pub fn read_in_place(&mut self, max: usize, f: &mut dyn FnMut(&[u8]) -> usize) -> Option<std::io::Result<usize>> {
        match self {
            Link::Shm(s) => Some(s.read_in_place(max, f)),
            _ => None,
        }
    }

    /// The descriptor to poll for readiness (TCP; for RDMA the completion
    /// channel), with the events to ask for it given what the caller waits
    /// for (see [`Link::poll_events`]).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        match self {
            Link::Tcp(t) => Some(t.fd()),
            Link::Shm(_) => None,
            #[cfg(feature = "rdma")]
            Link::Rdma(r) => Some(r.fd()),
        }
    }

    /// The poll events that signal progress in the directions `want`: the
    /// same for a socket; readable only for an RDMA completion channel,
    /// where sends progress through completions too (and which never
    /// reports writable).
    pub fn poll_events(&self, want: PollFlags) -> PollFlags {
        match self {
            #[cfg(feature = "rdma")]
            Link::Rdma(_) => PollFlags::IN,
            _ => want,
        }
    }

    /// The frame size from which sends on this link may go single-copy
    /// (shared memory whose reader allowed it; see [`crate::shm`]).
    #[inline]
    pub fn single_copy_min(&self) -> Option<usize> {
        match self {
            Link::Shm(s) => s.single_copy_min(),
            _ => None,
        }
    }

    /// How many of our single-copy frames the peer has copied (0 where
    /// there are none).
    #[inline]
    pub fn remote_acked(&self) -> u64 {
        match self {
            Link::Shm(s) => s.remote_acked(),
            _ => 0,
        }
    }

    /// Gives up on the single-copy frames sent so far, if any (the caller
    /// fails and may reuse its buffers).
    pub fn abandon_remote(&self) {
        if let Link::Shm(s) = self {
            s.abandon_remote();
        }
    }

    /// For shared memory: whether a read (or a write) could progress now.
    pub fn shm_ready(&self, write: bool) -> bool {
        match self {
            Link::Shm(s) => s.ready(write),
            _ => false,
        }
    }
}
