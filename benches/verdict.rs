//! The verdict engine at scale: 16,384 ranks, each with a snapshot, one of
//! them outside the all_reduce the others wait in (the missed-collective
//! case), and 16,384 ranks of which 16,383 left (every rank named in one
//! clause). Target: under 100 ms.
//!
//! `cargo bench --bench verdict`
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{criterion_group, criterion_main, Criterion};
use ringleader_core::{DType, Fingerprint, OpKind, ReduceOp};
use ringleader_diag::recorder::FlightRecorder;
use ringleader_diag::snapshot::Running;
use ringleader_diag::{verdict, Beat, Evidence, Liveness, PeerView, Snapshot};
use std::hint::black_box;

const N: usize = 16_384;

fn beat(done: u64, running: Option<u64>, awaited: Vec<usize>) -> Beat {
    let fp = Fingerprint::new(OpKind::AllReduce, DType::F32, 1 << 20).with_reduce_op(ReduceOp::Sum);
    Beat {
        last_started: running.unwrap_or(done),
        last_completed: done,
        running: running.map(|seq| Running { seq, fingerprint: fp, running_ms: 9_500, awaited_peers: awaited }),
        p2p: Vec::new(),
        running_site: None,
        last_completed_site: None,
    }
}

fn peer(rank: usize, liveness: Liveness, b: Beat) -> PeerView {
    PeerView {
        rank,
        liveness,
        host: Some(format!("node{}", rank / 8)),
        pid: Some(1000 + rank as u32),
        heartbeat_age_ms: Some(100 + (rank % 7) as u64 * 50),
        beat: Some(b),
        exit: None,
    }
}

/// Each rank's snapshot with the last 16 collectives in its recorder.
fn snapshot(rank: usize, b: Beat) -> Snapshot {
    let fr = FlightRecorder::new(16, 600_000);
    let fp = Fingerprint::new(OpKind::AllReduce, DType::F32, 1 << 20).with_reduce_op(ReduceOp::Sum);
    for seq in 1..=b.last_started {
        let id = fr.record_started(fp, seq, 0);
        if seq <= b.last_completed {
            fr.completed_seq(id, seq);
        }
    }
    let mut s = Snapshot::new(rank, N, &format!("node{}", rank / 8), 1000 + rank as u32, "bench");
    s.entries = fr.entries();
    s.beat = b;
    s
}

fn one_outside() -> Evidence {
    let (mut peers, mut snapshots) = (Vec::with_capacity(N), Vec::with_capacity(N));
    for r in 0..N {
        let b = if r == 37 { beat(20, None, vec![]) } else { beat(20, Some(21), vec![(r + N - 1) % N]) };
        peers.push(peer(r, Liveness::Alive, b.clone()));
        snapshots.push(snapshot(r, b));
    }
    Evidence { world_size: N, peers, snapshots, stale_after_ms: 3000, group: None }
}

fn all_but_one_left() -> Evidence {
    let mut peers = vec![peer(0, Liveness::Alive, beat(20, Some(21), vec![1]))];
    peers.extend((1..N).map(|r| peer(r, Liveness::Left, beat(20, None, vec![]))));
    let snapshots = vec![snapshot(0, beat(20, Some(21), vec![1]))];
    Evidence { world_size: N, peers, snapshots, stale_after_ms: 3000, group: None }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("verdict");
    g.sample_size(20);
    let ev = one_outside();
    g.bench_function("16384 ranks, one outside the all_reduce", |b| b.iter(|| black_box(verdict(black_box(&ev)))));
    let ev = all_but_one_left();
    g.bench_function("16384 ranks, 16383 left", |b| b.iter(|| black_box(verdict(black_box(&ev)))));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
