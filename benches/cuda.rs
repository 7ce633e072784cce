//! `cargo bench --features cuda`: all_reduce on device buffers, ringleader
//! against NCCL in the same run, nccl-tests style (busbw = algbw x 2(n-1)/n).
//!
//! Ranks are threads of this process, rank r on GPU r % GPUs: one rank per
//! GPU when there are two or more (then NCCL runs the same sizes), else two
//! ranks sharing the one GPU (NCCL needs a GPU per rank and is skipped,
//! with a line saying so). Without a CUDA driver the bench says why and
//! exits 0, so `cargo bench --features cuda` passes on CPU-only machines.

use cudarc::driver::{CudaContext, CudaSlice};
use cudarc::nccl::safe::{Comm, Id, ReduceOp as NcclOp};
use ringleader::{Communicator, Config, ReduceOp};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const SIZES: [usize; 5] = [1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20];
const ITERS: usize = 10;

fn busbw(bytes: usize, secs: f64, n: usize) -> f64 {
    bytes as f64 / secs / 1e9 * 2.0 * (n as f64 - 1.0) / n as f64
}

fn main() {
    if let Err(e) = ringleader::cuda::driver() {
        println!("cuda bench skipped: {e}");
        return;
    }
    let gpus = CudaContext::device_count().unwrap_or(0) as usize;
    if gpus == 0 {
        println!("cuda bench skipped: no CUDA device is visible");
        return;
    }
    let n = if gpus >= 2 { gpus.min(4) } else { 2 };
    // SAFETY: only tries to load the library.
    let nccl_lib = unsafe { cudarc::nccl::sys::is_culib_present() };
    let nccl_why = if gpus < n {
        Some(format!("{n} ranks share {gpus} GPU; NCCL needs one GPU per rank"))
    } else if !nccl_lib {
        Some("libnccl.so cannot be loaded".to_string())
    } else {
        None
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let id = nccl_why.is_none().then(|| Id::new().expect("ncclGetUniqueId"));
    let barrier = Arc::new(Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|rank| {
            let barrier = barrier.clone();
            let id = id.map(|i| Id::uninit(*i.internal()));
            std::thread::spawn(move || {
                let mut cfg = Config::new(rank, n, "127.0.0.1", port);
                cfg.run_id = format!("cuda-bench-{port}");
                cfg.init_timeout = Duration::from_secs(60);
                let comm = Communicator::init(cfg).expect("init");
                let ctx = CudaContext::new(rank % gpus).expect("context");
                let s = ctx.new_stream().expect("stream");
                let nccl = id.map(|id| Comm::from_rank(s.clone(), rank, n, id).expect("ncclCommInitRank"));
                let mut rows = Vec::new();
                for bytes in SIZES {
                    let mut buf: CudaSlice<f32> = s.alloc_zeros(bytes / 4).expect("alloc");
                    let mut time = |f: &mut dyn FnMut(&mut CudaSlice<f32>)| {
                        f(&mut buf);
                        s.synchronize().unwrap();
                        barrier.wait();
                        let t = Instant::now();
                        for _ in 0..ITERS {
                            f(&mut buf);
                        }
                        s.synchronize().unwrap();
                        t.elapsed().as_secs_f64() / ITERS as f64
                    };
                    let ours = time(&mut |b| comm.all_reduce_device(b, ReduceOp::Sum, &s).unwrap());
                    let theirs = nccl.as_ref().map(|c| {
                        time(&mut |b| {
                            let src = b.clone();
                            c.all_reduce(&src, b, &NcclOp::Sum).unwrap();
                        })
                    });
                    rows.push((bytes, ours, theirs));
                }
                drop(nccl);
                comm.destroy().unwrap();
                rows
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    println!("# all_reduce f32 sum on device buffers, {n} ranks on {gpus} GPU(s), {ITERS} iterations, slowest rank");
    if let Some(why) = &nccl_why {
        println!("# NCCL skipped: {why}");
    }
    println!(
        "{:>12} {:>12} {:>10} {:>12} {:>10} {:>8}",
        "size", "rl time us", "rl busbw", "nccl us", "nccl bw", "ratio"
    );
    for (i, &bytes) in SIZES.iter().enumerate() {
        let ours = results.iter().map(|r| r[i].1).fold(0.0, f64::max);
        let theirs =
            results.iter().filter_map(|r| r[i].2).fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.max(t))));
        let (nt, nb, ratio) = match theirs {
            Some(t) => (format!("{:.1}", t * 1e6), format!("{:.2}", busbw(bytes, t, n)), format!("{:.2}", t / ours)),
            None => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "{:>12} {:>12.1} {:>10.2} {:>12} {:>10} {:>8}",
            bytes,
            ours * 1e6,
            busbw(bytes, ours, n),
            nt,
            nb,
            ratio
        );
    }
}
