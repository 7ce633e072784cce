//! What one rank knows about itself at a moment: its progress, its flight
//! recorder, and what it observed when a collective failed. Ranks publish a
//! snapshot to the store when a collective fails, and write it as their dump
//! (docs/DESIGN.md §3), so the run-time watchdog and `ringleader analyze` feed the
//! same verdict engine with the same data.

use crate::recorder::{now_ns, Entry, FlightRecorder};
use crate::stacks::Stacks;
use ringleader_core::{Diagnosis, Error, ErrorKind, Fingerprint, Group, OpKind, Rank, RankSet};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;

/// Version string of the dump format.
pub const DUMP_VERSION: &str = "ringleader-dump-1";

/// What a rank itself saw go wrong (a summary of its local error).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// Kind of the local error.
    pub kind: ErrorKind,
    /// Its message.
    pub message: String,
    /// The peer it concerns.
    #[serde(default)]
    pub peer: Option<Rank>,
    /// Our sequence number.
    #[serde(default)]
    pub seq: Option<u64>,
    /// The peer's sequence number, for a mismatch.
    #[serde(default)]
    pub their_seq: Option<u64>,
    /// Our call, for a mismatch.
    #[serde(default)]
    pub ours: Option<Fingerprint>,
    /// The peer's call, for a mismatch.
    #[serde(default)]
    pub theirs: Option<Fingerprint>,
    /// The operation it concerns, where the error names one (an `internal`
    /// error of a send or receive, which no collective number identifies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<OpKind>,
}

impl Observation {
    /// Summarizes a local error.
    ///
    /// ```
    /// use ringleader_core::{Error, ErrorKind, OpKind};
    /// use ringleader_diag::snapshot::Observation;
    /// let o = Observation::from_error(&Error::PeerLost { peer: 2, op: OpKind::Broadcast, seq: 4, detail: "reset".into() });
    /// assert_eq!((o.kind, o.peer, o.seq), (ErrorKind::PeerDied, Some(2), Some(4)));
    /// ```
    pub fn from_error(e: &Error) -> Observation {
        let mut o = Observation {
            kind: e.kind(),
            message: e.to_string(),
            peer: None,
            seq: e.seq(),
            their_seq: None,
            ours: None,
            theirs: None,
            op: if e.kind() == ErrorKind::Internal { e.op() } else { None },
        };
        match e {
            Error::PeerLost { peer, .. } | Error::PeerProtocol { peer, .. } | Error::ScheduleMismatch { peer, .. } => {
                o.peer = Some(*peer)
            }
            Error::PeerLeft { peer, their_seq, .. } => {
                o.peer = Some(*peer);
                o.their_seq = Some(*their_seq);
            }
            Error::FrameMismatch { peer, ours, their_seq, theirs, .. } => {
                o.peer = Some(*peer);
                o.their_seq = Some(*their_seq);
                o.ours = Some(*ours);
                o.theirs = Some(*theirs);
            }
            _ => {}
        }
        o
    }
}

/// The operation a rank is running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    /// Collective sequence number (0 for send/recv).
    pub seq: u64,
    /// The call.
    pub fingerprint: Fingerprint,
    /// How long it has been running.
    pub running_ms: u64,
    /// Peers it waits for.
    pub awaited_peers: Vec<Rank>,
}

/// A send or receive a rank waits in: the head of its queue toward one
/// peer, what the verdict's wait-for graph is made of (see [`crate::deadlock`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct P2pWait {
    /// `send` or `recv`.
    pub op: OpKind,
    /// The peer (a rank of the communicator).
    pub peer: Rank,
    /// Its per-peer sequence number.
    pub seq: u64,
}

/// A rank's progress in a few bytes: what its heartbeat carries every
/// second, so that even a rank that died or froze has a last known position.
///
/// ```
/// use ringleader_diag::snapshot::Beat;
/// let b = Beat { last_started: 3, last_completed: 2, running: None, p2p: vec![], running_site: None, last_completed_site: None };
/// assert_eq!(Beat::decode(&b.encode()), Some(b));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beat {
    /// Highest collective sequence number started.
    pub last_started: u64,
    /// Highest completed.
    pub last_completed: u64,
    /// What runs now.
    #[serde(default)]
    pub running: Option<Running>,
    /// The sends and receives it waits in (their heads, one per peer and
    /// direction), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub p2p: Vec<P2pWait>,
    /// Where the user's code called the running collective.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_site: Option<String>,
    /// Where the user's code called the last completed collective.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_completed_site: Option<String>,
}

impl Beat {
    /// Reads a recorder's counters (and, if running, the entry in flight
    /// and the peers it waits for, as the data plane publishes them in
    /// `awaited`).
    pub fn of(fr: &FlightRecorder, running: Option<(u64, Fingerprint)>, awaited: &RankSet) -> Beat {
        let p = fr.progress();
        let site = |id: u64| (id > 0).then(|| fr.site_of(id - 1)).flatten().map(|s| s.to_string());
        let running_site = running.and(site(p.running.load(Ordering::Acquire)));
        let last_completed_site = site(p.last_completed_record.load(Ordering::Relaxed));
        let running = running.map(|(seq, fingerprint)| {
            let since = p.running_since.load(Ordering::Relaxed);
            Running {
                seq,
                fingerprint,
                running_ms: crate::clock::Reader::new().age_ns(since) / 1_000_000,
                awaited_peers: awaited.ranks(),
            }
        });
        let last_completed = p.last_completed.load(Ordering::Relaxed);
        // The entry in flight and the counters are read apart: an entry the
        // counters already count as completed was read as the rank moved on.
        let running = running.filter(|r| r.seq == 0 || r.seq > last_completed);
        Beat {
            last_started: p.last_started.load(Ordering::Relaxed),
            last_completed,
            running_site: running.as_ref().and(running_site),
            running,
            p2p: Vec::new(),
            last_completed_site,
        }
    }

    /// JSON bytes.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Inverse of [`Beat::encode`]; `None` for anything else.
    pub fn decode(b: &[u8]) -> Option<Beat> {
        serde_json::from_slice(b).ok()
    }
}

/// How a rank looked to the store when a snapshot was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Liveness {
    /// Its store connection is open.
    Alive,
    /// It left cleanly (destroyed its communicator or exited normally).
    Left,
    /// Its connection closed without leaving: killed or crashed.
    Vanished,
    /// Not known.
    Unknown,
}

/// One rank as the store saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerView {
    /// The rank.
    pub rank: Rank,
    /// Its liveness.
    pub liveness: Liveness,
    /// Host name.
    #[serde(default)]
    pub host: Option<String>,
    /// Process id.
    #[serde(default)]
    pub pid: Option<u32>,
    /// Age of its last heartbeat.
    #[serde(default)]
    pub heartbeat_age_ms: Option<u64>,
    /// Its last heartbeat.
    #[serde(default)]
    pub beat: Option<Beat>,
    /// How the process ended, as its launcher reported (`killed by signal 9 ...`).
    #[serde(default)]
    pub exit: Option<String>,
}

/// A rank's snapshot, also its dump file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// [`DUMP_VERSION`].
    pub version: String,
    /// The rank in its communicator (its group rank in a sub-group).
    pub rank: Rank,
    /// Its rank in the job: `rank`, or what `group` maps it to.
    #[serde(default)]
    pub global_rank: Option<Rank>,
    /// The sub-group the communicator spans, if it is one (see
    /// [`ringleader_core::group`]); ranks named to a person are global.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<Group>,
    /// The world size (of the communicator).
    pub world_size: usize,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// The job's run id.
    pub run_id: String,
    /// ringleader version.
    pub library_version: String,
    /// When taken, ns since the Unix epoch.
    pub time_ns: u64,
    /// Progress counters and the operation in flight.
    pub beat: Beat,
    /// Whether the communicator was destroyed.
    #[serde(default)]
    pub destroyed: bool,
    /// What this rank observed when its collective failed.
    #[serde(default)]
    pub observation: Option<Observation>,
    /// The flight recorder, oldest first.
    pub entries: Vec<Entry>,
    /// The job as the store showed it when the snapshot was taken.
    #[serde(default)]
    pub job: Vec<PeerView>,
    /// The verdict, once known.
    #[serde(default)]
    pub verdict: Option<Diagnosis>,
    /// Where the rank's threads were when it learned that the job failed
    /// (whole in a dump, [`Stacks::compact`] in a published snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stacks: Option<Stacks>,
    /// The store's wall clock minus this rank's, in nanoseconds, measured
    /// as the rank starts: adding it puts this rank's times on the store's clock, the
    /// one timeline every rank of every host shares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_offset_ns: Option<i64>,
    /// The round trip that offset came from: it is right within half of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_rtt_ns: Option<u64>,
}

impl Snapshot {
    /// An empty snapshot for `rank` (fill in the rest).
    pub fn new(rank: Rank, world_size: usize, host: &str, pid: u32, run_id: &str) -> Snapshot {
        Snapshot {
            version: DUMP_VERSION.into(),
            rank,
            global_rank: Some(rank),
            group: None,
            world_size,
            host: host.into(),
            pid,
            run_id: run_id.into(),
            library_version: ringleader_core::VERSION.into(),
            time_ns: now_ns(),
            beat: Beat {
                last_started: 0,
                last_completed: 0,
                running: None,
                p2p: Vec::new(),
                running_site: None,
                last_completed_site: None,
            },
            destroyed: false,
            observation: None,
            entries: Vec::new(),
            job: Vec::new(),
            verdict: None,
            stacks: None,
            clock_offset_ns: None,
            clock_rtt_ns: None,
        }
    }

    /// Places the snapshot in a sub-group: `global_rank` follows.
    pub fn in_group(mut self, group: Option<Group>) -> Snapshot {
        self.global_rank = Some(ringleader_core::group::global(group.as_ref(), self.rank));
        self.group = group;
        self
    }

    /// The fingerprint this rank used for collective `seq`, if it knows.
    pub fn fingerprint_of(&self, seq: u64) -> Option<Fingerprint> {
        if let Some(r) = self.beat.running.as_ref().filter(|r| r.seq == seq) {
            return Some(r.fingerprint);
        }
        self.entries
            .iter()
            .rev()
            .find(|e| e.collective_seq_id == seq && !e.fingerprint.op.is_p2p())
            .map(|e| e.fingerprint)
    }

    /// The last collective this rank completed, as `all_reduce #7`.
    pub fn last_completed_label(&self) -> Option<String> {
        let seq = self.beat.last_completed;
        (seq > 0).then(|| match self.fingerprint_of(seq) {
            Some(fp) => format!("{} #{seq}", fp.op),
            None => format!("#{seq}"),
        })
    }

    /// JSON, pretty printed.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Parses [`Snapshot::to_json`]'s output.
    pub fn from_json(s: &str) -> Result<Snapshot, serde_json::Error> {
        serde_json::from_str(s)
    }
}

/// Name of `op` for point-to-point-free labels.
pub fn op_label(op: OpKind, seq: u64) -> String {
    format!("{op} #{seq}")
}
