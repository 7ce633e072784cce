//! `ringleader doctor`: the preflight for a launch, run on every node with
//! the same options as `ringleader launch` (Slurm detection included).
//!
//! On its own node a doctor checks how MASTER_ADDR resolves, that node 0's
//! store port and MASTER_PORT are free (naming the process that holds them),
//! that it can listen on the data ports where the ranks would, and the kernel
//! log and memory cgroup for recent OOM kills. Across nodes, the doctors meet
//! at a temporary store that node 0's doctor hosts on the store port (so
//! reaching it is itself the store-port check), compare versions, the settings that
//! decide schedules (RINGLEADER_ALGO, RINGLEADER_STREAMS) and how each
//! resolves MASTER_ADDR, and every doctor connects to every doctor's data
//! ports ([`exchange`]). Each prints one table that says what to fix
//! ([`report`]) and exits 1 when a check failed. With one node, the same runs
//! on that node alone.
//!
//! Layout: [`local`] (this node's checks), [`probe`] (listening and
//! connecting), [`exchange`] (the doctors' rendezvous and the cross-node
//! checks, pure over the reports), [`report`] (the table).

mod exchange;
mod local;
mod probe;
mod report;

use crate::error::Result;
use crate::launch::plan::{JobPlan, MasterPort, Purpose, Sources};
use crate::launch::{parse_secs, random_run_id, this_host, JobArgs};
use clap::Args;
use exchange::NodeReport;
use report::{Check, Node, Report};
use ringleader_core::config::{join_host_port, parse_algo, parse_port_range, parse_streams, AlgoChoice};
use ringleader_core::{Error, ErrorKind, VERSION};
use ringleader_store::{ClientOptions, StoreClient};
use std::time::{Duration, Instant};

/// Arguments of `ringleader doctor`.
#[derive(Debug, Args)]
#[command(after_help = "\
Run it on every node, with the options you would give `ringleader launch` (without the \
command); node 0's doctor hosts a temporary store on the store port where the others meet. \
RINGLEADER_PORT_RANGE, RINGLEADER_IFNAME and RINGLEADER_TOKEN are read as the ranks would \
read them. Exits 1 when a check failed.

--json prints one object: status (overall: \"ok\", \"warn\" when a check warned, \"fail\" when \
one failed), checks [{name, status (\"ok\", \"warn\", \"fail\" or \"skip\"), detail, fix (what \
to do, or null)}], failed, warnings, ok, skipped (counts), node, nnodes, host, version, \
master_addr, header (the lines above the table).

Example (on each of two nodes):
  ringleader doctor --nnodes 2 --node-rank 0 --master-addr 10.0.0.1
  ringleader doctor --hosts node-a,node-b          (the node rank is this host's place)")]
pub(crate) struct DoctorArgs {
    /// The job's shape and where node 0 is, as for `ringleader launch`.
    #[command(flatten)]
    pub(crate) job: JobArgs,

    /// Seconds to wait for the other nodes' doctors.
    #[arg(long, default_value = "60", value_parser = parse_secs, value_name = "SECS")]
    pub(crate) timeout: Duration,

    /// Data ports each doctor listens on and every doctor connects to.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub(crate) ports: usize,

    /// Print the report as one JSON object instead of the table (schema
    /// below); the exit status is the same.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Runs `ringleader doctor`; returns the process exit code.
pub(crate) fn run(args: DoctorArgs) -> i32 {
    match diagnose(&args) {
        Ok(report) => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report.to_json()).unwrap_or_default());
            } else {
                print!("{}", report.render());
            }
            i32::from(report.failed())
        }
        Err(e) => {
            eprintln!("ringleader doctor: error: {e}");
            e.exit_code()
        }
    }
}

/// The settings of the environment the ranks would read.
struct Settings {
    ifname: Option<String>,
    port_range: Option<(u16, u16)>,
    token: Option<String>,
    version: String,
    /// RINGLEADER_ALGO as ranks would compare it: `auto`, `ring` or `rd`.
    algo: String,
    streams: usize,
}

impl Settings {
    fn from_env() -> Result<Settings> {
        let get = |k: &str| std::env::var(k).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        Ok(Settings {
            ifname: get("RINGLEADER_IFNAME"),
            port_range: get("RINGLEADER_PORT_RANGE").map(|r| parse_port_range(&r)).transpose()?,
            token: get("RINGLEADER_TOKEN"),
            version: get("RINGLEADER_TEST_ADVERTISE_VERSION").unwrap_or_else(|| VERSION.to_string()),
            algo: get("RINGLEADER_ALGO")
                .map(|a| parse_algo(&a))
                .transpose()?
                .flatten()
                .map_or("auto", AlgoChoice::name)
                .into(),
            streams: get("RINGLEADER_STREAMS").map(|v| parse_streams(&v)).transpose()?.unwrap_or(1),
        })
    }
}

fn diagnose(args: &DoctorArgs) -> Result<Report> {
    let env = |k: &str| std::env::var(k).ok();
    let host = this_host();
    let plan = JobPlan::resolve(&args.job, &Sources { env: &env, hostname: &host }, Purpose::Doctor, random_run_id)?;
    let s = Settings::from_env()?;
    let deadline = Instant::now() + args.timeout;
    let run_id = format!("{}-doctor", plan.run_id);
    let node = Node {
        node: plan.node_rank,
        nnodes: plan.nnodes,
        host: host.clone(),
        version: s.version.clone(),
        master_addr: plan.master_addr.clone(),
    };
    let mut report = Report { header: header(&plan, &host, &s), node, checks: Vec::new() };

    let (check, master_ips) = local::resolution(&plan, s.ifname.as_deref());
    report.push(check);
    let (check, server) = match plan.node_rank {
        0 => {
            let (c, s) = local::host_store(&plan, &run_id, s.token.clone());
            (Some(c), s)
        }
        _ => (None, None),
    };
    report.checks.extend(check);
    let (check, master_listener) = local::master_port(&plan);
    report.checks.extend(check);
    let store_port = server.as_ref().map_or(plan.store_port(), |s| s.local_addr().port());
    let store_addr = join_host_port(&plan.master_addr, store_port);
    let (check, listeners) = local::data_ports(&plan, s.ifname.as_deref(), s.port_range, &store_addr, args.ports);
    report.push(check);
    report.push(local::oom_kills());

    let me = NodeReport {
        node: plan.node_rank,
        host,
        version: s.version.clone(),
        master_addr: plan.master_addr.clone(),
        master_ips,
        data: listeners.iter().map(|l| l.addr().to_string()).collect(),
        master_port: master_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .map(|a| join_host_port(&plan.master_addr, a.port())),
        algo: s.algo.clone(),
        streams: s.streams,
    };
    if plan.node_rank == 0 && server.is_none() {
        report.push(Check::skip("cross-node checks", "node 0 cannot host the doctors' store: see `store port free`"));
        return Ok(report);
    }
    let mut client = match connect(&store_addr, &run_id, &s, deadline) {
        Ok(c) => {
            report.push(Check::ok("store reachable", format!("{store_addr} answered (node 0's doctor)")));
            c
        }
        Err(e) => {
            report.push(unreachable_store(&e, &plan, &store_addr));
            report.push(Check::skip("cross-node checks", "they need the doctors' store"));
            return Ok(report);
        }
    };
    let wait = deadline.saturating_duration_since(Instant::now());
    let probe_timeout = (args.timeout / 4).clamp(Duration::from_millis(300), Duration::from_secs(3));
    match exchange::rendezvous(&mut client, plan.nnodes, &me, wait, probe_timeout) {
        Ok(g) => {
            report.push(exchange::check_joined(plan.nnodes, &g, args.timeout, &store_addr));
            report.push(exchange::check_resolution_alike(&g));
            report.push(exchange::check_versions(&g));
            report.push(exchange::check_settings(&g));
            report.push(exchange::check_data_ports(&g, s.port_range));
            report.checks.extend(exchange::check_master_port(&g));
            if server.is_some() {
                let present: Vec<usize> = g.nodes.keys().copied().collect();
                exchange::wait_until_done(&mut client, &present, Duration::from_secs(3));
            }
        }
        Err(e) => report.push(Check::fail(
            "all doctors joined",
            format!("the doctors' store failed: {e}"),
            "run the doctors again (node 0's doctor must stay up until the others finish)",
        )),
    }
    drop(listeners);
    drop(master_listener);
    if let Some(s) = server {
        s.shutdown();
    }
    Ok(report)
}

/// The lines above the table: which node, which addresses and ports.
fn header(plan: &JobPlan, host: &str, s: &Settings) -> Vec<String> {
    let master_port = match plan.master_port {
        MasterPort::Fixed(p) => p.to_string(),
        MasterPort::PickFree => "a free port (one node)".into(),
    };
    let store_port = match plan.store_port() {
        0 => "an ephemeral port".to_string(),
        p => p.to_string(),
    };
    let data = match s.port_range {
        Some((lo, hi)) => format!("RINGLEADER_PORT_RANGE={lo}-{hi}"),
        None => "any free port (no RINGLEADER_PORT_RANGE)".into(),
    };
    let ifname = s.ifname.as_ref().map(|i| format!(" on RINGLEADER_IFNAME={i}")).unwrap_or_default();
    let mut h = vec![format!(
        "ringleader doctor {}: node {} of {} on {host}; MASTER_ADDR {}, MASTER_PORT {master_port}, ringleader's \
         store port {store_port}; data ports {data}{ifname}",
        s.version, plan.node_rank, plan.nnodes, plan.master_addr
    )];
    h.extend(plan.note.clone());
    h
}

/// Joins the doctors' store (retrying while node 0's doctor starts).
fn connect(addr: &str, run_id: &str, s: &Settings, deadline: Instant) -> std::result::Result<StoreClient, Error> {
    let mut o = ClientOptions::new(run_id);
    o.token = s.token.clone();
    o.library_version = s.version.clone();
    o.connect_timeout = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(500));
    o.op_timeout = Duration::from_secs(10);
    StoreClient::connect(addr, o)
}

/// The row for a store that could not be joined, with what to do per kind.
fn unreachable_store(e: &Error, plan: &JobPlan, addr: &str) -> Check {
    let port = plan.store_port();
    let fix = match e.kind() {
        ErrorKind::AuthFailed => "set the same RINGLEADER_TOKEN on every node".to_string(),
        ErrorKind::ForeignRun => "another process answers on that port (the store of another job?), or the nodes \
                                  were given different --run-id or --master-port"
            .to_string(),
        ErrorKind::VersionMismatch => "install the same ringleader build on every node".to_string(),
        _ => format!(
            "start `ringleader doctor` with the same options on node 0 too (it hosts the doctors' store); check \
             MASTER_ADDR ({}) and that TCP port {port} of node 0 is open to this node (`nc -zv {} {port}`)",
            plan.master_addr, plan.master_addr
        ),
    };
    Check::fail("store reachable", format!("{addr}: {e}"), fix)
}
