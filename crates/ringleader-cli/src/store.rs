//! `ringleader store`: a standalone store server, for jobs whose ranks are
//! started by something other than `ringleader launch` (point them at it with
//! `RINGLEADER_STORE_ADDR`). It runs until SIGINT or SIGTERM.

use crate::error::{CliError, Result};
use crate::signals::{signal_name, BlockedSignals};
use clap::Args;
use ringleader_core::config::join_host_port;
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

    /// Name of an environment variable that holds the shared secret clients
    /// must present (e.g. RINGLEADER_TOKEN). Without it, any client is
    /// accepted.
    #[arg(long, value_name = "VAR")]
    pub(crate) token_env: Option<String>,
}

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

fn serve(args: StoreArgs) -> Result<()> {
    // First, before any thread exists (see `signals`).
    let blocked = BlockedSignals::block(&[libc::SIGINT, libc::SIGTERM])
        .map_err(|e| CliError::io("blocking SIGINT and SIGTERM", e))?;
    let token = args.token_env.as_deref().map(token_from_env).transpose()?;
    let addr = join_host_port(&args.host, args.port);
    let server = crate::launch::host_store(&addr, &args.run_id, token)?;
    println!("ringleader store listening on {}", join_host_port(&args.host, server.local_addr().port()));

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
