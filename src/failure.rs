//! From a local failure to one verdict, the same on every rank.
//!
//! The rank that sees a collective fail (a mismatching frame, a closed
//! connection, the watchdog's timeout) aborts its communicator, raises the
//! job-wide abort at the store, and publishes its compact snapshot. Every
//! other rank's monitor sees the abort, wakes its own communicator and
//! publishes its snapshot too. The rank that raised the abort then reads
//! the snapshots of the ranks that can still answer, in chunks, runs the
//! verdict engine once and publishes the verdict; the others wait for it
//! (see [`crate::agreement`], the sans-IO state machine this file drives
//! against the store).

use crate::agreement::{self, AbortRecord, Action, Agreement};
use crate::engine::Shared;
use crate::log;
use ringleader_core::{Config, Diagnosis, Error, Group, Rank};
use ringleader_diag::{verdict, Evidence, Liveness, Observation, PeerView, Snapshot};
use ringleader_store::{keys, JobStatus, StoreClient};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

pub(crate) use agreement::STALE_MS;

/// Largest world in which every rank's dump records the whole job status
/// (each rank reads it, so the store sends it world-size times); beyond
/// it only the dump of the rank that decided the verdict has it (from the
/// status it read to decide).
const DUMP_STATUS_MAX_WORLD: usize = 1024;
/// The largest peer dump read back (a dump holds a bounded flight recorder).
const DUMP_READ_MAX: u64 = 64 << 20;

impl Shared {
    /// Turns the local error of the operation recorded as `record` into the
    /// verdict, which also becomes the communicator's permanent failure.
    pub(crate) fn resolve(&self, record: u64, local: Error) -> Error {
        if let Some(f) = self.failure.get() {
            self.fr.failed(record, &f.to_string(), Vec::new());
            return f;
        }
        // The ranks whose processes had ended when this rank failed: a peer
        // that ends later (it printed its own verdict and exited) is no
        // culprit of this failure, should this rank have to decide alone.
        let ended_before = self.ended.lock().clone();
        self.abort.abort(local.clone());
        // What a person reads names global ranks; the observation's fields
        // stay in this communicator's ranks, as every snapshot's do.
        let shown = self.to_global(local.clone());
        let awaited = self.awaited.ranks();
        self.fr.failed(record, &shown.to_string(), awaited);
        let mut observation = Observation::from_error(&local);
        observation.message = shown.to_string();
        if self.user_aborted.load(Ordering::Acquire) || self.destroyed.load(Ordering::Acquire) {
            // The caller aborted (or destroyed the communicator under a
            // running call) and knows why: tell the others, skip the inquiry.
            if let Some(mut store) = self.store.try_lock_for(Duration::from_millis(200)) {
                let record = AbortRecord { rank: self.rank, observation };
                let _ = store.abort_job(&serde_json::to_vec(&record).unwrap_or_default());
            }
            self.failure.set(shown.clone());
            return shown;
        }
        let (mut diagnosis, job) = match self.agree(&observation) {
            Ok(agreed) => agreed,
            Err(e) => {
                log::warn(&self.cfg, &format!("cannot reach the store to agree on a verdict ({e}); deciding alone"));
                (self.decide_alone(&observation, &ended_before), None)
            }
        };
        // The verdict is printed before this rank's dump is written: the
        // dump holds its stacks, whose capture can take seconds on a
        // crowded host, and the launcher ends the job soon after the
        // verdict is out. The dump's folder is known beforehand.
        let dir = self.cfg.run_dump_dir();
        diagnosis.hints.push(format!(
            "flight recorder dumps: {} (`ringleader analyze {}`)",
            dir.display(),
            dir.display()
        ));
        if let Some(r) = self.whole_verdict_printer(&diagnosis) {
            // One rank per host prints the whole verdict (with where the
            // dumps are); the others show one short line (what failed, who
            // is to blame, where the rest is), so a job's log grows by as
            // little as it can per rank.
            diagnosis.summary = Some(diagnosis.summary_pointing_to(&format!("rank {r}'s output")));
        }
        let err = Error::Collective(Box::new(diagnosis));
        self.failure.set(err.clone());
        // One line here, for logs where the caller swallows the error; the
        // error itself carries the full verdict.
        let text = err.to_string();
        log::error(&self.cfg, text.lines().next().unwrap_or_default());
        let Error::Collective(d) = &err else { return err };
        self.write_dump_with(Some(observation), Some(d), job);
        err
    }

    /// Which rank of this host prints the whole verdict, when it is not
    /// this one: the lowest-ranked of the host's ranks that the verdict does
    /// not blame (a culprit may be dead, or stuck where it prints nothing).
    /// Global ranks.
    fn whole_verdict_printer(&self, d: &Diagnosis) -> Option<Rank> {
        let me = self.peers.get(self.rank)?;
        let printer = self
            .peers
            .iter()
            .filter(|p| p.same_host(me))
            .map(|p| self.cfg.global(p.rank))
            .filter(|r| !d.culprits.contains(r))
            .min()?;
        (printer != self.cfg.global_rank()).then_some(printer)
    }

    /// Agrees with the other ranks on a verdict through the store: carries
    /// out the [`Agreement`]'s actions. The decider also answers the job as
    /// it read it, for its dump.
    fn agree(&self, observation: &Observation) -> Result<(Diagnosis, Option<Vec<PeerView>>), Error> {
        let mut store = self.store.lock();
        let record = AbortRecord { rank: self.rank, observation: observation.clone() };
        let decides = store.abort_job(&serde_json::to_vec(&record).unwrap_or_default())?;
        // Without stacks: this rank failed inside an operation, where the
        // flight recorder already says what it waits in and where it was
        // called. Its stacks go to its dump after its verdict (see
        // `resolve`); capturing them first, with every rank of a big job
        // doing so at once, delayed every verdict by seconds. The ranks a
        // verdict shows stacks of are outside any operation, and their
        // monitor publishes them (`Monitor::news`).
        let mine = agreement::compact(self.snapshot(Some(observation.clone())));
        store.set(&keys::snapshot(self.rank), mine.to_json().as_bytes())?;
        if let Some(d) = agreed(&mut store)? {
            return Ok((d, None));
        }
        let mut a = Agreement::new(mine, self.world, self.cfg.group.clone(), decides, Instant::now());
        loop {
            match a.next(Instant::now()) {
                Action::ReadStatus { not_before } => {
                    pause_until(not_before);
                    let status = ours(store.status(None, Duration::ZERO)?, self.world);
                    let exits = exits(&mut store, &status)?;
                    let launcher = store.try_get(keys::LAUNCHER)?.is_some();
                    a.status(status, exits, launcher, Instant::now());
                }
                Action::ReadSnapshots { ranks, wait } => {
                    let found = read_snapshots(&mut store, &ranks, wait)?;
                    a.snapshots(found, Instant::now());
                }
                Action::ClaimSuccession { round } => {
                    let value = store.add(&keys::succession(round), 1)?;
                    a.claimed(value, Instant::now());
                    if a.deciding() {
                        tracing::info!(round, "no verdict came in time: this rank decides in the decider's place");
                    }
                }
                Action::Pause { until } => pause_until(until),
                Action::AwaitVerdict { until } => {
                    match store.get(keys::VERDICT, until.saturating_duration_since(Instant::now())) {
                        Ok(v) => {
                            if let Ok(d) = serde_json::from_slice(&v) {
                                return Ok((d, None));
                            }
                            a.no_verdict(Instant::now());
                        }
                        Err(Error::StoreTimeout { .. }) => a.no_verdict(Instant::now()),
                        Err(e) => return Err(e),
                    }
                }
                Action::Decide(ev) => {
                    ringleader_core::fault::check(ringleader_core::fault::Point::Decide, observation.seq.unwrap_or(0));
                    let d = verdict(&ev);
                    let stored = store.compare_set(keys::VERDICT, None, &serde_json::to_vec(&d).unwrap_or_default())?;
                    return Ok((serde_json::from_slice(&stored).unwrap_or(d), Some(ev.peers)));
                }
            }
        }
    }

    /// A verdict from this rank's own knowledge, when the store is gone.
    fn decide_alone(&self, observation: &Observation, ended: &[Rank]) -> Diagnosis {
        let mut peers: Vec<PeerView> = ended
            .iter()
            .filter(|&&r| !self.ended_with_a_verdict(r))
            .map(|&r| PeerView {
                rank: r,
                liveness: Liveness::Vanished,
                host: self.peers.get(r).map(|p| p.host.clone()),
                pid: self.peers.get(r).map(|p| p.pid),
                heartbeat_age_ms: None,
                beat: None,
                exit: None,
            })
            .collect();
        if self.store_in_rank0 && self.rank != 0 && !peers.iter().any(|p| p.rank == 0) {
            // The store lived in rank 0's process; losing it means losing rank 0.
            peers.push(PeerView {
                rank: 0,
                liveness: Liveness::Vanished,
                host: self.peers.first().map(|p| p.host.clone()),
                pid: self.peers.first().map(|p| p.pid),
                heartbeat_age_ms: None,
                beat: None,
                exit: None,
            });
        }
        verdict(&Evidence {
            world_size: self.world,
            peers,
            snapshots: vec![self.snapshot(Some(observation.clone()))],
            stale_after_ms: STALE_MS,
            group: self.cfg.group.clone(),
        })
    }

    /// Whether peer `r` (a rank of this communicator on this host) ended
    /// after reaching a verdict of its own: its dump in this run's folder,
    /// written by its process before it ended, holds one. Such a peer ended
    /// because the job failed (it printed why and exited), so a rank that
    /// cannot reach the store does not blame it. Read only on that path.
    fn ended_with_a_verdict(&self, r: Rank) -> bool {
        let (Some(peer), Some(me)) = (self.peers.get(r), self.peers.get(self.rank)) else {
            return false;
        };
        if !peer.same_host(me) {
            return false;
        }
        let path = self.cfg.run_dump_dir().join(dump_name_of(&self.cfg, self.cfg.global(r)));
        let Ok(text) = crate::dumps::read_bounded(&path, DUMP_READ_MAX) else {
            return false;
        };
        Snapshot::from_json(&text).is_ok_and(|s| s.pid == peer.pid && s.verdict.is_some())
    }

    /// Writes this rank's dump to the dump directory; returns its path.
    pub(crate) fn write_dump(
        &self,
        observation: Option<Observation>,
        diagnosis: Option<&Diagnosis>,
    ) -> Option<PathBuf> {
        self.write_dump_with(observation, diagnosis, None)
    }

    /// [`Shared::write_dump`], with the job as this rank already read it
    /// (the verdict's decider), else read here in a job small enough.
    fn write_dump_with(
        &self,
        observation: Option<Observation>,
        diagnosis: Option<&Diagnosis>,
        job: Option<Vec<PeerView>>,
    ) -> Option<PathBuf> {
        let failed = observation.is_some() || diagnosis.is_some();
        let mut snap = self.snapshot(observation);
        snap.verdict = diagnosis.cloned();
        // The whole stacks: as of this communicator's failure, else (a dump
        // on request) only those a failure captured.
        let stacks = if failed { self.failure_stacks() } else { self.stacks.lock().clone() };
        snap.stacks = stacks.map(|s| (*s).clone());
        if let Some(job) = job {
            snap.job = job;
        } else if self.world <= DUMP_STATUS_MAX_WORLD {
            if let Some(mut store) = self.store.try_lock_for(Duration::from_millis(500)) {
                if let Ok(status) = store.status(None, Duration::ZERO).map(|s| ours(s, self.world)) {
                    if let Ok(exits) = exits(&mut store, &status) {
                        snap.job = agreement::peers(&status, &exits);
                    }
                }
            }
        }
        self.dump_to(&snap, None)
    }

    /// Writes `snap` as JSON to `path`, or to this run's dump folder (see
    /// [`crate::dumps`]).
    pub(crate) fn dump_to(&self, snap: &Snapshot, path: Option<PathBuf>) -> Option<PathBuf> {
        let json = snap.to_json();
        let (to, written) = match path {
            Some(p) => (p.clone(), crate::dumps::write_file(&p, json.as_bytes(), false).map(|()| p)),
            None => {
                let name = dump_name(&self.cfg);
                (self.cfg.run_dump_dir().join(&name), crate::dumps::write_run_dump(&self.cfg, &name, json.as_bytes()))
            }
        };
        match written {
            Ok(p) => Some(p),
            Err(e) => {
                log::warn(&self.cfg, &format!("cannot write the flight recorder dump {}: {e}", to.display()));
                None
            }
        }
    }
}

/// The job's status with only this communicator's ranks: a process that
/// joined the store as a rank outside the world (a stranger, on a store
/// without a token) is nobody these ranks wait for, so it neither aborts
/// their collectives nor delays their verdict.
pub(crate) fn ours(mut status: JobStatus, world: usize) -> JobStatus {
    status.ranks.retain(|r| r.rank < world);
    status
}

/// The verdict some rank already offered, if any.
fn agreed(store: &mut StoreClient) -> Result<Option<Diagnosis>, Error> {
    Ok(store.try_get(keys::VERDICT)?.and_then(|v| serde_json::from_slice(&v).ok()))
}

/// Sleeps until `until`: a pause between reads of the agreement, at most
/// 250 ms, inside the agreement's bounded gather.
fn pause_until(until: Instant) {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::park_timeout(left);
    }
}

/// The file name of a rank's dump: `ringleader-rank{R}.json` by global
/// rank, with the group's name for a sub-group (a process holds one
/// communicator per group, and their dumps must not overwrite each other).
pub(crate) fn dump_name(cfg: &Config) -> String {
    dump_name_of(cfg, cfg.global_rank())
}

/// The dump file name of global rank `global` in `cfg`'s communicator.
fn dump_name_of(cfg: &Config, global: Rank) -> String {
    match cfg.group.as_ref() {
        None => format!("ringleader-rank{global}.json"),
        Some(g) => {
            let name: String = g
                .name
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
                .collect();
            format!("ringleader-rank{global}-group{name}.json")
        }
    }
}

/// Everything the store knows about the job, as verdict evidence (`group`:
/// the sub-group the communicator spans, so the verdict names global
/// ranks). Reads every snapshot: for one rank at a time only (rank 0 of a
/// monitored barrier), never for every rank of a failure.
pub(crate) fn evidence(
    store: &mut StoreClient,
    status: &JobStatus,
    world: usize,
    group: Option<Group>,
) -> Result<Evidence, Error> {
    let exits = exits(store, status)?;
    let snapshots: Vec<Snapshot> = fetch_prefix(store, keys::SNAPSHOT_PREFIX)?
        .into_iter()
        .filter_map(|(_, v)| Snapshot::from_json(&String::from_utf8_lossy(&v)).ok())
        .collect();
    Ok(Evidence {
        world_size: world,
        peers: agreement::peers(status, &exits),
        snapshots,
        stale_after_ms: STALE_MS,
        group,
    })
}

/// The exit records launchers wrote for the ranks of `status` that ended
/// without leaving, by rank (only when some did).
fn exits(store: &mut StoreClient, status: &JobStatus) -> Result<BTreeMap<Rank, String>, Error> {
    if !status.ranks.iter().any(|r| r.liveness == ringleader_store::Presence::Vanished) {
        return Ok(BTreeMap::new());
    }
    let records = fetch_prefix(store, keys::EXIT_PREFIX)?;
    Ok(records
        .into_iter()
        .filter_map(|(k, v)| {
            let rank = k.strip_prefix(keys::EXIT_PREFIX)?.parse().ok()?;
            Some((rank, String::from_utf8_lossy(&v).into_owned()))
        })
        .collect())
}

/// The snapshots of `ranks` (at most a chunk), waiting up to `wait` for
/// those not published yet; what is there after that.
fn read_snapshots(store: &mut StoreClient, ranks: &[Rank], wait: Duration) -> Result<Vec<Snapshot>, Error> {
    let names: Vec<String> = ranks.iter().map(|r| keys::snapshot(*r)).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let present: Vec<&str> = match store.wait(&refs, wait) {
        Ok(()) => refs,
        Err(Error::StoreTimeout { keys: missing, .. }) => {
            refs.into_iter().filter(|k| !missing.iter().any(|m| m == k)).collect()
        }
        Err(e) => return Err(e),
    };
    if present.is_empty() {
        return Ok(Vec::new());
    }
    let values = store.multi_get(&present, Duration::from_secs(2))?;
    Ok(values.iter().filter_map(|v| Snapshot::from_json(&String::from_utf8_lossy(v)).ok()).collect())
}

fn fetch_prefix(store: &mut StoreClient, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, Error> {
    let names = store.keys_with_prefix(prefix)?;
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let values = store.multi_get(&refs, Duration::from_secs(2))?;
    Ok(names.into_iter().zip(values).collect())
}
