//! Live straggler statistics: every rank publishes when it entered its
//! recent collectives (`rl/arrivals/{rank}`), and rank 0 compares them and
//! warns, once per change of who straggles, naming the rank that arrived
//! last and by how much (see [`ringleader_diag::straggler`]).
//!
//! Run from the monitor thread every [`EVERY`]; reading the flight record
//! and one store round trip each time, nothing on the collectives' path.

use crate::engine::Shared;
use crate::log;
use ringleader_core::Rank;
use ringleader_diag::straggler::{self, Arrivals};
use ringleader_store::{keys, StoreClient};
use std::time::{Duration, Instant};

/// How often arrivals are published and compared.
pub(crate) const EVERY: Duration = Duration::from_secs(3);

/// What the monitor keeps between rounds.
#[derive(Debug, Default)]
pub(crate) struct ArrivalWatch {
    last_round: Option<Instant>,
    /// The last collective published.
    published: u64,
    /// The stragglers the last warning named.
    warned: Vec<Rank>,
}

impl ArrivalWatch {
    /// Publishes this rank's arrivals when new collectives started, and on
    /// rank 0 compares everyone's; store errors are left to the heartbeat,
    /// which notices a lost store.
    pub(crate) fn tick(&mut self, sh: &Shared, store: &mut StoreClient) {
        // The first round comes one period after the monitor starts: there
        // is no window of arrivals to compare before that, and a job's
        // first collectives (a short benchmark's timed loop, say) are not
        // interrupted by reading the whole flight record.
        let last = *self.last_round.get_or_insert_with(Instant::now);
        if last.elapsed() < EVERY {
            return;
        }
        self.last_round = Some(Instant::now());
        let started = sh.fr.progress().last_started.load(std::sync::atomic::Ordering::Relaxed);
        if started == self.published || sh.cfg.fr_size == 0 {
            return;
        }
        self.published = started;
        let Some(mine) = Arrivals::from_entries(sh.cfg.global_rank(), &sh.fr.entries(), straggler::WINDOW) else {
            return;
        };
        let mine = mine.on_store_clock(sh.clock.get().map(|c| c.offset_ns));
        if store.set(&keys::arrivals(sh.rank), &serde_json::to_vec(&mine).unwrap_or_default()).is_err() || sh.rank != 0
        {
            return;
        }
        let Ok(names) = store.keys_with_prefix(keys::ARRIVALS_PREFIX) else { return };
        if names.len() < sh.world {
            return;
        }
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let Ok(values) = store.multi_get(&refs, Duration::from_secs(1)) else { return };
        let all: Vec<Arrivals> = values.iter().filter_map(|v| serde_json::from_slice(v).ok()).collect();
        let stats = straggler::stats(&all, straggler::WINDOW);
        let stragglers: Vec<Rank> = stats.iter().filter(|s| s.is_straggler()).map(|s| s.rank).collect();
        if stragglers != self.warned {
            if let Some(w) = straggler::warning(&stats) {
                log::warn(&sh.cfg, &w);
            }
            self.warned = stragglers;
        }
    }
}
