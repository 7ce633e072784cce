//! The store keys ringleader itself uses, in one place, so the runtime, the
//! launcher and the tools agree on them. Everything lives under `rl/`;
//! user programs sharing the store should stay out of that prefix.

use ringleader_core::Rank;

/// Prefix of every key below.
pub const PREFIX: &str = "rl/";

/// A rank's registration (JSON: host, pid, version, data address, ...).
///
/// ```
/// assert_eq!(ringleader_store::keys::rank(3), "rl/rank/3");
/// ```
pub fn rank(r: Rank) -> String {
    format!("rl/rank/{r}")
}

/// Prefix of every registration.
pub const RANK_PREFIX: &str = "rl/rank/";

/// The world size the first rank to join claimed.
pub const WORLD_SIZE: &str = "rl/world_size";

/// A rank's snapshot (JSON [`ringleader_diag`-style snapshot]) published when
/// a collective fails.
pub fn snapshot(r: Rank) -> String {
    format!("rl/snap/{r}")
}

/// Prefix of every snapshot.
pub const SNAPSHOT_PREFIX: &str = "rl/snap/";

/// The verdict every rank agrees on (JSON diagnosis; first writer wins).
pub const VERDICT: &str = "rl/verdict";

/// How a rank's process ended, written by its launcher (`exited with code 3`,
/// `killed by signal 9 (SIGKILL, OOM killer)`).
pub fn exit(r: Rank) -> String {
    format!("rl/exit/{r}")
}

/// Prefix of every exit record.
pub const EXIT_PREFIX: &str = "rl/exit/";

/// A counter that `ringleader status --dump` increments: every rank writes
/// its flight-recorder dump when it changes.
pub const DUMP_REQUEST: &str = "rl/dump_request";

/// Keys of monitored barrier number `seq`: arrivals and rank 0's result.
pub fn monitored_barrier(seq: u64, what: &str) -> String {
    format!("rl/mb/{seq}/{what}")
}
