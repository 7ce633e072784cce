//! The heartbeat, sans-IO: when a rank tells the store it is alive, and
//! when a change of the dump-request counter asks it for a dump.
//!
//! The monitor thread (src/monitor.rs) does the IO: on every tick it asks
//! [`Heartbeat::due`] with the time, and when a beat is due it sends the
//! rank's progress ([`ringleader_diag::Beat`]) on its member connection and
//! reads the dump-request counter, which it hands to
//! [`Heartbeat::dump_requested`]. The store judges a heartbeat older than
//! [`crate::failure::STALE_MS`] as a process that stopped answering, so
//! [`INTERVAL`] stays well below it.

use std::time::{Duration, Instant};

/// Between two heartbeats.
pub(crate) const INTERVAL: Duration = Duration::from_millis(500);

/// A rank's heartbeat schedule and the dump requests it has seen.
#[derive(Debug, Default)]
pub(crate) struct Heartbeat {
    last: Option<Instant>,
    /// The dump-request counter as last read (empty when it was unset);
    /// `None` before the first read.
    counter: Option<Vec<u8>>,
}

impl Heartbeat {
    /// Whether a beat is due at `now`; if so, it counts as sent.
    pub(crate) fn due(&mut self, now: Instant) -> bool {
        if self.last.is_some_and(|t| now.saturating_duration_since(t) < INTERVAL) {
            return false;
        }
        self.last = Some(now);
        true
    }

    /// The dump-request counter read with a beat (`None`: unset). When it
    /// changed since the last read, which asks for a dump, the request: its
    /// number (`Some(None)` if the counter is not a number). The first read
    /// only learns the counter (a request made before this rank started is
    /// not for it).
    pub(crate) fn dump_requested(&mut self, counter: Option<Vec<u8>>) -> Option<Option<i64>> {
        let requested = counter.is_some() && self.counter.is_some() && counter != self.counter;
        let number = counter.as_deref().and_then(|c| std::str::from_utf8(c).ok()?.trim().parse::<i64>().ok());
        self.counter = Some(counter.unwrap_or_default());
        requested.then_some(number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beats_are_due_once_per_interval_by_the_clock_given() {
        let t0 = Instant::now();
        let mut h = Heartbeat::default();
        assert!(h.due(t0), "the first beat is due at once");
        assert!(!h.due(t0 + Duration::from_millis(100)));
        assert!(!h.due(t0 + INTERVAL - Duration::from_millis(1)));
        assert!(h.due(t0 + INTERVAL));
        assert!(!h.due(t0 + INTERVAL + Duration::from_millis(499)));
        // A monitor that was late (a stopped process resumed) beats at once.
        assert!(h.due(t0 + Duration::from_secs(60)));
    }

    #[test]
    fn a_dump_is_requested_by_a_change_of_the_counter_not_by_its_first_value() {
        let mut h = Heartbeat::default();
        assert_eq!(h.dump_requested(Some(b"3".to_vec())), None, "a request older than this rank");
        assert_eq!(h.dump_requested(Some(b"3".to_vec())), None);
        assert_eq!(h.dump_requested(Some(b"4".to_vec())), Some(Some(4)));
        assert_eq!(h.dump_requested(Some(b"4".to_vec())), None);

        let mut fresh = Heartbeat::default();
        assert_eq!(fresh.dump_requested(None), None);
        assert_eq!(fresh.dump_requested(Some(b"1".to_vec())), Some(Some(1)), "the first request after start");
        assert_eq!(fresh.dump_requested(None), None, "a counter deleted asks for nothing");
    }
}
