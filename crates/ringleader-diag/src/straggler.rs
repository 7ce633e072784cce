//! Stragglers from arrival times.
//!
//! A collective makes every rank's step equally long (the early ranks wait
//! for the late one inside it), so durations cannot tell who is slow; when
//! each rank entered each collective can. For every collective that all
//! ranks report, the rank that entered it last is the one the others
//! waited for, and each rank's lag is how long after the first rank it
//! entered. Over a recent window, a rank that is last most of the time by a
//! clear margin is a straggler; in a healthy job who comes last is a matter
//! of chance and the lags are scheduling noise.
//!
//! Arrival times are wall clocks (ns since the Unix epoch) read on each
//! rank's host, put on the store's clock by the offset each rank measured
//! as it started ([`Arrivals::on_store_clock`]): on one host they compare
//! exactly; across hosts within half a round trip to the store, whatever
//! the hosts' own clocks say.
//!
//! Pure: the monitor (live warnings), `ringleader status` (what ranks
//! published in the store) and `ringleader analyze` (dumps) feed it.

use crate::recorder::Entry;
use ringleader_core::Rank;
use serde::{Deserialize, Serialize};

/// How many recent collectives the statistics cover at most.
pub const WINDOW: usize = 1000;
/// Fewer collectives compared than this: no verdict on anyone.
pub const MIN_COMPARED: usize = 20;
/// A straggler arrived last in at least this share of the collectives...
pub const LAST_SHARE: f64 = 0.5;
/// ... with a median lag of at least this much.
pub const MIN_MEDIAN_LAG_NS: u64 = 5_000_000;

/// When one rank entered its recent collectives: collective `first_seq + i`
/// at `base_ns + offsets_us[i] * 1000`. Compact, because ranks publish it
/// in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Arrivals {
    /// The rank (global).
    pub rank: Rank,
    /// Sequence number of the first collective listed.
    pub first_seq: u64,
    /// Wall clock of the first arrival, ns since the Unix epoch.
    pub base_ns: u64,
    /// Arrivals after the first, in µs, one per collective in order.
    pub offsets_us: Vec<u64>,
}

impl Arrivals {
    /// The arrivals of `rank` in its flight record: the started
    /// collectives, the last `window` of them (an unbroken run of sequence
    /// numbers: a gap ends the run).
    pub fn from_entries(rank: Rank, entries: &[Entry], window: usize) -> Option<Arrivals> {
        let mut run: Vec<(u64, u64)> = Vec::new();
        for e in entries.iter().filter(|e| !e.fingerprint.op.is_p2p() && e.collective_seq_id > 0) {
            let Some(t) = e.time_discovered_started_ns else { continue };
            if run.last().is_some_and(|&(s, _)| s + 1 != e.collective_seq_id) {
                run.clear();
            }
            run.push((e.collective_seq_id, t));
        }
        let run = &run[run.len().saturating_sub(window)..];
        let &(first_seq, base_ns) = run.first()?;
        Some(Arrivals {
            rank,
            first_seq,
            base_ns,
            offsets_us: run.iter().map(|&(_, t)| t.saturating_sub(base_ns) / 1000).collect(),
        })
    }

    /// The same arrivals on the store's clock: `offset_ns` is the store's
    /// wall clock minus this rank's (`None`: unknown, left as they are).
    pub fn on_store_clock(mut self, offset_ns: Option<i64>) -> Arrivals {
        self.base_ns = crate::clock::on_store_clock(self.base_ns, offset_ns);
        self
    }

    /// The arrival at collective `seq`, if listed.
    pub fn at(&self, seq: u64) -> Option<u64> {
        let i = usize::try_from(seq.checked_sub(self.first_seq)?).ok()?;
        self.offsets_us.get(i).map(|us| self.base_ns + us * 1000)
    }

    /// The last collective listed.
    pub fn last_seq(&self) -> Option<u64> {
        (!self.offsets_us.is_empty()).then(|| self.first_seq + self.offsets_us.len() as u64 - 1)
    }
}

/// One rank's record over the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankStats {
    /// The rank (global).
    pub rank: Rank,
    /// Collectives compared (those every rank reported).
    pub compared: usize,
    /// In how many of them it arrived last.
    pub last: usize,
    /// Median of its lag behind the first rank to arrive, ns.
    pub median_lag_ns: u64,
    /// 99th percentile of that lag, ns.
    pub p99_lag_ns: u64,
}

impl RankStats {
    /// The share of collectives it arrived last in, 0 to 1.
    pub fn last_share(&self) -> f64 {
        if self.compared == 0 {
            0.0
        } else {
            self.last as f64 / self.compared as f64
        }
    }

    /// Whether it is a straggler: last in at least [`LAST_SHARE`] of at
    /// least [`MIN_COMPARED`] collectives, by a median lag of at least
    /// [`MIN_MEDIAN_LAG_NS`].
    pub fn is_straggler(&self) -> bool {
        self.compared >= MIN_COMPARED && self.last_share() >= LAST_SHARE && self.median_lag_ns >= MIN_MEDIAN_LAG_NS
    }

    /// `rank 5 arrived last in 87% of the last 1000 collectives, median lag
    /// 41.0 ms, p99 52.3 ms`.
    pub fn line(&self) -> String {
        format!(
            "rank {} arrived last in {:.0}% of the last {} collectives, median lag {}, p99 {}",
            self.rank,
            100.0 * self.last_share(),
            self.compared,
            ms(self.median_lag_ns),
            ms(self.p99_lag_ns)
        )
    }
}

fn ms(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}

/// Per rank (in the order given), who arrived last and by how much over
/// the last `window` collectives that every rank in `arrivals` reported.
/// A collective where two ranks tie for last counts for the lower rank.
///
/// ```
/// use ringleader_diag::straggler::{stats, Arrivals};
/// // Rank 1 enters every collective 50 ms after rank 0.
/// let a = |rank, late_us: u64| Arrivals { rank, first_seq: 1, base_ns: 0,
///     offsets_us: (0..100u64).map(|i| i * 100_000 + late_us).collect() };
/// let s = stats(&[a(0, 0), a(1, 50_000)], 1000);
/// assert_eq!((s[1].last, s[1].compared), (100, 100));
/// assert_eq!(s[1].median_lag_ns, 50_000_000);
/// assert!(s[1].is_straggler() && !s[0].is_straggler());
/// ```
pub fn stats(arrivals: &[Arrivals], window: usize) -> Vec<RankStats> {
    let lo = arrivals.iter().map(|a| a.first_seq).max().unwrap_or(0);
    let hi = arrivals.iter().map(|a| a.last_seq().unwrap_or(0)).min().unwrap_or(0);
    let n = arrivals.len();
    let mut lags: Vec<Vec<u64>> = vec![Vec::new(); n];
    let mut last = vec![0usize; n];
    if n > 0 && hi >= lo {
        let from = hi.saturating_sub(window as u64 - 1).max(lo);
        for seq in from..=hi {
            let times: Option<Vec<u64>> = arrivals.iter().map(|a| a.at(seq)).collect();
            let Some(times) = times else { continue };
            let first = times.iter().copied().min().unwrap_or(0);
            let latest = times.iter().copied().max().unwrap_or(0);
            let who = (0..n).filter(|&i| times[i] == latest).min_by_key(|&i| arrivals[i].rank).unwrap_or(0);
            last[who] += 1;
            for (i, t) in times.iter().enumerate() {
                lags[i].push(t - first);
            }
        }
    }
    arrivals
        .iter()
        .zip(lags)
        .zip(last)
        .map(|((a, mut l), last)| {
            l.sort_unstable();
            RankStats {
                rank: a.rank,
                compared: l.len(),
                last,
                median_lag_ns: quantile(&l, 0.5),
                p99_lag_ns: quantile(&l, 0.99),
            }
        })
        .collect()
}

/// The `q` quantile of sorted `v` (nearest rank); 0 for none.
fn quantile(v: &[u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// The straggler warning: one line per straggler, or `None` when there is
/// none.
pub fn warning(stats: &[RankStats]) -> Option<String> {
    let lines: Vec<String> = stats.iter().filter(|s| s.is_straggler()).map(RankStats::line).collect();
    (!lines.is_empty()).then(|| format!("[straggler] {}", lines.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(rank: Rank, first_seq: u64, n: u64, late_us: impl Fn(u64) -> u64) -> Arrivals {
        // Collective `seq` starts at (seq - 1) x 200 ms on every rank's clock.
        let base_ns = 1_000 + (first_seq - 1) * 200_000_000;
        Arrivals { rank, first_seq, base_ns, offsets_us: (0..n).map(|i| i * 200_000 + late_us(i)).collect() }
    }

    #[test]
    fn a_rank_late_every_step_is_named() {
        let a = [steps(0, 1, 200, |_| 0), steps(1, 1, 200, |_| 50_000), steps(2, 1, 200, |i| i % 7)];
        let s = stats(&a, WINDOW);
        assert_eq!((s[1].last, s[1].compared), (200, 200));
        assert!(s[1].is_straggler());
        assert!(!s[0].is_straggler() && !s[2].is_straggler());
        let w = warning(&s).unwrap();
        assert!(w.contains("rank 1 arrived last in 100% of the last 200 collectives, median lag 50.0 ms"), "{w}");
    }

    #[test]
    fn a_host_clock_ahead_makes_no_straggler_on_the_stores_clock() {
        // Rank 1 is on time, but its host's clock runs 80 ms ahead: on its
        // own clock it looks late every step, on the store's it is not.
        let ahead = |r| {
            let mut a = steps(r, 1, 200, |i| i % 5);
            a.base_ns += 80_000_000;
            a
        };
        let raw = [steps(0, 1, 200, |i| (i + 2) % 5), ahead(1)];
        assert!(stats(&raw, WINDOW)[1].is_straggler(), "the skew alone looks like a straggler");
        let aligned =
            [steps(0, 1, 200, |i| (i + 2) % 5).on_store_clock(Some(0)), ahead(1).on_store_clock(Some(-80_000_000))];
        assert_eq!(warning(&stats(&aligned, WINDOW)), None);
    }

    #[test]
    fn chance_and_noise_raise_no_alarm() {
        // Who is last alternates and lags are microseconds.
        let a = [steps(0, 1, 300, |i| (i % 2) * 30), steps(1, 1, 300, |i| ((i + 1) % 2) * 30)];
        let s = stats(&a, WINDOW);
        assert_eq!(s[0].last + s[1].last, 300);
        assert_eq!(warning(&s), None);
        // Always last by a few microseconds: last, but no lag worth a warning.
        let a = [steps(0, 1, 300, |_| 0), steps(1, 1, 300, |_| 3)];
        assert_eq!(warning(&stats(&a, WINDOW)), None);
    }

    #[test]
    fn only_collectives_every_rank_reported_count_within_the_window() {
        // Rank 1's record starts later (its ring wrapped); the window keeps the last 50.
        let a = [steps(0, 1, 300, |_| 0), steps(1, 101, 200, |_| 9_000)];
        let s = stats(&a, 50);
        assert_eq!(s[1].compared, 50);
        assert_eq!(s[1].median_lag_ns, 9_000_000);
        assert_eq!(stats(&[steps(0, 1, 5, |_| 0), steps(1, 10, 5, |_| 0)], WINDOW)[0].compared, 0);
        assert!(stats(&[], WINDOW).is_empty());
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!((quantile(&v, 0.5), quantile(&v, 0.99), quantile(&[], 0.5)), (50, 99, 0));
    }
}
