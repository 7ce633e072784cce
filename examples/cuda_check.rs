//! Device-buffer checks that scripts/gpu_check.sh runs under `ringleader
//! launch` on a machine with a GPU (needs the `cuda` feature):
//!
//! - `cuda_check all`: every collective on device buffers, several types
//!   and sizes (including ones large enough for the GPU reduction path and
//!   counts that do not divide into chunks), results checked element by
//!   element, with work queued on the stream before and after each call;
//! - `cuda_check mismatch`: rank 0 passes another count; every rank must
//!   fail with `mismatch`;
//! - `cuda_check kill`: rank 1 kills itself (SIGKILL) in the middle of a
//!   loop of all_reduces; the others must fail with `peer-died` naming it.
//!
//! Exit status 0 when the check held on this rank.

use cudarc::driver::{CudaContext, CudaStream, DeviceRepr, ValidAsZeroBits};
use ringleader::{bf16, Communicator, Element, ErrorKind, ReduceOp};
use std::sync::Arc;

type R<T> = std::result::Result<T, String>;

trait Val: Element + DeviceRepr + ValidAsZeroBits + Copy + PartialEq + std::fmt::Debug {
    fn of(v: i64) -> Self;
}
impl Val for f32 {
    fn of(v: i64) -> Self {
        v as f32
    }
}
impl Val for i32 {
    fn of(v: i64) -> Self {
        v as i32
    }
}
impl Val for bf16 {
    fn of(v: i64) -> Self {
        bf16::from_f64(v as f64)
    }
}

fn e<E: std::fmt::Debug>(what: &str) -> impl Fn(E) -> String + '_ {
    move |err| format!("{what}: {err:?}")
}

fn check<T: Val>(what: &str, got: &[T], want: impl Fn(usize) -> Option<i64>) -> R<()> {
    for (i, g) in got.iter().enumerate() {
        if let Some(w) = want(i) {
            if *g != T::of(w) {
                return Err(format!("{what}: element {i} is {g:?}, expected {w}"));
            }
        }
    }
    Ok(())
}

fn every_collective<T: Val>(c: &Communicator, s: &Arc<CudaStream>, count: usize, name: &str) -> R<()> {
    let (r, n) = (c.rank() as i64, c.world_size() as i64);
    let v = |i: usize, r: i64| (i % 13) as i64 + r;
    let tag = format!("{name} x {count}");
    // all_reduce (sum): queued copy in, the call, queued copy out, all on `s`.
    let host: Vec<T> = (0..count).map(|i| T::of(v(i, r))).collect();
    let mut d = s.clone_htod(&host).map_err(e("htod"))?;
    c.all_reduce_device(&mut d, ReduceOp::Sum, s).map_err(|x| x.to_string())?;
    let got = s.clone_dtoh(&d).map_err(e("dtoh"))?;
    check(&format!("all_reduce {tag}"), &got, |i| Some(n * (i % 13) as i64 + n * (n - 1) / 2))?;
    // all_gather
    let mut out = s.alloc_zeros::<T>(count * n as usize).map_err(e("alloc"))?;
    c.all_gather_device(&s.clone_htod(&host).map_err(e("htod"))?, &mut out, s).map_err(|x| x.to_string())?;
    let got = s.clone_dtoh(&out).map_err(e("dtoh"))?;
    check(&format!("all_gather {tag}"), &got, |j| Some(v(j % count, (j / count) as i64)))?;
    // reduce_scatter (sum)
    let big: Vec<T> = (0..count * n as usize).map(|j| T::of(v(j, r))).collect();
    let mut out = s.alloc_zeros::<T>(count).map_err(e("alloc"))?;
    c.reduce_scatter_device(&s.clone_htod(&big).map_err(e("htod"))?, &mut out, ReduceOp::Sum, s)
        .map_err(|x| x.to_string())?;
    let got = s.clone_dtoh(&out).map_err(e("dtoh"))?;
    let base = r as usize * count;
    check(&format!("reduce_scatter {tag}"), &got, |i| Some(n * ((base + i) % 13) as i64 + n * (n - 1) / 2))?;
    // broadcast from the last rank
    let mut d = s.clone_htod(&host).map_err(e("htod"))?;
    c.broadcast_device(&mut d, (n - 1) as usize, s).map_err(|x| x.to_string())?;
    check(&format!("broadcast {tag}"), &s.clone_dtoh(&d).map_err(e("dtoh"))?, |i| Some(v(i, n - 1)))?;
    // reduce (max) to rank 0; the others keep their input
    let mut d = s.clone_htod(&host).map_err(e("htod"))?;
    c.reduce_device(&mut d, 0, ReduceOp::Max, s).map_err(|x| x.to_string())?;
    let want_r = if r == 0 { n - 1 } else { r };
    check(&format!("reduce {tag}"), &s.clone_dtoh(&d).map_err(e("dtoh"))?, |i| Some(v(i, want_r)))?;
    // all_to_all: segment j of rank r holds r * 10 + j.
    let seg = count.min(4096);
    let a2a: Vec<T> = (0..seg * n as usize).map(|k| T::of(r * 10 + (k / seg) as i64)).collect();
    let mut out = s.alloc_zeros::<T>(seg * n as usize).map_err(e("alloc"))?;
    c.all_to_all_device(&s.clone_htod(&a2a).map_err(e("htod"))?, &mut out, s).map_err(|x| x.to_string())?;
    check(&format!("all_to_all {tag}"), &s.clone_dtoh(&out).map_err(e("dtoh"))?, |k| Some((k / seg) as i64 * 10 + r))?;
    if r == 0 {
        println!("ok: every collective on device buffers, {tag}, {n} ranks");
    }
    Ok(())
}

fn run(mode: &str) -> R<()> {
    let c = Communicator::from_env().map_err(|x| x.to_string())?;
    // Before cudarc: it panics on first use when the driver cannot be loaded.
    ringleader::cuda::driver().map_err(|x| x.to_string())?;
    let gpus = CudaContext::device_count().map_err(e("cuDeviceGetCount"))? as usize;
    let local: usize = std::env::var("LOCAL_RANK").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let ctx = CudaContext::new(local % gpus.max(1)).map_err(e("CudaContext::new"))?;
    let s = ctx.new_stream().map_err(e("new_stream"))?;
    match mode {
        "all" => {
            for count in [1, 1000, (1 << 20) + 3] {
                every_collective::<f32>(&c, &s, count, "f32")?;
                every_collective::<i32>(&c, &s, count, "i32")?;
            }
            // Large enough for the GPU reduction path (16 MiB f32, 1 MiB bf16)
            // and for several chunks, with a ragged last one.
            every_collective::<f32>(&c, &s, (5 << 20) + 7, "f32")?;
            every_collective::<bf16>(&c, &s, (1 << 20) + 5, "bf16")?;
            c.destroy().map_err(|x| x.to_string())
        }
        "mismatch" => {
            let count = if c.rank() == 0 { 1000 } else { 2000 };
            let mut d = s.alloc_zeros::<f32>(count).map_err(e("alloc"))?;
            match c.all_reduce_device(&mut d, ReduceOp::Sum, &s) {
                Err(x) if x.kind() == ErrorKind::Mismatch => {
                    println!("ok: rank {} got the mismatch: {}", c.rank(), x.to_string().lines().next().unwrap_or(""));
                    Ok(())
                }
                other => Err(format!("expected a mismatch, got {other:?}")),
            }
        }
        "kill" => {
            let mut d = s.alloc_zeros::<f32>(1 << 20).map_err(e("alloc"))?;
            for i in 0..1000 {
                if c.rank() == 1 && i == 5 {
                    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
                }
                if let Err(x) = c.all_reduce_device(&mut d, ReduceOp::Sum, &s) {
                    let msg = x.to_string();
                    return if x.kind() == ErrorKind::PeerDied && msg.contains("rank 1") {
                        println!("ok: rank {} got the verdict: {}", c.rank(), msg.lines().next().unwrap_or(""));
                        Ok(())
                    } else {
                        Err(format!("expected peer-died naming rank 1, got: {msg}"))
                    };
                }
            }
            Err("no rank died".into())
        }
        other => Err(format!("unknown mode {other:?} (all, mismatch, kill)")),
    }
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    if let Err(msg) = run(&mode) {
        eprintln!("cuda_check {mode}: FAILED: {msg}");
        std::process::exit(1);
    }
}
