//! Rendezvous: from a configuration to a connected job.
//!
//! Rank 0 hosts the store unless a launcher already does. Every rank opens
//! its member connection (the one whose life stands for the rank's), listens
//! for data connections, registers its host, pid, version, data address and
//! how it resolved MASTER_ADDR, and waits for every other rank's
//! registration, checking on the way that the registrations agree
//! ([`validate`], sans-IO). A process the store refused as a duplicate rank
//! leaves a note ([`keys::conflict`]) so the ranks waiting for the rest of
//! the job fail with `duplicate-rank` too.
//!
//! Then the full mesh of data connections is built, which doubles as the
//! data-plane preflight: every rank publishes its outcome (the pairs it could
//! not connect, [`keys::mesh`]) and gathers the others', bounded, so a
//! blocked port is named here, by every rank alike ([`preflight_verdict`],
//! sans-IO), not discovered by a hang. The time left after the registrations
//! is split between building the mesh and gathering ([`split_mesh_time`]), so
//! the error comes within the init timeout.

use crate::log;
use ringleader_core::config::{join_host_port, AlgoChoice};
use ringleader_core::error::{fmt_ranks, Unreachable};
use ringleader_core::{Config, Error, ErrorKind, Member, Rank, Result};
use ringleader_store::{keys, ClientOptions, ServerOptions, StoreClient, StoreServer};
use ringleader_transport::{DataListener, ListenOptions, Mesh, MeshOptions};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

/// What each rank registers at the store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PeerInfo {
    pub rank: Rank,
    pub world_size: usize,
    pub host: String,
    pub pid: u32,
    pub version: String,
    pub data_addr: String,
    /// Identifies the booted kernel: ranks with equal host and boot id share memory.
    pub boot_id: String,
    /// MASTER_ADDR as this rank was given it.
    #[serde(default)]
    pub master_addr: String,
    /// The addresses MASTER_ADDR resolves to on this rank's host, sorted
    /// (empty when it does not resolve).
    #[serde(default)]
    pub master_ips: Vec<String>,
    /// This rank's `RINGLEADER_TRANSPORT` setting.
    #[serde(default)]
    pub transport: String,
    /// This rank's `RINGLEADER_ALGO` setting: `auto`, `ring` or `rd`.
    #[serde(default)]
    pub algo: String,
    /// This rank's `RINGLEADER_STREAMS` setting.
    #[serde(default)]
    pub streams: usize,
    /// Its pid namespace: a pid names the same process only within one.
    #[serde(default)]
    pub pid_ns: String,
}

impl PeerInfo {
    fn member(&self) -> Member {
        Member { rank: self.rank, host: self.host.clone(), pid: self.pid, world_size: self.world_size }
    }

    /// Whether both run on one host (same name, same booted kernel).
    pub(crate) fn same_host(&self, other: &PeerInfo) -> bool {
        self.host == other.host && self.boot_id == other.boot_id
    }
}

/// What a rank publishes after trying to build its mesh ([`keys::mesh`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MeshOutcome {
    pub rank: Rank,
    /// The pairs it could not connect (as connector or acceptor); empty on success.
    pub pairs: Vec<Unreachable>,
    /// A failure of another kind (`foreign-run`, `auth-failed`, ...), as its message.
    pub error: Option<String>,
}

impl MeshOutcome {
    fn of(rank: Rank, result: &Result<Mesh>) -> MeshOutcome {
        match result {
            Ok(_) => MeshOutcome { rank, pairs: Vec::new(), error: None },
            Err(Error::DataPortsUnreachable { pairs, .. }) => MeshOutcome { rank, pairs: pairs.clone(), error: None },
            Err(e) => MeshOutcome { rank, pairs: Vec::new(), error: Some(e.to_string()) },
        }
    }
}

/// A rank the store refused because another process holds it ([`keys::conflict`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Conflict {
    rank: Rank,
    first: String,
    second: String,
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

/// This process's pid namespace (`pid:[4026531836]`), empty where unknown:
/// peers compare it before they watch each other's pids.
pub(crate) fn pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid").map(|p| p.to_string_lossy().into_owned()).unwrap_or_default()
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

/// Runs the rendezvous for `cfg`, bounded by `cfg.init_timeout`, and
/// connects every pair of ranks with `links` TCP connections.
pub(crate) fn join(cfg: &Config, links: usize, abort: &ringleader_core::AbortSignal) -> Result<Joined> {
    let start = Instant::now();
    let deadline = start + cfg.init_timeout;
    // Rank 0's port may be taken by the store of another process started as
    // rank 0 of this very job: then joining that store as rank 0 names both
    // processes (duplicate-rank, on every rank); anything else holding the
    // port stays port-in-use.
    let (server, port_taken) = match host_store_if_needed(cfg) {
        Ok(s) => (s, None),
        Err(e @ Error::PortInUse { .. }) => (None, Some(e)),
        Err(e) => return Err(e),
    };
    let store_addr = cfg.store_endpoint();
    let mut member_opts = client_options(cfg, cfg.init_timeout).member(cfg.rank, cfg.world_size);
    if port_taken.is_some() {
        member_opts.connect_timeout = member_opts.connect_timeout.min(Duration::from_secs(2));
    }
    let mut member = match StoreClient::connect(&store_addr, member_opts) {
        Ok(m) => m,
        Err(e) => {
            record_conflict(cfg, &store_addr, &e);
            return Err(match (e, port_taken) {
                (e @ Error::DuplicateRank { .. }, _) => e,
                (_, Some(taken)) => taken,
                (e, None) => e,
            });
        }
    };
    if let Some(taken) = port_taken {
        // A store of this run that had no rank 0 yet: not ours to join as rank 0.
        drop(member);
        return Err(taken);
    }
    match register_and_connect(cfg, &store_addr, &mut member, links, deadline, abort) {
        Ok((aux, peers, mesh)) => Ok(Joined { server, member, aux, peers, mesh, store_addr }),
        Err(e) => {
            // This rank reports its own failure; leaving says so to the
            // store, which then does not warn of a rank that vanished.
            let _ = member.leave();
            Err(e)
        }
    }
}

/// The rendezvous after the member connection: registers, waits for the
/// others, validates and builds the mesh.
fn register_and_connect(
    cfg: &Config,
    store_addr: &str,
    member: &mut StoreClient,
    links: usize,
    deadline: Instant,
    abort: &ringleader_core::AbortSignal,
) -> Result<(StoreClient, Vec<PeerInfo>, Mesh)> {
    let mut aux = StoreClient::connect(store_addr, client_options(cfg, remaining(deadline)))?;
    let listener = DataListener::bind(&ListenOptions {
        ifname: cfg.ifname.clone(),
        port_range: cfg.port_range,
        store_endpoint: store_addr.to_string(),
    })?;
    let me = PeerInfo {
        rank: cfg.rank,
        world_size: cfg.world_size,
        host: hostname(),
        pid: std::process::id(),
        version: cfg.advertised_version.clone(),
        data_addr: listener.addr().to_string(),
        boot_id: boot_id(),
        master_addr: cfg.master_addr.clone(),
        master_ips: resolve_ips(&cfg.master_addr),
        transport: cfg.transport.name().to_string(),
        algo: cfg.algo.map_or("auto", AlgoChoice::name).into(),
        streams: cfg.streams,
        pid_ns: pid_namespace(),
    };
    aux.set(&keys::rank(cfg.rank), &serde_json::to_vec(&me).unwrap_or_default())?;
    if let (Some(g), 0) = (&cfg.group, cfg.rank) {
        aux.set(keys::GROUP, &serde_json::to_vec(g).unwrap_or_default())?;
    }
    let peers = wait_for_all(&mut aux, cfg, &me, deadline, abort)?;
    validate(&peers, cfg.rank)?;
    if let Some(note) = resolution_note(&peers) {
        // One line per host: from the lowest rank there.
        if peers.iter().filter(|p| p.same_host(&me)).all(|p| p.rank >= me.rank) {
            log::warn(cfg, &note);
        }
    }
    let mesh = preflight(&mut aux, listener, &peers, cfg, links, deadline, abort)?;
    // The member connection is the rank's life line from here on.
    let _ = member.heartbeat(&[]);
    Ok((aux, peers, mesh))
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100))
}

/// The addresses `host` resolves to here, sorted; empty when it does not.
fn resolve_ips(host: &str) -> Vec<String> {
    let mut ips: Vec<String> = (host.trim_matches(['[', ']']), 0u16)
        .to_socket_addrs()
        .map(|a| a.map(|a| a.ip().to_string()).collect())
        .unwrap_or_default();
    ips.sort();
    ips.dedup();
    ips
}

/// After the store refused us as a duplicate rank: leave a note for the
/// ranks that wait for the rest of the job (best effort, bounded).
fn record_conflict(cfg: &Config, store_addr: &str, e: &Error) {
    let Error::DuplicateRank { rank, first, second } = e else {
        return;
    };
    let mut opts = client_options(cfg, Duration::from_secs(2));
    opts.op_timeout = Duration::from_secs(2);
    if let Ok(mut c) = StoreClient::connect(store_addr, opts) {
        let note = Conflict { rank: *rank, first: first.clone(), second: second.clone() };
        let _ = c.set(&keys::conflict(*rank), &serde_json::to_vec(&note).unwrap_or_default());
    }
}

/// Splits the time left after the registrations into building the mesh and
/// gathering every rank's outcome: the gather window is a fifth of it
/// (200 ms to 3 s), the mesh gets the rest, at most 30 s plus 100 ms per
/// rank. The cap names a blocked port soon, well inside the init timeout;
/// it grows with the world because each rank connects to every other (and
/// on one host the N² handshakes share its cores: 512 local ranks on 2
/// cores did not finish theirs in 30 s).
pub(crate) fn split_mesh_time(left: Duration, world: usize) -> (Duration, Duration) {
    let gather = (left / 5).clamp(Duration::from_millis(200), Duration::from_secs(3));
    let cap = Duration::from_secs(30) + Duration::from_millis(100).saturating_mul(world.min(1 << 20) as u32);
    let mesh = left.saturating_sub(gather).clamp(Duration::from_millis(500), cap);
    (mesh, gather)
}

/// Builds the mesh, publishes this rank's outcome, gathers the others'
/// (bounded) and fails, on every rank alike, when any pair failed.
fn preflight(
    store: &mut StoreClient,
    listener: DataListener,
    peers: &[PeerInfo],
    cfg: &Config,
    links: usize,
    deadline: Instant,
    abort: &ringleader_core::AbortSignal,
) -> Result<Mesh> {
    let (mesh_time, gather_time) = split_mesh_time(remaining(deadline), cfg.world_size);
    let addrs: Vec<String> = peers.iter().map(|p| p.data_addr.clone()).collect();
    let started = Instant::now();
    let result = Mesh::establish(
        listener,
        &addrs,
        &MeshOptions {
            rank: cfg.rank,
            world: cfg.world_size,
            streams: links,
            run_id: cfg.run_id.clone(),
            token: cfg.token.clone(),
            timeout: mesh_time,
        },
        abort,
    );
    if cfg.world_size == 1 || matches!(result, Err(Error::Aborted { .. })) {
        return result;
    }
    let mine = MeshOutcome::of(cfg.rank, &result);
    let _ = store.set(&keys::mesh(cfg.rank), &serde_json::to_vec(&mine).unwrap_or_default());
    let mut outcomes = gather_outcomes(store, cfg.world_size, started + mesh_time + gather_time, abort);
    if !outcomes.iter().any(|o| o.rank == cfg.rank) {
        outcomes.push(mine);
    }
    match (result, preflight_verdict(&outcomes, peers)) {
        (Ok(mesh), None) => Ok(mesh),
        (Err(e), Some(verdict)) if e.kind() == ErrorKind::DataPortUnreachable => Err(verdict),
        (Err(e), _) => Err(e),
        (Ok(_), Some(verdict)) => Err(verdict),
    }
}

/// Every rank's mesh outcome published by `until` (fewer if some never came).
fn gather_outcomes(
    store: &mut StoreClient,
    world: usize,
    until: Instant,
    abort: &ringleader_core::AbortSignal,
) -> Vec<MeshOutcome> {
    let names: Vec<String> = (0..world).map(keys::mesh).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || abort.check().is_err() {
            break;
        }
        match store.wait(&refs, left.min(Duration::from_secs(1))) {
            Ok(()) => break,
            Err(Error::StoreTimeout { .. }) => {}
            Err(_) => break,
        }
    }
    let present = store.keys_with_prefix(keys::MESH_PREFIX).unwrap_or_default();
    let present: Vec<&str> = present.iter().map(String::as_str).collect();
    if present.is_empty() {
        return Vec::new();
    }
    let values = store.multi_get(&present, Duration::from_secs(2)).unwrap_or_default();
    values.iter().filter_map(|v| serde_json::from_slice(v).ok()).collect()
}

/// The one error every rank reports after the preflight, from every rank's
/// outcome: each failing pair once (as its connecting rank saw it, where it
/// reported), sorted; `None` when no pair failed. Ranks that did not report
/// and a MASTER_ADDR that resolves differently go into the note.
pub(crate) fn preflight_verdict(outcomes: &[MeshOutcome], peers: &[PeerInfo]) -> Option<Error> {
    let mut pairs: BTreeMap<(Rank, Rank), (Rank, Unreachable)> = BTreeMap::new();
    for o in outcomes {
        for p in &o.pairs {
            let key = (p.src, p.dst);
            let better = match pairs.get(&key) {
                None => true,
                Some((reporter, _)) => *reporter != p.src && o.rank == p.src,
            };
            if better {
                pairs.insert(key, (o.rank, p.clone()));
            }
        }
    }
    if pairs.is_empty() {
        return None;
    }
    let mut notes = Vec::new();
    let silent: Vec<Rank> = (0..peers.len()).filter(|r| !outcomes.iter().any(|o| o.rank == *r)).collect();
    if !silent.is_empty() {
        notes.push(format!("{} did not report its own view in time", fmt_ranks(&silent)));
    }
    notes.extend(resolution_note(peers));
    let note = (!notes.is_empty()).then(|| notes.join("; "));
    Some(Error::DataPortsUnreachable { pairs: pairs.into_values().map(|(_, u)| u).collect(), note })
}

/// Whether `host` is an IP address rather than a name.
fn is_ip_literal(host: &str) -> bool {
    host.trim_matches(['[', ']']).parse::<IpAddr>().is_ok()
}

/// Ranks grouped by what MASTER_ADDR resolved to for them; `None` when the
/// registrations agree. The message names each group with its hosts.
pub(crate) fn resolution_note(peers: &[PeerInfo]) -> Option<String> {
    let mut groups: BTreeMap<&[String], Vec<&PeerInfo>> = BTreeMap::new();
    for p in peers {
        groups.entry(p.master_ips.as_slice()).or_default().push(p);
    }
    if groups.len() < 2 {
        return None;
    }
    let name = peers.first().map(|p| p.master_addr.as_str()).unwrap_or_default();
    let parts: Vec<String> = groups
        .iter()
        .map(|(ips, ps)| {
            let ranks: Vec<Rank> = ps.iter().map(|p| p.rank).collect();
            let mut hosts: Vec<&str> = ps.iter().map(|p| p.host.as_str()).collect();
            hosts.sort_unstable();
            hosts.dedup();
            let to = if ips.is_empty() { "does not resolve".to_string() } else { format!("-> {}", ips.join(", ")) };
            format!("{to} on {} ({})", hosts.join(", "), fmt_ranks(&ranks))
        })
        .collect();
    Some(format!(
        "MASTER_ADDR {name} resolves differently on different hosts: {}; use an IP address for MASTER_ADDR, \
         or make /etc/hosts and DNS agree on every node (`getent hosts {name}` on each)",
        parts.join("; ")
    ))
}

/// What may explain ranks that never came, from those that did: how they
/// resolved MASTER_ADDR when it is a host name.
fn incomplete_note(joined: &[PeerInfo]) -> Option<String> {
    if let Some(n) = resolution_note(joined) {
        return Some(n);
    }
    let first = joined.first()?;
    if is_ip_literal(&first.master_addr) || first.master_addr.is_empty() {
        return None;
    }
    let ips = if first.master_ips.is_empty() { "nothing".to_string() } else { first.master_ips.join(", ") };
    Some(format!(
        "MASTER_ADDR {} is a host name, which the joined ranks resolve to {ips}: a node that resolves it \
         otherwise looks for the store elsewhere (`getent hosts {}` on each node, or use the IP address)",
        first.master_addr, first.master_addr
    ))
}

fn host_store_if_needed(cfg: &Config) -> Result<Option<StoreServer>> {
    if cfg.rank != 0 || cfg.store_addr.is_some() {
        return Ok(None);
    }
    let mut opts = ServerOptions::new(cfg.run_id.clone());
    opts.token = cfg.token.clone();
    let host = store_bind_host(cfg);
    let server = match StoreServer::bind(&join_host_port(&host, cfg.master_port), opts.clone()) {
        Err(e) if host != "0.0.0.0" && e.kind() != ErrorKind::PortInUse => {
            // MASTER_ADDR is not an address of this host after all (NAT, a
            // container's published port): others reach us some other way.
            tracing::debug!(rank = 0, "cannot listen on {host} ({e}); listening on every interface");
            StoreServer::bind(&format!("0.0.0.0:{}", cfg.master_port), opts)?
        }
        r => r?,
    };
    tracing::debug!(rank = 0, addr = %server.local_addr(), "hosting the store");
    Ok(Some(server))
}

/// Where rank 0's store listens: no wider than it must. MASTER_ADDR is how
/// the others reach it, so the address it names when that is certain (an IP
/// literal, or a host name on a one-host job, where every rank resolves it
/// alike); every interface when MASTER_ADDR is a host name that other hosts
/// may resolve to an address this one cannot name (NAT, containers, the
/// Debian `127.0.1.1` line for the own host name).
fn store_bind_host(cfg: &Config) -> String {
    let one_host = cfg.local_world_size == Some(cfg.world_size);
    if !is_ip_literal(&cfg.master_addr) && !one_host {
        return "0.0.0.0".into();
    }
    let addrs: Vec<SocketAddr> =
        (cfg.master_addr.trim_matches(['[', ']']), 0u16).to_socket_addrs().map(|a| a.collect()).unwrap_or_default();
    match addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()) {
        Some(a) => a.ip().to_string(),
        None => "0.0.0.0".into(),
    }
}

/// Registrations read per request: a request and its answer stay far below
/// the store's frame limit whatever the world size.
const READ_CHUNK: usize = 256;

/// Registers this rank's arrival and waits until every rank registered,
/// failing early on conflicting registrations and at the deadline with the
/// ranks that never came.
///
/// While it waits, a rank costs the store O(1) per second, whatever the
/// world size: arrivals are counted ([`keys::REGISTERED`]), the rank that
/// completes the count says so ([`keys::ALL_REGISTERED`]), and the others
/// wait on that one key, looking between waits for the note a rank leaves
/// when it claims another world size than the first rank did
/// ([`keys::WORLD_CONFLICT`]) or is refused as a duplicate rank. Reading every registration happens once, after the wait
/// (the data plane's full mesh needs every address), in chunks; and, on the
/// failure path, once at the deadline to name the ranks that never came.
fn wait_for_all(
    store: &mut StoreClient,
    cfg: &Config,
    me: &PeerInfo,
    deadline: Instant,
    abort: &ringleader_core::AbortSignal,
) -> Result<Vec<PeerInfo>> {
    let world = cfg.world_size.to_string();
    let claimed = store.compare_set(keys::WORLD_SIZE, None, world.as_bytes())?;
    if claimed != world.as_bytes() {
        // Tell the ranks already waiting: the count they wait for may
        // never complete without this rank.
        store.set(keys::WORLD_CONFLICT, world.as_bytes())?;
        return Err(world_size_conflict(store, me));
    }
    if store.add(keys::REGISTERED, 1)? >= cfg.world_size as i64 {
        store.set(keys::ALL_REGISTERED, b"1")?;
    }
    let start = Instant::now();
    let mut next_note = start + Duration::from_secs(10);
    loop {
        abort.check()?;
        // Conflicts show up between the slices: look often at first, when
        // they happen, in a small job.
        let early = start.elapsed() < Duration::from_secs(5) && cfg.world_size <= 64;
        let poll = if early { Duration::from_millis(250) } else { Duration::from_secs(1) };
        let slice = remaining(deadline).min(poll);
        match store.wait(&[keys::ALL_REGISTERED], slice) {
            Ok(()) => break,
            Err(Error::StoreTimeout { .. }) => {}
            Err(e) => return Err(e),
        }
        if store.check(&[keys::WORLD_CONFLICT])? {
            return Err(world_size_conflict(store, me));
        }
        check_duplicates(store)?;
        let now = Instant::now();
        if now >= deadline {
            let present = registrations(store)?;
            check_conflicts(&present, me)?;
            let in_world: Vec<PeerInfo> = present.iter().filter(|p| p.rank < cfg.world_size).cloned().collect();
            let missing = (0..cfg.world_size).filter(|r| !present.iter().any(|p| p.rank == *r)).collect();
            return Err(Error::RendezvousIncomplete {
                expected: cfg.world_size,
                joined: in_world.iter().map(PeerInfo::member).collect(),
                missing,
                waited: cfg.init_timeout,
                note: incomplete_note(&in_world),
            });
        }
        // Who is missing, every 30 s: from every rank of a small job, from
        // rank 0 alone in a big one (each note reads every rank's key name).
        if now >= next_note && (cfg.world_size <= 64 || cfg.rank == 0) {
            let names = store.keys_with_prefix(keys::RANK_PREFIX)?;
            let present: std::collections::BTreeSet<Rank> =
                names.iter().filter_map(|n| n.strip_prefix(keys::RANK_PREFIX)?.parse().ok()).collect();
            let missing: Vec<Rank> = (0..cfg.world_size).filter(|r| !present.contains(r)).collect();
            log::warn(
                cfg,
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
    let mut peers = Vec::with_capacity(cfg.world_size);
    let names: Vec<String> = (0..cfg.world_size).map(keys::rank).collect();
    for chunk in names.chunks(READ_CHUNK) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        // Every rank reads at once when the count completes: allow for a
        // busy store within the init timeout, not a fixed few seconds.
        let wait = remaining(deadline).max(Duration::from_secs(5));
        for (v, name) in store.multi_get(&refs, wait)?.iter().zip(chunk) {
            let p: PeerInfo = serde_json::from_slice(v).map_err(|e| Error::VersionMismatch {
                detail: format!("{name}: a registration that cannot be read ({e})"),
                versions: vec![],
            })?;
            peers.push(p);
        }
    }
    Ok(peers)
}

/// The ranks disagree on the world size: every registration, as claims.
fn world_size_conflict(store: &mut StoreClient, me: &PeerInfo) -> Error {
    match registrations(store).and_then(|present| check_conflicts(&present, me)) {
        Err(e) => e,
        // The registrations agree with this rank: the claim came from a
        // rank that has not registered yet, or left; name what is known.
        Ok(()) => Error::WorldSizeMismatch { claims: vec![me.member()] },
    }
}

/// Every registration at the store now, including ranks outside our world.
fn registrations(store: &mut StoreClient) -> Result<Vec<PeerInfo>> {
    let names = store.keys_with_prefix(keys::RANK_PREFIX)?;
    let mut v: Vec<PeerInfo> = Vec::with_capacity(names.len());
    for chunk in names.chunks(READ_CHUNK) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let values = store.multi_get(&refs, Duration::from_secs(5))?;
        v.extend(values.iter().filter_map(|b| serde_json::from_slice::<PeerInfo>(b).ok()));
    }
    v.sort_by_key(|p| p.rank);
    Ok(v)
}

/// A process the store refused as a duplicate of a rank (it left a note):
/// the job cannot complete, so fail with its conflict at once.
fn check_duplicates(store: &mut StoreClient) -> Result<()> {
    let names = store.keys_with_prefix(keys::CONFLICT_PREFIX)?;
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    if refs.is_empty() {
        return Ok(());
    }
    let values = store.multi_get(&refs, Duration::from_secs(5))?;
    let conflict = values.iter().filter_map(|v| serde_json::from_slice::<Conflict>(v).ok()).min_by_key(|c| c.rank);
    match conflict {
        Some(c) => Err(Error::DuplicateRank { rank: c.rank, first: c.first, second: c.second }),
        None => Ok(()),
    }
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
/// sizes, versions and transport settings must agree, and no rank may
/// listen on a loopback address that a rank on another host would have to
/// connect to.
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
    check_job_settings(peers)?;
    check_transports(peers)?;
    check_loopback(peers)
}

/// A setting's value and the ranks that use it.
type Choice = (String, Vec<Rank>);

/// `(value, rank)` pairs grouped by value, in order of first appearance.
fn choices(pairs: impl IntoIterator<Item = (String, Rank)>) -> Vec<Choice> {
    let mut groups: Vec<Choice> = Vec::new();
    for (value, rank) in pairs {
        match groups.iter_mut().find(|(v, _)| *v == value) {
            Some((_, ranks)) => ranks.push(rank),
            None => groups.push((value, vec![rank])),
        }
    }
    groups
}

/// "tcp on rank 0, auto on ranks 1, 2".
fn said(groups: &[Choice]) -> String {
    groups.iter().map(|(v, ranks)| format!("{v} on {}", fmt_ranks(ranks))).collect::<Vec<_>>().join(", ")
}

/// Settings that decide which frames ranks exchange must be equal on every
/// rank: with `RINGLEADER_ALGO` or `RINGLEADER_STREAMS` differing, ranks
/// wait for data or connections their peers never send, which would
/// otherwise surface as a data-port or timeout error that names nobody.
fn check_job_settings(peers: &[PeerInfo]) -> Result<()> {
    let algo = choices(peers.iter().map(|p| (p.algo.clone(), p.rank)));
    let streams = choices(peers.iter().map(|p| (p.streams.to_string(), p.rank)));
    for (name, groups) in [("RINGLEADER_ALGO", algo), ("RINGLEADER_STREAMS", streams)] {
        if groups.len() > 1 {
            return Err(Error::invalid(
                name,
                format!(
                    "ranks disagree: {}; it decides which data ranks exchange, so set the same value (or none) \
                     on every rank",
                    said(&groups)
                ),
            ));
        }
    }
    Ok(())
}

/// Ranks that share a host must pick the same data plane: a rank set to
/// `tcp` never creates the shared memory that a rank set to `auto` on its
/// host waits for, which would otherwise surface only as a timeout blaming
/// the wrong rank. Ranks on different hosts may differ (a node launched
/// with another setting still reaches the others over TCP). Fails naming
/// the host and the ranks of each setting.
fn check_transports(peers: &[PeerInfo]) -> Result<()> {
    // By host, in order of each host's lowest rank: its ranks' settings.
    let mut hosts: Vec<(&PeerInfo, Vec<(String, Rank)>)> = Vec::new();
    let mut index: std::collections::HashMap<(&str, &str), usize> = std::collections::HashMap::new();
    for p in peers {
        let i = *index.entry((p.host.as_str(), p.boot_id.as_str())).or_insert_with(|| {
            hosts.push((p, Vec::new()));
            hosts.len() - 1
        });
        hosts[i].1.push((p.transport.clone(), p.rank));
    }
    for (host, settings) in hosts {
        let groups = choices(settings);
        if groups.len() > 1 {
            return Err(Error::invalid(
                "RINGLEADER_TRANSPORT",
                format!(
                    "ranks on host {} disagree: {}; set the same value (or none) on every rank of a host",
                    host.host,
                    said(&groups)
                ),
            ));
        }
    }
    Ok(())
}

/// A rank listens on a loopback address (MASTER_ADDR resolved to one on its
/// host, so that is the address it reaches the store by) while a higher rank
/// on another host must connect to it: fail at once, naming every such pair.
fn check_loopback(peers: &[PeerInfo]) -> Result<()> {
    let loopback = |a: &str| a.parse::<SocketAddr>().is_ok_and(|a| a.ip().is_loopback());
    let mut pairs = Vec::new();
    for p in peers.iter().filter(|p| loopback(&p.data_addr)) {
        for q in peers.iter().filter(|q| q.rank > p.rank && !q.same_host(p)) {
            pairs.push(Unreachable {
                src: q.rank,
                dst: p.rank,
                addr: p.data_addr.clone(),
                detail: format!("a loopback address on {}, which {} cannot reach", p.host, q.host),
            });
        }
    }
    if pairs.is_empty() {
        return Ok(());
    }
    pairs.sort_by_key(|u| (u.src, u.dst));
    let why = "ranks listen on the address they reach the store by, and MASTER_ADDR resolves to a loopback \
               address on the listed hosts: map it to an address the other hosts can reach there, or set \
               RINGLEADER_IFNAME";
    let note = match resolution_note(peers) {
        Some(n) => format!("{n}; {why}"),
        None => why.to_string(),
    };
    Err(Error::DataPortsUnreachable { pairs, note: Some(note) })
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
            data_addr: format!("10.0.0.{rank}:1"),
            boot_id: "b".into(),
            master_addr: "node-a".into(),
            master_ips: vec!["10.0.0.1".into()],
            transport: "auto".into(),
            algo: "auto".into(),
            streams: 1,
            pid_ns: String::new(),
        }
    }

    #[test]
    fn the_store_listens_no_wider_than_it_must() {
        let mut c = Config::new(0, 4, "127.0.0.1", 1);
        assert_eq!(store_bind_host(&c), "127.0.0.1");
        c.master_addr = "10.1.2.3".into();
        assert_eq!(store_bind_host(&c), "10.1.2.3", "an IP literal is where the others connect");
        c.master_addr = "localhost".into();
        assert_eq!(store_bind_host(&c), "0.0.0.0", "a host name other hosts may resolve otherwise");
        c.local_world_size = Some(4);
        assert_eq!(store_bind_host(&c), "127.0.0.1", "one host: every rank resolves it alike");
    }

    /// Rank `rank` on host `h{host}` listening at `10.0.0.{host}:4000{rank}`.
    fn on_host(rank: Rank, world: usize, host: usize) -> PeerInfo {
        let mut p = info(rank, world, "1.0");
        p.host = format!("h{host}");
        p.data_addr = format!("10.0.0.{host}:4000{rank}");
        p
    }

    fn unreachable(src: Rank, dst: Rank, detail: &str) -> Unreachable {
        Unreachable { src, dst, addr: format!("10.0.0.1:4000{dst}"), detail: detail.into() }
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

    #[test]
    fn transport_disagreement_on_one_host_names_the_ranks_of_each_setting() {
        // Host h0 holds ranks 0-11, host h1 ranks 12-13.
        let mut peers: Vec<PeerInfo> = (0..14).map(|r| on_host(r, 14, r / 12)).collect();
        peers[0].transport = "tcp".into();
        let e = validate(&peers, 13).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let s = e.to_string();
        assert!(s.contains("RINGLEADER_TRANSPORT") && s.contains("host h0"), "{s}");
        assert!(s.contains("tcp on rank 0, auto on ranks 1-11 (11 ranks)"), "{s}");
        peers[0].transport = "auto".into();
        assert!(validate(&peers, 13).is_ok(), "the same setting everywhere passes");
        // Another host's ranks may differ from this one's.
        peers[12].transport = "tcp".into();
        peers[13].transport = "tcp".into();
        assert!(validate(&peers, 13).is_ok(), "hosts may differ from each other");
    }

    #[test]
    fn algo_or_streams_disagreement_anywhere_names_the_ranks_of_each_value() {
        // Ranks 0, 1 on h0 and 2, 3 on h1: unlike the transport, these must
        // agree across hosts too.
        let mut peers: Vec<PeerInfo> = (0..4).map(|r| on_host(r, 4, r / 2)).collect();
        peers[3].algo = "rd".into();
        let e = validate(&peers, 0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let s = e.to_string();
        assert!(s.contains("RINGLEADER_ALGO") && s.contains("auto on ranks 0-2, rd on rank 3"), "{s}");
        peers[3].algo = "auto".into();
        peers[0].streams = 4;
        let s = validate(&peers, 2).unwrap_err().to_string();
        assert!(s.contains("RINGLEADER_STREAMS") && s.contains("4 on rank 0, 1 on ranks 1-3"), "{s}");
        peers[0].streams = 1;
        assert!(validate(&peers, 2).is_ok());
    }

    #[test]
    fn mesh_time_leaves_a_gather_window_inside_the_init_timeout() {
        let (mesh, gather) = split_mesh_time(Duration::from_secs(4), 2);
        assert_eq!(mesh + gather, Duration::from_secs(4));
        assert_eq!(gather, Duration::from_millis(800));
        let (mesh, gather) = split_mesh_time(Duration::from_secs(300), 2);
        assert_eq!((mesh, gather), (Duration::from_millis(30_200), Duration::from_secs(3)));
        let (mesh, gather) = split_mesh_time(Duration::from_millis(100), 2);
        assert_eq!((mesh, gather), (Duration::from_millis(500), Duration::from_millis(200)));
        // The cap follows the world: 512 ranks get 81.2 s of the default 300 s,
        // 16,384 all but the gather window.
        assert_eq!(split_mesh_time(Duration::from_secs(300), 512).0, Duration::from_millis(81_200));
        assert_eq!(split_mesh_time(Duration::from_secs(300), 16_384).0, Duration::from_secs(297));
    }

    #[test]
    fn every_rank_reports_every_failing_pair_once() {
        // Node a runs ranks 0, 1; node b ranks 2, 3; b cannot reach a's data ports.
        let peers: Vec<_> = (0..4).map(|r| on_host(r, 4, r / 2)).collect();
        let outcome = |rank, pairs| MeshOutcome { rank, pairs, error: None };
        let outcomes = vec![
            outcome(0, vec![unreachable(2, 0, "seen from rank 0"), unreachable(3, 0, "seen from rank 0")]),
            outcome(1, vec![unreachable(2, 1, "seen from rank 1"), unreachable(3, 1, "seen from rank 1")]),
            outcome(2, vec![unreachable(2, 0, "no answer"), unreachable(2, 1, "no answer")]),
            outcome(3, vec![unreachable(3, 0, "no answer"), unreachable(3, 1, "no answer")]),
        ];
        let e = preflight_verdict(&outcomes, &peers).unwrap();
        assert_eq!(e.kind(), ErrorKind::DataPortUnreachable);
        let s = e.to_string();
        assert!(s.starts_with("[data-port-unreachable] rank 2 cannot reach rank 0 at 10.0.0.1:40000 (no answer); rank 2 cannot reach rank 1"), "{s}");
        assert_eq!(s.matches("cannot reach").count(), 4, "{s}");
        assert!(!s.contains("seen from"), "the connector's own view wins: {s}");
        // The same verdict whatever the order the outcomes arrived in.
        let mut reversed = outcomes.clone();
        reversed.reverse();
        assert_eq!(preflight_verdict(&reversed, &peers).unwrap().to_string(), s);
        // Rank 3 never reported: the acceptors' view stands in for it, and it is named.
        let partial = &outcomes[..3];
        let s = preflight_verdict(partial, &peers).unwrap().to_string();
        assert!(s.contains("rank 3 cannot reach rank 0 at 10.0.0.1:40000 (seen from rank 0)"), "{s}");
        assert!(s.contains("rank 3 did not report its own view in time"), "{s}");
        // Nothing failed: no verdict.
        let ok: Vec<_> = (0..4).map(|r| outcome(r, vec![])).collect();
        assert!(preflight_verdict(&ok, &peers).is_none());
    }

    #[test]
    fn master_addr_resolving_differently_is_named_with_hosts() {
        let mut peers: Vec<_> = (0..4).map(|r| on_host(r, 4, r / 2)).collect();
        assert_eq!(resolution_note(&peers), None);
        for p in &mut peers[..2] {
            p.master_ips = vec!["127.0.1.1".into()];
        }
        let n = resolution_note(&peers).unwrap();
        assert!(n.contains("MASTER_ADDR node-a resolves differently"), "{n}");
        assert!(n.contains("-> 10.0.0.1 on h1 (ranks 2, 3)"), "{n}");
        assert!(n.contains("-> 127.0.1.1 on h0 (ranks 0, 1)"), "{n}");
        let joined = &peers[..2];
        assert_eq!(resolution_note(joined), None);
        let n = incomplete_note(joined).unwrap();
        assert!(n.contains("MASTER_ADDR node-a is a host name, which the joined ranks resolve to 127.0.1.1"), "{n}");
        let mut by_ip = joined.to_vec();
        by_ip.iter_mut().for_each(|p| p.master_addr = "10.0.0.1".into());
        assert_eq!(incomplete_note(&by_ip), None);
    }

    #[test]
    fn a_loopback_listener_other_hosts_must_reach_fails_at_once() {
        let mut peers: Vec<_> = (0..4).map(|r| on_host(r, 4, r / 2)).collect();
        for p in &mut peers[..2] {
            p.data_addr = format!("127.0.0.1:4000{}", p.rank);
            p.master_ips = vec!["127.0.0.1".into()];
        }
        let e = validate(&peers, 3).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DataPortUnreachable);
        assert_eq!(e.ranks(), vec![0, 1, 2, 3]);
        let s = e.to_string();
        assert!(s.contains("rank 2 cannot reach rank 0 at 127.0.0.1:40000 (a loopback address on h0"), "{s}");
        assert!(s.contains("-> 127.0.0.1 on h0 (ranks 0, 1)"), "{s}");
        // On one host, loopback is fine.
        let local: Vec<_> =
            (0..2).map(|r| on_host(r, 2, 0)).map(|p| PeerInfo { data_addr: "127.0.0.1:1".into(), ..p }).collect();
        validate(&local, 0).unwrap();
    }
}
