//! Where a rank's thread runs, and moving it off a core it shares with a
//! peer it waits for.
//!
//! Two ranks that each should have a core of their own sometimes find
//! themselves on one: the scheduler starts them there, and leaves them
//! there while both keep running. A rank that then polls for its peer only
//! delays it; the driver's idle policy (`driver/wait.rs`) notices, through
//! whatever tells it where the peer last ran (a shared-memory doorbell, or
//! the kernel's word on a loopback socket), and moves the rank with
//! [`move_off`]. The move is the rank's own: the affinity mask is narrowed
//! to one CPU and put back at once, so the user's or the launcher's mask
//! stays as it was.

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

/// The CPU the calling thread runs on now (0 if the kernel cannot say).
#[inline]
pub fn current() -> u32 {
    // SAFETY: no arguments; glibc answers from the thread's rseq area (or
    // the vDSO, or the system call), -1 only on failure.
    #[allow(unsafe_code)]
    let cpu = unsafe { libc::sched_getcpu() };
    cpu.max(0) as u32
}

/// Moves the calling thread off `cpu` to the first CPU of its affinity mask
/// that is not `cpu` and not `taken` (a CPU some local rank last ran on),
/// then puts the mask back as it was: the thread stays where it was moved.
/// `claim(target)` runs before the move, so that a peer that reads where
/// this rank runs does not pick the same target meanwhile. Whether it
/// moved: not when every allowed CPU is taken, or the mask cannot be read
/// or set.
pub fn move_off(cpu: u32, taken: impl Fn(usize) -> bool, claim: impl FnOnce(usize)) -> bool {
    let Ok(mask) = sched_getaffinity(None) else { return false };
    let Some(target) = (0..CpuSet::MAX_CPU).find(|&c| c != cpu as usize && mask.is_set(c) && !taken(c)) else {
        return false;
    };
    claim(target);
    let mut one = CpuSet::new();
    one.set(target);
    if sched_setaffinity(None, &one).is_err() {
        return false;
    }
    // The mask of one CPU must not outlive this call: a second try if the
    // first fails (the mask was valid a moment ago).
    if sched_setaffinity(None, &mask).is_err() {
        let _ = sched_setaffinity(None, &mask);
    }
    true
}

/// The CPUs the calling thread may run on (for tests that pin threads).
#[cfg(test)]
pub(crate) fn allowed() -> Vec<usize> {
    let mask = sched_getaffinity(None).unwrap();
    (0..CpuSet::MAX_CPU).filter(|&c| mask.is_set(c)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_keeps_the_mask_and_skips_taken_cpus() {
        let before = sched_getaffinity(None).unwrap();
        let allowed = allowed();
        let here = current();
        // Every CPU taken: no move, and no claim.
        assert!(!move_off(here, |_| true, |_| panic!("claimed with nowhere to go")));
        let mut claimed = None;
        let moved = move_off(here, |_| false, |t| claimed = Some(t));
        assert_eq!(moved, allowed.iter().any(|&c| c != here as usize), "allowed {allowed:?}, on {here}");
        if moved {
            let t = claimed.unwrap();
            assert_ne!(t, here as usize);
            assert!(before.is_set(t));
        }
        let after = sched_getaffinity(None).unwrap();
        assert!((0..CpuSet::MAX_CPU).all(|c| after.is_set(c) == before.is_set(c)), "the mask changed");
    }
}
