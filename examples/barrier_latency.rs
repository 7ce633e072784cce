//! Barrier latency through the Rust API (`ringleader perf` has no
//! barrier: it measures sizes). Prints, on rank 0, one JSON line: the
//! per-call time in us of each repeat, the slowest rank's.
//!
//! ```text
//! ringleader launch --nproc-per-node 2 -- target/release/examples/barrier_latency [ITERS] [REPEATS]
//! ```

use ringleader::{Communicator, ReduceOp};
use std::time::Instant;

fn main() -> ringleader::Result<()> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("ITERS and REPEATS are numbers"));
    let iters = args.next().unwrap_or(20000);
    let repeats = args.next().unwrap_or(5);
    let comm = Communicator::from_env()?;
    for _ in 0..200 {
        comm.barrier()?;
    }
    let mut times = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        comm.barrier()?;
        let start = Instant::now();
        for _ in 0..iters {
            comm.barrier()?;
        }
        let mut us = [start.elapsed().as_secs_f64() * 1e6 / iters as f64];
        comm.all_reduce(&mut us, ReduceOp::Max)?;
        times.push(us[0]);
    }
    if comm.rank() == 0 {
        let list: Vec<String> = times.iter().map(|t| format!("{t:.3}")).collect();
        println!("{{\"barrier_us\": [{}]}}", list.join(", "));
    }
    comm.destroy()
}
