//! What the flight recorder adds to one blocking collective: recording it
//! started and completed, with the default ring (2000 entries) and with the
//! ring off (`RINGLEADER_FR_SIZE=0` keeps only the progress counters), and
//! one timestamp of each kind the recorder could use.
//!
//! `cargo bench --bench recorder`
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{criterion_group, criterion_main, Criterion};
use ringleader_core::{DType, Fingerprint, OpKind};
use ringleader_diag::clock;
use ringleader_diag::recorder::FlightRecorder;
use ringleader_diag::CallSite;
use std::hint::black_box;
use std::time::{Instant, SystemTime};

fn recorder(c: &mut Criterion) {
    let mut g = c.benchmark_group("flight_recorder");
    for (name, capacity) in [("record_started+completed/2000", 2000), ("record_started+completed/off", 0)] {
        let fr = FlightRecorder::new(capacity, 600_000);
        let fp = Fingerprint::new(OpKind::AllReduce, DType::F32, 2);
        let mut seq = 0;
        g.bench_function(name, |b| {
            b.iter(|| {
                seq += 1;
                let id = fr.record_started(black_box(fp), seq, 0);
                fr.completed_seq(id, seq);
            })
        });
    }
    // The same with where the call came from, as every Rust collective
    // records it (`#[track_caller]`: a pointer to static data).
    let fr = FlightRecorder::new(2000, 600_000);
    let fp = Fingerprint::new(OpKind::AllReduce, DType::F32, 2);
    let mut seq = 0;
    g.bench_function("record_started_at+completed/2000 (with call site)", |b| {
        b.iter(|| {
            seq += 1;
            let site = Some(CallSite::Rust(std::panic::Location::caller()));
            let id = fr.record_started_at(black_box(fp), seq, 0, black_box(site));
            fr.completed_seq(id, seq);
        })
    });
    g.bench_function("stamp/clock::now", |b| b.iter(|| black_box(clock::now())));
    g.bench_function("stamp/Instant::now", |b| b.iter(|| black_box(Instant::now())));
    g.bench_function("stamp/SystemTime::now", |b| b.iter(|| black_box(SystemTime::now())));
    g.finish();
}

/// The two halves of the pair above on their own: recording a collective
/// as it starts, and marking it completed.
fn parts(c: &mut Criterion) {
    let mut g = c.benchmark_group("parts");
    for (name, capacity) in [("record_started/2000", 2000), ("record_started/off", 0)] {
        let fr = FlightRecorder::new(capacity, 600_000);
        let fp = Fingerprint::new(OpKind::AllReduce, DType::F32, 2);
        let mut seq = 0;
        g.bench_function(name, |b| {
            b.iter(|| {
                seq += 1;
                black_box(fr.record_started(black_box(fp), seq, 0));
            })
        });
    }
    for (name, capacity) in [("completed/2000", 2000), ("completed/off", 0)] {
        let fr = FlightRecorder::new(capacity, 600_000);
        let fp = Fingerprint::new(OpKind::AllReduce, DType::F32, 2);
        let id = fr.record_started(fp, 1, 0);
        g.bench_function(name, |b| b.iter(|| fr.completed_seq(black_box(id), 1)));
    }
    g.finish();
}

criterion_group!(benches, recorder, parts);
criterion_main!(benches);
