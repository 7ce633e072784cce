//! Every schedule against a naive reduction, in the simulator: world sizes
//! 1 to 9, counts that do not divide evenly, both algorithm families, one
//! and several streams, several random interleavings.

use super::sim::{run, SimRank};
use super::*;
use ringleader_core::reduce::finish_avg;
use ringleader_core::DType;
use ringleader_transport::Plan;

const COUNTS: [usize; 5] = [1, 3, 7, 1000, 40_003];

fn input(rank: usize, len: usize) -> Vec<i64> {
    (0..len).map(|i| (rank as i64 + 1) * 1_000_003 + i as i64 * 7 - 50).collect()
}

fn bytes(v: &[i64]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

fn ints(b: &[u8]) -> Vec<i64> {
    b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
}

/// Runs `coll(rank)` on every rank; returns each rank's (IO, OUT).
#[allow(clippy::too_many_arguments)] // a test helper; the arguments are the test's axes
fn simulate(
    n: usize,
    streams: usize,
    forced: Option<&str>,
    seed: u64,
    io_len: usize,
    out_len: usize,
    op: ReduceOp,
    coll: impl Fn(usize) -> Coll,
) -> Vec<(Vec<i64>, Vec<i64>)> {
    let mut ranks = Vec::new();
    let mut preps = Vec::new();
    for r in 0..n {
        let sh = Shape { rank: r, n, streams, esz: 8, flat_max: flat::FLAT_MAX };
        let mut plan = Plan::default();
        let prep = schedule(coll(r), sh, forced_by_name(forced), &mut plan, &mut Scratch::default());
        let mut bufs = vec![bytes(&input(r, io_len)), vec![0u8; out_len * 8], vec![0u8; prep.scratch_bytes]];
        if let Some((from, to)) = prep.copy {
            let src = bufs[from.buf as usize][from.off..from.off + from.len].to_vec();
            bufs[to.buf as usize][to.off..to.off + to.len].copy_from_slice(&src);
        }
        ranks.push(SimRank { plan, bufs });
        preps.push(prep);
    }
    run(&mut ranks, DType::I64, op, seed);
    ranks
        .into_iter()
        .zip(preps)
        .map(|(mut r, prep)| {
            if let Some(f) = prep.fold {
                let own = r.bufs[f.own.buf as usize][f.own.off..f.own.off + f.own.len].to_vec();
                f.reduce(&own, &mut r.bufs[SCRATCH as usize], DType::I64, op);
                let result = r.bufs[SCRATCH as usize][..f.len].to_vec();
                r.bufs[f.out.buf as usize][f.out.off..f.out.off + f.out.len].copy_from_slice(&result);
            }
            if let Some(a) = prep.avg {
                finish_avg(DType::I64, &mut r.bufs[a.buf as usize][a.off..a.off + a.len], n);
            }
            (ints(&r.bufs[0]), ints(&r.bufs[1]))
        })
        .collect()
}

fn naive(n: usize, len: usize, op: ReduceOp) -> Vec<i64> {
    let inputs: Vec<Vec<i64>> = (0..n).map(|r| input(r, len)).collect();
    (0..len)
        .map(|i| {
            let vals = inputs.iter().map(|v| v[i]);
            match op {
                ReduceOp::Sum => vals.fold(0i64, |a, b| a.wrapping_add(b)),
                ReduceOp::Avg => vals.fold(0i64, |a, b| a.wrapping_add(b)) / n as i64,
                ReduceOp::Prod => vals.fold(1i64, |a, b| a.wrapping_mul(b)),
                ReduceOp::Min => vals.min().unwrap(),
                ReduceOp::Max => vals.max().unwrap(),
            }
        })
        .collect()
}

fn variants() -> Vec<(usize, Option<&'static str>, u64)> {
    vec![(1, Some("small"), 1), (1, Some("large"), 2), (3, Some("large"), 3), (2, None, 4)]
}

#[test]
fn all_reduce_matches_naive() {
    for n in 1..=9 {
        for count in COUNTS {
            for (streams, forced, seed) in variants() {
                for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                    let got = simulate(n, streams, forced, seed, count, 0, op, |_| Coll::AllReduce { count, op });
                    let want = naive(n, count, op);
                    for (r, (io, _)) in got.iter().enumerate() {
                        assert_eq!(io, &want, "n={n} count={count} {forced:?} streams={streams} {op:?} rank {r}");
                    }
                }
            }
        }
    }
}

#[test]
fn reduce_scatter_matches_naive() {
    for n in 1..=9 {
        for per in COUNTS {
            for (streams, forced, seed) in variants() {
                let got = simulate(n, streams, forced, seed, per * n, per, ReduceOp::Sum, |_| Coll::ReduceScatter {
                    per_rank: per,
                    op: ReduceOp::Sum,
                });
                let want = naive(n, per * n, ReduceOp::Sum);
                for (r, (io, out)) in got.iter().enumerate() {
                    assert_eq!(out[..], want[r * per..(r + 1) * per], "n={n} per={per} rank {r}");
                    assert_eq!(io, &input(r, per * n), "input changed");
                }
            }
        }
    }
}

#[test]
fn all_gather_matches_naive() {
    for n in 1..=9 {
        for per in COUNTS {
            for (streams, forced, seed) in variants() {
                let got = simulate(n, streams, forced, seed, per, per * n, ReduceOp::Sum, |_| Coll::AllGather {
                    per_rank: per,
                });
                let want: Vec<i64> = (0..n).flat_map(|r| input(r, per)).collect();
                for (r, (_, out)) in got.iter().enumerate() {
                    assert_eq!(out, &want, "n={n} per={per} rank {r}");
                }
            }
        }
    }
}

#[test]
fn broadcast_and_reduce_match_naive() {
    for n in 1..=9 {
        for count in COUNTS {
            for (streams, forced, seed) in variants() {
                for root in [0, n / 2, n - 1] {
                    let got = simulate(n, streams, forced, seed, count, 0, ReduceOp::Sum, |_| Coll::Broadcast {
                        count,
                        root,
                    });
                    for (r, (io, _)) in got.iter().enumerate() {
                        assert_eq!(
                            io,
                            &input(root, count),
                            "bcast n={n} count={count} root={root} {forced:?} rank {r}"
                        );
                    }
                    let got = simulate(n, streams, forced, seed, count, 0, ReduceOp::Sum, |_| Coll::Reduce {
                        count,
                        root,
                        op: ReduceOp::Sum,
                    });
                    for (r, (io, _)) in got.iter().enumerate() {
                        let want = if r == root { naive(n, count, ReduceOp::Sum) } else { input(r, count) };
                        assert_eq!(io, &want, "reduce n={n} count={count} root={root} {forced:?} rank {r}");
                    }
                }
            }
        }
    }
}

#[test]
fn all_to_all_matches_naive() {
    for n in 1..=9 {
        for per in [1, 7, 1000] {
            let got = simulate(n, 1, None, 9, per * n, per * n, ReduceOp::Sum, |_| Coll::AllToAll { per_rank: per });
            for (r, (_, out)) in got.iter().enumerate() {
                for j in 0..n {
                    assert_eq!(
                        out[j * per..(j + 1) * per],
                        input(j, per * n)[r * per..(r + 1) * per],
                        "n={n} per={per} rank {r} from {j}"
                    );
                }
            }
        }
    }
}

#[test]
fn barrier_and_empty_collectives_complete() {
    for n in 1..=9 {
        simulate(n, 1, None, 5, 0, 0, ReduceOp::Sum, |_| Coll::Barrier);
        simulate(n, 1, None, 6, 0, 0, ReduceOp::Sum, |_| Coll::AllReduce { count: 0, op: ReduceOp::Sum });
        simulate(n, 1, None, 7, 0, 0, ReduceOp::Sum, |_| Coll::AllGather { per_rank: 0 });
    }
}

#[test]
fn algorithm_choice_follows_size_world_and_override() {
    use super::{Algo, PAIR_BROADCAST_BYTES, SMALL_BYTES};
    assert_eq!(Algo::pick(SMALL_BYTES, None), Algo::Small);
    assert_eq!(Algo::pick(SMALL_BYTES + 1, None), Algo::Large);
    // Two ranks broadcast in one frame up to 1 MiB; more ranks pipeline a chain.
    assert_eq!(Algo::pick_broadcast(PAIR_BROADCAST_BYTES, 2, None), Algo::Small);
    assert_eq!(Algo::pick_broadcast(PAIR_BROADCAST_BYTES, 2, forced_by_name(Some("auto"))), Algo::Small);
    assert_eq!(Algo::pick_broadcast(PAIR_BROADCAST_BYTES + 1, 2, None), Algo::Large);
    assert_eq!(Algo::pick_broadcast(PAIR_BROADCAST_BYTES, 3, None), Algo::Large);
    assert_eq!(Algo::pick_broadcast(SMALL_BYTES, 3, None), Algo::Small);
    // An explicit choice wins.
    assert_eq!(Algo::pick_broadcast(1024, 2, forced_by_name(Some("ring"))), Algo::Large);
    assert_eq!(Algo::pick_broadcast(64 << 20, 2, forced_by_name(Some("tree"))), Algo::Small);
}

/// Sends rank 0 makes in an all-gather of `per` 8-byte elements per rank.
fn all_gather_sends(n: usize, per: usize, forced: Option<&str>) -> usize {
    let sh = Shape { rank: 0, n, streams: 1, esz: 8, flat_max: flat::FLAT_MAX };
    let mut plan = Plan::default();
    schedule(Coll::AllGather { per_rank: per }, sh, forced_by_name(forced), &mut plan, &mut Scratch::default());
    plan.sends.len()
}

#[test]
fn small_all_gathers_on_power_of_two_worlds_take_log2_n_rounds() {
    // 8 KiB blocks (past the flat schedules' frames), 8 ranks: 3
    // recursive-doubling rounds instead of 7 ring hops.
    let per = 1024;
    assert_eq!(all_gather_sends(8, per, None), 3);
    assert_eq!(all_gather_sends(4, per, None), 2);
    // Other world sizes, large messages, or a forced ring keep the ring.
    assert_eq!(all_gather_sends(6, per, None), 5);
    assert_eq!(all_gather_sends(8, SMALL_BYTES, None), 7 * chunks(SMALL_BYTES, chunk_elems(SMALL_BYTES, 8)).count());
    assert_eq!(all_gather_sends(8, per, Some("ring")), 7);
    assert_eq!(all_gather_sends(8, SMALL_BYTES, Some("rd")), 3);
}

#[test]
fn small_reduce_scatters_on_power_of_two_worlds_take_log2_n_rounds() {
    let sends = |n: usize, per: usize, forced: Option<&str>| {
        let sh = Shape { rank: n - 1, n, streams: 1, esz: 8, flat_max: flat::FLAT_MAX };
        let mut plan = Plan::default();
        let coll = Coll::ReduceScatter { per_rank: per, op: ReduceOp::Sum };
        let prep = schedule(coll, sh, forced_by_name(forced), &mut plan, &mut Scratch::default());
        (plan.sends.len(), prep.scratch_bytes)
    };
    // 8 KiB blocks, 8 ranks: 3 recursive-halving rounds (scratch: half
    // the input) instead of 7 ring hops.
    let per = 1024;
    assert_eq!(sends(8, per, None), (3, 4 * per * 8));
    assert_eq!(sends(2, per, None), (1, 0));
    assert_eq!(sends(6, per, None), (5, 2 * per * 8));
    assert_eq!(sends(8, per, Some("ring")), (7, 2 * per * 8));
}

#[test]
fn a_few_ranks_with_small_frames_take_one_round() {
    // Up to 8 ranks and 4 KiB frames: every peer directly (one round),
    // the reductions folded from n slots of scratch.
    for n in 3..=flat::FLAT_MAX {
        let sh = Shape { rank: 1, n, streams: 1, esz: 8, flat_max: flat::FLAT_MAX };
        for (coll, folded) in [
            (Coll::AllReduce { count: 512, op: ReduceOp::Sum }, true),
            (Coll::AllGather { per_rank: 512 }, false),
            (Coll::ReduceScatter { per_rank: 512, op: ReduceOp::Sum }, true),
            (Coll::Barrier, false),
        ] {
            let mut plan = Plan::default();
            let prep = schedule(coll, sh, None, &mut plan, &mut Scratch::default());
            assert_eq!((plan.sends.len(), plan.recvs.len()), (n - 1, n - 1), "{coll:?} n={n}");
            assert!(plan.sends.iter().all(|s| s.after.is_none()), "{coll:?}: a send waits");
            assert!(
                plan.recvs.iter().all(|r| r.after.is_none() && r.after_send.is_none()),
                "{coll:?}: a receive waits"
            );
            assert_eq!(prep.fold.is_some(), folded, "{coll:?}");
            if folded {
                assert_eq!(prep.scratch_bytes, n * 512 * 8);
            }
        }
        // A forced algorithm, 9 ranks or larger frames are not flat.
        let mut plan = Plan::default();
        schedule(Coll::Barrier, sh, forced_by_name(Some("rd")), &mut plan, &mut Scratch::default());
        assert!(plan.sends.len() < n - 1 || n <= 3);
        let prep =
            schedule(Coll::AllReduce { count: 513, op: ReduceOp::Sum }, sh, None, &mut plan, &mut Scratch::default());
        assert!(prep.fold.is_none());
    }
}

/// The schedule a `RINGLEADER_ALGO` value forces (`None`: automatic).
fn forced_by_name(name: Option<&str>) -> Option<Algo> {
    Algo::forced(name.and_then(|n| ringleader_core::config::parse_algo(n).expect("a known name")))
}

#[test]
fn sockets_on_one_host_take_the_trees_from_four_ranks_on() {
    // Rank 0's frames and whether the result is folded, for a small
    // all_reduce, where one-round schedules serve up to `flat_max` ranks.
    let plan_of = |n: usize, flat_max: usize| {
        let sh = Shape { rank: 0, n, streams: 1, esz: 8, flat_max };
        let mut plan = Plan::default();
        let prep =
            schedule(Coll::AllReduce { count: 1, op: ReduceOp::Sum }, sh, None, &mut plan, &mut Scratch::default());
        (plan.sends.len(), prep.fold.is_some())
    };
    let (loopback, elsewhere) = (flat::world_max(true), flat::world_max(false));
    // Shared memory or a network: one round of n - 1 frames.
    assert_eq!(plan_of(4, elsewhere), (3, true));
    assert_eq!(plan_of(8, elsewhere), (7, true));
    // Sockets on one host: recursive doubling, log2 n frames, from 4 ranks.
    assert_eq!(plan_of(3, loopback), (2, true));
    assert_eq!(plan_of(4, loopback), (2, false));
    assert_eq!(plan_of(8, loopback), (3, false));
}
