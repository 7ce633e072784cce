//! An in-memory multi-rank simulator for plans (tests only).
//!
//! Runs every rank's plan with FIFO links that hold one frame at a time (the
//! tightest buffering a socket can have), choosing among the enabled steps
//! at random from a seed. A plan set that can deadlock under some order, or
//! whose frames disagree in position or size, fails here in microseconds;
//! the results are compared with a naive reduction by the tests in
//! `tests.rs`.

use ringleader_core::reduce::{reduce3_bytes, reduce_bytes};
use ringleader_core::{DType, ReduceOp};
use ringleader_transport::{Chan, Plan, RecvMode, Region};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// One simulated rank: its plan and its buffers (IO, OUT, SCRATCH).
pub(crate) struct SimRank {
    pub plan: Plan,
    pub bufs: Vec<Vec<u8>>,
}

#[derive(Default)]
struct Cursor {
    sends: BTreeMap<Chan, (Vec<u32>, usize)>,
    recvs: BTreeMap<Chan, (Vec<u32>, usize)>,
    send_done: Vec<bool>,
    recv_done: Vec<bool>,
}

fn region(bufs: &[Vec<u8>], r: Region) -> &[u8] {
    &bufs[r.buf as usize][r.off..r.off + r.len]
}

/// Frames in flight on one link: (tag, bytes).
type Frames = VecDeque<(u32, Vec<u8>)>;

/// Runs all ranks to completion; panics on a deadlock or a frame mismatch.
pub(crate) fn run(ranks: &mut [SimRank], dtype: DType, op: ReduceOp, seed: u64) {
    let n = ranks.len();
    let mut cur: Vec<Cursor> = ranks
        .iter()
        .map(|r| {
            let mut c = Cursor {
                send_done: vec![false; r.plan.sends.len()],
                recv_done: vec![false; r.plan.recvs.len()],
                ..Default::default()
            };
            for (i, s) in r.plan.sends.iter().enumerate() {
                c.sends.entry(s.chan).or_default().0.push(i as u32);
            }
            for (i, x) in r.plan.recvs.iter().enumerate() {
                c.recvs.entry(x.chan).or_default().0.push(i as u32);
            }
            c
        })
        .collect();
    // (src, dst, stream) -> frames (tag, bytes)
    let mut links: HashMap<(usize, usize, u16), Frames> = HashMap::new();
    let mut rng = seed | 1;
    loop {
        let mut enabled = Vec::new();
        for r in 0..n {
            let plan = &ranks[r].plan;
            let c = &cur[r];
            for (chan, (items, pos)) in &c.sends {
                if let Some(&i) = items.get(*pos) {
                    let it = &plan.sends[i as usize];
                    let room = links.get(&(r, chan.peer, chan.stream)).is_none_or(|q| q.is_empty());
                    if room && it.after.is_none_or(|d| c.recv_done[d as usize]) {
                        enabled.push((r, *chan, true));
                    }
                }
            }
            for (chan, (items, pos)) in &c.recvs {
                if let Some(&i) = items.get(*pos) {
                    let it = &plan.recvs[i as usize];
                    let ready = links.get(&(chan.peer, r, chan.stream)).is_some_and(|q| !q.is_empty());
                    if ready
                        && it.after.is_none_or(|d| c.recv_done[d as usize])
                        && it.after_send.is_none_or(|d| c.send_done[d as usize])
                    {
                        enabled.push((r, *chan, false));
                    }
                }
            }
        }
        if enabled.is_empty() {
            let stuck: Vec<_> = (0..n)
                .filter(|&r| !cur[r].send_done.iter().all(|d| *d) || !cur[r].recv_done.iter().all(|d| *d))
                .collect();
            assert!(stuck.is_empty(), "deadlock: ranks {stuck:?} cannot progress");
            assert!(links.values().all(|q| q.is_empty()), "frames left unread");
            return;
        }
        // xorshift: a deterministic but scrambled order.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let (r, chan, is_send) = enabled[(rng % enabled.len() as u64) as usize];
        if is_send {
            let (items, pos) = cur[r].sends.get_mut(&chan).unwrap();
            let i = items[*pos];
            let tag = *pos as u32;
            *pos += 1;
            let it = ranks[r].plan.sends[i as usize];
            let bytes = region(&ranks[r].bufs, it.region).to_vec();
            links.entry((r, chan.peer, chan.stream)).or_default().push_back((tag, bytes));
            cur[r].send_done[i as usize] = true;
        } else {
            let (items, pos) = cur[r].recvs.get_mut(&chan).unwrap();
            let i = items[*pos];
            let want_tag = *pos as u32;
            *pos += 1;
            let (tag, bytes) = links.get_mut(&(chan.peer, r, chan.stream)).unwrap().pop_front().unwrap();
            let it = ranks[r].plan.recvs[i as usize];
            assert_eq!(tag, want_tag, "rank {r} from {chan:?}: frame order");
            assert_eq!(bytes.len(), it.region.len, "rank {r} from {chan:?}: frame size (tag {tag})");
            apply(&mut ranks[r].bufs, it.region, it.mode, &bytes, dtype, op);
            cur[r].recv_done[i as usize] = true;
        }
    }
}

fn apply(bufs: &mut [Vec<u8>], dst: Region, mode: RecvMode, data: &[u8], dtype: DType, op: ReduceOp) {
    match mode {
        RecvMode::Copy => bufs[dst.buf as usize][dst.off..dst.off + dst.len].copy_from_slice(data),
        RecvMode::Reduce { with: None } => {
            reduce_bytes(dtype, op, &mut bufs[dst.buf as usize][dst.off..dst.off + dst.len], data)
        }
        RecvMode::Reduce { with: Some(w) } => {
            let other = region(bufs, w).to_vec();
            reduce3_bytes(dtype, op, &mut bufs[dst.buf as usize][dst.off..dst.off + dst.len], &other, data);
        }
    }
}
