//! Latency-optimal schedules for small messages: recursive doubling,
//! binomial trees and the dissemination barrier, each `ceil(log2 n)` rounds.

use super::{elems, Shape, IO, OUT, SCRATCH};

/// Largest frame of the recursive-doubling all-reduce (see [`all_reduce`]):
/// what the automatic choice ever sends that way, and well below what a
/// shared-memory ring or a pair of socket buffers holds.
pub(crate) const RD_PIECE: usize = super::SMALL_BYTES;
use ringleader_transport::{Plan, RecvMode, Region};

/// Largest power of two not above `x` (x >= 1).
fn pow2_floor(x: usize) -> usize {
    1 << (usize::BITS - 1 - x.leading_zeros())
}

/// In-place recursive-doubling all-reduce of `count` elements in [`IO`].
///
/// With `p` the largest power of two not above `n`, ranks `p..n` first fold
/// their buffer into rank `r - p` and wait for the result; ranks `0..p`
/// exchange whole buffers with `r ^ d` for `d = 1, 2, 4, ...` and reduce.
/// Partners compute `a op b` and `b op a`, which IEEE arithmetic makes equal,
/// so every rank ends with the same bits.
///
/// Buffers go in pieces of at most [`RD_PIECE`] bytes. A rank reduces into
/// the bytes it is sending, so each piece's receive waits for that piece's
/// send to be written out; with the whole buffer as one frame, two partners
/// with more to send than the transport buffers would wait for each other
/// forever (`RINGLEADER_ALGO=rd` on large messages). Messages the automatic
/// choice sends this way fit in one piece.
pub(crate) fn all_reduce(plan: &mut Plan, sh: Shape, count: usize) {
    let (r, n) = (sh.rank, sh.n);
    let p = pow2_floor(n);
    let per = (RD_PIECE / sh.esz).max(1);
    // Zero elements still make one (empty) frame, so fingerprints meet.
    let pieces = count.div_ceil(per).max(1);
    let piece = |j: usize| elems(IO, j * per, per.min(count - (j * per).min(count)), sh.esz);
    // The receives of one stage are consecutive: piece j's is at `base + j`.
    let after = |base: Option<u32>, j: usize| base.map(|b| b + j as u32);
    if r >= p {
        for j in 0..pieces {
            let folded = plan.send(sh.chan(r - p, 0), piece(j), None);
            plan.recv(sh.chan(r - p, 0), piece(j), RecvMode::Copy, None, Some(folded));
        }
        return;
    }
    let reduce = RecvMode::Reduce { with: None };
    let mut prev = None;
    if r + p < n {
        prev = Some(plan.recvs.len() as u32);
        for j in 0..pieces {
            plan.recv(sh.chan(r + p, 0), piece(j), reduce, None, None);
        }
    }
    let mut d = 1;
    while d < p {
        let partner = r ^ d;
        let sent = plan.sends.len() as u32;
        for j in 0..pieces {
            plan.send(sh.chan(partner, 0), piece(j), after(prev, j));
        }
        let got = plan.recvs.len() as u32;
        for j in 0..pieces {
            // Reduce a piece only once it has left: the send reads it.
            plan.recv(sh.chan(partner, 0), piece(j), reduce, after(prev, j), Some(sent + j as u32));
        }
        prev = Some(got);
        d <<= 1;
    }
    if r + p < n {
        for j in 0..pieces {
            plan.send(sh.chan(r + p, 0), piece(j), after(prev, j));
        }
    }
}

/// Recursive-doubling all-gather of `per_rank` elements per rank into
/// [`OUT`], for a power-of-two world: `log2 n` rounds where the ring needs
/// `n - 1` hops. In round `d = 1, 2, 4, ...` rank `r` swaps the `d` blocks
/// it holds with rank `r ^ d`; they are the blocks of ranks
/// `r & !(d - 1) ..`, contiguous in the output, so no block moves twice.
///
/// Each round's receive starts after the previous round's, so "the last
/// receive is done" means every block a round sends has arrived. The first
/// round sends this rank's block from [`IO`] (the output's copy is made
/// beside the plan).
pub(crate) fn all_gather(plan: &mut Plan, sh: Shape, per_rank: usize) {
    let (r, n, esz) = (sh.rank, sh.n, sh.esz);
    debug_assert!(n.is_power_of_two());
    let mut prev = None;
    let mut d = 1;
    while d < n {
        let partner = r ^ d;
        let (mine, theirs) = (r & !(d - 1), partner & !(d - 1));
        let held = match d {
            1 => elems(IO, 0, per_rank, esz),
            _ => elems(OUT, mine * per_rank, d * per_rank, esz),
        };
        plan.send(sh.chan(partner, 0), held, prev);
        let region = elems(OUT, theirs * per_rank, d * per_rank, esz);
        prev = Some(plan.recv(sh.chan(partner, 0), region, RecvMode::Copy, prev, None));
        d <<= 1;
    }
}

/// Recursive-halving reduce-scatter for a power-of-two world: [`IO`] holds
/// `n * per_rank` elements (read only), [`OUT`] receives this rank's
/// `per_rank`, [`SCRATCH`] needs `n / 2 * per_rank` elements. `log2 n`
/// rounds where the ring needs `n - 1` hops.
///
/// In round `d = n/2, n/4, ..., 1` rank `r` holds partial sums of `2d`
/// blocks (all `n` at first): it sends the `d` blocks on its partner's side
/// (`r ^ d`) and reduces the partner's partial sums of its own `d` blocks
/// into its copy. The first round reads [`IO`] and reduces into
/// [`SCRATCH`], the last reduces into [`OUT`]; each round's receive starts
/// after the previous one, and each send after the receive that finished
/// the blocks it carries.
pub(crate) fn reduce_scatter(plan: &mut Plan, sh: Shape, per_rank: usize) {
    let (r, n, esz) = (sh.rank, sh.n, sh.esz);
    debug_assert!(n.is_power_of_two() && n > 1);
    let block = |buf: u8, first: usize, blocks: usize| elems(buf, first * per_rank, blocks * per_rank, esz);
    // SCRATCH holds the first round's kept half, blocks `base..base + n/2`.
    let base = r & !(n / 2 - 1);
    let in_scratch = |first: usize, blocks: usize| elems(SCRATCH, (first - base) * per_rank, blocks * per_rank, esz);
    let mut prev = None;
    let mut d = n / 2;
    while d >= 1 {
        let partner = r ^ d;
        let (keep, give) = (r & !(d - 1), partner & !(d - 1));
        let first_round = d == n / 2;
        let sent = if first_round { block(IO, give, d) } else { in_scratch(give, d) };
        plan.send(sh.chan(partner, 0), sent, prev);
        let (region, with) = match (first_round, d == 1) {
            (true, true) => (block(OUT, 0, 1), Some(block(IO, keep, 1))),
            (true, false) => (in_scratch(keep, d), Some(block(IO, keep, d))),
            (false, true) => (block(OUT, 0, 1), Some(in_scratch(keep, 1))),
            (false, false) => (in_scratch(keep, d), None),
        };
        prev = Some(plan.recv(sh.chan(partner, 0), region, RecvMode::Reduce { with }, prev, None));
        d /= 2;
    }
}

/// Children of virtual rank `v` in a binomial tree over `n` (largest
/// subtree first): `v + d` for powers of two `d > v`.
fn children(v: usize, n: usize) -> impl DoubleEndedIterator<Item = usize> {
    let first = if v == 0 { 1 } else { pow2_floor(v) << 1 };
    let count = (0..usize::BITS).take_while(|&i| first.checked_shl(i).is_some_and(|d| v + d < n)).count();
    (0..count).rev().map(move |i| v + (first << i))
}

/// Binomial-tree broadcast of [`IO`] from `root`.
pub(crate) fn broadcast(plan: &mut Plan, sh: Shape, count: usize, root: usize) {
    let n = sh.n;
    let v = (sh.rank + n - root) % n;
    let real = |u: usize| (u + root) % n;
    let all = elems(IO, 0, count, sh.esz);
    let got = (v > 0).then(|| plan.recv(sh.chan(real(v - pow2_floor(v)), 0), all, RecvMode::Copy, None, None));
    for c in children(v, n) {
        plan.send(sh.chan(real(c), 0), all, got);
    }
}

/// Binomial-tree reduction of [`IO`] toward `root`. Non-roots accumulate in
/// [`SCRATCH`] (which must already hold a copy of their buffer) so their own
/// buffer stays unchanged. Children are reduced in a fixed order (smallest
/// subtree first), so the result does not depend on arrival order.
pub(crate) fn reduce(plan: &mut Plan, sh: Shape, count: usize, root: usize) {
    let n = sh.n;
    let v = (sh.rank + n - root) % n;
    let real = |u: usize| (u + root) % n;
    let acc = elems(if v == 0 { IO } else { SCRATCH }, 0, count, sh.esz);
    let mut prev = None;
    for c in children(v, n).rev() {
        prev = Some(plan.recv(sh.chan(real(c), 0), acc, RecvMode::Reduce { with: None }, prev, None));
    }
    if v > 0 {
        plan.send(sh.chan(real(v - pow2_floor(v)), 0), acc, prev);
    }
}

/// Barrier in `ceil(log2 n)` rounds: in round `d = 1, 2, 4, ...` send an
/// empty frame and receive one; after the last round every rank has heard,
/// directly or not, from every other. On a world that is a power of two the
/// ranks pair up (`r` and `r ^ d` exchange, recursive doubling), so each
/// round waits for one partner only; otherwise dissemination (send to
/// `r + d`, receive from `r - d`). Also used for collectives of zero
/// elements, so their fingerprints are still compared.
pub(crate) fn barrier(plan: &mut Plan, sh: Shape) {
    let empty = Region::new(IO, 0, 0);
    let mut prev = None;
    let mut d = 1;
    while d < sh.n {
        let (to, from) = match sh.n.is_power_of_two() {
            true => (sh.rank ^ d, sh.rank ^ d),
            false => (sh.rel(d as isize), sh.rel(-(d as isize))),
        };
        plan.send(sh.chan(to, 0), empty, prev);
        prev = Some(plan.recv(sh.chan(from, 0), empty, RecvMode::Copy, prev, None));
        d <<= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_a_barrier_every_rank_has_heard_from_every_other() {
        use ringleader_transport::Plan;
        for n in 1..=17 {
            let plans: Vec<Plan> = (0..n)
                .map(|rank| {
                    let mut plan = Plan::default();
                    barrier(&mut plan, Shape { rank, n, streams: 1, esz: 1, flat_max: 0 });
                    plan
                })
                .collect();
            // Round k: each rank sends what it knows, then takes in what
            // its k-th frame's sender knew when it sent.
            let mut knows: Vec<Vec<bool>> = (0..n).map(|r| (0..n).map(|j| j == r).collect()).collect();
            for k in 0..plans[0].sends.len() {
                let before = knows.clone();
                for (r, plan) in plans.iter().enumerate() {
                    let from = plan.recvs[k].chan.peer;
                    assert_eq!(plans[from].sends[k].chan.peer, r, "n={n}: round {k}: rank {from} sends elsewhere");
                    for j in 0..n {
                        knows[r][j] |= before[from][j];
                    }
                }
            }
            assert!(knows.iter().all(|k| k.iter().all(|&b| b)), "n={n}: {knows:?}");
            let rounds = if n > 1 { (n - 1).ilog2() as usize + 1 } else { 0 };
            assert!(plans.iter().all(|p| p.sends.len() == rounds && p.recvs.len() == rounds), "n={n}");
        }
    }

    #[test]
    fn binomial_tree_is_a_tree() {
        for n in 1..=17 {
            let mut parent = vec![None; n];
            for v in 0..n {
                for c in children(v, n) {
                    assert!(parent[c].is_none(), "n={n}: {c} has two parents");
                    parent[c] = Some(v);
                    assert_eq!(c - pow2_floor(c), v);
                }
            }
            assert!((1..n).all(|v| parent[v].is_some()), "n={n}");
        }
    }
}
