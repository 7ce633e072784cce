//! Warnings and errors reach stderr without any setup, one line each,
//! prefixed with the (global) rank, because a hang that explains itself must
//! not depend on the user having configured logging. Each line leaves in one
//! write, so lines of several ranks sharing a terminal or a pipe never
//! interleave mid-line. Every line is also a
//! `tracing` event, and `RINGLEADER_LOG` installs a stderr subscriber with
//! that filter for the library's debug output.

use ringleader_core::Config;
use std::io::Write;
use std::sync::Once;

/// Prints `[ringleader rank R] warning: msg` on stderr (and emits it to
/// tracing), with this communicator's global rank.
pub(crate) fn warn(cfg: &Config, msg: &str) {
    let rank = cfg.global_rank();
    tracing::warn!(rank, "{msg}");
    line(&format!("[ringleader rank {rank}] warning: {msg}\n"));
}

/// Prints `[ringleader rank R] error: msg` on stderr (and emits it to
/// tracing), with this communicator's global rank.
pub(crate) fn error(cfg: &Config, msg: &str) {
    let rank = cfg.global_rank();
    tracing::error!(rank, "{msg}");
    line(&format!("[ringleader rank {rank}] error: {msg}\n"));
}

/// Writes a whole line with one `write_all` on unbuffered stderr: one
/// write(2) for any line up to the pipe's atomic size, where `writeln!`
/// would issue one write per formatted piece.
fn line(text: &str) {
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
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
