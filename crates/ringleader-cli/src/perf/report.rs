//! The results: nccl-tests' bandwidth definitions, its table, and one JSON
//! line per size.
//!
//! algbw = size / time; busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n
//! for all_gather, reduce_scatter and all_to_all (size: the total output of
//! all_gather, the total input of reduce_scatter, the send buffer of
//! all_to_all; see [`Shape`]), x 1 for broadcast and reduce (docs/DESIGN.md §4).
//! barrier moves no data: its one row has size 0, so algbw and busbw are 0,
//! and only its time means anything.
//!
//! The table is nccl-tests' (its README and doc/PERFORMANCE.md): `#` header
//! lines (`# nThread ...`, `# Using devices` and a line per rank), the
//! column titles, then one line of 13 fields per size: size, count, type,
//! redop, root, then time, algbw, busbw and #wrong out of place, the same
//! four in place. A field not measured prints `N/A`. The closing lines are
//! `# Out of bounds values : N OK|FAILED` and `# Avg bus bandwidth    : X`
//! (the mean busbw of every measured column group, both groups, as
//! nccl-tests averages).

use super::sizes::Shape;
use super::spec::{emulation, moves_data, native, Average, Measured, Spec, Variant};
use ringleader_core::{DType, OpKind, ReduceOp};
use serde::Serialize;

/// busbw / algbw for `op` over `n` ranks.
pub(crate) fn bus_factor(op: OpKind, n: usize) -> f64 {
    let n = n.max(1) as f64;
    match op {
        OpKind::AllReduce => 2.0 * (n - 1.0) / n,
        OpKind::AllGather | OpKind::ReduceScatter | OpKind::AllToAll => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// Whether `op` combines values with a reduce op.
pub(crate) fn uses_redop(op: OpKind) -> bool {
    matches!(op, OpKind::AllReduce | OpKind::ReduceScatter | OpKind::Reduce)
}

/// Whether `op` has a root.
pub(crate) fn uses_root(op: OpKind) -> bool {
    matches!(op, OpKind::Broadcast | OpKind::Reduce)
}

/// nccl-tests' name of a dtype.
pub(crate) fn type_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 => "half",
        DType::BF16 => "bfloat16",
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::I32 => "int32",
        DType::I64 => "int64",
    }
}

/// One column group of a row (the key names of nccl-tests' own JSON).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct Group {
    /// Time per operation, microseconds, combined over the ranks (`-a`).
    pub(crate) time: f64,
    /// size / time, GB/s (10^9 bytes).
    pub(crate) alg_bw: f64,
    /// alg_bw x the op's bus factor.
    pub(crate) bus_bw: f64,
    /// Wrong elements over all ranks; `None` (JSON null, table `N/A`) when
    /// not checked.
    pub(crate) nwrong: Option<u64>,
    /// Timed iterations.
    pub(crate) iters: usize,
    /// Run with the copy ringleader's API needs for this form (the header
    /// says which).
    pub(crate) emulated: bool,
}

impl Group {
    fn new(setup: &Setup<'_>, shape: &Shape, m: &Measured) -> Group {
        let alg_bw = if m.time_s > 0.0 { shape.bytes as f64 / m.time_s / 1e9 } else { 0.0 };
        Group {
            time: m.time_s * 1e6,
            alg_bw,
            bus_bw: alg_bw * bus_factor(setup.op, setup.nproc),
            nwrong: m.wrong,
            iters: m.iters,
            emulated: m.emulated,
        }
    }
}

/// One size's result: a table line and a JSON line.
///
/// The flat `time_us`, `algbw_GBps`, `busbw_GBps`, `wrong`, `check` and
/// `iters` fields are the group of ringleader's own form of the op
/// (`native`: in place for all_reduce, broadcast and reduce, out of place
/// for the others), as in the JSON lines before there were two groups;
/// `out_of_place` and `in_place` hold both.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    /// The collective (`all_reduce`, ...).
    pub(crate) op: &'static str,
    /// Ranks.
    pub(crate) nproc: usize,
    /// The size column: bytes the bandwidths count ([`Shape`]).
    pub(crate) bytes: u64,
    /// The count column: elements per rank ([`Shape`]).
    pub(crate) count: u64,
    /// Element type (`f32`, ...).
    pub(crate) dtype: &'static str,
    /// Element type, nccl-tests' name (`float`, ...).
    #[serde(rename = "type")]
    pub(crate) type_name: &'static str,
    /// The reduce op, for the reducing collectives.
    pub(crate) redop: Option<&'static str>,
    /// The root, for broadcast and reduce.
    pub(crate) root: Option<usize>,
    /// Which group the flat fields below are: `in_place` or `out_of_place`.
    pub(crate) native: &'static str,
    /// Time per operation of the native group, microseconds.
    pub(crate) time_us: f64,
    /// Its algbw, GB/s.
    #[serde(rename = "algbw_GBps")]
    pub(crate) algbw_gbps: f64,
    /// Its busbw, GB/s.
    #[serde(rename = "busbw_GBps")]
    pub(crate) busbw_gbps: f64,
    /// Its wrong elements; `None` when not checked.
    pub(crate) wrong: Option<u64>,
    /// `ok`, `FAIL` (either group wrong) or `unchecked`.
    pub(crate) check: &'static str,
    /// The out-of-place group; `None` when not measured.
    pub(crate) out_of_place: Option<Group>,
    /// The in-place group; `None` when not measured.
    pub(crate) in_place: Option<Group>,
    /// `ringleader-<transport>`.
    pub(crate) lib: String,
    /// ringleader's version.
    pub(crate) lib_version: &'static str,
    /// Timed iterations of the native group.
    pub(crate) iters: usize,
    /// Warm-up iterations before them.
    pub(crate) warmup: usize,
    /// Operations per iteration (`-m`).
    pub(crate) agg_iters: usize,
    /// Whether each operation completed before the next started (`-z`).
    pub(crate) blocking: bool,
    /// How the ranks' times were combined (`-a`): rank0, mean, min, max.
    pub(crate) average: &'static str,
}

/// What a row is about, besides its measurements.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Setup<'a> {
    /// The collective.
    pub(crate) op: OpKind,
    /// Ranks.
    pub(crate) nproc: usize,
    /// Element type.
    pub(crate) dtype: DType,
    /// Reduce op (reported for the reducing collectives only).
    pub(crate) redop: ReduceOp,
    /// Root (reported for broadcast and reduce only).
    pub(crate) root: usize,
    /// The transport the communicator chose.
    pub(crate) transport: &'a str,
    /// Warm-up iterations.
    pub(crate) warmup: usize,
    /// Operations per iteration.
    pub(crate) agg_iters: usize,
    /// Blocking operations.
    pub(crate) blocking: bool,
    /// How the ranks' times combine.
    pub(crate) average: Average,
}

impl<'a> Setup<'a> {
    /// The setup of `spec` over `nproc` ranks on `transport`.
    pub(crate) fn new(spec: &Spec, nproc: usize, transport: &'a str) -> Setup<'a> {
        Setup {
            op: spec.op,
            nproc,
            dtype: spec.dtype,
            redop: spec.redop,
            root: spec.root,
            transport,
            warmup: spec.warmup,
            agg_iters: spec.agg_iters,
            blocking: spec.blocking,
            average: spec.average,
        }
    }
}

impl Row {
    /// The row of one size from its out-of-place and in-place measurements.
    pub(crate) fn new(setup: &Setup<'_>, shape: &Shape, oop: Option<Measured>, ip: Option<Measured>) -> Row {
        let oop = oop.map(|m| Group::new(setup, shape, &m));
        let ip = ip.map(|m| Group::new(setup, shape, &m));
        let (native_name, native) = match native(setup.op) {
            Variant::InPlace => ("in_place", ip.or(oop)),
            Variant::OutOfPlace => ("out_of_place", oop.or(ip)),
        };
        let groups = [oop, ip];
        let checked: Vec<u64> = groups.iter().flatten().filter_map(|g| g.nwrong).collect();
        let check = if checked.iter().any(|&w| w > 0) {
            "FAIL"
        } else if checked.is_empty() {
            "unchecked"
        } else {
            "ok"
        };
        Row {
            op: setup.op.name(),
            nproc: setup.nproc,
            bytes: shape.bytes,
            count: shape.count,
            dtype: setup.dtype.name(),
            type_name: type_name(setup.dtype),
            redop: uses_redop(setup.op).then(|| setup.redop.name()),
            root: uses_root(setup.op).then_some(setup.root),
            native: native_name,
            time_us: native.map_or(0.0, |g| g.time),
            algbw_gbps: native.map_or(0.0, |g| g.alg_bw),
            busbw_gbps: native.map_or(0.0, |g| g.bus_bw),
            wrong: native.and_then(|g| g.nwrong),
            check,
            out_of_place: oop,
            in_place: ip,
            lib: format!("ringleader-{}", setup.transport),
            lib_version: ringleader_core::VERSION,
            iters: native.map_or(0, |g| g.iters),
            warmup: setup.warmup,
            agg_iters: setup.agg_iters,
            blocking: setup.blocking,
            average: setup.average.name(),
        }
    }

    /// Wrong elements over both groups (0 when not checked).
    pub(crate) fn wrong_total(&self) -> u64 {
        [self.out_of_place, self.in_place].iter().flatten().filter_map(|g| g.nwrong).sum()
    }

    /// The table line: nccl-tests' 13 fields.
    pub(crate) fn table_line(&self) -> String {
        let mut cells = vec![
            self.bytes.to_string(),
            self.count.to_string(),
            self.type_name.to_string(),
            self.redop.unwrap_or("none").to_string(),
            self.root.map_or(-1, |r| r as i64).to_string(),
        ];
        for g in [self.out_of_place, self.in_place] {
            match g {
                Some(g) => cells.extend([
                    fit(g.time, 7),
                    fit(g.alg_bw, 6),
                    fit(g.bus_bw, 6),
                    g.nwrong.map_or_else(|| NA.to_string(), |w| w.to_string()),
                ]),
                None => cells.extend([NA, NA, NA, NA].map(String::from)),
            }
        }
        columns(&cells)
    }

    /// The JSON line (no newline).
    pub(crate) fn json_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// What nccl-tests prints for a field it did not measure.
const NA: &str = "N/A";

/// `v` with two decimals, or fewer when that does not fit in `width`
/// characters, or in exponent form, as nccl-tests' table does.
fn fit(v: f64, width: usize) -> String {
    for decimals in [2, 1, 0] {
        let s = format!("{v:.decimals$}");
        if s.len() <= width {
            return s;
        }
    }
    format!("{v:.1e}")
}

/// `v` in C's `%g` style: six significant digits, trailing zeros dropped.
fn general(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let exp = v.abs().log10().floor() as i32;
    let trim = |s: String| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if (-5..6).contains(&exp) {
        let decimals = (5 - exp).max(0) as usize;
        trim(format!("{v:.decimals$}"))
    } else {
        let s = format!("{v:.5e}");
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        format!("{}e{e}", trim(m.to_string()))
    }
}

/// Column widths: size, count, type, redop, root, then time, algbw, busbw,
/// #wrong twice (out of place, in place).
const WIDTHS: [usize; 13] = [12, 14, 10, 8, 8, 9, 8, 8, 7, 9, 8, 8, 7];

fn columns(cells: &[String]) -> String {
    let mut line = String::new();
    for (cell, w) in cells.iter().zip(WIDTHS) {
        line += &format!("{cell:>w$}");
    }
    line
}

/// A `#` line of column titles aligned with the rows (trailing blanks cut).
fn title_line(titles: [&str; 13]) -> String {
    let line = columns(&titles.map(String::from));
    format!("#{}", line[1..].trim_end())
}

/// What the header says besides the [`Setup`].
#[derive(Debug, Clone)]
pub(crate) struct Header<'a> {
    /// Smallest and largest size asked for.
    pub(crate) min_bytes: u64,
    /// Largest size asked for.
    pub(crate) max_bytes: u64,
    /// `-f`; `None` when the sizes came as a list (`--sizes`).
    pub(crate) step_factor: Option<u64>,
    /// `-n`; `None`: adaptive.
    pub(crate) iters: Option<usize>,
    /// Checked iterations per size and group (`-c`).
    pub(crate) check: usize,
    /// One line per rank for `# Using devices` ([`rank_line`]).
    pub(crate) ranks: &'a [String],
    /// The job's store, for the live view.
    pub(crate) store: Option<&'a str>,
    /// The groups not measured, and why (`--device cuda`).
    pub(crate) unmeasured: Option<&'a str>,
}

/// A rank's line under `# Using devices`, in nccl-tests' layout (`#  Rank
/// R Group G Pid P on HOST device D [BUS] NAME`): for host buffers the
/// device is -1 and the bracket says `cpu`; `what` names the transport and
/// the CPU.
pub(crate) fn rank_line(rank: usize, pid: u32, host: &str, device: i64, bus: &str, what: &str) -> String {
    format!("#  Rank {rank:2} Group  0 Pid {pid:6} on {host:>10} device {device:2} [{bus}] {what}")
}

/// The header lines: nccl-tests' (`# nThread ...`, `# Using devices` and
/// the ranks, the column titles) with ringleader's own between them: what
/// runs, how the times combine, which group is emulated and how, where to
/// watch it.
pub(crate) fn header(setup: &Setup<'_>, h: &Header<'_>) -> String {
    let step = match h.step_factor {
        Some(f) => format!("{f}(factor)"),
        None => "0(list)".into(),
    };
    let mut out = format!(
        "# ringleader perf: {} over {} ranks (one process each), transport {}, ringleader {}\n\
         # nThread 1 nGpus 1 minBytes {} maxBytes {} step: {step} warmup iters: {} iters: {} agg iters: {} \
         validation: {} graph: 0\n",
        setup.op.name(),
        setup.nproc,
        setup.transport,
        ringleader_core::VERSION,
        h.min_bytes,
        h.max_bytes,
        setup.warmup,
        h.iters.unwrap_or(0),
        setup.agg_iters,
        h.check,
    );
    if h.iters.is_none() {
        out += "# iters 0: adaptive, about 0.3 s per size and column group (5 to 1000 iterations; the JSON lines give each)\n";
    }
    if setup.blocking {
        out += "# Blocking Enabled: each operation completes before the next one starts\n";
    } else {
        out += "# Blocking Disabled: each iteration submits its operations, then waits for them all\n";
    }
    out += &format!(
        "# time: per operation, {} (-a {})\n",
        match setup.average {
            Average::Rank0 => "rank 0's",
            Average::Mean => "the mean over the ranks",
            Average::Min => "the fastest rank's",
            Average::Max => "the slowest rank's",
        },
        setup.average.code(),
    );
    if !moves_data(setup.op) {
        // Said once here rather than left for the reader to infer from the
        // N/A fields and the sizes that were asked for and not run.
        out += &format!(
            "# {} moves no data: one row of size 0 (-b/-e/-f/--sizes ignored), nothing to check (#wrong is N/A), \
             one form, printed in place (out-of-place is N/A)\n",
            setup.op.name()
        );
    } else if h.check == 0 {
        out += "# results not checked (-c 0): #wrong is N/A\n";
    }
    for (variant, name) in [(Variant::OutOfPlace, "out-of-place"), (Variant::InPlace, "in-place")] {
        if let Some(how) = emulation(setup.op, variant).filter(|_| h.unmeasured.is_none()) {
            out +=
                &format!("# {name}: ringleader's {} has no {name} form; {how} (the copy is timed)\n", setup.op.name());
        }
    }
    if let Some(why) = h.unmeasured {
        out += &format!("# {why}\n");
    }
    if let Some(store) = h.store {
        out += &format!("# live view: ringleader status --store {store}\n");
    }
    out += "#\n# Using devices\n";
    for r in h.ranks {
        out += r;
        out += "\n";
    }
    out += "#\n";
    out += format!("#{:51}{:^32}{:^32}", "", "out-of-place", "in-place").trim_end();
    out += "\n";
    out += &title_line([
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
        "#wrong",
    ]);
    out += "\n";
    out +=
        &title_line(["(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""]);
    out += "\n";
    out
}

/// The closing lines: wrong elements in all, and the mean bus bandwidth
/// over every measured group of every size.
pub(crate) fn footer(rows: &[Row]) -> String {
    let wrong: u64 = rows.iter().map(Row::wrong_total).sum();
    let bws: Vec<f64> = rows.iter().flat_map(|r| [r.out_of_place, r.in_place]).flatten().map(|g| g.bus_bw).collect();
    let avg = if bws.is_empty() { 0.0 } else { bws.iter().sum::<f64>() / bws.len() as f64 };
    format!(
        "# Out of bounds values : {wrong} {}\n# Avg bus bandwidth    : {}\n#\n",
        if wrong == 0 { "OK" } else { "FAILED" },
        general(avg)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn setup(op: OpKind, n: usize) -> Setup<'static> {
        Setup {
            op,
            nproc: n,
            dtype: DType::F32,
            redop: ReduceOp::Sum,
            root: 0,
            transport: "tcp",
            warmup: 3,
            agg_iters: 1,
            blocking: true,
            average: Average::Max,
        }
    }

    fn measured(time_s: f64, wrong: Option<u64>, emulated: bool) -> Measured {
        Measured { time_s, iters: 10, wrong, emulated }
    }

    #[test]
    fn bus_factors_follow_nccl_tests() {
        assert_eq!(bus_factor(OpKind::AllReduce, 4), 1.5);
        assert_eq!(bus_factor(OpKind::AllGather, 4), 0.75);
        assert_eq!(bus_factor(OpKind::ReduceScatter, 2), 0.5);
        assert_eq!(bus_factor(OpKind::AllToAll, 2), 0.5);
        assert_eq!(bus_factor(OpKind::Broadcast, 8), 1.0);
        assert_eq!(bus_factor(OpKind::Reduce, 8), 1.0);
        assert_eq!(bus_factor(OpKind::AllReduce, 1), 0.0);
    }

    #[test]
    fn row_and_json() {
        let shape = Shape::of(OpKind::AllReduce, 4 << 20, 4, 2).unwrap();
        let r = Row::new(
            &setup(OpKind::AllReduce, 2),
            &shape,
            Some(measured(0.002, Some(0), true)),
            Some(measured(0.001, Some(0), false)),
        );
        // The flat fields are all_reduce's native group: in place.
        assert_eq!(r.native, "in_place");
        assert!((r.algbw_gbps - 4.194304).abs() < 1e-9);
        assert!((r.busbw_gbps - 4.194304).abs() < 1e-9);
        assert_eq!(r.check, "ok");
        let j: serde_json::Value = serde_json::from_str(&r.json_line()).unwrap();
        assert_eq!(j["op"], "all_reduce");
        assert_eq!(j["bytes"], 4 << 20);
        assert_eq!(j["count"], 1 << 20);
        assert_eq!(j["type"], "float");
        assert_eq!(j["dtype"], "f32");
        assert_eq!(j["redop"], "sum");
        assert_eq!(j["root"], serde_json::Value::Null);
        assert_eq!(j["lib"], "ringleader-tcp");
        assert_eq!(j["check"], "ok");
        assert_eq!(j["wrong"], 0);
        assert_eq!(j["time_us"].as_f64(), Some(1000.0));
        assert_eq!(j["out_of_place"]["time"].as_f64(), Some(2000.0));
        assert_eq!(j["out_of_place"]["emulated"], true);
        assert_eq!(j["in_place"]["nwrong"], 0);
        assert_eq!(
            (j["agg_iters"].as_u64(), j["blocking"].as_bool(), j["average"].as_str()),
            (Some(1), Some(true), Some("max"))
        );
        let line = r.table_line();
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            f,
            [
                "4194304", "1048576", "float", "sum", "-1", "2000.00", "2.10", "2.10", "0", "1000.00", "4.19", "4.19",
                "0"
            ]
        );
    }

    #[test]
    fn unmeasured_and_unchecked_fields_print_na() {
        let shape = Shape::of(OpKind::AllGather, 64, 4, 2).unwrap();
        let s = setup(OpKind::AllGather, 2);
        let r = Row::new(&s, &shape, Some(measured(1e-5, None, false)), None);
        assert_eq!(r.native, "out_of_place");
        assert_eq!((r.check, r.wrong), ("unchecked", None));
        let f: Vec<String> = r.table_line().split_whitespace().map(String::from).collect();
        assert_eq!(f.len(), 13);
        assert_eq!(&f[..5], ["64", "8", "float", "none", "-1"]);
        assert_eq!(f[8], "N/A");
        assert!(f[9..].iter().all(|x| x == "N/A"), "{f:?}");
        let j: serde_json::Value = serde_json::from_str(&r.json_line()).unwrap();
        assert_eq!(j["in_place"], serde_json::Value::Null);
        assert_eq!(j["wrong"], serde_json::Value::Null);
        assert_eq!(j["check"], "unchecked");
    }

    #[test]
    fn a_barrier_row_has_a_time_and_nothing_else() {
        let s = setup(OpKind::Barrier, 2);
        let shape = Shape::of(OpKind::Barrier, 0, 4, 2).unwrap();
        let r = Row::new(&s, &shape, None, Some(measured(5e-6, None, false)));
        let f: Vec<String> = r.table_line().split_whitespace().map(String::from).collect();
        assert_eq!(
            f,
            ["0", "0", "float", "none", "-1", "N/A", "N/A", "N/A", "N/A", "5.00", "0.00", "0.00", "N/A"],
            "the out-of-place group as --device cuda prints it; #wrong as -c 0 does"
        );
        let j: Value = serde_json::from_str(&r.json_line()).unwrap();
        assert_eq!((j["op"].as_str(), j["bytes"].as_u64(), j["count"].as_u64()), (Some("barrier"), Some(0), Some(0)));
        assert_eq!((j["native"].as_str(), j["check"].as_str()), (Some("in_place"), Some("unchecked")));
        assert_eq!(
            (j["time_us"].as_f64(), j["algbw_GBps"].as_f64(), j["busbw_GBps"].as_f64()),
            (Some(5.0), Some(0.0), Some(0.0))
        );
        assert_eq!(
            (&j["wrong"], &j["out_of_place"], &j["redop"], &j["root"]),
            (&Value::Null, &Value::Null, &Value::Null, &Value::Null)
        );
        let h = header(
            &s,
            &Header {
                min_bytes: 0,
                max_bytes: 0,
                step_factor: None,
                iters: Some(5),
                check: 0,
                ranks: &[],
                store: None,
                unmeasured: None,
            },
        );
        assert!(h.contains("# barrier moves no data: one row of size 0"), "{h}");
        assert!(!h.contains("(-c 0)") && !h.contains("has no out-of-place form"), "{h}");
        assert_eq!(footer(&[r]), "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0\n#\n");
    }

    #[test]
    fn numbers_fit_their_columns_like_nccl_tests() {
        assert_eq!(fit(6.5, 7), "6.50");
        assert_eq!(fit(12345.678, 7), "12345.7");
        assert_eq!(fit(1234567.8, 7), "1234568");
        assert_eq!(fit(123456789.0, 7), "1.2e8");
        assert_eq!(general(0.0), "0");
        assert_eq!(general(2.5), "2.5");
        assert_eq!(general(0.00390625), "0.00390625");
        assert_eq!(general(123.4567891), "123.457");
        assert_eq!(general(1234567.0), "1.23457e6");
    }

    #[test]
    fn header_columns_line_up_with_rows() {
        let s = setup(OpKind::Broadcast, 2);
        let ranks = [rank_line(0, 42, "node1", -1, "cpu", "ringleader-tcp"), rank_line(1, 43, "node1", -1, "cpu", "x")];
        let h = header(
            &s,
            &Header {
                min_bytes: 8,
                max_bytes: 64,
                step_factor: Some(2),
                iters: None,
                check: 1,
                ranks: &ranks,
                store: Some("h:1"),
                unmeasured: None,
            },
        );
        assert!(h.contains(
            "# nThread 1 nGpus 1 minBytes 8 maxBytes 64 step: 2(factor) warmup iters: 3 iters: 0 agg iters: 1 validation: 1 graph: 0\n"
        ), "{h}");
        assert!(h.contains("# live view: ringleader status --store h:1\n"), "{h}");
        assert!(
            h.contains(
                "# Using devices\n#  Rank  0 Group  0 Pid     42 on      node1 device -1 [cpu] ringleader-tcp\n"
            ),
            "{h}"
        );
        assert!(h.contains("# out-of-place: ringleader's broadcast has no out-of-place form; the root copies"), "{h}");
        assert!(!h.contains("# in-place:"), "{h}");
        let titles = h.lines().find(|l| l.contains("#wrong")).unwrap();
        assert_eq!(
            titles,
            "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong"
        );
        let units = h.lines().find(|l| l.contains("(elements)")).unwrap();
        assert_eq!(
            units,
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"
        );
        let groups = h.lines().find(|l| l.contains("out-of-place") && !l.contains(':')).unwrap();
        let (o, i) = (groups.find("out-of-place").unwrap(), groups.find("in-place").unwrap());
        assert!(o > titles.find("size").unwrap() + 40 && i > titles.rfind("time").unwrap() - 5, "{groups}");
        let shape = Shape::of(OpKind::Broadcast, 8, 4, 2).unwrap();
        let row = Row::new(&s, &shape, Some(measured(1e-5, Some(2), true)), Some(measured(1e-5, Some(0), false)));
        assert_eq!(row.check, "FAIL");
        assert_eq!(row.wrong, Some(0), "the native (in-place) group was right");
        assert_eq!(row.root, Some(0));
        assert_eq!(row.redop, None);
        assert_eq!(titles.len(), row.table_line().len());
        let f = footer(&[row]);
        assert!(f.starts_with("# Out of bounds values : 2 FAILED\n# Avg bus bandwidth    : 0.0008\n#\n"), "{f}");
    }
}
