//! The `ringleader` command.
//!
//! One binary, one module per subcommand:
//!
//! - [`launch`]: a torchrun-like launcher that starts N ranks per node with the
//!   torchrun environment, hosts ringleader's store on node 0, prefixes every
//!   output line with the rank, and, when a rank fails, names it and how it
//!   ended (exit code, signal, OOM kill) before tearing the others down.
//! - [`doctor`]: the preflight for a launch, run on every node: name
//!   resolution, store and data ports reachable between the nodes, ports
//!   free, versions and schedule settings equal, recent OOM kills; a table
//!   that says what to fix.
//! - [`store`]: a standalone store server.
//! - [`status`]: a live view of a running job, read from its store.
//! - [`analyze`]: the verdict on a failed job, from its ranks' dumps.
//! - [`perf`]: an nccl-tests-style benchmark that starts its own ranks.
//!
//! Each has its own clap `Args` struct and a `run` function that returns the process
//! exit code. Shared plumbing lives in [`signals`] (SIGINT/SIGTERM/SIGHUP delivered
//! as channel messages), [`error`] and [`logging`] (the store's warnings on
//! stderr, filtered by RINGLEADER_LOG).

/// std's `eprintln!`, except that the whole line leaves in one write: std's
/// writes each formatted piece separately, so the lines of processes that
/// share a terminal or a pipe (a launcher and its ranks, several stores)
/// could interleave mid-line. Defined before the modules, it is the
/// `eprintln!` every one of them uses.
macro_rules! eprintln {
    ($($arg:tt)*) => {
        $crate::logging::stderr_line(&format!($($arg)*))
    };
}

mod analyze;
mod doctor;
mod error;
mod launch;
mod logging;
mod perf;
mod secret;
mod signals;
mod status;
mod store;

use clap::{Parser, Subcommand};

/// Collective communication whose hangs explain themselves.
#[derive(Debug, Parser)]
#[command(name = "ringleader", version = ringleader_core::VERSION, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The subcommands; each variant's doc comment is its `--help` summary.
#[derive(Debug, Subcommand)]
enum Command {
    /// Start N processes on this node with the torchrun environment (RANK,
    /// WORLD_SIZE, MASTER_ADDR, ...) and supervise them.
    Launch(launch::LaunchArgs),
    /// Check, on every node before a job, what would make it fail or hang:
    /// name resolution, store and data ports reachable between the nodes,
    /// ports free, versions and schedule settings equal, recent OOM kills.
    Doctor(doctor::DoctorArgs),
    /// Run a standalone ringleader store server until SIGINT or SIGTERM.
    Store(store::StoreArgs),
    /// Show a running job, rank by rank: the collective each is in, for how
    /// long, whom it waits for, and the last one it completed.
    Status(status::StatusArgs),
    /// Read the ranks' flight-recorder dumps in DIR and print the verdict and
    /// what each rank last did.
    Analyze(analyze::AnalyzeArgs),
    /// Benchmark a collective over N local ranks, nccl-tests style, checking
    /// every result.
    Perf(perf::PerfArgs),
}

impl Command {
    /// The subcommand's name, as log lines name their source.
    fn name(&self) -> &'static str {
        match self {
            Command::Launch(_) => "launch",
            Command::Doctor(_) => "doctor",
            Command::Store(_) => "store",
            Command::Status(_) => "status",
            Command::Analyze(_) => "analyze",
            Command::Perf(_) => "perf",
        }
    }
}

fn main() {
    let cli = Cli::parse();
    // A perf worker is a rank: the library logs for it (`[ringleader rank R]`
    // lines, and its own RINGLEADER_LOG subscriber).
    if !matches!(&cli.command, Command::Perf(p) if p.worker) {
        logging::init(cli.command.name());
    }
    let code = match cli.command {
        Command::Launch(args) => launch::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Store(args) => store::run(args),
        Command::Status(args) => status::run(args),
        Command::Analyze(args) => analyze::run(args),
        Command::Perf(args) => perf::run(args),
    };
    std::process::exit(code);
}
