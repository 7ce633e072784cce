//! Setting up the data plane over the TCP mesh: shared memory for the
//! ranks of one host, the handshake that tells a peer its new links are
//! ready (shared memory, RDMA), and the split of each pair's links into
//! the collectives' streams and the send/recv lane ([`Lanes`]).
//!
//! After rendezvous every rank knows where its peers run (host name and
//! kernel boot id). Ranks that share a host replace their TCP links with
//! rings in shared memory: each creates its segment, maps its local peers',
//! says so to each of them over the TCP link (an empty frame each way), and
//! only then unlinks its file, so nothing is left under /dev/shm whatever
//! happens later. Segments are allocated up front, after a check that
//! /dev/shm has room for every local rank's: a container's short /dev/shm
//! is an `invalid-argument` error on every rank of the host at init (naming
//! its size, what the job needs, and RINGLEADER_TRANSPORT=tcp or
//! `--shm-size`), never a SIGBUS in the middle of a transfer.
//!
//! The RDMA set-up (`src/rdma.rs` of the `ringleader` crate) exchanges
//! its queue-pair endpoints through the store, so it stays with the
//! runtime and calls [`handshake`] from there.

use crate::driver::{Deadline, Driver, Idle, Watch};
use crate::link::AnyLink;
use crate::plan::{Buf, Chan, OpInfo, Plan, RecvMode, Region};
use crate::shm::{segment_name, Domain, Waiter};
use ringleader_core::{AbortSignal, Config, DType, Error, Fingerprint, OpKind, Rank, Result, TransportKind};
use std::time::{Duration, Instant};

/// Where a rank runs, as set-up needs it: ranks with equal host and boot
/// id share memory.
#[derive(Debug, Clone, Copy)]
pub struct PeerHost<'a> {
    /// The rank.
    pub rank: Rank,
    /// Its host name.
    pub host: &'a str,
    /// Its booted kernel's id (empty when unknown: then it shares nothing).
    pub boot_id: &'a str,
    /// Its process id (names its shared-memory segment).
    pub pid: u32,
}

/// Each pair's links, split by use: `streams` links per peer for the
/// collectives (`collectives[peer][stream]`, what [`Driver::run`] takes)
/// and one for sends and receives (`send_recv[peer]`; `None` for this
/// rank itself).
#[derive(Debug)]
pub struct Lanes {
    /// The collectives' links.
    pub collectives: Vec<Vec<AnyLink>>,
    /// The send/recv lane's link to each peer.
    pub send_recv: Vec<Option<AnyLink>>,
}

impl Lanes {
    /// Splits a mesh built with one link per pair more than the
    /// collectives use: the last link of each pair is the send/recv lane.
    pub fn split(mut links: Vec<Vec<AnyLink>>) -> Lanes {
        let send_recv = links.iter_mut().map(Vec::pop).collect();
        Lanes { collectives: links, send_recv }
    }
}

/// What the data plane ended up made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    /// Every link is a socket.
    Tcp,
    /// Every link is shared memory (the whole job on one host).
    Shm,
    /// Shared memory to the ranks on this host, sockets to the others.
    Mixed,
}

impl Plane {
    /// The name logs and the perf header give it.
    pub fn name(self) -> &'static str {
        match self {
            Plane::Tcp => "tcp",
            Plane::Shm => "shm",
            Plane::Mixed => "shm+tcp",
        }
    }
}

/// The ranks that share `me`'s host and kernel, `me` included.
fn local_ranks(peers: &[PeerHost<'_>], me: Rank) -> Vec<Rank> {
    let mine = &peers[me];
    peers
        .iter()
        .filter(|p| !mine.boot_id.is_empty() && p.host == mine.host && p.boot_id == mine.boot_id)
        .map(|p| p.rank)
        .collect()
}

/// Replaces the TCP links to same-host peers (`streams` each) by shared
/// memory, as `RINGLEADER_TRANSPORT` allows; sets `driver` up to wait on it
/// and returns the doorbell waiter for other waits of this rank.
pub fn attach_shm(
    cfg: &Config,
    peers: &[PeerHost<'_>],
    links: &mut [Vec<AnyLink>],
    streams: usize,
    driver: &mut Driver,
    abort: &AbortSignal,
) -> Result<(Plane, Option<Waiter>)> {
    let local = local_ranks(peers, cfg.rank);
    driver.set_idle(Idle::for_local_ranks(local.len()));
    driver.set_local(cfg.rank, &local);
    driver.set_splice_min(cfg.tcp_splice);
    match cfg.transport {
        TransportKind::Tcp => return Ok((Plane::Tcp, None)),
        // Every link goes over RDMA (the runtime's RDMA set-up replaces them
        // after this).
        TransportKind::Rdma if cfg!(feature = "rdma") => return Ok((Plane::Tcp, None)),
        TransportKind::Rdma => {
            return Err(Error::invalid(
                "RINGLEADER_TRANSPORT",
                "rdma was asked for, but this build has no RDMA transport (built without the `rdma` cargo \
                 feature); use auto, tcp or shm",
            ))
        }
        TransportKind::Shm if local.len() < peers.len() => {
            let remote: Vec<String> = peers
                .iter()
                .filter(|p| !local.contains(&p.rank))
                .map(|p| format!("rank {} ({})", p.rank, p.host))
                .collect();
            return Err(Error::invalid(
                "RINGLEADER_TRANSPORT",
                format!("shm needs every rank on this host, but {} run elsewhere; use auto", remote.join(", ")),
            ));
        }
        _ => {}
    }
    if local.len() < 2 {
        return Ok((Plane::Tcp, None));
    }
    let deadline = Instant::now() + cfg.init_timeout.min(Duration::from_secs(30));
    let mut domain = Domain::create(&cfg.run_id, cfg.rank, cfg.world_size, &local, streams, cfg.shm_single_copy)?;
    for &p in local.iter().filter(|&&p| p != cfg.rank) {
        domain.open_peer(p, &segment_name(&cfg.run_id, p, peers[p].pid), deadline, abort)?;
    }
    handshake(cfg.rank, &local, links, deadline, abort)?;
    domain.unlink();
    let (shm_links, waiter) = domain.links();
    for (peer, l) in shm_links {
        links[peer] = l.into_iter().map(|l| Box::new(l) as AnyLink).collect();
    }
    waiter.wake_on(abort);
    driver.set_shm(waiter.clone(), Idle::for_local_ranks(local.len()));
    Ok((if local.len() == peers.len() { Plane::Shm } else { Plane::Mixed }, Some(waiter)))
}

/// An empty frame to and from every peer in `local` over TCP: once it has
/// arrived from a peer, that peer has mapped every segment it needs (or,
/// for RDMA, connected its queue pairs).
pub fn handshake(
    me: Rank,
    local: &[Rank],
    links: &mut [Vec<AnyLink>],
    deadline: Instant,
    abort: &AbortSignal,
) -> Result<()> {
    let mut plan = Plan::default();
    for &p in local.iter().filter(|&&p| p != me) {
        let chan = Chan { peer: p, stream: 0 };
        plan.send(chan, Region::new(0, 0, 0), None);
        plan.recv(chan, Region::new(0, 0, 0), RecvMode::Copy, None, None);
    }
    let op = OpInfo { seq: 0, fingerprint: Fingerprint::new(OpKind::Barrier, DType::U8, 0), checks: true };
    let watch =
        Watch { abort, deadline: Deadline::At(deadline), awaited: &ringleader_core::RankSet::new(0), under_way: None };
    Driver::new().run(links, &mut [Buf::Rw(&mut [])], &plan, &op, &watch)
}
