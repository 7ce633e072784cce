//! What the flight recorder and the consistency checks cost a blocking
//! all_reduce, measured inside one job: every rank opens two communicators
//! over the same ranks, one as configured (recorder and checks on by
//! default) and one with both off (`RINGLEADER_FR_SIZE=0`,
//! `RINGLEADER_CHECKS=0`), and times blocks of calls on each in turn.
//!
//! Separate launches of `ringleader perf` differ from one another by more
//! than the few tens of nanoseconds measured here (which cores the ranks
//! land on, the host's other tenants), so comparing two sets of launches
//! needs hundreds of them to resolve 2%; pairing blocks within one process
//! cancels what the launches do not share. `scripts/overhead.py --paired`
//! runs this over several launches.
//!
//! Prints, on rank 0, one JSON line: the per-call time in us of each block
//! with the recorder on and off (the slowest rank's), in the order run.
//!
//! ```text
//! ringleader launch --nproc-per-node 2 -- target/release/examples/recorder_overhead [BYTES] [CALLS] [BLOCKS] [both|recorder|checks|none] [on-first|off-first]
//! ```

use ringleader::{Communicator, Config, ReduceOp};
use ringleader_store::server::{ServerOptions, StoreServer};
use std::time::Instant;

fn main() -> ringleader::Result<()> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("BYTES, CALLS and BLOCKS are numbers"));
    let bytes = args.next().unwrap_or(8);
    let calls = args.next().unwrap_or(2000);
    let blocks = args.next().unwrap_or(40);
    // What the second communicator turns off: both (the comparison), the
    // recorder or the checks alone (their shares), or none (the control:
    // what two communicators differ by with nothing turned off).
    let what = std::env::args().nth(4).unwrap_or_else(|| "both".into());
    let cfg = Config::from_env()?;
    let mut off_cfg = cfg.clone();
    match what.as_str() {
        "both" => (off_cfg.fr_size, off_cfg.checks) = (0, false),
        "recorder" => off_cfg.fr_size = 0,
        "checks" => off_cfg.checks = false,
        "none" => {}
        other => panic!("the fourth argument is both, recorder, checks or none, not {other}"),
    }
    // Which is made first (its buffers, its place in memory) is a
    // difference of its own: `off-first` swaps them, and a comparison runs
    // both orders.
    let off_first = std::env::args().nth(5).is_some_and(|a| a == "off-first");
    let (first_cfg, second_cfg) = if off_first { (off_cfg, cfg) } else { (cfg, off_cfg) };
    let first = Communicator::init(first_cfg.clone())?;
    // The second communicator meets at a store of its own, which rank 0
    // starts on loopback (one host only) and whose port it broadcasts.
    let mut opts = ServerOptions::new(first_cfg.run_id.clone());
    opts.token = first_cfg.token.clone();
    let store = (first.rank() == 0).then(|| StoreServer::bind("127.0.0.1:0", opts)).transpose()?;
    let mut port = [store.as_ref().map_or(0, |s| i32::from(s.local_addr().port()))];
    first.broadcast(&mut port, 0)?;
    let mut second_cfg = second_cfg;
    second_cfg.store_addr = Some(format!("127.0.0.1:{}", port[0]));
    let second = Communicator::init(second_cfg)?;
    let (on, off) = if off_first { (second, first) } else { (first, second) };
    let mut x = vec![1.0f32; bytes.div_ceil(4).max(1)];
    for comm in [&on, &off] {
        for _ in 0..calls {
            comm.all_reduce(&mut x, ReduceOp::Sum)?;
        }
    }
    let (mut t_on, mut t_off) = (Vec::with_capacity(blocks), Vec::with_capacity(blocks));
    for b in 0..blocks {
        // Alternate which goes first, so that neither always follows the
        // other's cache state.
        let order = if b % 2 == 0 { [true, false] } else { [false, true] };
        for recorded in order {
            let comm = if recorded { &on } else { &off };
            comm.barrier()?;
            let start = Instant::now();
            for _ in 0..calls {
                comm.all_reduce(&mut x, ReduceOp::Sum)?;
            }
            let mut us = [start.elapsed().as_secs_f64() * 1e6 / calls as f64];
            off.all_reduce(&mut us, ReduceOp::Max)?;
            if recorded { &mut t_on } else { &mut t_off }.push(us[0]);
        }
    }
    if on.rank() == 0 {
        let list = |v: &[f64]| v.iter().map(|t| format!("{t:.4}")).collect::<Vec<_>>().join(", ");
        println!(
            "{{\"bytes\": {bytes}, \"calls\": {calls}, \"off\": \"{what}\", \"on_us\": [{}], \"off_us\": [{}]}}",
            list(&t_on),
            list(&t_off)
        );
    }
    off.destroy()?;
    on.destroy()?;
    drop(store);
    Ok(())
}
