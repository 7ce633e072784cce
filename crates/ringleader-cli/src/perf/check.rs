//! What each rank puts in its buffers for the checked run, and what it must
//! find there afterwards.
//!
//! Inputs are small non-negative integers that depend on the rank and the
//! element's index. Their range is chosen per dtype and world size so that
//! every partial result a reduction can form is exactly representable
//! (bf16 holds the integers up to 256 exactly, f16 up to 2048, i8 up to
//! 127): the expected result is then exact whatever order the algorithm
//! reduces in, and any difference is an error, not rounding. Outputs start
//! as [`POISON`], a value no input takes, so an element the collective
//! failed to write is caught too.
//!
//! - sum, min, max: rank `r` holds `(i + r) mod M` at index `i`;
//! - prod: 2 where `r == i mod n`, else 1, so every product is 2;
//! - avg: `1 + (i mod B) + c(r)` with offsets `c` of +1, -1 in pairs of
//!   ranks (0 for an odd last rank) that sum to 0, so every average is
//!   the integer `1 + (i mod B)`.

use ringleader_core::{DType, Element, OpKind, ReduceOp};

/// A value no input holds, written into outputs before the checked run.
pub(crate) const POISON: i64 = 100;

/// Elements the benchmark can fill and check.
pub(crate) trait Sample: Element + Copy {
    /// The integer `v` as this type (exact for the values used here).
    fn from_i64(v: i64) -> Self;
    /// The value as an f64.
    fn to_f64(self) -> f64;
}

macro_rules! sample_prim {
    ($($t:ty),*) => {$(
        impl Sample for $t {
            fn from_i64(v: i64) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
        }
    )*};
}
sample_prim!(f32, f64, i8, u8, i32, i64);

macro_rules! sample_half {
    ($($t:ty),*) => {$(
        impl Sample for $t {
            fn from_i64(v: i64) -> Self { <$t>::from_f64(v as f64) }
            fn to_f64(self) -> f64 { <$t>::to_f64(self) }
        }
    )*};
}
sample_half!(half::f16, half::bf16);

/// The largest `L` such that every integer in `0..=L` is exact in `dtype`.
pub(crate) fn exact_limit(dtype: DType) -> i64 {
    match dtype {
        DType::F32 => 1 << 24,
        DType::F64 => 1 << 53,
        DType::F16 => 2048,
        DType::BF16 => 256,
        DType::I8 => i8::MAX as i64,
        DType::U8 => u8::MAX as i64,
        DType::I32 => i32::MAX as i64,
        DType::I64 => i64::MAX,
    }
}

/// Largest modulus used: values stay below 16.
const MAX_MODULUS: i64 = 16;

/// The inputs and expected outputs of one collective over `n` ranks.
#[derive(Debug, Clone)]
pub(crate) struct Pattern {
    op: OpKind,
    redop: ReduceOp,
    n: usize,
    root: usize,
    /// `M` (sum, min, max, and the ops that do not reduce) or `B` (avg).
    modulus: usize,
    /// The expected reduction of index `i` is `reduced[i % modulus]`.
    reduced: Vec<i64>,
    /// Relative tolerance when comparing reduced values (avg on floats only).
    tolerance: f64,
}

impl Pattern {
    /// The pattern of `op` (with reduce op `redop`, root `root`) in `dtype`
    /// over `n` ranks.
    pub(crate) fn new(op: OpKind, redop: ReduceOp, dtype: DType, n: usize, root: usize) -> Pattern {
        let n = n.max(1);
        let limit = exact_limit(dtype);
        let n64 = n as i64;
        let reducing = matches!(op, OpKind::AllReduce | OpKind::ReduceScatter | OpKind::Reduce);
        let modulus = match (reducing, redop) {
            (true, ReduceOp::Sum) => (limit / n64).min(MAX_MODULUS - 1) + 1,
            (true, ReduceOp::Avg) => ((limit - n64 / 2 - 1) / n64).clamp(1, MAX_MODULUS - 1),
            (true, ReduceOp::Prod) => 1,
            _ => MAX_MODULUS,
        } as usize;
        let tolerance = match (reducing && redop == ReduceOp::Avg, dtype) {
            (false, _) => 0.0,
            (true, DType::F64) => 1e-12,
            (true, DType::F32) => 1e-6,
            (true, DType::F16) => 1.0 / 1024.0,
            (true, DType::BF16) => 1.0 / 128.0,
            (true, _) => 0.0,
        };
        let mut p = Pattern { op, redop, n, root, modulus, reduced: Vec::new(), tolerance };
        p.reduced = (0..modulus).map(|i| p.reduce_naively(i)).collect();
        p
    }

    fn reducing(&self) -> bool {
        matches!(self.op, OpKind::AllReduce | OpKind::ReduceScatter | OpKind::Reduce)
    }

    /// Element `i` of rank `r`'s input.
    pub(crate) fn value(&self, r: usize, i: usize) -> i64 {
        if !self.reducing() {
            return ((i + r) % self.modulus) as i64;
        }
        match self.redop {
            ReduceOp::Prod => {
                if r == i % self.n {
                    2
                } else {
                    1
                }
            }
            ReduceOp::Avg => 1 + (i % self.modulus) as i64 + avg_offset(r, self.n),
            _ => ((i + r) % self.modulus) as i64,
        }
    }

    /// The reduction over every rank of element `i`.
    pub(crate) fn reduced(&self, i: usize) -> i64 {
        self.reduced[i % self.modulus]
    }

    fn reduce_naively(&self, i: usize) -> i64 {
        let vals = (0..self.n).map(|r| self.value(r, i));
        match self.redop {
            ReduceOp::Sum => vals.sum(),
            ReduceOp::Prod => vals.product(),
            ReduceOp::Min => vals.min().unwrap_or(0),
            ReduceOp::Max => vals.max().unwrap_or(0),
            ReduceOp::Avg => vals.sum::<i64>() / self.n as i64,
        }
    }

    /// Element `i` of rank `me`'s input for the checked run: its pattern
    /// value; for broadcast, only the root's (the others start poisoned,
    /// so a result copied from the wrong rank is caught).
    pub(crate) fn input(&self, me: usize, i: usize) -> i64 {
        if self.op == OpKind::Broadcast && me != self.root {
            POISON
        } else {
            self.value(me, i)
        }
    }

    /// Element `k` of rank `me`'s result: the whole buffer of all_reduce,
    /// broadcast, reduce (on the other ranks than the root: its input, left
    /// alone), all_gather and all_to_all; its own chunk of reduce_scatter.
    /// `chunk` is the per-rank chunk of the ops that split data.
    pub(crate) fn expected(&self, me: usize, k: usize, chunk: usize) -> i64 {
        let chunk = chunk.max(1);
        match self.op {
            OpKind::AllReduce => self.reduced(k),
            OpKind::Reduce if me == self.root => self.reduced(k),
            OpKind::Reduce => self.value(me, k),
            OpKind::Broadcast => self.value(self.root, k),
            OpKind::AllGather => self.value(k / chunk, k % chunk),
            OpKind::ReduceScatter => self.reduced(me * chunk + k),
            OpKind::AllToAll => self.value(k / chunk, me * chunk + k % chunk),
            // Not benchmarked.
            _ => 0,
        }
    }

    /// How many elements of rank `me`'s `result` (see [`Pattern::expected`])
    /// are wrong after the checked run.
    pub(crate) fn wrong<T: Sample>(&self, me: usize, result: &[T], chunk: usize) -> u64 {
        let reduced = match self.op {
            OpKind::AllReduce | OpKind::ReduceScatter => true,
            OpKind::Reduce => me == self.root,
            _ => false,
        };
        self.count(result, reduced, |k| self.expected(me, k, chunk))
    }

    /// Counts the elements of `got` that differ from `expected(index)`;
    /// `reduced` values of floats under avg may differ by the tolerance.
    fn count<T: Sample>(&self, got: &[T], reduced: bool, expected: impl Fn(usize) -> i64) -> u64 {
        let tol = if reduced { self.tolerance } else { 0.0 };
        let mut wrong = 0;
        for (i, &g) in got.iter().enumerate() {
            let e = expected(i);
            let ok = if tol == 0.0 {
                g == T::from_i64(e)
            } else {
                (g.to_f64() - e as f64).abs() <= tol * (e as f64).abs().max(1.0)
            };
            if !ok {
                wrong += 1;
            }
        }
        wrong
    }
}

/// +1, -1 for each pair of ranks (2k, 2k+1); 0 for the last rank of an odd
/// world. The offsets of all ranks sum to 0.
fn avg_offset(r: usize, n: usize) -> i64 {
    if r % 2 == 1 {
        -1
    } else if r + 1 < n {
        1
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every partial reduction (in rank order and in reverse) stays within
    /// the exact range, and the expected values are what the pattern says.
    #[test]
    fn reductions_are_exact_for_every_dtype_and_world_size() {
        for dtype in DType::ALL {
            let limit = exact_limit(dtype);
            for n in 1..=64 {
                for redop in ReduceOp::ALL {
                    let p = Pattern::new(OpKind::AllReduce, redop, dtype, n, 0);
                    for i in 0..40 {
                        let vals: Vec<i64> = (0..n).map(|r| p.value(r, i)).collect();
                        assert!(vals.iter().all(|v| (0..=17).contains(v)));
                        for order in [vals.clone(), vals.iter().rev().copied().collect()] {
                            let mut acc = order[0];
                            for &v in &order[1..] {
                                acc = match redop {
                                    ReduceOp::Sum | ReduceOp::Avg => acc + v,
                                    ReduceOp::Prod => acc * v,
                                    ReduceOp::Min => acc.min(v),
                                    ReduceOp::Max => acc.max(v),
                                };
                                assert!(acc <= limit, "{dtype} {redop} n={n}: {acc}");
                            }
                        }
                        let expect = match redop {
                            ReduceOp::Sum => vals.iter().sum::<i64>(),
                            ReduceOp::Prod => 2,
                            ReduceOp::Min => *vals.iter().min().unwrap(),
                            ReduceOp::Max => *vals.iter().max().unwrap(),
                            ReduceOp::Avg => {
                                let s: i64 = vals.iter().sum();
                                assert_eq!(s % n as i64, 0, "{dtype} n={n}: avg not whole");
                                s / n as i64
                            }
                        };
                        assert_eq!(p.reduced(i), expect, "{dtype} {redop} n={n} i={i}");
                    }
                }
            }
        }
    }

    #[test]
    fn inputs_differ_between_ranks_and_from_poison() {
        let p = Pattern::new(OpKind::AllGather, ReduceOp::Sum, DType::BF16, 4, 0);
        assert_ne!(p.value(0, 0), p.value(1, 0));
        assert!((0..64).all(|i| (0..4).all(|r| p.value(r, i) != POISON)));
        let p = Pattern::new(OpKind::AllReduce, ReduceOp::Sum, DType::F32, 4, 0);
        assert!(p.reduced(3) > 0);
    }

    #[test]
    fn wrong_elements_are_counted() {
        let p = Pattern::new(OpKind::AllGather, ReduceOp::Sum, DType::F32, 2, 0);
        assert_eq!((0..3).map(|i| p.input(1, i)).collect::<Vec<_>>(), [1, 2, 3]);
        let poisoned = vec![POISON as f32; 6];
        assert_eq!(p.wrong(1, &poisoned, 3), 6, "all poisoned");
        let good: Vec<f32> = (0..6).map(|k| p.value(k / 3, k % 3) as f32).collect();
        assert_eq!(p.wrong(1, &good, 3), 0);
        let mut bad = good.clone();
        bad.swap(0, 3);
        assert_eq!(p.wrong(1, &bad, 3), 2);
    }

    #[test]
    fn broadcast_inputs_other_than_the_roots_are_poison() {
        let p = Pattern::new(OpKind::Broadcast, ReduceOp::Sum, DType::I32, 3, 1);
        assert_eq!(p.input(0, 4), POISON);
        assert_eq!(p.input(1, 4), p.value(1, 4));
        assert_eq!(p.expected(2, 4, 0), p.value(1, 4));
    }

    #[test]
    fn reduce_scatter_and_all_to_all_expect_this_ranks_share() {
        let p = Pattern::new(OpKind::ReduceScatter, ReduceOp::Max, DType::F32, 2, 0);
        assert_eq!(p.expected(1, 0, 4), p.reduced(4));
        let p = Pattern::new(OpKind::AllToAll, ReduceOp::Sum, DType::U8, 2, 0);
        // Chunk 1 of rank 0's result is rank 1's chunk 0.
        assert_eq!(p.expected(0, 5, 4), p.value(1, 1));
    }

    #[test]
    fn halves_convert_exactly() {
        for v in 0..=256 {
            assert_eq!(half::bf16::from_i64(v).to_f64(), v as f64);
            assert_eq!(half::f16::from_i64(v * 8).to_f64(), (v * 8) as f64);
        }
        assert_eq!(<u8 as Sample>::from_i64(POISON), 100);
        assert_eq!(<i8 as Sample>::from_i64(POISON), 100);
    }
}
