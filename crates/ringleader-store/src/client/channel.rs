//! A nonblocking TCP socket driven by `poll(2)`, where every wait has a
//! deadline and also watches the abort signal's descriptor.
//!
//! This is why the client avoids std's blocking calls: `read` with a socket
//! timeout cannot be interrupted by another thread, and an abort must wake a
//! thread blocked in `get` at once, with the abort's reason.

use crate::codec::CodecError;
use ringleader_core::{AbortSignal, Error};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fd::{AsFd, BorrowedFd};
use rustix::io::Errno;
use rustix::net::{AddressFamily, SendFlags, SocketFlags, SocketType};
use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Bytes asked of the kernel per read, at least.
const READ_CHUNK: usize = 64 << 10;
/// At most, so that a frame's declared length is not zero-filled at once.
const MAX_READ: usize = 16 << 20;

/// Why a wait on the socket ended without its result.
#[derive(Debug)]
pub(super) enum Failure {
    /// The abort signal fired; its reason.
    Aborted(Error),
    /// The deadline passed.
    Deadline,
    /// The peer closed the connection.
    Closed,
    Io(io::Error),
    Codec(CodecError),
    /// A well-formed message that makes no sense here.
    Unexpected(String),
}

impl From<Errno> for Failure {
    fn from(e: Errno) -> Self {
        Failure::Io(e.into())
    }
}

/// One connection's socket and read buffer.
#[derive(Debug)]
pub(super) struct Channel {
    stream: TcpStream,
    /// Bytes read and not yet decoded are `rbuf[..filled]`; the rest is
    /// room for the next read, zeroed once when it was first needed
    /// (zeroing it again before every read cost more than the read).
    rbuf: Vec<u8>,
    filled: usize,
    abort: Option<AbortSignal>,
}

impl Channel {
    /// Connects to `addr` by `deadline`, abortably.
    pub(super) fn connect(addr: SocketAddr, deadline: Instant, abort: Option<AbortSignal>) -> Result<Channel, Failure> {
        let family = match addr {
            SocketAddr::V4(_) => AddressFamily::INET,
            SocketAddr::V6(_) => AddressFamily::INET6,
        };
        let flags = SocketFlags::NONBLOCK | SocketFlags::CLOEXEC;
        let fd = rustix::net::socket_with(family, SocketType::STREAM, flags, None)?;
        match rustix::net::connect(&fd, &addr) {
            Ok(()) => {}
            Err(Errno::INPROGRESS | Errno::INTR) => {
                wait_ready(fd.as_fd(), PollFlags::OUT, deadline, abort.as_ref())?;
                rustix::net::sockopt::socket_error(&fd)??;
            }
            Err(e) => return Err(e.into()),
        }
        // Requests and answers are small frames; Nagle would only add delay.
        let _ = rustix::net::sockopt::set_tcp_nodelay(&fd, true);
        Ok(Channel { stream: TcpStream::from(fd), rbuf: Vec::new(), filled: 0, abort })
    }

    /// Writes all of `frame` by `deadline`. `MSG_NOSIGNAL`: a closed peer
    /// must be an error, not a `SIGPIPE` that kills a Python host process.
    pub(super) fn send(&mut self, mut frame: &[u8], deadline: Instant) -> Result<(), Failure> {
        while !frame.is_empty() {
            match rustix::net::send(&self.stream, frame, SendFlags::NOSIGNAL) {
                Ok(0) => return Err(Failure::Closed),
                Ok(n) => frame = &frame[n..],
                Err(Errno::AGAIN) => self.wait(PollFlags::OUT, deadline)?,
                Err(Errno::INTR) => {}
                Err(Errno::PIPE | Errno::CONNRESET) => return Err(Failure::Closed),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Reads until `decode` finds a whole message, by `deadline`.
    pub(super) fn recv<T>(
        &mut self,
        deadline: Instant,
        decode: impl Fn(&[u8]) -> Result<Option<(T, usize)>, CodecError>,
    ) -> Result<T, Failure> {
        loop {
            if let Some((msg, used)) = decode(&self.rbuf[..self.filled]).map_err(Failure::Codec)? {
                self.rbuf.copy_within(used..self.filled, 0);
                self.filled -= used;
                return Ok(msg);
            }
            self.fill(deadline)?;
        }
    }

    /// Appends what the socket has to the buffer, waiting for it if need be.
    fn fill(&mut self, deadline: Instant) -> Result<(), Failure> {
        let old = self.filled;
        let frame_rest = crate::codec::declared_len(&self.rbuf[..old]).map_or(0, |len| (len + 4).saturating_sub(old));
        let end = old + frame_rest.clamp(READ_CHUNK, MAX_READ);
        if self.rbuf.len() < end {
            self.rbuf.resize(end, 0);
        }
        match self.read_into(old, end, deadline)? {
            0 => Err(Failure::Closed),
            n => {
                self.filled += n;
                Ok(())
            }
        }
    }

    fn read_into(&mut self, at: usize, end: usize, deadline: Instant) -> Result<usize, Failure> {
        loop {
            match (&self.stream).read(&mut self.rbuf[at..end]) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wait(PollFlags::IN, deadline)?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Err(Failure::Closed),
                Err(e) => return Err(Failure::Io(e)),
            }
        }
    }

    fn wait(&self, flags: PollFlags, deadline: Instant) -> Result<(), Failure> {
        wait_ready(self.stream.as_fd(), flags, deadline, self.abort.as_ref())
    }
}

/// Waits until `fd` is ready for `flags` (or has an error or hangup), the
/// abort signal fires, or `deadline` passes.
fn wait_ready(
    fd: BorrowedFd<'_>,
    flags: PollFlags,
    deadline: Instant,
    abort: Option<&AbortSignal>,
) -> Result<(), Failure> {
    let abort_fd = abort.map(AbortSignal::fd);
    loop {
        if let Some(signal) = abort {
            signal.check().map_err(Failure::Aborted)?;
        }
        // Poll at least once, even past the deadline: what is ready now
        // counts.
        let left = deadline.saturating_duration_since(Instant::now());
        let mut fds = vec![PollFd::new(&fd, flags)];
        fds.extend(abort_fd.as_ref().map(|a| PollFd::new(a, PollFlags::IN)));
        match poll(&mut fds, Some(&timespec(left))) {
            Ok(_) if !fds[0].revents().is_empty() => return Ok(()),
            Ok(_) | Err(Errno::INTR) if left.is_zero() => return Err(Failure::Deadline),
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Sleeps for `pause`, waking early (with the reason) if `abort` fires.
pub(super) fn pause(pause: Duration, abort: Option<&AbortSignal>) -> Result<(), Error> {
    let Some(signal) = abort else {
        std::thread::sleep(pause);
        return Ok(());
    };
    let until = Instant::now() + pause;
    let fd = signal.fd();
    while let Some(left) = until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
        signal.check()?;
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        let _ = poll(&mut fds, Some(&timespec(left)));
    }
    signal.check()
}

fn timespec(d: Duration) -> Timespec {
    // Waits are re-armed in a loop, so capping a huge one loses nothing.
    Timespec::try_from(d.min(Duration::from_secs(86_400))).expect("a day fits a timespec")
}
