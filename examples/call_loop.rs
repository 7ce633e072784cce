//! One small collective called in a loop, for counting the instructions a
//! call costs (scripts/call_instructions.sh runs every rank of it under
//! callgrind, collecting only inside `timed`).
//!
//! ```text
//! ringleader launch --nproc-per-node 2 -- target/release/examples/call_loop OP [ITERS] [BYTES]
//! ```
//!
//! OP is barrier, all_reduce, broadcast, all_gather or reduce_scatter;
//! BYTES (default 8) is the size as `ringleader perf` counts it (all_gather:
//! the output, reduce_scatter: the input).

use ringleader::{Communicator, ReduceOp};
use std::time::Instant;

/// The loop callgrind counts (`--toggle-collect=*call_loop*timed*`).
#[inline(never)]
fn timed(comm: &Communicator, op: &str, iters: usize, a: &mut [f32], b: &mut [f32]) -> ringleader::Result<()> {
    for _ in 0..iters {
        match op {
            "barrier" => comm.barrier()?,
            "all_reduce" => comm.all_reduce(a, ReduceOp::Sum)?,
            "broadcast" => comm.broadcast(a, 0)?,
            "all_gather" => comm.all_gather(&a[..b.len() / comm.world_size()], b)?,
            "reduce_scatter" => comm.reduce_scatter(a, &mut b[..a.len() / comm.world_size()], ReduceOp::Sum)?,
            other => {
                return Err(ringleader::Error::invalid("OP", format!("{other} is not one this example runs")));
            }
        }
    }
    Ok(())
}

fn main() -> ringleader::Result<()> {
    let mut args = std::env::args().skip(1);
    let op = args.next().unwrap_or_else(|| "barrier".into());
    let iters: usize = args.next().map_or(20000, |s| s.parse().expect("ITERS is a number"));
    let bytes: usize = args.next().map_or(8, |s| s.parse().expect("BYTES is a number"));
    let comm = Communicator::from_env()?;
    let n = comm.world_size();
    let count = (bytes / 4).max(n).div_ceil(n) * n;
    let (mut a, mut b) = (vec![1.0f32; count], vec![0.0f32; count]);
    timed(&comm, &op, 200, &mut a, &mut b)?;
    comm.barrier()?;
    let start = Instant::now();
    timed(&comm, &op, iters, &mut a, &mut b)?;
    let mut us = [start.elapsed().as_secs_f64() * 1e6 / iters.max(1) as f64];
    comm.all_reduce(&mut us, ReduceOp::Max)?;
    if comm.rank() == 0 {
        println!("{{\"op\": \"{op}\", \"bytes\": {}, \"us\": {:.3}}}", count * 4, us[0]);
    }
    comm.destroy()
}
