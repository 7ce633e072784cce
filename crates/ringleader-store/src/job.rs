//! Who is in the job and whether they are alive, as the store sees it.
//!
//! The store is the one place every rank stays connected to, so it is the
//! natural witness of a rank's death: a TCP connection that closes without a
//! `Leave` message means the process ended without cleaning up. These types
//! carry that knowledge to the watchdog, the verdict engine and
//! `ringleader status`. Ages are computed with the *server's* clock, so clock
//! skew between hosts never makes a healthy rank look stale.

use ringleader_core::Rank;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// What a connection stands for, declared in the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The connection that represents a rank's life; at most one per rank.
    /// When it closes without [`StoreClient::leave`](crate::StoreClient::leave),
    /// the rank is [`Presence::Vanished`].
    Member,
    /// Any other connection: of a rank (a helper thread's, say; it names
    /// the rank, and acts as the rank while its member connection is
    /// connected), of a launcher or of a user program. Does not count for
    /// liveness.
    Aux,
    /// A viewer such as `ringleader status`. Never counts for liveness,
    /// writes only what tools record (see the crate docs), and may use the
    /// run id `*` for the store's run (the only one of a store of any run).
    Tool,
}

impl Role {
    /// Stable one-byte wire code.
    pub(crate) const fn code(self) -> u8 {
        match self {
            Role::Member => 0,
            Role::Aux => 1,
            Role::Tool => 2,
        }
    }

    /// Inverse of [`Role::code`].
    pub(crate) fn from_code(code: u8) -> Option<Role> {
        [Role::Member, Role::Aux, Role::Tool].get(code as usize).copied()
    }
}

/// Whether a rank's member connection is open, and if not, how it closed
/// (the store's view; the verdict's own `Liveness` adds what the ranks saw).
///
/// ```
/// use ringleader_store::Presence;
/// assert_eq!(Presence::Vanished.to_string(), "vanished");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Presence {
    /// The member connection is open.
    Connected,
    /// The rank said goodbye before closing (it destroyed its communicator
    /// or exited normally).
    Left,
    /// The connection closed or reset without a goodbye: the process was
    /// killed, crashed, or its host went away.
    Vanished,
}

impl Presence {
    /// Stable one-byte wire code.
    pub(crate) const fn code(self) -> u8 {
        match self {
            Presence::Connected => 0,
            Presence::Left => 1,
            Presence::Vanished => 2,
        }
    }

    /// Inverse of [`Presence::code`].
    pub(crate) fn from_code(code: u8) -> Option<Presence> {
        [Presence::Connected, Presence::Left, Presence::Vanished].get(code as usize).copied()
    }
}

impl fmt::Display for Presence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Presence::Connected => "connected",
            Presence::Left => "left",
            Presence::Vanished => "vanished",
        })
    }
}

/// One rank as the store last saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankStatus {
    /// The rank.
    pub rank: Rank,
    /// Whether its member connection is alive.
    pub liveness: Presence,
    /// Its host name, as it declared.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// Its library version.
    pub version: String,
    /// The world size it was launched with, when it said.
    pub world_size: Option<usize>,
    /// Time since `liveness` last changed (by the store's clock).
    pub since_change: Duration,
    /// Time since its last heartbeat (by the store's clock); `None` before the first.
    pub heartbeat_age: Option<Duration>,
    /// The payload of its last heartbeat (opaque to the store).
    pub heartbeat: Vec<u8>,
}

impl fmt::Display for RankStatus {
    /// `rank 1 (node-b pid 42): vanished 3.2 s ago`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} ({} pid {}): {}", self.rank, self.host, self.pid, self.liveness)?;
        if self.liveness != Presence::Connected {
            write!(f, " {:.1} s ago", self.since_change.as_secs_f64())?;
        }
        Ok(())
    }
}

/// The job as the store sees it: every rank that ever connected as a member,
/// and the job-wide abort record.
///
/// ```
/// use ringleader_store::{JobStatus, Presence};
/// let s = JobStatus { generation: 0, ranks: vec![], abort: None };
/// assert!(s.with(Presence::Vanished).is_empty());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct JobStatus {
    /// Counts events (a member connected, left or vanished; the abort record
    /// was set). Pass it back to [`StoreClient::status`](crate::StoreClient::status)
    /// to wait for the next event.
    pub generation: u64,
    /// Every rank that ever connected as a member, ascending.
    pub ranks: Vec<RankStatus>,
    /// The job-wide abort record, once some rank set it.
    pub abort: Option<Vec<u8>>,
}

/// What changed in the job after a generation: the answer to
/// [`StoreClient::changes`](crate::StoreClient::changes). Heartbeats are not
/// changes (they would make every rank's news O(world size) per second);
/// a rank's entry carries its latest heartbeat when its liveness changes.
///
/// ```
/// use ringleader_store::{JobChanges, JobStatus};
/// let mut view = JobStatus::default();
/// view.apply(JobChanges { generation: 3, ranks: vec![], abort: Some(b"rank 1 failed".to_vec()), more: false });
/// assert_eq!((view.generation, view.abort.as_deref()), (3, Some(&b"rank 1 failed"[..])));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct JobChanges {
    /// The generation this answer brings the reader to: pass it back to
    /// wait for the next change.
    pub generation: u64,
    /// The ranks that left or vanished after the generation asked about,
    /// each as it is now, in the order of their departure. Joins advance
    /// the generation but are not listed: every rank joins before a job
    /// runs, so a view that starts empty at generation 0 costs the
    /// departures only ([`StoreClient::status`](crate::StoreClient::status)
    /// lists every rank).
    pub ranks: Vec<RankStatus>,
    /// The job-wide abort record, when it was set after that generation.
    pub abort: Option<Vec<u8>>,
    /// The answer stops short of the store's generation (its size is
    /// bounded): ask again at once for the rest.
    pub more: bool,
}

impl JobStatus {
    /// Brings this view up to date with `changes` (ranks replaced or
    /// added in rank order, the abort record set, the generation advanced).
    pub fn apply(&mut self, changes: JobChanges) {
        for r in changes.ranks {
            match self.ranks.binary_search_by_key(&r.rank, |x| x.rank) {
                Ok(i) => self.ranks[i] = r,
                Err(i) => self.ranks.insert(i, r),
            }
        }
        if changes.abort.is_some() {
            self.abort = changes.abort;
        }
        self.generation = changes.generation;
    }

    /// The status of `rank`, if it ever connected.
    pub fn rank(&self, rank: Rank) -> Option<&RankStatus> {
        self.ranks.iter().find(|r| r.rank == rank)
    }

    /// The ranks whose liveness is `liveness`, ascending.
    pub fn with(&self, liveness: Presence) -> Vec<Rank> {
        self.ranks.iter().filter(|r| r.liveness == liveness).map(|r| r.rank).collect()
    }
}
