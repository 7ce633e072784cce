//! How a rank's process ended, in the words the launcher prints and stores.

use crate::signals::signal_name;
use rustix::process::WaitIdStatus;

/// How a rank's process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ending {
    /// It called `exit` with this code.
    Code(i32),
    /// A signal ended it.
    Signal {
        /// The signal number.
        signal: i32,
        /// Whether it left a core dump.
        core_dumped: bool,
    },
    /// Waiting for it failed (should not happen for our own child).
    Unknown(String),
}

impl Ending {
    /// Reads a `waitid` status of an exited or killed process.
    pub(crate) fn from_waitid(status: &WaitIdStatus) -> Ending {
        if let Some(code) = status.exit_status() {
            Ending::Code(code)
        } else if let Some(signal) = status.terminating_signal() {
            Ending::Signal { signal, core_dumped: status.dumped() }
        } else {
            Ending::Unknown(format!("unexpected wait status {status:?}"))
        }
    }

    /// Exit code 0.
    pub(crate) fn is_success(&self) -> bool {
        *self == Ending::Code(0)
    }

    /// The signal that ended it, if one did.
    pub(crate) fn signal(&self) -> Option<i32> {
        match self {
            Ending::Signal { signal, .. } => Some(*signal),
            _ => None,
        }
    }

    /// The exit code a shell would report: the code itself, or 128 + signal.
    pub(crate) fn exit_code(&self) -> i32 {
        match self {
            Ending::Code(c) => *c,
            Ending::Signal { signal, .. } => 128 + signal,
            Ending::Unknown(_) => 1,
        }
    }

    /// The launcher's words, completing "rank 1 (pid 12345) ...":
    /// `exited with code 3`, `was killed by signal 9 (SIGKILL)`.
    /// `note` (e.g. `OOM killer: ...`) goes inside the parentheses.
    pub(crate) fn describe(&self, note: Option<&str>) -> String {
        match self {
            Ending::Code(c) => match note {
                Some(n) => format!("exited with code {c} ({n})"),
                None => format!("exited with code {c}"),
            },
            Ending::Signal { signal, .. } => {
                format!("was killed by signal {signal} ({})", self.signal_detail(note))
            }
            Ending::Unknown(why) => format!("ended, but how is unknown ({why})"),
        }
    }

    /// The short text stored under `rl/exit/{rank}` for the other ranks'
    /// diagnosis: `exited with code 3`, `killed by signal 9 (SIGKILL, OOM killer)`.
    pub(crate) fn store_text(&self, note: Option<&str>) -> String {
        match self {
            Ending::Code(c) => match note {
                Some(n) => format!("exited with code {c} ({n})"),
                None => format!("exited with code {c}"),
            },
            Ending::Signal { signal, .. } => {
                format!("killed by signal {signal} ({})", self.signal_detail(note))
            }
            Ending::Unknown(_) => "ended (status unknown)".into(),
        }
    }

    fn signal_detail(&self, note: Option<&str>) -> String {
        let Ending::Signal { signal, core_dumped } = self else {
            return String::new();
        };
        let mut parts = vec![signal_name(*signal)];
        if *core_dumped {
            parts.push("core dumped".into());
        }
        parts.extend(note.map(str::to_string));
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_and_codes() {
        let code = Ending::Code(3);
        assert_eq!(code.describe(None), "exited with code 3");
        assert_eq!(code.store_text(None), "exited with code 3");
        assert_eq!(code.exit_code(), 3);
        assert!(!code.is_success() && Ending::Code(0).is_success());

        let kill = Ending::Signal { signal: libc::SIGKILL, core_dumped: false };
        assert_eq!(kill.describe(None), "was killed by signal 9 (SIGKILL)");
        assert_eq!(kill.store_text(Some("OOM killer")), "killed by signal 9 (SIGKILL, OOM killer)");
        assert_eq!(kill.exit_code(), 137);

        let segv = Ending::Signal { signal: libc::SIGSEGV, core_dumped: true };
        assert_eq!(segv.describe(None), "was killed by signal 11 (SIGSEGV, core dumped)");
    }
}
