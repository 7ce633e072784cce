//! Sleeping on this rank's doorbell until a peer rings it.

use super::domain::Domain;
use ringleader_core::AbortSignal;
use rustix::thread::futex;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Waits on this rank's doorbell.
#[derive(Clone)]
pub struct Waiter {
    pub(super) domain: Arc<Domain>,
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter").field("rank", &self.domain.rank).finish()
    }
}

impl Waiter {
    /// Sleeps until a peer rings the doorbell, `ready()` turns true, or
    /// `timeout` passes. `ready` is checked after registering as a sleeper,
    /// so a ring between the caller's last check and the sleep is not lost.
    pub fn wait(&self, timeout: Duration, ready: impl Fn() -> bool) {
        let bell = self.domain.own.doorbell();
        let epoch = bell.epoch.load(Ordering::Acquire);
        bell.sleepers.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !ready() {
            let ts = rustix::thread::futex::Timespec {
                tv_sec: timeout.as_secs() as i64,
                tv_nsec: timeout.subsec_nanos() as i64,
            };
            let _ = futex::wait(&bell.epoch, futex::Flags::empty(), epoch, Some(&ts));
        }
        bell.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Publishes the CPU this rank runs on, and returns it. Stored only
    /// when it changed: the doorbell's line is read by every peer that
    /// writes to this rank, and a store would take it from their caches.
    #[inline]
    pub fn note_cpu(&self) -> u32 {
        // SAFETY: no arguments; glibc answers from the thread's rseq area
        // (or the vDSO, or the system call), -1 only on failure.
        let cpu = unsafe { libc::sched_getcpu() }.max(0) as u32;
        let published = &self.domain.own.doorbell().cpu;
        if published.load(Ordering::Relaxed) != cpu + 1 {
            published.store(cpu + 1, Ordering::Relaxed);
        }
        cpu
    }

    /// Whether `peer` last ran (as it last started a collective or
    /// waited) on `cpu`.
    #[inline]
    pub fn peer_on(&self, peer: ringleader_core::Rank, cpu: u32) -> bool {
        match self.domain.peers.get(peer) {
            Some(Some(m)) => m.doorbell().cpu.load(Ordering::Relaxed) == cpu + 1,
            _ => false,
        }
    }

    /// Moves the calling thread off `cpu` (where a peer it waits for runs
    /// too) to a CPU of its affinity mask that no local rank last ran on,
    /// then puts the mask back as it was: the thread stays where it was
    /// moved, and the mask the user or the launcher set is unchanged.
    /// Whether it moved (not when every allowed CPU is taken, or the mask
    /// cannot be read or set).
    pub fn move_off(&self, cpu: u32) -> bool {
        use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
        let Ok(mask) = sched_getaffinity(None) else { return false };
        // This rank's own CPU is `cpu` (its caller has just published it).
        let taken = |c: usize| self.domain.local.iter().any(|&r| self.peer_on(r, c as u32));
        let Some(target) = (0..CpuSet::MAX_CPU).find(|&c| c != cpu as usize && mask.is_set(c) && !taken(c)) else {
            return false;
        };
        // Claimed first: the peer, which runs on `cpu` while this thread
        // moves, must not see it there still and move to `target` too.
        let published = &self.domain.own.doorbell().cpu;
        published.store(target as u32 + 1, Ordering::Relaxed);
        let mut one = CpuSet::new();
        one.set(target);
        if sched_setaffinity(None, &one).is_err() {
            self.note_cpu();
            return false;
        }
        // The mask of one CPU must not outlive this call: a second try if
        // the first fails (the mask was valid a moment ago).
        if sched_setaffinity(None, &mask).is_err() {
            let _ = sched_setaffinity(None, &mask);
        }
        self.note_cpu();
        true
    }

    /// Rings this rank's own doorbell: wakes its sleeping waits (another
    /// thread of this rank has new work for them).
    pub fn ring(&self) {
        let bell = self.domain.own.doorbell();
        bell.epoch.fetch_add(1, Ordering::Release);
        let _ = futex::wake(&bell.epoch, futex::Flags::empty(), i32::MAX as u32);
    }

    /// Makes `abort` ring this rank's doorbell, so a sleeping wait wakes.
    pub fn wake_on(&self, abort: &AbortSignal) {
        let d = self.domain.clone();
        abort.on_abort(move || {
            let bell = d.own.doorbell();
            bell.epoch.fetch_add(1, Ordering::Release);
            let _ = futex::wake(&bell.epoch, futex::Flags::empty(), i32::MAX as u32);
        });
    }
}
