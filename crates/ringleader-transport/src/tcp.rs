//! TCP: choosing the address to listen on, building the full mesh of
//! connections at init, and the nonblocking socket behind a TCP [`Link`].
//!
//! Every rank listens before it registers at the store, so by the time a
//! peer learns our address the listener exists: a refused connection then
//! means a wrong address or a firewall, never a race. Lower ranks accept,
//! higher ranks connect, all pairs at once on one thread, so a blocked port
//! costs one connect timeout, not one per peer.

use crate::hello::{Challenge, Hello, Reply};
use crate::link::{AnyLink, Link, ReadOutcome, Splice, Wake};
use ringleader_core::{config::join_host_port, error::Unreachable, AbortSignal, Error, Rank, Result};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{RecvFlags, SendFlags};
use rustix::pipe::{
    fcntl_getpipe_size, fcntl_setpipe_size, pipe_with, splice, vmsplice, IoSliceRaw, PipeFlags, SpliceFlags,
};
use socket2::{Domain, Protocol, Socket, Type};
use std::io::{self, IoSlice};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant};

/// Socket buffer size asked for on data connections. Loopback and LAN
/// throughput need a few MiB in flight.
const SOCKET_BUFFER: usize = 4 << 20;
/// Refused strangers named in a mesh error, at most.
const MAX_STRANGERS_NOTED: usize = 4;

/// Bytes of the pipe that [`TcpLink::try_splice`] moves pages through (the
/// kernel's default limit for unprivileged processes).
const PIPE_SIZE: usize = 1 << 20;

/// A nonblocking TCP connection to one peer.
#[derive(Debug)]
pub struct TcpLink {
    stream: TcpStream,
    peer: Rank,
    /// The pipe of [`TcpLink::try_splice`], made on first use: (read end,
    /// write end, capacity); `None` inside when the kernel refused one.
    pipe: Option<Option<(OwnedFd, OwnedFd, usize)>>,
    /// Bytes spliced into the pipe but not yet into the socket: the first
    /// bytes of what the next `try_splice` is given.
    in_pipe: usize,
}

impl TcpLink {
    fn new(stream: TcpStream, peer: Rank) -> io::Result<TcpLink> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        Ok(TcpLink { stream, peer, pipe: None, in_pipe: 0 })
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

    /// Reads without blocking.
    #[inline]
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<ReadOutcome> {
        if buf.is_empty() {
            return Ok(ReadOutcome::WouldBlock);
        }
        match rustix::net::recv(&self.stream, buf, RecvFlags::DONTWAIT) {
            Ok((_, 0)) => Ok(ReadOutcome::Closed),
            Ok((_, n)) => Ok(ReadOutcome::Data(n)),
            Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => Ok(ReadOutcome::WouldBlock),
            Err(e) => Err(e.into()),
        }
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

    fn splice(&mut self) -> Option<&mut dyn Splice> {
        Some(self)
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

/// Two connected links over loopback, for tests: (rank 0's link to rank 1,
/// rank 1's link to rank 0).
#[cfg(test)]
pub(crate) fn test_pair() -> (TcpLink, TcpLink) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    (TcpLink::new(a, 1).unwrap(), TcpLink::new(b, 0).unwrap())
}

/// A nonblocking pipe of [`PIPE_SIZE`] (or what the kernel grants), where
/// splicing is safe: `splice(2)` into a socket whose peer is gone raises
/// SIGPIPE (it has no MSG_NOSIGNAL), which would kill a process that left
/// the signal at its default. Rust programs and Python ignore it; a C
/// program that does not gets the copying path.
fn make_pipe() -> Option<(OwnedFd, OwnedFd, usize)> {
    if sigpipe_kills() {
        return None;
    }
    let (rd, wr) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK).ok()?;
    let cap = fcntl_setpipe_size(&wr, PIPE_SIZE).or_else(|_| fcntl_getpipe_size(&wr)).ok()?;
    Some((rd, wr, cap))
}

/// Whether SIGPIPE is at its default disposition (terminate).
#[allow(unsafe_code)]
fn sigpipe_kills() -> bool {
    // SAFETY: a query only (no new action); `old` is a plain C struct that
    // the kernel fills.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut old) != 0 || old.sa_sigaction == libc::SIG_DFL
    }
}

/// Where and how to listen for data connections.
#[derive(Debug, Clone, Default)]
pub struct ListenOptions {
    /// Interface name or prefix (`RINGLEADER_IFNAME`).
    pub ifname: Option<String>,
    /// Inclusive port range (`RINGLEADER_PORT_RANGE`); any free port when `None`.
    pub port_range: Option<(u16, u16)>,
    /// `host:port` of the store; without an interface name we listen on the
    /// address the kernel would use to reach it.
    pub store_endpoint: String,
}

/// A bound listener and the address peers should dial.
#[derive(Debug)]
pub struct DataListener {
    listener: TcpListener,
    addr: SocketAddr,
}

impl DataListener {
    /// Binds per `opts`.
    ///
    /// ```
    /// use ringleader_transport::tcp::{DataListener, ListenOptions};
    /// let l = DataListener::bind(&ListenOptions { store_endpoint: "127.0.0.1:1".into(), ..Default::default() }).unwrap();
    /// assert!(l.addr().ip().is_loopback());
    /// ```
    pub fn bind(opts: &ListenOptions) -> Result<DataListener> {
        let ip = choose_ip(opts)?;
        let (lo, hi) = opts.port_range.unwrap_or((0, 0));
        let mut last = None;
        for port in lo..=hi {
            match listen_on(SocketAddr::new(ip, port)) {
                Ok(listener) => {
                    let addr = listener
                        .local_addr()
                        .map_err(|e| Error::invalid("RINGLEADER_IFNAME", format!("listener on {ip}: {e}")))?;
                    return Ok(DataListener { listener, addr });
                }
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
                Err(e) => {
                    return Err(Error::invalid(
                        "RINGLEADER_IFNAME",
                        format!("cannot listen on {}: {e}", SocketAddr::new(ip, port)),
                    ))
                }
            }
        }
        let range = format!("{lo}-{hi}");
        Err(Error::PortInUse {
            addr: join_host_port(&ip.to_string(), lo)
                + &format!(
                    " (every port of RINGLEADER_PORT_RANGE {range}: {})",
                    last.map(|e| e.to_string()).unwrap_or_default()
                ),
            holder: None,
        })
    }

    /// The address peers dial.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Sizes the socket buffers. Set before `listen`/`connect` so that window
/// scaling is negotiated for them.
fn set_buffers(s: &Socket) {
    let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = s.set_send_buffer_size(SOCKET_BUFFER);
}

fn listen_on(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM.cloexec(), Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    // Buffers must be sized before listen() for accepted sockets to inherit
    // them with window scaling.
    set_buffers(&s);
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(s.into())
}

/// The local IP to listen on: by interface name, else the source address the
/// kernel picks toward the store.
fn choose_ip(opts: &ListenOptions) -> Result<IpAddr> {
    if let Some(name) = &opts.ifname {
        return ip_of_interface(name);
    }
    let target = opts.store_endpoint.to_socket_addrs().ok().and_then(|mut a| a.find(|a| a.is_ipv4()));
    if let Some(target) = target {
        if target.ip().is_loopback() {
            return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        // connect() on UDP sends nothing; it only asks the routing table.
        if let Ok(u) = UdpSocket::bind("0.0.0.0:0") {
            if u.connect(target).is_ok() {
                if let Ok(local) = u.local_addr() {
                    return Ok(local.ip());
                }
            }
        }
    }
    Ok(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// The IPv4 address of the interface named `name`, or of the first whose
/// name starts with it (as NCCL_SOCKET_IFNAME does).
///
/// ```
/// let ip = ringleader_transport::tcp::ip_of_interface("lo").unwrap();
/// assert!(ip.is_loopback());
/// ```
pub fn ip_of_interface(name: &str) -> Result<IpAddr> {
    let ifs = if_addrs::get_if_addrs()
        .map_err(|e| Error::invalid("RINGLEADER_IFNAME", format!("cannot list interfaces: {e}")))?;
    let pick = |exact: bool| {
        ifs.iter()
            .filter(|i| i.ip().is_ipv4())
            .find(|i| if exact { i.name == name } else { i.name.starts_with(name) })
            .map(|i| i.ip())
    };
    pick(true).or_else(|| pick(false)).ok_or_else(|| {
        let mut names: Vec<_> =
            ifs.iter().filter(|i| i.ip().is_ipv4()).map(|i| format!("{} ({})", i.name, i.ip())).collect();
        names.dedup();
        Error::invalid(
            "RINGLEADER_IFNAME",
            format!("no IPv4 interface named {name:?} or starting with it; this host has {}", names.join(", ")),
        )
    })
}

/// Who we are and whom we trust, for building the mesh.
#[derive(Debug, Clone)]
pub struct MeshOptions {
    /// This rank.
    pub rank: Rank,
    /// The world size.
    pub world: usize,
    /// Streams per pair of ranks.
    pub streams: usize,
    /// The job's run id.
    pub run_id: String,
    /// The job's shared secret.
    pub token: Option<String>,
    /// Give up connecting after this long.
    pub timeout: Duration,
}

/// Connections to every peer: `links[peer][stream]` (empty for ourselves).
#[derive(Debug)]
pub struct Mesh {
    /// Indexed by peer rank, then stream.
    pub links: Vec<Vec<AnyLink>>,
}

enum Pending {
    /// Outbound: connect in progress, then the acceptor's challenge in
    /// (`got`), then the hello out (made once the challenge is complete),
    /// then the reply in.
    Out {
        peer: Rank,
        stream: u16,
        sock: Socket,
        addr: SocketAddr,
        got: Vec<u8>,
        hello: Vec<u8>,
        sent: usize,
        connected: bool,
    },
    /// Inbound: accepted, the challenge going out, then the hello being read.
    In { sock: TcpStream, challenge: Challenge, sent: usize, buf: Vec<u8> },
}

impl Mesh {
    /// Builds the full mesh: connects to every lower rank at `addrs[peer]`
    /// and accepts every higher rank on `listener`, all pairs concurrently.
    ///
    /// Errors name both ranks and the address: connections that cannot be
    /// made are one [`Error::DataPortsUnreachable`] listing every pair this
    /// rank is part of (it keeps trying the other pairs until they are made
    /// or the timeout ends, so the list is complete); a peer of another run
    /// is `foreign-run`, a peer without the token `auth-failed`.
    pub fn establish(
        listener: DataListener,
        addrs: &[String],
        opts: &MeshOptions,
        abort: &AbortSignal,
    ) -> Result<Mesh> {
        MeshBuilder::new(listener, addrs, opts)?.run(abort)
    }
}

struct MeshBuilder<'a> {
    listener: DataListener,
    opts: &'a MeshOptions,
    pending: Vec<Pending>,
    links: Vec<Vec<Option<AnyLink>>>,
    start: Instant,
    /// Refused connects to retry: (peer, stream, address, when).
    refused: Vec<(Rank, u16, SocketAddr, Instant)>,
    /// Pairs given up on before the timeout (outbound errors other than a
    /// refusal, inbound links that broke while being set up).
    failures: Vec<Unreachable>,
    /// Lower peers whose outbound connection failed for good.
    failed_out: Vec<bool>,
    /// Connections refused for another run id or a wrong token: dropped
    /// (a stranger must not end the job's start), and named if the mesh
    /// then times out.
    strangers: Vec<String>,
}

impl<'a> MeshBuilder<'a> {
    fn new(listener: DataListener, addrs: &[String], opts: &'a MeshOptions) -> Result<MeshBuilder<'a>> {
        listener.listener.set_nonblocking(true).map_err(|e| Error::invalid("data listener", e.to_string()))?;
        let mut b = MeshBuilder {
            listener,
            opts,
            pending: Vec::new(),
            links: (0..opts.world).map(|_| (0..opts.streams).map(|_| None).collect()).collect(),
            start: Instant::now(),
            refused: Vec::new(),
            failures: Vec::new(),
            failed_out: vec![false; opts.world],
            strangers: Vec::new(),
        };
        for peer in 0..opts.rank {
            let addr = match resolve(&addrs[peer]) {
                Ok(a) => a,
                Err(detail) => {
                    b.fail(opts.rank, peer, addrs[peer].clone(), detail);
                    continue;
                }
            };
            for stream in 0..opts.streams {
                b.start_connect(peer, stream as u16, addr);
            }
        }
        Ok(b)
    }

    /// Gives up on the pair `src` -> `dst` (one entry per pair, whatever
    /// the number of streams).
    fn fail(&mut self, src: Rank, dst: Rank, addr: String, detail: String) {
        if src == self.opts.rank {
            self.failed_out[dst] = true;
        }
        if !self.failures.iter().any(|f| f.src == src && f.dst == dst) {
            self.failures.push(Unreachable { src, dst, addr, detail });
        }
    }

    fn start_connect(&mut self, peer: Rank, stream: u16, addr: SocketAddr) {
        let o = self.opts;
        let sock = match Socket::new(Domain::for_address(addr), Type::STREAM.cloexec(), Some(Protocol::TCP)) {
            Ok(s) => s,
            Err(e) => return self.fail(o.rank, peer, addr.to_string(), e.to_string()),
        };
        set_buffers(&sock);
        if let Err(e) = sock.set_nonblocking(true) {
            return self.fail(o.rank, peer, addr.to_string(), e.to_string());
        }
        let connected = match sock.connect(&addr.into()) {
            Ok(()) => true,
            Err(e) if e.raw_os_error() == Some(libc_einprogress()) || e.kind() == io::ErrorKind::WouldBlock => false,
            Err(e) => return self.fail(o.rank, peer, addr.to_string(), e.to_string()),
        };
        self.pending.push(Pending::Out {
            peer,
            stream,
            sock,
            addr,
            got: Vec::new(),
            hello: Vec::new(),
            sent: 0,
            connected,
        });
    }

    /// Every outbound pair is made or given up on, and every inbound one made.
    fn done(&self) -> bool {
        let me = self.opts.rank;
        self.links
            .iter()
            .enumerate()
            .all(|(p, s)| p == me || (p < me && self.failed_out[p]) || s.iter().all(|l| l.is_some()))
    }

    fn run(mut self, abort: &AbortSignal) -> Result<Mesh> {
        let deadline = self.start + self.opts.timeout;
        while !self.done() {
            abort.check()?;
            self.retry_refused()?;
            self.accept_all()?;
            let mut progressed = false;
            let pending = std::mem::take(&mut self.pending);
            for p in pending {
                if let Some(p) = self.advance(p, &mut progressed)? {
                    self.pending.push(p);
                }
            }
            if self.done() {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.timeout_error());
            }
            if !progressed {
                self.wait(abort, deadline.min(now + Duration::from_millis(50)))?;
            }
        }
        if !self.failures.is_empty() {
            match self.unreachable_error(Vec::new()) {
                // Every pair given up on was made after all (another stream).
                Error::DataPortsUnreachable { pairs, .. } if pairs.is_empty() => {}
                e => return Err(e),
            }
        }
        let links = self.links.into_iter().map(|s| s.into_iter().flatten().collect()).collect();
        Ok(Mesh { links })
    }

    fn wait(&self, abort: &AbortSignal, until: Instant) -> Result<()> {
        let mut fds: Vec<PollFd<'_>> = vec![
            PollFd::from_borrowed_fd(abort.fd(), PollFlags::IN),
            PollFd::from_borrowed_fd(self.listener.listener.as_fd(), PollFlags::IN),
        ];
        for p in &self.pending {
            match p {
                Pending::Out { sock, sent, hello, connected, .. } => {
                    let want = if !connected || (!hello.is_empty() && sent < &hello.len()) {
                        PollFlags::OUT
                    } else {
                        PollFlags::IN
                    };
                    fds.push(PollFd::from_borrowed_fd(sock.as_fd(), want));
                }
                Pending::In { sock, sent, .. } => {
                    let want = if *sent < Challenge::LEN { PollFlags::OUT } else { PollFlags::IN };
                    fds.push(PollFd::from_borrowed_fd(sock.as_fd(), want));
                }
            }
        }
        let left = until.saturating_duration_since(Instant::now());
        let ts = Timespec { tv_sec: left.as_secs() as i64, tv_nsec: left.subsec_nanos() as i64 };
        let _ = poll(&mut fds, Some(&ts));
        Ok(())
    }

    fn accept_all(&mut self) -> Result<()> {
        loop {
            match self.listener.listener.accept() {
                Ok((sock, _)) => {
                    let _ = sock.set_nonblocking(true);
                    // A connection we cannot challenge is dropped; its
                    // connector retries or reports the pair.
                    if let Ok(challenge) = Challenge::fresh() {
                        self.pending.push(Pending::In { sock, challenge, sent: 0, buf: Vec::new() });
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Transient accept errors (EMFILE, ECONNABORTED): try again on the next round.
                Err(_) => return Ok(()),
            }
        }
    }

    fn retry_refused(&mut self) -> Result<()> {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.refused).into_iter().partition(|r| r.3 <= now);
        self.refused = later;
        for (peer, stream, addr, _) in due {
            if !self.failed_out[peer] {
                self.start_connect(peer, stream, addr);
            }
        }
        Ok(())
    }

    /// Moves one pending connection forward; returns it if still pending.
    fn advance(&mut self, p: Pending, progressed: &mut bool) -> Result<Option<Pending>> {
        match p {
            Pending::Out { peer, stream, sock, addr, mut got, mut hello, mut sent, mut connected } => {
                let o = self.opts;
                if self.failed_out[peer] {
                    return Ok(None);
                }
                if !connected {
                    match sock.take_error() {
                        Ok(Some(e))
                            if e.kind() == io::ErrorKind::ConnectionRefused
                                && Instant::now() < self.start + o.timeout =>
                        {
                            // The peer listens before it registers, so a refusal
                            // is not a startup race; it is retried until the
                            // timeout anyway, in case a SYN met a full backlog.
                            self.refused.push((peer, stream, addr, Instant::now() + Duration::from_millis(50)));
                            return Ok(None);
                        }
                        Ok(Some(e)) | Err(e) => {
                            self.fail(o.rank, peer, addr.to_string(), e.to_string());
                            return Ok(None);
                        }
                        Ok(None) => {}
                    }
                    match sock.peer_addr() {
                        Ok(_) => {
                            connected = true;
                            *progressed = true;
                        }
                        Err(_) => {
                            return Ok(Some(Pending::Out { peer, stream, sock, addr, got, hello, sent, connected }));
                        }
                    }
                }
                if hello.is_empty() {
                    // The acceptor's challenge first: our MAC covers its nonce.
                    let mut chunk = [0u8; Challenge::LEN];
                    let want = Challenge::LEN - got.len();
                    match rustix::net::recv(&sock, &mut chunk[..want], RecvFlags::DONTWAIT) {
                        Ok((_, 0)) => {
                            let detail = "the peer closed the connection during the handshake".to_string();
                            self.fail(o.rank, peer, addr.to_string(), detail);
                            return Ok(None);
                        }
                        Ok((_, n)) => {
                            *progressed = true;
                            got.extend_from_slice(&chunk[..n]);
                        }
                        Err(rustix::io::Errno::AGAIN) => {}
                        Err(e) => {
                            self.fail(o.rank, peer, addr.to_string(), format!("waiting for the handshake: {e}"));
                            return Ok(None);
                        }
                    }
                    match Challenge::decode(&got) {
                        Ok(Some(c)) => {
                            hello = Hello::new(
                                &o.run_id,
                                o.rank as u32,
                                peer as u32,
                                stream,
                                o.world as u32,
                                o.token.as_deref(),
                                &c.nonce,
                            )
                            .encode();
                        }
                        Ok(None) => {
                            return Ok(Some(Pending::Out { peer, stream, sock, addr, got, hello, sent, connected }))
                        }
                        Err(_) => {
                            let detail = "what answers there is not a ringleader rank (no data-plane challenge)";
                            self.fail(o.rank, peer, addr.to_string(), detail.into());
                            return Ok(None);
                        }
                    }
                }
                if sent < hello.len() {
                    match rustix::net::send(&sock, &hello[sent..], SendFlags::NOSIGNAL | SendFlags::DONTWAIT) {
                        Ok(n) => {
                            sent += n;
                            *progressed = true;
                        }
                        Err(rustix::io::Errno::AGAIN) => {}
                        Err(e) => {
                            self.fail(o.rank, peer, addr.to_string(), format!("sending the handshake: {e}"));
                            return Ok(None);
                        }
                    }
                    return Ok(Some(Pending::Out { peer, stream, sock, addr, got, hello, sent, connected }));
                }
                let mut reply = [0u8; 1];
                match rustix::net::recv(&sock, &mut reply, RecvFlags::DONTWAIT) {
                    Ok((_, 1)) => {
                        *progressed = true;
                        self.finish_out(peer, stream, sock, addr, Reply::from_code(reply[0]))?;
                        Ok(None)
                    }
                    Ok(_) => {
                        let detail = "the peer closed the connection during the handshake".to_string();
                        self.fail(o.rank, peer, addr.to_string(), detail);
                        Ok(None)
                    }
                    Err(rustix::io::Errno::AGAIN) => {
                        Ok(Some(Pending::Out { peer, stream, sock, addr, got, hello, sent, connected }))
                    }
                    Err(e) => {
                        self.fail(o.rank, peer, addr.to_string(), format!("waiting for the handshake reply: {e}"));
                        Ok(None)
                    }
                }
            }
            Pending::In { sock, challenge, mut sent, mut buf } => {
                if sent < Challenge::LEN {
                    let bytes = challenge.encode();
                    match rustix::net::send(&sock, &bytes[sent..], SendFlags::NOSIGNAL | SendFlags::DONTWAIT) {
                        Ok(n) => {
                            *progressed = true;
                            sent += n;
                        }
                        Err(rustix::io::Errno::AGAIN) => {}
                        Err(_) => return Ok(None),
                    }
                    return Ok(Some(Pending::In { sock, challenge, sent, buf }));
                }
                let mut chunk = [0u8; 512];
                match rustix::net::recv(&sock, &mut chunk, RecvFlags::DONTWAIT) {
                    Ok((_, 0)) => {
                        *progressed = true;
                        Ok(None)
                    }
                    Ok((_, n)) => {
                        *progressed = true;
                        buf.extend_from_slice(&chunk[..n]);
                        self.judge_in(sock, challenge, buf)
                    }
                    Err(rustix::io::Errno::AGAIN) => Ok(Some(Pending::In { sock, challenge, sent, buf })),
                    Err(_) => Ok(None),
                }
            }
        }
    }

    fn finish_out(&mut self, peer: Rank, stream: u16, sock: Socket, addr: SocketAddr, reply: Reply) -> Result<()> {
        let o = self.opts;
        let addr_s = addr.to_string();
        match reply {
            Reply::Ok => {
                match TcpLink::new(sock.into(), peer) {
                    Ok(link) => self.links[peer][stream as usize] = Some(Box::new(link)),
                    Err(e) => self.fail(o.rank, peer, addr_s, e.to_string()),
                }
                Ok(())
            }
            Reply::ForeignRun => Err(Error::ForeignRun {
                addr: format!("rank {peer} at {addr_s}"),
                ours: o.run_id.clone(),
                theirs: "another run".into(),
            }),
            Reply::AuthFailed => Err(Error::AuthFailed {
                addr: format!("rank {peer} at {addr_s}"),
                detail: "the peer refused our token".into(),
            }),
            Reply::Version => Err(Error::VersionMismatch {
                detail: format!("rank {peer} at {addr_s} speaks another data-frame version"),
                versions: vec![],
            }),
            Reply::WrongPeer => {
                let detail = "a process that is not that rank (or has another world size) answered".to_string();
                self.fail(o.rank, peer, addr_s, detail);
                Ok(())
            }
        }
    }

    fn judge_in(&mut self, sock: TcpStream, challenge: Challenge, buf: Vec<u8>) -> Result<Option<Pending>> {
        let o = self.opts;
        let hello = match Hello::decode(&buf) {
            Ok(None) => return Ok(Some(Pending::In { sock, challenge, sent: Challenge::LEN, buf })),
            Ok(Some((h, _))) => h,
            // Not one of ours (a port scanner, a stale client): drop it.
            Err(_) => return Ok(None),
        };
        let reply = hello.judge(o.rank as u32, o.world as u32, &o.run_id, o.token.as_deref(), &challenge.nonce);
        let _ = rustix::net::send(&sock, &[reply.code()], SendFlags::NOSIGNAL);
        let (src, stream) = (hello.src as usize, hello.stream as usize);
        match reply {
            Reply::Ok if src > o.rank && stream < o.streams && self.links[src][stream].is_none() => {
                match TcpLink::new(sock, src) {
                    Ok(link) => self.links[src][stream] = Some(Box::new(link)),
                    Err(e) => self.fail(src, o.rank, self.listener.addr.to_string(), e.to_string()),
                }
                Ok(None)
            }
            // A stranger (another run, no token) is dropped, not obeyed: it
            // must not end this job's start. Its connector reads the refusal
            // and reports; our own rank names it only if the mesh then fails.
            Reply::ForeignRun | Reply::AuthFailed => {
                let from = sock.peer_addr().map_or("an unknown address".into(), |a| a.to_string());
                let why = match reply {
                    Reply::ForeignRun => format!("of another run ({:?})", hello.run_id),
                    _ => "without the job's token".to_string(),
                };
                let note = format!("refused a data connection from {from} claiming rank {src} {why}");
                tracing::warn!(rank = o.rank, "{note}");
                if self.strangers.len() < MAX_STRANGERS_NOTED && !self.strangers.contains(&note) {
                    self.strangers.push(note);
                }
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    /// Every pair still missing at the timeout, with what this rank saw of
    /// it, added to the pairs already given up on.
    fn timeout_error(&self) -> Error {
        let o = self.opts;
        let waited = o.timeout.as_secs_f64();
        let mut late = Vec::new();
        for (peer, _, addr, _) in &self.refused {
            let detail = "connection refused: nothing listens there (wrong address), or a firewall rejects it";
            late.push(Unreachable { src: o.rank, dst: *peer, addr: addr.to_string(), detail: detail.into() });
        }
        for p in &self.pending {
            if let Pending::Out { peer, addr, connected, .. } = p {
                let detail = if *connected {
                    format!("connected, but the handshake got no answer within {waited:.1} s")
                } else {
                    format!("no answer to connect within {waited:.1} s: packets dropped, by a firewall?")
                };
                late.push(Unreachable { src: o.rank, dst: *peer, addr: addr.to_string(), detail });
            }
        }
        for src in o.rank + 1..o.world {
            if self.links[src].iter().any(|l| l.is_none()) {
                let detail =
                    format!("seen from rank {}: no connection from rank {src} arrived within {waited:.1} s", o.rank);
                late.push(Unreachable { src, dst: o.rank, addr: self.listener.addr.to_string(), detail });
            }
        }
        self.unreachable_error(late)
    }

    /// One error for the pairs given up on and `more`, one entry per pair.
    fn unreachable_error(&self, more: Vec<Unreachable>) -> Error {
        let mut pairs: Vec<Unreachable> = Vec::new();
        for u in self.failures.iter().cloned().chain(more) {
            let missing_link = |p: Rank| self.links[p].iter().any(|l| l.is_none());
            let relevant = if u.src == self.opts.rank { missing_link(u.dst) } else { missing_link(u.src) };
            if relevant && !pairs.iter().any(|p| p.src == u.src && p.dst == u.dst) {
                pairs.push(u);
            }
        }
        pairs.sort_by_key(|p| (p.src, p.dst));
        let note = (!self.strangers.is_empty()).then(|| self.strangers.join("; "));
        Error::DataPortsUnreachable { pairs, note }
    }
}

fn libc_einprogress() -> i32 {
    rustix::io::Errno::INPROGRESS.raw_os_error()
}

fn resolve(addr: &str) -> std::result::Result<SocketAddr, String> {
    addr.to_socket_addrs()
        .map_err(|e| format!("cannot resolve: {e}"))?
        .next()
        .ok_or_else(|| "resolves to no address".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn closed_port() -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    }

    #[test]
    fn every_failing_pair_is_named_in_one_error() {
        // Rank 2 of 3: ranks 0 and 1 never listen, so both of its pairs fail,
        // and it keeps trying both until the timeout.
        let listener =
            DataListener::bind(&ListenOptions { store_endpoint: "127.0.0.1:1".into(), ..Default::default() }).unwrap();
        let addrs = [closed_port(), closed_port(), listener.addr().to_string()];
        let opts = MeshOptions {
            rank: 2,
            world: 3,
            streams: 2,
            run_id: "r".into(),
            token: None,
            timeout: Duration::from_millis(300),
        };
        let abort = AbortSignal::new().unwrap();
        let start = Instant::now();
        let e = Mesh::establish(listener, &addrs, &opts, &abort).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(2));
        let Error::DataPortsUnreachable { pairs, .. } = &e else { panic!("{e}") };
        assert_eq!(pairs.iter().map(|p| (p.src, p.dst)).collect::<Vec<_>>(), [(2, 0), (2, 1)], "one entry per pair");
        assert_eq!(pairs[1].addr, addrs[1]);
        assert!(pairs[0].detail.contains("refused"), "{e}");
        assert_eq!(e.ranks(), [0, 1, 2]);
    }

    /// Connects to `addr` as a stranger would: reads the challenge, sends
    /// `hello_for(nonce)`, returns the reply byte (None if none came).
    fn knock(addr: &str, hello_for: impl Fn(&[u8; crate::hello::NONCE_LEN]) -> Vec<u8>) -> Option<u8> {
        use std::io::{Read, Write};
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut c = [0u8; Challenge::LEN];
        s.read_exact(&mut c).ok()?;
        let nonce = Challenge::decode(&c).unwrap().unwrap().nonce;
        s.write_all(&hello_for(&nonce)).ok()?;
        let mut r = [0u8; 1];
        s.read_exact(&mut r).ok().map(|_| r[0])
    }

    #[test]
    fn strangers_and_replays_are_refused_without_ending_the_start() {
        // Rank 0 of 2 accepts; before the real rank 1 connects, a process of
        // another run, one without the token, and a replay of a hello made
        // for another connection's nonce all knock and are refused.
        let listener =
            DataListener::bind(&ListenOptions { store_endpoint: "127.0.0.1:1".into(), ..Default::default() }).unwrap();
        let addr = listener.addr().to_string();
        let opts = MeshOptions {
            rank: 0,
            world: 2,
            streams: 1,
            run_id: "job".into(),
            token: Some("secret".into()),
            timeout: Duration::from_secs(20),
        };
        let addrs = [addr.clone(), closed_port()];
        let acceptor = std::thread::spawn(move || {
            let opts = opts;
            Mesh::establish(listener, &addrs, &opts, &AbortSignal::new().unwrap())
        });
        let foreign = knock(&addr, |n| Hello::new("other-job", 1, 0, 0, 2, Some("secret"), n).encode());
        assert_eq!(foreign, Some(Reply::ForeignRun.code()));
        let no_token = knock(&addr, |n| Hello::new("job", 1, 0, 0, 2, None, n).encode());
        assert_eq!(no_token, Some(Reply::AuthFailed.code()));
        let recorded = Hello::new("job", 1, 0, 0, 2, Some("secret"), &[9u8; crate::hello::NONCE_LEN]).encode();
        let replay = knock(&addr, |_| recorded.clone());
        assert_eq!(replay, Some(Reply::AuthFailed.code()), "a hello made for another nonce");
        // The real rank 1 still gets in, and rank 0's mesh completes.
        let real = knock(&addr, |n| Hello::new("job", 1, 0, 0, 2, Some("secret"), n).encode());
        assert_eq!(real, Some(Reply::Ok.code()));
        let mesh = acceptor.join().unwrap().expect("the mesh completes despite the strangers");
        assert_eq!(mesh.links[1].len(), 1);
    }

    #[test]
    fn an_acceptor_names_the_ranks_that_never_connected() {
        let listener =
            DataListener::bind(&ListenOptions { store_endpoint: "127.0.0.1:1".into(), ..Default::default() }).unwrap();
        let me = listener.addr().to_string();
        let opts = MeshOptions {
            rank: 0,
            world: 2,
            streams: 1,
            run_id: "r".into(),
            token: None,
            timeout: Duration::from_millis(200),
        };
        let e =
            Mesh::establish(listener, &[me.clone(), closed_port()], &opts, &AbortSignal::new().unwrap()).unwrap_err();
        let s = e.to_string();
        assert!(s.contains(&format!("rank 1 cannot reach rank 0 at {me} (seen from rank 0: no connection")), "{s}");
    }
}
