//! From a local failure to one verdict, the same on every rank.
//!
//! The rank that sees a collective fail (a mismatching frame, a closed
//! connection, the watchdog's timeout) aborts its communicator, raises the
//! job-wide abort at the store, and publishes its snapshot. Every other
//! rank's monitor sees the abort, wakes its own communicator and publishes
//! its snapshot too. Each failing rank then waits, briefly and bounded, for
//! the snapshots of the ranks that can still answer (alive, heartbeat fresh),
//! runs the verdict engine, and offers its verdict to the store; the first
//! verdict offered is the one every rank reports.

use crate::engine::Shared;
use crate::log;
use ringleader_core::{Config, Diagnosis, Error, Group, Rank};
use ringleader_diag::{verdict, Beat, Evidence, Liveness, Observation, PeerView, Snapshot};
use ringleader_store::{keys, JobStatus, Liveness as StoreLiveness, StoreClient};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a failing rank waits for the others' snapshots.
const GATHER: Duration = Duration::from_secs(2);
/// A heartbeat older than this means the process stopped answering.
pub(crate) const STALE_MS: u64 = 3000;

/// The job-wide abort record: who failed first, and what it saw.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct AbortRecord {
    pub rank: usize,
    pub observation: Observation,
}

impl Shared {
    /// Turns the local error of the operation recorded as `record` into the
    /// verdict, which also becomes the communicator's permanent failure.
    pub(crate) fn resolve(&self, record: u64, local: Error) -> Error {
        if let Some(f) = self.failure.lock().clone() {
            self.fr.failed(record, &f.to_string(), Vec::new());
            return f;
        }
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
            *self.failure.lock() = Some(shown.clone());
            return shown;
        }
        let mut diagnosis = match self.agree(&observation) {
            Ok(d) => d,
            Err(e) => {
                log::warn(&self.cfg, &format!("cannot reach the store to agree on a verdict ({e}); deciding alone"));
                self.decide_alone(&observation)
            }
        };
        let dumped = self.write_dump(Some(observation), Some(&diagnosis));
        if let Some(dir) = dumped.as_ref().and_then(|p| p.parent()) {
            diagnosis.hints.push(format!(
                "flight recorder dumps: {} (`ringleader analyze {}`)",
                dir.display(),
                dir.display()
            ));
        }
        if let Some(r) = self.whole_verdict_printer(&diagnosis) {
            // One rank per host prints the whole verdict; the others show one
            // line (what failed, who is to blame, where the rest is), so a
            // job's log does not grow with its size.
            let dumps = dumped
                .as_ref()
                .and_then(|p| p.parent())
                .map_or(String::new(), |d| format!(", and `ringleader analyze {}`", d.display()));
            diagnosis.summary = Some(diagnosis.summary_pointing_to(&format!("rank {r}'s output{dumps}")));
        }
        let err = Error::Collective(Box::new(diagnosis));
        *self.failure.lock() = Some(err.clone());
        // One line here, for logs where the caller swallows the error; the
        // error itself carries the full verdict.
        let text = err.to_string();
        log::error(&self.cfg, text.lines().next().unwrap_or_default());
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

    /// Agrees with the other ranks on a verdict through the store.
    fn agree(&self, observation: &Observation) -> Result<Diagnosis, Error> {
        let mut store = self.store.lock();
        let record = AbortRecord { rank: self.rank, observation: observation.clone() };
        store.abort_job(&serde_json::to_vec(&record).unwrap_or_default())?;
        let mine = self.snapshot(Some(observation.clone()));
        store.set(&keys::snapshot(self.rank), mine.to_json().as_bytes())?;
        if let Some(d) = agreed(&mut store)? {
            return Ok(d);
        }
        let status = gather(&mut store, self.rank, self.world)?;
        if let Some(d) = agreed(&mut store)? {
            return Ok(d);
        }
        let ev = evidence(&mut store, &status, self.world, self.cfg.group.clone())?;
        let d = verdict(&ev);
        let stored = store.compare_set(keys::VERDICT, None, &serde_json::to_vec(&d).unwrap_or_default())?;
        Ok(serde_json::from_slice(&stored).unwrap_or(d))
    }

    /// A verdict from this rank's own knowledge, when the store is gone.
    fn decide_alone(&self, observation: &Observation) -> Diagnosis {
        let mut peers: Vec<PeerView> = self
            .ended
            .lock()
            .iter()
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

    /// Writes this rank's dump to the dump directory; returns its path.
    pub(crate) fn write_dump(
        &self,
        observation: Option<Observation>,
        diagnosis: Option<&Diagnosis>,
    ) -> Option<PathBuf> {
        let mut snap = self.snapshot(observation);
        snap.verdict = diagnosis.cloned();
        if let Some(mut store) = self.store.try_lock_for(Duration::from_millis(500)) {
            if let Ok(status) = store.status(None, Duration::ZERO).map(|s| ours(s, self.world)) {
                if let Ok(ev) = evidence(&mut store, &status, self.world, None) {
                    snap.job = ev.peers;
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

/// Waits (bounded) until every rank that can still answer published a
/// snapshot that shows it at (or past) the collective the job is stuck in;
/// returns the job status at that point. A live rank that has not reached it
/// yet is given the rest of the wait to get there: its call's fingerprint
/// may be what decides who is to blame.
fn gather(store: &mut StoreClient, me: usize, world: usize) -> Result<JobStatus, Error> {
    let deadline = Instant::now() + GATHER;
    loop {
        let status = ours(store.status(None, Duration::ZERO)?, world);
        let snaps: Vec<Snapshot> = fetch_prefix(store, keys::SNAPSHOT_PREFIX)?
            .into_iter()
            .filter_map(|(_, v)| Snapshot::from_json(&String::from_utf8_lossy(&v)).ok())
            .collect();
        let stuck = snaps
            .iter()
            .filter_map(|s| s.beat.running.as_ref().map(|r| r.seq).or(s.observation.as_ref().and_then(|o| o.seq)))
            .filter(|q| *q > 0)
            .min();
        let reached = |s: &Snapshot| {
            stuck.is_none_or(|q| {
                s.observation.is_some()
                    || s.beat.last_completed >= q
                    || s.beat.running.as_ref().is_some_and(|r| r.seq >= q)
            })
        };
        // The rank that failed first must have published what it saw (its
        // monitor may have published an earlier snapshot without it).
        let first = first_failed(&status);
        let missing: Vec<String> = status
            .ranks
            .iter()
            .filter(|r| r.rank != me && r.liveness == StoreLiveness::Connected)
            .filter(|r| r.heartbeat_age.is_some_and(|a| a.as_millis() < STALE_MS as u128))
            .filter(|r| {
                !snaps
                    .iter()
                    .any(|s| s.rank == r.rank && reached(s) && (Some(r.rank) != first || s.observation.is_some()))
            })
            .map(|r| keys::snapshot(r.rank))
            .collect();
        let now = Instant::now();
        let endings_due = vanished_without_ending(store, &status)?;
        if (missing.is_empty() && !endings_due) || now >= deadline || store.try_get(keys::VERDICT)?.is_some() {
            return Ok(status);
        }
        // Snapshots are overwritten in place, so poll rather than wait for
        // the keys to appear.
        let absent: Vec<&str> = missing
            .iter()
            .map(String::as_str)
            .filter(|k| !snaps.iter().any(|s| keys::snapshot(s.rank) == *k))
            .collect();
        let pause = (deadline - now).min(Duration::from_millis(20));
        if absent.is_empty() {
            std::thread::park_timeout(pause);
        } else {
            match store.wait(&absent, pause) {
                Ok(()) | Err(Error::StoreTimeout { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// The rank that raised the job-wide abort, if one did.
fn first_failed(status: &JobStatus) -> Option<usize> {
    let raw = status.abort.as_deref()?;
    serde_json::from_slice::<AbortRecord>(raw).ok().map(|r| r.rank)
}

/// Whether a rank vanished whose launcher (one runs: it announced itself)
/// has not yet recorded how it ended; worth a moment's wait, since "killed
/// by signal 9 (SIGKILL, OOM killer)" is the most useful line of a verdict.
fn vanished_without_ending(store: &mut StoreClient, status: &JobStatus) -> Result<bool, Error> {
    let vanished: Vec<String> =
        status.ranks.iter().filter(|r| r.liveness == StoreLiveness::Vanished).map(|r| keys::exit(r.rank)).collect();
    if vanished.is_empty() || store.try_get(keys::LAUNCHER)?.is_none() {
        return Ok(false);
    }
    let refs: Vec<&str> = vanished.iter().map(String::as_str).collect();
    Ok(!store.check(&refs)?)
}

/// The file name of a rank's dump: `ringleader-rank{R}.json` by global
/// rank, with the group's name for a sub-group (a process holds one
/// communicator per group, and their dumps must not overwrite each other).
pub(crate) fn dump_name(cfg: &Config) -> String {
    match cfg.group.as_ref() {
        None => format!("ringleader-rank{}.json", cfg.global_rank()),
        Some(g) => {
            let name: String = g
                .name
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
                .collect();
            format!("ringleader-rank{}-group{name}.json", cfg.global_rank())
        }
    }
}

/// Everything the store knows about the job, as verdict evidence (`group`:
/// the sub-group the communicator spans, so the verdict names global ranks).
pub(crate) fn evidence(
    store: &mut StoreClient,
    status: &JobStatus,
    world: usize,
    group: Option<Group>,
) -> Result<Evidence, Error> {
    let exits = fetch_prefix(store, keys::EXIT_PREFIX)?;
    let mut snapshots: Vec<Snapshot> = fetch_prefix(store, keys::SNAPSHOT_PREFIX)?
        .into_iter()
        .filter_map(|(_, v)| Snapshot::from_json(&String::from_utf8_lossy(&v)).ok())
        .collect();
    // What the rank that failed first saw is in the abort record, even when
    // its snapshot does not hold it yet.
    if let Some(record) = status.abort.as_deref().and_then(|raw| serde_json::from_slice::<AbortRecord>(raw).ok()) {
        if let Some(s) = snapshots.iter_mut().find(|s| s.rank == record.rank && s.observation.is_none()) {
            s.observation = Some(record.observation);
        }
    }
    let peers = status
        .ranks
        .iter()
        .map(|r| PeerView {
            rank: r.rank,
            liveness: match r.liveness {
                StoreLiveness::Connected => Liveness::Alive,
                StoreLiveness::Left => Liveness::Left,
                StoreLiveness::Vanished => Liveness::Vanished,
            },
            host: Some(r.host.clone()),
            pid: Some(r.pid),
            heartbeat_age_ms: r.heartbeat_age.map(|a| a.as_millis() as u64),
            beat: Beat::decode(&r.heartbeat),
            exit: exits
                .iter()
                .find(|(k, _)| *k == keys::exit(r.rank))
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned()),
        })
        .collect();
    Ok(Evidence { world_size: world, peers, snapshots, stale_after_ms: STALE_MS, group })
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
