//! Every hang cause of docs/DESIGN.md §1 that can happen after init, provoked for
//! real between processes (a skipped call, mismatched arguments, kill -9,
//! SIGSTOP, a slow rank), each asserting the error kind, the ranks it names,
//! the collective, and how fast it arrived.
#![allow(missing_docs)]

mod common;

use common::*;
use ringleader::{Communicator, ReduceOp};
use std::time::{Duration, Instant};

fn arg() -> String {
    std::env::var("RL_ARG").unwrap_or_default()
}

/// Runs `body`; prints the error it ends with (if any) as the ERROR line.
fn guarded(body: impl FnOnce(&Communicator) -> ringleader::Result<()>) -> i32 {
    let start = Instant::now();
    let c = Communicator::from_env().expect("init");
    match body(&c) {
        Ok(()) => {
            println!("DONE");
            c.destroy().unwrap();
            0
        }
        Err(e) => {
            report_error(&e, start);
            eprintln!("{e}");
            3
        }
    }
}

fn skip_then_exit(c: &Communicator) -> ringleader::Result<()> {
    let mut t = [1.0f32];
    c.all_reduce(&mut t, ReduceOp::Sum)?;
    if c.rank() == 0 {
        c.all_reduce(&mut t, ReduceOp::Sum)?; // THE BUG: only rank 0 makes this call
    }
    Ok(())
}

fn skip_alive(c: &Communicator) -> ringleader::Result<()> {
    let mut t = [1.0f32];
    c.all_reduce(&mut t, ReduceOp::Sum)?;
    if c.rank() == 1 {
        // Alive, busy elsewhere, never calls the second all_reduce in time.
        std::thread::sleep(Duration::from_secs(6));
        return c.barrier();
    }
    c.all_reduce(&mut t, ReduceOp::Sum)
}

fn uneven(c: &Communicator) -> ringleader::Result<()> {
    let steps = if c.rank() == 0 { 5 } else { 4 };
    let mut t = [1.0f32; 16];
    for _ in 0..steps {
        c.all_reduce(&mut t, ReduceOp::Sum)?;
    }
    c.barrier()
}

fn mismatch(c: &Communicator) -> ringleader::Result<()> {
    let odd = c.rank() == 1;
    c.barrier()?;
    mismatched_call(c, odd)?;
    // A root only sends, so a broadcast whose ranks disagree on the root is
    // caught by the next collective, which meets the stray frames.
    c.barrier()
}

fn mismatched_call(c: &Communicator, odd: bool) -> ringleader::Result<()> {
    match arg().as_str() {
        "shape" => c.all_reduce(&mut vec![1.0f32; if odd { 2 } else { 1 }], ReduceOp::Sum),
        "dtype" if odd => c.all_reduce(&mut [1.0f64; 4], ReduceOp::Sum),
        "dtype" => c.all_reduce(&mut [1.0f32; 4], ReduceOp::Sum),
        "order" if odd => {
            c.all_reduce(&mut [1.0f32; 4], ReduceOp::Sum)?;
            c.broadcast(&mut [1.0f32; 4], 0)
        }
        "order" => {
            c.broadcast(&mut [1.0f32; 4], 0)?;
            c.all_reduce(&mut [1.0f32; 4], ReduceOp::Sum)
        }
        "root" => c.broadcast(&mut [1.0f32; 4], usize::from(odd)),
        "redop" => c.all_reduce(&mut [1.0f32; 4], if odd { ReduceOp::Max } else { ReduceOp::Sum }),
        "gather" => {
            let inp = vec![1i32; if odd { 3 } else { 2 }];
            let mut out = vec![0i32; inp.len() * c.world_size()];
            c.all_gather(&inp, &mut out)
        }
        // Rank 0 sends 4 floats where rank 1 receives 5 (at 16 bytes the
        // frame travels in a fastbox over shared memory).
        "p2p" => match c.rank() {
            0 => c.send(&[1.0f32; 4], 1),
            1 => c.recv(&mut [0.0f32; 5], 0),
            _ => Ok(()),
        },
        a => panic!("unknown mismatch {a}"),
    }
}

fn monitored(c: &Communicator) -> ringleader::Result<()> {
    let late: Vec<usize> = arg().split(',').filter_map(|s| s.parse().ok()).collect();
    c.barrier()?;
    if late.contains(&c.rank()) {
        std::thread::sleep(Duration::from_millis(2500));
    }
    c.monitored_barrier(Duration::from_secs(1), late.len() > 1)
}

/// Many monitored barriers in a row, one of them failed (rank 1 late);
/// then rank 0 counts the barrier keys left in the store.
fn monitored_many(c: &Communicator) -> ringleader::Result<()> {
    for i in 0..12 {
        if i == 5 && c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(1500));
        }
        match c.monitored_barrier(Duration::from_secs(1), false) {
            Err(_) if i == 5 => c.barrier()?,
            r => r?,
        }
    }
    c.barrier()?;
    if c.rank() == 0 {
        let var = |k: &str| std::env::var(k).unwrap_or_default();
        let mut opts = ringleader_store::ClientOptions::new(var("RINGLEADER_RUN_ID"));
        opts.role = ringleader_store::Role::Tool;
        let mut store = ringleader_store::StoreClient::connect(&var("RINGLEADER_STORE_ADDR"), opts)?;
        let left = store.keys_with_prefix(ringleader_store::keys::MONITORED_BARRIER_PREFIX)?;
        println!("MBKEYS {}", left.join(" "));
    }
    Ok(())
}

/// Loops a collective until killed; marks when the loop runs.
fn busy(c: &Communicator) -> ringleader::Result<()> {
    let mut buf = vec![1.0f32; 4 << 20];
    for i in 0u64.. {
        if i == 3 {
            mark(&format!("busy{}", c.rank()));
        }
        match arg().as_str() {
            "broadcast" => c.broadcast(&mut buf, 0)?,
            _ => c.all_reduce(&mut buf, ReduceOp::Max)?,
        }
    }
    Ok(())
}

/// Small all_reduces in a loop (marking when the loop runs), for large
/// jobs; with `RL_ARG=skip`, rank 1 skips all_reduce #2 and stays alive
/// well past the others' timeout.
fn many(c: &Communicator) -> ringleader::Result<()> {
    let mut t = [1.0f32; 8];
    c.all_reduce(&mut t, ReduceOp::Sum)?;
    if arg() == "skip" && c.rank() == 1 {
        std::thread::sleep(Duration::from_secs(30));
        return Ok(());
    }
    for i in 0u64.. {
        if i == 3 {
            mark(&format!("busy{}", c.rank()));
        }
        c.all_reduce(&mut t, ReduceOp::Sum)?;
    }
    Ok(())
}

/// Runs a few collectives, then waits to be told (by a marker) to finish.
fn dumps(c: &Communicator) -> ringleader::Result<()> {
    let mut t = [1.0f32; 8];
    for _ in 0..3 {
        c.all_reduce(&mut t, ReduceOp::Sum)?;
    }
    mark(&format!("ready{}", c.rank()));
    let dir = std::env::var("RL_MARK_DIR").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::path::Path::new(&dir).join("finish").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    c.barrier()
}

fn straggler(c: &Communicator) -> ringleader::Result<()> {
    let mut t = [1.0f32; 8];
    for _ in 0..3 {
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_secs(3));
        }
        c.all_reduce(&mut t, ReduceOp::Sum)?;
    }
    Ok(())
}

/// Pipeline code gone wrong: every rank receives from its neighbour before
/// sending to it, so no rank ever sends.
fn recv_first(c: &Communicator) -> ringleader::Result<()> {
    let peer = 1 - c.rank();
    let mut buf = [0.0f32; 4];
    c.recv(&mut buf, peer)?;
    c.send(&buf, peer)
}

/// A chain: rank 0 receives from rank 1, which receives from rank 2, which
/// is busy in its own code and never sends.
fn recv_chain(c: &Communicator) -> ringleader::Result<()> {
    let mut buf = [0.0f32; 4];
    match c.rank() {
        2 => {
            std::thread::sleep(Duration::from_secs(7));
            c.send(&buf, 1)
        }
        r => {
            c.recv(&mut buf, r + 1)?;
            if r == 1 {
                c.send(&buf, 0)?;
            }
            Ok(())
        }
    }
}

/// 200 all_reduces, one step every 50 ms: every rank works 50 ms before
/// each one; with `RL_ARG=late` only rank 1 does, so it enters every one
/// 50 ms after the others.
fn paced(c: &Communicator) -> ringleader::Result<()> {
    let mut t = [1.0f32; 64];
    let works = arg() != "late" || c.rank() == 1;
    for _ in 0..200 {
        if works {
            std::thread::sleep(Duration::from_millis(50));
        }
        c.all_reduce(&mut t, ReduceOp::Sum)?;
    }
    Ok(())
}

/// Rank 3 skips all_reduce #2 (alive, asleep); rank 0, whose timeout is
/// the shortest, fails first and so decides the verdict, but dies (SIGKILL
/// from its own panic hook) at the moment it would offer it.
fn decider_dies(c: &Communicator) -> ringleader::Result<()> {
    if c.rank() == 0 {
        ringleader_core::fault::arm(ringleader_core::fault::Point::Decide, 2);
        std::panic::set_hook(Box::new(|info| {
            if info.to_string().contains("injected fault") {
                // SAFETY: kill(2) of this very process.
                unsafe { libc::kill(std::process::id() as i32, libc::SIGKILL) };
            }
        }));
    }
    let mut t = [1.0f32];
    c.all_reduce(&mut t, ReduceOp::Sum)?;
    if c.rank() == 3 {
        std::thread::sleep(Duration::from_secs(16));
        return c.barrier();
    }
    c.all_reduce(&mut t, ReduceOp::Sum)
}

#[test]
fn worker() {
    let Some(s) = scenario() else { return };
    let code = match s.as_str() {
        "skip_then_exit" => guarded(skip_then_exit),
        "skip_alive" => guarded(skip_alive),
        "uneven" => guarded(uneven),
        "mismatch" => guarded(mismatch),
        "monitored" => guarded(monitored),
        "monitored_many" => guarded(monitored_many),
        "busy" => guarded(busy),
        "straggler" => guarded(straggler),
        "dumps" => guarded(dumps),
        "many" => guarded(many),
        "recv_first" => guarded(recv_first),
        "paced" => guarded(paced),
        "recv_chain" => guarded(recv_chain),
        "decider_dies" => guarded(decider_dies),
        other => panic!("unknown scenario {other}"),
    };
    std::process::exit(code);
}

fn err_of(o: &Outcome) -> ErrLine {
    o.error().unwrap_or_else(|| panic!("rank {} printed no error:\n{}\n{}", o.rank, o.stdout, o.stderr))
}

#[test]
fn skipped_collective_whose_skipper_exited_is_named_at_once() {
    let outs = run(JobSpec::new(2, "skip_then_exit").env("RINGLEADER_TIMEOUT", "10").limit(30));
    assert_eq!(outs[1].code, Some(0), "rank 1 finishes cleanly: {}", outs[1].stderr);
    let e = err_of(&outs[0]);
    assert_eq!(e.kind, "missed-collective", "{}", e.message);
    assert_eq!(e.ranks, vec![1]);
    assert_eq!((e.op.as_deref(), e.seq), (Some("all_reduce"), Some(2)));
    assert!(e.message.contains("rank 1") && e.message.contains("all_reduce #2"), "{}", e.message);
    // "at once": well before the 10 s timeout.
    assert!(e.elapsed_ms < 3000, "took {} ms", e.elapsed_ms);
}

#[test]
fn skipped_collective_whose_skipper_is_alive_is_named_at_the_timeout() {
    let outs = run(JobSpec::new(3, "skip_alive").env("RINGLEADER_TIMEOUT", "3").limit(40));
    for r in [0, 2] {
        let e = err_of(&outs[r]);
        assert_eq!(e.kind, "missed-collective", "{}", e.message);
        assert_eq!(e.ranks, vec![1], "{}", e.message);
        assert_eq!(e.seq, Some(2));
        assert!(e.elapsed_ms < 3000 + 4000, "took {} ms", e.elapsed_ms);
    }
    // The skipper learns the same verdict when it comes back.
    let e1 = err_of(&outs[1]);
    assert_eq!((e1.kind.as_str(), e1.ranks.clone()), ("missed-collective", vec![1]), "{}", e1.message);
    assert_eq!(err_of(&outs[0]).message, e1.message, "the same verdict everywhere");
}

#[test]
fn uneven_iterations_are_a_mismatch_naming_both_calls() {
    let outs = run(JobSpec::new(2, "uneven").env("RINGLEADER_TIMEOUT", "20").limit(40));
    for o in &outs {
        let e = err_of(o);
        assert_eq!(e.kind, "mismatch", "{}", e.message);
        assert_eq!(e.seq, Some(5));
        assert!(e.message.contains("all_reduce") && e.message.contains("barrier"), "{}", e.message);
        assert!(e.elapsed_ms < 5000, "took {} ms", e.elapsed_ms);
    }
    assert_eq!(err_of(&outs[0]).message, err_of(&outs[1]).message);
    // One rank per host shows the whole verdict, the other one line.
    assert_eq!(err_of(&outs[0]).shown, err_of(&outs[0]).message);
    let short = err_of(&outs[1]).shown;
    assert!(
        short.starts_with("[mismatch] ")
            && short.contains("#5")
            && short.contains("; the whole verdict: rank 0's output"),
        "{short}"
    );
    assert_eq!(short.lines().count(), 1, "{short}");
}

#[test]
fn mismatched_arguments_fail_at_once_on_every_rank() {
    let cases = [
        ("shape", "f32 x 2", 2),
        ("dtype", "f64 x 4", 2),
        ("order", "broadcast", 2),
        ("root", "root 1", 2),
        ("redop", "max", 2),
        ("gather", "i32 x 3", 2),
    ];
    for (what, theirs, seq) in cases {
        let outs = run(JobSpec::new(3, "mismatch").env("RL_ARG", what).env("RINGLEADER_TIMEOUT", "30").limit(40));
        let first = err_of(&outs[0]).message;
        for o in &outs {
            let e = err_of(o);
            assert_eq!(e.kind, "mismatch", "{what}: {}", e.message);
            assert_eq!(e.ranks, vec![1], "{what}: {}", e.message);
            assert_eq!(e.seq, Some(seq), "{what}: {}", e.message);
            assert!(e.message.contains(theirs), "{what}: {}", e.message);
            assert!(e.elapsed_ms < 5000, "{what}: took {} ms", e.elapsed_ms);
            assert_eq!(e.message, first, "{what}: the same verdict everywhere");
        }
    }
}

#[test]
fn a_send_and_a_receive_that_disagree_fail_at_once_naming_both_over_both_transports() {
    for transport in ["shm", "tcp"] {
        let spec = JobSpec::new(3, "mismatch")
            .env("RL_ARG", "p2p")
            .env("RINGLEADER_TRANSPORT", transport)
            .env("RINGLEADER_TIMEOUT", "30")
            .limit(40);
        let outs = run(spec);
        let first = err_of(&outs[0]).message;
        for o in &outs {
            let e = err_of(o);
            assert_eq!(e.kind, "mismatch", "{transport}: {}", e.message);
            assert_eq!((e.op.as_deref(), e.seq), (Some("recv"), Some(1)), "{transport}: {}", e.message);
            assert_eq!(e.ranks, vec![0, 1], "{transport}: {}", e.message);
            let both = "in recv(f32 x 5, peer 0) #1 rank 0 sent send(f32 x 4, peer 1) #1";
            assert!(e.message.contains(both), "{transport}: {}", e.message);
            assert!(e.message.contains("must agree on dtype and element count"), "{transport}: {}", e.message);
            // Both calls' lines in this file.
            for at in ["rank 1's recv #1 called at tests/hangs.rs:", "rank 0's send #1 at tests/hangs.rs:"] {
                assert!(e.message.contains(at), "{transport}: {}", e.message);
            }
            assert!(e.elapsed_ms < 5000, "{transport}: took {} ms", e.elapsed_ms);
            assert_eq!(e.message, first, "{transport}: the same verdict everywhere");
        }
    }
}

#[test]
fn monitored_barrier_names_the_late_rank() {
    let outs = run(JobSpec::new(3, "monitored").env("RL_ARG", "1").limit(30));
    let e = err_of(&outs[0]);
    assert_eq!((e.kind.as_str(), e.ranks.clone()), ("missed-collective", vec![1]));
    assert!(e.message.contains("Rank 1 failed to pass monitored_barrier in 1000 ms"), "{}", e.message);
    assert!(e.elapsed_ms < 4000, "took {} ms", e.elapsed_ms);
    let e2 = err_of(&outs[2]);
    assert!(e2.message.contains("rank 0 reports: Rank 1 failed"), "{}", e2.message);
    assert!(e2.elapsed_ms < 4000, "took {} ms", e2.elapsed_ms);
}

#[test]
fn monitored_barrier_with_wait_all_names_every_late_rank() {
    let outs = run(JobSpec::new(4, "monitored").env("RL_ARG", "1,3").limit(30));
    let e = err_of(&outs[0]);
    assert_eq!(e.ranks, vec![1, 3], "{}", e.message);
    assert!(e.message.contains("Ranks 1, 3 failed to pass monitored_barrier in 1000 ms"), "{}", e.message);
}

#[test]
fn monitored_barrier_keys_are_deleted_once_every_rank_is_past_them() {
    let outs = run(JobSpec::new(3, "monitored_many").limit(60));
    for o in &outs {
        assert!(o.stdout.contains("DONE"), "rank {}:\n{}\n{}", o.rank, o.stdout, o.stderr);
    }
    let line = outs[0].lines("MBKEYS").pop().unwrap_or_else(|| panic!("{}", outs[0].stdout));
    let left: Vec<&str> = line.split_whitespace().collect();
    // Only the last barrier's: three arrivals and the result.
    assert!(left.len() <= 4, "{left:?}");
    assert!(left.iter().all(|k| k.starts_with("rl/mb/")), "{left:?}");
    let seqs: std::collections::BTreeSet<&str> = left.iter().filter_map(|k| k.split('/').nth(2)).collect();
    assert_eq!(seqs.len(), 1, "{left:?}");
}

fn kill_during(op: &str) {
    let marks = mark_dir();
    let spec = JobSpec::new(3, "busy")
        .env("RL_ARG", op)
        .env("RL_MARK_DIR", marks.to_str().unwrap())
        .env("RINGLEADER_TIMEOUT", "30")
        .env("RINGLEADER_TRANSPORT", "shm")
        .limit(40);
    let job = start(&spec);
    wait_mark(&marks, "busy1", 20);
    let victim = job.pid(1);
    let pids: Vec<String> = (0..3).map(|r| job.pid(r).to_string()).collect();
    let killed_at = now_ms();
    signal(victim, 9);
    let outs = job.finish();
    assert_eq!(outs[1].signal, Some(9));
    // Segment files are named /dev/shm/rl-<run>-<rank>-<pid>: none of this
    // job's may outlive it, the killed rank's included.
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    let ours: Vec<&String> =
        left.iter().filter(|n| n.starts_with("rl-") && pids.iter().any(|p| n.ends_with(&format!("-{p}")))).collect();
    assert!(ours.is_empty(), "shared memory left behind by the job: {ours:?}");
    for r in [0, 2] {
        let e = err_of(&outs[r]);
        assert_eq!(e.kind, "peer-died", "{}", e.message);
        assert_eq!(e.ranks, vec![1], "{}", e.message);
        assert_eq!(e.op.as_deref(), Some(op), "{}", e.message);
        assert!(e.message.contains(&format!("pid {victim}")), "{}", e.message);
        assert!(e.at_ms.saturating_sub(killed_at) < 2000, "{} ms after the kill", e.at_ms - killed_at);
    }
}

#[test]
fn kill_9_during_all_reduce_is_peer_died_within_2_s() {
    kill_during("all_reduce");
}

#[test]
fn kill_9_during_broadcast_is_peer_died_within_2_s() {
    kill_during("broadcast");
}

#[test]
fn sigstop_is_peer_stalled_at_the_timeout() {
    let marks = mark_dir();
    let spec =
        JobSpec::new(2, "busy").env("RL_MARK_DIR", marks.to_str().unwrap()).env("RINGLEADER_TIMEOUT", "4").limit(40);
    let job = start(&spec);
    wait_mark(&marks, "busy1", 20);
    let victim = job.pid(1);
    let stopped_at = now_ms();
    signal(victim, 19); // SIGSTOP
                        // Once rank 0 has its verdict, end the stopped rank.
    let pid0 = job.pid(0);
    let waiter = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && std::path::Path::new(&format!("/proc/{pid0}")).exists() {
            std::thread::sleep(Duration::from_millis(50));
        }
        signal(victim, 9);
    });
    let outs = job.finish();
    waiter.join().unwrap();
    let e = err_of(&outs[0]);
    assert_eq!(e.kind, "peer-stalled", "{}", e.message);
    assert_eq!(e.ranks, vec![1], "{}", e.message);
    assert_eq!(e.op.as_deref(), Some("all_reduce"));
    let after = e.at_ms - stopped_at;
    assert!((3000..4000 + 3000).contains(&after), "{after} ms after SIGSTOP");
}

#[test]
fn a_slow_rank_gets_straggler_warnings_never_an_error() {
    let outs =
        run(JobSpec::new(3, "straggler").env("RINGLEADER_TIMEOUT", "10").env("RINGLEADER_STALL_WARN", "1").limit(60));
    assert_all_ok(&outs);
    let warned = &outs[0].stderr;
    assert!(warned.contains("[straggler]") && warned.contains("rank 1 has not entered it"), "{warned}");
    assert!(!warned.contains("error"), "{warned}");
}

#[test]
fn sigusr1_writes_a_dump_on_demand() {
    let marks = mark_dir();
    let dumps = mark_dir();
    let spec = JobSpec::new(2, "dumps")
        .env("RL_MARK_DIR", marks.to_str().unwrap())
        .env("RINGLEADER_DUMP_DIR", dumps.to_str().unwrap())
        .limit(40);
    let job = start(&spec);
    wait_mark(&marks, "ready1", 20);
    signal(job.pid(1), 10); // SIGUSR1
                            // Each run writes into a folder of its own under RINGLEADER_DUMP_DIR.
    let run = dumps.join(&job.run_id);
    let file = run.join("ringleader-rank1.json");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !file.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(marks.join("finish"), b"").unwrap();
    let outs = job.finish();
    assert_all_ok(&outs);
    let dump: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).expect("dump written")).unwrap();
    assert_eq!(dump["rank"], 1);
    assert_eq!(dump["version"], "ringleader-dump-1");
    let entries = dump["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 3);
    assert_eq!(entries[2]["collective_seq_id"], 3);
    assert_eq!(entries[2]["profiling_name"], "ringleader:all_reduce");
    assert_eq!(entries[2]["state"], "completed");
    assert_eq!(entries[2]["input_dtypes"][0], "Float");
    assert!(!run.join("ringleader-rank0.json").exists(), "only the signalled rank dumps");
}

/// 256 real ranks on this host, over TCP (the default shared-memory rings
/// and their fastbox cells would need about 270 GiB of /dev/shm for 256
/// ranks on one host).
fn large(args: &str, timeout: &str) -> JobSpec<'static> {
    JobSpec::new(256, "many")
        .env("RL_ARG", args)
        .env("RINGLEADER_TIMEOUT", timeout)
        .env("RINGLEADER_TRANSPORT", "tcp")
        .limit(240)
}

#[test]
#[ignore = "256 processes: one to two minutes on 2 cores; run with --ignored"]
fn at_256_ranks_a_skipper_and_a_kill_9_are_named_on_every_rank() {
    let outs = run(large("skip", "15"));
    for o in outs.iter().filter(|o| o.rank != 1) {
        let e = err_of(o);
        assert_eq!((e.kind.as_str(), e.ranks.clone(), e.seq), ("missed-collective", vec![1], Some(2)), "{}", e.message);
    }
    let log: usize = outs.iter().map(|o| o.stdout.len() + o.stderr.len()).sum();
    let last = outs.iter().filter(|o| o.rank != 1).map(|o| err_of(o).elapsed_ms).max().unwrap_or(0);
    eprintln!("skip: every rank named rank 1 by {last} ms after its start; the ranks wrote {log} bytes");

    let marks = mark_dir();
    let spec = large("loop", "60").env("RL_MARK_DIR", marks.to_str().unwrap());
    let job = start(&spec);
    wait_mark(&marks, "busy1", 180);
    let victim = job.pid(1);
    let killed_at = now_ms();
    signal(victim, 9);
    let outs = job.finish();
    let mut after: Vec<u64> = Vec::new();
    for o in outs.iter().filter(|o| o.rank != 1) {
        let e = err_of(o);
        assert_eq!((e.kind.as_str(), e.ranks.clone()), ("peer-died", vec![1]), "{}", e.message);
        assert!(e.message.contains(&format!("pid {victim}")), "{}", e.message);
        after.push(e.at_ms.saturating_sub(killed_at));
    }
    after.sort_unstable();
    eprintln!(
        "kill -9: peer-died on {} ranks, {} ms (median) to {} ms after the kill",
        after.len(),
        after[after.len() / 2],
        after[after.len() - 1]
    );
    // The target is 2 s; a loaded 2-core machine running 256 ranks may
    // pass it, so the test holds the job to a bound it must never pass.
    assert!(after[after.len() - 1] < 10_000, "{after:?}");
}

#[test]
fn two_ranks_each_receiving_first_are_named_as_a_cycle_within_the_timeout_plus_2_s() {
    let outs = run(JobSpec::new(2, "recv_first").env("RINGLEADER_TIMEOUT", "3").limit(30));
    for o in &outs {
        let e = err_of(o);
        assert_eq!(e.kind, "missed-collective", "{}", e.message);
        assert_eq!(e.ranks, vec![0, 1], "{}", e.message);
        assert!(
            e.message.contains("deadlock: rank 0 waits to receive from rank 1, which waits to receive from rank 0"),
            "{}",
            e.message
        );
        assert_eq!(e.op.as_deref(), Some("recv"), "{}", e.message);
        eprintln!("rank {}: the cycle was named after {} ms (timeout 3 s)", o.rank, e.elapsed_ms);
        assert!(e.elapsed_ms < 3000 + 2000, "took {} ms", e.elapsed_ms);
    }
}

#[test]
fn a_chain_of_receives_names_the_rank_at_its_end() {
    let outs = run(JobSpec::new(3, "recv_chain").env("RINGLEADER_TIMEOUT", "3").limit(40));
    for r in [0, 1] {
        let e = err_of(&outs[r]);
        assert_eq!(e.kind, "missed-collective", "{}", e.message);
        assert_eq!(e.ranks, vec![2], "{}", e.message);
        assert!(
            e.message.contains(
                "rank 0 waits to receive from rank 1, which waits to receive from rank 2, which is outside any operation"
            ),
            "{}",
            e.message
        );
        // The verdict waits up to 2 s for the snapshot of the live rank
        // outside the operation (rank 2) before it names it.
        assert!(e.elapsed_ms < 3000 + 3000, "took {} ms", e.elapsed_ms);
    }
}

/// The share in `[straggler] rank R arrived last in P% ...` of rank 0's output.
fn arrived_last(stderr: &str, rank: usize) -> Option<u32> {
    let needle = format!("[straggler] rank {rank} arrived last in ");
    let at = stderr.find(&needle)? + needle.len();
    stderr[at..].split('%').next()?.parse().ok()
}

#[test]
fn a_rank_late_to_every_step_is_named_by_its_arrivals() {
    let outs = run(JobSpec::new(3, "paced").env("RL_ARG", "late").env("RINGLEADER_TIMEOUT", "20").limit(60));
    assert_all_ok(&outs);
    let share = arrived_last(&outs[0].stderr, 1).unwrap_or_else(|| panic!("no straggler warning:\n{}", outs[0].stderr));
    assert!(share > 90, "{}", outs[0].stderr);
    assert!(outs[0].stderr.contains("median lag"), "{}", outs[0].stderr);
    for r in [0, 2] {
        assert_eq!(arrived_last(&outs[0].stderr, r), None, "{}", outs[0].stderr);
    }
}

#[test]
fn ranks_at_the_same_pace_raise_no_straggler_warning() {
    let outs = run(JobSpec::new(3, "paced").env("RINGLEADER_TIMEOUT", "20").limit(60));
    assert_all_ok(&outs);
    for o in &outs {
        assert!(!o.stderr.contains("[straggler]"), "rank {}: {}", o.rank, o.stderr);
    }
}

#[test]
fn a_stopped_rank_is_named_as_silent_long_before_the_timeout() {
    let marks = mark_dir();
    let spec =
        JobSpec::new(3, "busy").env("RL_MARK_DIR", marks.to_str().unwrap()).env("RINGLEADER_TIMEOUT", "60").limit(60);
    let job = start(&spec);
    wait_mark(&marks, "busy1", 20);
    let victim = job.pid(1);
    signal(victim, 19); // SIGSTOP
                        // The store pushes the silence 3 s after the last heartbeat; the kill
                        // 8 s after the stop ends the job long before its 60 s timeout.
    std::thread::sleep(Duration::from_secs(8));
    signal(victim, 9);
    let outs = job.finish();
    let warned: Vec<&str> = outs
        .iter()
        .filter(|o| o.rank != 1)
        .flat_map(|o| o.stderr.lines())
        .filter(|l| l.contains("has sent no heartbeat"))
        .collect();
    assert!(!warned.is_empty(), "no silence warning: {:?}", outs.iter().map(|o| &o.stderr).collect::<Vec<_>>());
    for l in &warned {
        assert!(l.contains("rank 1 (") && l.contains(&format!("pid {victim})")), "{l}");
        assert!(l.contains("stopped (SIGSTOP"), "{l}");
    }
    assert!(warned.len() <= 2, "only the ranks that wait for it warn: {warned:?}");
    eprintln!("{}", warned[0]);
    for o in outs.iter().filter(|o| o.rank != 1) {
        assert_eq!(err_of(o).kind, "peer-died", "{}", o.stderr);
    }
}

#[test]
fn a_decider_that_dies_is_succeeded_by_one_rank() {
    let spec = JobSpec::new(4, "decider_dies")
        .per_rank(|r| {
            let timeout = if r == 0 { "2" } else { "4" };
            vec![("RINGLEADER_TIMEOUT".into(), timeout.into()), ("RINGLEADER_LOG".into(), "ringleader=info".into())]
        })
        .limit(45);
    let outs = run(spec);
    assert_eq!(outs[0].code, None, "rank 0 died at its decision: {}", outs[0].stderr);
    // The followers waited for the dead decider's verdict, then one of
    // them decided in its place: the succession's one gather, not one per
    // rank.
    let successors: Vec<usize> =
        (1..4).filter(|&r| outs[r].stderr.contains("decides in the decider's place")).collect();
    assert_eq!(successors.len(), 1, "one successor, not {successors:?}");
    let verdicts: Vec<ErrLine> = (1..4).map(|r| err_of(&outs[r])).collect();
    for (r, e) in (1..4).zip(&verdicts) {
        assert_eq!(e.message, verdicts[0].message, "rank {r}: the same verdict everywhere");
        assert!(e.ranks.contains(&3) || e.ranks.contains(&0), "rank {r}: {}", e.message);
    }
    for r in [1, 2] {
        let e = &verdicts[r - 1];
        // The timeout, the follower's wait for the dead decider's verdict
        // (7 s, src/agreement.rs FOLLOW), the successor's gather (at most
        // 2 s), and slack.
        let bound = 4_000 + 7_000 + 2_000 + 4_000;
        assert!(e.elapsed_ms < bound, "rank {r} took {} ms (bound {bound})", e.elapsed_ms);
    }
}
