//! A test-only hook that makes ringleader panic at a chosen place, so that
//! tests can show a panic ends the operation with an `internal` error and
//! never a hang.
//!
//! Nothing arms it but a call to [`arm`], which is hidden from the
//! documentation and which no code path of the library makes: no
//! environment variable or setting reaches it. Once armed it fires once,
//! at the first matching place, then disarms itself. Checking costs one
//! relaxed atomic load.

use std::sync::atomic::{AtomicU64, Ordering};

/// Where an armed hook panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Point {
    /// In the engine, as it starts a collective (on the engine thread for a
    /// queued call, on the caller's thread for an inline one).
    Engine = 1,
    /// In the transport's driver, as it starts moving a collective's data.
    Driver = 2,
    /// In the send/recv lane thread, as it moves a send or receive.
    P2p = 3,
    /// In the rank deciding a failure's verdict, as it is about to offer
    /// it (`seq`: the failing collective's), so that a test can end the
    /// decider there, as if it died mid-gather.
    Decide = 4,
}

impl Point {
    /// Parses `engine`, `driver`, `p2p` or `decide`.
    pub fn parse(s: &str) -> Option<Point> {
        match s {
            "engine" => Some(Point::Engine),
            "driver" => Some(Point::Driver),
            "p2p" => Some(Point::P2p),
            "decide" => Some(Point::Decide),
            _ => None,
        }
    }
}

/// Point in the top byte, sequence number below; 0 when disarmed.
static ARMED: AtomicU64 = AtomicU64::new(0);

/// Arms the hook: the next time `point` is reached for the operation
/// numbered `seq` (a collective's sequence number, or a send's or
/// receive's per-peer number), that place panics. For tests only.
#[doc(hidden)]
pub fn arm(point: Point, seq: u64) {
    ARMED.store(((point as u64) << 56) | (seq & ((1 << 56) - 1)), Ordering::SeqCst);
}

/// Panics if the hook is armed for `point` and `seq` (and disarms it).
#[inline]
pub fn check(point: Point, seq: u64) {
    let armed = ARMED.load(Ordering::Relaxed);
    if armed != 0 {
        fire(armed, point, seq);
    }
}

#[cold]
fn fire(armed: u64, point: Point, seq: u64) {
    let want = ((point as u64) << 56) | (seq & ((1 << 56) - 1));
    if armed == want && ARMED.compare_exchange(armed, 0, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
        panic!("injected fault: {point:?} panics at #{seq} (test hook)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_once_at_the_armed_place() {
        check(Point::Engine, 3);
        arm(Point::Driver, 3);
        check(Point::Engine, 3);
        check(Point::Driver, 2);
        let r = std::panic::catch_unwind(|| check(Point::Driver, 3));
        assert!(r.is_err());
        check(Point::Driver, 3);
        assert_eq!(Point::parse("p2p"), Some(Point::P2p));
    }
}
