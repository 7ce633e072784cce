//! A link is one ordered, reliable byte stream to one peer, driven without
//! blocking. The driver ([`crate::driver`]) multiplexes many links on one
//! thread; what a link is made of (a TCP socket, a shared-memory ring) stays
//! behind this enum.

use crate::tcp::TcpLink;
use ringleader_core::Rank;
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
}

impl Link {
    /// The peer at the other end.
    pub fn peer(&self) -> Rank {
        match self {
            Link::Tcp(t) => t.peer(),
        }
    }

    /// Writes what it can of `bufs` without blocking; `Ok(0)` means full.
    #[inline]
    pub fn try_write(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Link::Tcp(t) => t.try_write(bufs),
        }
    }

    /// Reads what has arrived into `buf` without blocking.
    #[inline]
    pub fn try_read(&mut self, buf: &mut [u8]) -> std::io::Result<ReadOutcome> {
        match self {
            Link::Tcp(t) => t.try_read(buf),
        }
    }

    /// The descriptor to poll for readiness.
    pub fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Link::Tcp(t) => t.fd(),
        }
    }
}
