//! One rank's benchmark loop, written against the [`Collectives`] trait so
//! that it runs over the real communicator in the workers and over an
//! in-memory one in the unit tests.
//!
//! For each size:
//! 1. allocate zero-filled buffers and run the warm-up calls (at least one
//!    when the iteration count is adaptive: it measures how long a call
//!    takes; ranks agree on the count through an all_reduce(max) of that
//!    estimate);
//! 2. barrier, then time `iters` calls; this rank's mean per call goes
//!    through an all_reduce(max), so every rank knows the slowest rank's;
//! 3. fill the buffers with the [`Pattern`], run once more, count wrong
//!    elements, and sum the counts over the ranks.
//!
//! The timed calls run on zero-filled buffers: the in-place reductions
//! repeated k times would otherwise grow the values n^k-fold until integers
//! wrap and floats become infinite. Arithmetic speed does not depend on
//! the values (zeros are not subnormal), and the checked run uses fresh
//! inputs anyway.

use super::check::{Pattern, Sample};
use super::report::{Row, Setup};
use super::sizes::Shape;
use half::{bf16, f16};
use ringleader_core::{DType, Element, OpKind, ReduceOp};
use std::time::Instant;

/// An error of the communicator, as its message.
pub(crate) type CommResult<T> = std::result::Result<T, String>;

/// The collectives the benchmark calls (the facade's signatures).
pub(crate) trait Collectives {
    /// This rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// The data-plane transport in use (`tcp`, `shm`, ...).
    fn transport(&self) -> &str;
    /// In-place all_reduce.
    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> CommResult<()>;
    /// `output` (world x input) = every rank's input, in rank order.
    fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> CommResult<()>;
    /// `output` = this rank's chunk of the reduction of every `input` (world x output).
    fn reduce_scatter<T: Element>(&self, input: &[T], output: &mut [T], op: ReduceOp) -> CommResult<()>;
    /// `buf` = root's `buf`.
    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> CommResult<()>;
    /// Root's `buf` = the reduction of every `buf`; the others' are left alone.
    fn reduce<T: Element>(&self, buf: &mut [T], root: usize, op: ReduceOp) -> CommResult<()>;
    /// Chunk j of `output` = chunk (this rank) of rank j's `input`.
    fn all_to_all<T: Element>(&self, input: &[T], output: &mut [T]) -> CommResult<()>;
    /// Every rank reaches this point before any leaves it.
    fn barrier(&self) -> CommResult<()>;
}

/// Time the adaptive iteration count aims at per size.
const TARGET_SECS: f64 = 0.3;
/// Bounds of the adaptive iteration count.
const MIN_ITERS: usize = 5;
const MAX_ITERS: usize = 1000;

/// What to benchmark.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    /// The collective.
    pub(crate) op: OpKind,
    /// Element type.
    pub(crate) dtype: DType,
    /// Reduce op of the reducing collectives.
    pub(crate) redop: ReduceOp,
    /// Root of broadcast and reduce.
    pub(crate) root: usize,
    /// Requested sizes in bytes.
    pub(crate) sizes: Vec<u64>,
    /// Timed calls per size; `None`: adaptive.
    pub(crate) iters: Option<usize>,
    /// Warm-up calls per size.
    pub(crate) warmup: usize,
}

/// What the loop reports as it goes.
#[derive(Debug)]
pub(crate) enum Event<'a> {
    /// A size was measured and checked.
    Row(&'a Row),
    /// A size leaves no element per rank for this op; skipped.
    Skipped(u64),
}

/// The iteration count that makes a size take about [`TARGET_SECS`], from
/// the slowest rank's estimate of one call.
pub(crate) fn adaptive_iters(per_call_secs: f64) -> usize {
    if !per_call_secs.is_finite() || per_call_secs <= 0.0 {
        return MAX_ITERS;
    }
    let n = (TARGET_SECS / per_call_secs).ceil();
    if n >= MAX_ITERS as f64 {
        MAX_ITERS
    } else {
        (n as usize).max(MIN_ITERS)
    }
}

/// Runs every size of `spec`; reports each through `on_event` and returns
/// the rows (identical on every rank).
pub(crate) fn run_all<C: Collectives>(
    comm: &C,
    spec: &Spec,
    on_event: &mut dyn FnMut(Event<'_>),
) -> CommResult<Vec<Row>> {
    let n = comm.world_size();
    let setup = Setup {
        op: spec.op,
        nproc: n,
        dtype: spec.dtype,
        redop: spec.redop,
        root: spec.root,
        transport: comm.transport(),
    };
    let pattern = Pattern::new(spec.op, spec.redop, spec.dtype, n, spec.root);
    let mut rows = Vec::new();
    for &bytes in &spec.sizes {
        let Some(shape) = Shape::of(spec.op, bytes, spec.dtype.size(), n) else {
            on_event(Event::Skipped(bytes));
            continue;
        };
        let m = match spec.dtype {
            DType::F32 => measure::<f32, C>(comm, spec, &shape, &pattern)?,
            DType::F64 => measure::<f64, C>(comm, spec, &shape, &pattern)?,
            DType::F16 => measure::<f16, C>(comm, spec, &shape, &pattern)?,
            DType::BF16 => measure::<bf16, C>(comm, spec, &shape, &pattern)?,
            DType::I8 => measure::<i8, C>(comm, spec, &shape, &pattern)?,
            DType::U8 => measure::<u8, C>(comm, spec, &shape, &pattern)?,
            DType::I32 => measure::<i32, C>(comm, spec, &shape, &pattern)?,
            DType::I64 => measure::<i64, C>(comm, spec, &shape, &pattern)?,
        };
        let row = Row::new(&setup, &shape, m.time_s, m.iters, spec.warmup, m.wrong);
        on_event(Event::Row(&row));
        rows.push(row);
    }
    Ok(rows)
}

/// One size's measurement, agreed on by every rank.
#[derive(Debug, Clone, Copy)]
struct Measured {
    /// The slowest rank's mean time per call.
    time_s: f64,
    /// Timed calls.
    iters: usize,
    /// Wrong elements over every rank.
    wrong: u64,
}

fn measure<T: Sample, C: Collectives>(comm: &C, spec: &Spec, shape: &Shape, pattern: &Pattern) -> CommResult<Measured> {
    let zero = T::from_i64(0);
    let mut input = vec![zero; shape.in_len];
    let mut output = vec![zero; shape.out_len];
    huge_pages(&mut input);
    huge_pages(&mut output);
    // Touch every page first: an untouched buffer reads as the kernel's
    // shared zero page, which costs no memory bandwidth and flatters
    // whatever copies out of it.
    let me = comm.rank();
    pattern.fill(me, &mut input, &mut output);

    let calls = if spec.iters.is_none() { spec.warmup.max(1) } else { spec.warmup };
    let t = Instant::now();
    for _ in 0..calls {
        call(comm, spec, &mut input, &mut output)?;
    }
    let iters = match spec.iters {
        Some(i) => i,
        None => {
            let estimate = t.elapsed().as_secs_f64() / calls as f64;
            adaptive_iters(max_over_ranks(comm, estimate)?)
        }
    };

    comm.barrier()?;
    let t = Instant::now();
    for _ in 0..iters {
        call(comm, spec, &mut input, &mut output)?;
    }
    let mine = t.elapsed().as_secs_f64() / iters.max(1) as f64;
    let time_s = max_over_ranks(comm, mine)?;

    pattern.fill(me, &mut input, &mut output);
    call(comm, spec, &mut input, &mut output)?;
    let wrong = pattern.wrong(me, &input, &output, shape.per_rank(comm.world_size()));
    let mut total = [wrong as i64];
    comm.all_reduce(&mut total, ReduceOp::Sum)?;
    Ok(Measured { time_s, iters, wrong: total[0].max(0) as u64 })
}

/// Asks for transparent huge pages on a large, untouched buffer, as numpy
/// does for its arrays (so ringleader's numbers compare with Open MPI's and
/// gloo's through numpy and torch on equal terms).
fn huge_pages<T>(buf: &mut [T]) {
    let bytes = std::mem::size_of_val(buf);
    if bytes < 4 << 20 {
        return;
    }
    let page = 4096;
    let start = (buf.as_mut_ptr() as usize).next_multiple_of(page);
    let end = (buf.as_mut_ptr() as usize + bytes) / page * page;
    // SAFETY: advice only, on whole pages inside `buf`; it changes how the
    // kernel backs them, never their contents.
    unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
}

/// One call of the benchmarked collective.
fn call<T: Element, C: Collectives>(comm: &C, spec: &Spec, input: &mut [T], output: &mut [T]) -> CommResult<()> {
    match spec.op {
        OpKind::AllReduce => comm.all_reduce(input, spec.redop),
        OpKind::AllGather => comm.all_gather(input, output),
        OpKind::ReduceScatter => comm.reduce_scatter(input, output, spec.redop),
        OpKind::Broadcast => comm.broadcast(input, spec.root),
        OpKind::Reduce => comm.reduce(input, spec.root, spec.redop),
        OpKind::AllToAll => comm.all_to_all(input, output),
        other => Err(format!("{other} is not a benchmarked collective")),
    }
}

/// The largest `v` over every rank.
fn max_over_ranks<C: Collectives>(comm: &C, v: f64) -> CommResult<f64> {
    let mut buf = [v];
    comm.all_reduce(&mut buf, ReduceOp::Max)?;
    Ok(buf[0])
}

#[cfg(test)]
mod tests {
    use super::super::sim::SimWorld;
    use super::*;

    fn spec(op: OpKind, dtype: DType, redop: ReduceOp, root: usize) -> Spec {
        Spec { op, dtype, redop, root, sizes: vec![1, 8, 64, 1000, 4096], iters: Some(2), warmup: 1 }
    }

    fn run(n: usize, spec: &Spec, corrupt: bool) -> Vec<Vec<Row>> {
        SimWorld::run(n, corrupt, |comm| run_all(comm, spec, &mut |_| {}).expect("no communicator error"))
    }

    #[test]
    fn every_op_checks_clean_on_a_correct_communicator() {
        let ops = [
            OpKind::AllReduce,
            OpKind::AllGather,
            OpKind::ReduceScatter,
            OpKind::Broadcast,
            OpKind::Reduce,
            OpKind::AllToAll,
        ];
        for n in [1, 2, 3, 4] {
            for op in ops {
                for (dtype, redop) in [
                    (DType::F32, ReduceOp::Sum),
                    (DType::BF16, ReduceOp::Sum),
                    (DType::I8, ReduceOp::Avg),
                    (DType::F16, ReduceOp::Prod),
                    (DType::U8, ReduceOp::Min),
                    (DType::F64, ReduceOp::Max),
                    (DType::I64, ReduceOp::Avg),
                ] {
                    let s = spec(op, dtype, redop, n - 1);
                    let per_rank = run(n, &s, false);
                    for rows in &per_rank {
                        assert!(!rows.is_empty(), "{op} {dtype} n={n}: no size ran");
                        for r in rows {
                            assert_eq!(r.wrong, 0, "{op} {dtype} {redop} n={n}: {r:?}");
                        }
                    }
                    // Every rank agrees on every row.
                    for rows in &per_rank[1..] {
                        let key = |r: &Row| (r.bytes, r.count, r.wrong, r.time_us.to_bits());
                        assert!(rows.iter().map(key).eq(per_rank[0].iter().map(key)));
                    }
                }
            }
        }
    }

    #[test]
    fn a_wrong_result_is_counted_on_every_rank() {
        for op in [OpKind::AllReduce, OpKind::AllGather, OpKind::Broadcast] {
            let s = spec(op, DType::F32, ReduceOp::Sum, 0);
            for rows in run(3, &s, true) {
                assert!(rows.iter().all(|r| r.wrong == 1 && r.check == "FAIL"), "{op}: {rows:?}");
            }
        }
    }

    #[test]
    fn sizes_too_small_for_the_world_are_skipped() {
        let s = spec(OpKind::AllGather, DType::F64, ReduceOp::Sum, 0);
        let mut skipped = Vec::new();
        SimWorld::run(4, false, |comm| {
            let mut mine = Vec::new();
            let rows = run_all(comm, &s, &mut |e| {
                if let Event::Skipped(b) = e {
                    mine.push(b)
                }
            })
            .unwrap();
            (mine, rows.len())
        })
        .into_iter()
        .for_each(|(m, rows)| {
            assert_eq!(rows, 3);
            skipped = m;
        });
        assert_eq!(skipped, [1, 8]);
    }

    #[test]
    fn adaptive_iteration_counts() {
        assert_eq!(adaptive_iters(1.0), MIN_ITERS);
        assert_eq!(adaptive_iters(0.003), 100);
        assert_eq!(adaptive_iters(1e-9), MAX_ITERS);
        assert_eq!(adaptive_iters(0.0), MAX_ITERS);
        assert_eq!(adaptive_iters(f64::NAN), MAX_ITERS);
    }

    #[test]
    fn adaptive_runs_agree_on_the_count() {
        let mut s = spec(OpKind::AllReduce, DType::F32, ReduceOp::Sum, 0);
        s.iters = None;
        s.warmup = 0;
        s.sizes = vec![64];
        let per_rank = run(2, &s, false);
        assert_eq!(per_rank[0][0].iters, per_rank[1][0].iters);
        assert!((MIN_ITERS..=MAX_ITERS).contains(&per_rank[0][0].iters));
    }
}
