//! One-round schedules for small messages among a few ranks: every rank
//! sends what each peer needs straight to it and receives straight from
//! each, so a collective costs one hop instead of `log2 n` (recursive
//! doubling, binomial trees) or `n - 1` (the ring, which all-gather and
//! reduce-scatter use on worlds that are not a power of two).
//!
//! Small messages are latency-bound: what a collective costs is how many
//! times a rank waits for a peer, not how many bytes it moves. Over shared
//! memory a frame of a few kilobytes is a fastbox write, and with more
//! ranks than cores each wait can cost a trip through the scheduler, so
//! one round of `n - 1` frames beats `log2 n` rounds of one. The count of
//! frames grows with `n`, so these serve worlds of at most [`FLAT_MAX`]
//! ranks.
//!
//! Over sockets on one host it is otherwise: a loopback send runs the
//! receiver's side of the TCP stack too, on the sender's core, so a round
//! of `n - 1` frames costs each rank `n - 1` such passes, and with the
//! ranks sharing cores the trees' fewer frames per rank win from four
//! ranks on ([`world_max`]). Where sockets cross a network, the wire's
//! latency is the hop's cost, and one round stays.
//!
//! Reductions receive every peer's operand into a slot of
//! [`SCRATCH`](super::SCRATCH) and are folded afterwards ([`Fold`]) in rank
//! order, `((x0 op x1) op x2) op ...`, the same expression on every rank,
//! so every rank ends with the same bits whatever order frames arrived in.

use super::{elems, Shape, IO, OUT, SCRATCH};
use ringleader_core::reduce::reduce_bytes;
use ringleader_core::{DType, ReduceOp};
use ringleader_transport::{Plan, RecvMode, Region};

/// The largest world these schedules serve.
pub(crate) const FLAT_MAX: usize = 8;

/// The largest frame (bytes) these schedules send: a fastbox's payload
/// (see `ringleader_transport::link::FASTBOX_MAX`), rounded down to 4 KiB.
pub(crate) const FLAT_BYTES: usize = 4096;

/// The largest world these schedules serve over sockets between ranks
/// of one host (see the module docs): at 3 ranks one round held its own
/// against the trees, from 4 on it lost in every op
/// (docs/perf/tcp-small-2026-12-07.md).
pub(crate) const LOOPBACK_FLAT_MAX: usize = 3;

/// The largest world these schedules serve: [`LOOPBACK_FLAT_MAX`] when
/// every link is a socket to a rank of this host (`loopback`), else
/// [`FLAT_MAX`]. The same on every rank of a job: whether the job runs on
/// one host, and its transport setting there, are.
pub(crate) fn world_max(loopback: bool) -> usize {
    if loopback {
        LOOPBACK_FLAT_MAX
    } else {
        FLAT_MAX
    }
}

/// Whether a collective among `n` ranks whose frames would carry `bytes`
/// each runs flat, where these schedules serve worlds of at most `max`
/// ranks ([`world_max`]). Two ranks are one round either way.
pub(crate) fn fits(n: usize, bytes: usize, max: usize) -> bool {
    (3..=max).contains(&n) && bytes <= FLAT_BYTES
}

/// The local step after a flat reduction: this rank's operand (`own`)
/// and the `n` slots of `len` bytes at the start of [`SCRATCH`] (slot `j`
/// holds rank `j`'s operand; slot `rank` is filled from `own`) are reduced
/// in rank order into `out`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fold {
    /// This rank's operand.
    pub own: Region,
    /// Where the result goes.
    pub out: Region,
    /// Bytes per operand.
    pub len: usize,
    /// This rank.
    pub rank: usize,
    /// The world size.
    pub n: usize,
}

impl Fold {
    /// Bytes of [`SCRATCH`] the slots take.
    pub(crate) fn scratch_bytes(&self) -> usize {
        self.n * self.len
    }

    /// Reduces the slots (`scratch`) and `own` (this rank's operand) in
    /// rank order, leaving the result in slot 0 (`&scratch[..len]`).
    pub(crate) fn reduce(&self, own: &[u8], scratch: &mut [u8], dtype: DType, op: ReduceOp) {
        let len = self.len;
        scratch[self.rank * len..(self.rank + 1) * len].copy_from_slice(own);
        let (acc, rest) = scratch[..self.n * len].split_at_mut(len);
        // Slot by slot by offset: `chunks_exact` would divide by `len` (a
        // division on every small collective's path).
        for j in 0..self.n - 1 {
            reduce_bytes(dtype, op, acc, &rest[j * len..(j + 1) * len]);
        }
    }
}

/// All-reduce of `count` elements in [`IO`]: this rank's buffer to every
/// peer, every peer's into its slot, then the [`Fold`].
pub(crate) fn all_reduce(plan: &mut Plan, sh: Shape, count: usize) -> Fold {
    let (r, n, esz) = (sh.rank, sh.n, sh.esz);
    let mine = elems(IO, 0, count, esz);
    for k in 1..n {
        plan.send(sh.chan((r + k) % n, 0), mine, None);
    }
    // The last slot sent is the first received: frames come in as peers
    // get to them; any order is fine, the fold orders the result.
    for k in 1..n {
        let j = (r + n - k) % n;
        plan.recv(sh.chan(j, 0), elems(SCRATCH, j * count, count, esz), RecvMode::Copy, None, None);
    }
    Fold { own: mine, out: mine, len: count * esz, rank: r, n }
}

/// All-gather of `per_rank` elements per rank into [`OUT`] (this rank's
/// block is copied beside the plan).
pub(crate) fn all_gather(plan: &mut Plan, sh: Shape, per_rank: usize) {
    let (r, n, esz) = (sh.rank, sh.n, sh.esz);
    for k in 1..n {
        plan.send(sh.chan((r + k) % n, 0), elems(IO, 0, per_rank, esz), None);
    }
    for k in 1..n {
        let j = (r + n - k) % n;
        plan.recv(sh.chan(j, 0), elems(OUT, j * per_rank, per_rank, esz), RecvMode::Copy, None, None);
    }
}

/// Reduce-scatter: block `j` of [`IO`] to rank `j`, every peer's block of
/// this rank into its slot, then the [`Fold`] into [`OUT`].
pub(crate) fn reduce_scatter(plan: &mut Plan, sh: Shape, per_rank: usize) -> Fold {
    let (r, n, esz) = (sh.rank, sh.n, sh.esz);
    for k in 1..n {
        let j = (r + k) % n;
        plan.send(sh.chan(j, 0), elems(IO, j * per_rank, per_rank, esz), None);
    }
    for k in 1..n {
        let j = (r + n - k) % n;
        plan.recv(sh.chan(j, 0), elems(SCRATCH, j * per_rank, per_rank, esz), RecvMode::Copy, None, None);
    }
    let own = elems(IO, r * per_rank, per_rank, esz);
    Fold { own, out: elems(OUT, 0, per_rank, esz), len: per_rank * esz, rank: r, n }
}

/// Broadcast of [`IO`] from `root` to every other rank at once.
pub(crate) fn broadcast(plan: &mut Plan, sh: Shape, count: usize, root: usize) {
    let (r, n) = (sh.rank, sh.n);
    let all = elems(IO, 0, count, sh.esz);
    if r == root {
        for k in 1..n {
            plan.send(sh.chan((root + k) % n, 0), all, None);
        }
    } else {
        plan.recv(sh.chan(root, 0), all, RecvMode::Copy, None, None);
    }
}

/// Reduction of [`IO`] toward `root`: every other rank sends its buffer,
/// the root folds them (non-roots' buffers stay unchanged).
pub(crate) fn reduce(plan: &mut Plan, sh: Shape, count: usize, root: usize) -> Option<Fold> {
    let (r, n, esz) = (sh.rank, sh.n, sh.esz);
    let mine = elems(IO, 0, count, esz);
    if r != root {
        plan.send(sh.chan(root, 0), mine, None);
        return None;
    }
    for k in 1..n {
        let j = (r + n - k) % n;
        plan.recv(sh.chan(j, 0), elems(SCRATCH, j * count, count, esz), RecvMode::Copy, None, None);
    }
    Some(Fold { own: mine, out: mine, len: count * esz, rank: r, n })
}

/// Barrier: an empty frame to every peer and one from each.
pub(crate) fn barrier(plan: &mut Plan, sh: Shape) {
    let (r, n) = (sh.rank, sh.n);
    let empty = Region::new(IO, 0, 0);
    for k in 1..n {
        plan.send(sh.chan((r + k) % n, 0), empty, None);
    }
    for k in 1..n {
        plan.recv(sh.chan((r + n - k) % n, 0), empty, RecvMode::Copy, None, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fold_is_the_same_expression_on_every_rank() {
        // Floats whose sum depends on the order: every rank must still get
        // the bits of ((x0 + x1) + x2) + x3.
        let xs = [1e20f32, 1.0, -1e20, 3.0];
        let want = ((xs[0] + xs[1]) + xs[2]) + xs[3];
        for rank in 0..4 {
            let fold = Fold { own: Region::new(IO, 0, 4), out: Region::new(IO, 0, 4), len: 4, rank, n: 4 };
            let mut scratch = vec![0u8; fold.scratch_bytes()];
            for (j, x) in xs.iter().enumerate() {
                if j != rank {
                    scratch[j * 4..j * 4 + 4].copy_from_slice(&x.to_ne_bytes());
                }
            }
            fold.reduce(&xs[rank].to_ne_bytes(), &mut scratch, DType::F32, ReduceOp::Sum);
            let got = f32::from_ne_bytes(scratch[..4].try_into().unwrap());
            assert_eq!(got.to_bits(), want.to_bits(), "rank {rank}");
        }
    }

    #[test]
    fn flat_serves_a_few_ranks_and_small_frames() {
        assert!(!fits(2, 8, FLAT_MAX) && fits(3, 8, FLAT_MAX) && fits(8, FLAT_BYTES, FLAT_MAX));
        assert!(!fits(9, 8, FLAT_MAX) && !fits(4, FLAT_BYTES + 1, FLAT_MAX));
        // Sockets on one host: three ranks only.
        let max = world_max(true);
        assert!(fits(3, 8, max) && !fits(4, 8, max) && !fits(8, 8, max));
        assert_eq!(world_max(false), FLAT_MAX);
    }
}
