//! What a launch will do, resolved from the arguments before anything starts:
//! the job's shape, the ports, the run id, each rank's environment, and the
//! command line of every node.
//!
//! Everything here is pure (no sockets, no processes, no process
//! environment: Slurm's variables come in through [`Sources::env`]) so it is
//! unit-tested directly.
//!
//! Where each value comes from, first match wins:
//!
//! | value | options | `--hosts` | Slurm | otherwise |
//! |---|---|---|---|---|
//! | nodes | `--nnodes` | their number | `SLURM_STEP_NUM_NODES`, `SLURM_NNODES` | 1 |
//! | node rank | `--node-rank` | this host's place | `SLURM_NODEID` | 0 |
//! | master | `--master-addr` | the first | first host of `SLURM_STEP_NODELIST` / `SLURM_JOB_NODELIST` | 127.0.0.1 on one node |
//! | MASTER_PORT | `--master-port` | | `20000 + SLURM_JOB_ID % 20000` | 29500 with several nodes, else a free port |
//! | run id | `--run-id` | | `SLURM_JOB_ID` | derived from master and port with several nodes, else random |
//! | ranks per node | `--nproc-per-node` | | `SLURM_GPUS_ON_NODE`, `SLURM_GPUS_PER_NODE`, `SLURM_STEP_GPUS`, `SLURM_JOB_GPUS` | required |

use super::JobArgs;
use ringleader_core::config::{first_slurm_host, join_host_port, slurm_master_port};
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

/// What the plan is for, which decides what must be known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// Start this node's ranks: everything.
    Launch,
    /// Print every node's command: this node's rank is not needed.
    PrintCommands,
    /// Check the nodes: the number of ranks per node is not needed.
    Doctor,
}

/// What the plan may read besides the options.
pub(crate) struct Sources<'a> {
    /// The environment (Slurm's variables).
    pub(crate) env: &'a dyn Fn(&str) -> Option<String>,
    /// This host's name, to find it in `--hosts`.
    pub(crate) hostname: &'a str,
}

/// A launch, resolved.
#[derive(Debug, Clone)]
pub(crate) struct JobPlan {
    /// Ranks started on each node (1 when a doctor was not told).
    pub(crate) nproc_per_node: usize,
    /// Nodes in the job.
    pub(crate) nnodes: usize,
    /// This node's index.
    pub(crate) node_rank: usize,
    /// Every node's name, where `--hosts` gave them.
    pub(crate) hosts: Vec<String>,
    /// MASTER_ADDR: where torch's rank 0 and ringleader's store listen.
    pub(crate) master_addr: String,
    /// MASTER_PORT, or how to pick it.
    pub(crate) master_port: MasterPort,
    /// `--store-port`, when given.
    pub(crate) store_port_given: Option<u16>,
    /// Hosting or reaching ringleader's store.
    pub(crate) store: StoreSide,
    /// RINGLEADER_RUN_ID / TORCHELASTIC_RUN_ID.
    pub(crate) run_id: String,
    /// Where the values came from, when not only from options (Slurm), for
    /// a line on stderr.
    pub(crate) note: Option<String>,
}

impl JobPlan {
    /// Checks the options and fills in the defaults (see the module docs for
    /// the order). `fresh_run_id` makes a random id (single node, none given).
    pub(crate) fn resolve(
        args: &JobArgs,
        src: &Sources<'_>,
        purpose: Purpose,
        fresh_run_id: impl FnOnce() -> String,
    ) -> Result<JobPlan, Error> {
        let slurm = SlurmNode::detect(src.env)?;
        let hosts: Vec<String> = args.hosts.iter().map(|h| h.trim().to_string()).filter(|h| !h.is_empty()).collect();
        let nnodes = match (args.nnodes, hosts.len(), &slurm) {
            (Some(n), _, _) => n,
            (None, h, _) if h > 0 => h,
            (None, _, Some(s)) => s.nnodes,
            _ => 1,
        };
        if nnodes == 0 {
            return Err(Error::invalid("--nnodes", "must be at least 1"));
        }
        if !hosts.is_empty() && hosts.len() != nnodes {
            return Err(Error::invalid("--hosts", format!("names {} nodes but --nnodes is {nnodes}", hosts.len())));
        }
        let node_rank = resolve_node_rank(args, &hosts, slurm.as_ref(), src.hostname, nnodes, purpose)?;
        let nproc = match (args.nproc_per_node, slurm.as_ref().and_then(|s| s.gpus), purpose) {
            (Some(0), _, _) => return Err(Error::invalid("--nproc-per-node", "must be at least 1")),
            (Some(n), _, _) => n,
            (None, Some(g), _) if g > 0 => g,
            (None, _, Purpose::Doctor) => 1,
            (None, _, _) => {
                let why = if slurm.is_some() { ", and Slurm gave this node no GPUs to count" } else { "" };
                return Err(Error::invalid("--nproc-per-node", format!("is required (ranks per node){why}")));
            }
        };
        let multi = nnodes > 1;
        let master_addr = match (&args.master_addr, hosts.first(), &slurm, multi) {
            (Some(a), _, _, _) if !a.trim().is_empty() => a.trim().to_string(),
            (_, Some(h), _, _) => h.clone(),
            (_, _, Some(s), _) => s.master_addr.clone(),
            (_, _, _, false) => "127.0.0.1".to_string(),
            (_, _, _, true) => {
                return Err(Error::invalid(
                    "--master-addr",
                    format!(
                        "is required with --nnodes {nnodes}: the address of node 0, the same on every node \
                         (or give every node with --hosts)"
                    ),
                ))
            }
        };
        let master_port = match (args.master_port, &slurm, multi) {
            (Some(0), _, _) => {
                return Err(Error::invalid(
                    "--master-port",
                    "0 is not a port (leave it out on one node to pick a free one)",
                ))
            }
            (Some(p), _, _) => MasterPort::Fixed(p),
            (None, Some(s), _) => MasterPort::Fixed(s.master_port),
            (None, None, true) => MasterPort::Fixed(DEFAULT_MASTER_PORT),
            (None, None, false) => MasterPort::PickFree,
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
        let run_id = match (&args.run_id, &slurm, master_port) {
            (Some(id), _, _) if !id.trim().is_empty() => id.trim().to_string(),
            (_, Some(s), _) => s.job_id.clone(),
            (_, None, MasterPort::Fixed(p)) if multi => derived_run_id(&master_addr, p),
            _ => fresh_run_id(),
        };
        ringleader_core::config::check_run_id("--run-id", &run_id)?;
        let note = slurm.as_ref().map(|s| s.describe(args, nnodes, node_rank, &master_addr, master_port, nproc));
        Ok(JobPlan {
            nproc_per_node: nproc,
            nnodes,
            node_rank,
            hosts,
            master_addr,
            master_port,
            store_port_given: args.store_port,
            store,
            run_id,
            note,
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

    /// The port of ringleader's store (0: ephemeral, one node only).
    pub(crate) fn store_port(&self) -> u16 {
        match &self.store {
            StoreSide::Host { port, .. } => *port,
            StoreSide::Remote(addr) => addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).unwrap_or(0),
        }
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

    /// The options that make node `node` launch its part of this job, every
    /// value explicit so that no node derives anything on its own.
    pub(crate) fn node_options(&self, node: usize) -> Vec<String> {
        let mut o = vec![
            "--nproc-per-node".to_string(),
            self.nproc_per_node.to_string(),
            "--nnodes".into(),
            self.nnodes.to_string(),
            "--node-rank".into(),
            node.to_string(),
            "--master-addr".into(),
            self.master_addr.clone(),
        ];
        if let MasterPort::Fixed(p) = self.master_port {
            o.extend(["--master-port".into(), p.to_string()]);
        }
        if let Some(p) = self.store_port_given {
            o.extend(["--store-port".into(), p.to_string()]);
        }
        if self.nnodes > 1 {
            o.extend(["--run-id".into(), self.run_id.clone()]);
        }
        o
    }

    /// What `--print-commands` prints: a summary, then for each node a
    /// comment naming it and the exact command line (`program launch ...`),
    /// led by the RINGLEADER_* `settings` to carry.
    pub(crate) fn print_commands(
        &self,
        program: &str,
        grace: Option<Duration>,
        command: &[OsString],
        settings: &[(String, String)],
        has_token: bool,
    ) -> String {
        let store_port = match self.store_port() {
            0 => "an ephemeral port".to_string(),
            p => format!("port {p}"),
        };
        let master_port = match self.master_port {
            MasterPort::Fixed(p) => p.to_string(),
            MasterPort::PickFree => "a free port".into(),
        };
        let mut out = format!(
            "# {} node{} x {} ranks = {} ranks; MASTER_ADDR {}, MASTER_PORT {master_port}; \
             ringleader's store on {store_port} of node 0; run id {}\n",
            self.nnodes,
            if self.nnodes == 1 { "" } else { "s" },
            self.nproc_per_node,
            self.world_size(),
            self.master_addr,
            self.run_id
        );
        out += "# run each line on its node; check the nodes first with the same line, `doctor` for `launch` \
                and without the command\n";
        if has_token {
            out += "# every node needs the same RINGLEADER_TOKEN in its environment (not printed)\n";
        }
        for node in 0..self.nnodes {
            let name = self.hosts.get(node).map(|h| format!(" ({h})")).unwrap_or_default();
            out += &format!(
                "# node {node}{name}: ranks {}-{}\n",
                node * self.nproc_per_node,
                (node + 1) * self.nproc_per_node - 1
            );
            let mut words: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={}", shell_quote(v))).collect();
            words.push(shell_quote(program));
            words.push("launch".into());
            words.extend(self.node_options(node).iter().map(|w| shell_quote(w)));
            if let Some(g) = grace {
                words.extend(["--grace".into(), format!("{}", g.as_secs_f64())]);
            }
            words.push("--".into());
            words.extend(command.iter().map(|c| shell_quote(&c.to_string_lossy())));
            out += &words.join(" ");
            out.push('\n');
        }
        out
    }
}

/// The RINGLEADER_* settings of `vars` that every node should share, sorted
/// (not the token, which is a secret, nor what the launcher sets itself).
pub(crate) fn carried_settings(vars: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    const OWN: [&str; 3] = ["RINGLEADER_TOKEN", "RINGLEADER_RUN_ID", "RINGLEADER_STORE_ADDR"];
    let mut v: Vec<(String, String)> = vars
        .into_iter()
        .filter(|(k, _)| {
            k.starts_with("RINGLEADER_") && !k.starts_with("RINGLEADER_TEST_") && !OWN.contains(&k.as_str())
        })
        .collect();
    v.sort();
    v
}

/// `s` as one POSIX shell word.
pub(crate) fn shell_quote(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:=,@+%".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn resolve_node_rank(
    args: &JobArgs,
    hosts: &[String],
    slurm: Option<&SlurmNode>,
    hostname: &str,
    nnodes: usize,
    purpose: Purpose,
) -> Result<usize, Error> {
    let rank = if let Some(r) = args.node_rank {
        r
    } else if purpose == Purpose::PrintCommands {
        0
    } else if !hosts.is_empty() {
        let short = |h: &str| h.split('.').next().unwrap_or(h).to_string();
        hosts.iter().position(|h| h == hostname || short(h) == short(hostname)).ok_or_else(|| {
            Error::invalid(
                "--node-rank",
                format!(
                    "is needed: this host ({hostname}) is not among --hosts {} (or pass --node-rank)",
                    hosts.join(",")
                ),
            )
        })?
    } else if let Some(s) = slurm {
        if let Some(n) = s.tasks_here.filter(|n| *n > 1) {
            return Err(Error::invalid(
                "--node-rank",
                format!(
                    "srun started {n} tasks on this node (SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE), but \
                     `ringleader launch` starts the ranks itself and must run once per node: \
                     `srun --ntasks-per-node=1 ringleader launch ...`"
                ),
            ));
        }
        s.node_rank
    } else {
        0
    };
    if rank >= nnodes {
        return Err(Error::invalid(
            "--node-rank",
            format!("{rank} is not below --nnodes {nnodes} (nodes count from 0)"),
        ));
    }
    Ok(rank)
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
pub(crate) fn wildcard_for(addr: &str) -> &'static str {
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

/// What the variables of a Slurm step (`srun`) say about this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlurmNode {
    /// SLURM_JOB_ID, the run id.
    job_id: String,
    /// Nodes of the step.
    nnodes: usize,
    /// SLURM_NODEID.
    node_rank: usize,
    /// The first host of the step's (or job's) node list.
    master_addr: String,
    /// Derived from the job id as the library derives it.
    master_port: u16,
    /// GPUs Slurm gave this node, if any.
    gpus: Option<usize>,
    /// Tasks of the step on this node, where Slurm says.
    tasks_here: Option<usize>,
}

impl SlurmNode {
    /// `None` outside a Slurm allocation (no SLURM_JOB_ID or SLURM_NODEID);
    /// an `invalid-argument` error naming the variable when one is malformed.
    pub(crate) fn detect(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<SlurmNode>, Error> {
        let get = |k: &str| env(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let (Some(job_id), Some(node_id)) = (get("SLURM_JOB_ID"), get("SLURM_NODEID")) else {
            return Ok(None);
        };
        let number =
            |k: &str, v: &str| v.parse::<usize>().map_err(|_| Error::invalid(k, format!("{v:?} is not a number")));
        let node_rank = number("SLURM_NODEID", &node_id)?;
        let mut nnodes = None;
        for k in ["SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"] {
            if let Some(v) = get(k) {
                nnodes = Some(number(k, &v)?);
                break;
            }
        }
        let list_var =
            ["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"].into_iter().find(|k| get(k).is_some());
        let master_addr = list_var.and_then(&get).as_deref().and_then(first_slurm_host).ok_or_else(|| {
            Error::invalid(
                "SLURM_JOB_NODELIST",
                "is not set (or empty) inside a Slurm job: the master is its first host",
            )
        })?;
        let job: u64 =
            job_id.parse().map_err(|_| Error::invalid("SLURM_JOB_ID", format!("{job_id:?} is not a number")))?;
        let tasks_here = ["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]
            .into_iter()
            .find_map(&get)
            .and_then(|v| tasks_on_node(&v, node_rank));
        Ok(Some(SlurmNode {
            job_id,
            nnodes: nnodes.unwrap_or(1),
            node_rank,
            master_addr,
            master_port: slurm_master_port(job),
            gpus: gpus_on_node(&get),
            tasks_here,
        }))
    }

    /// The stderr line that says what was taken from Slurm.
    fn describe(
        &self,
        args: &JobArgs,
        nnodes: usize,
        node_rank: usize,
        master: &str,
        port: MasterPort,
        nproc: usize,
    ) -> String {
        let mut taken = Vec::new();
        if args.nnodes.is_none() && args.hosts.is_empty() {
            taken.push(format!("{nnodes} nodes"));
        }
        if args.node_rank.is_none() && args.hosts.is_empty() {
            taken.push(format!("node rank {node_rank} (SLURM_NODEID)"));
        }
        if args.master_addr.is_none() && args.hosts.is_empty() {
            taken.push(format!("master {master} (the first host of the node list)"));
        }
        if let (None, MasterPort::Fixed(p)) = (args.master_port, port) {
            taken.push(format!("MASTER_PORT {p} (from the job id)"));
        }
        if args.nproc_per_node.is_none() {
            taken.push(format!("{nproc} ranks per node (its GPUs)"));
        }
        if args.run_id.is_none() {
            taken.push(format!("run id {}", self.job_id));
        }
        let taken = if taken.is_empty() { "nothing (every value was given)".to_string() } else { taken.join(", ") };
        format!("inside Slurm job {}: took {taken}", self.job_id)
    }
}

/// GPUs on this node: SLURM_GPUS_ON_NODE, else the count in
/// SLURM_GPUS_PER_NODE (`4`, `gpu:4`, `a100:4`), else the length of the
/// SLURM_STEP_GPUS / SLURM_JOB_GPUS list (`0,1,2,3`).
fn gpus_on_node(get: &dyn Fn(&str) -> Option<String>) -> Option<usize> {
    if let Some(n) = get("SLURM_GPUS_ON_NODE").and_then(|v| v.parse().ok()) {
        return Some(n);
    }
    if let Some(n) = get("SLURM_GPUS_PER_NODE").and_then(|v| v.rsplit(':').next().and_then(|n| n.parse().ok())) {
        return Some(n);
    }
    ["SLURM_STEP_GPUS", "SLURM_JOB_GPUS"].into_iter().find_map(get).map(|v| v.split(',').count())
}

/// The count of node `node` in a Slurm tasks-per-node list such as
/// `4(x2),3` (4 on nodes 0 and 1, 3 on node 2).
fn tasks_on_node(list: &str, node: usize) -> Option<usize> {
    let mut seen = 0;
    for item in list.split(',') {
        let (count, repeat) = match item.split_once("(x") {
            Some((c, r)) => (c.trim().parse::<usize>().ok()?, r.trim_end_matches(')').parse::<usize>().ok()?),
            None => (item.trim().parse::<usize>().ok()?, 1),
        };
        if node < seen + repeat {
            return Some(count);
        }
        seen += repeat;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn args(nproc: usize, nnodes: usize, node_rank: usize) -> JobArgs {
        JobArgs { nproc_per_node: Some(nproc), nnodes: Some(nnodes), node_rank: Some(node_rank), ..Default::default() }
    }

    fn resolve(a: &JobArgs) -> Result<JobPlan, Error> {
        resolve_in(a, &[], Purpose::Launch)
    }

    fn resolve_in(a: &JobArgs, env: &[(&str, &str)], purpose: Purpose) -> Result<JobPlan, Error> {
        let m: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let lookup = move |k: &str| m.get(k).cloned();
        JobPlan::resolve(a, &Sources { env: &lookup, hostname: "node-b.cluster" }, purpose, || "fresh".into())
    }

    #[test]
    fn single_node_defaults() {
        let p = resolve(&JobArgs { nproc_per_node: Some(2), ..Default::default() }).unwrap();
        assert_eq!(p.master_addr, "127.0.0.1");
        assert_eq!(p.master_port, MasterPort::PickFree);
        assert_eq!(p.store, StoreSide::Host { bind_host: "127.0.0.1".into(), port: 0 });
        assert_eq!(p.run_id, "fresh");
        assert_eq!(p.world_size(), 2);
        assert_eq!(p.note, None);
    }

    #[test]
    fn multi_node_defaults() {
        let mut a = args(4, 2, 1);
        assert!(resolve(&a).unwrap_err().to_string().contains("--master-addr"));
        a.master_addr = Some("node-a".into());
        let p = resolve(&a).unwrap();
        assert_eq!(p.master_port, MasterPort::Fixed(29500));
        assert_eq!(p.store, StoreSide::Remote("node-a:29501".into()));
        assert_eq!(p.store_port(), 29501);
        assert_eq!(p.run_id, derived_run_id("node-a", 29500));
        assert_eq!((p.rank_of(0), p.rank_of(3), p.world_size()), (4, 7, 8));
        a.node_rank = Some(0);
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
        let e = resolve(&JobArgs::default()).unwrap_err().to_string();
        assert!(e.contains("--nproc-per-node") && e.contains("required"), "{e}");
        let doctor = resolve_in(&JobArgs::default(), &[], Purpose::Doctor).unwrap();
        assert_eq!(doctor.nproc_per_node, 1, "a doctor does not need it");
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

    #[test]
    fn hosts_give_nodes_master_and_this_node() {
        let hosts = |h: &[&str]| JobArgs {
            nproc_per_node: Some(4),
            hosts: h.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        // This host is node-b.cluster; a short name in the list matches it.
        let p = resolve(&hosts(&["node-a", "node-b", "node-c"])).unwrap();
        assert_eq!((p.nnodes, p.node_rank, p.master_addr.as_str()), (3, 1, "node-a"));
        assert_eq!(p.store, StoreSide::Remote("node-a:29501".into()));
        let e = resolve(&hosts(&["x", "y"])).unwrap_err().to_string();
        assert!(e.contains("this host (node-b.cluster) is not among --hosts x,y"), "{e}");
        let mut a = hosts(&["x", "y"]);
        a.node_rank = Some(1);
        assert_eq!(resolve(&a).unwrap().node_rank, 1);
        a.nnodes = Some(3);
        assert!(resolve(&a).unwrap_err().to_string().contains("--hosts"));
        // Printing every node's command needs no node rank.
        let p = resolve_in(&hosts(&["x", "y"]), &[], Purpose::PrintCommands).unwrap();
        assert_eq!((p.nnodes, p.master_addr.as_str()), (2, "x"));
    }

    #[test]
    fn every_node_command_from_one_plan() {
        let a = JobArgs {
            nproc_per_node: Some(2),
            hosts: vec!["10.0.0.1".into(), "10.0.0.2".into()],
            ..Default::default()
        };
        let p = resolve_in(&a, &[], Purpose::PrintCommands).unwrap();
        let settings = carried_settings([
            ("RINGLEADER_PORT_RANGE".to_string(), "41000-41009".to_string()),
            ("RINGLEADER_TOKEN".to_string(), "secret".to_string()),
            ("RINGLEADER_TEST_ADVERTISE_VERSION".to_string(), "9".to_string()),
            ("PATH".to_string(), "/bin".to_string()),
        ]);
        assert_eq!(settings, [("RINGLEADER_PORT_RANGE".to_string(), "41000-41009".to_string())]);
        let cmd: Vec<OsString> = vec!["python".into(), "train.py".into(), "--msg".into(), "it's".into()];
        let out = p.print_commands("/opt/ringleader", Some(Duration::from_secs(1)), &cmd, &settings, true);
        let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
        let rid = derived_run_id("10.0.0.1", 29500);
        for (node, line) in lines.iter().enumerate() {
            assert_eq!(
                *line,
                format!(
                    "RINGLEADER_PORT_RANGE=41000-41009 /opt/ringleader launch --nproc-per-node 2 --nnodes 2 \
                     --node-rank {node} --master-addr 10.0.0.1 --master-port 29500 --run-id {rid} --grace 1 \
                     -- python train.py --msg 'it'\\''s'"
                )
            );
        }
        assert_eq!(lines.len(), 2);
        assert!(out.contains("# node 1 (10.0.0.2): ranks 2-3"), "{out}");
        assert!(out.contains("same RINGLEADER_TOKEN") && !out.contains("secret"), "{out}");
        assert!(out.starts_with("# 2 nodes x 2 ranks = 4 ranks; MASTER_ADDR 10.0.0.1, MASTER_PORT 29500; ringleader's store on port 29501"), "{out}");
    }

    const SLURM: [(&str, &str); 7] = [
        ("SLURM_JOB_ID", "123456"),
        ("SLURM_NODEID", "1"),
        ("SLURM_NNODES", "2"),
        ("SLURM_JOB_NODELIST", "gpu[07-08]"),
        ("SLURM_STEP_NODELIST", "gpu[07-08]"),
        ("SLURM_STEP_TASKS_PER_NODE", "1(x2)"),
        ("SLURM_GPUS_ON_NODE", "4"),
    ];

    #[test]
    fn slurm_needs_no_flags() {
        let p = resolve_in(&JobArgs::default(), &SLURM, Purpose::Launch).unwrap();
        assert_eq!((p.nnodes, p.node_rank, p.nproc_per_node), (2, 1, 4));
        assert_eq!(p.master_addr, "gpu07");
        assert_eq!(p.master_port, MasterPort::Fixed(20000 + (123456 % 20000) as u16));
        assert_eq!(p.store, StoreSide::Remote("gpu07:23457".into()));
        assert_eq!(p.run_id, "123456");
        let note = p.note.unwrap();
        assert!(note.contains("Slurm job 123456") && note.contains("node rank 1 (SLURM_NODEID)"), "{note}");
        // Node 0 of the same step hosts the store; both agree on everything else.
        let mut env0 = SLURM.to_vec();
        env0[1] = ("SLURM_NODEID", "0");
        let p0 = resolve_in(&JobArgs::default(), &env0, Purpose::Launch).unwrap();
        assert_eq!(p0.store, StoreSide::Host { bind_host: "0.0.0.0".into(), port: 23457 });
        assert_eq!(p0.run_id, "123456");
    }

    #[test]
    fn slurm_values_yield_to_options() {
        let a = JobArgs {
            nproc_per_node: Some(2),
            master_addr: Some("10.1.1.1".into()),
            master_port: Some(30000),
            run_id: Some("mine".into()),
            ..Default::default()
        };
        let p = resolve_in(&a, &SLURM, Purpose::Launch).unwrap();
        assert_eq!((p.nproc_per_node, p.master_addr.as_str(), p.run_id.as_str()), (2, "10.1.1.1", "mine"));
        assert_eq!(p.store, StoreSide::Remote("10.1.1.1:30001".into()));
        assert_eq!(p.node_rank, 1);
    }

    #[test]
    fn slurm_gpu_and_task_variables() {
        let env = |pairs: &[(&str, &str)]| {
            let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            move |k: &str| m.get(k).cloned()
        };
        let count = |pairs: &[(&str, &str)]| gpus_on_node(&env(pairs));
        assert_eq!(count(&[("SLURM_GPUS_PER_NODE", "a100:8")]), Some(8));
        assert_eq!(count(&[("SLURM_GPUS_PER_NODE", "2")]), Some(2));
        assert_eq!(count(&[("SLURM_JOB_GPUS", "0,1,2")]), Some(3));
        assert_eq!(count(&[]), None);
        assert_eq!(tasks_on_node("4(x2),3", 0), Some(4));
        assert_eq!(tasks_on_node("4(x2),3", 1), Some(4));
        assert_eq!(tasks_on_node("4(x2),3", 2), Some(3));
        assert_eq!(tasks_on_node("4(x2),3", 3), None);
        assert_eq!(tasks_on_node("1", 0), Some(1));

        // Several launchers per node would claim one node rank twice.
        let mut many = SLURM.to_vec();
        many[5] = ("SLURM_STEP_TASKS_PER_NODE", "4(x2)");
        let e = resolve_in(&JobArgs::default(), &many, Purpose::Launch).unwrap_err().to_string();
        assert!(e.contains("--ntasks-per-node=1"), "{e}");
        // No GPUs: the number of ranks must be given.
        let no_gpu: Vec<_> = SLURM.iter().copied().filter(|(k, _)| *k != "SLURM_GPUS_ON_NODE").collect();
        let e = resolve_in(&JobArgs::default(), &no_gpu, Purpose::Launch).unwrap_err().to_string();
        assert!(e.contains("--nproc-per-node") && e.contains("no GPUs"), "{e}");
        // Malformed values name their variable; outside Slurm nothing is taken.
        let mut bad = SLURM.to_vec();
        bad[1] = ("SLURM_NODEID", "one");
        assert!(resolve_in(&JobArgs::default(), &bad, Purpose::Launch)
            .unwrap_err()
            .to_string()
            .contains("SLURM_NODEID"));
        assert_eq!(SlurmNode::detect(&env(&[("SLURM_JOB_ID", "1")])).unwrap(), None);
    }

    #[test]
    fn shell_words() {
        assert_eq!(shell_quote("train.py"), "train.py");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }
}
