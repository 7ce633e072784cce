//! Rendezvous: from a configuration to a connected job.
//!
//! Rank 0 hosts the store unless a launcher already does. Every rank opens
//! its member connection (the one whose life stands for the rank's), listens
//! for data connections, registers its host, pid, version and data address,
//! and waits for every other rank's registration, checking on the way that
//! the registrations agree ([`validate`], sans-IO). Then the full mesh of
//! data connections is built, which doubles as the data-plane preflight: a
//! port that cannot be reached is named here, not discovered by a hang.

use crate::log;
use ringleader_core::{Config, Error, Member, Rank, Result};
use ringleader_store::{keys, ClientOptions, ServerOptions, StoreClient, StoreServer};
use ringleader_transport::{DataListener, ListenOptions, Mesh, MeshOptions};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// What each rank registers at the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PeerInfo {
    pub rank: Rank,
    pub world_size: usize,
    pub host: String,
    pub pid: u32,
    pub version: String,
    pub data_addr: String,
    /// Identifies the booted kernel: ranks with equal host and boot id share memory.
    pub boot_id: String,
}

impl PeerInfo {
    fn member(&self) -> Member {
        Member { rank: self.rank, host: self.host.clone(), pid: self.pid, world_size: self.world_size }
    }
}

/// A joined job: the store, the peers and the data connections.
pub(crate) struct Joined {
    pub server: Option<StoreServer>,
    pub member: StoreClient,
    pub aux: StoreClient,
    pub peers: Vec<PeerInfo>,
    pub mesh: Mesh,
    pub store_addr: String,
}

/// This host's name.
pub(crate) fn hostname() -> String {
    rustix::system::uname().nodename().to_string_lossy().into_owned()
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Client options for this rank's connections to the store.
pub(crate) fn client_options(cfg: &Config, connect_timeout: Duration) -> ClientOptions {
    let mut o = ClientOptions::new(cfg.run_id.clone());
    o.token = cfg.token.clone();
    o.library_version = cfg.advertised_version.clone();
    o.connect_timeout = connect_timeout;
    o.rank = Some(cfg.rank);
    o.world_size = Some(cfg.world_size);
    o
}

/// Runs the rendezvous for `cfg`, bounded by `cfg.init_timeout`.
pub(crate) fn join(cfg: &Config, abort: &ringleader_core::AbortSignal) -> Result<Joined> {
    let start = Instant::now();
    let deadline = start + cfg.init_timeout;
    let server = host_store_if_needed(cfg)?;
    let store_addr = cfg.store_endpoint();
    let mut member =
        StoreClient::connect(&store_addr, client_options(cfg, cfg.init_timeout).member(cfg.rank, cfg.world_size))?;
    let mut aux = StoreClient::connect(&store_addr, client_options(cfg, remaining(deadline)))?;
    let listener = DataListener::bind(&ListenOptions {
        ifname: cfg.ifname.clone(),
        port_range: cfg.port_range,
        store_endpoint: store_addr.clone(),
    })?;
    let me = PeerInfo {
        rank: cfg.rank,
        world_size: cfg.world_size,
        host: hostname(),
        pid: std::process::id(),
        version: cfg.advertised_version.clone(),
        data_addr: listener.addr().to_string(),
        boot_id: boot_id(),
    };
    aux.set(&keys::rank(cfg.rank), &serde_json::to_vec(&me).unwrap_or_default())?;
    let peers = wait_for_all(&mut aux, cfg, &me, deadline, abort)?;
    validate(&peers, cfg.rank)?;
    let addrs: Vec<String> = peers.iter().map(|p| p.data_addr.clone()).collect();
    let mesh = Mesh::establish(
        listener,
        &addrs,
        &MeshOptions {
            rank: cfg.rank,
            world: cfg.world_size,
            streams: cfg.streams,
            run_id: cfg.run_id.clone(),
            token: cfg.token.clone(),
            timeout: remaining(deadline).min(Duration::from_secs(30)).max(Duration::from_secs(1)),
        },
        abort,
    )?;
    // The member connection is the rank's life line from here on.
    let _ = member.heartbeat(&[]);
    Ok(Joined { server, member, aux, peers, mesh, store_addr })
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100))
}

fn host_store_if_needed(cfg: &Config) -> Result<Option<StoreServer>> {
    if cfg.rank != 0 || cfg.store_addr.is_some() {
        return Ok(None);
    }
    let mut opts = ServerOptions::new(cfg.run_id.clone());
    opts.token = cfg.token.clone();
    // Listen on every interface: MASTER_ADDR is how others reach us, which
    // need not be an address we can name here (NAT, containers).
    let server = StoreServer::bind(&format!("0.0.0.0:{}", cfg.master_port), opts)?;
    tracing::debug!(rank = 0, port = cfg.master_port, "hosting the store");
    Ok(Some(server))
}

/// Waits until every rank registered, failing early on conflicting
/// registrations and at the deadline with the ranks that never came.
fn wait_for_all(
    store: &mut StoreClient,
    cfg: &Config,
    me: &PeerInfo,
    deadline: Instant,
    abort: &ringleader_core::AbortSignal,
) -> Result<Vec<PeerInfo>> {
    let keys_owned: Vec<String> = (0..cfg.world_size).map(keys::rank).collect();
    let keys_ref: Vec<&str> = keys_owned.iter().map(String::as_str).collect();
    let start = Instant::now();
    let mut next_note = start + Duration::from_secs(10);
    loop {
        abort.check()?;
        let slice = remaining(deadline).min(Duration::from_secs(1));
        match store.wait(&keys_ref, slice) {
            Ok(()) => break,
            Err(Error::StoreTimeout { .. }) => {}
            Err(e) => return Err(e),
        }
        let present = registrations(store)?;
        check_conflicts(&present, me)?;
        let now = Instant::now();
        if now >= deadline {
            let joined: Vec<Member> =
                present.iter().filter(|p| p.rank < cfg.world_size).map(PeerInfo::member).collect();
            let missing = (0..cfg.world_size).filter(|r| !present.iter().any(|p| p.rank == *r)).collect();
            return Err(Error::RendezvousIncomplete {
                expected: cfg.world_size,
                joined,
                missing,
                waited: cfg.init_timeout,
            });
        }
        if now >= next_note {
            let missing: Vec<Rank> = (0..cfg.world_size).filter(|r| !present.iter().any(|p| p.rank == *r)).collect();
            log::warn(
                cfg.rank,
                &format!(
                    "still waiting for {} to join at the store {} ({:.0} s of RINGLEADER_INIT_TIMEOUT={:.0} s)",
                    ringleader_core::error::fmt_ranks(&missing),
                    store.addr(),
                    (now - start).as_secs_f64(),
                    cfg.init_timeout.as_secs_f64()
                ),
            );
            next_note = now + Duration::from_secs(30);
        }
    }
    let values = store.multi_get(&keys_ref, Duration::from_secs(5))?;
    let mut peers = Vec::with_capacity(values.len());
    for (r, v) in values.iter().enumerate() {
        let p: PeerInfo = serde_json::from_slice(v).map_err(|e| Error::VersionMismatch {
            detail: format!("rank {r}'s registration cannot be read ({e})"),
            versions: vec![],
        })?;
        peers.push(p);
    }
    let present = registrations(store)?;
    check_conflicts(&present, me)?;
    Ok(peers)
}

/// Every registration at the store now, including ranks outside our world.
fn registrations(store: &mut StoreClient) -> Result<Vec<PeerInfo>> {
    let names = store.keys_with_prefix(keys::RANK_PREFIX)?;
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    if refs.is_empty() {
        return Ok(Vec::new());
    }
    let values = store.multi_get(&refs, Duration::from_secs(5))?;
    let mut v: Vec<PeerInfo> = values.iter().filter_map(|b| serde_json::from_slice(b).ok()).collect();
    v.sort_by_key(|p| p.rank);
    Ok(v)
}

/// Registrations that contradict each other (world size) fail at once.
fn check_conflicts(present: &[PeerInfo], me: &PeerInfo) -> Result<()> {
    if present.iter().any(|p| p.world_size != me.world_size) {
        let mut claims: Vec<Member> = present.iter().map(PeerInfo::member).collect();
        if !claims.iter().any(|m| m.rank == me.rank && m.pid == me.pid) {
            claims.push(me.member());
        }
        claims.sort_by_key(|m| m.rank);
        return Err(Error::WorldSizeMismatch { claims });
    }
    Ok(())
}

/// Checks a complete set of registrations (`peers[r]` is rank r's): world
/// sizes and versions must agree.
pub(crate) fn validate(peers: &[PeerInfo], me: Rank) -> Result<()> {
    let Some(mine) = peers.get(me) else {
        return Err(Error::invalid("rank", format!("rank {me} missing from its own rendezvous")));
    };
    check_conflicts(peers, mine)?;
    if peers.iter().any(|p| p.version != mine.version) {
        return Err(Error::VersionMismatch {
            detail: "ranks run different ringleader versions".into(),
            versions: peers.iter().map(|p| (format!("rank {} ({})", p.rank, p.host), p.version.clone())).collect(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringleader_core::ErrorKind;

    fn info(rank: Rank, world: usize, version: &str) -> PeerInfo {
        PeerInfo {
            rank,
            world_size: world,
            host: format!("h{rank}"),
            pid: 100 + rank as u32,
            version: version.into(),
            data_addr: "127.0.0.1:1".into(),
            boot_id: "b".into(),
        }
    }

    #[test]
    fn agreeing_registrations_pass() {
        let peers: Vec<_> = (0..3).map(|r| info(r, 3, "1.0")).collect();
        validate(&peers, 1).unwrap();
    }

    #[test]
    fn world_size_disagreement_names_each_claim() {
        let peers = vec![info(0, 4, "1.0"), info(1, 4, "1.0"), info(2, 6, "1.0")];
        let e = validate(&peers, 0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WorldSizeMismatch);
        let s = e.to_string();
        assert!(s.contains("rank 2 (h2 pid 102) says 6"), "{s}");
        assert!(s.contains("rank 0 (h0 pid 100) says 4"), "{s}");
    }

    #[test]
    fn version_disagreement_lists_versions() {
        let peers = vec![info(0, 2, "1.0"), info(1, 2, "9.9")];
        let e = validate(&peers, 0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::VersionMismatch);
        assert!(e.to_string().contains("rank 1 (h1) runs 9.9"), "{e}");
    }
}
