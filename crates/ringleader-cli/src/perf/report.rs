//! The results: nccl-tests' bandwidth definitions, its table, and one JSON
//! line per size.
//!
//! algbw = bytes / time; busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n
//! for all_gather, reduce_scatter and all_to_all (bytes: the total output of
//! all_gather, the total input of reduce_scatter, the send buffer of
//! all_to_all), x 1 for broadcast and reduce (docs/DESIGN.md §4).

use super::sizes::Shape;
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
fn type_name(d: DType) -> &'static str {
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

/// One size's result: a table line and a JSON line.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    /// The collective (`all_reduce`, ...).
    pub(crate) op: &'static str,
    /// Ranks.
    pub(crate) nproc: usize,
    /// Bytes the bandwidths count (see the module docs).
    pub(crate) bytes: u64,
    /// Elements those bytes hold.
    pub(crate) count: u64,
    /// Element type (`f32`, ...).
    pub(crate) dtype: &'static str,
    /// The reduce op, for the reducing collectives.
    pub(crate) redop: Option<&'static str>,
    /// The root, for broadcast and reduce.
    pub(crate) root: Option<usize>,
    /// Mean time of one call on the slowest rank, microseconds.
    pub(crate) time_us: f64,
    /// bytes / time, GB/s (10^9 bytes).
    #[serde(rename = "algbw_GBps")]
    pub(crate) algbw_gbps: f64,
    /// algbw x the op's bus factor.
    #[serde(rename = "busbw_GBps")]
    pub(crate) busbw_gbps: f64,
    /// Wrong elements over all ranks in the checked run.
    pub(crate) wrong: u64,
    /// `ok` or `FAIL`.
    pub(crate) check: &'static str,
    /// `ringleader-<transport>`.
    pub(crate) lib: String,
    /// ringleader's version.
    pub(crate) lib_version: &'static str,
    /// Timed calls.
    pub(crate) iters: usize,
    /// Warm-up calls before them.
    pub(crate) warmup: usize,
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
}

impl Row {
    /// The row of one size: `time_s` is the slowest rank's mean time per call.
    pub(crate) fn new(setup: &Setup<'_>, shape: &Shape, time_s: f64, iters: usize, warmup: usize, wrong: u64) -> Row {
        let algbw = if time_s > 0.0 { shape.bytes as f64 / time_s / 1e9 } else { 0.0 };
        Row {
            op: setup.op.name(),
            nproc: setup.nproc,
            bytes: shape.bytes,
            count: shape.count,
            dtype: setup.dtype.name(),
            redop: uses_redop(setup.op).then(|| setup.redop.name()),
            root: uses_root(setup.op).then_some(setup.root),
            time_us: time_s * 1e6,
            algbw_gbps: algbw,
            busbw_gbps: algbw * bus_factor(setup.op, setup.nproc),
            wrong,
            check: if wrong == 0 { "ok" } else { "FAIL" },
            lib: format!("ringleader-{}", setup.transport),
            lib_version: ringleader_core::VERSION,
            iters,
            warmup,
        }
    }

    /// The table line, in nccl-tests' columns.
    pub(crate) fn table_line(&self, dtype: DType) -> String {
        let t = self.time_us;
        let time = if t < 1e4 {
            format!("{t:.2}")
        } else if t < 1e6 {
            format!("{t:.1}")
        } else {
            format!("{t:.0}")
        };
        columns(&[
            self.bytes.to_string(),
            self.count.to_string(),
            type_name(dtype).to_string(),
            self.redop.unwrap_or("none").to_string(),
            self.root.map_or(-1, |r| r as i64).to_string(),
            time,
            format!("{:.2}", self.algbw_gbps),
            format!("{:.2}", self.busbw_gbps),
            self.wrong.to_string(),
        ])
    }

    /// The JSON line (no newline).
    pub(crate) fn json_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

const WIDTHS: [usize; 9] = [12, 12, 9, 6, 6, 10, 8, 8, 7];

fn columns(cells: &[String]) -> String {
    let mut line = String::new();
    for (cell, w) in cells.iter().zip(WIDTHS) {
        line += &format!("{cell:>w$}");
    }
    line
}

/// The header lines: what runs, where to watch it (`store`: the job's
/// store address), and the column titles.
pub(crate) fn header(setup: &Setup<'_>, iters: Option<usize>, warmup: usize, store: Option<&str>) -> String {
    let iters = match iters {
        Some(i) => format!("{i} per size"),
        None => "adaptive (about 0.3 s per size, 5 to 1000)".into(),
    };
    let mut out = format!(
        "# ringleader perf: {} over {} ranks, transport {}, ringleader {}\n\
         # iterations: {iters}, warm-up: {warmup}; time = mean per call on the slowest rank\n",
        setup.op.name(),
        setup.nproc,
        setup.transport,
        ringleader_core::VERSION,
    );
    if let Some(store) = store {
        out += &format!("# live view: ringleader status --store {store}\n");
    }
    out += "#\n";
    for titles in [
        ["size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"],
        ["(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", ""],
    ] {
        let line = columns(&titles.map(String::from));
        out += "#";
        out += &line[1..];
        out += "\n";
    }
    out
}

/// The closing lines: wrong elements in all, and the mean bus bandwidth.
pub(crate) fn footer(rows: &[Row]) -> String {
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    let avg = if rows.is_empty() { 0.0 } else { rows.iter().map(|r| r.busbw_gbps).sum::<f64>() / rows.len() as f64 };
    format!(
        "# Out of bounds values : {wrong} {}\n# Avg bus bandwidth    : {avg:.3}\n",
        if wrong == 0 { "OK" } else { "FAILED" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(op: OpKind, n: usize) -> Setup<'static> {
        Setup { op, nproc: n, dtype: DType::F32, redop: ReduceOp::Sum, root: 0, transport: "tcp" }
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
        let r = Row::new(&setup(OpKind::AllReduce, 2), &shape, 0.001, 10, 3, 0);
        assert!((r.algbw_gbps - 4.194304).abs() < 1e-9);
        assert!((r.busbw_gbps - 4.194304).abs() < 1e-9);
        assert_eq!(r.check, "ok");
        let j: serde_json::Value = serde_json::from_str(&r.json_line()).unwrap();
        assert_eq!(j["op"], "all_reduce");
        assert_eq!(j["bytes"], 4 << 20);
        assert_eq!(j["count"], 1 << 20);
        assert_eq!(j["redop"], "sum");
        assert_eq!(j["root"], serde_json::Value::Null);
        assert_eq!(j["lib"], "ringleader-tcp");
        assert_eq!(j["check"], "ok");
        assert!(j["algbw_GBps"].as_f64().is_some() && j["time_us"].as_f64() == Some(1000.0));
        let line = r.table_line(DType::F32);
        assert!(line.trim_start().starts_with("4194304"), "{line}");
        assert!(line.contains("float") && line.contains("sum") && line.contains("-1"));
        assert!(line.ends_with(" 0"), "{line}");
    }

    #[test]
    fn header_columns_line_up_with_rows() {
        let h = header(&setup(OpKind::Broadcast, 2), None, 3, Some("h:1"));
        assert!(h.contains("# live view: ringleader status --store h:1\n#\n"), "{h}");
        let titles = h.lines().find(|l| l.contains("#wrong")).unwrap();
        let shape = Shape::of(OpKind::Broadcast, 8, 4, 2).unwrap();
        let row = Row::new(&setup(OpKind::Broadcast, 2), &shape, 1e-5, 5, 3, 2);
        assert_eq!(row.check, "FAIL");
        assert_eq!(row.root, Some(0));
        assert_eq!(row.redop, None);
        assert_eq!(titles.len(), row.table_line(DType::F32).len());
        assert!(footer(&[row]).contains("Out of bounds values : 2 FAILED"));
    }
}
