//! Send/recv ping-pong through the Rust API's blocking calls (`ringleader
//! perf` times collectives only), in pairs: ranks 0 and 1, 2 and 3, ...
//! (an odd last rank only joins and leaves; more pairs than cores is how
//! ranks that share cores are measured). Prints, on rank 0, one JSON line:
//! the message size and rank 0's round trip's mean in us over ITERS round
//! trips after 200 of warm-up, timed around the whole loop as
//! docs/perf/mpi_pingpong.c times Open MPI's. With `each`, every round
//! trip is timed too (two clock reads more per round trip) and the line
//! adds percentiles.
//!
//! ```text
//! ringleader launch --nproc-per-node 2 -- target/release/examples/p2p_latency [ITERS] [BYTES] [each]
//! ```

use ringleader::Communicator;
use std::time::Instant;

fn main() -> ringleader::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let each = args.get(2).is_some_and(|a| a == "each");
    let mut args = args.iter().take(2).map(|a| a.parse::<usize>().expect("ITERS and BYTES are numbers"));
    let iters = args.next().unwrap_or(20000).max(1);
    let bytes = args.next().unwrap_or(8);
    let comm = Communicator::from_env()?;
    let (a, mut b) = (vec![1u8; bytes], vec![0u8; bytes]);
    let mut trip = |comm: &Communicator| -> ringleader::Result<()> {
        let r = comm.rank();
        let peer = r ^ 1;
        if peer >= comm.world_size() {
            return Ok(());
        }
        if r % 2 == 0 {
            comm.send(&a, peer)?;
            comm.recv(&mut b, peer)
        } else {
            comm.recv(&mut b, peer)?;
            comm.send(&a, peer)
        }
    };
    for _ in 0..200 {
        trip(&comm)?;
    }
    comm.barrier()?;
    let mut us = Vec::with_capacity(if each { iters } else { 0 });
    let start = Instant::now();
    for _ in 0..iters {
        if each {
            let t = Instant::now();
            trip(&comm)?;
            us.push(t.elapsed().as_secs_f64() * 1e6);
        } else {
            trip(&comm)?;
        }
    }
    let mean = start.elapsed().as_secs_f64() * 1e6 / iters as f64;
    if comm.rank() == 0 {
        let mut line = format!("{{\"bytes\": {bytes}, \"round_trip_us\": {{\"mean\": {mean:.3}");
        if each {
            us.sort_by(f64::total_cmp);
            let at = |q: f64| us[((iters - 1) as f64 * q) as usize];
            line += &format!(
                ", \"p10\": {:.3}, \"p50\": {:.3}, \"p90\": {:.3}, \"p99\": {:.3}",
                at(0.1),
                at(0.5),
                at(0.9),
                at(0.99)
            );
        }
        println!("{line}}}}}");
    }
    comm.destroy()
}
