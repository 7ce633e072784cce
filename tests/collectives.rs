//! Every collective x dtype x world size x size, between real processes
//! over real sockets, checked against a reference each rank computes itself.
#![allow(missing_docs)]

mod common;

use common::*;
use ringleader::{bf16, f16, Communicator, Element, ReduceOp};

/// Values that every dtype holds exactly, sums included (|sum| <= 80).
fn val(rank: usize, i: usize) -> i64 {
    ((rank * 7 + i * 3) % 11) as i64 - 5
}

/// Factors for products: powers of two stay exact in every float type.
fn factor(rank: usize, i: usize) -> i64 {
    1 + ((rank + i) % 2) as i64
}

trait TestElem: Element + Copy + PartialOrd {
    fn of(v: i64) -> Self;
    /// `sum / n` as ringleader's `Avg` computes it in this type.
    fn avg(sum: i64, n: usize) -> Self;
}

macro_rules! ints {
    ($($t:ty),*) => {$(impl TestElem for $t {
        fn of(v: i64) -> Self { v as $t }
        fn avg(sum: i64, n: usize) -> Self { (sum as $t).wrapping_div(n as $t) }
    })*};
}
ints!(i8, i32, i64);
impl TestElem for u8 {
    fn of(v: i64) -> Self {
        v as u8
    }
    fn avg(sum: i64, n: usize) -> Self {
        (sum as u8).wrapping_div(n as u8)
    }
}
impl TestElem for f32 {
    fn of(v: i64) -> Self {
        v as f32
    }
    fn avg(sum: i64, n: usize) -> Self {
        sum as f32 / n as f32
    }
}
impl TestElem for f64 {
    fn of(v: i64) -> Self {
        v as f64
    }
    fn avg(sum: i64, n: usize) -> Self {
        sum as f64 / n as f64
    }
}
impl TestElem for f16 {
    fn of(v: i64) -> Self {
        f16::from_f32(v as f32)
    }
    fn avg(sum: i64, n: usize) -> Self {
        f16::from_f32(sum as f32 / n as f32)
    }
}
impl TestElem for bf16 {
    fn of(v: i64) -> Self {
        bf16::from_f32(v as f32)
    }
    fn avg(sum: i64, n: usize) -> Self {
        bf16::from_f32(sum as f32 / n as f32)
    }
}

struct Checker {
    failures: Vec<String>,
    ran: usize,
}

impl Checker {
    fn check<T: TestElem>(&mut self, what: &str, got: &[T], want: impl Fn(usize) -> T) {
        self.ran += 1;
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want(i)) {
            self.failures.push(format!("{what} [{}]: element {i} is {:?}, want {:?}", T::DTYPE, got[i], want(i)));
        }
    }
}

fn reduce_ref<T: TestElem>(n: usize, i: usize, op: ReduceOp) -> T {
    let vals = || (0..n).map(move |r| val(r, i));
    match op {
        ReduceOp::Sum => T::of(vals().sum()),
        ReduceOp::Avg => T::avg(vals().sum(), n),
        // In the type's own order: u8 holds -5 as 251.
        ReduceOp::Min => vals().map(T::of).reduce(|a, b| if b < a { b } else { a }).unwrap(),
        ReduceOp::Max => vals().map(T::of).reduce(|a, b| if b > a { b } else { a }).unwrap(),
        ReduceOp::Prod => T::of((0..n).map(|r| factor(r, i)).product()),
    }
}

fn input<T: TestElem>(rank: usize, len: usize, op: ReduceOp) -> Vec<T> {
    (0..len).map(|i| T::of(if op == ReduceOp::Prod { factor(rank, i) } else { val(rank, i) })).collect()
}

fn matrix_for<T: TestElem>(c: &Communicator, ck: &mut Checker, sizes: &[usize]) -> ringleader::Result<()> {
    let (r, n) = (c.rank(), c.world_size());
    for &len in sizes {
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg] {
            let mut buf = input::<T>(r, len, op);
            c.all_reduce(&mut buf, op)?;
            ck.check(&format!("all_reduce {op} len {len}"), &buf, |i| reduce_ref::<T>(n, i, op));
        }
        for op in [ReduceOp::Sum, ReduceOp::Avg] {
            let inp = input::<T>(r, len * n, op);
            let mut out = vec![T::of(0); len];
            c.reduce_scatter(&inp, &mut out, op)?;
            ck.check(&format!("reduce_scatter {op} len {len}"), &out, |i| reduce_ref::<T>(n, r * len + i, op));
            ck.check(&format!("reduce_scatter input kept len {len}"), &inp, |i| T::of(val(r, i)));
        }
        let inp = input::<T>(r, len, ReduceOp::Sum);
        let mut out = vec![T::of(0); len * n];
        c.all_gather(&inp, &mut out)?;
        ck.check(&format!("all_gather len {len}"), &out, |i| T::of(val(i / len.max(1), i % len.max(1))));
        for root in [0, n - 1] {
            let mut buf = input::<T>(r, len, ReduceOp::Sum);
            c.broadcast(&mut buf, root)?;
            ck.check(&format!("broadcast root {root} len {len}"), &buf, |i| T::of(val(root, i)));
            let mut buf = input::<T>(r, len, ReduceOp::Sum);
            c.reduce(&mut buf, root, ReduceOp::Max)?;
            if r == root {
                ck.check(&format!("reduce root {root} len {len}"), &buf, |i| reduce_ref::<T>(n, i, ReduceOp::Max));
            } else {
                ck.check(&format!("reduce non-root kept len {len}"), &buf, |i| T::of(val(r, i)));
            }
        }
        let inp = input::<T>(r, len * n, ReduceOp::Sum);
        let mut out = vec![T::of(0); len * n];
        c.all_to_all(&inp, &mut out)?;
        // Segment j of the output is segment r of rank j's input.
        ck.check(&format!("all_to_all len {len}"), &out, |i| T::of(val(i / len.max(1), r * len + i % len.max(1))));
        if n > 1 {
            // Ring of sends: async send right, receive from the left.
            let work = c.send_async(input::<T>(r, len, ReduceOp::Sum), (r + 1) % n)?;
            let mut got = vec![T::of(0); len];
            c.recv(&mut got, (r + n - 1) % n)?;
            work.into_inner()?;
            ck.check(&format!("send/recv len {len}"), &got, |i| T::of(val((r + n - 1) % n, i)));
        }
        c.barrier()?;
    }
    Ok(())
}

fn matrix(sizes: &[usize]) -> i32 {
    let c = Communicator::from_env().expect("init");
    let mut ck = Checker { failures: Vec::new(), ran: 0 };
    let r = (|| {
        matrix_for::<f32>(&c, &mut ck, sizes)?;
        matrix_for::<f64>(&c, &mut ck, sizes)?;
        matrix_for::<f16>(&c, &mut ck, sizes)?;
        matrix_for::<bf16>(&c, &mut ck, sizes)?;
        matrix_for::<i8>(&c, &mut ck, sizes)?;
        matrix_for::<u8>(&c, &mut ck, sizes)?;
        matrix_for::<i32>(&c, &mut ck, sizes)?;
        matrix_for::<i64>(&c, &mut ck, sizes)
    })();
    if let Err(e) = r {
        println!("FAIL collective error: {e}");
        return 1;
    }
    for f in &ck.failures {
        println!("FAIL {f}");
    }
    println!("CHECKED {}", ck.ran);
    c.destroy().unwrap();
    i32::from(!ck.failures.is_empty())
}

fn async_scenario() -> i32 {
    let c = Communicator::from_env().expect("init");
    let n = c.world_size();
    // Several operations in flight at once complete in submission order.
    let works: Vec<_> = (0..8)
        .map(|k| c.all_reduce_async(vec![k as f32 + c.rank() as f32; 1000 + k], ReduceOp::Sum).unwrap())
        .collect();
    let barrier = c.barrier_async().unwrap();
    let mut ok = true;
    for (k, w) in works.into_iter().enumerate() {
        let v = w.into_inner().unwrap();
        let want = (0..n).map(|r| k as f32 + r as f32).sum::<f32>();
        ok &= v.len() == 1000 + k && v.iter().all(|x| *x == want);
    }
    barrier.wait(None).unwrap();
    assert!(barrier.is_completed());
    // A sync call queued behind async work waits its turn.
    let w = c.all_gather_async(vec![c.rank() as i32; 3], vec![0; 3 * n]).unwrap();
    let mut x = [1i64];
    c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
    let (_, out) = w.into_inner().unwrap();
    ok &= x[0] == n as i64 && out == (0..n).flat_map(|r| [r as i32; 3]).collect::<Vec<_>>();
    println!("ASYNC {}", if ok { "ok" } else { "wrong" });
    c.destroy().unwrap();
    i32::from(!ok)
}

/// Two threads of each rank call into one communicator at once, one
/// blocking (inline when the communicator is idle) and one queueing
/// background calls, so that inline claims, queued operations and claims
/// that find an operation queued meanwhile race (see `sched.rs`). Every
/// call has the same shape, so ranks may pair them in any order; each must
/// complete with the right sum, numbered without a gap.
fn threads_scenario() -> i32 {
    const CALLS: usize = 3000;
    let c = std::sync::Arc::new(Communicator::from_env().expect("init"));
    let n = c.world_size() as f32;
    let blocking = {
        let c = c.clone();
        std::thread::spawn(move || {
            let mut wrong = 0;
            let unused = [0u8; 16];
            for i in 0..CALLS {
                let mut x = [1.0f32; 2];
                // The same all_reduce as the other thread's, but described
                // anew each time: an all_reduce reads no input, yet its
                // input count is part of the call's shape, and 12 shapes
                // in turn outnumber those the engine keeps. Working one
                // out takes a while after the claim, which widens the
                // window for the other thread to queue before this call
                // is numbered.
                let call = ringleader::Call {
                    op: ringleader::RawOp::AllReduce { op: ReduceOp::Sum },
                    dtype: ringleader::DType::F32,
                    input: unused.as_ptr(),
                    input_count: 1 + i % 12,
                    output: x.as_mut_ptr().cast(),
                    output_count: 2,
                    site: None,
                };
                // SAFETY: `x` is valid for the call's 2 elements, `unused`
                // (never read) for 16 bytes, and neither is touched
                // elsewhere while the call runs.
                #[allow(unsafe_code)]
                unsafe { c.call_raw(call) }.unwrap();
                wrong += usize::from(x != [n; 2]);
            }
            wrong
        })
    };
    let mut wrong = 0;
    let mut left = CALLS;
    while left > 0 {
        // One or two in flight at a time.
        let k = 1 + left % 2;
        let works: Vec<_> =
            (0..k.min(left)).map(|_| c.all_reduce_async(vec![1.0f32; 2], ReduceOp::Sum).unwrap()).collect();
        left -= works.len();
        for w in works {
            wrong += usize::from(w.into_inner().unwrap() != vec![n; 2]);
        }
    }
    wrong += blocking.join().unwrap();
    // Every number once, none skipped, up to the last. (Records of calls
    // the two threads submit at the same moment may swap places in the
    // recorder: it lists them in the order they were recorded.)
    let entries = c.flight_recorder();
    let mut seqs: Vec<u64> = entries.iter().map(|e| e.collective_seq_id).collect();
    seqs.sort_unstable();
    let contiguous = seqs.windows(2).all(|w| w[1] == w[0] + 1) && seqs.last() == Some(&(2 * CALLS as u64));
    // Each one recorded whole: started, then completed no earlier (a small
    // call that never waited is recorded in one write, after it ended).
    let whole = entries.iter().all(|e| {
        e.state == ringleader::State::Completed
            && e.time_discovered_started_ns.is_some_and(|s| s >= e.time_created_ns)
            && e.time_discovered_completed_ns >= e.time_discovered_started_ns
            && e.fingerprint.count == 2
    });
    println!("THREADS wrong={wrong} contiguous={contiguous} whole={whole}");
    let c = std::sync::Arc::into_inner(c).expect("the threads are done");
    c.destroy().unwrap();
    i32::from(wrong > 0 || !contiguous || !whole)
}

/// Sends and receives between ranks 0 and 1, blocking (run on the caller's
/// thread when nothing is queued ahead) and background (run on the lane)
/// mixed in one direction's order, small frames and frames larger than a
/// ring (which a blocking call hands to the lane part-moved), a receive
/// posted long before its data, and a ping-pong; every message carries
/// its index, checked on arrival. Other ranks only join and leave.
fn p2p_mix_scenario() -> i32 {
    let c = Communicator::from_env().expect("init");
    let (r, big) = (c.rank(), (1usize << 20) + 3);
    let len = |k: usize| if k % 3 == 2 { big } else { 8 + k };
    let mut wrong = 0usize;
    const K: usize = 24;
    if r == 0 {
        let mut pending = Vec::new();
        for k in 0..K {
            let msg = vec![k as f32; len(k)];
            if k % 2 == 0 {
                c.send(&msg, 1).unwrap();
            } else {
                pending.push(c.send_async(msg, 1).unwrap());
            }
        }
        for w in pending {
            w.wait(None).unwrap();
        }
        // Rank 1 is already waiting in its receive.
        std::thread::sleep(std::time::Duration::from_millis(200));
        c.send(&[42.0f64; 3], 1).unwrap();
        let mut x = [0i32; 2];
        for i in 0..5000i32 {
            c.send(&[i, i + 1], 1).unwrap();
            c.recv(&mut x, 1).unwrap();
            wrong += usize::from(x != [i + 1, i + 2]);
        }
    } else if r == 1 {
        let mut pending = Vec::new();
        for k in 0..K {
            if k % 4 == 1 {
                pending.push((k, c.recv_async(vec![0.0f32; len(k)], 0).unwrap()));
                continue;
            }
            for (j, w) in pending.drain(..) {
                let got = w.into_inner().unwrap();
                wrong += usize::from(got.len() != len(j) || got.iter().any(|v| *v != j as f32));
            }
            let mut got = vec![0.0f32; len(k)];
            c.recv(&mut got, 0).unwrap();
            wrong += usize::from(got.iter().any(|v| *v != k as f32));
        }
        for (j, w) in pending.drain(..) {
            let got = w.into_inner().unwrap();
            wrong += usize::from(got.len() != len(j) || got.iter().any(|v| *v != j as f32));
        }
        let mut late = [0.0f64; 3];
        c.recv(&mut late, 0).unwrap();
        wrong += usize::from(late != [42.0; 3]);
        let mut x = [0i32; 2];
        for i in 0..5000i32 {
            c.recv(&mut x, 0).unwrap();
            wrong += usize::from(x != [i, i + 1]);
            c.send(&[x[0] + 1, x[1] + 1], 0).unwrap();
        }
    }
    c.barrier().unwrap();
    // Each send and receive recorded, completed.
    let p2p: Vec<_> = c.flight_recorder().into_iter().filter(|e| e.collective_seq_id == 0).collect();
    let whole = p2p.iter().all(|e| e.state == ringleader::State::Completed);
    println!("P2P wrong={wrong} whole={whole} recorded={}", p2p.len());
    c.destroy().unwrap();
    i32::from(wrong > 0 || !whole)
}

/// Entry point of worker processes (a no-op in a normal test run).
#[test]
fn worker() {
    let Some(s) = scenario() else { return };
    let code = match s.as_str() {
        "matrix_small" => matrix(&[0, 1, 7, 1000]),
        "matrix_large" => matrix(&[(1 << 20) + 3]),
        "async" => async_scenario(),
        "threads" => threads_scenario(),
        "p2p_mix" => p2p_mix_scenario(),
        other => panic!("unknown scenario {other}"),
    };
    std::process::exit(code);
}

fn run_matrix(world: usize, scenario: &str, transport: &str, limit: u64) {
    run_matrix_with(world, scenario, transport, limit, &[]);
}

fn run_matrix_with(world: usize, scenario: &str, transport: &str, limit: u64, env: &[(&str, &str)]) {
    let mut spec = JobSpec::new(world, scenario).env("RINGLEADER_TRANSPORT", transport).limit(limit);
    for (k, v) in env {
        spec = spec.env(k, v);
    }
    let outs = run(spec);
    assert_all_ok(&outs);
    for o in &outs {
        assert!(o.lines("CHECKED").first().is_some_and(|c| c.parse::<usize>().unwrap() > 0), "{}", o.stdout);
    }
}

#[test]
fn every_op_dtype_and_small_size_on_1_2_3_4_5_8_ranks_over_tcp() {
    for world in [1, 2, 3, 4, 5, 8] {
        run_matrix(world, "matrix_small", "tcp", 120);
    }
}

#[test]
fn every_op_dtype_and_small_size_on_1_2_3_4_5_8_ranks_over_shared_memory() {
    for world in [1, 2, 3, 4, 5, 8] {
        run_matrix(world, "matrix_small", "shm", 120);
    }
}

#[test]
fn every_op_and_dtype_at_2_pow_20_plus_3_on_1_2_3_4_5_8_ranks_over_tcp() {
    for world in [1, 2, 3, 4, 5, 8] {
        run_matrix(world, "matrix_large", "tcp", 240);
    }
}

#[test]
fn every_op_and_dtype_at_2_pow_20_plus_3_on_1_2_3_4_5_8_ranks_over_shared_memory() {
    // Even world sizes move every frame from 4 KiB on single-copy (straight
    // from the sender's memory); odd ones keep the default (1 MiB), so
    // most of their frames go through the rings.
    for world in [1, 2, 3, 4, 5, 8] {
        let single_copy = if world % 2 == 0 { "4K" } else { "1M" };
        run_matrix_with(world, "matrix_large", "shm", 240, &[("RINGLEADER_SHM_SINGLE_COPY", single_copy)]);
    }
}

#[test]
fn blocking_and_background_sends_and_receives_keep_their_order_over_both_transports() {
    for transport in ["shm", "tcp"] {
        for world in [2, 3] {
            let outs = run(JobSpec::new(world, "p2p_mix").env("RINGLEADER_TRANSPORT", transport).limit(120));
            assert_all_ok(&outs);
            for o in &outs[..2] {
                let line = &o.lines("P2P")[0];
                assert!(line.starts_with("wrong=0 whole=true"), "{transport} x{world} rank {}: {line}", o.rank);
            }
        }
    }
}

#[test]
fn forced_recursive_doubling_on_large_messages_completes_over_both_transports() {
    // Whole-buffer exchanges used to wait on each other once a message
    // outgrew the transport's buffers (a timeout, never a result).
    for (world, transport) in [(2, "tcp"), (3, "shm")] {
        run_matrix_with(
            world,
            "matrix_large",
            transport,
            120,
            &[("RINGLEADER_ALGO", "rd"), ("RINGLEADER_TIMEOUT", "20")],
        );
    }
}

#[test]
fn several_streams_per_peer_over_both_transports() {
    for transport in ["tcp", "shm"] {
        let outs = run(JobSpec::new(3, "matrix_small")
            .env("RINGLEADER_TRANSPORT", transport)
            .env("RINGLEADER_STREAMS", "3")
            .limit(120));
        assert_all_ok(&outs);
    }
}

#[test]
fn no_shared_memory_segment_outlives_the_job() {
    let before = shm_files();
    let outs = run(JobSpec::new(3, "async").env("RINGLEADER_TRANSPORT", "shm").limit(60));
    assert_all_ok(&outs);
    let leaked: Vec<_> = shm_files().into_iter().filter(|f| !before.contains(f)).collect();
    assert!(leaked.is_empty(), "left behind: {leaked:?}");
}

fn shm_files() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with("rl-")).collect()
        })
        .unwrap_or_default()
}

#[test]
fn async_operations_complete_in_order() {
    let outs = run(JobSpec::new(3, "async").limit(60));
    assert_all_ok(&outs);
}

#[test]
fn threads_racing_blocking_and_background_calls_complete_in_one_order() {
    for transport in ["shm", "tcp"] {
        let outs = run(JobSpec::new(2, "threads").env("RINGLEADER_TRANSPORT", transport).limit(120));
        assert_all_ok(&outs);
        for o in &outs {
            assert_eq!(o.lines("THREADS"), vec!["wrong=0 contiguous=true whole=true".to_string()], "{}", o.stderr);
        }
    }
}

#[test]
fn rank0_can_host_the_store() {
    let outs = run(JobSpec::new(3, "async").env("RINGLEADER_TRANSPORT", "tcp").rank0_hosts_store().limit(60));
    assert_all_ok(&outs);
}
