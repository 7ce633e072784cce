//! Hangs provoked under `ringleader launch`, as a user meets them: the
//! launcher's own report (which rank ended, how) and the survivors'
//! verdict, which knows from the launcher how the culprit ended. The ranks
//! are this test binary, re-run by the launcher as workers.

mod common;

use common::{run, start_env, Scratch};
use ringleader::{Communicator, ReduceOp};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One job of this file at a time: the 32-rank job alone loads both cores
/// of a small machine for seconds, and the tests here assert how soon a
/// verdict comes (a 3-rank job's took 10.5 s beside it on a 2-core VM, 4.9 s
/// alone).
static ONE_JOB: Mutex<()> = Mutex::new(());

fn one_job() -> MutexGuard<'static, ()> {
    ONE_JOB.lock().unwrap_or_else(|e| e.into_inner())
}

const SCENARIO: &str = "RL_LAUNCH_SCENARIO";

/// Entry point of the ranks (a no-op in a normal test run).
#[test]
fn worker() {
    let Ok(s) = std::env::var(SCENARIO) else { return };
    let c = Communicator::from_env().expect("init");
    let mut t = [1.0f32];
    c.all_reduce(&mut t, ReduceOp::Sum).expect("first all_reduce");
    let start = Instant::now();
    match s.as_str() {
        // The seed's bug: only rank 0 makes a second all_reduce.
        "skip" if c.rank() == 0 => {
            let e = c.all_reduce(&mut t, ReduceOp::Sum).unwrap_err();
            println!("VERDICT {} after {} ms", e.to_string().lines().next().unwrap_or(""), start.elapsed().as_millis());
            std::process::exit(1);
        }
        // Rank 1 is killed (as by the OOM killer) while the others wait.
        "killed" if c.rank() == 1 => {
            std::thread::sleep(Duration::from_millis(200));
            let _ = std::process::Command::new("kill").args(["-9", &std::process::id().to_string()]).status();
            std::thread::sleep(Duration::from_secs(10));
        }
        "killed" => {
            let mut big = vec![1.0f32; 1 << 16];
            let e = c.all_reduce(&mut big, ReduceOp::Sum).unwrap_err();
            println!("VERDICT {} after {} ms", e.to_string().lines().next().unwrap_or(""), start.elapsed().as_millis());
            std::process::exit(1);
        }
        // Rank 2 sleeps in its own code instead of making all_reduce #2:
        // it never reads the verdict, so the launcher must end it.
        "sleep" if c.rank() == 2 => std::thread::sleep(Duration::from_secs(60)),
        "sleep" => {
            println!("HANG_START {}", epoch_ms());
            let e = c.all_reduce(&mut t, ReduceOp::Sum).unwrap_err();
            println!("VERDICT_AT {}", epoch_ms());
            println!("VERDICT {} after {} ms", e.to_string().lines().next().unwrap_or(""), start.elapsed().as_millis());
            std::process::exit(1);
        }
        // As `sleep`, but the ranks print nothing of their own: what the
        // job's log holds is ringleader's and the launcher's alone.
        "quiet_sleep" if c.rank() == 2 => std::thread::sleep(Duration::from_secs(60)),
        "quiet_sleep" => {
            let _ = c.all_reduce(&mut t, ReduceOp::Sum).unwrap_err();
            std::process::exit(1);
        }
        // Rank 1 sleeps in a function of its own instead of making
        // all_reduce #2: the verdict shows that function, from rank 1's
        // native stack.
        "sleep_named" if c.rank() == 1 => load_batch_in_rust(),
        "sleep_named" => {
            let e = c.all_reduce(&mut t, ReduceOp::Sum).unwrap_err();
            for line in e.to_string().lines() {
                println!("VERDICT {line}");
            }
            std::process::exit(1);
        }
        // 60 steps with rank 1 entering each 50 ms late; then rank 3 writes
        // its dump and leaves instead of making all_reduce #62.
        "late_then_skip" => {
            for _ in 0..60 {
                if c.rank() == 1 {
                    std::thread::sleep(Duration::from_millis(50));
                }
                c.all_reduce(&mut t, ReduceOp::Sum).expect("a paced all_reduce");
            }
            if c.rank() == 3 {
                c.dump(None).expect("dump");
            } else {
                let e = c.all_reduce(&mut t, ReduceOp::Sum).unwrap_err();
                println!("VERDICT {}", e.to_string().lines().next().unwrap_or(""));
                std::process::exit(1);
            }
        }
        // A job that runs (all_reduce every 5 ms) until told to stop, rank 0
        // saying where its store is.
        "running" => {
            let dir = std::path::PathBuf::from(std::env::var("RL_SCRATCH").expect("RL_SCRATCH"));
            if c.rank() == 0 {
                let addr = std::env::var("RINGLEADER_STORE_ADDR").expect("the launcher's store");
                std::fs::write(dir.join("store.tmp"), addr).unwrap();
                std::fs::rename(dir.join("store.tmp"), dir.join("store")).unwrap();
            }
            loop {
                c.all_reduce(&mut t, ReduceOp::Sum).expect("a running all_reduce");
                let stop = [0.0f32 + f32::from(u8::from(dir.join("stop").exists()))];
                let mut any = stop;
                c.all_reduce(&mut any, ReduceOp::Max).expect("the stop vote");
                if any[0] > 0.0 || start.elapsed() > Duration::from_secs(40) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        _ => {}
    }
    c.destroy().unwrap();
    std::process::exit(0);
}

/// Where rank 1 of `sleep_named` stays: a function of this program's own,
/// which its native stack must name. (Work after the sleep keeps it a
/// frame of its own: a function that ends in a tail call, or that is
/// inlined, leaves no frame to name, and symbols are all a native stack
/// has.)
#[inline(never)]
fn load_batch_in_rust() {
    std::thread::sleep(Duration::from_secs(30));
    std::hint::black_box(epoch_ms());
}

fn epoch_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// The first `TAG <ms>` line's number.
fn stamp(stdout: &str, tag: &str) -> u64 {
    let line = stdout.lines().find(|l| l.contains(tag)).unwrap_or_else(|| panic!("no {tag}:\n{stdout}"));
    line.rsplit(' ').next().unwrap().trim().parse().unwrap()
}

fn launch(n: &str, scenario: &str) -> common::Finished {
    let exe = std::env::current_exe().unwrap();
    let exe = exe.to_str().unwrap();
    // Through `env`, not set_var: the tests of this file run in parallel.
    let scenario = format!("{SCENARIO}={scenario}");
    run(
        &[
            "launch",
            "--nproc-per-node",
            n,
            "--grace",
            "3",
            "--",
            "env",
            &scenario,
            "RINGLEADER_TIMEOUT=20",
            exe,
            "--exact",
            "worker",
            "--nocapture",
            "-q",
        ],
        Duration::from_secs(60),
    )
}

fn verdict_ms(stdout: &str) -> u64 {
    let line = stdout.lines().find(|l| l.contains("VERDICT")).unwrap_or_else(|| panic!("no verdict:\n{stdout}"));
    line.rsplit("after ").next().unwrap().trim_end_matches(" ms").parse().unwrap()
}

#[test]
fn a_skipped_collective_under_launch_names_rank_1_at_once() {
    let _one = one_job();
    let out = launch("2", "skip");
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("[rank0]: VERDICT [missed-collective] rank 1"), "{}", out.stdout);
    assert!(out.stdout.contains("did not enter all_reduce #2"), "{}", out.stdout);
    assert!(verdict_ms(&out.stdout) < 2000);
    assert!(out.stderr.contains("rank 0"), "the launcher names the rank that failed: {}", out.stderr);
}

#[test]
fn a_killed_rank_under_launch_is_named_with_how_it_ended() {
    let _one = one_job();
    let out = launch("3", "killed");
    assert!(out.stderr.contains("rank 1") && out.stderr.contains("SIGKILL"), "launcher: {}", out.stderr);
    for r in [0, 2] {
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("[rank{r}]: VERDICT")))
            .unwrap_or_else(|| panic!("{}", out.stdout));
        assert!(line.contains("[peer-died] rank 1"), "{line}");
        assert!(line.contains("killed by signal 9"), "the launcher's exit record reached the verdict: {line}");
    }
    assert_ne!(out.code, Some(0));
}

/// The hard timeout of [`a_failed_job_ends_within_2_s_of_its_verdict`].
const SLEEP_TIMEOUT_S: u64 = 4;

#[test]
fn a_failed_job_ends_within_2_s_of_its_verdict() {
    let _one = one_job();
    let exe = std::env::current_exe().unwrap();
    let timeout = format!("RINGLEADER_TIMEOUT={SLEEP_TIMEOUT_S}");
    let scenario = format!("{SCENARIO}=sleep");
    let started = Instant::now();
    // The default --grace (5 s): only the verdict can end the job sooner.
    let out = run(
        &[
            "launch",
            "--nproc-per-node",
            "3",
            "--",
            "env",
            &scenario,
            &timeout,
            exe.to_str().unwrap(),
            "--exact",
            "worker",
            "--nocapture",
            "-q",
        ],
        Duration::from_secs(60),
    );
    let (ended, took) = (epoch_ms(), started.elapsed());
    assert!(out.stdout.contains("[rank0]: VERDICT [missed-collective] rank 2"), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("the job failed"), "{}", out.stderr);
    assert!(out.stderr.contains("rank 2") && out.stderr.contains("SIGTERM"), "{}", out.stderr);
    assert_ne!(out.code, Some(0));
    let (hang, verdict) = (stamp(&out.stdout, "HANG_START"), stamp(&out.stdout, "VERDICT_AT"));
    eprintln!(
        "hang to verdict {} ms, verdict to the job's end {} ms, hang to end {} ms (timeout {SLEEP_TIMEOUT_S} s; \
         the whole launch {:.1} s)",
        verdict - hang,
        ended - verdict,
        ended - hang,
        took.as_secs_f64()
    );
    assert!(ended - verdict < 2000 + 500, "the job ended {} ms after its verdict:\n{}", ended - verdict, out.stderr);
    assert!(
        ended - hang < (SLEEP_TIMEOUT_S + 3) * 1000,
        "the job ended {} ms after the hang:\n{}",
        ended - hang,
        out.stderr
    );
}

#[test]
fn the_verdict_shows_the_function_a_rust_rank_sleeps_in() {
    let _one = one_job();
    let exe = std::env::current_exe().unwrap();
    let dumps = Scratch::new("launch-sleep-named");
    let dump_dir = format!("RINGLEADER_DUMP_DIR={}", dumps.path());
    let scenario = format!("{SCENARIO}=sleep_named");
    let args = ["launch", "--nproc-per-node", "2", "--", "env", &scenario, &dump_dir, "RINGLEADER_TIMEOUT=3"];
    let mut args = args.to_vec();
    args.extend([exe.to_str().unwrap(), "--exact", "worker", "--nocapture", "-q"]);
    let out = run(&args, Duration::from_secs(60));
    assert!(out.stdout.contains("[rank0]: VERDICT [missed-collective] rank 1"), "{}\n{}", out.stdout, out.stderr);
    let at =
        out.stdout.lines().find(|l| l.contains("VERDICT   rank 1 is at ")).unwrap_or_else(|| panic!("{}", out.stdout));
    assert!(at.contains("launch_hangs::load_batch_in_rust"), "{at}");
    // The test binary has line tables: the frame shows the sleep's own
    // source line, as a Python frame would.
    assert!(at.contains("launch_hangs.rs:") && at.contains("std::thread::sleep(Duration::from_secs(30))"), "{at}");
    // Its dump holds every thread's native stack, the sleeping one by
    // name; `ringleader analyze` prints them.
    let dir = std::fs::read_dir(dumps.path()).unwrap().flatten().next().expect("the run's folder").path();
    let dump: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("ringleader-rank1.json")).unwrap()).unwrap();
    let native = dump["stacks"]["native"].as_array().expect("native stacks");
    assert!(native.len() >= 3, "the caller, the engine and the monitor at least: {native:?}");
    let names: Vec<&str> =
        native.iter().flat_map(|t| t["frames"].as_array().unwrap()).filter_map(|f| f["function"].as_str()).collect();
    assert!(names.contains(&"launch_hangs::load_batch_in_rust"), "{names:?}");
    let analyze = run(&["analyze", dir.to_str().unwrap()], Duration::from_secs(30));
    assert!(analyze.stdout.contains("rank 1 (pid "), "{}", analyze.stdout);
    assert!(analyze.stdout.contains("in launch_hangs::load_batch_in_rust"), "{}", analyze.stdout);
    assert!(analyze.stdout.contains("native thread"), "{}", analyze.stdout);
}

#[test]
fn analyze_names_the_late_rank_and_writes_a_timeline_of_a_failed_4_rank_job() {
    let _one = one_job();
    let exe = std::env::current_exe().unwrap();
    let dumps = Scratch::new("launch-late-then-skip");
    let dump_dir = format!("RINGLEADER_DUMP_DIR={}", dumps.path());
    let scenario = format!("{SCENARIO}=late_then_skip");
    let args = ["launch", "--nproc-per-node", "4", "--", "env", &scenario, &dump_dir, "RINGLEADER_TIMEOUT=20"];
    let mut args = args.to_vec();
    args.extend([exe.to_str().unwrap(), "--exact", "worker", "--nocapture", "-q"]);
    let job = run(&args, Duration::from_secs(60));
    assert!(job.stdout.contains("[rank0]: VERDICT [missed-collective] rank 3"), "{}\n{}", job.stdout, job.stderr);

    let trace = format!("{}/trace.json", dumps.path());
    let out = run(&["analyze", dumps.path(), "--trace", &trace], Duration::from_secs(30));
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("[missed-collective] rank 3"), "{}", out.stdout);
    let line =
        out.stdout.lines().find(|l| l.contains("rank 1 arrived last in")).unwrap_or_else(|| panic!("{}", out.stdout));
    let share: u32 = line.split("arrived last in ").nth(1).unwrap().split('%').next().unwrap().parse().unwrap();
    assert!(share > 90 && line.ends_with("<- straggler"), "{line}");
    assert_eq!(out.stdout.matches("<- straggler").count(), 1, "{}", out.stdout);
    assert!(out.stdout.contains("launch_hangs.rs:"), "call sites in the table: {}", out.stdout);

    // The trace, read back as a trace reader would: Trace Event Format
    // (JSON object form): metadata events name processes and threads,
    // complete events have a timestamp and a duration in microseconds.
    let t: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let ev = t["traceEvents"].as_array().unwrap();
    for e in ev {
        let ph = e["ph"].as_str().unwrap();
        assert!(["M", "X", "i"].contains(&ph), "{e}");
        assert!(e["pid"].is_u64() && e["tid"].is_u64() && e["name"].is_string(), "{e}");
        if ph == "X" {
            assert!(e["ts"].as_f64().unwrap() >= 0.0 && e["dur"].as_f64().unwrap() >= 0.0, "{e}");
        }
    }
    let mut procs: Vec<u64> =
        ev.iter().filter(|e| e["name"] == "process_name").map(|e| e["pid"].as_u64().unwrap()).collect();
    procs.sort_unstable();
    assert_eq!(procs, vec![0, 1, 2, 3], "one process per rank");
    let tracks = ev.iter().filter(|e| e["name"] == "thread_name").count();
    assert_eq!(tracks, 4, "one communicator track per rank");
    let failed: Vec<&serde_json::Value> =
        ev.iter().filter(|e| e["ph"] == "X" && e["args"]["state"] == "failed").collect();
    assert_eq!(failed.len(), 3, "ranks 0-2 failed in all_reduce #62: {failed:?}");
    for f in failed {
        assert_eq!((f["name"].as_str(), f["args"]["seq"].as_u64()), (Some("all_reduce #62 FAILED"), Some(62)));
        assert!(f["args"]["call_site"].as_str().unwrap().contains("launch_hangs.rs:"), "{f}");
    }
    let slices = ev.iter().filter(|e| e["ph"] == "X" && e["pid"] == 3).count();
    assert_eq!(slices, 61, "rank 3 recorded all_reduce #1-61");

    // Every rank measured its clock against the store's at init (one host
    // here, one clock: the offset is within half the round trip).
    let mut dumps_seen = 0;
    let mut stack = vec![dumps.0.clone()];
    while let Some(d) = stack.pop() {
        for f in std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().path()) {
            if f.is_dir() {
                stack.push(f);
            } else if f.extension().is_some_and(|x| x == "json") && f.file_name() != Some("trace.json".as_ref()) {
                let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
                let (off, rtt) = (j["clock_offset_ns"].as_i64(), j["clock_rtt_ns"].as_u64());
                let (off, rtt) = (off.unwrap_or_else(|| panic!("{}: no clock offset", f.display())), rtt.unwrap());
                assert!(rtt > 0 && off.unsigned_abs() <= rtt / 2 + 1, "{}: offset {off} ns, rtt {rtt} ns", f.display());
                dumps_seen += 1;
            }
        }
    }
    assert!(dumps_seen >= 4, "a dump per rank: {dumps_seen}");
}

/// Ranks of [`a_hang_in_a_32_rank_job_writes_a_line_per_rank_at_most`].
const QUIET_RANKS: usize = 32;

#[test]
fn a_hang_in_a_32_rank_job_writes_a_line_per_rank_at_most() {
    let _one = one_job();
    let exe = std::env::current_exe().unwrap();
    let scenario = format!("{SCENARIO}=quiet_sleep");
    let n = QUIET_RANKS.to_string();
    // TCP: 32 ranks' shared-memory rings would take gigabytes of /dev/shm.
    let out = run(
        &[
            "launch",
            "--nproc-per-node",
            &n,
            "--grace",
            "3",
            "--",
            "env",
            &scenario,
            "RINGLEADER_TIMEOUT=4",
            "RINGLEADER_TRANSPORT=tcp",
            exe.to_str().unwrap(),
            "--exact",
            "worker",
            "--nocapture",
            "-q",
        ],
        Duration::from_secs(120),
    );
    // stderr: ringleader's lines and the launcher's (the ranks' stdout holds
    // only the test harness's own banner).
    let log = out.stderr;
    assert!(log.contains("[missed-collective] rank 2 "), "{log}");
    // Nothing per rank from the store or the launcher once the job failed:
    // the teardown is one line per way of ending.
    assert!(!log.contains("vanished") && !log.contains("connection dropped"), "{log}");
    let launcher = log.lines().filter(|l| l.starts_with("ringleader launch: ")).count();
    assert!(launcher <= 9, "{launcher} launcher lines:\n{log}");
    // One line per rank (the error the program gets holds the whole
    // verdict): rank 0's headline, and on the others a short line that
    // points there.
    for r in 0..QUIET_RANKS {
        let lines: Vec<&str> = log.lines().filter(|l| l.starts_with(&format!("[rank{r}]: "))).collect();
        assert!(lines.len() <= 1, "rank {r} wrote {} lines:\n{log}", lines.len());
        if let (Some(l), true) = (lines.first(), r > 0) {
            assert!(l.contains("; the whole verdict: rank 0's output") && l.len() < 300, "{l}");
        }
    }
    // The same short line from many ranks: 8 print it, the launcher counts
    // the others in one line of its own at the end.
    let pointers = log.lines().filter(|l| l.contains("; the whole verdict: rank 0's output")).count();
    let counted: usize = log
        .lines()
        .filter_map(|l| l.strip_prefix("ringleader launch: "))
        .filter_map(|l| l.split_once(" more cop").and_then(|(n, _)| n.parse::<usize>().ok()))
        .sum();
    assert!(pointers <= 8, "{pointers} copies of the short line:\n{log}");
    assert!(counted == 0 || pointers == 8, "{counted} counted with only {pointers} printed:\n{log}");
    assert!(pointers + counted < QUIET_RANKS, "{log}");
    eprintln!(
        "a 32-rank hang: {} bytes of log, {} lines; the short line {pointers} times, {counted} more counted",
        log.len(),
        log.lines().count()
    );
    assert!(log.len() < 16 * 1024, "{} bytes:\n{log}", log.len());
}

#[test]
fn status_writes_the_timeline_of_a_running_job() {
    let _one = one_job();
    let exe = std::env::current_exe().unwrap();
    let dir = Scratch::new("launch-running-trace");
    let scratch = format!("RL_SCRATCH={}", dir.path());
    let scenario = format!("{SCENARIO}=running");
    let mut args = vec!["launch", "--nproc-per-node", "4", "--", "env", &scenario, &scratch];
    args.extend([exe.to_str().unwrap(), "--exact", "worker", "--nocapture", "-q"]);
    let job = start_env(&args, &[]);
    dir.wait_for(&["store"], Duration::from_secs(30));
    let addr = std::fs::read_to_string(dir.0.join("store")).unwrap();

    // From outside the job, as a user would: the launcher's secret is found
    // by the store's port, the ranks answer at their next heartbeat.
    let trace = format!("{}/running.json", dir.path());
    let out = run(&["status", "--store", &addr, "--trace", &trace], Duration::from_secs(30));
    std::fs::write(dir.0.join("stop"), b"").unwrap();
    let job = job.finish(Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("wrote the timeline of 4 rank(s)"), "{}", out.stdout);
    assert!(!out.stdout.contains("did not answer"), "{}", out.stdout);
    assert_eq!(job.code, Some(0), "the job runs on: {}\n{}", job.stdout, job.stderr);

    let t: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let ev = t["traceEvents"].as_array().unwrap();
    let mut procs: Vec<u64> =
        ev.iter().filter(|e| e["name"] == "process_name").map(|e| e["pid"].as_u64().unwrap()).collect();
    procs.sort_unstable();
    assert_eq!(procs, vec![0, 1, 2, 3], "one process per rank");
    for rank in 0..4u64 {
        let slices: Vec<&serde_json::Value> = ev.iter().filter(|e| e["ph"] == "X" && e["pid"] == rank).collect();
        assert!(!slices.is_empty(), "rank {rank} has collectives on its track");
        assert!(slices.iter().all(|s| s["name"].as_str().unwrap().starts_with("all_reduce #")), "{slices:?}");
        assert!(slices.iter().all(|s| s["args"]["state"] != "failed"), "{slices:?}");
    }
}
