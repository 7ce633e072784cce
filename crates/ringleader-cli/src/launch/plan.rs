//! What a launch will do, resolved from the arguments before anything starts:
//! the job's shape, the ports, the run id, and each rank's environment.
//!
//! Everything here is pure (no sockets, no processes) so it is unit-tested
//! directly. Later sources of defaults (Slurm, `--hosts`) belong here too.

use super::LaunchArgs;
use ringleader_core::config::join_host_port;
use ringleader_core::Error;
use std::ffi::OsString;
use std::time::Duration;

/// torch's default MASTER_PORT, used when several nodes must agree on it.
pub(crate) const DEFAULT_MASTER_PORT: u16 = 29500;

/// Where MASTER_PORT comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MasterPort {
    /// Given, or the multi-node default.
    Fixed(u16),
    /// One node and none given: a free port, picked after the store is bound
    /// so the two cannot collide.
    PickFree,
}

/// The launcher's part in hosting ringleader's store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoreSide {
    /// Node 0: host it in-process, bound to `bind_host:port` (port 0: ephemeral).
    Host {
        /// Address to bind: the master address on one node, every interface
        /// with several.
        bind_host: String,
        /// Port to bind; 0 picks one.
        port: u16,
    },
    /// Another node hosts it at this `host:port`.
    Remote(String),
}

/// A launch, resolved.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Ranks started on this node.
    pub(crate) nproc_per_node: usize,
    /// Nodes in the job.
    pub(crate) nnodes: usize,
    /// This node's index.
    pub(crate) node_rank: usize,
    /// MASTER_ADDR: where torch's rank 0 and ringleader's store listen.
    pub(crate) master_addr: String,
    /// MASTER_PORT, or how to pick it.
    pub(crate) master_port: MasterPort,
    /// Hosting or reaching ringleader's store.
    pub(crate) store: StoreSide,
    /// RINGLEADER_RUN_ID / TORCHELASTIC_RUN_ID.
    pub(crate) run_id: String,
    /// How long survivors get after a failure before SIGTERM.
    pub(crate) grace: Duration,
    /// The program and its arguments.
    pub(crate) command: Vec<OsString>,
}

impl Plan {
    /// Checks the arguments and fills in the defaults. `fresh_run_id` makes a
    /// random id (single node, none given).
    pub(crate) fn resolve(args: &LaunchArgs, fresh_run_id: impl FnOnce() -> String) -> Result<Plan, Error> {
        let (nproc, nnodes, node_rank) = (args.nproc_per_node, args.nnodes, args.node_rank);
        if nproc == 0 {
            return Err(Error::invalid("--nproc-per-node", "must be at least 1"));
        }
        if nnodes == 0 {
            return Err(Error::invalid("--nnodes", "must be at least 1"));
        }
        if node_rank >= nnodes {
            return Err(Error::invalid(
                "--node-rank",
                format!("{node_rank} is not below --nnodes {nnodes} (nodes count from 0)"),
            ));
        }
        let multi = nnodes > 1;
        let master_addr = match (&args.master_addr, multi) {
            (Some(a), _) if !a.trim().is_empty() => a.trim().to_string(),
            (_, false) => "127.0.0.1".to_string(),
            (_, true) => {
                return Err(Error::invalid(
                    "--master-addr",
                    format!(
                        "is required with --nnodes {nnodes}: the address of node 0, \
                         the same on every node"
                    ),
                ))
            }
        };
        let master_port = match (args.master_port, multi) {
            (Some(0), _) => {
                return Err(Error::invalid(
                    "--master-port",
                    "0 is not a port (leave it out on one node to pick a free one)",
                ))
            }
            (Some(p), _) => MasterPort::Fixed(p),
            (None, true) => MasterPort::Fixed(DEFAULT_MASTER_PORT),
            (None, false) => MasterPort::PickFree,
        };
        let store_port = resolve_store_port(args.store_port, master_port, multi)?;
        let store = if node_rank == 0 {
            StoreSide::Host {
                bind_host: if multi { wildcard_for(&master_addr).to_string() } else { master_addr.clone() },
                port: store_port,
            }
        } else {
            StoreSide::Remote(join_host_port(&master_addr, store_port))
        };
        let run_id = match (&args.run_id, master_port) {
            (Some(id), _) if !id.trim().is_empty() => id.trim().to_string(),
            (_, MasterPort::Fixed(p)) if multi => derived_run_id(&master_addr, p),
            _ => fresh_run_id(),
        };
        if args.command.is_empty() {
            return Err(Error::invalid("CMD", "no command to launch was given"));
        }
        Ok(Plan {
            nproc_per_node: nproc,
            nnodes,
            node_rank,
            master_addr,
            master_port,
            store,
            run_id,
            grace: args.grace,
            command: args.command.clone(),
        })
    }

    /// Number of ranks in the job.
    pub(crate) fn world_size(&self) -> usize {
        self.nnodes * self.nproc_per_node
    }

    /// The global rank of local rank `local`.
    pub(crate) fn rank_of(&self, local: usize) -> usize {
        self.node_rank * self.nproc_per_node + local
    }

    /// The variables set for local rank `local`. `inherited` tells whether
    /// the launcher's own environment sets a variable (those marked "unless
    /// set" are then left alone).
    pub(crate) fn rank_env(
        &self,
        local: usize,
        master_port: u16,
        store_addr: &str,
        inherited: impl Fn(&str) -> bool,
    ) -> Vec<(&'static str, String)> {
        let rank = self.rank_of(local).to_string();
        let world = self.world_size().to_string();
        let mut env = vec![
            ("RANK", rank.clone()),
            ("WORLD_SIZE", world.clone()),
            ("LOCAL_RANK", local.to_string()),
            ("LOCAL_WORLD_SIZE", self.nproc_per_node.to_string()),
            ("GROUP_RANK", self.node_rank.to_string()),
            ("GROUP_WORLD_SIZE", self.nnodes.to_string()),
            ("ROLE_RANK", rank),
            ("ROLE_WORLD_SIZE", world),
            ("ROLE_NAME", "default".into()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", master_port.to_string()),
            ("TORCHELASTIC_RUN_ID", self.run_id.clone()),
            ("TORCHELASTIC_RESTART_COUNT", "0".into()),
            ("TORCHELASTIC_MAX_RESTARTS", "0".into()),
            // torch's env:// rendezvous: rank 0 hosts the TCPStore on
            // MASTER_PORT itself (no agent store there; ours is elsewhere).
            ("TORCHELASTIC_USE_AGENT_STORE", "False".into()),
            ("RINGLEADER_RUN_ID", self.run_id.clone()),
            ("RINGLEADER_STORE_ADDR", store_addr.to_string()),
        ];
        for (k, v) in [("PYTHONUNBUFFERED", "1"), ("OMP_NUM_THREADS", "1")] {
            if !inherited(k) {
                env.push((k, v.into()));
            }
        }
        env
    }
}

fn resolve_store_port(given: Option<u16>, master: MasterPort, multi: bool) -> Result<u16, Error> {
    let port = match (given, master, multi) {
        (Some(0), _, true) => {
            return Err(Error::invalid(
                "--store-port",
                "0 (an ephemeral port) cannot be used with several nodes: \
                 the other nodes could not know it",
            ))
        }
        (Some(p), _, _) => p,
        (None, MasterPort::Fixed(m), true) => m
            .checked_add(1)
            .ok_or_else(|| Error::invalid("--store-port", "is needed: the default, MASTER_PORT + 1, is past 65535"))?,
        (None, _, _) => 0,
    };
    if let MasterPort::Fixed(m) = master {
        if port == m {
            return Err(Error::invalid(
                "--store-port",
                format!(
                    "{port} is MASTER_PORT, where torch's rank 0 binds its own TCPStore; \
                     choose another port for ringleader's store"
                ),
            ));
        }
    }
    Ok(port)
}

/// The address that binds every interface of the family of `addr`.
fn wildcard_for(addr: &str) -> &'static str {
    if addr.trim_matches(['[', ']']).parse::<std::net::Ipv6Addr>().is_ok() {
        "::"
    } else {
        "0.0.0.0"
    }
}

/// The run id every node derives alike from the master's address and port
/// (FNV-1a of `addr:port`), so nodes agree without talking.
pub(crate) fn derived_run_id(master_addr: &str, master_port: u16) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in join_host_port(master_addr, master_port).bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("rl-{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(nproc: usize, nnodes: usize, node_rank: usize) -> LaunchArgs {
        LaunchArgs {
            nproc_per_node: nproc,
            nnodes,
            node_rank,
            master_addr: None,
            master_port: None,
            store_port: None,
            grace: Duration::from_secs(5),
            run_id: None,
            command: vec!["true".into()],
        }
    }

    fn resolve(a: &LaunchArgs) -> Result<Plan, Error> {
        Plan::resolve(a, || "fresh".into())
    }

    #[test]
    fn single_node_defaults() {
        let p = resolve(&args(2, 1, 0)).unwrap();
        assert_eq!(p.master_addr, "127.0.0.1");
        assert_eq!(p.master_port, MasterPort::PickFree);
        assert_eq!(p.store, StoreSide::Host { bind_host: "127.0.0.1".into(), port: 0 });
        assert_eq!(p.run_id, "fresh");
        assert_eq!(p.world_size(), 2);
    }

    #[test]
    fn multi_node_defaults() {
        let mut a = args(4, 2, 1);
        assert!(resolve(&a).unwrap_err().to_string().contains("--master-addr"));
        a.master_addr = Some("node-a".into());
        let p = resolve(&a).unwrap();
        assert_eq!(p.master_port, MasterPort::Fixed(29500));
        assert_eq!(p.store, StoreSide::Remote("node-a:29501".into()));
        assert_eq!(p.run_id, derived_run_id("node-a", 29500));
        assert_eq!((p.rank_of(0), p.rank_of(3), p.world_size()), (4, 7, 8));
        a.node_rank = 0;
        let p0 = resolve(&a).unwrap();
        assert_eq!(p0.run_id, p.run_id, "every node derives the same run id");
        assert_eq!(p0.store, StoreSide::Host { bind_host: "0.0.0.0".into(), port: 29501 });
    }

    #[test]
    fn store_port_never_master_port() {
        let mut a = args(1, 1, 0);
        a.master_port = Some(1234);
        a.store_port = Some(1234);
        let e = resolve(&a).unwrap_err().to_string();
        assert!(e.contains("--store-port") && e.contains("MASTER_PORT"), "{e}");
        let mut a = args(1, 2, 0);
        a.master_addr = Some("h".into());
        a.store_port = Some(0);
        assert!(resolve(&a).is_err());
        a.store_port = None;
        a.master_port = Some(65535);
        assert!(resolve(&a).unwrap_err().to_string().contains("--store-port"));
    }

    #[test]
    fn bad_topology() {
        assert!(resolve(&args(0, 1, 0)).is_err());
        assert!(resolve(&args(1, 0, 0)).is_err());
        let e = resolve(&args(1, 2, 2)).unwrap_err().to_string();
        assert!(e.contains("--node-rank"), "{e}");
    }

    #[test]
    fn rank_environment() {
        let mut a = args(2, 2, 1);
        a.master_addr = Some("10.0.0.1".into());
        a.run_id = Some("job7".into());
        let p = resolve(&a).unwrap();
        let env = p.rank_env(1, 29500, "10.0.0.1:29501", |k| k == "OMP_NUM_THREADS");
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("RANK"), Some("3"));
        assert_eq!(get("WORLD_SIZE"), Some("4"));
        assert_eq!(get("LOCAL_RANK"), Some("1"));
        assert_eq!(get("LOCAL_WORLD_SIZE"), Some("2"));
        assert_eq!(get("GROUP_RANK"), Some("1"));
        assert_eq!(get("ROLE_RANK"), Some("3"));
        assert_eq!(get("MASTER_ADDR"), Some("10.0.0.1"));
        assert_eq!(get("MASTER_PORT"), Some("29500"));
        assert_eq!(get("TORCHELASTIC_RUN_ID"), Some("job7"));
        assert_eq!(get("RINGLEADER_RUN_ID"), Some("job7"));
        assert_eq!(get("RINGLEADER_STORE_ADDR"), Some("10.0.0.1:29501"));
        assert_eq!(get("PYTHONUNBUFFERED"), Some("1"));
        assert_eq!(get("OMP_NUM_THREADS"), None, "inherited values are kept");
    }

    #[test]
    fn ipv6_wildcard() {
        assert_eq!(wildcard_for("::1"), "::");
        assert_eq!(wildcard_for("[fe80::1]"), "::");
        assert_eq!(wildcard_for("node-a"), "0.0.0.0");
    }
}
