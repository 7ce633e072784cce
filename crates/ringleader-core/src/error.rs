//! The error vocabulary of docs/DESIGN.md §1: every failure carries a stable
//! [`ErrorKind`] that appears in its message (`[peer-died] ...`), so a person
//! can grep a log for it and a program can branch on it.
//!
//! Faults of a peer or of the job (a dead rank, a mismatched call) are kept
//! apart from misuse by the caller ([`Error::InvalidArgument`]), whose message
//! says what to change.

use crate::types::{Fingerprint, OpKind, Rank};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// The stable kind of an [`Error`], one of the names in docs/DESIGN.md §1.
///
/// ```
/// use ringleader_core::ErrorKind;
/// assert_eq!(ErrorKind::PeerDied.as_str(), "peer-died");
/// assert_eq!(ErrorKind::parse("peer-died"), Some(ErrorKind::PeerDied));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// A rank did not enter a collective the others are in.
    MissedCollective,
    /// Ranks called a collective with different op, dtype, count, root or reduce op.
    Mismatch,
    /// A rank's process ended without leaving the job (killed, crashed).
    PeerDied,
    /// A rank is alive but makes no progress.
    PeerStalled,
    /// A rank is slow; a warning, never an error that ends a collective.
    Straggler,
    /// A wait ran out and nothing better is known.
    Timeout,
    /// Not every rank joined before the init timeout.
    RendezvousIncomplete,
    /// Ranks were launched with different world sizes.
    WorldSizeMismatch,
    /// Two processes claim the same rank.
    DuplicateRank,
    /// Ranks run different library or protocol versions.
    VersionMismatch,
    /// The store cannot be reached (or does not speak the store protocol).
    StoreUnreachable,
    /// The port to listen on is taken.
    PortInUse,
    /// The store is reachable but a data port between two ranks is not.
    DataPortUnreachable,
    /// A peer or store belongs to a different run.
    ForeignRun,
    /// A peer failed the shared-secret check.
    AuthFailed,
    /// The communicator was aborted.
    Aborted,
    /// The caller passed something unusable.
    InvalidArgument,
    /// A bug in ringleader itself (a panic, a broken invariant), caught and
    /// named; the communicator is aborted.
    Internal,
}

impl ErrorKind {
    /// Every kind, in C ABI code order (code = index + 1).
    pub const ALL: [ErrorKind; 18] = [
        ErrorKind::MissedCollective,
        ErrorKind::Mismatch,
        ErrorKind::PeerDied,
        ErrorKind::PeerStalled,
        ErrorKind::Straggler,
        ErrorKind::Timeout,
        ErrorKind::RendezvousIncomplete,
        ErrorKind::WorldSizeMismatch,
        ErrorKind::DuplicateRank,
        ErrorKind::VersionMismatch,
        ErrorKind::StoreUnreachable,
        ErrorKind::PortInUse,
        ErrorKind::DataPortUnreachable,
        ErrorKind::ForeignRun,
        ErrorKind::AuthFailed,
        ErrorKind::Aborted,
        ErrorKind::InvalidArgument,
        ErrorKind::Internal,
    ];

    /// The stable name, e.g. `missed-collective`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::MissedCollective => "missed-collective",
            ErrorKind::Mismatch => "mismatch",
            ErrorKind::PeerDied => "peer-died",
            ErrorKind::PeerStalled => "peer-stalled",
            ErrorKind::Straggler => "straggler",
            ErrorKind::Timeout => "timeout",
            ErrorKind::RendezvousIncomplete => "rendezvous-incomplete",
            ErrorKind::WorldSizeMismatch => "world-size-mismatch",
            ErrorKind::DuplicateRank => "duplicate-rank",
            ErrorKind::VersionMismatch => "version-mismatch",
            ErrorKind::StoreUnreachable => "store-unreachable",
            ErrorKind::PortInUse => "port-in-use",
            ErrorKind::DataPortUnreachable => "data-port-unreachable",
            ErrorKind::ForeignRun => "foreign-run",
            ErrorKind::AuthFailed => "auth-failed",
            ErrorKind::Aborted => "aborted",
            ErrorKind::InvalidArgument => "invalid-argument",
            ErrorKind::Internal => "internal",
        }
    }

    /// The C ABI error code (0 is success, so codes start at 1).
    pub fn code(self) -> i32 {
        ErrorKind::ALL.iter().position(|k| *k == self).map_or(-1, |i| i as i32 + 1)
    }

    /// Inverse of [`ErrorKind::code`].
    pub fn from_code(code: i32) -> Option<ErrorKind> {
        usize::try_from(code - 1).ok().and_then(|i| ErrorKind::ALL.get(i).copied())
    }

    /// Inverse of [`ErrorKind::as_str`].
    pub fn parse(s: &str) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One rank as seen at rendezvous: where it runs.
///
/// ```
/// use ringleader_core::Member;
/// let m = Member { rank: 1, host: "node-b".into(), pid: 4242, world_size: 2 };
/// assert_eq!(m.to_string(), "rank 1 (node-b pid 4242)");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The rank it claims.
    pub rank: Rank,
    /// Its host name.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// The world size it was launched with.
    pub world_size: usize,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} ({} pid {})", self.rank, self.host, self.pid)
    }
}

/// One pair of ranks whose data connection could not be made: `src`
/// connects to `dst` at `addr` (higher ranks connect to lower ones).
///
/// ```
/// use ringleader_core::error::Unreachable;
/// let u = Unreachable { src: 2, dst: 0, addr: "10.0.0.1:40007".into(), detail: "no answer".into() };
/// assert_eq!(u.to_string(), "rank 2 cannot reach rank 0 at 10.0.0.1:40007 (no answer)");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unreachable {
    /// The rank that connects.
    pub src: Rank,
    /// The rank it connects to.
    pub dst: Rank,
    /// The `host:port` it dials.
    pub addr: String,
    /// What failed.
    pub detail: String,
}

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} cannot reach rank {} at {} ({})", self.src, self.dst, self.addr, self.detail)
    }
}

/// The verdict on a failed collective: what went wrong, who caused it, in
/// which call, and what to check next. Computed from every rank's snapshot by
/// the verdict engine (`ringleader-diag`), identical on every rank.
///
/// ```
/// use ringleader_core::{Diagnosis, ErrorKind, OpKind};
/// let d = Diagnosis {
///     kind: ErrorKind::PeerDied,
///     culprits: vec![1],
///     op: Some(OpKind::AllReduce),
///     seq: Some(7),
///     headline: "rank 1 died during all_reduce #7".into(),
///     details: vec![],
///     hints: vec!["check the kernel log for an OOM kill".into()],
///     summary: None,
/// };
/// assert!(d.to_string().starts_with("[peer-died] rank 1 died"));
/// let short = Diagnosis { summary: Some(d.summary_pointing_to("rank 0's output")), ..d };
/// assert_eq!(short.to_string(), "[peer-died] rank 1 died during all_reduce #7; the whole verdict: rank 0's output");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnosis {
    /// The cause.
    pub kind: ErrorKind,
    /// The ranks to blame, ascending.
    pub culprits: Vec<Rank>,
    /// The collective that failed.
    pub op: Option<OpKind>,
    /// Its sequence number.
    pub seq: Option<u64>,
    /// One line that names the ranks, the collective and the cause.
    pub headline: String,
    /// Supporting facts, one per line (what each rank last did, ...).
    pub details: Vec<String>,
    /// What to check next.
    pub hints: Vec<String>,
    /// One line shown instead of the whole verdict, on the ranks that do
    /// not print it (one rank per host does; see
    /// [`Diagnosis::summary_pointing_to`]), so that a job's log does not grow
    /// with its size. The fields above still hold the whole verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

impl Diagnosis {
    /// The one-line summary: the headline (the culprits, the operation and
    /// the cause, bounded whatever the world size) and `whole_at`, where the
    /// whole verdict is.
    pub fn summary_pointing_to(&self, whole_at: &str) -> String {
        let headline = self.headline.lines().next().unwrap_or_default();
        // The headline's first clause names the culprits; the clauses after
        // it (what they last did, who waits) stay while the line is short.
        let mut clauses = headline.split("; ");
        let mut short = clauses.next().unwrap_or_default().to_string();
        for c in clauses {
            if short.len() + 2 + c.len() > SUMMARY_HEADLINE_MAX {
                break;
            }
            short.push_str("; ");
            short.push_str(c);
        }
        format!("{short}; the whole verdict: {whole_at}")
    }
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(s) = &self.summary {
            return write!(f, "[{}] {s}", self.kind);
        }
        write!(f, "[{}] {}", self.kind, self.headline)?;
        for d in &self.details {
            write!(f, "\n  {d}")?;
        }
        for h in &self.hints {
            write!(f, "\n  hint: {h}")?;
        }
        Ok(())
    }
}

pub use crate::group::fmt_ranks;

/// The length past which [`Diagnosis::summary_pointing_to`] drops the
/// headline's later clauses (its first clause always stays).
const SUMMARY_HEADLINE_MAX: usize = 160;

/// At most this many members are spelled out in a message.
const MAX_MEMBERS_SHOWN: usize = 8;

fn fmt_members(members: &[Member]) -> String {
    if members.is_empty() {
        return "none".into();
    }
    let mut s = members.iter().take(MAX_MEMBERS_SHOWN).map(|m| m.to_string()).collect::<Vec<_>>().join(", ");
    if members.len() > MAX_MEMBERS_SHOWN {
        let rest: Vec<Rank> = members[MAX_MEMBERS_SHOWN..].iter().map(|m| m.rank).collect();
        s += &format!(" and {}", fmt_ranks(&rest));
    }
    s
}

/// At most this many pairs are spelled out in a message.
const MAX_PAIRS_SHOWN: usize = 12;

fn fmt_unreachable(pairs: &[Unreachable]) -> String {
    let mut s = pairs.iter().take(MAX_PAIRS_SHOWN).map(|p| p.to_string()).collect::<Vec<_>>().join("; ");
    if pairs.len() > MAX_PAIRS_SHOWN {
        s += &format!("; and {} more pairs", pairs.len() - MAX_PAIRS_SHOWN);
    }
    s
}

fn fmt_note(note: &Option<String>) -> String {
    note.as_ref().map(|n| format!("; {n}")).unwrap_or_default()
}

/// Keys for a message: the first few, then how many more (a wait for every
/// rank's key would otherwise print them all).
fn fmt_keys(keys: &[String]) -> String {
    const SHOWN: usize = 8;
    let mut s = keys.iter().take(SHOWN).map(String::as_str).collect::<Vec<_>>().join(", ");
    if keys.len() > SHOWN {
        s += &format!(" and {} more", keys.len() - SHOWN);
    }
    s
}

fn fmt_secs(d: &Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// Every error ringleader returns. Each variant maps to one [`ErrorKind`]
/// (see [`Error::kind`]) whose name starts the message.
///
/// ```
/// use ringleader_core::{Error, ErrorKind};
/// let e = Error::invalid("WORLD_SIZE", "\"two\" is not a number");
/// assert_eq!(e.kind(), ErrorKind::InvalidArgument);
/// assert_eq!(e.to_string(), "[invalid-argument] WORLD_SIZE: \"two\" is not a number");
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed something unusable; the message says what to change.
    #[error("[invalid-argument] {what}: {detail}")]
    InvalidArgument {
        /// The argument or variable at fault.
        what: String,
        /// What is wrong with it.
        detail: String,
    },

    /// No store answered at `addr` within the init timeout.
    #[error("[store-unreachable] cannot reach the store at {addr} ({attempts} attempts over {}): {last_error}; check MASTER_ADDR/MASTER_PORT, that rank 0 (or the launcher) is running, and that no firewall blocks the port (try `nc -zv HOST PORT`)", fmt_secs(.waited))]
    StoreUnreachable {
        /// host:port tried.
        addr: String,
        /// Connection attempts made.
        attempts: u32,
        /// Time spent trying.
        waited: Duration,
        /// The last failure.
        last_error: String,
    },

    /// Something answered at `addr` that is not a ringleader store, or the
    /// connection to the store broke.
    #[error("[store-unreachable] the store at {addr}: {detail}")]
    StoreProtocol {
        /// host:port of the store.
        addr: String,
        /// What went wrong.
        detail: String,
    },

    /// A bounded store wait ran out.
    #[error("[timeout] waited {} for key(s) {} at the store {addr}", fmt_secs(.waited), fmt_keys(.keys))]
    StoreTimeout {
        /// host:port of the store.
        addr: String,
        /// The keys still missing.
        keys: Vec<String>,
        /// How long it waited.
        waited: Duration,
    },

    /// The address to listen on is taken.
    #[error("[port-in-use] cannot listen on {addr}: the port is already in use{}; a process from an earlier run may still hold it (`ss -ltnp | grep PORT`)", .holder.as_ref().map(|h| format!(" by {h}")).unwrap_or_default())]
    PortInUse {
        /// host:port that was asked for.
        addr: String,
        /// The process holding it, where it could be found.
        holder: Option<String>,
    },

    /// Not every rank joined before the init timeout.
    #[error("[rendezvous-incomplete] {} of {expected} ranks joined within {}; missing {}; joined: {}; check that every node was launched and can reach the store{}", .joined.len(), fmt_secs(.waited), fmt_ranks(.missing), fmt_members(.joined), fmt_note(.note))]
    RendezvousIncomplete {
        /// The world size.
        expected: usize,
        /// The ranks that joined.
        joined: Vec<Member>,
        /// The ranks that did not.
        missing: Vec<Rank>,
        /// The init timeout.
        waited: Duration,
        /// What else is known that may explain it (how the joined ranks
        /// resolved MASTER_ADDR), if anything.
        note: Option<String>,
    },

    /// Ranks disagree about the world size.
    #[error("[world-size-mismatch] ranks were launched with different world sizes: {}; launch every node from one command (e.g. `ringleader launch --print-commands`)", .claims.iter().map(|m| format!("{m} says {}", m.world_size)).collect::<Vec<_>>().join(", "))]
    WorldSizeMismatch {
        /// Each rank and the world size it was launched with.
        claims: Vec<Member>,
    },

    /// Two processes claim the same rank.
    #[error("[duplicate-rank] rank {rank} is claimed twice: by {first} and by {second}; check --node-rank / RANK on every node")]
    DuplicateRank {
        /// The rank claimed twice.
        rank: Rank,
        /// The first claimant (host and pid).
        first: String,
        /// The second claimant.
        second: String,
    },

    /// Ranks, or a rank and the store, run different versions.
    #[error("[version-mismatch] {detail}: {}; run the same ringleader build on every node", .versions.iter().map(|(who, v)| format!("{who} runs {v}")).collect::<Vec<_>>().join(", "))]
    VersionMismatch {
        /// What was compared.
        detail: String,
        /// Who runs which version.
        versions: Vec<(String, String)>,
    },

    /// A peer or the store belongs to another run.
    #[error("[foreign-run] {addr} belongs to run {theirs:?}, this process to run {ours:?}; a process from an earlier job may still be running")]
    ForeignRun {
        /// Where the foreign party was met.
        addr: String,
        /// Our run id.
        ours: String,
        /// Theirs.
        theirs: String,
    },

    /// A peer failed the shared-secret check.
    #[error("[auth-failed] {addr}: {detail}; every rank needs the same RINGLEADER_TOKEN")]
    AuthFailed {
        /// Where.
        addr: String,
        /// What failed.
        detail: String,
    },

    /// The store is reachable but a data port is not.
    #[error("[data-port-unreachable] rank {src} cannot reach rank {dst} at {addr}: {detail}; a firewall may block the data ports: open them or pick allowed ones with RINGLEADER_PORT_RANGE, and choose the interface with RINGLEADER_IFNAME")]
    DataPortUnreachable {
        /// The rank that tried.
        src: Rank,
        /// The rank it tried to reach.
        dst: Rank,
        /// host:port tried.
        addr: String,
        /// What failed.
        detail: String,
    },

    /// The data-plane preflight at init: every pair of ranks that could not
    /// connect, as gathered from the ranks' own reports, so that every rank
    /// reports the same list.
    #[error("[data-port-unreachable] {}{}; a firewall may block the data ports: open them or pick allowed ones with RINGLEADER_PORT_RANGE (e.g. RINGLEADER_PORT_RANGE=40000-40100 on every node), and choose the interface with RINGLEADER_IFNAME", fmt_unreachable(.pairs), fmt_note(.note))]
    DataPortsUnreachable {
        /// Each pair that failed, sorted by source and destination rank.
        pairs: Vec<Unreachable>,
        /// What else is known (ranks that did not report, how MASTER_ADDR resolved).
        note: Option<String>,
    },

    /// A data connection to a peer broke during a collective (before the
    /// verdict engine decided why).
    #[error("[peer-died] lost the connection to rank {peer} during {op} #{seq}: {detail}")]
    PeerLost {
        /// The peer.
        peer: Rank,
        /// The collective.
        op: OpKind,
        /// Its sequence number.
        seq: u64,
        /// What the socket said.
        detail: String,
    },

    /// A peer destroyed its communicator (or exited cleanly) while we wait
    /// for it in a collective it never entered.
    #[error("[missed-collective] rank {peer} left the job (its last collective was #{their_seq}) while this rank waits for it in {op} #{seq}")]
    PeerLeft {
        /// The peer.
        peer: Rank,
        /// The collective we are in.
        op: OpKind,
        /// Its sequence number.
        seq: u64,
        /// The last sequence number the peer had started.
        their_seq: u64,
    },

    /// A peer sent bytes that are not a ringleader frame of this version.
    #[error("[version-mismatch] rank {peer} sent data this build cannot read ({detail}); run the same ringleader build on every node")]
    PeerProtocol {
        /// The peer.
        peer: Rank,
        /// What was wrong.
        detail: String,
    },

    /// Same call on both sides, but the ranks computed different schedules.
    #[error("[mismatch] in {op} #{seq} rank {peer} follows another schedule: {detail}; the settings that decide schedules (RINGLEADER_ALGO, RINGLEADER_STREAMS) were checked equal at init, so run the same ringleader build on every rank")]
    ScheduleMismatch {
        /// The peer.
        peer: Rank,
        /// The collective.
        op: OpKind,
        /// Its sequence number.
        seq: u64,
        /// What differed.
        detail: String,
    },

    /// A peer's frame carried a different fingerprint or sequence number.
    #[error("[mismatch] in {} #{seq} rank {peer} sent {theirs} #{their_seq}", .ours)]
    FrameMismatch {
        /// The peer.
        peer: Rank,
        /// Our sequence number.
        seq: u64,
        /// Our call.
        ours: Fingerprint,
        /// The peer's sequence number.
        their_seq: u64,
        /// The peer's call.
        theirs: Fingerprint,
    },

    /// A wait ran out with nothing better known.
    #[error("[timeout] {op} #{seq} did not complete within {}{}", fmt_secs(.waited), if .awaited.is_empty() { String::new() } else { format!(", still waiting for {}", fmt_ranks(.awaited)) })]
    Timeout {
        /// The collective.
        op: OpKind,
        /// Its sequence number.
        seq: u64,
        /// How long it waited.
        waited: Duration,
        /// The peers it was still waiting for.
        awaited: Vec<Rank>,
    },

    /// The verdict on a failed collective.
    #[error("{0}")]
    Collective(Box<Diagnosis>),

    /// The communicator was aborted (by the caller, or after an earlier failure).
    #[error("[aborted] {reason}")]
    Aborted {
        /// Why.
        reason: String,
    },

    /// A bug in ringleader: a panic (or a broken invariant) in the engine,
    /// the send/recv lane or a transport, caught and turned into this error
    /// of the operation it broke; the communicator is aborted.
    #[error("[internal] a bug in ringleader on rank {rank}{}: {what}; the communicator was aborted", .op.map(|(op, seq)| format!(" in {op} #{seq}")).unwrap_or_default())]
    Internal {
        /// The rank it happened on.
        rank: Rank,
        /// The operation it broke and its sequence number, if one.
        op: Option<(OpKind, u64)>,
        /// What happened (the panic's message and where).
        what: String,
    },
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(what: impl Into<String>, detail: impl Into<String>) -> Error {
        Error::InvalidArgument { what: what.into(), detail: detail.into() }
    }

    /// Shorthand for [`Error::Aborted`].
    pub fn aborted(reason: impl Into<String>) -> Error {
        Error::Aborted { reason: reason.into() }
    }

    /// The stable kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            Error::StoreUnreachable { .. } | Error::StoreProtocol { .. } => ErrorKind::StoreUnreachable,
            Error::StoreTimeout { .. } | Error::Timeout { .. } => ErrorKind::Timeout,
            Error::PortInUse { .. } => ErrorKind::PortInUse,
            Error::RendezvousIncomplete { .. } => ErrorKind::RendezvousIncomplete,
            Error::WorldSizeMismatch { .. } => ErrorKind::WorldSizeMismatch,
            Error::DuplicateRank { .. } => ErrorKind::DuplicateRank,
            Error::VersionMismatch { .. } => ErrorKind::VersionMismatch,
            Error::ForeignRun { .. } => ErrorKind::ForeignRun,
            Error::AuthFailed { .. } => ErrorKind::AuthFailed,
            Error::DataPortUnreachable { .. } | Error::DataPortsUnreachable { .. } => ErrorKind::DataPortUnreachable,
            Error::PeerLost { .. } => ErrorKind::PeerDied,
            Error::PeerLeft { .. } => ErrorKind::MissedCollective,
            Error::PeerProtocol { .. } => ErrorKind::VersionMismatch,
            Error::ScheduleMismatch { .. } => ErrorKind::Mismatch,
            Error::FrameMismatch { .. } => ErrorKind::Mismatch,
            Error::Collective(d) => d.kind,
            Error::Aborted { .. } => ErrorKind::Aborted,
            Error::Internal { .. } => ErrorKind::Internal,
        }
    }

    /// The ranks this error names as culprits (or missing, or conflicting).
    pub fn ranks(&self) -> Vec<Rank> {
        match self {
            Error::RendezvousIncomplete { missing, .. } => missing.clone(),
            Error::WorldSizeMismatch { claims } => claims.iter().map(|m| m.rank).collect(),
            Error::DuplicateRank { rank, .. } => vec![*rank],
            Error::DataPortUnreachable { src, dst, .. } => vec![*src, *dst],
            Error::DataPortsUnreachable { pairs, .. } => {
                let mut r: Vec<Rank> = pairs.iter().flat_map(|p| [p.src, p.dst]).collect();
                r.sort_unstable();
                r.dedup();
                r
            }
            Error::PeerLost { peer, .. }
            | Error::PeerLeft { peer, .. }
            | Error::PeerProtocol { peer, .. }
            | Error::ScheduleMismatch { peer, .. }
            | Error::FrameMismatch { peer, .. } => vec![*peer],
            Error::Timeout { awaited, .. } => awaited.clone(),
            Error::Internal { rank, .. } => vec![*rank],
            Error::Collective(d) => d.culprits.clone(),
            _ => Vec::new(),
        }
    }

    /// The sequence number of the collective concerned, if any.
    pub fn seq(&self) -> Option<u64> {
        match self {
            Error::PeerLost { seq, .. }
            | Error::PeerLeft { seq, .. }
            | Error::ScheduleMismatch { seq, .. }
            | Error::FrameMismatch { seq, .. }
            | Error::Timeout { seq, .. } => Some(*seq),
            Error::Internal { op, .. } => op.map(|(_, s)| s),
            Error::Collective(d) => d.seq,
            _ => None,
        }
    }

    /// The collective concerned, if any.
    pub fn op(&self) -> Option<OpKind> {
        match self {
            Error::PeerLost { op, .. }
            | Error::PeerLeft { op, .. }
            | Error::ScheduleMismatch { op, .. }
            | Error::Timeout { op, .. } => Some(*op),
            Error::FrameMismatch { ours, .. } => Some(ours.op),
            Error::Internal { op, .. } => op.map(|(o, _)| o),
            Error::Collective(d) => d.op,
            _ => None,
        }
    }

    /// The same error with every rank it names turned from a group rank
    /// into a global rank (see [`crate::group`]). A verdict
    /// ([`Error::Collective`]) is left alone: the verdict engine writes it
    /// with global ranks already.
    ///
    /// ```
    /// use ringleader_core::{Error, Group, OpKind};
    /// let g = Group::new("1", vec![1, 2, 3]);
    /// let e = Error::PeerLost { peer: 2, op: OpKind::AllReduce, seq: 4, detail: "reset".into() }.to_global(&g);
    /// assert_eq!(e.ranks(), vec![3]);
    /// assert!(e.to_string().contains("rank 3 during all_reduce #4"));
    /// ```
    pub fn to_global(self, group: &crate::Group) -> Error {
        let g = |r: Rank| group.global(r);
        let gs = |rs: Vec<Rank>| group.globals(&rs);
        let member = |m: Member| Member { rank: g(m.rank), ..m };
        match self {
            Error::RendezvousIncomplete { expected, joined, missing, waited, note } => Error::RendezvousIncomplete {
                expected,
                joined: joined.into_iter().map(member).collect(),
                missing: gs(missing),
                waited,
                note,
            },
            Error::WorldSizeMismatch { claims } => {
                Error::WorldSizeMismatch { claims: claims.into_iter().map(member).collect() }
            }
            Error::DuplicateRank { rank, first, second } => Error::DuplicateRank { rank: g(rank), first, second },
            Error::DataPortUnreachable { src, dst, addr, detail } => {
                Error::DataPortUnreachable { src: g(src), dst: g(dst), addr, detail }
            }
            Error::DataPortsUnreachable { pairs, note } => Error::DataPortsUnreachable {
                pairs: pairs.into_iter().map(|p| Unreachable { src: g(p.src), dst: g(p.dst), ..p }).collect(),
                note,
            },
            Error::PeerLost { peer, op, seq, detail } => Error::PeerLost { peer: g(peer), op, seq, detail },
            Error::PeerLeft { peer, op, seq, their_seq } => Error::PeerLeft { peer: g(peer), op, seq, their_seq },
            Error::PeerProtocol { peer, detail } => Error::PeerProtocol { peer: g(peer), detail },
            Error::ScheduleMismatch { peer, op, seq, detail } => {
                Error::ScheduleMismatch { peer: g(peer), op, seq, detail }
            }
            Error::FrameMismatch { peer, seq, ours, their_seq, theirs } => {
                Error::FrameMismatch { peer: g(peer), seq, ours, their_seq, theirs }
            }
            Error::Timeout { op, seq, waited, awaited } => Error::Timeout { op, seq, waited, awaited: gs(awaited) },
            Error::Internal { rank, op, what } => Error::Internal { rank: g(rank), op, what },
            other => other,
        }
    }

    /// Turns a caught panic's payload into [`Error::Internal`] for `op`
    /// (with its sequence number) on `rank`; `place` says where it was
    /// caught (`the engine thread`, ...).
    ///
    /// ```
    /// use ringleader_core::{Error, ErrorKind, OpKind};
    /// let payload = std::panic::catch_unwind(|| panic!("boom")).unwrap_err();
    /// let e = Error::from_panic(payload.as_ref(), "the engine thread", 1, Some((OpKind::AllReduce, 4)));
    /// assert_eq!(e.kind(), ErrorKind::Internal);
    /// assert_eq!(e.seq(), Some(4));
    /// assert!(e.to_string().starts_with("[internal] a bug in ringleader on rank 1 in all_reduce #4: panic in the engine thread: boom"), "{e}");
    /// ```
    pub fn from_panic(
        payload: &(dyn std::any::Any + Send),
        place: &str,
        rank: Rank,
        op: Option<(OpKind, u64)>,
    ) -> Error {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        Error::Internal { rank, op, what: format!("panic in {place}: {msg}") }
    }

    /// The verdict, when this error is one.
    pub fn diagnosis(&self) -> Option<&Diagnosis> {
        match self {
            Error::Collective(d) => Some(d),
            _ => None,
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DType;

    #[test]
    fn a_store_timeout_names_a_few_keys_and_counts_the_rest() {
        let keys: Vec<String> = (0..256).map(|r| format!("rl/rank/{r}")).collect();
        let e = Error::StoreTimeout { addr: "h:1".into(), keys, waited: Duration::from_secs(7) };
        let text = e.to_string();
        assert!(text.contains("rl/rank/7 and 248 more at the store h:1"), "{text}");
        assert!(!text.contains("rl/rank/8,"), "{text}");
    }

    #[test]
    fn every_kind_has_a_code_and_name() {
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_code(k.code()), Some(k));
            assert_eq!(ErrorKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(ErrorKind::from_code(0), None);
    }

    #[test]
    fn messages_start_with_the_kind() {
        let errs = [
            Error::invalid("x", "y"),
            Error::StoreUnreachable {
                addr: "10.0.0.1:29500".into(),
                attempts: 3,
                waited: Duration::from_secs(2),
                last_error: "connection refused".into(),
            },
            Error::RendezvousIncomplete {
                expected: 4,
                joined: vec![Member { rank: 0, host: "a".into(), pid: 1, world_size: 4 }],
                missing: vec![1, 2, 3],
                waited: Duration::from_secs(5),
                note: None,
            },
            Error::FrameMismatch {
                peer: 1,
                seq: 3,
                ours: Fingerprint::new(OpKind::AllReduce, DType::F32, 1),
                their_seq: 3,
                theirs: Fingerprint::new(OpKind::AllReduce, DType::F32, 2),
            },
            Error::Timeout { op: OpKind::Barrier, seq: 2, waited: Duration::from_secs(1), awaited: vec![2] },
        ];
        for e in errs {
            let s = e.to_string();
            assert!(s.starts_with(&format!("[{}]", e.kind())), "{s}");
        }
    }

    #[test]
    fn rendezvous_message_names_missing_and_joined() {
        let e = Error::RendezvousIncomplete {
            expected: 3,
            joined: vec![Member { rank: 0, host: "node-a".into(), pid: 10, world_size: 3 }],
            missing: vec![1, 2],
            waited: Duration::from_secs(5),
            note: Some("MASTER_ADDR node-a is a host name".into()),
        };
        let s = e.to_string();
        assert!(s.contains("missing ranks 1, 2"), "{s}");
        assert!(s.contains("rank 0 (node-a pid 10)"), "{s}");
        assert_eq!(e.ranks(), vec![1, 2]);
        assert!(s.contains("can reach the store; MASTER_ADDR node-a is a host name"), "{s}");
    }

    #[test]
    fn unreachable_pairs_are_all_named() {
        let pair = |src, dst| Unreachable { src, dst, addr: format!("10.0.0.1:4000{dst}"), detail: "no answer".into() };
        let e = Error::DataPortsUnreachable { pairs: vec![pair(2, 0), pair(3, 0), pair(3, 1)], note: None };
        assert_eq!(e.kind(), ErrorKind::DataPortUnreachable);
        assert_eq!(e.ranks(), vec![0, 1, 2, 3]);
        let s = e.to_string();
        assert!(
            s.starts_with("[data-port-unreachable] rank 2 cannot reach rank 0 at 10.0.0.1:40000 (no answer); rank 3"),
            "{s}"
        );
        assert!(s.contains("RINGLEADER_PORT_RANGE") && s.contains("RINGLEADER_IFNAME"), "{s}");
        let many =
            Error::DataPortsUnreachable { pairs: (0..20).map(|d| pair(30, d)).collect(), note: Some("n".into()) };
        assert!(many.to_string().contains("and 8 more pairs; n;"), "{many}");
    }
}
