//! `ringleader store`: a standalone store server, for jobs whose ranks are
//! started by something other than `ringleader launch` (point them at it with
//! `RINGLEADER_STORE_ADDR`). It runs until SIGINT or SIGTERM.
//!
//! Like the ranks, `launch` and `status`, it reads the shared secret from
//! RINGLEADER_TOKEN (or the variable `--token-env` names) and says at start-up
//! whether one is in force, never what it is.

use crate::error::{CliError, Result};
use crate::signals::{signal_name, BlockedSignals};
use clap::Args;
use ringleader_core::config::join_host_port;
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

    /// Accept only clients of this run (`*`: any run).
    #[arg(long, default_value = "*", value_name = "ID")]
    pub(crate) run_id: String,

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
    let server = crate::launch::host_store(&addr, &args.run_id, token.map(|(t, _)| t))?;
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
