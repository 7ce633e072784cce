//! Small asynchronous all_reduce through the engine's submission queue:
//! each repeat queues DEPTH 8-byte `all_reduce_async` calls back to back,
//! then waits for them all. Prints, on rank 0, one JSON line: the per-call
//! time in us of each repeat, the slowest rank's.
//!
//! ```text
//! ringleader launch --nproc-per-node 2 -- target/release/examples/async_latency [CALLS] [DEPTH] [REPEATS]
//! ```

use ringleader::{Communicator, ReduceOp};
use std::time::Instant;

fn main() -> ringleader::Result<()> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("CALLS, DEPTH and REPEATS are numbers"));
    let calls = args.next().unwrap_or(2000);
    let depth = args.next().unwrap_or(16).max(1);
    let repeats = args.next().unwrap_or(7);
    let comm = Communicator::from_env()?;
    let round = |n: usize| -> ringleader::Result<()> {
        let mut done = 0;
        while done < n {
            let k = depth.min(n - done);
            let works: Vec<_> = (0..k).map(|_| comm.all_reduce_async(vec![1.0f32; 2], ReduceOp::Sum)).collect();
            for w in works {
                w?.into_inner()?;
            }
            done += k;
        }
        Ok(())
    };
    round(200)?;
    let mut times = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        comm.barrier()?;
        let start = Instant::now();
        round(calls)?;
        let mut us = [start.elapsed().as_secs_f64() * 1e6 / calls as f64];
        comm.all_reduce(&mut us, ReduceOp::Max)?;
        times.push(us[0]);
    }
    if comm.rank() == 0 {
        let list: Vec<String> = times.iter().map(|t| format!("{t:.3}")).collect();
        println!("{{\"async_us\": [{}]}}", list.join(", "));
    }
    comm.destroy()
}
