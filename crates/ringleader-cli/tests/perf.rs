//! `ringleader perf` end to end: the binary starts its own ranks, which run
//! real collectives over the runtime and check every result; its output is
//! read back with a parser of nccl-tests' output format ([`nccl`]).
//!
//! Every run goes through [`common::run`], which kills the process group
//! and fails the test past its time limit.

mod common;

use common::{run, Scratch};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// A reader of nccl-tests' output, written from its documented format (its
/// README and doc/PERFORMANCE.md, and the layout its tables have):
///
/// - header lines start with `#`; among them `# nThread N nGpus N minBytes
///   N maxBytes N step: N(factor|bytes) warmup iters: N iters: N agg iters:
///   N validation: N graph: N`, then `# Using devices` followed by one
///   `#  Rank R Group G Pid P on HOST device D [BUS] NAME` line per rank;
/// - every other non-empty line is a result: 13 whitespace-separated
///   fields, `size count type redop root`, then `time algbw busbw #wrong`
///   out of place and the same four in place; `N/A` stands for a field
///   that was not measured (a time or bandwidth read as NaN, so that a
///   test expecting a number fails on it);
/// - the end: `# Out of bounds values : N OK|FAILED` and `# Avg bus
///   bandwidth    : X`.
///
/// It knows nothing of ringleader: it ignores the `#` lines it does not
/// know, and refuses (panics on) a result line that does not fit.
mod nccl {
    /// The parameters of the `# nThread ...` line, by label.
    pub(crate) const PARAMS: [&str; 10] = [
        "nThread",
        "nGpus",
        "minBytes",
        "maxBytes",
        "step:",
        "warmup iters:",
        "iters:",
        "agg iters:",
        "validation:",
        "graph:",
    ];

    /// One `#  Rank ...` line.
    #[derive(Debug, Clone, PartialEq)]
    pub(crate) struct Device {
        pub(crate) rank: usize,
        pub(crate) group: usize,
        pub(crate) pid: u32,
        pub(crate) host: String,
        pub(crate) device: i64,
        pub(crate) bus: String,
        pub(crate) name: String,
    }

    /// One column group of a result line.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub(crate) struct Group {
        /// NaN for `N/A`, as are the bandwidths.
        pub(crate) time_us: f64,
        pub(crate) algbw: f64,
        pub(crate) busbw: f64,
        /// `None` for `N/A`.
        pub(crate) wrong: Option<u64>,
    }

    /// One result line.
    #[derive(Debug, Clone, PartialEq)]
    pub(crate) struct Row {
        pub(crate) size: u64,
        pub(crate) count: u64,
        pub(crate) dtype: String,
        pub(crate) redop: String,
        pub(crate) root: i64,
        pub(crate) out_of_place: Group,
        pub(crate) in_place: Group,
    }

    /// A whole output.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct Output {
        /// The `# nThread` line's values, in [`PARAMS`] order.
        pub(crate) params: Vec<String>,
        pub(crate) devices: Vec<Device>,
        pub(crate) rows: Vec<Row>,
        /// `# Out of bounds values`: the count and OK / FAILED.
        pub(crate) out_of_bounds: Option<(u64, String)>,
        pub(crate) avg_busbw: Option<f64>,
    }

    impl Output {
        /// A parameter of the `# nThread` line by its label.
        pub(crate) fn param(&self, label: &str) -> &str {
            let i = PARAMS.iter().position(|p| *p == label).expect("a known label");
            &self.params[i]
        }
    }

    fn num<T: std::str::FromStr>(s: &str, what: &str, line: &str) -> T {
        s.parse().unwrap_or_else(|_| panic!("{what} {s:?} is not a number in {line:?}"))
    }

    /// A number, or NaN for `N/A`.
    fn measured(s: &str, what: &str, line: &str) -> f64 {
        if s == "N/A" {
            f64::NAN
        } else {
            num(s, what, line)
        }
    }

    fn group(f: &[&str], line: &str) -> Group {
        Group {
            time_us: measured(f[0], "time", line),
            algbw: measured(f[1], "algbw", line),
            busbw: measured(f[2], "busbw", line),
            wrong: if f[3] == "N/A" { None } else { Some(num(f[3], "#wrong", line)) },
        }
    }

    /// `#  Rank R Group G Pid P on HOST device D [BUS] NAME`.
    fn device(line: &str) -> Device {
        let rest = line.trim_start_matches('#');
        let (head, tail) = rest.split_once('[').unwrap_or_else(|| panic!("no [bus] in {line:?}"));
        let (bus, name) = tail.split_once(']').unwrap_or_else(|| panic!("no ] in {line:?}"));
        let w: Vec<&str> = head.split_whitespace().collect();
        assert_eq!(
            (w.len(), w[0], w[2], w[4], w[6], w[8]),
            (10, "Rank", "Group", "Pid", "on", "device"),
            "a device line: {line:?}"
        );
        Device {
            rank: num(w[1], "rank", line),
            group: num(w[3], "group", line),
            pid: num(w[5], "pid", line),
            host: w[7].to_string(),
            device: num(w[9], "device", line),
            bus: bus.to_string(),
            name: name.trim().to_string(),
        }
    }

    /// Parses `text`; panics on a result line that is not nccl-tests'.
    pub(crate) fn parse(text: &str) -> Output {
        let mut out = Output::default();
        let mut in_devices = false;
        for line in text.lines() {
            if line.trim().is_empty() {
                continue;
            }
            let Some(comment) = line.strip_prefix('#') else {
                in_devices = false;
                let f: Vec<&str> = line.split_whitespace().collect();
                assert_eq!(f.len(), 13, "a result line has 13 fields: {line:?}");
                out.rows.push(Row {
                    size: num(f[0], "size", line),
                    count: num(f[1], "count", line),
                    dtype: f[2].to_string(),
                    redop: f[3].to_string(),
                    root: num(f[4], "root", line),
                    out_of_place: group(&f[5..9], line),
                    in_place: group(&f[9..13], line),
                });
                continue;
            };
            let c = comment.trim();
            if in_devices && c.starts_with("Rank ") {
                out.devices.push(device(line));
                continue;
            }
            in_devices = c == "Using devices";
            if c.starts_with("nThread ") {
                let mut rest = c;
                for label in PARAMS {
                    let at = rest.find(label).unwrap_or_else(|| panic!("no {label:?} in {line:?}"));
                    rest = rest[at + label.len()..].trim_start();
                    let value = rest.split_whitespace().next().unwrap_or_else(|| panic!("no {label} value"));
                    out.params.push(value.to_string());
                    rest = &rest[value.len()..];
                }
            } else if let Some(v) = c.strip_prefix("Out of bounds values :") {
                let w: Vec<&str> = v.split_whitespace().collect();
                out.out_of_bounds = Some((num(w[0], "out of bounds", line), w[1].to_string()));
            } else if let Some(v) = c.strip_prefix("Avg bus bandwidth    :") {
                out.avg_busbw = Some(num(v.split_whitespace().next().unwrap_or(""), "avg busbw", line));
            }
        }
        out
    }
}

/// The `count` and `size` columns nccl-tests gives `op` over `n` ranks for
/// a requested size of `bytes` in elements of `esize` bytes: `count` per
/// rank (all_gather: each rank's input; reduce_scatter: each rank's output;
/// all_to_all: what each rank sends each peer; the others: the buffer),
/// `size` the larger buffer (n x count for the three that split data).
fn nccl_columns(op: &str, bytes: u64, esize: u64, n: u64) -> (u64, u64) {
    let elems = bytes / esize;
    match op {
        "all_gather" | "reduce_scatter" | "all_to_all" => (elems / n, elems / n * n * esize),
        _ => (elems, elems * esize),
    }
}

fn bus_factor(op: &str, n: f64) -> f64 {
    match op {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "all_gather" | "reduce_scatter" | "all_to_all" => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// `busbw` printed with two decimals is `algbw` x the factor, within the
/// rounding of both.
fn close(busbw: f64, algbw: f64, factor: f64) -> bool {
    (busbw - algbw * factor).abs() <= 0.011 + 0.01 * busbw.abs()
}

/// One run: op, its extra arguments, and the type name, bytes per
/// element, redop and root its rows must show.
type Case<'a> = (&'a str, &'a [&'a str], &'a str, u64, &'a str, i64);

#[test]
fn nccl_tests_parser_reads_both_column_groups_of_every_op() {
    let cases: [Case<'_>; 7] = [
        ("all_reduce", &[], "float", 4, "sum", -1),
        ("all_gather", &["-d", "bfloat16"], "bfloat16", 2, "none", -1),
        ("reduce_scatter", &["-d", "int32", "-o", "max"], "int32", 4, "max", -1),
        ("broadcast", &["-d", "half", "-r", "1"], "half", 2, "none", 1),
        ("reduce", &["-d", "double", "-o", "avg", "-r", "1"], "double", 8, "avg", 1),
        ("all_to_all", &["-d", "uint8"], "uint8", 1, "none", -1),
        // nccl-tests' aggregated, non-blocking, averaged iterations.
        ("all_reduce", &["-d", "int8", "-o", "min", "-m", "3", "-z", "0", "-a", "1"], "int8", 1, "min", -1),
    ];
    let sizes = [64u64, 512, 4096];
    for (op, extra, dtype, esize, redop, root) in cases {
        let mut args =
            vec!["perf", "--op", op, "--nproc", "2", "-b", "64", "-e", "4K", "-f", "8", "-n", "3", "-w", "1"];
        args.extend_from_slice(extra);
        let f = run(&args, LIMIT);
        assert_eq!(f.code, Some(0), "{args:?}: {f:#?}");
        let out = nccl::parse(&f.stdout);

        let agg = if extra.contains(&"-m") { "3" } else { "1" };
        let params = ["1", "1", "64", "4096", "8(factor)", "1", "3", agg, "1", "0"];
        assert_eq!(out.params, params, "{args:?}: {}", f.stdout);
        assert_eq!(out.devices.len(), 2, "{args:?}: {}", f.stdout);
        for (r, d) in out.devices.iter().enumerate() {
            assert_eq!((d.rank, d.group, d.device, d.bus.as_str()), (r, 0, -1, "cpu"), "{d:?}");
            assert!(d.pid > 0 && !d.host.is_empty() && d.name.starts_with("ringleader-"), "{d:?}");
        }

        assert_eq!(out.rows.len(), sizes.len(), "{args:?}: {}", f.stdout);
        for (row, bytes) in out.rows.iter().zip(sizes) {
            let (count, size) = nccl_columns(op, bytes, esize, 2);
            assert_eq!((row.size, row.count), (size, count), "{op} {bytes} B: {row:?}");
            assert_eq!((row.dtype.as_str(), row.redop.as_str(), row.root), (dtype, redop, root), "{row:?}");
            for g in [row.out_of_place, row.in_place] {
                assert!(g.time_us > 0.0 && g.algbw >= 0.0, "{op}: {row:?}");
                assert!(close(g.busbw, g.algbw, bus_factor(op, 2.0)), "{op}: {row:?}");
                assert_eq!(g.wrong, Some(0), "{op}: {row:?}");
            }
        }
        assert_eq!(out.out_of_bounds, Some((0, "OK".to_string())), "{}", f.stdout);
        let avg = out.avg_busbw.expect("an Avg bus bandwidth line");
        let mean: f64 = out.rows.iter().flat_map(|r| [r.out_of_place.busbw, r.in_place.busbw]).sum::<f64>() / 6.0;
        assert!((avg - mean).abs() <= 0.006, "the mean of both groups: {avg} vs {mean}");
    }
}

#[test]
fn check_off_prints_na_for_wrong_in_both_groups() {
    let f = run(
        &["perf", "--op", "reduce_scatter", "--nproc", "2", "--sizes", "256,8K", "-n", "3", "-w", "1", "-c", "0"],
        LIMIT,
    );
    assert_eq!(f.code, Some(0), "{f:#?}");
    let out = nccl::parse(&f.stdout);
    assert_eq!((out.param("validation:"), out.param("step:")), ("0", "0(list)"), "{}", f.stdout);
    assert_eq!((out.param("minBytes"), out.param("maxBytes")), ("256", "8192"));
    assert_eq!(out.rows.len(), 2, "{}", f.stdout);
    for (row, bytes) in out.rows.iter().zip([256u64, 8192]) {
        assert_eq!((row.size, row.count), (bytes, bytes / 4 / 2), "{row:?}");
        assert_eq!((row.out_of_place.wrong, row.in_place.wrong), (None, None), "{row:?}");
        assert!(row.out_of_place.time_us > 0.0 && row.in_place.time_us > 0.0, "{row:?}");
    }
}

#[test]
fn all_reduce_two_ranks_writes_json_lines_that_match_the_table() {
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
    let table = nccl::parse(&f.stdout);
    assert_eq!(table.rows.len(), 14, "8 B to 64 KiB: {f:#?}");
    for (i, r) in table.rows.iter().enumerate() {
        assert_eq!((r.size, r.count), (8u64 << i, 2u64 << i), "{r:?}");
        assert_eq!((r.dtype.as_str(), r.redop.as_str(), r.root), ("float", "sum", -1), "{r:?}");
        assert_eq!((r.out_of_place.wrong, r.in_place.wrong), (Some(0), Some(0)), "{r:?}");
    }

    let text = std::fs::read_to_string(&json).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 14);
    for (i, (j, r)) in lines.iter().zip(&table.rows).enumerate() {
        assert_eq!(j["op"], "all_reduce");
        assert_eq!(j["nproc"], 2);
        assert_eq!(j["bytes"], 8u64 << i);
        assert_eq!(j["count"], 2u64 << i);
        assert_eq!((j["dtype"].as_str(), j["type"].as_str()), (Some("f32"), Some("float")));
        assert_eq!(j["redop"], "sum");
        assert_eq!(j["wrong"], 0);
        assert_eq!(j["check"], "ok");
        assert_eq!(j["iters"], 20);
        assert_eq!(j["native"], "in_place");
        assert!(j["lib"].as_str().unwrap().starts_with("ringleader-"), "{j}");
        assert_eq!(j["lib_version"], env!("CARGO_PKG_VERSION"));
        let (t, alg, bus) =
            (j["time_us"].as_f64().unwrap(), j["algbw_GBps"].as_f64().unwrap(), j["busbw_GBps"].as_f64().unwrap());
        assert!(t > 0.0);
        let expect = (8u64 << i) as f64 / (t * 1e-6) / 1e9;
        assert!((alg - expect).abs() <= 1e-9 * expect.max(1.0), "{j}");
        // all_reduce over 2 ranks: busbw = algbw x 2(n-1)/n = algbw.
        assert!((bus - alg).abs() <= 1e-12, "{j}");
        // The flat fields are the in-place group; both groups are there.
        assert_eq!(j["in_place"]["time"].as_f64(), Some(t));
        assert_eq!(
            (j["in_place"]["emulated"].as_bool(), j["out_of_place"]["emulated"].as_bool()),
            (Some(false), Some(true))
        );
        for (g, name) in [(r.out_of_place, "out_of_place"), (r.in_place, "in_place")] {
            let jt = j[name]["time"].as_f64().unwrap();
            assert!((g.time_us - jt).abs() <= 0.006 + 1e-3 * jt, "{name}: table {g:?}, json {}", j[name]);
            assert_eq!(j[name]["nwrong"], 0);
        }
    }
}

#[test]
fn barrier_two_ranks_over_shm_and_tcp_is_one_row_of_size_0() {
    for transport in ["shm", "tcp"] {
        let dir = Scratch::new(&format!("perf-barrier-{transport}"));
        let json = dir.0.join("out.jsonl");
        // Sizes asked for are ignored (barrier has none), -c finds nothing to check.
        let args = [
            "perf",
            "--op",
            "barrier",
            "--nproc",
            "2",
            "--transport",
            transport,
            "--sizes",
            "8,1M",
            "-n",
            "50",
            "-w",
            "2",
            "-c",
            "2",
            "--json",
            json.to_str().unwrap(),
        ];
        let f = run(&args, LIMIT);
        assert_eq!(f.code, Some(0), "{args:?}: {f:#?}");
        let out = nccl::parse(&f.stdout);
        let params = ["1", "1", "0", "0", "0(list)", "2", "50", "1", "0", "0"];
        assert_eq!(out.params, params, "{}", f.stdout);
        assert_eq!(out.devices.len(), 2, "{}", f.stdout);
        for d in &out.devices {
            assert!(d.name.starts_with(&format!("ringleader-{transport},")), "{d:?}");
        }
        assert!(f.stdout.contains("# barrier moves no data"), "{}", f.stdout);
        assert_eq!(out.rows.len(), 1, "{}", f.stdout);
        let r = &out.rows[0];
        assert_eq!((r.size, r.count, r.dtype.as_str(), r.redop.as_str(), r.root), (0, 0, "float", "none", -1), "{r:?}");
        // One form: the out-of-place group is N/A throughout, as with --device cuda.
        let o = r.out_of_place;
        assert!(o.time_us.is_nan() && o.algbw.is_nan() && o.busbw.is_nan() && o.wrong.is_none(), "{r:?}");
        let g = r.in_place;
        assert!(g.time_us > 0.0 && (g.algbw, g.busbw, g.wrong) == (0.0, 0.0, None), "{r:?}");
        assert_eq!(out.out_of_bounds, Some((0, "OK".to_string())), "{}", f.stdout);
        assert_eq!(out.avg_busbw, Some(0.0), "{}", f.stdout);

        let text = std::fs::read_to_string(&json).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 1, "{text}");
        let j = &lines[0];
        assert_eq!((j["op"].as_str(), j["nproc"].as_u64()), (Some("barrier"), Some(2)), "{j}");
        assert_eq!((j["bytes"].as_u64(), j["count"].as_u64()), (Some(0), Some(0)), "{j}");
        assert_eq!((j["native"].as_str(), j["check"].as_str()), (Some("in_place"), Some("unchecked")), "{j}");
        assert_eq!(j["lib"].as_str(), Some(format!("ringleader-{transport}").as_str()), "{j}");
        assert_eq!((j["algbw_GBps"].as_f64(), j["busbw_GBps"].as_f64()), (Some(0.0), Some(0.0)), "{j}");
        assert!(j["wrong"].is_null() && j["out_of_place"].is_null() && j["in_place"]["nwrong"].is_null(), "{j}");
        assert_eq!((j["iters"].as_u64(), j["in_place"]["emulated"].as_bool()), (Some(50), Some(false)), "{j}");
        let t = j["time_us"].as_f64().unwrap();
        assert!(t > 0.0 && j["in_place"]["time"].as_f64() == Some(t), "{j}");
        assert!((g.time_us - t).abs() <= 0.006 + 1e-3 * t, "table {g:?}, json {j}");
    }
}

#[test]
fn nccl_tests_names_and_flags_are_accepted_and_graphs_refused() {
    // nccl-tests' program name for the collective, long option names.
    let f = run(
        &[
            "perf",
            "--op",
            "alltoall_perf",
            "--nproc",
            "2",
            "--minbytes",
            "1K",
            "--maxbytes",
            "1K",
            "--datatype",
            "int64",
            "--iters",
            "2",
            "--warmup_iters",
            "1",
            "--agg_iters",
            "2",
            "--blocking",
            "0",
            "--average",
            "0",
            "--check",
            "2",
            "-G",
            "0",
        ],
        LIMIT,
    );
    assert_eq!(f.code, Some(0), "{f:#?}");
    let out = nccl::parse(&f.stdout);
    assert_eq!(out.rows.len(), 1, "{}", f.stdout);
    assert_eq!((out.rows[0].count, out.rows[0].dtype.as_str()), (64, "int64"), "{:?}", out.rows[0]);
    assert_eq!((out.param("agg iters:"), out.param("validation:")), ("2", "2"));
    assert!(f.stdout.contains("# Blocking Disabled"), "{}", f.stdout);
    assert!(f.stdout.contains("rank 0's (-a 0)"), "{}", f.stdout);

    let f = run(&["perf", "--nproc", "2", "-G", "2"], LIMIT);
    assert_eq!(f.code, Some(2), "{f:#?}");
    assert!(f.stderr.contains("-G/--cudagraph") && f.stderr.contains("on the CPU"), "{f:#?}");
    let f = run(&["perf", "--op", "sum"], LIMIT);
    assert_eq!(f.code, Some(2), "{f:#?}");
    assert!(f.stderr.contains("-o/--redop"), "{f:#?}");
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
    let f = run(&["perf", "--op", "send"], LIMIT);
    assert_eq!(f.code, Some(2), "{f:#?}");
    assert!(f.stderr.contains("barrier"), "the ops are listed: {f:#?}");
}
