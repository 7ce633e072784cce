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
        let cpu = crate::cpu::current();
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
    /// too) to a CPU of its affinity mask that no local rank last ran on
    /// ([`crate::cpu::move_off`]), and publishes where it runs then.
    /// Whether it moved.
    pub fn move_off(&self, cpu: u32) -> bool {
        // This rank's own CPU is `cpu` (its caller has just published it).
        let taken = |c: usize| self.domain.local.iter().any(|&r| self.peer_on(r, c as u32));
        // Claimed first: the peer, which runs on `cpu` while this thread
        // moves, must not see it there still and move to the target too.
        let published = &self.domain.own.doorbell().cpu;
        let moved = crate::cpu::move_off(cpu, taken, |target| published.store(target as u32 + 1, Ordering::Relaxed));
        self.note_cpu();
        moved
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
