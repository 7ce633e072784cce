//! Warnings and errors reach stderr without any setup, one line each,
//! prefixed with the rank, because a hang that explains itself must not
//! depend on the user having configured logging. Every line is also a
//! `tracing` event, and `RINGLEADER_LOG` installs a stderr subscriber with
//! that filter for the library's debug output.

use ringleader_core::Rank;
use std::io::Write;
use std::sync::Once;

/// Prints `[ringleader rank R] warning: msg` on stderr (and emits it to tracing).
pub(crate) fn warn(rank: Rank, msg: &str) {
    tracing::warn!(rank, "{msg}");
    let _ = writeln!(std::io::stderr().lock(), "[ringleader rank {rank}] warning: {msg}");
}

/// Prints `[ringleader rank R] error: msg` on stderr (and emits it to tracing).
pub(crate) fn error(rank: Rank, msg: &str) {
    tracing::error!(rank, "{msg}");
    let _ = writeln!(std::io::stderr().lock(), "[ringleader rank {rank}] error: {msg}");
}

/// Installs a tracing subscriber once if `RINGLEADER_LOG` is set.
pub(crate) fn init_from_env() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Ok(filter) = std::env::var("RINGLEADER_LOG") {
            if !filter.is_empty() {
                let _ = tracing_subscriber::fmt()
                    .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                    .with_writer(std::io::stderr)
                    .try_init();
            }
        }
    });
}
