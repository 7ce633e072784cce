//! A polling budget that learns from the waits that outlast it.
//!
//! A wait that polls for a fixed budget and then sleeps has a trap when
//! two ranks take turns (a ping-pong of sends and receives): once one of
//! them sleeps, its reply comes a wake-up later (50-150 µs in this VM), so
//! the other's wait outlasts the budget too and it sleeps as well, and its
//! reply comes a wake-up later in turn. Each side's sleep makes the other
//! sleep, and the pair stays in that mode (a 2-rank 8-byte send/recv
//! ping-pong, 0.6 µs a round trip, spent whole launches at 30-40 µs
//! on average, a tenth of the round trips over 100 µs) until a wake-up
//! happens to come sooner than the budget.
//!
//! So a wait that slept and still ended within [`SPIN_MAX`] doubles the
//! budget (polling that much longer would have met the peer's reply), and
//! one that lasted longer than that halves it, down to the base: a peer
//! that is really busy costs at most a few long polls. Only ranks with a
//! core each ([`Idle::Spin`]) adapt; where ranks share cores their waits
//! yield, and a longer budget would take the core from the peer they wait
//! for.
//!
//! Sans-IO: the caller measures its waits and says how long each lasted;
//! the budget is one atomic, so every thread of a rank can share it.

use super::wait::Idle;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The most a learned budget grows to: a few wake-ups of this VM.
pub const SPIN_MAX: Duration = Duration::from_micros(500);

/// A polling budget shared by the waits of one kind (see the module docs).
///
/// ```
/// use ringleader_transport::driver::spin_budget::SpinBudget;
/// use ringleader_transport::Idle;
/// use std::time::Duration;
/// let b = SpinBudget::new(Idle::Spin(Duration::from_micros(50)));
/// b.slept(Duration::from_micros(120)); // met a wake-up: poll longer
/// assert_eq!(b.idle(), Idle::Spin(Duration::from_micros(100)));
/// b.slept(Duration::from_millis(20)); // the peer was busy: back off
/// assert_eq!(b.idle(), Idle::Spin(Duration::from_micros(50)));
/// ```
#[derive(Debug)]
pub struct SpinBudget {
    /// The policy it starts from; a spin's duration is the floor.
    base: Idle,
    /// The learned spin, in nanoseconds (unused for [`Idle::Yield`]).
    ns: AtomicU64,
}

impl Default for SpinBudget {
    fn default() -> SpinBudget {
        SpinBudget::new(Idle::default())
    }
}

impl SpinBudget {
    /// A budget starting at `base`'s.
    pub fn new(base: Idle) -> SpinBudget {
        let ns = match base {
            Idle::Spin(d) => nanos(d),
            Idle::Yield(_) => 0,
        };
        SpinBudget { base, ns: AtomicU64::new(ns) }
    }

    /// The policy a wait polls by now.
    #[inline]
    pub fn idle(&self) -> Idle {
        match self.base {
            Idle::Spin(_) => Idle::Spin(Duration::from_nanos(self.ns.load(Ordering::Relaxed))),
            y @ Idle::Yield(_) => y,
        }
    }

    /// A wait that outlasted the budget and slept (or handed over) ended
    /// after `waited` in all: the budget grows or shrinks (module docs).
    pub fn slept(&self, waited: Duration) {
        let Idle::Spin(floor) = self.base else { return };
        let (floor, max) = (nanos(floor), nanos(SPIN_MAX).max(nanos(floor)));
        let now = self.ns.load(Ordering::Relaxed);
        let next = if waited <= SPIN_MAX { now.saturating_mul(2).clamp(floor, max) } else { (now / 2).max(floor) };
        // Threads that race here each made a fair update; one of them wins.
        self.ns.store(next, Ordering::Relaxed);
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_micros(50);

    fn spin(b: &SpinBudget) -> Duration {
        match b.idle() {
            Idle::Spin(d) => d,
            Idle::Yield(_) => panic!("a spinning budget yields"),
        }
    }

    #[test]
    fn waits_that_meet_a_wake_up_grow_it_to_the_cap_and_busy_peers_shrink_it_to_the_base() {
        let b = SpinBudget::new(Idle::Spin(BASE));
        assert_eq!(spin(&b), BASE);
        let mut seen = vec![];
        for _ in 0..6 {
            b.slept(Duration::from_micros(130));
            seen.push(spin(&b).as_micros());
        }
        assert_eq!(seen, [100, 200, 400, 500, 500, 500]);
        // A wait of exactly the cap still counts as one polling would have met.
        b.slept(SPIN_MAX);
        assert_eq!(spin(&b), SPIN_MAX);
        let mut seen = vec![];
        for _ in 0..5 {
            b.slept(Duration::from_millis(3));
            seen.push(spin(&b).as_micros());
        }
        assert_eq!(seen, [250, 125, 62, 50, 50]);
    }

    #[test]
    fn yielding_ranks_keep_their_policy() {
        let y = Idle::Yield(Duration::from_micros(20));
        let b = SpinBudget::new(y);
        b.slept(Duration::from_micros(100));
        assert_eq!(b.idle(), y);
    }

    #[test]
    fn a_base_above_the_cap_stays_put() {
        let b = SpinBudget::new(Idle::Spin(Duration::from_millis(2)));
        b.slept(Duration::from_micros(100));
        assert_eq!(spin(&b), Duration::from_millis(2));
        b.slept(Duration::from_secs(1));
        assert_eq!(spin(&b), Duration::from_millis(2));
    }
}
