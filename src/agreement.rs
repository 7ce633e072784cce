//! The failure agreement as a sans-IO state machine: one verdict, computed
//! once, from snapshots read in chunks.
//!
//! When a collective fails, every failing rank publishes a compact snapshot
//! (the flight recorder's last [`SNAPSHOT_ENTRIES`] records, around the
//! failing collective, not the whole ring) and offers the job-wide abort
//! record. The rank whose offer set the record *decides*: it reads the job
//! status, reads the snapshots of the ranks that can still answer
//! (connected, heartbeat fresh) in chunks of [`CHUNK`], waiting a bounded
//! time for those not there yet (dead ranks write none: the verdict is
//! made from what arrived), runs the verdict engine once and publishes the
//! verdict. Every other rank *follows*: it waits for that one verdict.
//! A follower whose wait passes (the decider died or stalled) claims the
//! succession: it adds 1 to the round's counter in the store, and the one
//! rank that finds it at 1 decides in the dead decider's place while the
//! others wait again. So a failure whose decider dies costs one more
//! gather, not one per rank; after [`SUCCESSIONS`] rounds without a
//! verdict, every rank still waiting decides itself, so a verdict always
//! comes.
//!
//! No request reads every snapshot at once, and only the decider reads
//! them, so the job's cost of a failure is O(N) bytes, not the O(N²) of
//! every rank re-reading every snapshot. The machine reads no clock and
//! does no IO: `src/failure.rs` carries out its [`Action`]s against the
//! store and feeds back what it read, with the time.

use ringleader_core::{Group, Rank};
use ringleader_diag::{Beat, Evidence, Liveness, PeerView, Snapshot};
use ringleader_store::{JobStatus, Presence};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The job-wide abort record: who failed first, and what it saw. The first
/// rank to fail writes it to the store; every other rank's agreement reads
/// it as the failure's origin.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct AbortRecord {
    pub rank: usize,
    pub observation: ringleader_diag::Observation,
}

/// How long the decider waits for the snapshots of the ranks that can
/// still answer.
pub(crate) const GATHER: Duration = Duration::from_secs(2);
/// How long a follower waits for the decider's verdict before deciding
/// itself: the gather and time to read and judge the snapshots.
pub(crate) const FOLLOW: Duration = Duration::from_secs(7);
/// Rounds of succession (a new decider chosen when the last one gave no
/// verdict in time) before every waiting rank decides itself.
pub(crate) const SUCCESSIONS: u32 = 3;
/// A heartbeat older than this means the process stopped answering.
pub(crate) const STALE_MS: u64 = 3000;
/// Snapshots read per request.
pub(crate) const CHUNK: usize = 256;
/// Flight-recorder records a published snapshot keeps (the newest: the
/// failing collective and those before it, where a mismatch may have
/// started); the local dump keeps the whole ring.
pub(crate) const SNAPSHOT_ENTRIES: usize = 32;
/// A rank that was outside any operation when its snapshot was taken,
/// its last one completed at least this long before, is settled where it
/// is (asleep in its own code, a dataloader): it is not on its way into
/// the stuck collective, so the gather does not wait for it to get there
/// (which would add the whole [`GATHER`] to every such verdict).
const SETTLED_IDLE: Duration = Duration::from_secs(1);
/// Between two reads of the same rank's snapshot (one that is there but
/// does not show the rank at the failing collective yet).
const REREAD: Duration = Duration::from_millis(20);
/// Between two reads of the whole status by the decider (for ranks that
/// vanish meanwhile, heartbeats going stale, and launchers' exit records).
const STATUS_EVERY: Duration = Duration::from_millis(250);

/// What the IO layer must do next.
#[derive(Debug)]
pub(crate) enum Action {
    /// Read the job status, the exit records launchers wrote, and whether
    /// a launcher runs; feed them to [`Agreement::status`]. Not before
    /// `not_before` (sleep until then, abortably).
    ReadStatus { not_before: Instant },
    /// Wait up to `wait` for these ranks' snapshots to exist, then read
    /// those that do; feed them to [`Agreement::snapshots`].
    ReadSnapshots { ranks: Vec<Rank>, wait: Duration },
    /// No verdict came in time: add 1 to the succession counter of
    /// `round`; feed the value it now holds to [`Agreement::claimed`].
    ClaimSuccession { round: u32 },
    /// Nothing to read before `until`: sleep (abortably), then ask again.
    Pause { until: Instant },
    /// Wait until `until` for the verdict another rank publishes; feed
    /// its absence to [`Agreement::no_verdict`].
    AwaitVerdict { until: Instant },
    /// Run the verdict engine on this evidence and offer the verdict (the
    /// first one offered is everyone's).
    Decide(Box<Evidence>),
}

/// One rank's part in agreeing on a verdict.
#[derive(Debug)]
pub(crate) struct Agreement {
    me: Rank,
    world: usize,
    group: Option<Group>,
    deciding: bool,
    /// Succession rounds claimed so far...
    rounds: u32,
    /// ...and whether the next claim is due.
    claim_due: bool,
    /// The decider's end of the gather, or the follower's end of its wait.
    deadline: Instant,
    status: Option<(JobStatus, Instant)>,
    exits: BTreeMap<Rank, String>,
    launcher: bool,
    /// The rank that set the abort record, with what it saw.
    first: Option<(Rank, ringleader_diag::Observation)>,
    snaps: BTreeMap<Rank, Snapshot>,
    /// When each rank's snapshot was last asked for.
    asked: BTreeMap<Rank, Instant>,
    /// The ranks of the read in flight.
    reading: Vec<Rank>,
    /// Where the next chunk starts among the ranks still wanted.
    cursor: Rank,
}

impl Agreement {
    /// A rank that published `mine` and either set the abort record
    /// (`decides`) or found it set.
    pub(crate) fn new(mine: Snapshot, world: usize, group: Option<Group>, decides: bool, now: Instant) -> Self {
        let me = mine.rank;
        Agreement {
            me,
            world,
            group,
            deciding: decides,
            rounds: 0,
            claim_due: false,
            deadline: now + if decides { GATHER } else { FOLLOW },
            status: None,
            exits: BTreeMap::new(),
            launcher: false,
            first: None,
            snaps: BTreeMap::from([(me, mine)]),
            asked: BTreeMap::new(),
            reading: Vec::new(),
            cursor: 0,
        }
    }

    /// Whether this rank decides (it set the abort record, or it won a
    /// succession, or every succession passed without a verdict).
    pub(crate) fn deciding(&self) -> bool {
        self.deciding
    }

    /// The job status read at `now` (this communicator's ranks), the exit
    /// records by rank, and whether a launcher runs (it records how ranks
    /// ended, worth waiting for).
    pub(crate) fn status(&mut self, status: JobStatus, exits: BTreeMap<Rank, String>, launcher: bool, now: Instant) {
        self.first = status
            .abort
            .as_deref()
            .and_then(|raw| serde_json::from_slice::<AbortRecord>(raw).ok())
            .map(|r| (r.rank, r.observation));
        self.status = Some((status, now));
        self.exits = exits;
        self.launcher = launcher;
    }

    /// The snapshots the last [`Action::ReadSnapshots`] found, read at `now`.
    pub(crate) fn snapshots(&mut self, snaps: Vec<Snapshot>, now: Instant) {
        for r in self.reading.drain(..) {
            self.asked.insert(r, now);
        }
        for s in snaps {
            if s.rank < self.world && s.rank != self.me {
                self.snaps.insert(s.rank, s);
            }
        }
    }

    /// The follower's wait for a verdict passed at `now` without one:
    /// claim the succession, or, after [`SUCCESSIONS`] rounds, decide.
    pub(crate) fn no_verdict(&mut self, now: Instant) {
        if self.deciding {
            return;
        }
        if self.rounds < SUCCESSIONS {
            self.claim_due = true;
        } else {
            self.decide_from(now);
        }
    }

    /// The succession counter of the round just claimed holds `value`
    /// (read at `now`): 1 makes this rank the decider; otherwise another
    /// rank claimed it first, and this one waits for its verdict.
    pub(crate) fn claimed(&mut self, value: i64, now: Instant) {
        if !self.claim_due {
            return;
        }
        self.claim_due = false;
        self.rounds += 1;
        if value == 1 {
            self.decide_from(now);
        } else {
            self.deadline = now + FOLLOW;
        }
    }

    fn decide_from(&mut self, now: Instant) {
        self.deciding = true;
        self.deadline = now + GATHER;
    }

    /// What to do at `now`.
    pub(crate) fn next(&mut self, now: Instant) -> Action {
        if self.claim_due {
            return Action::ClaimSuccession { round: self.rounds };
        }
        if !self.deciding {
            return Action::AwaitVerdict { until: self.deadline };
        }
        let Some((_, read_at)) = &self.status else {
            return Action::ReadStatus { not_before: now };
        };
        let read_at = *read_at;
        let wanted = self.wanted();
        let endings_due = self.endings_due();
        if (wanted.is_empty() && !endings_due) || now >= self.deadline {
            return Action::Decide(Box::new(self.evidence()));
        }
        if now >= read_at + STATUS_EVERY {
            return Action::ReadStatus { not_before: now };
        }
        let due: Vec<Rank> =
            wanted.iter().copied().filter(|r| self.asked.get(r).is_none_or(|t| now >= *t + REREAD)).collect();
        if due.is_empty() {
            let next_read = wanted.iter().filter_map(|r| self.asked.get(r)).map(|t| *t + REREAD).min();
            let until = [Some(read_at + STATUS_EVERY), next_read, Some(self.deadline)].into_iter().flatten().min();
            return Action::Pause { until: until.unwrap_or(self.deadline) };
        }
        // Round-robin over what is due, so that ranks late to publish do
        // not starve the rest of a large job.
        let start = due.partition_point(|r| *r < self.cursor);
        let chunk: Vec<Rank> = due[start..].iter().chain(&due[..start]).copied().take(CHUNK).collect();
        self.cursor = chunk.last().map_or(0, |r| r + 1);
        self.reading = chunk.clone();
        let wait = REREAD.min(self.deadline.saturating_duration_since(now));
        Action::ReadSnapshots { ranks: chunk, wait }
    }

    /// The collective the job is stuck in: the earliest one a failing rank
    /// observed failing, else the earliest one a rank runs, by what was
    /// read so far. A rank still in an earlier collective (its monitor
    /// published when the abort came) has not reached it: its call of the
    /// failing one may be what decides the verdict, so it is waited for.
    fn stuck(&self) -> Option<u64> {
        let observed = self
            .snaps
            .values()
            .filter_map(|s| s.observation.as_ref().and_then(|o| o.seq))
            .chain(self.first.as_ref().and_then(|(_, o)| o.seq))
            .filter(|q| *q > 0)
            .min();
        observed.or_else(|| {
            self.snaps.values().filter_map(|s| s.beat.running.as_ref().map(|r| r.seq)).filter(|q| *q > 0).min()
        })
    }

    /// The ranks whose snapshot the verdict still needs: connected, with a
    /// fresh heartbeat, and without a snapshot that shows them at (or past)
    /// the stuck collective; the rank that failed first until its
    /// snapshot holds what it saw.
    fn wanted(&self) -> Vec<Rank> {
        let Some((status, _)) = &self.status else { return Vec::new() };
        let stuck = self.stuck();
        let reached = |s: &Snapshot| {
            stuck.is_none_or(|q| {
                s.observation.is_some()
                    || s.beat.last_completed >= q
                    || s.beat.running.as_ref().is_some_and(|r| r.seq >= q)
                    || settled(s)
            })
        };
        let first = self.first.as_ref().map(|(r, _)| *r);
        status
            .ranks
            .iter()
            .filter(|r| r.rank != self.me && r.rank < self.world && r.liveness == Presence::Connected)
            .filter(|r| r.heartbeat_age.is_some_and(|a| a.as_millis() < u128::from(STALE_MS)))
            .filter(|r| {
                !self
                    .snaps
                    .get(&r.rank)
                    .is_some_and(|s| reached(s) && (Some(r.rank) != first || s.observation.is_some()))
            })
            .map(|r| r.rank)
            .collect()
    }

    /// Whether a rank vanished whose launcher (one runs) has not recorded
    /// how it ended yet: "killed by signal 9" is worth a moment's wait.
    fn endings_due(&self) -> bool {
        let Some((status, _)) = &self.status else { return false };
        self.launcher
            && status.ranks.iter().any(|r| r.liveness == Presence::Vanished && !self.exits.contains_key(&r.rank))
    }

    /// Everything read, as the verdict engine's evidence.
    fn evidence(&self) -> Evidence {
        let empty = JobStatus::default();
        let status = self.status.as_ref().map_or(&empty, |(s, _)| s);
        let mut snapshots: Vec<Snapshot> = self.snaps.values().cloned().collect();
        // What the rank that failed first saw is in the abort record, even
        // when its snapshot does not hold it yet.
        if let Some((rank, observation)) = &self.first {
            if let Some(s) = snapshots.iter_mut().find(|s| s.rank == *rank && s.observation.is_none()) {
                s.observation = Some(observation.clone());
            }
        }
        Evidence {
            world_size: self.world,
            peers: peers(status, &self.exits),
            snapshots,
            stale_after_ms: STALE_MS,
            group: self.group.clone(),
        }
    }
}

/// The store's view of each rank, as verdict evidence.
pub(crate) fn peers(status: &JobStatus, exits: &BTreeMap<Rank, String>) -> Vec<PeerView> {
    status
        .ranks
        .iter()
        .map(|r| PeerView {
            rank: r.rank,
            liveness: match r.liveness {
                Presence::Connected => Liveness::Alive,
                Presence::Left => Liveness::Left,
                Presence::Vanished => Liveness::Vanished,
            },
            host: Some(r.host.clone()),
            pid: Some(r.pid),
            heartbeat_age_ms: r.heartbeat_age.map(|a| a.as_millis() as u64),
            beat: Beat::decode(&r.heartbeat),
            exit: exits.get(&r.rank).cloned(),
        })
        .collect()
}

/// Whether `s` shows its rank settled outside any operation (see
/// [`SETTLED_IDLE`]).
fn settled(s: &Snapshot) -> bool {
    let last_done = s.entries.iter().filter_map(|e| e.time_discovered_completed_ns).max();
    s.beat.running.is_none()
        && s.beat.p2p.is_empty()
        && last_done.is_some_and(|t| s.time_ns.saturating_sub(t) >= SETTLED_IDLE.as_nanos() as u64)
}

/// `snap` as published: its newest [`SNAPSHOT_ENTRIES`] records.
pub(crate) fn compact(mut snap: Snapshot) -> Snapshot {
    let n = snap.entries.len();
    if n > SNAPSHOT_ENTRIES {
        snap.entries.drain(..n - SNAPSHOT_ENTRIES);
    }
    snap
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringleader_diag::snapshot::Running;
    use ringleader_diag::Observation;
    use ringleader_store::RankStatus;

    fn rank(r: Rank, liveness: Presence, age_ms: u64) -> RankStatus {
        RankStatus {
            rank: r,
            liveness,
            host: format!("node-{}", r / 4),
            pid: 1000 + r as u32,
            version: "0.1.0".into(),
            world_size: None,
            since_change: Duration::ZERO,
            heartbeat_age: Some(Duration::from_millis(age_ms)),
            heartbeat: Vec::new(),
        }
    }

    fn status(world: usize, vanished: &[Rank], stale: &[Rank]) -> JobStatus {
        let ranks = (0..world)
            .map(|r| {
                let l = if vanished.contains(&r) { Presence::Vanished } else { Presence::Connected };
                rank(r, l, if stale.contains(&r) { 60_000 } else { 100 })
            })
            .collect();
        JobStatus { generation: 1, ranks, abort: None }
    }

    /// A rank's snapshot inside collective `seq`.
    fn snap(r: Rank, world: usize, seq: u64) -> Snapshot {
        let mut s = Snapshot::new(r, world, "node", 1000 + r as u32, "job");
        s.beat = Beat {
            last_started: seq,
            last_completed: seq - 1,
            running: Some(Running {
                seq,
                fingerprint: ringleader_core::Fingerprint::new(
                    ringleader_core::OpKind::AllReduce,
                    ringleader_core::DType::F32,
                    4,
                ),
                running_ms: 10,
                awaited_peers: vec![],
            }),
            p2p: vec![],
            running_site: None,
            last_completed_site: None,
        };
        s
    }

    /// Plays the machine against a synthetic store that holds `published`
    /// and answers `status`: counts reads, returns what it decided with.
    fn play(
        a: &mut Agreement,
        status: &JobStatus,
        published: &BTreeMap<Rank, Snapshot>,
        t0: Instant,
    ) -> (Evidence, usize, Duration) {
        let mut now = t0;
        let mut most = 0;
        for _ in 0..100_000 {
            match a.next(now) {
                Action::ReadStatus { not_before } => {
                    now = now.max(not_before);
                    a.status(status.clone(), BTreeMap::new(), false, now);
                }
                Action::ReadSnapshots { ranks, wait } => {
                    assert!(ranks.len() <= CHUNK, "a read of {} snapshots", ranks.len());
                    most = most.max(ranks.len());
                    let found: Vec<Snapshot> = ranks.iter().filter_map(|r| published.get(r).cloned()).collect();
                    if found.len() < ranks.len() {
                        now += wait;
                    }
                    a.snapshots(found, now);
                }
                Action::Pause { until } => {
                    assert!(until > now, "a pause must move time");
                    now = until;
                }
                Action::AwaitVerdict { until } => {
                    now = until;
                    a.no_verdict(now);
                }
                // Alone in the job: every claim wins.
                Action::ClaimSuccession { .. } => a.claimed(1, now),
                Action::Decide(ev) => return (*ev, most, now - t0),
            }
        }
        panic!("no decision");
    }

    #[test]
    fn the_decider_reads_every_live_snapshot_in_chunks_and_decides_at_once() {
        let world = 2000;
        let t0 = Instant::now();
        let published: BTreeMap<Rank, Snapshot> = (0..world).map(|r| (r, snap(r, world, 5))).collect();
        let mut a = Agreement::new(snap(7, world, 5), world, None, true, t0);
        let (ev, most, took) = play(&mut a, &status(world, &[], &[]), &published, t0);
        assert_eq!(ev.snapshots.len(), world);
        assert_eq!(most, CHUNK);
        assert_eq!(took, Duration::ZERO, "every snapshot was there: no waiting");
    }

    #[test]
    fn dead_and_frozen_ranks_write_none_and_the_verdict_comes_without_them() {
        let world = 600;
        let (dead, frozen) = ([13, 400], [77]);
        let t0 = Instant::now();
        let published: BTreeMap<Rank, Snapshot> =
            (0..world).filter(|r| !dead.contains(r) && !frozen.contains(r)).map(|r| (r, snap(r, world, 3))).collect();
        let mut a = Agreement::new(snap(0, world, 3), world, None, true, t0);
        let (ev, _, took) = play(&mut a, &status(world, &dead, &frozen), &published, t0);
        assert_eq!(ev.snapshots.len(), world - 3);
        assert!(took < GATHER, "stale and vanished ranks are not waited for: {took:?}");
        assert_eq!(ev.peers.iter().filter(|p| p.liveness == Liveness::Vanished).count(), 2);
    }

    #[test]
    fn a_live_rank_that_never_publishes_is_waited_for_until_the_gather_ends() {
        let world = 64;
        let t0 = Instant::now();
        let published: BTreeMap<Rank, Snapshot> =
            (0..world).filter(|r| *r != 9).map(|r| (r, snap(r, world, 2))).collect();
        let mut a = Agreement::new(snap(1, world, 2), world, None, true, t0);
        let (ev, _, took) = play(&mut a, &status(world, &[], &[]), &published, t0);
        assert_eq!(ev.snapshots.len(), world - 1, "a partial set still decides");
        assert!(took >= GATHER && took < GATHER + Duration::from_millis(100), "{took:?}");
    }

    #[test]
    fn a_snapshot_published_before_the_rank_reached_the_collective_is_read_again() {
        let world = 8;
        let t0 = Instant::now();
        let mut published: BTreeMap<Rank, Snapshot> = (0..world).map(|r| (r, snap(r, world, 4))).collect();
        // Rank 5's monitor published while it was idle after collective 2.
        let mut idle = snap(5, world, 3);
        idle.beat.running = None;
        published.insert(5, idle);
        let mut a = Agreement::new(snap(0, world, 4), world, None, true, t0);
        let st = status(world, &[], &[]);
        let mut reads_of_5 = 0;
        let mut now = t0;
        let ev = loop {
            match a.next(now) {
                Action::ReadStatus { not_before } => {
                    now = now.max(not_before);
                    a.status(st.clone(), BTreeMap::new(), false, now);
                }
                Action::ReadSnapshots { ranks, .. } => {
                    reads_of_5 += usize::from(ranks.contains(&5));
                    if reads_of_5 == 3 {
                        published.insert(5, snap(5, world, 4));
                    }
                    a.snapshots(ranks.iter().filter_map(|r| published.get(r).cloned()).collect(), now);
                }
                Action::Pause { until } => now = until,
                Action::AwaitVerdict { .. } | Action::ClaimSuccession { .. } => {
                    panic!("the decider never waits for a verdict")
                }
                Action::Decide(ev) => break ev,
            }
        };
        assert_eq!(reads_of_5, 3);
        assert!(ev.snapshots.iter().any(|s| s.rank == 5 && s.beat.running.as_ref().is_some_and(|r| r.seq == 4)));
        assert!(now - t0 < GATHER, "decided once rank 5 got there: {:?}", now - t0);
    }

    /// Rank `r` idle since collective 3, `idle_ms` before its snapshot.
    fn idle_for(r: Rank, world: usize, idle_ms: u64) -> Snapshot {
        let fr = ringleader_diag::FlightRecorder::new(4, 10_000);
        let fp = ringleader_core::Fingerprint::new(ringleader_core::OpKind::AllReduce, ringleader_core::DType::F32, 4);
        let id = fr.record(fp, 3, 0);
        fr.started(id);
        fr.completed(id);
        let mut s = snap(r, world, 4);
        s.beat.running = None;
        s.beat.last_completed = 3;
        s.entries = fr.entries();
        let done = s.entries[0].time_discovered_completed_ns.unwrap();
        s.time_ns = done + idle_ms * 1_000_000;
        s
    }

    #[test]
    fn a_rank_settled_in_its_own_code_is_not_waited_for() {
        let world = 4;
        let t0 = Instant::now();
        let mut published: BTreeMap<Rank, Snapshot> = (0..world).map(|r| (r, snap(r, world, 4))).collect();
        // Idle for 3 s when it learned of the failure: asleep in its own code.
        published.insert(3, idle_for(3, world, 3_000));
        let mut a = Agreement::new(snap(0, world, 4), world, None, true, t0);
        let (ev, _, took) = play(&mut a, &status(world, &[], &[]), &published, t0);
        assert_eq!(ev.snapshots.len(), world);
        assert!(took < GATHER / 4, "{took:?}");
        // Idle for 50 ms: it may be on its way, so it is waited for.
        published.insert(3, idle_for(3, world, 50));
        let mut a = Agreement::new(snap(0, world, 4), world, None, true, t0);
        let (_, _, took) = play(&mut a, &status(world, &[], &[]), &published, t0);
        assert!(took >= GATHER, "{took:?}");
    }

    #[test]
    fn a_rank_still_in_an_earlier_collective_is_waited_for_until_it_reaches_the_failing_one() {
        let world = 3;
        let t0 = Instant::now();
        let failing = |r: Rank| {
            let mut s = snap(r, world, 2);
            s.observation = Some(Observation::from_error(&ringleader_core::Error::PeerLost {
                peer: 1,
                op: ringleader_core::OpKind::AllReduce,
                seq: 2,
                detail: "mismatch".into(),
            }));
            s
        };
        // Rank 1's monitor published while it was still in collective 1.
        let mut published: BTreeMap<Rank, Snapshot> = BTreeMap::from([(1, snap(1, world, 1)), (2, failing(2))]);
        let mut a = Agreement::new(failing(0), world, None, true, t0);
        let st = status(world, &[], &[]);
        let (mut now, mut reads_of_1) = (t0, 0);
        let ev = loop {
            match a.next(now) {
                Action::ReadStatus { not_before } => {
                    now = now.max(not_before);
                    a.status(st.clone(), BTreeMap::new(), false, now);
                }
                Action::ReadSnapshots { ranks, .. } => {
                    reads_of_1 += usize::from(ranks.contains(&1));
                    if reads_of_1 == 2 {
                        published.insert(1, failing(1));
                    }
                    a.snapshots(ranks.iter().filter_map(|r| published.get(r).cloned()).collect(), now);
                }
                Action::Pause { until } => now = until,
                Action::AwaitVerdict { .. } | Action::ClaimSuccession { .. } => {
                    panic!("the decider never waits for a verdict")
                }
                Action::Decide(ev) => break ev,
            }
        };
        assert_eq!(reads_of_1, 2, "read again until it shows collective 2");
        let one = ev.snapshots.iter().find(|s| s.rank == 1).unwrap();
        assert_eq!(one.beat.running.as_ref().map(|r| r.seq), Some(2));
    }

    #[test]
    fn a_follower_waits_for_the_verdict_then_claims_the_succession() {
        let world = 16;
        let t0 = Instant::now();
        let mut a = Agreement::new(snap(3, world, 2), world, None, false, t0);
        let Action::AwaitVerdict { until } = a.next(t0) else { panic!("a follower waits") };
        assert_eq!(until, t0 + FOLLOW);
        assert!(!a.deciding());
        a.no_verdict(until);
        let Action::ClaimSuccession { round: 0 } = a.next(until) else { panic!("it claims round 0") };
        a.claimed(1, until);
        assert!(a.deciding());
        assert!(matches!(a.next(until), Action::ReadStatus { .. }));
    }

    /// Every follower of a job whose decider (and whose successors) never
    /// publish a verdict, played together against one set of succession
    /// counters: returns, per round, the ranks that decided in it.
    fn successions(world: usize, verdict_after_round: Option<u32>) -> Vec<Vec<Rank>> {
        let t0 = Instant::now();
        let mut followers: Vec<Agreement> =
            (1..world).map(|r| Agreement::new(snap(r, world, 2), world, None, false, t0)).collect();
        let mut counters: BTreeMap<u32, i64> = BTreeMap::new();
        let mut deciders: Vec<Vec<Rank>> = Vec::new();
        let mut now = t0;
        for round in 0..=SUCCESSIONS {
            // Each follower's wait passes at the same moment, then each
            // claims (in rank order, as the store would serialize them).
            now += FOLLOW;
            let mut decided = Vec::new();
            for a in followers.iter_mut().filter(|a| !a.deciding()) {
                assert!(matches!(a.next(now), Action::AwaitVerdict { .. }), "rank {} waits", a.me);
                a.no_verdict(now);
                if let Action::ClaimSuccession { round: r } = a.next(now) {
                    assert_eq!(r, round);
                    let c = counters.entry(r).or_default();
                    *c += 1;
                    a.claimed(*c, now);
                }
                if a.deciding() {
                    decided.push(a.me);
                }
            }
            deciders.push(decided);
            if verdict_after_round == Some(round) {
                break;
            }
        }
        deciders
    }

    #[test]
    fn a_dead_decider_is_succeeded_by_one_rank_per_round_then_by_all() {
        // The successor of round 0 publishes: one extra gather in the job.
        let d = successions(1000, Some(0));
        assert_eq!(d, vec![vec![1]]);
        // Successors that die too: one new decider per round, then every
        // rank still waiting decides itself.
        let d = successions(8, None);
        assert_eq!(d.len() as u32, SUCCESSIONS + 1);
        for (round, ranks) in d.iter().take(SUCCESSIONS as usize).enumerate() {
            assert_eq!(ranks.len(), 1, "round {round}: {ranks:?}");
        }
        assert_eq!(d.last().unwrap().len(), 7 - SUCCESSIONS as usize);
    }

    #[test]
    fn the_first_failed_ranks_observation_reaches_the_evidence() {
        let world = 4;
        let t0 = Instant::now();
        let published: BTreeMap<Rank, Snapshot> = (0..world).map(|r| (r, snap(r, world, 2))).collect();
        let mut st = status(world, &[], &[]);
        let observation = Observation::from_error(&ringleader_core::Error::PeerLost {
            peer: 2,
            op: ringleader_core::OpKind::AllReduce,
            seq: 2,
            detail: "reset".into(),
        });
        let record = AbortRecord { rank: 1, observation };
        st.abort = Some(serde_json::to_vec(&record).unwrap());
        let mut a = Agreement::new(snap(0, world, 2), world, None, true, t0);
        let (ev, _, took) = play(&mut a, &st, &published, t0);
        // Rank 1's snapshot lacks what it saw: it is waited for, then the
        // abort record fills it in.
        assert!(took >= GATHER);
        let one = ev.snapshots.iter().find(|s| s.rank == 1).unwrap();
        assert_eq!(one.observation.as_ref().map(|o| o.peer), Some(Some(2)));
    }

    #[test]
    fn a_published_snapshot_keeps_the_newest_records() {
        let mut s = snap(0, 2, 9);
        let fp = s.beat.running.as_ref().unwrap().fingerprint;
        let fr = ringleader_diag::FlightRecorder::new(100, 1000);
        for seq in 1..=100 {
            let id = fr.record_started(fp, seq, 0);
            fr.completed(id);
        }
        s.entries = fr.entries();
        let last = s.entries.last().cloned();
        let c = compact(s);
        assert_eq!(c.entries.len(), SNAPSHOT_ENTRIES);
        assert_eq!(c.entries.last().cloned(), last);
    }
}
