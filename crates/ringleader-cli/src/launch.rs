//! `ringleader launch`: a torchrun-like launcher whose failures explain
//! themselves.
//!
//! It starts `--nproc-per-node` copies of a command with the torchrun
//! environment (see [`plan::JobPlan::rank_env`]), hosts ringleader's store on
//! node 0, prefixes every line the ranks print with `[rank{R}]: `, and when a
//! rank fails it prints how (exit code, signal, OOM kill), records that in
//! the store under `rl/exit/{rank}`, gives the others a grace period to print
//! their own diagnosis, and tears them down; once the ranks publish their
//! verdict in the store, that grace shrinks to half a second (see
//! [`supervise`]).
//!
//! Each rank runs in a process group of its own, and every signal the
//! launcher sends goes to the whole group; when the job ends, for whatever
//! reason, every group gets a last SIGKILL, so what a rank started (a data
//! loader, `sleep 1000 &` in a shell rank) does not outlive the job. The
//! launcher ignores SIGHUP (and says so): an ssh session that drops leaves
//! the job running to its end, its ranks writing their dumps as usual.
//!
//! Every node's command can be derived from one place: `--print-commands`
//! prints them all (with `--hosts a,b,c`, or `--nnodes`), and inside a Slurm
//! allocation (`srun --ntasks-per-node=1 ringleader launch -- CMD`) the node
//! count, node rank, master and port come from Slurm's variables.
//!
//! Layout:
//! - [`plan`]: arguments (and Slurm's variables) to a resolved plan, each
//!   rank's environment and every node's command line (pure);
//! - [`child`]: starting one rank (process group, pipes, exit watcher);
//! - [`output`]: the line-prefixing copy of a rank's output (and the
//!   library's lines that many ranks print alike, printed by a few);
//! - [`supervise`]: the event loop and the teardown escalation;
//! - [`ending`]: how a rank ended, in words;
//! - [`oom`]: telling an OOM kill from another SIGKILL;
//! - [`store_link`]: hosting the store and recording endings in it.
//!
//! Ports: torch's rank 0 binds its own TCPStore on MASTER_PORT (env://), so
//! ringleader's store never uses MASTER_PORT: it listens on `--store-port`
//! (one node: an ephemeral port; several: MASTER_PORT + 1), and the ranks
//! learn it from `RINGLEADER_STORE_ADDR`.

mod child;
pub(crate) mod ending;
mod event;
pub(crate) mod oom;
pub(crate) mod output;
pub(crate) mod plan;
mod store_link;
mod supervise;

use crate::error::{CliError, Result};
use crate::secret;
use crate::signals::BlockedSignals;
use child::RankProcess;
use clap::Args;
use event::Event;
use plan::{JobPlan, MasterPort, Purpose, Sources, StoreSide};
use ringleader_core::config::join_host_port;
use rustix::process::{kill_process_group, Signal};
use std::ffi::OsString;
use std::io::Read;
use std::net::TcpListener;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use supervise::Supervisor;

pub(crate) use store_link::host_store;

/// What a job looks like from one node: the options `ringleader launch` and
/// `ringleader doctor` share. Option names follow torchrun's (the underscore
/// spellings are accepted too). Inside a Slurm allocation the unset ones
/// come from Slurm's variables.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct JobArgs {
    /// Ranks to start on each node [default under Slurm: the GPUs Slurm gave
    /// this node (SLURM_GPUS_ON_NODE, ...)].
    #[arg(long, alias = "nproc_per_node", value_name = "N")]
    pub(crate) nproc_per_node: Option<usize>,

    /// Nodes in the job (run one launcher per node) [default: the number of
    /// --hosts, Slurm's node count, or 1].
    #[arg(long, alias = "nnodes", value_name = "M")]
    pub(crate) nnodes: Option<usize>,

    /// This node's index, 0 to M-1; it runs ranks R*N to R*N+N-1. Node 0
    /// hosts ringleader's store [default: this host's place in --hosts,
    /// SLURM_NODEID, or 0].
    #[arg(long, alias = "node_rank", value_name = "R")]
    pub(crate) node_rank: Option<usize>,

    /// Every node of the job, node 0 first (names or addresses, comma
    /// separated): sets --nnodes, --master-addr (the first) and, where this
    /// host is in the list, --node-rank.
    #[arg(long, value_delimiter = ',', value_name = "HOST,...")]
    pub(crate) hosts: Vec<String>,

    /// Address of node 0, the same on every node [default: the first of
    /// --hosts or of Slurm's node list; 127.0.0.1 on one node].
    #[arg(long, alias = "master_addr", value_name = "A")]
    pub(crate) master_addr: Option<String>,

    /// MASTER_PORT, where torch's rank 0 binds its TCPStore [default: a free
    /// port on one node, 29500 with several, 20000 + SLURM_JOB_ID % 20000
    /// under Slurm].
    #[arg(long, alias = "master_port", value_name = "P")]
    pub(crate) master_port: Option<u16>,

    /// Port of ringleader's store on node 0, never MASTER_PORT [default: an
    /// ephemeral port on one node, MASTER_PORT+1 with several].
    #[arg(long, alias = "store_port", value_name = "S")]
    pub(crate) store_port: Option<u16>,

    /// Id of the job, the same on every node [default: random on one node;
    /// SLURM_JOB_ID under Slurm; derived from master address and port with
    /// several].
    #[arg(long, alias = "run_id", value_name = "ID")]
    pub(crate) run_id: Option<String>,
}

/// Arguments of `ringleader launch`.
#[derive(Debug, Args)]
#[command(after_help = "\
Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, \
GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT, \
TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, \
TORCHELASTIC_USE_AGENT_STORE=False, RINGLEADER_RUN_ID, RINGLEADER_STORE_ADDR, and \
PYTHONUNBUFFERED=1 and OMP_NUM_THREADS=1 unless already set.

Examples:
  ringleader launch --nproc-per-node 4 -- python train.py --lr 0.1
  ringleader launch --print-commands --hosts node-a,node-b --nproc-per-node 4 -- python train.py
  srun --ntasks-per-node=1 ringleader launch -- python train.py     (inside a Slurm allocation)")]
pub(crate) struct LaunchArgs {
    /// The job's shape and where node 0 is.
    #[command(flatten)]
    pub(crate) job: JobArgs,

    /// Seconds the other ranks get to exit on their own (and print their
    /// diagnosis) after one fails, before SIGTERM; SIGKILL follows 3 s later.
    #[arg(long, default_value = "5", value_parser = parse_secs, value_name = "SECS")]
    pub(crate) grace: Duration,

    /// Print the exact command for every node (derived from these options,
    /// and the RINGLEADER_* settings of this environment) instead of
    /// launching.
    #[arg(long)]
    pub(crate) print_commands: bool,

    /// The command each rank runs, and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    pub(crate) command: Vec<OsString>,
}

/// Parses a non-negative number of seconds, fractions allowed.
pub(crate) fn parse_secs(s: &str) -> std::result::Result<Duration, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..1e9).contains(&v) => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!("{s:?} is not a number of seconds")),
    }
}

/// Runs `ringleader launch`; returns the process exit code.
pub(crate) fn run(args: LaunchArgs) -> i32 {
    match launch(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ringleader launch: error: {e}");
            e.exit_code()
        }
    }
}

fn launch(args: LaunchArgs) -> Result<i32> {
    // First, before any thread exists (see `signals`).
    // SIGHUP too: an ssh session that drops must not take the job with it
    // (the supervisor ignores it, and says so).
    let blocked = BlockedSignals::block(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP])
        .map_err(|e| CliError::io("blocking SIGINT, SIGTERM and SIGHUP", e))?;
    let env = |k: &str| std::env::var(k).ok();
    let here = this_host();
    let purpose = if args.print_commands { Purpose::PrintCommands } else { Purpose::Launch };
    let plan = JobPlan::resolve(&args.job, &Sources { env: &env, hostname: &here }, purpose, random_run_id)?;
    if args.print_commands {
        let program = std::env::args().next().unwrap_or_else(|| "ringleader".into());
        let settings = plan::carried_settings(std::env::vars());
        let grace = (args.grace != DEFAULT_GRACE).then_some(args.grace);
        print!("{}", plan.print_commands(&program, grace, &args.command, &settings, env("RINGLEADER_TOKEN").is_some()));
        return Ok(0);
    }
    if let Some(note) = &plan.note {
        eprintln!("ringleader launch: {note}");
    }

    let (tx, events) = mpsc::channel();
    let signal_tx = tx.clone();
    blocked
        .listen(move |sig| {
            let _ = signal_tx.send(Event::Signal(sig));
        })
        .map_err(|e| CliError::io("starting the signal thread", e))?;

    let set_token = std::env::var(secret::TOKEN_VAR).ok().filter(|t| !t.is_empty());
    // One node: a secret of our own when none is set, handed to the ranks in
    // their environment. Several nodes have no channel for it.
    let made_token = match (&set_token, plan.nnodes) {
        (None, 1) => Some(secret::new_token().map_err(|e| CliError::io("making the job's token", e))?),
        (None, _) => {
            eprintln!(
                "ringleader launch: warning: {} is not set, so ringleader's store admits any client that reaches \
                 it; set it to the same secret on every node",
                secret::TOKEN_VAR
            );
            None
        }
        _ => None,
    };
    let token = set_token.or(made_token.clone());
    let (hosted, store_addr) = match &plan.store {
        StoreSide::Host { bind_host, port } => {
            let hosted = store_link::host_store(&join_host_port(bind_host, *port), &plan.run_id, token.clone())?;
            let addr = join_host_port(&plan.master_addr, hosted.local_addr().port());
            (Some(hosted), addr)
        }
        StoreSide::Remote(addr) => (None, addr.clone()),
    };
    // Tools of this user on this host (`ringleader status`) find our secret.
    let _token_file = match (&made_token, &hosted) {
        (Some(t), Some(h)) => secret::publish(h.local_addr().port(), t).ok(),
        _ => None,
    };
    let master_port = match plan.master_port {
        MasterPort::Fixed(p) => p,
        MasterPort::PickFree => free_port(&plan.master_addr, hosted.as_ref().map(|h| h.local_addr().port()))?,
    };

    let oom = oom::OomWatch::start();
    let recorder = store_link::ExitRecorder::start(store_addr.clone(), plan.run_id.clone(), token.clone());
    if plan.nnodes > 1 {
        eprintln!(
            "ringleader launch: node {} of {}: ranks {}-{} of {}; ringleader's store at {store_addr}; \
             MASTER_ADDR={} MASTER_PORT={master_port}",
            plan.node_rank,
            plan.nnodes,
            plan.rank_of(0),
            plan.rank_of(plan.nproc_per_node - 1),
            plan.world_size(),
            plan.master_addr
        );
    }
    let repeats = Arc::new(output::Repeats::default());
    let ranks = spawn_all(&plan, &args.command, master_port, &store_addr, made_token.as_deref(), &tx, &repeats)?;
    let verdict_tx = tx.clone();
    store_link::watch_verdict(store_addr.clone(), plan.run_id.clone(), token.clone(), move |headline| {
        let _ = verdict_tx.send(Event::Verdict(headline));
    });
    drop(tx);

    let (code, recorder) = Supervisor::new(ranks, events, args.grace, oom, recorder).run();
    for line in repeats.report() {
        eprintln!("ringleader launch: {line}");
    }
    recorder.finish(Duration::from_secs(1));
    if let Some(h) = hosted {
        if plan.nnodes > 1 {
            store_link::linger(&store_addr, &plan.run_id, token, args.grace.max(LINGER_AT_LEAST));
        }
        h.shutdown();
    }
    Ok(code)
}

/// Starts every local rank; if one cannot be started, kills those that were.
fn spawn_all(
    plan: &JobPlan,
    command: &[OsString],
    master_port: u16,
    store_addr: &str,
    made_token: Option<&str>,
    events: &mpsc::Sender<Event>,
    repeats: &Arc<output::Repeats>,
) -> Result<Vec<RankProcess>> {
    let inherited = |k: &str| std::env::var_os(k).is_some();
    let mut ranks: Vec<RankProcess> = Vec::with_capacity(plan.nproc_per_node);
    for local in 0..plan.nproc_per_node {
        let mut env = plan.rank_env(local, master_port, store_addr, inherited);
        if let Some(t) = made_token {
            env.push((secret::TOKEN_VAR, t.to_string()));
        }
        match child::spawn_rank(local, plan.rank_of(local), command, &env, events, repeats) {
            Ok(r) => ranks.push(r),
            Err(e) => {
                for r in &mut ranks {
                    let _ = kill_process_group(r.pid, Signal::KILL);
                    let _ = r.child.wait();
                }
                return Err(e);
            }
        }
    }
    Ok(ranks)
}

/// How long node 0 keeps the store up at least, after its ranks ended, for
/// the ranks of other nodes still connected to it (`--grace` if longer).
const LINGER_AT_LEAST: Duration = Duration::from_secs(3);

/// The default of `--grace`.
const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// This host's name, as the ranks register it.
pub(crate) fn this_host() -> String {
    rustix::system::uname().nodename().to_string_lossy().into_owned()
}

/// A port that is free on `host` now, other than `avoid` (our store's):
/// bind port 0, read it, close. Another process could take it before
/// torch's rank 0 binds it; the ephemeral range makes that unlikely.
pub(crate) fn free_port(host: &str, avoid: Option<u16>) -> Result<u16> {
    for _ in 0..8 {
        let l = TcpListener::bind((host, 0)).map_err(|e| CliError::io(format!("finding a free port on {host}"), e))?;
        let port = l.local_addr().map_err(|e| CliError::io("reading a bound port", e))?.port();
        if Some(port) != avoid {
            return Ok(port);
        }
    }
    Err(CliError::io(
        format!("finding a free port on {host}"),
        std::io::Error::other("the kernel kept handing out the store's port"),
    ))
}

/// 16 random hex digits (from /dev/urandom; pid and clock if unreadable).
pub(crate) fn random_run_id() -> String {
    let mut b = [0u8; 8];
    let random = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_ok();
    let n = if random {
        u64::from_le_bytes(b)
    } else {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        t.as_nanos() as u64 ^ (u64::from(std::process::id()) << 32)
    };
    format!("{n:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        launch: LaunchArgs,
    }

    #[test]
    fn command_after_dashes_keeps_its_own_options() {
        let cli = Cli::try_parse_from([
            "x",
            "--nproc-per-node",
            "2",
            "--grace",
            "0.5",
            "--",
            "python",
            "train.py",
            "--nnodes",
            "7",
        ])
        .unwrap();
        assert_eq!(cli.launch.job.nproc_per_node, Some(2));
        assert_eq!(cli.launch.job.nnodes, None);
        assert_eq!(cli.launch.grace, Duration::from_millis(500));
        assert_eq!(cli.launch.command, ["python", "train.py", "--nnodes", "7"]);
    }

    #[test]
    fn torchrun_spellings() {
        let cli = Cli::try_parse_from(["x", "--nproc_per_node=3", "train.py", "-v"]).unwrap();
        assert_eq!(cli.launch.job.nproc_per_node, Some(3));
        assert_eq!(cli.launch.command, ["train.py", "-v"]);
        assert!(Cli::try_parse_from(["x", "--nproc-per-node", "2"]).is_err());
        assert!(Cli::try_parse_from(["x", "--nproc-per-node", "2", "--grace", "-1", "t"]).is_err());
    }

    #[test]
    fn hosts_and_print_commands() {
        let cli = Cli::try_parse_from(["x", "--hosts", "a,b,c", "--print-commands", "--", "t.py"]).unwrap();
        assert_eq!(cli.launch.job.hosts, ["a", "b", "c"]);
        assert!(cli.launch.print_commands);
        assert_eq!(cli.launch.command, ["t.py"]);
    }

    #[test]
    fn free_ports_and_run_ids() {
        let p = free_port("127.0.0.1", None).unwrap();
        assert_ne!(p, 0);
        assert_ne!(random_run_id(), random_run_id());
        assert_eq!(random_run_id().len(), 16);
    }
}
