//! `monitored_barrier`: a barrier whose rank 0 names the ranks that did not
//! arrive in time.
//!
//! It runs through the store rather than the data plane: a late rank's
//! arrival then lands in a key nobody reads any more instead of lingering on
//! a data link where the next collective would trip over it, the
//! communicator stays usable after a failure, and it works the same over
//! every transport.
//!
//! Its keys (`rl/mb/{seq}/...`) are deleted by rank 0 once every rank has
//! arrived at a later monitored barrier: each rank then has read the
//! earlier results, so nobody needs them any more (late arrivals at a
//! failed barrier included). At most one barrier's keys (world size + 1)
//! stay in the store.

use crate::engine::{Job, Shared};
use crate::failure::evidence;
use ringleader_core::error::fmt_ranks;
use ringleader_core::{Diagnosis, Error, ErrorKind, OpKind, Rank, Result};
use ringleader_diag::verdict::positions;
use ringleader_store::{keys, StoreClient};
use std::time::{Duration, Instant};

const OK: &[u8] = b"ok";

impl Shared {
    pub(crate) fn monitored_barrier(&self, job: &Job, timeout: Duration, wait_all: bool) -> Result<()> {
        let seq = job.seq;
        let mut store = self.store.lock();
        store.set(&keys::monitored_barrier(seq, &format!("arrived/{}", self.rank)), b"1")?;
        if self.rank == 0 {
            self.collect_arrivals(&mut store, seq, timeout, wait_all)
        } else {
            self.await_release(&mut store, seq, timeout)
        }
    }

    fn collect_arrivals(&self, store: &mut StoreClient, seq: u64, timeout: Duration, wait_all: bool) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let keys: Vec<String> =
            (1..self.world).map(|r| keys::monitored_barrier(seq, &format!("arrived/{r}"))).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        match store.wait(&refs, deadline.saturating_duration_since(Instant::now())) {
            Ok(()) => {
                store.set(&keys::monitored_barrier(seq, "result"), OK)?;
                forget_earlier(store, seq)?;
                return Ok(());
            }
            Err(Error::StoreTimeout { .. }) => {}
            Err(e) => return Err(e),
        }
        // Group ranks here; the report names global ranks.
        let mut late: Vec<Rank> = Vec::new();
        for (i, k) in refs.iter().enumerate() {
            if !store.check(&[k])? {
                late.push(i + 1);
                if !wait_all {
                    break;
                }
            }
        }
        let ms = timeout.as_millis();
        let who = if late.len() == 1 { "Rank" } else { "Ranks" };
        let list = late.iter().map(|&r| self.cfg.global(r).to_string()).collect::<Vec<_>>().join(", ");
        let headline = format!("{who} {list} failed to pass monitored_barrier in {ms} ms{}", self.of_group());
        let details = match store
            .status(None, Duration::ZERO)
            .map(|s| crate::failure::ours(s, self.world))
            .and_then(|s| evidence(store, &s, self.world, self.cfg.group.clone()))
        {
            Ok(ev) => {
                positions(&ev).into_iter().enumerate().filter(|(r, _)| late.contains(r)).map(|(_, l)| l).collect()
            }
            Err(_) => Vec::new(),
        };
        store.set(&keys::monitored_barrier(seq, "result"), headline.as_bytes())?;
        Err(Error::Collective(Box::new(Diagnosis {
            kind: ErrorKind::MissedCollective,
            culprits: late.iter().map(|&r| self.cfg.global(r)).collect(),
            op: Some(OpKind::MonitoredBarrier),
            seq: Some(seq),
            headline,
            details,
            hints: vec!["the late ranks are slow or stuck before this point (a dataloader, a skipped call): `py-spy dump --pid PID` shows where".into()],
            summary: None,
        })))
    }

    /// ` of group 1 (ranks 1-3)` in a sub-group, else nothing.
    fn of_group(&self) -> String {
        match self.cfg.group.as_ref() {
            Some(g) => format!(" of {g}"),
            None => String::new(),
        }
    }

    fn await_release(&self, store: &mut StoreClient, seq: u64, timeout: Duration) -> Result<()> {
        // Rank 0 answers at its own timeout at the latest; allow for clocks
        // starting at different moments.
        let limit = timeout + Duration::from_secs(2);
        match store.get(&keys::monitored_barrier(seq, "result"), limit) {
            Ok(v) if v == OK => Ok(()),
            Ok(report) => {
                let report = String::from_utf8_lossy(&report).into_owned();
                Err(Error::Collective(Box::new(Diagnosis {
                    kind: ErrorKind::MissedCollective,
                    culprits: culprits_in(&report),
                    op: Some(OpKind::MonitoredBarrier),
                    seq: Some(seq),
                    headline: format!(
                        "monitored_barrier #{seq}{} failed; rank {} reports: {report}",
                        self.of_group(),
                        self.cfg.global(0)
                    ),
                    details: Vec::new(),
                    hints: vec![format!("rank {}'s error has the details", self.cfg.global(0))],
                    summary: None,
                })))
            }
            Err(Error::StoreTimeout { .. }) => Err(Error::Collective(Box::new(Diagnosis {
                kind: ErrorKind::MissedCollective,
                culprits: vec![self.cfg.global(0)],
                op: Some(OpKind::MonitoredBarrier),
                seq: Some(seq),
                headline: format!(
                    "rank {} did not complete monitored_barrier #{seq}{} within {} ms; it collects the arrivals, so it did not reach this barrier",
                    self.cfg.global(0),
                    self.of_group(),
                    limit.as_millis()
                ),
                details: Vec::new(),
                hints: vec![format!("{} is where to look", fmt_ranks(&[self.cfg.global(0)]))],
                summary: None,
            }))),
            Err(e) => Err(e),
        }
    }
}

/// Deletes the keys of every monitored barrier before `seq`: every rank has
/// arrived at `seq`, so each has read their results.
fn forget_earlier(store: &mut StoreClient, seq: u64) -> Result<()> {
    for key in store.keys_with_prefix(keys::MONITORED_BARRIER_PREFIX)? {
        if keys::monitored_barrier_seq(&key).is_some_and(|s| s < seq) {
            store.delete(&key)?;
        }
    }
    Ok(())
}

/// The ranks named in rank 0's report (`Ranks 1, 3 failed ...`).
fn culprits_in(report: &str) -> Vec<Rank> {
    report
        .split(" failed")
        .next()
        .unwrap_or("")
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|t| t.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn culprits_are_read_back_from_the_report() {
        assert_eq!(super::culprits_in("Ranks 1, 3 failed to pass monitored_barrier in 4000 ms"), vec![1, 3]);
        assert_eq!(super::culprits_in("Rank 2 failed to pass monitored_barrier in 10 ms"), vec![2]);
    }
}
