//! The doctors' rendezvous: what each node publishes at node 0's temporary
//! store, and the cross-node checks computed from it.
//!
//! Three rounds, each bounded: every doctor publishes its [`NodeReport`]
//! (host, version, how it resolves MASTER_ADDR, the data ports it listens
//! on) and waits for the others'; every doctor connects to every node's
//! ports and publishes its [`ProbeReport`]; every doctor reads all probe
//! reports, so all print the same cross-node rows, and says it is done (node
//! 0 keeps the store up until every doctor has). The checks themselves are
//! pure functions of the reports.

use super::probe::{self, Probe, ProbeTarget, Target};
use super::report::Check;
use ringleader_core::Error;
use ringleader_store::{keys, StoreClient};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// What one doctor tells the others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NodeReport {
    /// Its node rank.
    pub(crate) node: usize,
    /// Its host name.
    pub(crate) host: String,
    /// The ringleader version it runs (as ranks there would advertise it).
    pub(crate) version: String,
    /// MASTER_ADDR as given there.
    pub(crate) master_addr: String,
    /// What MASTER_ADDR resolves to there, sorted.
    pub(crate) master_ips: Vec<String>,
    /// The data ports it listens on (`ip:port`).
    pub(crate) data: Vec<String>,
    /// Node 0 only: a listener on MASTER_PORT (torch's TCPStore port), if free.
    pub(crate) master_port: Option<String>,
    /// RINGLEADER_ALGO there: `auto`, `ring` or `rd`.
    #[serde(default)]
    pub(crate) algo: String,
    /// RINGLEADER_STREAMS there.
    #[serde(default)]
    pub(crate) streams: usize,
}

impl NodeReport {
    fn name(&self) -> String {
        format!("node {} ({})", self.node, self.host)
    }
}

/// Every probe one doctor made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ProbeReport {
    /// The node that made them.
    pub(crate) node: usize,
    /// The probes.
    pub(crate) probes: Vec<Probe>,
}

/// What the rounds gathered.
#[derive(Debug, Default)]
pub(crate) struct Gathered {
    /// Node reports, by node (missing ones absent).
    pub(crate) nodes: BTreeMap<usize, NodeReport>,
    /// Probe reports, by node.
    pub(crate) probes: BTreeMap<usize, ProbeReport>,
}

/// Runs the rounds for node `me`; `wait` bounds the wait for the other
/// doctors to arrive, `probe_timeout` each connection attempt.
pub(crate) fn rendezvous(
    store: &mut StoreClient,
    nnodes: usize,
    me: &NodeReport,
    wait: Duration,
    probe_timeout: Duration,
) -> Result<Gathered, Error> {
    let mut g = Gathered::default();
    store.set(&keys::doctor("node", me.node), &serde_json::to_vec(me).unwrap_or_default())?;
    let all: Vec<usize> = (0..nnodes).collect();
    g.nodes = gather(store, "node", &all, Instant::now() + wait)?;
    let targets = targets_for(me, &g.nodes);
    let probes = ProbeReport { node: me.node, probes: probe::probe_all(me.node, &targets, probe_timeout) };
    store.set(&keys::doctor("probe", me.node), &serde_json::to_vec(&probes).unwrap_or_default())?;
    // Every doctor that joined probes at about the same time, each attempt bounded.
    let until = Instant::now() + probe_timeout + Duration::from_secs(3);
    let joined: Vec<usize> = g.nodes.keys().copied().collect();
    g.probes = gather(store, "probe", &joined, until)?;
    store.set(&keys::doctor("done", me.node), b"1")?;
    Ok(g)
}

/// Node 0: waits (bounded) until every doctor in `nodes` has read what it
/// needs, before its store goes away.
pub(crate) fn wait_until_done(store: &mut StoreClient, nodes: &[usize], within: Duration) {
    let names: Vec<String> = nodes.iter().map(|n| keys::doctor("done", *n)).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let _ = store.wait(&refs, within);
}

/// Whatever of `rl/doctor/{what}/{node}` for `nodes` is there by `until`.
fn gather<T: DeserializeOwned>(
    store: &mut StoreClient,
    what: &str,
    nodes: &[usize],
    until: Instant,
) -> Result<BTreeMap<usize, T>, Error> {
    let names: Vec<String> = nodes.iter().map(|n| keys::doctor(what, *n)).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match store.wait(&refs, left.min(Duration::from_secs(1))) {
            Ok(()) => break,
            Err(Error::StoreTimeout { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    let mut out = BTreeMap::new();
    for (n, key) in nodes.iter().zip(&names) {
        if let Some(v) = store.try_get(key)? {
            if let Ok(t) = serde_json::from_slice(&v) {
                out.insert(*n, t);
            }
        }
    }
    Ok(out)
}

/// Every port of every node, as seen from `me`.
fn targets_for(me: &NodeReport, nodes: &BTreeMap<usize, NodeReport>) -> Vec<ProbeTarget> {
    let mut t = Vec::new();
    for n in nodes.values() {
        let remote_loopback =
            |a: &str| n.host != me.host && a.parse::<SocketAddr>().is_ok_and(|a| a.ip().is_loopback());
        for a in &n.data {
            t.push(ProbeTarget {
                to: n.node,
                addr: a.clone(),
                what: Target::Data,
                remote_loopback: remote_loopback(a),
            });
        }
        if let Some(a) = &n.master_port {
            let remote_loopback = remote_loopback(a);
            t.push(ProbeTarget { to: n.node, addr: a.clone(), what: Target::MasterPort, remote_loopback });
        }
    }
    t
}

/// Did every node's doctor arrive?
pub(crate) fn check_joined(nnodes: usize, g: &Gathered, waited: Duration, store: &str) -> Check {
    let missing: Vec<String> = (0..nnodes).filter(|n| !g.nodes.contains_key(n)).map(|n| n.to_string()).collect();
    if missing.is_empty() {
        let hosts: Vec<String> = g.nodes.values().map(NodeReport::name).collect();
        return Check::ok("all doctors joined", hosts.join(", "));
    }
    Check::fail(
        "all doctors joined",
        format!(
            "node{} {} did not join at {store} within {:.1} s (joined: {})",
            if missing.len() == 1 { "" } else { "s" },
            missing.join(", "),
            waited.as_secs_f64(),
            g.nodes.values().map(NodeReport::name).collect::<Vec<_>>().join(", ")
        ),
        "run `ringleader doctor` with the same options on every node (a missing node that cannot reach the \
         store says why in its own table); a node launched with another --nnodes or --master-addr does not \
         count",
    )
}

/// Does MASTER_ADDR resolve alike on every node?
pub(crate) fn check_resolution_alike(g: &Gathered) -> Check {
    let mut groups: BTreeMap<&[String], Vec<String>> = BTreeMap::new();
    for n in g.nodes.values() {
        groups.entry(n.master_ips.as_slice()).or_default().push(n.name());
    }
    let name = g.nodes.values().next().map(|n| n.master_addr.as_str()).unwrap_or_default();
    let show = |ips: &[String]| if ips.is_empty() { "nothing".to_string() } else { ips.join(", ") };
    if groups.len() <= 1 {
        let ips = groups.keys().next().map(|ips| show(ips)).unwrap_or_default();
        return Check::ok("MASTER_ADDR alike", format!("{name} -> {ips} on every node"));
    }
    let parts: Vec<String> =
        groups.iter().map(|(ips, nodes)| format!("{} on {}", show(ips), nodes.join(", "))).collect();
    Check::fail(
        "MASTER_ADDR alike",
        format!("{name} resolves differently: {}", parts.join("; ")),
        format!(
            "use an IP address for MASTER_ADDR, or make /etc/hosts and DNS agree on every node \
             (`getent hosts {name}` on each)"
        ),
    )
}

/// The nodes' names grouped by `value` of their reports.
fn by_value(g: &Gathered, value: impl Fn(&NodeReport) -> String) -> BTreeMap<String, Vec<String>> {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for n in g.nodes.values() {
        groups.entry(value(n)).or_default().push(n.name());
    }
    groups
}

/// Do all nodes run the same version?
pub(crate) fn check_versions(g: &Gathered) -> Check {
    let groups = by_value(g, |n| n.version.clone());
    if groups.len() <= 1 {
        let v = groups.keys().next().cloned().unwrap_or_default();
        return Check::ok("versions equal", format!("ringleader {v} on every node"));
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(v, nodes)| format!("{} run{} {v}", nodes.join(", "), if nodes.len() == 1 { "s" } else { "" }))
        .collect();
    Check::fail(
        "versions equal",
        parts.join("; "),
        "install the same ringleader build on every node (one container image, or one wheel)",
    )
}

/// Do all nodes set RINGLEADER_ALGO and RINGLEADER_STREAMS alike? Ranks
/// refuse to start otherwise, since these decide which data they exchange.
pub(crate) fn check_settings(g: &Gathered) -> Check {
    let mut differ = Vec::new();
    let algo = by_value(g, |n| n.algo.clone());
    let streams = by_value(g, |n| n.streams.to_string());
    for (name, groups) in [("RINGLEADER_ALGO", algo), ("RINGLEADER_STREAMS", streams)] {
        if groups.len() > 1 {
            let parts: Vec<String> = groups.iter().map(|(v, nodes)| format!("{v} on {}", nodes.join(", "))).collect();
            differ.push(format!("{name}: {}", parts.join("; ")));
        }
    }
    if differ.is_empty() {
        let first = g.nodes.values().next();
        let (algo, streams) = first.map_or(("auto".into(), 1), |n| (n.algo.clone(), n.streams));
        return Check::ok(
            "settings alike",
            format!("RINGLEADER_ALGO {algo}, RINGLEADER_STREAMS {streams} on every node"),
        );
    }
    Check::fail(
        "settings alike",
        differ.join(" / "),
        "set the same RINGLEADER_ALGO and RINGLEADER_STREAMS (or none) on every node: ranks check them at init and refuse to start",
    )
}

/// Did every doctor reach every node's data ports? `range` is
/// RINGLEADER_PORT_RANGE, for the advice.
pub(crate) fn check_data_ports(g: &Gathered, range: Option<(u16, u16)>) -> Check {
    let name = |n: usize| g.nodes.get(&n).map(NodeReport::name).unwrap_or_else(|| format!("node {n}"));
    // (from, to) -> (failed addresses, what failed first)
    let mut failed: BTreeMap<(usize, usize), (Vec<String>, String)> = BTreeMap::new();
    let mut made = 0;
    for p in g.probes.values().flat_map(|r| &r.probes).filter(|p| p.what == Target::Data) {
        if p.ok {
            made += 1;
        } else {
            let e = failed.entry((p.from, p.to)).or_insert_with(|| (Vec::new(), p.detail.clone()));
            e.0.push(p.addr.clone());
        }
    }
    let silent: Vec<String> = g.nodes.keys().filter(|n| !g.probes.contains_key(n)).map(|n| name(*n)).collect();
    if failed.is_empty() && silent.is_empty() {
        return Check::ok(
            "data ports reachable",
            format!("every node reaches every node's data ports ({made} connections)"),
        );
    }
    if failed.is_empty() {
        return Check::skip("data ports reachable", format!("{} did not report its probes", silent.join(", ")));
    }
    let mut parts: Vec<String> = failed
        .iter()
        .map(|((from, to), (addrs, why))| {
            format!("{} cannot reach {} at {} ({why})", name(*from), name(*to), addrs.join(", "))
        })
        .collect();
    if !silent.is_empty() {
        parts.push(format!("{} did not report its probes", silent.join(", ")));
    }
    let ports = match range {
        Some((lo, hi)) => format!("the ports of RINGLEADER_PORT_RANGE={lo}-{hi}"),
        None => "the ephemeral ports ranks listen on without RINGLEADER_PORT_RANGE (see /proc/sys/net/ipv4/ip_local_port_range)".into(),
    };
    Check::fail(
        "data ports reachable",
        parts.join("; "),
        format!(
            "open {ports} between the nodes (TCP), or set RINGLEADER_PORT_RANGE=LO-HI to ports the firewall \
             allows, the same on every node, and run doctor again with it; RINGLEADER_IFNAME=NAME picks the \
             interface"
        ),
    )
}

/// Can every node reach node 0's MASTER_PORT (only PyTorch's own TCPStore,
/// env://, uses it)? `None` when node 0 did not listen there.
pub(crate) fn check_master_port(g: &Gathered) -> Option<Check> {
    let node0 = g.nodes.get(&0)?;
    let addr = node0.master_port.as_ref()?;
    let failed: Vec<String> = g
        .probes
        .values()
        .flat_map(|r| &r.probes)
        .filter(|p| p.what == Target::MasterPort && !p.ok)
        .map(|p| format!("{} ({})", g.nodes.get(&p.from).map(NodeReport::name).unwrap_or_default(), p.detail))
        .collect();
    if failed.is_empty() {
        return Some(Check::ok("MASTER_PORT reachable", format!("{addr} from every node")));
    }
    Some(Check::warn(
        "MASTER_PORT reachable",
        format!("{addr} cannot be reached from {}", failed.join(", ")),
        "only PyTorch's own TCPStore (init_process_group with env://) uses MASTER_PORT: open it for such jobs",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::Status;

    fn node(n: usize, version: &str, ips: &[&str]) -> NodeReport {
        NodeReport {
            node: n,
            host: format!("h{n}"),
            version: version.into(),
            master_addr: "master".into(),
            master_ips: ips.iter().map(|s| s.to_string()).collect(),
            data: vec![format!("10.0.0.{n}:41000"), format!("10.0.0.{n}:41009")],
            master_port: (n == 0).then(|| "10.0.0.0:29500".to_string()),
            algo: "auto".into(),
            streams: 1,
        }
    }

    fn probe(from: usize, to: usize, addr: &str, what: Target, ok: bool) -> Probe {
        let detail = if ok { "connected in 0.1 ms" } else { "no answer within 1.0 s" };
        Probe { from, to, addr: addr.into(), what, ok, detail: detail.into() }
    }

    fn gathered(nodes: Vec<NodeReport>) -> Gathered {
        let mut g = Gathered::default();
        for n in nodes {
            g.nodes.insert(n.node, n);
        }
        g
    }

    #[test]
    fn joined_alike_and_versions() {
        let g = gathered(vec![node(0, "0.1.0", &["10.0.0.0"]), node(1, "0.1.0", &["10.0.0.0"])]);
        assert_eq!(check_joined(2, &g, Duration::from_secs(1), "m:1").status, Status::Ok);
        assert_eq!(check_resolution_alike(&g).status, Status::Ok);
        assert_eq!(check_versions(&g).status, Status::Ok);
        let c = check_joined(3, &g, Duration::from_secs(4), "10.0.0.0:29501");
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.starts_with("node 2 did not join at 10.0.0.0:29501 within 4.0 s"), "{c:?}");

        let g = gathered(vec![node(0, "0.1.0", &["127.0.0.1"]), node(1, "9.9.9", &["10.0.0.0"])]);
        let c = check_resolution_alike(&g);
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("127.0.0.1 on node 0 (h0)") && c.detail.contains("10.0.0.0 on node 1 (h1)"), "{c:?}");
        let c = check_versions(&g);
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("node 1 (h1) runs 9.9.9") && c.detail.contains("node 0 (h0) runs 0.1.0"), "{c:?}");
    }

    #[test]
    fn settings_that_differ_between_nodes_are_named_with_the_nodes() {
        let mut g = gathered(vec![node(0, "v", &[]), node(1, "v", &[]), node(2, "v", &[])]);
        let c = check_settings(&g);
        assert_eq!(c.status, Status::Ok);
        assert!(c.detail.contains("RINGLEADER_ALGO auto, RINGLEADER_STREAMS 1"), "{c:?}");
        g.nodes.get_mut(&2).unwrap().algo = "rd".into();
        g.nodes.get_mut(&0).unwrap().streams = 4;
        let c = check_settings(&g);
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("RINGLEADER_ALGO: auto on node 0 (h0), node 1 (h1); rd on node 2 (h2)"), "{c:?}");
        assert!(c.detail.contains("RINGLEADER_STREAMS: 1 on node 1 (h1), node 2 (h2); 4 on node 0 (h0)"), "{c:?}");
    }

    #[test]
    fn blocked_data_ports_name_both_nodes_and_the_addresses() {
        let mut g = gathered(vec![node(0, "v", &[]), node(1, "v", &[])]);
        let d = Target::Data;
        g.probes.insert(0, ProbeReport { node: 0, probes: vec![probe(0, 1, "10.0.0.1:41000", d, true)] });
        g.probes.insert(
            1,
            ProbeReport {
                node: 1,
                probes: vec![
                    probe(1, 0, "10.0.0.0:41000", d, false),
                    probe(1, 0, "10.0.0.0:41009", d, false),
                    probe(1, 0, "10.0.0.0:29500", Target::MasterPort, false),
                    probe(1, 1, "10.0.0.1:41000", d, true),
                ],
            },
        );
        let c = check_data_ports(&g, Some((41000, 41009)));
        assert_eq!(c.status, Status::Fail);
        assert_eq!(
            c.detail,
            "node 1 (h1) cannot reach node 0 (h0) at 10.0.0.0:41000, 10.0.0.0:41009 (no answer within 1.0 s)"
        );
        assert!(c.fix.unwrap().contains("RINGLEADER_PORT_RANGE=41000-41009"));
        let m = check_master_port(&g).unwrap();
        assert_eq!(m.status, Status::Warn);
        assert!(m.detail.contains("10.0.0.0:29500 cannot be reached from node 1 (h1)"), "{m:?}");

        g.probes.get_mut(&1).unwrap().probes.retain(|p| p.ok);
        assert_eq!(check_data_ports(&g, None).status, Status::Ok);
        g.probes.remove(&0);
        assert_eq!(check_data_ports(&g, None).status, Status::Skip);
    }

    #[test]
    fn loopback_ports_of_other_hosts_are_not_tried() {
        let mut n0 = node(0, "v", &[]);
        n0.data = vec!["127.0.0.1:41000".into()];
        let n1 = node(1, "v", &[]);
        let g = gathered(vec![n0.clone(), n1.clone()]);
        let from1 = targets_for(&n1, &g.nodes);
        assert!(from1.iter().any(|t| t.addr == "127.0.0.1:41000" && t.remote_loopback));
        let from0 = targets_for(&n0, &g.nodes);
        assert!(from0.iter().all(|t| !t.remote_loopback));
    }
}
