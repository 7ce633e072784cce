//! The checks a doctor makes on its own node: how MASTER_ADDR resolves,
//! whether node 0's ports are free, listening on the data ports, and recent
//! OOM kills.

use super::probe;
use super::report::Check;
use crate::launch::oom::{self, KernelLog};
use crate::launch::plan::{wildcard_for, JobPlan, MasterPort, StoreSide};
use ringleader_core::config::join_host_port;
use ringleader_core::{Error, ErrorKind};
use ringleader_store::{ServerOptions, StoreServer};
use ringleader_transport::DataListener;
use std::net::{IpAddr, TcpListener, ToSocketAddrs};

/// Kills older than this are history, not a warning.
const RECENT_US: u64 = 24 * 3600 * 1_000_000;

/// How MASTER_ADDR resolves on this node; the check and the addresses (sorted).
pub(crate) fn resolution(plan: &JobPlan, ifname: Option<&str>) -> (Check, Vec<String>) {
    const NAME: &str = "MASTER_ADDR resolves";
    let addr = &plan.master_addr;
    let resolved = (addr.trim_matches(['[', ']']), 0u16).to_socket_addrs();
    let mut ips: Vec<IpAddr> = match resolved {
        Ok(a) => a.map(|a| a.ip()).collect(),
        Err(e) => {
            let fix = "add the name to DNS or /etc/hosts on this node, or use node 0's IP address for MASTER_ADDR";
            return (Check::fail(NAME, format!("{addr} does not resolve here: {e}"), fix), Vec::new());
        }
    };
    ips.sort();
    ips.dedup();
    let shown: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
    let literal = addr.trim_matches(['[', ']']).parse::<IpAddr>().is_ok();
    let found = if literal { format!("{addr} (an IP address)") } else { format!("{addr} -> {}", shown.join(", ")) };
    let loopback = ips.iter().any(IpAddr::is_loopback);
    let check = match (loopback && plan.nnodes > 1, plan.node_rank, ifname) {
        (false, _, _) | (true, 0, Some(_)) => Check::ok(NAME, found),
        (true, 0, None) => Check::fail(
            NAME,
            format!(
                "{found}, a loopback address: the ranks of this node would listen for data connections there \
                 (they listen on the address they reach the store by), where no other node can reach them"
            ),
            format!(
                "map {addr} to this node's address on the network the nodes share (/etc/hosts), use that IP for \
                 MASTER_ADDR, or set RINGLEADER_IFNAME"
            ),
        ),
        (true, _, _) => Check::fail(
            NAME,
            format!("{found}, a loopback address: this node would look for node 0's store on itself"),
            format!("use node 0's IP address for MASTER_ADDR, or map {addr} to it in /etc/hosts on this node"),
        ),
    };
    (check, shown)
}

/// Node 0: is the store's port free? If so, the doctors' store is hosted
/// there (for run `run_id`) until they finish.
pub(crate) fn host_store(plan: &JobPlan, run_id: &str, token: Option<String>) -> (Check, Option<StoreServer>) {
    const NAME: &str = "store port free";
    let StoreSide::Host { bind_host, port } = &plan.store else {
        return (Check::skip(NAME, "only node 0 hosts the store"), None);
    };
    let mut opts = ServerOptions::new(run_id);
    opts.token = token;
    match StoreServer::bind(&join_host_port(bind_host, *port), opts) {
        Ok(s) => {
            let what = if *port == 0 { "an ephemeral port (one node)".to_string() } else { format!("port {port}") };
            (Check::ok(NAME, format!("{what} is free; the doctors meet there")), Some(s))
        }
        Err(e) => {
            let fix = if e.kind() == ErrorKind::PortInUse {
                "stop the process that holds it (a job or store of an earlier run?), or choose another port with \
                 --store-port (or --master-port: the store's port is MASTER_PORT + 1)"
            } else {
                "check --master-addr and --store-port"
            };
            (Check::fail(NAME, e.to_string(), fix), None)
        }
    }
}

/// Node 0: is MASTER_PORT free (PyTorch's TCPStore binds it)? The listener
/// is kept so the other doctors can try to reach it.
pub(crate) fn master_port(plan: &JobPlan) -> (Option<Check>, Option<TcpListener>) {
    const NAME: &str = "MASTER_PORT free";
    let MasterPort::Fixed(port) = plan.master_port else {
        return (None, None);
    };
    if plan.node_rank != 0 {
        return (None, None);
    }
    match TcpListener::bind((wildcard_for(&plan.master_addr), port)) {
        Ok(l) => (Some(Check::ok(NAME, format!("port {port} is free"))), Some(l)),
        Err(e) => {
            let holder = ringleader_store::port_holder(port).map(|h| format!(" by {h}")).unwrap_or_default();
            let check = Check::warn(
                NAME,
                format!("port {port}: {e}{holder}"),
                "only PyTorch's own TCPStore (init_process_group with env://) binds MASTER_PORT: for such jobs \
                 stop what holds it or choose another --master-port",
            );
            (Some(check), None)
        }
    }
}

/// Listens on up to `count` data ports where this node's ranks would.
pub(crate) fn data_ports(
    plan: &JobPlan,
    ifname: Option<&str>,
    range: Option<(u16, u16)>,
    store_endpoint: &str,
    count: usize,
) -> (Check, Vec<DataListener>) {
    const NAME: &str = "data ports listen";
    match probe::open_listeners(ifname, range, store_endpoint, count) {
        Ok((listeners, notes)) => {
            let addrs: Vec<String> = listeners.iter().map(|l| l.addr().to_string()).collect();
            let mut detail = format!("listening on {}, where this node's ranks would", addrs.join(", "));
            for n in &notes {
                detail += &format!("; {n}");
            }
            let loopback = listeners.iter().all(|l| l.addr().ip().is_loopback());
            let check = if loopback && plan.nnodes > 1 {
                Check::fail(
                    NAME,
                    format!("{detail}: a loopback address, which no other node can reach"),
                    "set RINGLEADER_IFNAME to the interface the nodes share, or make MASTER_ADDR resolve to an \
                     address of that network",
                )
            } else if notes.is_empty() {
                Check::ok(NAME, detail)
            } else {
                Check::warn(NAME, detail, "ranks take the free ports of the range: make sure it has enough")
            };
            (check, listeners)
        }
        Err(e) => {
            let fix = match &e {
                Error::PortInUse { .. } => "free ports of RINGLEADER_PORT_RANGE, or widen it",
                _ => "set RINGLEADER_IFNAME to one of this node's interfaces (or unset it)",
            };
            (Check::fail(NAME, e.to_string(), fix), Vec::new())
        }
    }
}

/// Recent OOM kills on this node: the kernel log, and this cgroup's count.
pub(crate) fn oom_kills() -> Check {
    const NAME: &str = "OOM kills";
    let now = oom::monotonic_us();
    let cgroup = oom::cgroup_oom_kills().filter(|(_, n)| *n > 0);
    let fix = "a process on this node was killed for memory (host RAM, not GPU memory): if it was a rank, lower \
               its memory (dataloader workers, prefetch, batch size) or check what else runs here";
    match oom::oom_kills_in_kernel_log() {
        KernelLog::Kills(kills) => {
            let recent: Vec<&(Option<u64>, String)> =
                kills.iter().filter(|(ts, _)| ts.is_none_or(|t| now.saturating_sub(t) < RECENT_US)).collect();
            if let Some((ts, line)) = recent.last() {
                let ago = ts.map(|t| format!(", the last {} ago", fmt_ago(now.saturating_sub(t)))).unwrap_or_default();
                Check::warn(NAME, format!("{} in the kernel log in the last 24 h{ago}: {line}", recent.len()), fix)
            } else if let Some((path, n)) = cgroup {
                Check::warn(NAME, format!("{} counts {n} OOM kills", path.display()), fix)
            } else {
                let older = if kills.is_empty() { String::new() } else { format!(" ({} older ones)", kills.len()) };
                Check::ok(NAME, format!("none in the kernel log in the last 24 h{older}"))
            }
        }
        KernelLog::Unreadable(why) => match cgroup {
            Some((path, n)) => Check::warn(NAME, format!("{} counts {n} OOM kills", path.display()), fix),
            None => Check::skip(
                NAME,
                format!("the kernel log is not readable here ({why}); as root, or with kernel.dmesg_restrict=0, it is"),
            ),
        },
    }
}

fn fmt_ago(us: u64) -> String {
    let s = us / 1_000_000;
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        _ => format!("{} h", s / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::Status;
    use crate::launch::plan::{Purpose, Sources};
    use crate::launch::JobArgs;

    fn plan(nnodes: usize, node: usize, master: &str) -> JobPlan {
        let args = JobArgs {
            nnodes: Some(nnodes),
            node_rank: Some(node),
            master_addr: Some(master.into()),
            ..Default::default()
        };
        JobPlan::resolve(&args, &Sources { env: &|_| None, hostname: "h" }, Purpose::Doctor, || "r".into()).unwrap()
    }

    #[test]
    fn loopback_master_is_fine_on_one_node_only() {
        assert_eq!(resolution(&plan(1, 0, "127.0.0.1"), None).0.status, Status::Ok);
        let (c, ips) = resolution(&plan(2, 0, "127.0.0.1"), None);
        assert_eq!((c.status, ips), (Status::Fail, vec!["127.0.0.1".to_string()]));
        assert!(c.detail.contains("no other node can reach them"), "{c:?}");
        assert_eq!(resolution(&plan(2, 0, "127.0.0.1"), Some("eth0")).0.status, Status::Ok);
        let c = resolution(&plan(2, 1, "localhost"), None).0;
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("on itself"), "{c:?}");
        let c = resolution(&plan(2, 1, "no-such-host.invalid"), None).0;
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("does not resolve"), "{c:?}");
    }

    #[test]
    fn a_taken_store_port_names_its_holder() {
        let holder = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = holder.local_addr().unwrap().port();
        let args = JobArgs { store_port: Some(port), master_port: Some(port - 1), ..Default::default() };
        let p = JobPlan::resolve(&args, &Sources { env: &|_| None, hostname: "h" }, Purpose::Doctor, || "r".into())
            .unwrap();
        let (c, server) = host_store(&p, "r", None);
        assert!(server.is_none());
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains(&format!("pid {}", std::process::id())), "{c:?}");
    }

    #[test]
    fn ages() {
        assert_eq!(fmt_ago(5_000_000), "5 s");
        assert_eq!(fmt_ago(600_000_000), "10 min");
        assert_eq!(fmt_ago(7_200_000_000), "2 h");
    }
}
