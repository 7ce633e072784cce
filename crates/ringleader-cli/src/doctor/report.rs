//! The doctor's verdict: one row per check (status, name, what was found)
//! and, for a failure or a warning, what to do about it; as a table, or as
//! JSON (`--json`).

use serde_json::{json, Value};
use std::fmt::Write as _;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Nothing to do.
    Ok,
    /// Worth knowing; does not stop a launch.
    Warn,
    /// A launch would fail or hang: fix it first.
    Fail,
    /// Could not be checked (what it needs failed, or is unavailable here).
    Skip,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        }
    }

    /// The status in JSON: `ok`, `warn`, `fail` or `skip`.
    fn json_name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
            Status::Skip => "skip",
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Check {
    /// Stable name, e.g. `data ports reachable`.
    pub(crate) name: &'static str,
    /// The outcome.
    pub(crate) status: Status,
    /// What was found.
    pub(crate) detail: String,
    /// What to do (failures and warnings).
    pub(crate) fix: Option<String>,
}

impl Check {
    /// A passed check.
    pub(crate) fn ok(name: &'static str, detail: impl Into<String>) -> Check {
        Check { name, status: Status::Ok, detail: detail.into(), fix: None }
    }

    /// A warning and what to do about it.
    pub(crate) fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { name, status: Status::Warn, detail: detail.into(), fix: Some(fix.into()) }
    }

    /// A failure and how to fix it.
    pub(crate) fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { name, status: Status::Fail, detail: detail.into(), fix: Some(fix.into()) }
    }

    /// A check that could not be made, and why.
    pub(crate) fn skip(name: &'static str, detail: impl Into<String>) -> Check {
        Check { name, status: Status::Skip, detail: detail.into(), fix: None }
    }
}

/// Which node ran the checks, for the JSON report (the table says it in
/// its header).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Node {
    /// This node's rank.
    pub(crate) node: usize,
    /// Nodes in the job.
    pub(crate) nnodes: usize,
    /// This host's name.
    pub(crate) host: String,
    /// The ringleader version this node runs.
    pub(crate) version: String,
    /// MASTER_ADDR, as given.
    pub(crate) master_addr: String,
}

/// Every check of one doctor run, in the order made.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// The lines above the table (which node, which addresses).
    pub(crate) header: Vec<String>,
    /// Which node ran the checks.
    pub(crate) node: Node,
    /// The rows.
    pub(crate) checks: Vec<Check>,
}

impl Report {
    /// Adds a row.
    pub(crate) fn push(&mut self, c: Check) {
        self.checks.push(c);
    }

    /// Whether any check failed (the doctor then exits 1).
    pub(crate) fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.status == Status::Fail)
    }

    /// The overall status: `fail` when a check failed, else `warn` when one
    /// warned, else `ok`.
    fn overall(&self) -> Status {
        let any = |s: Status| self.checks.iter().any(|c| c.status == s);
        if any(Status::Fail) {
            Status::Fail
        } else if any(Status::Warn) {
            Status::Warn
        } else {
            Status::Ok
        }
    }

    /// The report as one JSON object (`--json`): `status` (overall: `ok`,
    /// `warn` or `fail`), `checks` (each `{name, status, detail, fix}`, status
    /// `ok`, `warn`, `fail` or `skip`, fix null for ok and skip), the counts,
    /// which node ran them, and the header lines.
    pub(crate) fn to_json(&self) -> Value {
        let checks: Vec<Value> = self
            .checks
            .iter()
            .map(|c| json!({"name": c.name, "status": c.status.json_name(), "detail": c.detail, "fix": c.fix}))
            .collect();
        let count = |s: Status| self.checks.iter().filter(|c| c.status == s).count();
        json!({
            "status": self.overall().json_name(),
            "failed": count(Status::Fail),
            "warnings": count(Status::Warn),
            "ok": count(Status::Ok),
            "skipped": count(Status::Skip),
            "node": self.node.node,
            "nnodes": self.node.nnodes,
            "host": self.node.host,
            "version": self.node.version,
            "master_addr": self.node.master_addr,
            "header": self.header,
            "checks": checks,
        })
    }

    /// The table, for stdout.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        for h in &self.header {
            let _ = writeln!(out, "{h}");
        }
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        for c in &self.checks {
            let _ = writeln!(out, "  {:<4}  {:<width$}  {}", c.status.label(), c.name, c.detail);
            if let Some(fix) = &c.fix {
                let _ = writeln!(out, "  {:<4}  {:<width$}  fix: {fix}", "", "");
            }
        }
        let count = |s: Status| self.checks.iter().filter(|c| c.status == s).count();
        let (failed, warned, ok) = (count(Status::Fail), count(Status::Warn), count(Status::Ok));
        let failed_names: Vec<&str> = self.checks.iter().filter(|c| c.status == Status::Fail).map(|c| c.name).collect();
        let verdict = if failed > 0 {
            format!("fix the failed checks ({}) before launching", failed_names.join(", "))
        } else {
            "ready to launch".to_string()
        };
        let _ = writeln!(out, "result: {failed} failed, {warned} warnings, {ok} ok: {verdict}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_failures_and_their_fix() {
        let mut r = Report { header: vec!["ringleader doctor: node 0 of 1".into()], ..Report::default() };
        r.push(Check::ok("store reachable", "10.0.0.1:29501"));
        r.push(Check::fail("data ports reachable", "node 1 cannot reach node 0", "open the ports"));
        r.push(Check::warn("OOM kills", "1 kill", "look"));
        assert!(r.failed());
        let t = r.render();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "ringleader doctor: node 0 of 1");
        assert_eq!(lines[1], "  ok    store reachable       10.0.0.1:29501");
        assert_eq!(lines[2], "  FAIL  data ports reachable  node 1 cannot reach node 0");
        assert_eq!(lines[3], "                              fix: open the ports");
        assert_eq!(
            lines.last().unwrap(),
            &"result: 1 failed, 1 warnings, 1 ok: fix the failed checks (data ports reachable) before launching"
        );
        let mut fine = Report::default();
        fine.push(Check::skip("x", "y"));
        assert!(!fine.failed());
        assert!(fine.render().ends_with("ready to launch\n"));
    }

    #[test]
    fn json_has_every_check_and_the_overall_status() {
        let node = Node { node: 1, nnodes: 2, host: "node-b".into(), version: "0.1.0".into(), master_addr: "a".into() };
        let mut r = Report { header: vec!["h".into()], node, checks: vec![] };
        r.push(Check::ok("store reachable", "10.0.0.1:29501"));
        assert_eq!(r.to_json()["status"], "ok");
        r.push(Check::warn("OOM kills", "1 kill", "look"));
        r.push(Check::skip("cross-node checks", "why"));
        assert_eq!(r.to_json()["status"], "warn");
        r.push(Check::fail("data ports reachable", "node 1 cannot reach node 0", "open the ports"));
        let j = r.to_json();
        assert_eq!(j["status"], "fail");
        assert_eq!((j["failed"].as_u64(), j["warnings"].as_u64(), j["ok"].as_u64()), (Some(1), Some(1), Some(1)));
        assert_eq!(j["skipped"], 1);
        assert_eq!((&j["node"], &j["nnodes"], &j["host"]), (&json!(1), &json!(2), &json!("node-b")));
        assert_eq!(j["header"], json!(["h"]));
        assert_eq!(
            j["checks"][0],
            json!({"name": "store reachable", "status": "ok", "detail": "10.0.0.1:29501", "fix": null})
        );
        assert_eq!(j["checks"][1]["status"], "warn");
        assert_eq!(j["checks"][2]["status"], "skip");
        assert_eq!(j["checks"][3]["fix"], "open the ports");
    }
}
