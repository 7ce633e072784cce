//! The driver over real links: shared-memory pairs and loopback TCP pairs
//! in one process, exercising single copy, splicing and their failure paths.

use super::*;
use crate::link::AnyLink;
use crate::plan::{RecvMode, Region};
use crate::shm::{test_pair, ShmLink, Waiter};
use ringleader_core::{DType, Error, Fingerprint, OpKind};
use std::time::Duration;

const MIB: usize = 1 << 20;

fn op() -> OpInfo {
    OpInfo { seq: 1, fingerprint: Fingerprint::new(OpKind::AllReduce, DType::U8, 3), checks: true }
}

/// One rank of a shared-memory pair: its driver, links and buffers.
struct Side {
    driver: Driver,
    links: Vec<Vec<AnyLink>>,
    abort: AbortSignal,
}

fn side(me: Rank, link: ShmLink, waiter: Waiter) -> Side {
    side_idle(me, link, waiter, Idle::Spin(Duration::from_micros(20)))
}

/// [`side`], waiting by `idle`.
fn side_idle(me: Rank, link: ShmLink, waiter: Waiter, idle: Idle) -> Side {
    let mut driver = Driver::new();
    let abort = AbortSignal::new().unwrap();
    waiter.wake_on(&abort);
    driver.set_shm(waiter, idle);
    let mut links: Vec<Vec<AnyLink>> = vec![Vec::new(), Vec::new()];
    links[1 - me] = vec![Box::new(link)];
    Side { driver, links, abort }
}

impl Side {
    fn run(&mut self, bufs: &mut [Buf<'_>], plan: &Plan, within: Duration) -> Result<()> {
        self.run_op(bufs, plan, within, &op())
    }

    fn run_op(&mut self, bufs: &mut [Buf<'_>], plan: &Plan, within: Duration, op: &OpInfo) -> Result<()> {
        self.run_watched(bufs, plan, within, op, None)
    }

    /// [`Side::run_op`] with `under_way` as the watch's bookkeeping.
    fn run_watched(
        &mut self,
        bufs: &mut [Buf<'_>],
        plan: &Plan,
        within: Duration,
        op: &OpInfo,
        under_way: Option<&dyn Fn()>,
    ) -> Result<()> {
        let deadline = Deadline::At(Instant::now() + within);
        let watch = Watch { abort: &self.abort, deadline, awaited: &RankSet::new(0), under_way };
        self.driver.run(&mut self.links, bufs, plan, op, &watch)
    }

    fn acked(&self) -> u64 {
        let link = self.links.iter().flatten().next().expect("one link");
        link.single_copy().expect("shared memory").acked()
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Both ranks send `len` bytes of buffer 0 and receive the peer's into
/// buffer 1, copied or reduced (u8 sum into the pattern already there).
fn exchange(mode: RecvMode, len: usize) -> Plan {
    let chan = Chan { peer: 0, stream: 0 };
    let mut plan = Plan::default();
    plan.send(chan, Region::new(0, 0, len), None);
    plan.recv(chan, Region::new(1, 0, len), mode, None, None);
    plan
}

fn for_peer(mut plan: Plan, peer: Rank) -> Plan {
    plan.sends.iter_mut().for_each(|s| s.chan.peer = peer);
    plan.recvs.iter_mut().for_each(|r| r.chan.peer = peer);
    plan
}

/// One rank's half of [`exchange`]: sends `pattern(seed_in)`, receives
/// into `pattern(seed_out)`; returns what it ends with and its acks.
fn exchange_side(
    me: Rank,
    link: ShmLink,
    waiter: Waiter,
    mode: RecvMode,
    len: usize,
    seeds: (u8, u8),
) -> (Vec<u8>, u64) {
    let mut s = side(me, link, waiter);
    let input = pattern(seeds.0, len);
    let mut out = pattern(seeds.1, len);
    let plan = for_peer(exchange(mode, len), 1 - me);
    s.run(&mut [Buf::Ro(&input), Buf::Rw(&mut out)], &plan, Duration::from_secs(20)).unwrap();
    (out, s.acked())
}

#[test]
fn large_frames_between_busy_ranks_go_single_copy_copied_and_reduced() {
    for (run, mode) in [("t-drv-copy", RecvMode::Copy), ("t-drv-red", RecvMode::Reduce { with: None })] {
        let (a, b, wa, wb) = test_pair(run);
        let len = 3 * MIB + 8;
        let t = std::thread::spawn(move || exchange_side(1, b, wb, mode, len, (1, 7)));
        let (out, acked) = exchange_side(0, a, wa, mode, len, (2, 9));
        let (out_b, acked_b) = t.join().unwrap();
        let want = |from: &[u8], had: &[u8]| -> Vec<u8> {
            match mode {
                RecvMode::Copy => from.to_vec(),
                RecvMode::Reduce { .. } => from.iter().zip(had).map(|(x, y)| x.wrapping_add(*y)).collect(),
            }
        };
        assert!(out == want(&pattern(1, len), &pattern(9, len)), "rank 0 got wrong bytes ({mode:?})");
        assert!(out_b == want(&pattern(2, len), &pattern(7, len)), "rank 1 got wrong bytes ({mode:?})");
        // Each side's one frame went single-copy and was acknowledged.
        assert_eq!((acked, acked_b), (1, 1), "{mode:?}");
    }
}

/// One rank of a TCP pair that splices frames from 64 KiB on.
fn tcp_side(me: Rank, link: crate::tcp::TcpLink) -> Side {
    let mut driver = Driver::new();
    driver.set_splice_min(Some(64 << 10));
    let mut links: Vec<Vec<AnyLink>> = vec![Vec::new(), Vec::new()];
    links[1 - me] = vec![Box::new(link)];
    Side { driver, links, abort: AbortSignal::new().unwrap() }
}

#[test]
fn a_spliced_send_returns_only_once_the_receiver_has_the_bytes() {
    // The sender also receives (a rank that only sends does not splice),
    // and the receiver starts late, so the whole frame waits in the
    // sockets, still in the sender's pages, while the sender has its own
    // receive at once. The sender then reuses its buffer as a caller
    // would: the receiver must still get the bytes of the call, which only
    // the wait for its acknowledgement ensures.
    let (a, b) = crate::tcp::test_pair();
    let len = 3 * MIB + 8;
    let t = std::thread::spawn(move || {
        let mut s = tcp_side(1, b);
        std::thread::sleep(Duration::from_millis(300));
        let (word, mut out) = ([7u8; 8], vec![0u8; len]);
        let mut plan = Plan::default();
        plan.send(Chan { peer: 0, stream: 0 }, Region::new(0, 0, 8), None);
        plan.recv(Chan { peer: 0, stream: 0 }, Region::new(1, 0, len), RecvMode::Copy, None, None);
        s.run(&mut [Buf::Ro(&word), Buf::Rw(&mut out)], &plan, Duration::from_secs(10)).unwrap();
        out
    });
    let mut s = tcp_side(0, a);
    let (mut data, mut word) = (pattern(3, len), [0u8; 8]);
    let mut plan = Plan::default();
    plan.send(Chan { peer: 1, stream: 0 }, Region::new(0, 0, len), None);
    plan.recv(Chan { peer: 1, stream: 0 }, Region::new(1, 0, 8), RecvMode::Copy, None, None);
    s.run(&mut [Buf::Rw(&mut data), Buf::Rw(&mut word)], &plan, Duration::from_secs(10)).unwrap();
    data.iter_mut().for_each(|x| *x = 0xff);
    assert_eq!(word, [7; 8]);
    assert!(t.join().unwrap() == pattern(3, len), "the receiver saw the buffer change");
}

#[test]
fn a_rank_that_only_sends_copies_into_the_socket_rather_than_splice() {
    // A broadcast's root: splicing would hold it until the receiver
    // acknowledged the frame, where a copy into the socket lets it go on.
    // The receiver reads only once the sender's run has returned, so a
    // spliced frame would keep the sender waiting for an acknowledgement
    // that cannot come, until its deadline. The sender's socket has room
    // for the whole frame, as data connections ask for.
    let (a, b) = crate::tcp::test_pair_sized(Some(4 << 20));
    let len = MIB;
    let (returned, go) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let mut s = tcp_side(1, b);
        go.recv_timeout(Duration::from_secs(20)).expect("the sender's run returned");
        let mut out = vec![0u8; len];
        let mut plan = Plan::default();
        plan.recv(Chan { peer: 0, stream: 0 }, Region::new(0, 0, len), RecvMode::Copy, None, None);
        s.run(&mut [Buf::Rw(&mut out)], &plan, Duration::from_secs(10)).unwrap();
        out
    });
    let mut s = tcp_side(0, a);
    let data = pattern(4, len);
    let mut plan = Plan::default();
    plan.send(Chan { peer: 1, stream: 0 }, Region::new(0, 0, len), None);
    let r = s.run(&mut [Buf::Ro(&data)], &plan, Duration::from_secs(5));
    let _ = returned.send(());
    r.expect("a rank that only sends returns once its frame is in the socket");
    assert!(t.join().unwrap() == data);
}

#[test]
fn spliced_frames_both_ways_interleave_their_acknowledgements() {
    // Four 1 MiB frames each way, copied and reduced: every frame is
    // spliced, and each side's acknowledgements come between the
    // other's data frames.
    for mode in [RecvMode::Copy, RecvMode::Reduce { with: None }] {
        let (a, b) = crate::tcp::test_pair();
        let plan = move |peer| {
            let chan = Chan { peer, stream: 0 };
            let mut plan = Plan::default();
            for k in 0..4 {
                plan.send(chan, Region::new(0, k * MIB, MIB), None);
                plan.recv(chan, Region::new(1, k * MIB, MIB), mode, None, None);
            }
            plan
        };
        let side_run = move |me: Rank, link, seeds: (u8, u8)| {
            let mut s = tcp_side(me, link);
            let input = pattern(seeds.0, 4 * MIB);
            let mut out = pattern(seeds.1, 4 * MIB);
            for _ in 0..3 {
                out = pattern(seeds.1, 4 * MIB);
                s.run(&mut [Buf::Ro(&input), Buf::Rw(&mut out)], &plan(1 - me), Duration::from_secs(20)).unwrap();
            }
            out
        };
        let t = std::thread::spawn(move || side_run(1, b, (1, 7)));
        let out = side_run(0, a, (2, 9));
        let out_b = t.join().unwrap();
        let want = |from: Vec<u8>, had: Vec<u8>| -> Vec<u8> {
            match mode {
                RecvMode::Copy => from,
                RecvMode::Reduce { .. } => from.iter().zip(&had).map(|(x, y)| x.wrapping_add(*y)).collect(),
            }
        };
        assert!(out == want(pattern(1, 4 * MIB), pattern(9, 4 * MIB)), "rank 0 got wrong bytes ({mode:?})");
        assert!(out_b == want(pattern(2, 4 * MIB), pattern(7, 4 * MIB)), "rank 1 got wrong bytes ({mode:?})");
    }
}

#[test]
fn a_send_a_receive_waits_for_and_a_sender_that_only_sends_use_the_ring() {
    // Recursive doubling's swap: each rank reduces into the buffer it
    // sends, so its receive waits for its own send. Single copy would
    // wait for the peer's receive: both would wait forever.
    let (a, b, wa, wb) = test_pair("t-drv-gate");
    let len = MIB;
    let swap = move |peer| {
        let chan = Chan { peer, stream: 0 };
        let mut plan = Plan::default();
        let sent = plan.send(chan, Region::new(0, 0, len), None);
        plan.recv(chan, Region::new(0, 0, len), RecvMode::Reduce { with: None }, None, Some(sent));
        plan
    };
    let t = std::thread::spawn(move || {
        let mut s = side(1, b, wb);
        let mut buf = vec![1u8; len];
        s.run(&mut [Buf::Rw(&mut buf)], &swap(0), Duration::from_secs(10)).unwrap();
        // A rank that only receives...
        let mut got = vec![0u8; 2 * MIB];
        let mut plan = Plan::default();
        plan.recv(Chan { peer: 0, stream: 0 }, Region::new(0, 0, 2 * MIB), RecvMode::Copy, None, None);
        s.run(&mut [Buf::Rw(&mut got)], &plan, Duration::from_secs(10)).unwrap();
        (buf, got)
    });
    let mut s = side(0, a, wa);
    let mut buf = vec![2u8; len];
    s.run(&mut [Buf::Rw(&mut buf)], &swap(1), Duration::from_secs(10)).unwrap();
    // ...from one that only sends (a broadcast's root): through the ring.
    let data = pattern(5, 2 * MIB);
    let mut plan = Plan::default();
    plan.send(Chan { peer: 1, stream: 0 }, Region::new(0, 0, 2 * MIB), None);
    s.run(&mut [Buf::Ro(&data)], &plan, Duration::from_secs(10)).unwrap();
    let (buf_b, got) = t.join().unwrap();
    assert!(buf.iter().chain(&buf_b).all(|&x| x == 3));
    assert!(got == data);
    assert_eq!(s.acked(), 0, "nothing went single-copy");
}

#[test]
fn a_sender_that_fails_abandons_its_single_copy_frames() {
    let (a, b, wa, wb) = test_pair("t-drv-abandon");
    let len = MIB;
    let mut s = side(0, a, wa);
    let input = pattern(3, len);
    let mut out = vec![0u8; len];
    // Rank 1 is not there yet: rank 0 posts its frame and times out.
    let e = s
        .run(
            &mut [Buf::Ro(&input), Buf::Rw(&mut out)],
            &for_peer(exchange(RecvMode::Copy, len), 1),
            Duration::from_millis(200),
        )
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    // Rank 1 then finds the descriptor, but must not trust what it reads.
    let mut r = side(1, b, wb);
    let mut got = vec![0u8; len];
    let mut plan = Plan::default();
    plan.recv(Chan { peer: 0, stream: 0 }, Region::new(0, 0, len), RecvMode::Copy, None, None);
    let e = r.run(&mut [Buf::Rw(&mut got)], &plan, Duration::from_secs(5)).unwrap_err();
    assert!(e.to_string().contains("gave up on the transfer"), "{e}");
}

/// Frames of these sizes each way, in this order: small ones fit a
/// fastbox, the 1 MiB one does not.
const MIXED: [usize; 6] = [8, 16, MIB, 24, 0, 80];

/// Both ranks send [`MIXED`]'s frames of buffer 0 and receive the peer's
/// into buffer 1, alternately copied and reduced.
fn mixed(peer: Rank) -> Plan {
    let chan = Chan { peer, stream: 0 };
    let mut plan = Plan::default();
    let mut off = 0;
    for (k, len) in MIXED.into_iter().enumerate() {
        plan.send(chan, Region::new(0, off, len), None);
        let mode = if k % 2 == 0 { RecvMode::Copy } else { RecvMode::Reduce { with: None } };
        plan.recv(chan, Region::new(1, off, len), mode, None, None);
        off += len;
    }
    plan
}

fn mixed_want(from: &[u8], had: &[u8]) -> Vec<u8> {
    let mut want = Vec::new();
    let mut off = 0;
    for (k, len) in MIXED.into_iter().enumerate() {
        let (f, h) = (&from[off..off + len], &had[off..off + len]);
        match k % 2 {
            0 => want.extend_from_slice(f),
            _ => want.extend(f.iter().zip(h).map(|(x, y)| x.wrapping_add(*y))),
        }
        off += len;
    }
    want
}

#[test]
fn small_frames_go_through_fastboxes_in_order_with_ring_frames() {
    // Single copy off: the large frame goes through the ring.
    let (a, b, wa, wb) = crate::shm::test_pair_with("t-drv-box", [None, None]);
    let total: usize = MIXED.iter().sum();
    let (ta, tb) = (a.traffic(), b.traffic());
    let side_run = move |me: Rank, link: ShmLink, waiter: Waiter, seeds: (u8, u8)| {
        let mut s = side(me, link, waiter);
        let input = pattern(seeds.0, total);
        let mut out = pattern(seeds.1, total);
        // Twice, so the second plan's small frames follow the first's
        // large one on the same link.
        for _ in 0..2 {
            out = pattern(seeds.1, total);
            s.run(&mut [Buf::Ro(&input), Buf::Rw(&mut out)], &mixed(1 - me), Duration::from_secs(20)).unwrap();
        }
        out
    };
    let t = std::thread::spawn(move || side_run(1, b, wb, (1, 7)));
    let out = side_run(0, a, wa, (2, 9));
    let out_b = t.join().unwrap();
    assert!(out == mixed_want(&pattern(1, total), &pattern(9, total)), "rank 0 got wrong bytes");
    assert!(out_b == mixed_want(&pattern(2, total), &pattern(7, total)), "rank 1 got wrong bytes");
    for t in [ta, tb] {
        // Five small frames a plan went in fastboxes; the ring carried the
        // large frame alone (its header and payload).
        assert_eq!(t.boxes_taken(), 10);
        assert_eq!(t.ring_bytes(), 2 * (crate::frame::HEADER_LEN + MIB) as u64);
    }
}

#[test]
fn a_fastbox_frame_of_another_call_is_the_same_mismatch_as_a_ring_frame() {
    // 8 bytes and 4 KiB travel in a fastbox, 8 KiB through the ring: the
    // receiver reports either the same way.
    for (k, len) in [8usize, 4096, 8192].into_iter().enumerate() {
        for their_seq in [1, 2] {
            let (a, b, wa, wb) = test_pair(&format!("t-drv-mm-{k}-{their_seq}"));
            let theirs =
                OpInfo { seq: their_seq, fingerprint: Fingerprint::new(OpKind::AllReduce, DType::U8, 4), checks: true };
            let ours = if their_seq == 1 { op() } else { OpInfo { fingerprint: theirs.fingerprint, ..op() } };
            let t = std::thread::spawn(move || {
                let mut s = side(1, b, wb);
                let input = pattern(1, len);
                let mut out = vec![0u8; len];
                s.run_op(
                    &mut [Buf::Ro(&input), Buf::Rw(&mut out)],
                    &for_peer(exchange(RecvMode::Copy, len), 0),
                    Duration::from_secs(10),
                    &theirs,
                )
            });
            let mut s = side(0, a, wa);
            let input = pattern(2, len);
            let mut out = vec![0u8; len];
            let e = s
                .run_op(
                    &mut [Buf::Ro(&input), Buf::Rw(&mut out)],
                    &for_peer(exchange(RecvMode::Copy, len), 1),
                    Duration::from_secs(10),
                    &ours,
                )
                .unwrap_err();
            let _ = t.join().unwrap();
            match e {
                Error::FrameMismatch { peer: 1, seq: 1, ours: o, their_seq: ts, theirs: th } => {
                    assert_eq!((o, ts, th), (ours.fingerprint, their_seq, theirs.fingerprint), "{len} B");
                }
                e => panic!("{len} B: {e}"),
            }
        }
    }
}

#[test]
fn random_mixes_of_fastbox_ring_and_single_copy_frames_arrive_intact_and_in_order() {
    // Plans of 1-6 frames each way, sizes drawn around the fastbox's
    // capacity and the ring's, so cells run out, ring frames wait behind
    // cells and cells behind ring frames; with single copy on, frames from
    // 64 B go single-copy where the box does not take them.
    const SIZES: [usize; 8] = [0, 8, 80, 4112, 4120, 8192, 300_000, 8];
    let plans = |seed: u64| {
        let mut x = seed;
        let mut next = move || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as usize
        };
        (0..150).map(|_| (0..1 + next() % 6).map(|_| SIZES[next() % SIZES.len()]).collect()).collect()
    };
    for (run, single_copy) in [("t-drv-mix-ring", None), ("t-drv-mix-sc", Some(64))] {
        let (a, b, wa, wb) = crate::shm::test_pair_with(run, [single_copy; 2]);
        let side_run = move |me: Rank, link: ShmLink, waiter: Waiter| {
            let mut s = side(me, link, waiter);
            let all: Vec<Vec<usize>> = plans(7);
            for (k, sizes) in all.iter().enumerate() {
                let total: usize = sizes.iter().sum();
                let input = pattern((k as u8).wrapping_mul(3).wrapping_add(me as u8), total);
                let mut out = vec![0u8; total];
                let chan = Chan { peer: 1 - me, stream: 0 };
                let mut plan = Plan::default();
                let mut off = 0;
                for &len in sizes {
                    plan.send(chan, Region::new(0, off, len), None);
                    plan.recv(chan, Region::new(1, off, len), RecvMode::Copy, None, None);
                    off += len;
                }
                s.run(&mut [Buf::Ro(&input), Buf::Rw(&mut out)], &plan, Duration::from_secs(20)).unwrap();
                let want = pattern((k as u8).wrapping_mul(3).wrapping_add(1 - me as u8), total);
                assert!(out == want, "plan {k} ({sizes:?}) arrived wrong on rank {me}");
            }
        };
        let t = std::thread::spawn(move || side_run(1, b, wb));
        side_run(0, a, wa);
        t.join().unwrap();
    }
}

/// A plan of one 8-byte frame to `peer` (`send`) or from it, reduced
/// (u8 sum) into buffer 0.
fn one_frame(peer: Rank, send: bool) -> Plan {
    let mut plan = Plan::default();
    let chan = Chan { peer, stream: 0 };
    match send {
        true => plan.send(chan, Region::new(0, 0, 8), None),
        false => plan.recv(chan, Region::new(0, 0, 8), RecvMode::Reduce { with: None }, None, None),
    };
    plan
}

/// Runs `plans` one-frame sends to rank 1, frame `k` carrying
/// `pattern(k, 8)`, each within `within`; `sent()` after each.
fn send_frames(s: &mut Side, plans: usize, within: Duration, mut sent: impl FnMut()) {
    let plan = one_frame(1, true);
    for k in 0..plans {
        let mut data = pattern(k as u8, 8);
        s.run(&mut [Buf::Rw(&mut data)], &plan, within).unwrap();
        sent();
    }
}

/// Runs `plans` one-frame receives from rank 0, each within `within`, and
/// checks that frame `k` is [`send_frames`]' `k`-th, reduced into
/// `pattern(100, 8)`.
fn receive_frames(r: &mut Side, plans: usize, within: Duration) {
    let plan = one_frame(0, false);
    for k in 0..plans {
        let mut got = pattern(100, 8);
        r.run(&mut [Buf::Rw(&mut got)], &plan, within).unwrap();
        let want: Vec<u8> = pattern(k as u8, 8).iter().zip(pattern(100, 8)).map(|(x, y)| x.wrapping_add(y)).collect();
        assert_eq!(got, want, "plan {k}");
    }
}

#[test]
fn boxed_runs_hand_over_when_cells_run_out_and_frames_take_the_ring() {
    // Rank 0 sends 3 * CELLS one-frame plans before rank 1 reads any: its
    // boxed runs find no free cell after the first CELLS, wait for one
    // for their polling budget, and hand over, whose frames then go
    // through the ring. Rank 1's boxed runs take the cells, then find the
    // next frame in the ring and hand over too.
    const PLANS: usize = 3 * crate::shm::CELLS_PER_RING;
    let (a, b, wa, wb) = crate::shm::test_pair_with("t-drv-handover", [None, None]);
    let ta = a.traffic();
    let t = std::thread::spawn(move || {
        let mut s = side(0, a, wa);
        send_frames(&mut s, PLANS, Duration::from_secs(10), || {});
        s
    });
    let sender = t.join().unwrap();
    assert_eq!(ta.boxes_taken(), 0, "nothing read yet");
    receive_frames(&mut side(1, b, wb), PLANS, Duration::from_secs(10));
    // The first cells' worth went in fastboxes, the rest in the ring.
    let cells = crate::shm::CELLS_PER_RING as u64;
    assert_eq!(ta.boxes_taken(), cells);
    assert!(ta.ring_bytes() > 0);
    drop(sender);
}

/// Rank 0, waiting by `idle` (a budget that does not run out here), sends
/// 3 * CELLS one-frame plans before rank 1 reads any: after CELLS plans it
/// waits for rank 1 to free a cell rather than write the ring, so a root
/// that runs ahead of its receivers stays on the fastbox path. Rank 1 has
/// not run yet (it has published no CPU), so the check for a peer sharing
/// the core cannot cut a spinning wait short.
fn a_boxed_send_waits_for_a_free_cell(idle: Idle, run: &str) {
    const PLANS: usize = 3 * crate::shm::CELLS_PER_RING;
    let (a, b, wa, wb) = crate::shm::test_pair_with(run, [None, None]);
    let ta = a.traffic();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = sent.clone();
    let t = std::thread::spawn(move || {
        let mut s = side_idle(0, a, wa, idle);
        send_frames(&mut s, PLANS, Duration::from_secs(60), || {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        s
    });
    let cells = crate::shm::CELLS_PER_RING;
    let deadline = Instant::now() + Duration::from_secs(20);
    while sent.load(std::sync::atomic::Ordering::SeqCst) < cells {
        assert!(Instant::now() < deadline, "the first {cells} plans did not complete ({idle:?})");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), cells, "a send went on without a free cell ({idle:?})");
    assert_eq!(ta.ring_bytes(), 0, "nothing went through the ring ({idle:?})");
    receive_frames(&mut side(1, b, wb), PLANS, Duration::from_secs(60));
    let sender = t.join().unwrap();
    assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), PLANS);
    assert_eq!(ta.ring_bytes(), 0, "every frame went in a cell ({idle:?})");
    drop(sender);
}

#[test]
fn with_a_core_each_a_boxed_send_waits_for_a_free_cell_rather_than_take_the_ring() {
    a_boxed_send_waits_for_a_free_cell(Idle::Spin(Duration::from_secs(60)), "t-drv-cellwait");
}

#[test]
fn ranks_sharing_cores_wait_for_a_free_cell_yielding_rather_than_take_the_ring() {
    // With more ranks than cores, the receiver that would free a cell may
    // be waiting for this core: the wait yields it, and a broadcast's root
    // does not push its receivers onto the ring's slower path.
    a_boxed_send_waits_for_a_free_cell(Idle::Yield(Duration::from_secs(60)), "t-drv-cellyield");
}

#[test]
fn ranks_sharing_cores_send_through_the_ring_once_their_yielding_budget_is_spent() {
    // Yielding for 1 ms at most: the plans after the first CELLS each wait
    // that long for a cell, then go through the ring, though nobody reads
    // them yet.
    const PLANS: usize = 3 * crate::shm::CELLS_PER_RING;
    let (a, b, wa, wb) = crate::shm::test_pair_with("t-drv-yieldring", [None, None]);
    let ta = a.traffic();
    let mut s = side_idle(0, a, wa, Idle::Yield(Duration::from_millis(1)));
    let start = Instant::now();
    send_frames(&mut s, PLANS, Duration::from_secs(60), || {});
    assert!(start.elapsed() < Duration::from_secs(30), "the sends waited for cells past their budget");
    assert!(ta.ring_bytes() > 0);
    receive_frames(&mut side(1, b, wb), PLANS, Duration::from_secs(60));
    assert_eq!(ta.boxes_taken(), crate::shm::CELLS_PER_RING as u64);
}

/// Runs `f` on a thread of its own whose mask is `cpus` alone.
fn on_cpus<T: Send>(cpus: &[usize], f: impl FnOnce() -> T + Send) -> T {
    use rustix::thread::{sched_setaffinity, CpuSet};
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut set = CpuSet::new();
            cpus.iter().for_each(|&c| set.set(c));
            sched_setaffinity(None, &set).unwrap();
            f()
        })
        .join()
        .unwrap()
    })
}

/// Whether a rank that waits over loopback TCP for a peer running on its
/// own core (pinned there) tries to move off it, when its driver knows the
/// peer is on this host (`local`) or does not.
fn tries_to_move_off_a_shared_core(local: bool) -> bool {
    use rustix::thread::{sched_getaffinity, sched_setaffinity};
    let mask = sched_getaffinity(None).unwrap();
    let (a, b) = crate::tcp::test_pair();
    let shared = crate::cpu::allowed()[0];
    // Rank 0 sends, rank 1 (this rank) receives.
    let peer = std::sync::Mutex::new(tcp_side(0, a));
    let mut me = tcp_side(1, b);
    me.driver.set_idle(Idle::Spin(wait::SPIN));
    if local {
        me.driver.set_local(1, &[0, 1]);
    }
    // A few tries: the rank moves once two of its waits in a row found the
    // peer on its core (a socket's word may be stale), and another test's
    // thread on the shared core may get this one moved by the scheduler
    // before it waits there.
    for _ in 0..5 {
        std::thread::scope(|s| {
            // The peer sends from the shared core alone, late enough that
            // this rank waits for it there.
            s.spawn(|| {
                on_cpus(&[shared], || {
                    let mut peer = peer.lock().unwrap();
                    send_frames(&mut peer, 1, Duration::from_secs(10), || {});
                    std::thread::sleep(Duration::from_millis(20));
                    send_frames(&mut peer, 1, Duration::from_secs(10), || {});
                })
            });
            on_cpus(&[shared], || receive_frames(&mut me, 1, Duration::from_secs(10)));
            // On the shared core, now free to go elsewhere.
            on_cpus(&[shared], || {
                sched_setaffinity(None, &mask).unwrap();
                let plan = one_frame(0, false);
                let mut got = [0u8; 8];
                me.run(&mut [Buf::Rw(&mut got)], &plan, Duration::from_secs(10)).unwrap();
            });
        });
        if me.driver.moved.get().tried() {
            return true;
        }
    }
    false
}

#[test]
fn a_rank_waiting_over_loopback_tcp_on_its_peers_core_moves_off() {
    if crate::cpu::allowed().len() < 2 {
        eprintln!("skipped: one CPU allowed, nowhere to move");
        return;
    }
    assert!(tries_to_move_off_a_shared_core(true), "it waited on its peer's core and stayed");
    assert!(!tries_to_move_off_a_shared_core(false), "it moved for a peer not known to be on this host");
}

#[test]
fn tries_to_move_come_soon_then_less_often_and_soon_again_after_a_quiet_spell() {
    use super::wait::MoveGaps;
    let ms = Duration::from_millis;
    let t0 = std::time::Instant::now();
    let mut g = MoveGaps::default();
    // Admitted at: the first try, then gaps of 1, 2, 4, ... 64, 100, 100 ms.
    let admitted: Vec<u64> = (0..700).filter(|&t| g.admit(t0 + ms(t))).collect();
    assert_eq!(admitted, [0, 1, 3, 7, 15, 31, 63, 127, 227, 327, 427, 527, 627]);
    // Refused tries are not counted: a quiet spell of a second, then soon again.
    assert!(!g.admit(t0 + ms(700)));
    assert!(g.admit(t0 + ms(1700)));
    assert!(!g.admit(t0 + ms(1700) + Duration::from_micros(999)));
    assert!(g.admit(t0 + ms(1701)));
    assert!(!g.admit(t0 + ms(1702)));
    assert!(g.admit(t0 + ms(1703)));
}

#[test]
fn an_express_run_does_its_bookkeeping_before_its_first_receive_even_when_the_frame_is_there() {
    let (a, b, wa, wb) = test_pair("t-drv-underway");
    let (mut a, mut b) = (side(0, a, wa), side(1, b, wb));
    let calls = std::cell::Cell::new(0);
    let count = || calls.set(calls.get() + 1);
    // Rank 1 only sends, into a free cell: it never waits, and leaves the
    // bookkeeping to its caller.
    let mut send_only = Plan::default();
    send_only.send(Chan { peer: 0, stream: 0 }, Region::new(0, 0, 8), None);
    let theirs = pattern(5, 8);
    b.run_watched(&mut [Buf::Ro(&theirs)], &send_only, Duration::from_secs(20), &op(), Some(&count)).unwrap();
    assert_eq!(calls.get(), 0, "a run that only sends and never waits has nothing under way to report");
    // Rank 0's frame from rank 1 is already in its cell: it never waits
    // either, but its bookkeeping is done while its own frame travels,
    // once, and the frame lands.
    let ours = pattern(1, 8);
    let mut out = pattern(2, 8);
    let plan = for_peer(exchange(RecvMode::Copy, 8), 1);
    a.run_watched(&mut [Buf::Ro(&ours), Buf::Rw(&mut out)], &plan, Duration::from_secs(20), &op(), Some(&count))
        .unwrap();
    assert_eq!(calls.get(), 1, "the exchange reported itself under way once, before taking the waiting frame");
    assert_eq!(out, theirs);
}
