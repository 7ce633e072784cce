//! RDMA links between ranks on different hosts (feature `rdma`), set up
//! through the store.
//!
//! After rendezvous and shared memory, every rank that still has TCP links
//! opens its RDMA device (`RINGLEADER_RDMA_DEVICE` names one; the software
//! model `model` serves tests whose ranks are threads of one process),
//! creates one queue pair per remote peer and stream, posts its receives,
//! and publishes the endpoints at [`keys::rdma`] (or why it has no device).
//! Each pair whose two ranks both published endpoints connects its queue
//! pairs, exchanges an empty frame over TCP (so both ends are ready to
//! send before the first RDMA message), and replaces its TCP links; the
//! others keep TCP.
//!
//! `RINGLEADER_TRANSPORT=auto` without a device logs one line and keeps
//! TCP; `rdma` without a device on any rank is an `invalid-argument` error
//! that names the rank and the reason.

use crate::rendezvous::PeerInfo;
use ringleader_core::{AbortSignal, Config, Error, Rank, Result, TransportKind};
use ringleader_store::{keys, StoreClient};
use ringleader_transport::link::Wake;
use ringleader_transport::plane::{handshake, Plane};
use ringleader_transport::rdma::{self, Endpoint, LinkParams, RdmaLink};
use ringleader_transport::AnyLink;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What a rank publishes at [`keys::rdma`].
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Published {
    /// The device, or why there is none.
    device: std::result::Result<String, String>,
    /// Per peer rank: one endpoint per stream, in wire form.
    endpoints: BTreeMap<Rank, Vec<String>>,
}

/// The data plane's name once RDMA took the pairs it could.
fn plane_name(plane: Plane, all_remote_on_rdma: bool) -> &'static str {
    match (plane, all_remote_on_rdma) {
        (Plane::Tcp, true) => "rdma",
        (Plane::Tcp, false) => "rdma+tcp",
        (_, true) => "shm+rdma",
        (_, false) => "shm+rdma+tcp",
    }
}

/// Replaces the TCP links to every peer that can use RDMA. Returns the new
/// name of the data plane, or `None` when nothing changed.
pub(crate) fn attach(
    cfg: &Config,
    peers: &[PeerInfo],
    links: &mut [Vec<AnyLink>],
    store: &mut StoreClient,
    abort: &AbortSignal,
    plane: Plane,
) -> Result<Option<&'static str>> {
    if cfg.transport == TransportKind::Tcp || cfg.transport == TransportKind::Shm {
        return Ok(None);
    }
    let remote: Vec<Rank> =
        (0..links.len()).filter(|&p| links[p].first().is_some_and(|l| !matches!(l.wake(), Wake::Doorbell))).collect();
    if remote.is_empty() {
        return Ok(None);
    }
    let streams = links[remote[0]].len();
    let name = std::env::var("RINGLEADER_RDMA_DEVICE").ok().filter(|n| !n.is_empty());
    let params = LinkParams::default();
    let mut mine: BTreeMap<Rank, Vec<RdmaLink>> = BTreeMap::new();
    let device = match rdma::open(name.as_deref()) {
        Ok(dev) => {
            for &p in &remote {
                let mut v = Vec::with_capacity(streams);
                for _ in 0..streams {
                    let qp = dev.create_qp(params.slots, params.chunk).map_err(|e| rdma_error(cfg, &dev.name(), e))?;
                    v.push(RdmaLink::new(qp, p, params).map_err(|e| rdma_error(cfg, &dev.name(), e))?);
                }
                mine.insert(p, v);
            }
            Ok(dev.name())
        }
        Err(why) if cfg.transport == TransportKind::Rdma => {
            return Err(Error::invalid(
                "RINGLEADER_TRANSPORT",
                format!("rdma was asked for, but rank {} has no usable RDMA device: {why}; use auto or tcp", cfg.rank),
            ))
        }
        Err(why) => Err(why.0),
    };
    let endpoints = mine.iter().map(|(p, v)| (*p, v.iter().map(|l| l.endpoint().to_wire()).collect())).collect();
    let published = Published { device: device.clone(), endpoints };
    store.set(&keys::rdma(cfg.rank), &serde_json::to_vec(&published).unwrap_or_default())?;
    if let Err(why) = &device {
        tracing::info!(rank = cfg.rank, "RDMA: not used ({why}); the data plane stays on TCP/shared memory");
        return Ok(None);
    }
    let deadline = Instant::now() + cfg.init_timeout.min(Duration::from_secs(60));
    let mut connected = Vec::new();
    for &p in &remote {
        let left = deadline.saturating_duration_since(Instant::now());
        let raw = store.get(&keys::rdma(p), left)?;
        let theirs: Published = serde_json::from_slice(&raw).map_err(|e| Error::PeerProtocol {
            peer: p,
            detail: format!("unreadable RDMA endpoints at the store: {e}"),
        })?;
        let wires = match (&theirs.device, theirs.endpoints.get(&cfg.rank)) {
            (Ok(_), Some(w)) if w.len() == streams => w,
            (Err(why), _) if cfg.transport == TransportKind::Rdma => {
                return Err(Error::invalid(
                    "RINGLEADER_TRANSPORT",
                    format!(
                        "rdma was asked for, but rank {p} ({}) has no usable RDMA device: {why}; use auto or tcp",
                        peers[p].host
                    ),
                ))
            }
            (Err(why), _) => {
                tracing::info!(rank = cfg.rank, peer = p, "RDMA: rank {p} has none ({why}); this pair stays on TCP");
                continue;
            }
            _ => {
                return Err(Error::ScheduleMismatch {
                    peer: p,
                    op: ringleader_core::OpKind::Barrier,
                    seq: 0,
                    detail: format!(
                        "it published RDMA endpoints for {} streams to rank {}",
                        theirs.endpoints.get(&cfg.rank).map_or(0, Vec::len),
                        cfg.rank
                    ),
                })
            }
        };
        let ours = mine.get_mut(&p).expect("a queue pair per remote peer");
        for (link, wire) in ours.iter_mut().zip(wires) {
            let ep = Endpoint::from_wire(wire)
                .ok_or_else(|| Error::PeerProtocol { peer: p, detail: format!("malformed RDMA endpoint {wire:?}") })?;
            link.connect(&ep).map_err(|e| Error::DataPortUnreachable {
                src: cfg.rank,
                dst: p,
                addr: format!("RDMA queue pair {:#x} on {}", ep.qpn, theirs.device.clone().unwrap_or_default()),
                detail: format!("connecting the queue pair failed: {e}"),
            })?;
        }
        connected.push(p);
    }
    // Both ends of every connected pair are ready to send once this frame
    // went each way over TCP.
    handshake(cfg.rank, &connected, links, deadline, abort)?;
    for p in &connected {
        links[*p] = mine.remove(p).unwrap_or_default().into_iter().map(|l| Box::new(l) as AnyLink).collect();
    }
    tracing::debug!(rank = cfg.rank, peers = ?connected, device = ?device, "RDMA links up");
    if connected.is_empty() {
        return Ok(None);
    }
    Ok(Some(plane_name(plane, connected.len() == remote.len())))
}

fn rdma_error(cfg: &Config, device: &str, e: std::io::Error) -> Error {
    Error::invalid("RDMA device", format!("rank {} cannot create a queue pair on {device}: {e}", cfg.rank))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plane_names_say_what_carries_the_data() {
        assert_eq!(plane_name(Plane::Tcp, true), "rdma");
        assert_eq!(plane_name(Plane::Mixed, true), "shm+rdma");
        assert_eq!(plane_name(Plane::Tcp, false), "rdma+tcp");
    }

    #[test]
    fn published_records_round_trip() {
        let p = Published { device: Err("no RDMA device found".into()), endpoints: BTreeMap::new() };
        let back: Published = serde_json::from_slice(&serde_json::to_vec(&p).unwrap()).unwrap();
        assert_eq!(back.device, Err("no RDMA device found".into()));
    }
}
