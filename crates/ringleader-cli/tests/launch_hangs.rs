//! Hangs provoked under `ringleader launch`, as a user meets them: the
//! launcher's own report (which rank ended, how) and the survivors'
//! verdict, which knows from the launcher how the culprit ended. The ranks
//! are this test binary, re-run by the launcher as workers.

mod common;

use common::run;
use ringleader::{Communicator, ReduceOp};
use std::time::{Duration, Instant};

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
        _ => {}
    }
    c.destroy().unwrap();
    std::process::exit(0);
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
    let out = launch("2", "skip");
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("[rank0]: VERDICT [missed-collective] rank 1"), "{}", out.stdout);
    assert!(out.stdout.contains("did not enter all_reduce #2"), "{}", out.stdout);
    assert!(verdict_ms(&out.stdout) < 2000);
    assert!(out.stderr.contains("rank 0"), "the launcher names the rank that failed: {}", out.stderr);
}

#[test]
fn a_killed_rank_under_launch_is_named_with_how_it_ended() {
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
