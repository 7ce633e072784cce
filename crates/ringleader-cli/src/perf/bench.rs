//! One rank's benchmark loop, written against the [`Collectives`] trait so
//! that it runs over the real communicator in the workers and over an
//! in-memory one in the unit tests.
//!
//! Each size is measured twice, as nccl-tests does: out of place (a send
//! buffer and a separate receive buffer), then in place (one buffer). The
//! ringleader API has one form per collective: all_reduce, broadcast and
//! reduce work in place, all_gather, reduce_scatter and all_to_all out of
//! place (overlapping buffers are refused). The other form is run the way a
//! caller of that API would get it, with the copy it takes inside the
//! timed loop ([`emulation`] says which copy); nothing is measured once and
//! printed twice. barrier, which moves no data, has one form only
//! ([`has_form`]): its one row (size 0, [`Shape::of`]) runs the same steps
//! on empty buffers, in place, and prints N/A for the other group.
//!
//! For each size and form:
//! 1. allocate the buffers (one set per operation in flight: `agg_iters`
//!    of them without blocking, one with) and write zeros into them, then
//!    run the warm-up iterations (at least one when the iteration count is
//!    adaptive: it measures how long an iteration takes; ranks agree on
//!    the count through an all_reduce(max) of that estimate);
//! 2. barrier, then time `iters` iterations of `agg_iters` operations each:
//!    blocking, each operation is a blocking call that completes before the
//!    next starts; not blocking, the iteration's operations are all
//!    submitted through the asynchronous API, then waited for. The time per
//!    operation (elapsed / (iters x agg_iters)) is combined over the ranks
//!    as `-a` says (rank 0's, mean, min or max), so every rank knows it;
//! 3. unless checking is off, fill the buffers with the [`Pattern`], run
//!    one more iteration (of one operation when blocking: more would
//!    reduce the result again), count wrong elements, and sum the counts
//!    over the ranks; `-c N` does this N times.
//!
//! The timed calls run on zeros: the in-place reductions repeated k times
//! would otherwise grow the values n^k-fold until integers wrap and floats
//! become infinite. Arithmetic speed does not depend on the values (zeros
//! are not subnormal), and the checked runs use fresh inputs anyway.

use super::check::{Pattern, Sample, POISON};
use super::report::{Row, Setup};
use super::sizes::Shape;
use super::spec::{emulation, has_form, Average, Measured, Spec, Variant};
use half::{bf16, f16};
use ringleader_core::{DType, Element, OpKind, ReduceOp};
use std::time::Instant;

/// An error of the communicator, as its message.
pub(crate) type CommResult<T> = std::result::Result<T, String>;

/// The collectives the benchmark calls (the facade's signatures).
pub(crate) trait Collectives {
    /// A collective started by [`Collectives::submit`]; it holds the buffers.
    type Pending<T: Element>;
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
    /// Starts `call` and returns without waiting for it: on `output` alone
    /// for the in-place collectives (`input` is handed back as it is),
    /// from `input` into `output` for the others; barrier hands both back
    /// as they are.
    fn submit<T: Element>(&self, call: Call, input: Vec<T>, output: Vec<T>) -> CommResult<Self::Pending<T>>;
    /// Waits for a submitted collective and gives its `(input, output)` back.
    fn complete<T: Element>(&self, pending: Self::Pending<T>) -> CommResult<(Vec<T>, Vec<T>)>;
}

/// One call of a benchmarked collective, with its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    /// all_reduce, in place.
    AllReduce(ReduceOp),
    /// all_gather, input to output.
    AllGather,
    /// reduce_scatter, input to output.
    ReduceScatter(ReduceOp),
    /// broadcast from the root, in place.
    Broadcast(usize),
    /// reduce to the root, in place.
    Reduce(usize, ReduceOp),
    /// all_to_all, input to output.
    AllToAll,
    /// barrier: no buffer (both are handed back untouched).
    Barrier,
}

impl Call {
    /// The call `spec` benchmarks; `None` for an op `perf` does not measure.
    pub(crate) fn of(op: OpKind, redop: ReduceOp, root: usize) -> Option<Call> {
        Some(match op {
            OpKind::AllReduce => Call::AllReduce(redop),
            OpKind::AllGather => Call::AllGather,
            OpKind::ReduceScatter => Call::ReduceScatter(redop),
            OpKind::Broadcast => Call::Broadcast(root),
            OpKind::Reduce => Call::Reduce(root, redop),
            OpKind::AllToAll => Call::AllToAll,
            OpKind::Barrier => Call::Barrier,
            _ => return None,
        })
    }
}

/// Runs `call` with the blocking API (`input` is unused by the in-place
/// collectives, both buffers by barrier).
pub(crate) fn call_blocking<T: Element, C: Collectives>(
    comm: &C,
    call: Call,
    input: &[T],
    output: &mut [T],
) -> CommResult<()> {
    match call {
        Call::AllReduce(op) => comm.all_reduce(output, op),
        Call::AllGather => comm.all_gather(input, output),
        Call::ReduceScatter(op) => comm.reduce_scatter(input, output, op),
        Call::Broadcast(root) => comm.broadcast(output, root),
        Call::Reduce(root, op) => comm.reduce(output, root, op),
        Call::AllToAll => comm.all_to_all(input, output),
        Call::Barrier => comm.barrier(),
    }
}

/// Time the adaptive iteration count aims at per size and column group.
const TARGET_SECS: f64 = 0.3;
/// Bounds of the adaptive iteration count.
const MIN_ITERS: usize = 5;
const MAX_ITERS: usize = 1000;

/// What the loop reports as it goes.
#[derive(Debug)]
pub(crate) enum Event<'a> {
    /// A size was measured (and checked, unless checking is off).
    Row(&'a Row),
    /// A size leaves no element per rank for this op; skipped.
    Skipped(u64),
}

/// The iteration count that makes a size take about [`TARGET_SECS`], from
/// the slowest rank's estimate of one iteration.
pub(crate) fn adaptive_iters(per_iter_secs: f64) -> usize {
    if !per_iter_secs.is_finite() || per_iter_secs <= 0.0 {
        return MAX_ITERS;
    }
    let n = (TARGET_SECS / per_iter_secs).ceil();
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
    let setup = Setup::new(spec, n, comm.transport());
    let pattern = Pattern::new(spec.op, spec.redop, spec.dtype, n, spec.root);
    let mut rows = Vec::new();
    for &bytes in &spec.sizes {
        let Some(shape) = Shape::of(spec.op, bytes, spec.dtype.size(), n) else {
            on_event(Event::Skipped(bytes));
            continue;
        };
        let mut groups = [None, None];
        let forms = [Variant::OutOfPlace, Variant::InPlace];
        for (g, variant) in groups.iter_mut().zip(forms).filter(|(_, v)| has_form(spec.op, *v)) {
            *g = Some(match spec.dtype {
                DType::F32 => measure::<f32, C>(comm, spec, &shape, &pattern, variant)?,
                DType::F64 => measure::<f64, C>(comm, spec, &shape, &pattern, variant)?,
                DType::F16 => measure::<f16, C>(comm, spec, &shape, &pattern, variant)?,
                DType::BF16 => measure::<bf16, C>(comm, spec, &shape, &pattern, variant)?,
                DType::I8 => measure::<i8, C>(comm, spec, &shape, &pattern, variant)?,
                DType::U8 => measure::<u8, C>(comm, spec, &shape, &pattern, variant)?,
                DType::I32 => measure::<i32, C>(comm, spec, &shape, &pattern, variant)?,
                DType::I64 => measure::<i64, C>(comm, spec, &shape, &pattern, variant)?,
            });
        }
        let row = Row::new(&setup, &shape, groups[0], groups[1]);
        on_event(Event::Row(&row));
        rows.push(row);
    }
    Ok(rows)
}

/// The three buffers of one operation in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Buf {
    Send = 0,
    Recv = 1,
    Scratch = 2,
}

/// Elements `start..start + len` of one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Region {
    buf: Buf,
    start: usize,
    len: usize,
}

impl Region {
    fn new(buf: Buf, start: usize, len: usize) -> Region {
        Region { buf, start, len }
    }
}

/// What one operation of one form does with its buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    /// Elements of the send, receive and scratch buffers.
    lens: [usize; 3],
    /// Where this rank's input goes for the checked run.
    input: Region,
    /// A copy before the call: from a region to a buffer, at an offset.
    pre: Option<(Region, Buf, usize)>,
    /// The call's input buffer (`None`: in place) and output buffer.
    args: (Option<Buf>, Buf),
    /// A copy after the call.
    post: Option<(Region, Buf, usize)>,
    /// Where this rank's result is (see [`Pattern::expected`]).
    result: Region,
}

impl Layout {
    /// The plan of `variant` of `op` on rank `me` (see [`emulation`]).
    fn of(op: OpKind, variant: Variant, shape: &Shape, me: usize, root: usize) -> Layout {
        let (t, c) = (shape.total, shape.chunk);
        let whole = |b| Region::new(b, 0, t);
        let mine = |b| Region::new(b, me * c, c);
        let (send, recv) = (Buf::Send, Buf::Recv);
        let in_place = Layout {
            lens: [0, t, 0],
            input: whole(recv),
            pre: None,
            args: (None, recv),
            post: None,
            result: whole(recv),
        };
        match (variant, op) {
            (Variant::InPlace, OpKind::AllGather) => Layout {
                lens: [0, t, c],
                input: mine(recv),
                pre: Some((mine(recv), Buf::Scratch, 0)),
                args: (Some(Buf::Scratch), recv),
                ..in_place
            },
            (Variant::InPlace, OpKind::ReduceScatter) => Layout {
                lens: [0, t, c],
                args: (Some(recv), Buf::Scratch),
                post: Some((Region::new(Buf::Scratch, 0, c), recv, me * c)),
                result: mine(recv),
                ..in_place
            },
            (Variant::InPlace, OpKind::AllToAll) => Layout {
                lens: [0, t, t],
                pre: Some((whole(recv), Buf::Scratch, 0)),
                args: (Some(Buf::Scratch), recv),
                ..in_place
            },
            (Variant::InPlace, _) => in_place,
            (Variant::OutOfPlace, OpKind::AllGather) => Layout {
                lens: [c, t, 0],
                input: Region::new(send, 0, c),
                pre: None,
                args: (Some(send), recv),
                post: None,
                result: whole(recv),
            },
            (Variant::OutOfPlace, OpKind::ReduceScatter) => Layout {
                lens: [t, c, 0],
                input: whole(send),
                pre: None,
                args: (Some(send), recv),
                post: None,
                result: Region::new(recv, 0, c),
            },
            (Variant::OutOfPlace, OpKind::AllToAll) => Layout {
                lens: [t, t, 0],
                input: whole(send),
                pre: None,
                args: (Some(send), recv),
                post: None,
                result: whole(recv),
            },
            // The in-place collectives, out of place: copy, then in place.
            // Reduce's other ranks need no copy (their buffer is left
            // alone), nor broadcast's (theirs is only written).
            (Variant::OutOfPlace, _) => {
                let copies = op == OpKind::AllReduce || me == root;
                let keeps = op == OpKind::Reduce && me != root;
                Layout {
                    lens: [t, t, 0],
                    input: whole(send),
                    pre: copies.then_some((whole(send), recv, 0)),
                    args: (None, if keeps { send } else { recv }),
                    post: None,
                    result: whole(if keeps { send } else { recv }),
                }
            }
        }
    }
}

/// One operation's buffers, indexed by [`Buf`].
type Bufs<T> = [Vec<T>; 3];

/// Copies `from` into buffer `to` at `at`.
fn copy<T: Copy>(bufs: &mut Bufs<T>, (from, to, at): (Region, Buf, usize)) {
    let src = std::mem::take(&mut bufs[from.buf as usize]);
    bufs[to as usize][at..at + from.len].copy_from_slice(&src[from.start..from.start + from.len]);
    bufs[from.buf as usize] = src;
}

/// One operation with the blocking API: copy, call, copy.
fn run_blocking<T: Sample, C: Collectives>(comm: &C, call: Call, plan: &Layout, bufs: &mut Bufs<T>) -> CommResult<()> {
    if let Some(c) = plan.pre {
        copy(bufs, c);
    }
    let (input, output) = plan.args;
    let mut out = std::mem::take(&mut bufs[output as usize]);
    let r = match input {
        None => call_blocking(comm, call, &[], &mut out),
        Some(i) => call_blocking(comm, call, &bufs[i as usize], &mut out),
    };
    bufs[output as usize] = out;
    r?;
    if let Some(c) = plan.post {
        copy(bufs, c);
    }
    Ok(())
}

/// One iteration: `blocking_ops` blocking operations on the first buffer
/// set, or one submitted operation per buffer set, then waited for.
fn iteration<T: Sample, C: Collectives>(
    comm: &C,
    call: Call,
    plan: &Layout,
    sets: &mut [Bufs<T>],
    blocking_ops: Option<usize>,
) -> CommResult<()> {
    if let Some(ops) = blocking_ops {
        for _ in 0..ops {
            run_blocking(comm, call, plan, &mut sets[0])?;
        }
        return Ok(());
    }
    let (input, output) = plan.args;
    let mut pending = Vec::with_capacity(sets.len());
    for bufs in sets.iter_mut() {
        if let Some(c) = plan.pre {
            copy(bufs, c);
        }
        let i = input.map_or_else(Vec::new, |i| std::mem::take(&mut bufs[i as usize]));
        let o = std::mem::take(&mut bufs[output as usize]);
        pending.push(comm.submit(call, i, o)?);
    }
    for (bufs, p) in sets.iter_mut().zip(pending) {
        let (i, o) = comm.complete(p)?;
        if let Some(b) = input {
            bufs[b as usize] = i;
        }
        bufs[output as usize] = o;
        if let Some(c) = plan.post {
            copy(bufs, c);
        }
    }
    Ok(())
}

fn measure<T: Sample, C: Collectives>(
    comm: &C,
    spec: &Spec,
    shape: &Shape,
    pattern: &Pattern,
    variant: Variant,
) -> CommResult<Measured> {
    let me = comm.rank();
    let call = Call::of(spec.op, spec.redop, spec.root).ok_or_else(|| format!("{} is not benchmarked", spec.op))?;
    let plan = Layout::of(spec.op, variant, shape, me, spec.root);
    let agg = spec.agg_iters.max(1);
    let sets = if spec.blocking { 1 } else { agg };
    let mut sets: Vec<Bufs<T>> = (0..sets).map(|_| plan.lens.map(zeroed::<T>)).collect();
    let timed_ops = spec.blocking.then_some(agg);

    let warm = if spec.iters.is_none() { spec.warmup.max(1) } else { spec.warmup };
    let t = Instant::now();
    for _ in 0..warm {
        iteration(comm, call, &plan, &mut sets, timed_ops)?;
    }
    let iters = match spec.iters {
        Some(i) => i,
        None => {
            let estimate = t.elapsed().as_secs_f64() / warm as f64;
            adaptive_iters(across_ranks(comm, estimate, Average::Max)?)
        }
    };

    comm.barrier()?;
    let t = Instant::now();
    for _ in 0..iters {
        iteration(comm, call, &plan, &mut sets, timed_ops)?;
    }
    let mine = t.elapsed().as_secs_f64() / (iters.max(1) * agg) as f64;
    let time_s = across_ranks(comm, mine, spec.average)?;

    let mut wrong = None;
    if spec.check > 0 {
        let mut mine = 0u64;
        for _ in 0..spec.check {
            for bufs in sets.iter_mut() {
                fill(bufs, &plan, pattern, me);
            }
            // One operation per buffer set: a second on the same buffers
            // would reduce the result again.
            iteration(comm, call, &plan, &mut sets, spec.blocking.then_some(1))?;
            for bufs in &sets {
                let r = plan.result;
                mine += pattern.wrong(me, &bufs[r.buf as usize][r.start..r.start + r.len], shape.chunk);
            }
        }
        let mut total = [mine as i64];
        comm.all_reduce(&mut total, ReduceOp::Sum)?;
        wrong = Some(total[0].max(0) as u64);
    }
    Ok(Measured { time_s, iters, wrong, emulated: emulation(spec.op, variant).is_some() })
}

/// Poisons every buffer, then writes this rank's input where the plan
/// takes it from.
fn fill<T: Sample>(bufs: &mut Bufs<T>, plan: &Layout, pattern: &Pattern, me: usize) {
    for b in bufs.iter_mut() {
        b.fill(T::from_i64(POISON));
    }
    let r = plan.input;
    for (i, x) in bufs[r.buf as usize][r.start..r.start + r.len].iter_mut().enumerate() {
        *x = T::from_i64(pattern.input(me, i));
    }
}

/// `len` zeros, written (not just allocated: an untouched buffer reads as
/// the kernel's shared zero page, which costs no memory bandwidth and
/// flatters whatever copies out of it), on transparent huge pages when
/// large, as numpy asks for its arrays (so ringleader's numbers compare
/// with Open MPI's and gloo's through numpy and torch on equal terms).
fn zeroed<T: Sample>(len: usize) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(len);
    huge_pages(v.spare_capacity_mut());
    v.resize(len, T::from_i64(0));
    v
}

/// Asks for transparent huge pages on a large, untouched buffer.
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

/// `v` of every rank combined as `how` says; the same on every rank.
pub(crate) fn across_ranks<C: Collectives>(comm: &C, v: f64, how: Average) -> CommResult<f64> {
    let mut buf = [v];
    match how {
        Average::Rank0 => comm.broadcast(&mut buf, 0)?,
        Average::Mean => {
            comm.all_reduce(&mut buf, ReduceOp::Sum)?;
            buf[0] /= comm.world_size().max(1) as f64;
        }
        Average::Min => comm.all_reduce(&mut buf, ReduceOp::Min)?,
        Average::Max => comm.all_reduce(&mut buf, ReduceOp::Max)?,
    }
    Ok(buf[0])
}

#[cfg(test)]
mod tests {
    use super::super::sim::SimWorld;
    use super::super::spec::native;
    use super::*;

    /// The ops that move data (barrier has its own tests below).
    fn data_ops() -> impl Iterator<Item = OpKind> {
        super::super::OPS.into_iter().filter(|&op| super::super::spec::moves_data(op))
    }

    fn spec(op: OpKind, dtype: DType, redop: ReduceOp, root: usize) -> Spec {
        Spec {
            op,
            dtype,
            redop,
            root,
            sizes: vec![1, 8, 64, 1000, 4096],
            iters: Some(2),
            warmup: 1,
            agg_iters: 1,
            blocking: true,
            check: 1,
            average: Average::Max,
        }
    }

    fn run(n: usize, spec: &Spec, corrupt: bool) -> Vec<Vec<Row>> {
        SimWorld::run(n, corrupt, |comm| run_all(comm, spec, &mut |_| {}).expect("no communicator error"))
    }

    fn groups(r: &Row) -> [Group; 2] {
        [r.out_of_place.expect("out of place measured"), r.in_place.expect("in place measured")]
    }

    use super::super::report::Group;

    #[test]
    fn every_op_and_form_checks_clean_on_a_correct_communicator() {
        for n in [1, 2, 3, 4] {
            for op in data_ops() {
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
                            for g in groups(r) {
                                assert_eq!(g.nwrong, Some(0), "{op} {dtype} {redop} n={n}: {r:?}");
                            }
                            assert_eq!(r.check, "ok");
                        }
                    }
                    // Every rank agrees on every row.
                    for rows in &per_rank[1..] {
                        let key = |r: &Row| {
                            (r.bytes, r.count, r.wrong_total(), r.time_us.to_bits(), groups(r)[0].time.to_bits())
                        };
                        assert!(rows.iter().map(key).eq(per_rank[0].iter().map(key)));
                    }
                }
            }
        }
    }

    #[test]
    fn aggregated_and_non_blocking_iterations_check_clean() {
        for op in data_ops() {
            for (agg, blocking) in [(3, true), (3, false), (1, false)] {
                let mut s = spec(op, DType::I32, ReduceOp::Sum, 1);
                s.agg_iters = agg;
                s.blocking = blocking;
                s.check = 2;
                for rows in run(3, &s, false) {
                    for r in &rows {
                        assert_eq!(r.wrong_total(), 0, "{op} agg {agg} blocking {blocking}: {r:?}");
                        assert_eq!((r.agg_iters, r.blocking), (agg, blocking));
                    }
                }
            }
        }
    }

    #[test]
    fn only_the_form_the_api_lacks_is_emulated() {
        for op in data_ops() {
            let rows = run(2, &spec(op, DType::F32, ReduceOp::Sum, 0), false);
            let [oop, ip] = groups(&rows[0][0]);
            let in_place_api = matches!(op, OpKind::AllReduce | OpKind::Broadcast | OpKind::Reduce);
            assert_eq!((oop.emulated, ip.emulated), (in_place_api, !in_place_api), "{op}");
            assert_eq!(emulation(op, native(op)), None);
        }
    }

    #[test]
    fn a_wrong_result_is_counted_on_every_rank_in_both_groups() {
        for op in [OpKind::AllReduce, OpKind::AllGather, OpKind::Broadcast] {
            let s = spec(op, DType::F32, ReduceOp::Sum, 0);
            for rows in run(3, &s, true) {
                for r in &rows {
                    assert!(groups(r).iter().all(|g| g.nwrong == Some(1)), "{op}: {r:?}");
                    assert_eq!(r.check, "FAIL");
                }
            }
        }
    }

    #[test]
    fn checking_off_reports_no_wrong_count() {
        let mut s = spec(OpKind::ReduceScatter, DType::F32, ReduceOp::Sum, 0);
        s.check = 0;
        for rows in run(2, &s, true) {
            for r in &rows {
                assert!(groups(r).iter().all(|g| g.nwrong.is_none()), "{r:?}");
                assert_eq!((r.check, r.wrong), ("unchecked", None));
            }
        }
    }

    #[test]
    fn times_combine_over_ranks_as_asked() {
        // Rank r reports r + 1: rank 0's is 1, the mean 2, the min 1, the max 3.
        for (how, expect) in [(Average::Rank0, 1.0), (Average::Mean, 2.0), (Average::Min, 1.0), (Average::Max, 3.0)] {
            let got = SimWorld::run(3, false, |comm| across_ranks(comm, comm.rank() as f64 + 1.0, how).unwrap());
            assert_eq!(got, [expect; 3], "{how:?}");
            assert_eq!(Average::from_code(how.code()), Some(how));
        }
        assert_eq!(Average::from_code(4), None);
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
    fn barrier_is_one_row_in_place_with_nothing_to_check() {
        for (agg, blocking) in [(1, true), (3, true), (3, false)] {
            let mut s = spec(OpKind::Barrier, DType::F32, ReduceOp::Sum, 0);
            // What `perf --op barrier` builds: one size, 0, and no check.
            s.sizes = vec![0];
            s.check = 0;
            s.agg_iters = agg;
            s.blocking = blocking;
            for rows in run(3, &s, true) {
                assert_eq!(rows.len(), 1, "{rows:?}");
                let r = &rows[0];
                assert_eq!((r.op, r.bytes, r.count, r.native), ("barrier", 0, 0, "in_place"), "{r:?}");
                assert_eq!(r.out_of_place, None, "one form: {r:?}");
                let g = r.in_place.expect("in place measured");
                assert!(g.time > 0.0 && !g.emulated && g.iters == 2, "{r:?}");
                assert_eq!((g.alg_bw, g.bus_bw, g.nwrong), (0.0, 0.0, None), "{r:?}");
                assert_eq!((r.check, r.wrong, r.wrong_total()), ("unchecked", None, 0), "{r:?}");
                assert_eq!(r.time_us, g.time);
            }
        }
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
