//! Collective algorithms as schedules.
//!
//! Each function here fills a [`Plan`]: which byte ranges this rank sends to
//! which peer, where each incoming frame goes (copied or reduced), and what
//! must happen before what. The plans are pure functions of
//! `(rank, world size, element count, element size)`, so every rank derives
//! its peers' plans too, which is what makes frame `n` on a link mean the same
//! thing on both ends. They are checked against a naive reduction by an
//! in-memory simulator in [`sim`] (tests only), over every world size and
//! uneven counts, before any socket is involved.
//!
//! Buffer indices used by the plans: [`IO`] is the caller's in-place buffer
//! or input, [`OUT`] the output of out-of-place collectives, [`SCRATCH`]
//! the communicator's scratch space.

pub(crate) mod flat;
pub(crate) mod pairwise;
pub(crate) mod ring;
pub(crate) mod tree;

#[cfg(test)]
pub(crate) mod sim;

use ringleader_core::config::AlgoChoice;
use ringleader_core::{Rank, ReduceOp};
use ringleader_transport::{Chan, Plan, Region};

/// The caller's buffer (in place) or input (out of place).
pub(crate) const IO: u8 = 0;
/// The output of an out-of-place collective.
pub(crate) const OUT: u8 = 1;
/// Scratch space owned by the communicator.
pub(crate) const SCRATCH: u8 = 2;

/// Messages up to this size use the latency-optimal algorithms
/// (recursive doubling, binomial trees); larger ones the pipelined ring and
/// chains. Override with `RINGLEADER_ALGO`.
pub(crate) const SMALL_BYTES: usize = 64 << 10;

/// A broadcast between two ranks is one transfer with no hop to pipeline:
/// one frame beats the chain's chunks up to here (measured crossover between
/// 1 and 2 MiB, over TCP and shared memory alike).
pub(crate) const PAIR_BROADCAST_BYTES: usize = 1 << 20;

/// Which algorithm a collective runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algo {
    /// Latency-optimal: recursive doubling / binomial tree.
    Small,
    /// Bandwidth-optimal: pipelined ring / chain.
    Large,
}

impl Algo {
    /// The schedule a job's forced choice (`RINGLEADER_ALGO`) stands for;
    /// `None` for automatic.
    pub(crate) fn forced(forced: Option<AlgoChoice>) -> Option<Algo> {
        forced.map(|a| match a {
            AlgoChoice::Ring => Algo::Large,
            AlgoChoice::RecursiveDoubling => Algo::Small,
        })
    }

    /// The algorithm for a message of `bytes`, unless `forced` names one.
    pub(crate) fn pick(bytes: usize, forced: Option<Algo>) -> Algo {
        match forced {
            Some(a) => a,
            None if bytes <= SMALL_BYTES => Algo::Small,
            None => Algo::Large,
        }
    }

    /// [`Algo::pick`] for a broadcast among `n` ranks.
    pub(crate) fn pick_broadcast(bytes: usize, n: usize, forced: Option<Algo>) -> Algo {
        if forced.is_none() && n == 2 && bytes <= PAIR_BROADCAST_BYTES {
            return Algo::Small;
        }
        Algo::pick(bytes, forced)
    }
}

/// Static facts a plan builder needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// This rank.
    pub rank: Rank,
    /// The world size.
    pub n: usize,
    /// Streams per peer.
    pub streams: usize,
    /// Element size in bytes.
    pub esz: usize,
    /// The largest world one-round schedules serve here
    /// ([`flat::world_max`]).
    pub flat_max: usize,
}

impl Shape {
    pub(crate) fn chan(&self, peer: Rank, k: usize) -> Chan {
        Chan { peer, stream: (k % self.streams) as u16 }
    }

    pub(crate) fn right(&self) -> Rank {
        (self.rank + 1) % self.n
    }

    pub(crate) fn left(&self) -> Rank {
        (self.rank + self.n - 1) % self.n
    }

    /// `(rank + delta) mod n` for a possibly negative delta.
    pub(crate) fn rel(&self, delta: isize) -> Rank {
        (self.rank as isize + delta).rem_euclid(self.n as isize) as Rank
    }
}

/// Element range `(start, len)` of segment `i` when `count` elements are
/// split into `n` segments as evenly as possible (the first `count % n`
/// segments hold one more).
pub(crate) fn segment(count: usize, n: usize, i: usize) -> (usize, usize) {
    let (base, extra) = (count / n, count % n);
    let start = i * base + i.min(extra);
    (start, base + usize::from(i < extra))
}

/// Pipeline chunk size in elements for a stream of `seg_elems` elements:
/// about a quarter of the segment, so reduction and transfer overlap, within
/// 64 KiB .. 1 MiB. A pure function of its arguments: both ends of a link
/// must agree on it.
pub(crate) fn chunk_elems(seg_elems: usize, esz: usize) -> usize {
    let bytes = (seg_elems * esz / 4).clamp(64 << 10, 1 << 20);
    (bytes / esz).max(1)
}

/// The chunks `(start, len)` (elements, relative) of a run of `len` elements.
pub(crate) fn chunks(len: usize, per: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len.div_ceil(per)).map(move |k| (k * per, per.min(len - k * per)))
}

/// A byte region of elements `[start, start + len)` in buffer `buf`.
pub(crate) fn elems(buf: u8, start: usize, len: usize, esz: usize) -> Region {
    Region::new(buf, start * esz, len * esz)
}

/// A collective, as the schedules see it: counts in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coll {
    /// In place on `count` elements.
    AllReduce { count: usize, op: ReduceOp },
    /// `per_rank` in, `n * per_rank` out.
    AllGather { per_rank: usize },
    /// `n * per_rank` in, `per_rank` out.
    ReduceScatter { per_rank: usize, op: ReduceOp },
    /// In place on `count` elements.
    Broadcast { count: usize, root: Rank },
    /// In place on `count` elements; only the root's changes.
    Reduce { count: usize, root: Rank, op: ReduceOp },
    /// `n * per_rank` in and out.
    AllToAll { per_rank: usize },
    /// Nothing moves but empty frames.
    Barrier,
}

/// Reusable memory for building plans, so that building one allocates
/// nothing once warmed up.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// Receives of the previous ring step, by segment and chunk.
    last: Vec<Vec<Option<u32>>>,
    /// Sends reading each reduce-scatter scratch slot, by chunk.
    slot_readers: [Vec<u32>; 2],
}

/// Local work around a plan: what to copy before it runs, how much scratch
/// it needs, and where an `Avg` reduction is divided afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Prep {
    /// Copy `.0` to `.1` before the plan runs.
    pub copy: Option<(Region, Region)>,
    /// Bytes of [`SCRATCH`] the plan uses.
    pub scratch_bytes: usize,
    /// Reduce the received operands in rank order afterwards (a flat
    /// reduction: [`flat::Fold`]), before any `avg`.
    pub fold: Option<flat::Fold>,
    /// Divide this region by the world size afterwards (for `Avg`).
    pub avg: Option<Region>,
}

/// Fills `plan` for `coll` on this rank and says what to do around it.
pub(crate) fn schedule(coll: Coll, sh: Shape, forced: Option<Algo>, plan: &mut Plan, scratch: &mut Scratch) -> Prep {
    plan.clear();
    let (r, n, esz) = (sh.rank, sh.n, sh.esz);
    let mut prep = Prep::default();
    let avg = |op: ReduceOp, region: Region| (op == ReduceOp::Avg && n > 1).then_some(region);
    // A few ranks and small frames: one round ([`flat`]), unless an
    // algorithm is forced.
    let flat = |frame_bytes: usize| forced.is_none() && flat::fits(n, frame_bytes, sh.flat_max);
    let folded = |prep: &mut Prep, fold: flat::Fold| {
        prep.scratch_bytes = fold.scratch_bytes();
        prep.fold = Some(fold);
    };
    match coll {
        Coll::AllReduce { count, .. } | Coll::Broadcast { count, .. } | Coll::Reduce { count, .. }
            if count == 0 && n > 1 =>
        {
            tree::barrier(plan, sh)
        }
        Coll::AllGather { per_rank: 0 } | Coll::ReduceScatter { per_rank: 0, .. } if n > 1 => tree::barrier(plan, sh),
        Coll::AllReduce { count, op } => {
            if flat(count * esz) {
                folded(&mut prep, flat::all_reduce(plan, sh, count));
            } else if n > 1 {
                match Algo::pick(count * esz, forced) {
                    Algo::Small => tree::all_reduce(plan, sh, count),
                    Algo::Large => ring::all_reduce(plan, sh, count, scratch),
                }
            }
            prep.avg = avg(op, elems(IO, 0, count, esz));
        }
        Coll::AllGather { per_rank } => {
            prep.copy = Some((elems(IO, 0, per_rank, esz), elems(OUT, r * per_rank, per_rank, esz)));
            if flat(per_rank * esz) {
                flat::all_gather(plan, sh, per_rank);
            } else if n > 1 {
                match Algo::pick(n * per_rank * esz, forced) {
                    Algo::Small if n.is_power_of_two() => tree::all_gather(plan, sh, per_rank),
                    _ => ring::all_gather(plan, sh, per_rank, scratch),
                }
            }
        }
        Coll::ReduceScatter { per_rank, op } => {
            if n == 1 {
                prep.copy = Some((elems(IO, 0, per_rank, esz), elems(OUT, 0, per_rank, esz)));
            } else if flat(per_rank * esz) {
                folded(&mut prep, flat::reduce_scatter(plan, sh, per_rank));
            } else {
                match Algo::pick(n * per_rank * esz, forced) {
                    Algo::Small if n.is_power_of_two() => {
                        // Two ranks finish in the first round, straight into OUT.
                        prep.scratch_bytes = if n > 2 { n / 2 * per_rank * esz } else { 0 };
                        tree::reduce_scatter(plan, sh, per_rank);
                    }
                    _ => {
                        prep.scratch_bytes = 2 * per_rank * esz;
                        ring::reduce_scatter(plan, sh, per_rank, scratch);
                    }
                }
            }
            prep.avg = avg(op, elems(OUT, 0, per_rank, esz));
        }
        Coll::Broadcast { count, root } if flat(count * esz) => flat::broadcast(plan, sh, count, root),
        Coll::Broadcast { count, root } if n > 1 => match Algo::pick_broadcast(count * esz, n, forced) {
            Algo::Small => tree::broadcast(plan, sh, count, root),
            Algo::Large => ring::broadcast(plan, sh, count, root),
        },
        Coll::Broadcast { .. } => {}
        Coll::Reduce { count, root, op } => {
            if flat(count * esz) {
                if let Some(fold) = flat::reduce(plan, sh, count, root) {
                    folded(&mut prep, fold);
                }
            } else if n > 1 {
                match Algo::pick(count * esz, forced) {
                    Algo::Small => {
                        if r != root {
                            prep.copy = Some((elems(IO, 0, count, esz), elems(SCRATCH, 0, count, esz)));
                        }
                        tree::reduce(plan, sh, count, root);
                    }
                    Algo::Large => ring::reduce(plan, sh, count, root),
                }
                prep.scratch_bytes = if r == root { 0 } else { count * esz };
            }
            if r == root {
                prep.avg = avg(op, elems(IO, 0, count, esz));
            }
        }
        Coll::AllToAll { per_rank } => {
            prep.copy = Some((elems(IO, r * per_rank, per_rank, esz), elems(OUT, r * per_rank, per_rank, esz)));
            pairwise::all_to_all(plan, sh, per_rank);
        }
        Coll::Barrier if flat(0) => flat::barrier(plan, sh),
        Coll::Barrier => tree::barrier(plan, sh),
    }
    prep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_exactly() {
        for count in [0, 1, 7, 8, 1000, 1003] {
            for n in 1..=9 {
                let mut next = 0;
                for i in 0..n {
                    let (s, l) = segment(count, n, i);
                    assert_eq!(s, next);
                    next += l;
                }
                assert_eq!(next, count);
            }
        }
    }

    #[test]
    fn chunks_cover_exactly() {
        for len in [0, 1, 5, 100] {
            for per in [1, 3, 100, 1000] {
                let total: usize = chunks(len, per).map(|(_, l)| l).sum();
                assert_eq!(total, len);
            }
        }
    }
}

#[cfg(test)]
mod schedule_tests;
