//! `ringleader perf` end to end: the binary starts its own ranks, which run
//! real collectives over the runtime and check every result.

mod common;

use common::{run, Scratch};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn all_reduce_two_ranks_checks_clean_and_writes_json_lines() {
    let dir = Scratch::new("perf-ar");
    let json = dir.0.join("out.jsonl");
    let f = run(
        &[
            "perf",
            "--op",
            "all_reduce",
            "--nproc",
            "2",
            "-b",
            "8",
            "-e",
            "64K",
            "-f",
            "2",
            "-n",
            "20",
            "-w",
            "2",
            "--json",
            json.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert_eq!(f.code, Some(0), "{f:#?}");
    let rows: Vec<Vec<&str>> =
        f.stdout.lines().filter(|l| !l.starts_with('#')).map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.len(), 14, "8 B to 64 KiB: {f:#?}");
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.len(), 9, "{r:?}");
        assert_eq!(r[0], (8u64 << i).to_string(), "{r:?}");
        assert_eq!(r[1], (2u64 << i).to_string(), "{r:?}");
        assert_eq!((r[2], r[3], r[4]), ("float", "sum", "-1"), "{r:?}");
        assert_eq!(r[8], "0", "#wrong: {r:?}");
        assert!(r[5].parse::<f64>().unwrap() > 0.0, "{r:?}");
    }
    assert!(f.stdout.contains("# Out of bounds values : 0 OK"), "{f:#?}");

    let text = std::fs::read_to_string(&json).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 14);
    for (i, j) in lines.iter().enumerate() {
        assert_eq!(j["op"], "all_reduce");
        assert_eq!(j["nproc"], 2);
        assert_eq!(j["bytes"], 8u64 << i);
        assert_eq!(j["count"], 2u64 << i);
        assert_eq!(j["dtype"], "f32");
        assert_eq!(j["redop"], "sum");
        assert_eq!(j["wrong"], 0);
        assert_eq!(j["check"], "ok");
        assert_eq!(j["iters"], 20);
        assert!(j["lib"].as_str().unwrap().starts_with("ringleader-"), "{j}");
        assert_eq!(j["lib_version"], env!("CARGO_PKG_VERSION"));
        let (t, alg, bus) =
            (j["time_us"].as_f64().unwrap(), j["algbw_GBps"].as_f64().unwrap(), j["busbw_GBps"].as_f64().unwrap());
        assert!(t > 0.0);
        let expect = (8u64 << i) as f64 / (t * 1e-6) / 1e9;
        assert!((alg - expect).abs() <= 1e-9 * expect.max(1.0), "{j}");
        // all_reduce over 2 ranks: busbw = algbw x 2(n-1)/n = algbw.
        assert!((bus - alg).abs() <= 1e-12, "{j}");
    }
}

#[test]
fn other_ops_and_dtypes_check_clean() {
    for args in [
        &["--op", "all_gather", "--nproc", "3", "-d", "bf16"][..],
        &["--op", "reduce_scatter", "--nproc", "3", "-d", "i32", "-o", "max"][..],
        &["--op", "broadcast", "--nproc", "2", "--root", "1", "-d", "f16"][..],
        &["--op", "reduce", "--nproc", "3", "--root", "2", "-o", "avg"][..],
        &["--op", "all_to_all", "--nproc", "2", "-d", "u8"][..],
    ] {
        let mut all = vec!["perf", "-b", "64", "-e", "4K", "-f", "8", "-n", "3", "-w", "1"];
        all.extend_from_slice(args);
        let f = run(&all, LIMIT);
        assert_eq!(f.code, Some(0), "{args:?}: {f:#?}");
        let rows: Vec<&str> = f.stdout.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(rows.len(), 3, "{args:?}: {f:#?}");
        assert!(rows.iter().all(|r| r.trim_end().ends_with(" 0")), "{args:?}: {f:#?}");
    }
}

#[test]
fn time_limit_kills_the_workers_and_says_so() {
    let f = run(&["perf", "--nproc", "2", "-b", "64M", "-e", "64M", "-n", "1000", "--time-limit", "1.5"], LIMIT);
    assert_eq!(f.code, Some(1), "{f:#?}");
    assert!(f.stderr.contains("the time limit of 1.5 s passed; killed ranks 0, 1 (still running)"), "{f:#?}");
}

#[test]
fn bad_arguments_exit_2_before_starting_anything() {
    let f = run(&["perf", "--nproc", "2", "--root", "5"], LIMIT);
    assert_eq!(f.code, Some(2), "{f:#?}");
    assert!(f.stderr.contains("[invalid-argument]") && f.stderr.contains("--root"), "{f:#?}");
    let f = run(&["perf", "--op", "barrier"], LIMIT);
    assert_eq!(f.code, Some(2), "{f:#?}");
}
