//! Reduction kernels in GB/s (bytes of the destination per second), beside
//! memcpy of the same size in the same run: a kernel that the compiler failed
//! to vectorize shows up as a fraction of memcpy's bandwidth.
//!
//! `cargo bench --bench reduce`
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ringleader_core::reduce::reduce_bytes;
use ringleader_core::{DType, ReduceOp};
use std::hint::black_box;

/// In cache (256 KiB, the size a receive is reduced in) and out of cache (64 MiB).
const SIZES: [usize; 2] = [256 << 10, 64 << 20];

fn buffers(bytes: usize) -> (Vec<u64>, Vec<u64>) {
    // u64 storage: 8-byte aligned, as the transport's staging is.
    (vec![0x3f80_0000_3f80_0000; bytes / 8], vec![0x3f80_0000_3f80_0000; bytes / 8])
}

fn kernels(c: &mut Criterion) {
    for bytes in SIZES {
        let mut g = c.benchmark_group(format!("reduce_{}KiB", bytes >> 10));
        g.throughput(Throughput::Bytes(bytes as u64));
        g.sample_size(if bytes > 1 << 20 { 20 } else { 100 });
        let (mut dst, src) = buffers(bytes);
        g.bench_function("memcpy", |b| {
            b.iter(|| {
                let d: &mut [u8] = bytemuck::cast_slice_mut(&mut dst);
                d.copy_from_slice(bytemuck::cast_slice(&src));
                black_box(&d);
            })
        });
        for dtype in DType::ALL {
            g.bench_with_input(BenchmarkId::new("sum", dtype.name()), &dtype, |b, &dt| {
                b.iter(|| {
                    reduce_bytes(dt, ReduceOp::Sum, bytemuck::cast_slice_mut(&mut dst), bytemuck::cast_slice(&src));
                    black_box(&dst);
                })
            });
        }
        for op in [ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
            g.bench_with_input(BenchmarkId::new(op.name(), "f32"), &op, |b, &op| {
                b.iter(|| {
                    reduce_bytes(DType::F32, op, bytemuck::cast_slice_mut(&mut dst), bytemuck::cast_slice(&src));
                    black_box(&dst);
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, kernels);
criterion_main!(benches);
