//! Shared memory for ranks on the same host.
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

use crate::rendezvous::PeerInfo;
use ringleader_core::{AbortSignal, Config, DType, Error, Fingerprint, OpKind, Rank, Result, TransportKind};
use ringleader_transport::shm::{segment_name, Domain, Waiter};
use ringleader_transport::{AnyLink, Driver, Idle};
use ringleader_transport::{Buf, Chan, OpInfo, Plan, RecvMode, Region, Watch};
use std::time::{Duration, Instant};

/// What the data plane ended up made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plane {
    Tcp,
    Shm,
    Mixed,
}

impl Plane {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Plane::Tcp => "tcp",
            Plane::Shm => "shm",
            Plane::Mixed => "shm+tcp",
        }
    }
}

/// The ranks that share `me`'s host and kernel, `me` included.
fn local_ranks(peers: &[PeerInfo], me: Rank) -> Vec<Rank> {
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
pub(crate) fn attach(
    cfg: &Config,
    peers: &[PeerInfo],
    links: &mut [Vec<AnyLink>],
    streams: usize,
    driver: &mut Driver,
    abort: &AbortSignal,
) -> Result<(Plane, Option<Waiter>)> {
    let local = local_ranks(peers, cfg.rank);
    driver.set_idle(Idle::for_local_ranks(local.len()));
    driver.set_splice_min(cfg.tcp_splice);
    match cfg.transport {
        TransportKind::Tcp => return Ok((Plane::Tcp, None)),
        // Every link goes over RDMA (`crate::rdma` replaces them after this).
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
pub(crate) fn handshake(
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
    let watch = Watch { abort, deadline: Some(deadline), awaited: &ringleader_core::RankSet::new(0) };
    Driver::new().run(links, &mut [Buf::Rw(&mut [])], &plan, &op, &watch)
}
