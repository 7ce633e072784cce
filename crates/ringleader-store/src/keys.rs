//! The store keys ringleader itself uses, in one place, so the runtime, the
//! launcher and the tools agree on them. Everything lives under `rl/`;
//! user programs sharing the store should stay out of that prefix: the store
//! lets only a job's ranks write there, and launchers and tools the few keys
//! [`tool_may_write`] names.

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

/// The sub-group the job's communicator spans, when it is one (JSON
/// [`ringleader_core::Group`], written by its rank 0): tools name global
/// ranks with it.
pub const GROUP: &str = "rl/group";

/// The world size the first rank to register claimed (set once, by
/// compare-and-set): a rank that claims another fails with
/// `world-size-mismatch` at once, and so do the ranks waiting for it.
pub const WORLD_SIZE: &str = "rl/world_size";

/// Left by a rank whose world size differs from [`WORLD_SIZE`] (its own
/// claim), so that the ranks waiting for the count fail at once too.
pub const WORLD_CONFLICT: &str = "rl/world_conflict";

/// How many ranks have registered (a counter).
pub const REGISTERED: &str = "rl/registered";

/// Set by the rank whose registration completed the count: the one key the
/// others wait on, so that waiting for N ranks costs O(1) per rank.
pub const ALL_REGISTERED: &str = "rl/all_registered";

/// A rank's snapshot (JSON [`ringleader_diag`-style snapshot]) published when
/// a collective fails.
pub fn snapshot(r: Rank) -> String {
    format!("rl/snap/{r}")
}

/// Prefix of every snapshot.
pub const SNAPSHOT_PREFIX: &str = "rl/snap/";

/// When a rank entered its recent collectives (JSON
/// `ringleader_diag::straggler::Arrivals`), for straggler statistics.
///
/// ```
/// assert_eq!(ringleader_store::keys::arrivals(4), "rl/arrivals/4");
/// ```
pub fn arrivals(r: Rank) -> String {
    format!("{ARRIVALS_PREFIX}{r}")
}

/// Prefix of every arrivals record.
pub const ARRIVALS_PREFIX: &str = "rl/arrivals/";

/// The verdict every rank agrees on (JSON diagnosis; first writer wins).
pub const VERDICT: &str = "rl/verdict";

/// The counter of succession round `round`: when no verdict came in time
/// (the rank deciding it died or stalled), each waiting rank adds 1, and
/// the one that finds it at 1 decides in its place; the others wait again.
pub fn succession(round: u32) -> String {
    format!("{SUCCESSION_PREFIX}{round}")
}

/// Prefix of every succession counter.
pub const SUCCESSION_PREFIX: &str = "rl/succession/";

/// How a rank's process ended, written by its launcher (`exited with code 3`,
/// `killed by signal 9 (SIGKILL, OOM killer)`).
pub fn exit(r: Rank) -> String {
    format!("rl/exit/{r}")
}

/// Prefix of every exit record.
pub const EXIT_PREFIX: &str = "rl/exit/";

/// A rank's answer to a dump request for a running job's timeline
/// (`ringleader status --trace`): `{"request": N, "snapshot": {...}}`, its
/// compact snapshot (the newest flight records) and the request number it
/// answers. Overwritten by each request, so the store keeps one per rank.
pub fn view(r: Rank) -> String {
    format!("{VIEW_PREFIX}{r}")
}

/// Prefix of every rank's timeline answer.
pub const VIEW_PREFIX: &str = "rl/view/";

/// A counter that `ringleader status --dump` increments: every rank writes
/// its flight-recorder dump when it changes.
pub const DUMP_REQUEST: &str = "rl/dump_request";

/// Keys of monitored barrier number `seq`: arrivals and rank 0's result.
/// Once every rank arrived at a later monitored barrier (and so has read
/// this one's result), rank 0 deletes them.
pub fn monitored_barrier(seq: u64, what: &str) -> String {
    format!("{MONITORED_BARRIER_PREFIX}{seq}/{what}")
}

/// Prefix of every monitored barrier's keys.
pub const MONITORED_BARRIER_PREFIX: &str = "rl/mb/";

/// The barrier number a monitored barrier's key belongs to.
///
/// ```
/// use ringleader_store::keys;
/// assert_eq!(keys::monitored_barrier_seq(&keys::monitored_barrier(7, "arrived/2")), Some(7));
/// assert_eq!(keys::monitored_barrier_seq("rl/verdict"), None);
/// ```
pub fn monitored_barrier_seq(key: &str) -> Option<u64> {
    key.strip_prefix(MONITORED_BARRIER_PREFIX)?.split('/').next()?.parse().ok()
}

/// A rank's outcome of the data-plane preflight at init (JSON: the pairs it
/// could not connect, empty when its mesh was built), so that a rank that
/// failed can name every failing pair, not only its own.
///
/// ```
/// assert_eq!(ringleader_store::keys::mesh(2), "rl/mesh/2");
/// ```
pub fn mesh(r: Rank) -> String {
    format!("rl/mesh/{r}")
}

/// Prefix of every mesh outcome.
pub const MESH_PREFIX: &str = "rl/mesh/";

/// A rank claimed twice: written by the process the store refused (JSON:
/// rank, first claimant, second claimant), so that the ranks waiting for the
/// rest of the job fail with `duplicate-rank` too, instead of timing out.
pub fn conflict(r: Rank) -> String {
    format!("rl/conflict/{r}")
}

/// Prefix of every conflict record.
pub const CONFLICT_PREFIX: &str = "rl/conflict/";

/// What `ringleader doctor` on node `node` publishes at the doctors'
/// temporary store; `what` is `node` (its report), `probe` (what it could
/// reach) or `done`.
///
/// ```
/// assert_eq!(ringleader_store::keys::doctor("probe", 1), "rl/doctor/probe/1");
/// ```
pub fn doctor(what: &str, node: usize) -> String {
    format!("{DOCTOR_PREFIX}{what}/{node}")
}

/// Set by every `ringleader launch` that records exit records in this store:
/// when a rank vanishes, the verdict may wait a moment for its launcher to
/// say how it ended.
pub const LAUNCHER: &str = "rl/launcher";

/// A rank's RDMA queue-pair endpoints (JSON: the device and, per peer, one
/// endpoint per stream; or why it has no device), published at init so that
/// every pair of ranks connects its queue pairs, or both keep TCP.
///
/// ```
/// assert_eq!(ringleader_store::keys::rdma(5), "rl/rdma/5");
/// ```
pub fn rdma(r: Rank) -> String {
    format!("rl/rdma/{r}")
}

/// Prefix of every RDMA endpoint record.
pub const RDMA_PREFIX: &str = "rl/rdma/";

/// Prefix of the doctors' reports ([`doctor`]).
pub const DOCTOR_PREFIX: &str = "rl/doctor/";

/// Whether a connection that is not one of the job's ranks (a launcher, a
/// tool such as `ringleader status`, a doctor, a process the store refused
/// as a duplicate rank) may write `key`: how ranks ended ([`EXIT_PREFIX`]),
/// that a launcher records them ([`LAUNCHER`]), dump requests
/// ([`DUMP_REQUEST`]), duplicate-rank notes ([`CONFLICT_PREFIX`]) and the
/// doctors' reports ([`DOCTOR_PREFIX`]). Every other key under [`PREFIX`]
/// is the ranks' own.
///
/// ```
/// use ringleader_store::keys;
/// assert!(keys::tool_may_write(&keys::exit(3)) && keys::tool_may_write(keys::DUMP_REQUEST));
/// assert!(!keys::tool_may_write(keys::VERDICT) && !keys::tool_may_write(&keys::rank(0)));
/// ```
pub fn tool_may_write(key: &str) -> bool {
    [EXIT_PREFIX, CONFLICT_PREFIX, DOCTOR_PREFIX].iter().any(|p| key.starts_with(p))
        || key == LAUNCHER
        || key == DUMP_REQUEST
}
