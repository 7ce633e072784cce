//! Shared memory between ranks on one host.
//!
//! Each rank owns one segment holding the rings it *reads* (one per local
//! peer and stream) and a doorbell: a futex word its peers ring when they
//! wrote into one of its rings or freed space in one they read. A ring is a
//! single-producer single-consumer byte stream, so the frames, the
//! fingerprint checks and the driver are the same as over TCP; only copies
//! are cheaper, and a receive can be reduced straight out of the ring.
//!
//! Waiting spins briefly, then sleeps on the doorbell (`FUTEX_WAIT` on shared
//! memory), so ranks that outnumber the cores do not starve each other. The
//! abort signal rings the doorbell too, so an abort wakes a sleeping wait at
//! once, as it does a `poll` on sockets.
//!
//! Segments are allocated in full when they are created (`fallocate`), not
//! merely sized: a sparse file on a tmpfs too small for it (a container's
//! 64 MiB `/dev/shm`) would kill the process with SIGBUS at the first write
//! past the space left. Before creating its segment each rank checks that
//! `/dev/shm` has room for every local rank's segment (this run's segments
//! already there count as room), so on a short `/dev/shm` every rank of the
//! host fails at once with the same error, which names the sizes and the
//! fixes. Should the allocation still fail (another job took the space
//! meanwhile), the rank leaves a note in its segment file that its peers
//! read instead of waiting for the segment.
//!
//! Segments are files under `/dev/shm` only until every local peer has
//! mapped them: the owner unlinks its file right after the local handshake,
//! so a job whose ranks are killed leaves nothing behind. Files of crashed
//! start-ups (the owner's pid is dead) are removed by the next job.
//!
//! Large frames can skip the ring ("single copy"): the writer puts only a
//! descriptor (the payload's address in its own memory) into the ring, the
//! reader copies the payload straight from the writer's process into its
//! destination with `process_vm_readv` (cross-memory attach), and then
//! acknowledges it in its ring header, which is when the writer's send
//! completes. One copy instead of two (into the ring, out of it) is what
//! bandwidth-bound transfers need. The reader only accepts descriptors from
//! a peer whose memory it proved it can read at set-up (a random nonce at a
//! published address), so ptrace restrictions, seccomp or separate pid
//! namespaces leave the ring in use rather than fail a collective.
//!
//! Small frames (up to [`BOX_PAYLOAD`] bytes of payload) skip the ring the
//! other way: the writer puts the whole frame, header fields and payload,
//! in a fastbox cell beside the ring (the header and the payload's first
//! bytes in its first cache line), which the reader polls; a frame costs
//! about the transfer of the lines it fills. Cells keep their place in the
//! ring's order, and a writer without a free cell uses the ring (see
//! `fastbox.rs`).
//!
//! Everything read from shared memory (the ring positions) is bounded before
//! use: a corrupt or malicious peer can make this rank fail, never make it
//! read or write outside the mapping.
//!
//! Where each part lives: `segment.rs` the shared layout (doorbell, ring
//! headers, fastbox cells) and the mapping; `room.rs` whether `/dev/shm`
//! can hold the job; `domain.rs` creating and opening the segments;
//! `link.rs` a ring pair as a [`crate::Link`], and the links made from a
//! domain; `fastbox.rs` the fastboxes; `cross_memory.rs` reading a peer's
//! memory (single copy and its probe); `waiter.rs` sleeping on the
//! doorbell.
#![allow(unsafe_code)]

mod cross_memory;
mod domain;
mod fastbox;
mod link;
mod room;
mod segment;
mod waiter;

#[cfg(test)]
mod tests;

pub use domain::Domain;
pub use fastbox::Fastbox;
pub use link::ShmLink;
pub use segment::{segment_name, BOX_PAYLOAD};
pub use waiter::Waiter;

/// Fastbox cells per ring between two ranks of a 2-rank host (for tests
/// that fill them).
#[cfg(test)]
pub(crate) const CELLS_PER_RING: usize = segment::cells_per_ring(2);

#[cfg(test)]
use ringleader_core::AbortSignal;
#[cfg(test)]
use std::time::Duration;

/// Bytes of one ring (a power of two, a multiple of 8).
pub const RING_BYTES: usize = 2 << 20;
/// A long write publishes its progress (and rings the reader's doorbell)
/// every this many bytes, so copying in and copying out overlap.
const PUBLISH_EVERY: usize = 128 << 10;

/// Two "ranks" in one process, each with its own domain; frames from 64
/// bytes on go single-copy.
#[cfg(test)]
pub(crate) fn test_pair(run: &str) -> (ShmLink, ShmLink, Waiter, Waiter) {
    test_pair_with(run, [Some(64), Some(64)])
}

/// [`test_pair`] with each rank's single-copy setting.
#[cfg(test)]
pub(crate) fn test_pair_with(run: &str, single_copy: [Option<usize>; 2]) -> (ShmLink, ShmLink, Waiter, Waiter) {
    let abort = AbortSignal::new().unwrap();
    let mut a = Domain::create(run, 0, 2, &[0, 1], 1, single_copy[0]).unwrap();
    let mut b = Domain::create(run, 1, 2, &[0, 1], 1, single_copy[1]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    let (na, nb) = (a.name().to_string(), b.name().to_string());
    a.open_peer(1, &nb, deadline, &abort).unwrap();
    b.open_peer(0, &na, deadline, &abort).unwrap();
    a.unlink();
    b.unlink();
    let (mut la, wa) = a.links();
    let (mut lb, wb) = b.links();
    (la.remove(0).1.remove(0), lb.remove(0).1.remove(0), wa, wb)
}
