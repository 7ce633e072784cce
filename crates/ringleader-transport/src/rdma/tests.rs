//! The protocol against the software model, with real concurrency: each
//! end of a link runs on a thread of its own, the model's wire threads move
//! the messages, and waits sleep on the completion channel beside the abort
//! eventfd.

use super::link::WaitError;
use super::model::{Control, Fabric};
use super::*;
use crate::driver::{Deadline, Driver, Watch};
use crate::link::{AnyLink, ReadOutcome};
use crate::plan::{Buf, Chan, OpInfo, Plan, RecvMode, Region};
use ringleader_core::{AbortSignal, DType, Error, ErrorKind, Fingerprint, OpKind, ReduceOp};
use std::io::IoSlice;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const SMALL: LinkParams = LinkParams { slots: 4, chunk: 4096 };

/// Two connected links on a fresh fabric, with the controls of their queue pairs.
fn pair(params: LinkParams) -> ((RdmaLink, Control), (RdmaLink, Control)) {
    let f = Fabric::new();
    let (qa, qb) = (f.create_qp(params.slots, params.chunk).unwrap(), f.create_qp(params.slots, params.chunk).unwrap());
    let (ca, cb) = (qa.control(), qb.control());
    let mut a = RdmaLink::new(Box::new(qa), 1, params).unwrap();
    let mut b = RdmaLink::new(Box::new(qb), 0, params).unwrap();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    a.connect(&eb).unwrap();
    b.connect(&ea).unwrap();
    ((a, ca), (b, cb))
}

fn pattern(seed: u64, n: usize) -> Vec<u8> {
    (0..n as u64).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 7) as u8).collect()
}

/// A small xorshift, so write and read sizes vary without a dependency.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Sends `out` and receives `expect_len` bytes on `link` at once, in
/// random-sized pieces, waiting on the link when neither can move.
fn exchange(link: &mut RdmaLink, out: &[u8], expect_len: usize, seed: u64) -> Vec<u8> {
    let abort = AbortSignal::new().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut rng = Rng(seed | 1);
    let (mut sent, mut got) = (0, Vec::with_capacity(expect_len));
    let mut buf = vec![0u8; 20_000];
    while sent < out.len() || got.len() < expect_len {
        let mut moved = false;
        if sent < out.len() {
            let end = (sent + 1 + rng.below(30_000)).min(out.len());
            let mid = sent + (end - sent) / 2;
            let n = link.try_write(&[IoSlice::new(&out[sent..mid]), IoSlice::new(&out[mid..end])]).unwrap();
            sent += n;
            moved |= n > 0;
        }
        if got.len() < expect_len {
            let want = (1 + rng.below(buf.len())).min(expect_len - got.len());
            if let ReadOutcome::Data(n) = link.try_read(&mut buf[..want]).unwrap() {
                got.extend_from_slice(&buf[..n]);
                moved = true;
            }
        }
        if !moved {
            match link.wait(got.len() < expect_len, sent < out.len(), &abort, deadline) {
                Ok(()) => {}
                Err(e) => {
                    panic!("wait failed: {e:?} (sent {sent} of {}, got {} of {expect_len})", out.len(), got.len())
                }
            }
        }
    }
    got
}

#[test]
fn streams_flow_both_ways_in_order_through_few_small_slots() {
    let ((mut a, ca), (mut b, _)) = pair(SMALL);
    ca.faults().delay_us.store(20, Ordering::Relaxed);
    let (da, db) = (pattern(1, 3 << 20), pattern(2, (2 << 20) + 12345));
    let (da2, db2, dblen) = (da.clone(), db.clone(), db.len());

    let ta = std::thread::spawn(move || exchange(&mut a, &da2, dblen, 7));
    let tb = std::thread::spawn(move || exchange(&mut b, &db, da.len(), 11));
    let (got_a, got_b) = (ta.join().unwrap(), tb.join().unwrap());
    assert!(got_a == db2, "a received a corrupt stream");
    assert!(got_b == pattern(1, 3 << 20), "b received a corrupt stream");
}

#[test]
fn a_one_way_stream_gets_its_credits_back_in_credit_only_messages() {
    let ((mut a, _), (mut b, _)) = pair(SMALL);
    let data = pattern(3, 1 << 20);
    let d2 = data.clone();
    let tb = std::thread::spawn(move || exchange(&mut b, &[], d2.len(), 5));
    exchange(&mut a, &data, 0, 9);
    assert!(tb.join().unwrap() == data);
}

#[test]
fn lost_credits_end_in_a_timeout_that_says_what_is_missing() {
    let ((mut a, _), (mut b, cb)) = pair(SMALL);
    cb.faults().drop_credit_only.store(true, Ordering::Relaxed);
    let abort = AbortSignal::new().unwrap();
    let data = pattern(4, 64 << 10);
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_millis(600);
        let abort = AbortSignal::new().unwrap();
        loop {
            match b.try_read(&mut buf).unwrap() {
                ReadOutcome::Data(n) => got += n,
                _ => {
                    if b.wait(true, false, &abort, deadline).is_err() {
                        return got;
                    }
                }
            }
        }
    });
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_millis(400);
    let err = loop {
        sent += a.try_write(&[IoSlice::new(&data[sent..])]).unwrap();
        if let Err(e) = a.wait(false, true, &abort, deadline) {
            break e;
        }
    };
    let start = Instant::now();
    let WaitError::TimedOut(msg) = err else { panic!("expected a timeout, got {err:?}") };
    assert!(msg.contains("rank 1") && msg.contains("of 4 receive buffers granted"), "{msg}");
    // Without credits coming back, at most slots - 1 messages went out.
    assert_eq!(sent, 3 * 4096, "{msg}");
    assert_eq!(reader.join().unwrap(), sent);
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[test]
fn abort_ends_a_wait_at_once() {
    let ((mut a, _), (_b, _)) = pair(SMALL);
    let abort = AbortSignal::new().unwrap();
    let a2 = abort.clone();
    let t = std::thread::spawn(move || {
        let start = Instant::now();
        let r = a.wait(true, false, &a2, Instant::now() + Duration::from_secs(20));
        (r, start.elapsed())
    });
    std::thread::sleep(Duration::from_millis(50));
    abort.abort(Error::aborted("rank 3 died"));
    let (r, took) = t.join().unwrap();
    match r {
        Err(WaitError::Aborted(e)) => assert_eq!(e.to_string(), "[aborted] rank 3 died"),
        other => panic!("{other:?}"),
    }
    assert!(took < Duration::from_secs(1), "{took:?}");
}

#[test]
fn an_error_completion_mid_transfer_fails_the_sender_by_name_and_sticks() {
    let ((mut a, ca), (mut b, _)) = pair(SMALL);
    ca.faults().fail_send_at.store(3, Ordering::Relaxed);
    let data = pattern(5, 40_000);
    let abort = AbortSignal::new().unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 50_000];
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_millis(500);
        loop {
            if let ReadOutcome::Data(n) = b.try_read(&mut buf).unwrap() {
                got += n;
            } else if let Err(e) = b.wait(true, false, &AbortSignal::new().unwrap(), deadline) {
                return (got, e);
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut sent = 0;
    let err = loop {
        match a.try_write(&[IoSlice::new(&data[sent..])]) {
            Ok(n) => sent += n,
            Err(e) => break e,
        }
        if sent == data.len() {
            // Everything is posted; the failure shows at the next call.
            if let Err(e) = a.try_read(&mut [0u8; 8]) {
                break e;
            }
        }
        if let Err(WaitError::Failed(e)) = a.wait(true, sent < data.len(), &abort, deadline) {
            break e;
        }
    };
    let msg = err.to_string();
    assert!(msg.contains("RDMA error completion sending message 3"), "{msg}");
    assert!(msg.contains("remote access or operation error"), "{msg}");
    assert_eq!(a.try_write(&[IoSlice::new(b"more")]).unwrap_err().to_string(), msg, "the failure sticks");
    // The receiver got the two messages before the failed one, then silence.
    let (got, e) = reader.join().unwrap();
    assert_eq!(got, 2 * 4096);
    assert!(matches!(e, WaitError::TimedOut(_)), "{e:?}");
}

#[test]
fn a_peer_that_disappears_fails_the_sender_and_abort_frees_the_reader() {
    let ((mut a, _), (b, cb)) = pair(SMALL);
    let data = pattern(6, 64 << 10);
    let abort = AbortSignal::new().unwrap();
    cb.kill();
    drop(b);
    let start = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut sent = 0;
    let err = loop {
        match a.try_write(&[IoSlice::new(&data[sent..])]) {
            Ok(n) => sent += n,
            Err(e) => break e,
        }
        match a.wait(false, true, &abort, deadline) {
            Err(WaitError::Failed(e)) => break e,
            Err(other) => panic!("{other:?}"),
            Ok(()) => {}
        }
    };
    assert!(err.to_string().contains("the peer stopped acknowledging (did it die"), "{err}");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
    assert!(start.elapsed() < Duration::from_secs(2));

    // A pure reader of a vanished peer hears nothing; the abort the monitor
    // raises when the store reports the death ends its wait.
    let ((mut r, _), (_w, cw)) = pair(SMALL);
    cw.kill();
    let a2 = abort.clone();
    let t = std::thread::spawn(move || r.wait(true, false, &a2, Instant::now() + Duration::from_secs(20)));
    std::thread::sleep(Duration::from_millis(50));
    abort.abort(Error::aborted("rank 0 died"));
    assert!(matches!(t.join().unwrap(), Err(WaitError::Aborted(_))));
}

#[test]
fn reordered_messages_and_impossible_credit_grants_are_caught() {
    let ((mut a, ca), (mut b, _)) = pair(SMALL);
    ca.faults().swap_next.store(true, Ordering::Relaxed);
    a.try_write(&[IoSlice::new(&[1u8; 5000])]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    let abort = AbortSignal::new().unwrap();
    let err = match b.wait(true, false, &abort, deadline) {
        Err(WaitError::Failed(e)) => e,
        Ok(()) => panic!("a reordered stream was delivered"),
        Err(e) => panic!("{e:?}"),
    };
    assert!(err.to_string().contains("message number 1 arrived where 0 was expected"), "{err}");

    let ((mut a, ca), (mut b, _)) = pair(SMALL);
    ca.faults().extra_credits.store(5, Ordering::Relaxed);
    a.try_write(&[IoSlice::new(b"12345678")]).unwrap();
    let err = match b.wait(true, false, &abort, deadline) {
        Err(WaitError::Failed(e)) => e,
        Ok(()) => panic!("a corrupt grant was accepted"),
        Err(e) => panic!("{e:?}"),
    };
    assert!(err.to_string().contains("granted 9 receive buffers but only 4 exist"), "{err}");
}

#[test]
fn unusable_parameters_are_refused() {
    let f = Fabric::new();
    for p in [LinkParams { slots: 2, chunk: 64 }, LinkParams { slots: 8, chunk: 12 }] {
        assert!(RdmaLink::new(Box::new(f.create_qp(p.slots, 64).unwrap()), 0, p).is_err());
    }
    let mut q = f.create_qp(4, 64).unwrap();
    let e = q.connect(&Endpoint { lid: 0, qpn: 999_999, psn: 0, gid: [0; 16] }).unwrap_err();
    assert!(e.to_string().contains("no queue pair 999999"), "{e}");
}

/// Links for a two-rank world, as the driver takes them (`links[peer][stream]`).
fn driver_links() -> (Vec<Vec<AnyLink>>, Vec<Vec<AnyLink>>) {
    let ((a, _), (b, _)) = pair(LinkParams { slots: 8, chunk: 8192 });
    (vec![vec![], vec![Box::new(a) as AnyLink]], vec![vec![Box::new(b) as AnyLink], vec![]])
}

fn run_side(
    links: &mut [Vec<AnyLink>],
    me: usize,
    data: &mut [u8],
    fp: Fingerprint,
    reduce: bool,
) -> ringleader_core::Result<()> {
    let peer = 1 - me;
    let chan = Chan { peer, stream: 0 };
    let mut plan = Plan::default();
    let half = data.len() / 2;
    // Rank 0 owns the first half, rank 1 the second: each sends its half
    // and receives (or reduces into) the other.
    let (mine, theirs) = if me == 0 { (0, half) } else { (half, 0) };
    let mode = if reduce { RecvMode::Reduce { with: None } } else { RecvMode::Copy };
    let mut scratch = vec![0u8; half];
    if reduce {
        // Reduce: send our copy of their half, and reduce theirs of ours into ours.
        plan.send(chan, Region::new(0, theirs, half), None);
        plan.recv(chan, Region::new(0, mine, half), mode, None, None);
    } else {
        plan.send(chan, Region::new(0, mine, half), None);
        plan.recv(chan, Region::new(0, theirs, half), mode, None, None);
    }
    let op = OpInfo { seq: 1, fingerprint: fp, checks: true };
    let abort = AbortSignal::new().unwrap();
    let deadline = Deadline::At(Instant::now() + Duration::from_secs(20));
    let mut bufs = [Buf::Rw(data), Buf::Rw(&mut scratch)];
    let watch = Watch { abort: &abort, deadline, awaited: &ringleader_core::RankSet::new(0), under_way: None };
    Driver::new().run(links, &mut bufs, &plan, &op, &watch)
}

#[test]
fn the_driver_runs_plans_over_rdma_links_unchanged() {
    let (mut la, mut lb) = driver_links();
    let n = 1 << 20; // f32 elements, 4 MiB
    let fp = Fingerprint::new(OpKind::AllReduce, DType::F32, n as u64).with_reduce_op(ReduceOp::Sum);
    let fill = |r: f32| -> Vec<u8> { (0..n).flat_map(|i| ((i % 1000) as f32 + r).to_le_bytes()).collect() };
    let (mut da, mut db) = (fill(0.0), fill(1.0));
    let t = std::thread::spawn(move || {
        run_side(&mut lb, 1, &mut db, fp, true).unwrap();
        (db, lb)
    });
    run_side(&mut la, 0, &mut da, fp, true).unwrap();
    let (db, mut lb) = t.join().unwrap();
    let vals = |d: &[u8]| -> Vec<f32> { d.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
    let (va, vb) = (vals(&da), vals(&db));
    for i in [0, 1, n / 2 - 1, n / 2, n - 1] {
        let want = 2.0 * (i % 1000) as f32 + 1.0;
        if i < n / 2 {
            assert_eq!(va[i], want, "rank 0 element {i}");
        } else {
            assert_eq!(vb[i], want, "rank 1 element {i}");
        }
    }
    // And a copy (all_gather-like) exchange on the same links afterwards.
    let fp = Fingerprint::new(OpKind::AllGather, DType::U8, 1000);
    let (mut da, mut db) = (vec![1u8; 2000], vec![2u8; 2000]);
    let t = std::thread::spawn(move || {
        run_side(&mut lb, 1, &mut db, fp, false).unwrap();
        db
    });
    run_side(&mut la, 0, &mut da, fp, false).unwrap();
    let db = t.join().unwrap();
    assert!(da[..1000].iter().all(|&x| x == 1) && da[1000..].iter().all(|&x| x == 2));
    assert!(db[..1000].iter().all(|&x| x == 1) && db[1000..].iter().all(|&x| x == 2));
}

#[test]
fn a_mismatch_over_rdma_is_caught_from_the_frame_header() {
    let (mut la, mut lb) = driver_links();
    let fa = Fingerprint::new(OpKind::AllGather, DType::U8, 1000);
    let fb = Fingerprint::new(OpKind::AllGather, DType::U8, 500);
    let t = std::thread::spawn(move || {
        let mut d = vec![0u8; 1000];
        run_side(&mut lb, 1, &mut d, fb, false)
    });
    let mut d = vec![0u8; 2000];
    let e = run_side(&mut la, 0, &mut d, fa, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Mismatch, "{e}");
    assert!(t.join().unwrap().is_err());
}

#[test]
fn an_error_completion_under_the_driver_names_the_peer_the_collective_and_its_number() {
    let ((a, ca), (b, _)) = pair(LinkParams { slots: 8, chunk: 8192 });
    ca.faults().fail_send_at.store(2, Ordering::Relaxed);
    let (mut la, mut lb) = (vec![vec![], vec![Box::new(a) as AnyLink]], vec![vec![Box::new(b) as AnyLink], vec![]]);
    let fp = Fingerprint::new(OpKind::AllGather, DType::U8, 100_000);
    // The receiver hears nothing after the failed message: the deadline
    // (or, in the runtime, the abort that follows rank 0's error) ends it.
    let t = std::thread::spawn(move || {
        let mut d = vec![0u8; 200_000];
        let chan = Chan { peer: 0, stream: 0 };
        let mut plan = Plan::default();
        plan.recv(chan, Region::new(0, 0, 100_000), RecvMode::Copy, None, None);
        let op = OpInfo { seq: 7, fingerprint: fp, checks: true };
        let deadline = Deadline::At(Instant::now() + Duration::from_millis(500));
        let abort = AbortSignal::new().unwrap();
        let watch = Watch { abort: &abort, deadline, awaited: &ringleader_core::RankSet::new(0), under_way: None };
        Driver::new().run(&mut lb, &mut [Buf::Rw(&mut d)], &plan, &op, &watch)
    });
    let d = vec![1u8; 100_000];
    let chan = Chan { peer: 1, stream: 0 };
    let mut plan = Plan::default();
    plan.send(chan, Region::new(0, 0, 100_000), None);
    let op = OpInfo { seq: 7, fingerprint: fp, checks: true };
    let abort = AbortSignal::new().unwrap();
    let deadline = Deadline::At(Instant::now() + Duration::from_secs(10));
    // A send completes locally once posted: the failure surfaces at the
    // next call on the link, here the goodbye-like second frame.
    plan.send(chan, Region::new(0, 0, 8), None);
    let watch = Watch { abort: &abort, deadline, awaited: &ringleader_core::RankSet::new(0), under_way: None };
    let e = Driver::new().run(&mut la, &mut [Buf::Ro(&d)], &plan, &op, &watch).unwrap_err();
    let s = e.to_string();
    assert_eq!(e.kind(), ErrorKind::PeerDied, "{s}");
    assert!(
        s.contains("rank 1") && s.contains("all_gather #7") && s.contains("RDMA error completion sending message 2"),
        "{s}"
    );
    assert_eq!((e.ranks(), e.seq()), (vec![1], Some(7)));
    assert_eq!(t.join().unwrap().unwrap_err().kind(), ErrorKind::Timeout);
}
