//! Many local ranks, one failure: how long the job takes to start, how soon
//! every rank learns of a death, and how much the job writes for one hang.
//!
//! ```text
//! RINGLEADER_TIMEOUT=20 ringleader launch --nproc-per-node 256 -- target/release/examples/scale_demo kill
//! RINGLEADER_TIMEOUT=20 ringleader launch --nproc-per-node 256 -- target/release/examples/scale_demo skip
//! ```
//!
//! Every rank makes one all_reduce. Then rank N/2+1 either kills itself with
//! SIGKILL (`kill`; the others must fail with `peer-died` within 2 s) or
//! skips the second all_reduce while staying alive (`skip`; the others must
//! fail with `missed-collective` at the timeout). Rank 0 prints the time to
//! the first completed all_reduce. With `SCALE_DEMO_TIMES=DIR`, every rank
//! writes one line to `DIR/rank-N` (the error's kind and when it came, in
//! Unix microseconds; the victim: when it died or how long it stayed away),
//! so that `scripts/scale_demo.sh` can compute the spread without the
//! example adding a line per rank to the job's log, which that script
//! measures.

use ringleader::{Communicator, ReduceOp};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn unix_us() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros())
}

/// Records this rank's line in `$SCALE_DEMO_TIMES/rank-N`, when set.
fn record(rank: usize, line: &str) {
    if let Some(dir) = std::env::var_os("SCALE_DEMO_TIMES") {
        let path = std::path::Path::new(&dir).join(format!("rank-{rank}"));
        if let Err(e) = std::fs::write(&path, format!("{line}\n")) {
            eprintln!("scale_demo: cannot write {}: {e}", path.display());
        }
    }
}

fn main() {
    let scenario = std::env::args().nth(1).unwrap_or_else(|| "skip".into());
    let t0 = Instant::now();
    let comm = Communicator::from_env().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let (rank, world) = (comm.rank(), comm.world_size());
    let mut t = [1.0f32];
    comm.all_reduce(&mut t, ReduceOp::Sum).expect("first all_reduce");
    if rank == 0 {
        println!("scale_demo: {world} ranks: first all_reduce done {:.2} s after start", t0.elapsed().as_secs_f64());
    }
    let victim = world / 2 + 1;
    if rank == victim {
        match scenario.as_str() {
            "kill" => {
                // Wait for the others to enter the second all_reduce.
                std::thread::sleep(Duration::from_secs(2));
                record(rank, &format!("victim killed at {}", unix_us()));
                let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
                std::thread::sleep(Duration::from_secs(60));
            }
            _ => {
                // THE BUG: this rank skips the second all_reduce but stays alive.
                // It stays until the others' timeout has long passed (the
                // launcher ends it earlier, once they failed).
                let timeout = std::env::var("RINGLEADER_TIMEOUT").ok().and_then(|t| t.parse::<f64>().ok());
                let away = Duration::from_secs_f64(timeout.unwrap_or(300.0) + 30.0);
                std::thread::sleep(away);
                record(rank, &format!("victim stayed away {:.1} s", away.as_secs_f64()));
                std::process::exit(0);
            }
        }
    }
    let entered = unix_us();
    match comm.all_reduce(&mut t, ReduceOp::Sum) {
        Ok(()) => record(rank, "completed the second all_reduce"),
        Err(e) => {
            let kind = e.kind();
            record(rank, &format!("failed {kind} at {} (entered {entered})", unix_us()));
            std::process::exit(1);
        }
    }
    comm.destroy().expect("destroy");
}
