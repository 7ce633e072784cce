//! A nonblocking TCP connection to one peer, and sending from the
//! caller's pages through a pipe (`vmsplice`, then `splice`).
//!
//! Small reads take what has arrived in one system call, up to
//! [`READ_AHEAD`] bytes, and hand out the rest from memory: a small frame's
//! header and payload (and a frame behind it) then cost one `recv`, not
//! one each. Bytes read ahead no longer make the descriptor readable, so
//! the link says it holds some ([`Link::buffered`]) and a wait does not
//! sleep on the descriptor while it does.

use crate::link::{Link, ReadOutcome, Splice, Wake};
use ringleader_core::Rank;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{RecvFlags, SendFlags};
use rustix::pipe::{
    fcntl_getpipe_size, fcntl_setpipe_size, pipe_with, splice, vmsplice, IoSliceRaw, PipeFlags, SpliceFlags,
};
use std::io::{self, IoSlice};
#[cfg(test)]
use std::net::TcpListener;
use std::net::TcpStream;

/// Bytes of the pipe that [`TcpLink::try_splice`] moves pages through (the
/// kernel's default limit for unprivileged processes).
pub(super) const PIPE_SIZE: usize = 1 << 20;

/// Reads shorter than this go through the link's read-ahead buffer of as
/// many bytes (made on the first such read, so that a link that never
/// reads a small frame costs no memory); longer ones go straight into the
/// caller's buffer. A frame of 4 KiB and its header fit.
pub(super) const READ_AHEAD: usize = 8 << 10;

/// A nonblocking TCP connection to one peer.
#[derive(Debug)]
pub struct TcpLink {
    pub(super) stream: TcpStream,
    pub(super) peer: Rank,
    /// The pipe of [`TcpLink::try_splice`], made on first use: (read end,
    /// write end, capacity); `None` inside when the kernel refused one.
    pub(super) pipe: Option<Option<(OwnedFd, OwnedFd, usize)>>,
    /// Bytes spliced into the pipe but not yet into the socket: the first
    /// bytes of what the next `try_splice` is given.
    pub(super) in_pipe: usize,
    /// Bytes read ahead of what was asked ([`READ_AHEAD`] of room once
    /// made): those in `ahead_at..ahead_end` wait to be handed out, in
    /// order, before anything more is read from the socket.
    pub(super) ahead: Vec<u8>,
    pub(super) ahead_at: usize,
    pub(super) ahead_end: usize,
}

impl TcpLink {
    pub(super) fn new(stream: TcpStream, peer: Rank) -> io::Result<TcpLink> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        Ok(TcpLink { stream, peer, pipe: None, in_pipe: 0, ahead: Vec::new(), ahead_at: 0, ahead_end: 0 })
    }

    /// Whether [`TcpLink::try_splice`] can run here (it makes the pipe).
    pub fn can_splice(&mut self) -> bool {
        self.pipe.get_or_insert_with(make_pipe).is_some()
    }

    /// Sends the start of `data` without copying it: its pages go into the
    /// socket by reference (`vmsplice` into a pipe, `splice` into the
    /// socket), and the receiver's kernel copies straight out of them.
    /// Returns how many bytes reached the socket; bytes taken into the pipe
    /// but not yet sent stay there, and the next call must pass the same
    /// data again from the returned offset, before any other write.
    ///
    /// # Safety
    /// The bytes must not change until the peer has received them (over a
    /// network the kernel may even resend them from these pages): the
    /// caller waits for the peer's word that it has.
    #[allow(unsafe_code)]
    pub unsafe fn try_splice(&mut self, data: &[u8]) -> io::Result<usize> {
        let Some(Some((rd, wr, cap))) = &self.pipe else {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "no pipe to splice through"));
        };
        if self.in_pipe == 0 && !data.is_empty() {
            let take = data.len().min(*cap);
            let iov = [IoSliceRaw::from_slice(&data[..take])];
            // SAFETY: the write end of our pipe; the caller keeps the bytes
            // unchanged until the peer has them.
            match unsafe { vmsplice(wr, &iov, SpliceFlags::NONBLOCK) } {
                Ok(n) => self.in_pipe = n,
                Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => return Ok(0),
                Err(_) => {
                    // A kernel (or sandbox) without vmsplice: copy from now on.
                    self.pipe = Some(None);
                    return self.try_write(&[IoSlice::new(data)]);
                }
            }
        }
        // "More" only while bytes of `data` wait behind the pipe: with
        // TCP_NODELAY the last piece must leave at once.
        let mut flags = SpliceFlags::NONBLOCK | SpliceFlags::MOVE;
        if data.len() > self.in_pipe {
            flags |= SpliceFlags::MORE;
        }
        match splice(rd, None, &self.stream, None, self.in_pipe, flags) {
            Ok(n) => {
                self.in_pipe -= n;
                Ok(n)
            }
            Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// The peer's rank.
    pub fn peer(&self) -> Rank {
        self.peer
    }

    /// Writes without blocking. `MSG_NOSIGNAL`: a peer that died must be an
    /// error here, not a SIGPIPE that kills the process.
    #[inline]
    pub fn try_write(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let r = if bufs.len() == 1 {
            rustix::net::send(&self.stream, &bufs[0], SendFlags::NOSIGNAL | SendFlags::DONTWAIT)
        } else {
            rustix::net::sendmsg(&self.stream, bufs, &mut Default::default(), SendFlags::NOSIGNAL | SendFlags::DONTWAIT)
        };
        match r {
            Ok(n) => Ok(n),
            Err(rustix::io::Errno::AGAIN) => Ok(0),
            Err(rustix::io::Errno::INTR) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads without blocking: bytes read ahead first (see the module
    /// docs), then the socket's.
    #[inline]
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<ReadOutcome> {
        if buf.is_empty() {
            return Ok(ReadOutcome::WouldBlock);
        }
        if self.ahead_at == self.ahead_end {
            if buf.len() >= READ_AHEAD {
                return recv(&self.stream, buf);
            }
            if self.ahead.is_empty() {
                self.ahead = vec![0; READ_AHEAD];
            }
            match recv(&self.stream, &mut self.ahead)? {
                ReadOutcome::Data(n) => (self.ahead_at, self.ahead_end) = (0, n),
                other => return Ok(other),
            }
        }
        let n = buf.len().min(self.ahead_end - self.ahead_at);
        buf[..n].copy_from_slice(&self.ahead[self.ahead_at..self.ahead_at + n]);
        self.ahead_at += n;
        Ok(ReadOutcome::Data(n))
    }

    /// The socket's descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

impl Link for TcpLink {
    fn peer(&self) -> Rank {
        self.peer
    }

    #[inline]
    fn try_write(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        TcpLink::try_write(self, bufs)
    }

    #[inline]
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<ReadOutcome> {
        TcpLink::try_read(self, buf)
    }

    fn wake(&self) -> Wake<'_> {
        Wake::Poll(self.stream.as_fd())
    }

    /// Bytes read ahead wait in the link (see the module docs).
    fn buffered(&self) -> bool {
        self.ahead_at < self.ahead_end
    }

    fn splice(&mut self) -> Option<&mut dyn Splice> {
        Some(self)
    }

    /// `SO_INCOMING_CPU`: the CPU that handled the segment that last
    /// arrived. Over loopback the kernel handles a segment on the sender's
    /// CPU, as part of its send; over a network it is where the NIC's
    /// interrupt went, which says nothing of the peer (hence only for
    /// peers on this host). `None` before anything arrived.
    fn peer_cpu(&self) -> Option<u32> {
        rustix::net::sockopt::socket_incoming_cpu(&self.stream)
            .ok()
            .filter(|&c| (c as usize) < rustix::thread::CpuSet::MAX_CPU)
    }
}

impl Splice for TcpLink {
    fn available(&mut self) -> bool {
        self.can_splice()
    }

    /// See [`TcpLink::try_splice`].
    ///
    /// # Safety
    /// As for [`TcpLink::try_splice`].
    #[allow(unsafe_code)]
    unsafe fn try_splice(&mut self, data: &[u8]) -> io::Result<usize> {
        // SAFETY: the caller's contract is this function's.
        unsafe { TcpLink::try_splice(self, data) }
    }
}

/// One `recv` without blocking into `buf` (not empty).
#[inline]
fn recv(stream: &TcpStream, buf: &mut [u8]) -> io::Result<ReadOutcome> {
    match rustix::net::recv(stream, buf, RecvFlags::DONTWAIT) {
        Ok((_, 0)) => Ok(ReadOutcome::Closed),
        Ok((_, n)) => Ok(ReadOutcome::Data(n)),
        Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => Ok(ReadOutcome::WouldBlock),
        Err(e) => Err(e.into()),
    }
}

/// Two connected links over loopback, for tests: (rank 0's link to rank 1,
/// rank 1's link to rank 0).
#[cfg(test)]
pub(crate) fn test_pair() -> (TcpLink, TcpLink) {
    test_pair_sized(None)
}

/// [`test_pair`], rank 0's socket asking for a send buffer of `send` bytes
/// (as data connections ask for theirs, see `listen.rs`).
#[cfg(test)]
pub(crate) fn test_pair_sized(send: Option<usize>) -> (TcpLink, TcpLink) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    if let Some(n) = send {
        socket2::SockRef::from(&a).set_send_buffer_size(n).unwrap();
    }
    (TcpLink::new(a, 1).unwrap(), TcpLink::new(b, 0).unwrap())
}

/// A nonblocking pipe of [`PIPE_SIZE`] (or what the kernel grants), where
/// splicing is safe: `splice(2)` into a socket whose peer is gone raises
/// SIGPIPE (it has no MSG_NOSIGNAL), which would kill a process that left
/// the signal at its default. Rust programs and Python ignore it; a C
/// program that does not gets the copying path.
pub(super) fn make_pipe() -> Option<(OwnedFd, OwnedFd, usize)> {
    if sigpipe_kills() {
        return None;
    }
    let (rd, wr) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK).ok()?;
    let cap = fcntl_setpipe_size(&wr, PIPE_SIZE).or_else(|_| fcntl_getpipe_size(&wr)).ok()?;
    Some((rd, wr, cap))
}

/// Whether SIGPIPE is at its default disposition (terminate).
#[allow(unsafe_code)]
pub(super) fn sigpipe_kills() -> bool {
    // SAFETY: a query only (no new action); `old` is a plain C struct that
    // the kernel fills.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut old) != 0 || old.sa_sigaction == libc::SIG_DFL
    }
}
