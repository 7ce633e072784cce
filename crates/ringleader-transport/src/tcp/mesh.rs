//! The full mesh of connections at init: lower ranks accept, higher ranks
//! connect, every pair at once on one thread, each proved by a hello.

use super::link::TcpLink;
use super::listen::{set_buffers, DataListener};
use crate::hello::{Challenge, Hello, Reply};
use crate::link::AnyLink;
use ringleader_core::{error::Unreachable, AbortSignal, Error, Rank, Result};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fd::AsFd;
use rustix::net::{RecvFlags, SendFlags};
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Refused strangers named in a mesh error, at most.
pub(super) const MAX_STRANGERS_NOTED: usize = 4;

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

pub(super) enum Pending {
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

pub(super) struct MeshBuilder<'a> {
    pub(super) listener: DataListener,
    pub(super) opts: &'a MeshOptions,
    pub(super) pending: Vec<Pending>,
    pub(super) links: Vec<Vec<Option<AnyLink>>>,
    pub(super) start: Instant,
    /// Refused connects to retry: (peer, stream, address, when).
    pub(super) refused: Vec<(Rank, u16, SocketAddr, Instant)>,
    /// Pairs given up on before the timeout (outbound errors other than a
    /// refusal, inbound links that broke while being set up).
    pub(super) failures: Vec<Unreachable>,
    /// Lower peers whose outbound connection failed for good.
    pub(super) failed_out: Vec<bool>,
    /// Connections refused for another run id or a wrong token: dropped
    /// (a stranger must not end the job's start), and named if the mesh
    /// then times out.
    pub(super) strangers: Vec<String>,
}

impl<'a> MeshBuilder<'a> {
    pub(super) fn new(listener: DataListener, addrs: &[String], opts: &'a MeshOptions) -> Result<MeshBuilder<'a>> {
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
    pub(super) fn fail(&mut self, src: Rank, dst: Rank, addr: String, detail: String) {
        if src == self.opts.rank {
            self.failed_out[dst] = true;
        }
        if !self.failures.iter().any(|f| f.src == src && f.dst == dst) {
            self.failures.push(Unreachable { src, dst, addr, detail });
        }
    }

    pub(super) fn start_connect(&mut self, peer: Rank, stream: u16, addr: SocketAddr) {
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
    pub(super) fn done(&self) -> bool {
        let me = self.opts.rank;
        self.links
            .iter()
            .enumerate()
            .all(|(p, s)| p == me || (p < me && self.failed_out[p]) || s.iter().all(|l| l.is_some()))
    }

    pub(super) fn run(mut self, abort: &AbortSignal) -> Result<Mesh> {
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

    pub(super) fn wait(&self, abort: &AbortSignal, until: Instant) -> Result<()> {
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

    pub(super) fn accept_all(&mut self) -> Result<()> {
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

    pub(super) fn retry_refused(&mut self) -> Result<()> {
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
    pub(super) fn advance(&mut self, p: Pending, progressed: &mut bool) -> Result<Option<Pending>> {
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

    pub(super) fn finish_out(
        &mut self,
        peer: Rank,
        stream: u16,
        sock: Socket,
        addr: SocketAddr,
        reply: Reply,
    ) -> Result<()> {
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

    pub(super) fn judge_in(&mut self, sock: TcpStream, challenge: Challenge, buf: Vec<u8>) -> Result<Option<Pending>> {
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
    pub(super) fn timeout_error(&self) -> Error {
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
    pub(super) fn unreachable_error(&self, more: Vec<Unreachable>) -> Error {
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

pub(super) fn libc_einprogress() -> i32 {
    rustix::io::Errno::INPROGRESS.raw_os_error()
}

pub(super) fn resolve(addr: &str) -> std::result::Result<SocketAddr, String> {
    addr.to_socket_addrs()
        .map_err(|e| format!("cannot resolve: {e}"))?
        .next()
        .ok_or_else(|| "resolves to no address".to_string())
}
