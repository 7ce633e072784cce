//! Same-host peers watched through pidfds.
//!
//! The store learns of a rank's death when its connection closes, and tells
//! the others. That chain has one weak link: the store's own process. When
//! it dies (rank 0 hosts it in-process when nothing else does), a rank whose
//! peers share its host and talk to it over shared memory has nothing left
//! that would notice a dead peer: a ring position that never moves looks
//! like a slow peer. So each rank also holds a pidfd for every peer on its
//! host, which becomes readable when that process ends, whoever ends it
//! (kill -9, the OOM killer, a segfault), without ptrace and without the
//! store. The monitor polls them every tick (`poll` with a zero timeout,
//! one syscall for all of them).
//!
//! Only peers in the same pid namespace are watched: a pid from another
//! container on the same kernel names some other process here.

use crate::rendezvous::PeerInfo;
use ringleader_core::Rank;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fd::{AsFd, OwnedFd};
use rustix::process::{pidfd_open, Pid, PidfdFlags};

/// The pidfds of this rank's same-host peers.
#[derive(Debug, Default)]
pub(crate) struct PidWatch {
    /// (peer, its pidfd), for peers not yet seen ending.
    watched: Vec<(Rank, OwnedFd)>,
}

impl PidWatch {
    /// Watches every peer of `peers` that runs on `me`'s host, in `me`'s pid
    /// namespace. A peer whose pidfd cannot be opened (an old kernel, or it
    /// already ended) is left to the store.
    pub(crate) fn new(me: &PeerInfo, peers: &[PeerInfo]) -> PidWatch {
        let mut watched = Vec::new();
        if me.pid_ns.is_empty() {
            return PidWatch { watched };
        }
        for p in peers {
            if p.rank == me.rank || !p.same_host(me) || p.pid_ns != me.pid_ns {
                continue;
            }
            let Some(pid) = i32::try_from(p.pid).ok().and_then(Pid::from_raw) else { continue };
            match pidfd_open(pid, PidfdFlags::empty()) {
                Ok(fd) => watched.push((p.rank, fd)),
                Err(e) => tracing::debug!(rank = me.rank, peer = p.rank, "cannot watch pid {}: {e}", p.pid),
            }
        }
        PidWatch { watched }
    }

    /// How many peers are watched.
    pub(crate) fn len(&self) -> usize {
        self.watched.len()
    }

    /// The peers whose process ended since the last call (each reported once).
    pub(crate) fn ended(&mut self) -> Vec<Rank> {
        if self.watched.is_empty() {
            return Vec::new();
        }
        let mut fds: Vec<PollFd<'_>> =
            self.watched.iter().map(|(_, fd)| PollFd::from_borrowed_fd(fd.as_fd(), PollFlags::IN)).collect();
        let zero = Timespec { tv_sec: 0, tv_nsec: 0 };
        if !matches!(poll(&mut fds, Some(&zero)), Ok(n) if n > 0) {
            return Vec::new();
        }
        let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
        drop(fds);
        let mut ended = Vec::new();
        let mut i = 0;
        self.watched.retain(|(rank, _)| {
            let keep = !ready[i];
            i += 1;
            if !keep {
                ended.push(*rank);
            }
            keep
        });
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(rank: Rank, pid: u32) -> PeerInfo {
        PeerInfo {
            rank,
            pid,
            host: "h".into(),
            boot_id: "b".into(),
            pid_ns: crate::rendezvous::pid_namespace(),
            ..PeerInfo::default()
        }
    }

    #[test]
    fn a_child_that_ends_is_reported_once() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let me = info(0, std::process::id());
        let mut other_ns = info(2, child.id());
        other_ns.pid_ns = "pid:[1]".into();
        let mut w = PidWatch::new(&me, &[me.clone(), info(1, child.id()), other_ns]);
        assert_eq!(w.len(), 1, "the peer in another pid namespace is not watched");
        assert!(w.ended().is_empty());
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(w.ended(), vec![1]);
        assert!(w.ended().is_empty());
    }
}
