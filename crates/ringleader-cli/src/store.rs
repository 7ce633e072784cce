//! `ringleader store`: a standalone store server, for jobs whose ranks are
//! started by something other than `ringleader launch` (point them at it with
//! `RINGLEADER_STORE_ADDR`). It runs until SIGINT or SIGTERM.
//!
//! Like the ranks, `launch` and `status`, it reads the shared secret from
//! RINGLEADER_TOKEN (or the variable `--token-env` names) and says at start-up
//! whether one is in force, never what it is.
//!
//! With the default `--run-id *` it serves several jobs side by side: each
//! run id gets its own keys, ranks, abort record and verdict, created when
//! its first rank connects and dropped ten minutes after its last
//! connection closed; `ringleader status --run-id ID` views one (plain
//! `status` works while there is only one). What it holds is bounded
//! (`--max-memory`, and the store crate's `Limits`), and it raises its own
//! limit of open files to the hard limit, so that the connection limit that
//! follows the jobs' world sizes is what bounds connections.

use crate::error::{CliError, Result};
use crate::signals::{signal_name, BlockedSignals};
use clap::Args;
use ringleader_core::config::join_host_port;
use ringleader_store::{ServerOptions, StoreServer};
use std::io::Write as _;
use std::sync::mpsc;

/// Arguments of `ringleader store`.
#[derive(Debug, Args)]
pub(crate) struct StoreArgs {
    /// Port to listen on (0: pick a free one and print it).
    #[arg(long, value_name = "P")]
    pub(crate) port: u16,

    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0", value_name = "H")]
    pub(crate) host: String,

    /// Accept only clients of this run (`*`: any run, several side by side,
    /// each with keys, ranks and verdict of its own).
    #[arg(long, default_value = "*", value_name = "ID")]
    pub(crate) run_id: String,

    /// Memory the store may hold for its runs in all, and each run at most:
    /// keys, values, rank records, parked waits (K, M, G: powers of 1024).
    /// Writes past it are refused with an error naming the budget. Answers
    /// on their way out (at most 1G) and large requests being read (at most
    /// 512M) come on top.
    #[arg(long, default_value = "2G", value_parser = crate::perf::parse_size, value_name = "SIZE")]
    pub(crate) max_memory: u64,

    /// Name of the environment variable that holds the shared secret clients
    /// must present (it must then be set) [default: RINGLEADER_TOKEN, when
    /// set; without a secret, any client of the run is admitted].
    #[arg(long, value_name = "VAR")]
    pub(crate) token_env: Option<String>,
}

/// The variable that holds the shared secret unless `--token-env` names another.
pub(crate) const TOKEN_VAR: &str = "RINGLEADER_TOKEN";

/// Runs `ringleader store`; returns the process exit code.
pub(crate) fn run(args: StoreArgs) -> i32 {
    match serve(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ringleader store: error: {e}");
            e.exit_code()
        }
    }
}

/// The shared secret in the environment variable `var` (named by a
/// `--token-env` option); an `invalid-argument` error when it is unset or empty.
pub(crate) fn token_from_env(var: &str) -> Result<String> {
    match std::env::var(var) {
        Ok(t) if !t.is_empty() => Ok(t),
        _ => {
            Err(ringleader_core::Error::invalid("--token-env", format!("the variable {var} is not set or empty"))
                .into())
        }
    }
}

/// The shared secret and the variable it came from: the one `--token-env`
/// names (an error when unset or empty), else RINGLEADER_TOKEN when set and
/// not empty, else none.
pub(crate) fn token(token_env: Option<&str>) -> Result<Option<(String, String)>> {
    match token_env {
        Some(var) => Ok(Some((token_from_env(var)?, var.to_string()))),
        None => Ok(std::env::var(TOKEN_VAR).ok().filter(|t| !t.is_empty()).map(|t| (t, TOKEN_VAR.to_string()))),
    }
}

fn serve(args: StoreArgs) -> Result<()> {
    // First, before any thread exists (see `signals`).
    let blocked = BlockedSignals::block(&[libc::SIGINT, libc::SIGTERM])
        .map_err(|e| CliError::io("blocking SIGINT and SIGTERM", e))?;
    let token = token(args.token_env.as_deref())?;
    let addr = join_host_port(&args.host, args.port);
    let var = token.as_ref().map(|(_, var)| var.clone());
    raise_open_files();
    let mut opts = ServerOptions::new(args.run_id.clone());
    opts.token = token.map(|(t, _)| t);
    opts.limits.store_bytes = args.max_memory;
    opts.limits.run_bytes = args.max_memory.min(opts.limits.run_bytes);
    let server = StoreServer::bind(&addr, opts)?;
    // The first line stays `... listening on HOST:PORT` alone: scripts read
    // the port from it, and may close the pipe then (hence no panic on a
    // failed write, as println! would).
    let run = if args.run_id == "*" { "of any run".to_string() } else { format!("of run {}", args.run_id) };
    let token_note = match var {
        Some(var) => format!("token required: clients {run} must present the secret in {var}"),
        None => format!("no token ({TOKEN_VAR} is not set): any client {run} is admitted"),
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "ringleader store listening on {}", join_host_port(&args.host, server.local_addr().port()));
    let _ = writeln!(out, "ringleader store: {token_note}");
    drop(out);

    let (tx, rx) = mpsc::channel();
    blocked
        .listen(move |sig| {
            let _ = tx.send(sig);
        })
        .map_err(|e| CliError::io("starting the signal thread", e))?;
    if let Ok(sig) = rx.recv() {
        eprintln!("ringleader store: got {}; shutting down", signal_name(sig));
    }
    server.shutdown();
    Ok(())
}

/// Raises this process's soft limit of open files to the hard limit (best
/// effort): the store's own limits decide how many connections it keeps.
fn raise_open_files() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::debug!(%e, "cannot raise the limit of open files");
        }
    }
}
