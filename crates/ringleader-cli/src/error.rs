//! Errors of the `ringleader` command itself.
//!
//! A rank that fails is not one of these: its ending becomes the launcher's
//! exit code. These are the launcher's own failures (bad arguments, a port
//! that is taken, a program that cannot be started), printed as one line on
//! stderr, `ringleader <subcommand>: error: ...`.

use std::fmt;
use std::io;

/// Why a subcommand could not do its job.
#[derive(Debug)]
pub(crate) enum CliError {
    /// A ringleader error (invalid argument, port in use, ...); its message
    /// starts with the error kind, e.g. `[invalid-argument]`.
    Core(ringleader_core::Error),
    /// A system call failed; `context` says what we were doing.
    Io {
        /// What we were doing, e.g. `reading /proc/self/cgroup`.
        context: String,
        /// The failure.
        source: io::Error,
    },
    /// The command to launch could not be started.
    Spawn {
        /// The program, as given on the command line.
        program: String,
        /// The failure (not found, not executable, ...).
        source: io::Error,
    },
}

impl CliError {
    /// Wraps an I/O error with what we were doing.
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> CliError {
        CliError::Io { context: context.into(), source }
    }

    /// The exit code that reports this error: 2 for a usage error (as clap
    /// uses), 127 / 126 for a program that is missing / not executable (as
    /// shells use), 1 otherwise.
    pub(crate) fn exit_code(&self) -> i32 {
        match self {
            CliError::Core(e) if e.kind() == ringleader_core::ErrorKind::InvalidArgument => 2,
            CliError::Spawn { source, .. } => match source.kind() {
                io::ErrorKind::NotFound => 127,
                io::ErrorKind::PermissionDenied => 126,
                _ => 1,
            },
            _ => 1,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Core(e) => write!(f, "{e}"),
            CliError::Io { context, source } => write!(f, "{context}: {source}"),
            CliError::Spawn { program, source } => {
                write!(f, "cannot start {program:?}: {source}")
            }
        }
    }
}

impl std::error::Error for CliError {}

impl From<ringleader_core::Error> for CliError {
    fn from(e: ringleader_core::Error) -> CliError {
        CliError::Core(e)
    }
}

/// `Result` with [`CliError`].
pub(crate) type Result<T> = std::result::Result<T, CliError>;
