//! Cheap timestamps for the flight recorder.
//!
//! Every collective is stamped three times (created, started, completed).
//! A sub-microsecond all_reduce over shared memory cannot afford three
//! `clock_gettime` calls (about 40 ns each on a TSC-clocked VM), so where
//! the CPU has an invariant time-stamp counter a stamp is one `rdtsc`
//! (a few ns) and is turned into nanoseconds only when someone reads the
//! recorder: by the counter's rate measured between the process's first
//! stamp and that read, which needs no calibration wait at start-up.
//! Elsewhere a stamp is the nanoseconds of a monotonic clock.
//!
//! ```
//! use ringleader_diag::clock;
//! let t = clock::now();
//! let ns = clock::Reader::new().since_origin_ns(t);
//! assert!(clock::Reader::new().since_origin_ns(clock::now()) >= ns);
//! ```

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Where stamps count from: a counter value, the monotonic and the wall
/// clock at that moment.
#[derive(Debug)]
struct Origin {
    tick: u64,
    instant: Instant,
    wall_ns: u64,
    tsc: bool,
}

fn origin() -> &'static Origin {
    static ORIGIN: OnceLock<Origin> = OnceLock::new();
    ORIGIN.get_or_init(|| {
        let tsc = invariant_tsc();
        Origin {
            tick: if tsc { rdtsc() } else { 0 },
            instant: Instant::now(),
            wall_ns: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64),
            tsc,
        }
    })
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[allow(unsafe_code)] // one side-effect-free instruction
fn rdtsc() -> u64 {
    // SAFETY: RDTSC exists on every x86-64 CPU, reads a counter and has no
    // side effects (the intrinsic is `unsafe` only by convention).
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn rdtsc() -> u64 {
    0
}

/// Whether the counter ticks at one rate in every power state and on every
/// core (CPUID 0x8000_0007, EDX bit 8), so that stamps are comparable.
#[cfg(target_arch = "x86_64")]
fn invariant_tsc() -> bool {
    use std::arch::x86_64::__cpuid;
    let max_ext = __cpuid(0x8000_0000).eax;
    max_ext >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
}

#[cfg(not(target_arch = "x86_64"))]
fn invariant_tsc() -> bool {
    false
}

/// A stamp: raw counter ticks, or nanoseconds since the origin where there
/// is no invariant counter. Never 0 once taken (0 means "not stamped").
#[inline]
pub fn now() -> u64 {
    let o = origin();
    let t = if o.tsc { rdtsc() } else { o.instant.elapsed().as_nanos() as u64 };
    t.max(1)
}

/// Wall-clock nanoseconds `ns` of a rank whose clock is `offset_ns` behind
/// the store's (the store's minus the rank's; `None`: unknown, left as
/// they are), on the store's clock: how ranks on different hosts are put on
/// one time line.
///
/// ```
/// assert_eq!(ringleader_diag::clock::on_store_clock(1_000, Some(-300)), 700);
/// assert_eq!(ringleader_diag::clock::on_store_clock(1_000, None), 1_000);
/// ```
pub fn on_store_clock(ns: u64, offset_ns: Option<i64>) -> u64 {
    ns.saturating_add_signed(offset_ns.unwrap_or(0))
}

/// Converts stamps to nanoseconds, at the counter rate measured when it was
/// made (make one per batch of conversions).
#[derive(Debug, Clone, Copy)]
pub struct Reader {
    origin_tick: u64,
    /// Ticks and nanoseconds elapsed since the origin at creation.
    ticks: u64,
    nanos: u64,
    wall_ns: u64,
    tsc: bool,
}

impl Reader {
    /// A reader for stamps taken up to now.
    pub fn new() -> Reader {
        let o = origin();
        let nanos = o.instant.elapsed().as_nanos() as u64;
        let ticks = if o.tsc { rdtsc().saturating_sub(o.tick) } else { nanos };
        Reader { origin_tick: o.tick, ticks, nanos, wall_ns: o.wall_ns, tsc: o.tsc }
    }

    /// Nanoseconds from the origin to stamp `t`.
    pub fn since_origin_ns(&self, t: u64) -> u64 {
        if !self.tsc {
            return t;
        }
        let dt = t.saturating_sub(self.origin_tick);
        if self.ticks == 0 {
            return 0;
        }
        (dt as u128 * self.nanos as u128 / self.ticks as u128) as u64
    }

    /// Stamp `t` as wall-clock nanoseconds since the Unix epoch.
    pub fn wall_ns(&self, t: u64) -> u64 {
        self.wall_ns + self.since_origin_ns(t)
    }

    /// Nanoseconds from stamp `t` to this reader's creation.
    pub fn age_ns(&self, t: u64) -> u64 {
        self.nanos.saturating_sub(self.since_origin_ns(t))
    }
}

impl Default for Reader {
    fn default() -> Reader {
        Reader::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stamps_convert_to_the_monotonic_and_wall_clocks() {
        let wall0 = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
        let a = now();
        let begun = Instant::now();
        // Busy-wait (no sleep): the interval is what is measured.
        while begun.elapsed() < Duration::from_millis(20) {}
        let b = now();
        let r = Reader::new();
        let measured = r.since_origin_ns(b) - r.since_origin_ns(a);
        assert!((19_000_000..40_000_000).contains(&measured), "20 ms measured as {measured} ns");
        assert!(r.age_ns(b) < 5_000_000, "{}", r.age_ns(b));
        let wall = r.wall_ns(a);
        assert!(wall.abs_diff(wall0) < 50_000_000, "wall {wall} vs {wall0}");
        assert!(a > 0 && b >= a);
    }
}
