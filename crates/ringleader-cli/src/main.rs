//! The `ringleader` command.
//!
//! One binary, one module per subcommand:
//!
//! - [`launch`]: a torchrun-like launcher that starts N ranks per node with the
//!   torchrun environment, hosts ringleader's store on node 0, prefixes every
//!   output line with the rank, and, when a rank fails, names it and how it
//!   ended (exit code, signal, OOM kill) before tearing the others down.
//! - [`store`]: a standalone store server.
//!
//! `perf`, `doctor`, `analyze` and `status` (DESIGN.md §3) will be further
//! modules beside these, each with its own clap `Args` struct and a `run`
//! function that returns the process exit code. Shared plumbing lives in
//! [`signals`] (SIGINT/SIGTERM delivered as channel messages) and [`error`].

mod error;
mod launch;
mod signals;
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
    /// Run a standalone ringleader store server until SIGINT or SIGTERM.
    Store(store::StoreArgs),
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Launch(args) => launch::run(args),
        Command::Store(args) => store::run(args),
    };
    std::process::exit(code);
}
