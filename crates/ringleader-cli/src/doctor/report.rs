//! The doctor's verdict: one row per check (status, name, what was found)
//! and, for a failure or a warning, what to do about it.

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

/// Every check of one doctor run, in the order made.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// The lines above the table (which node, which addresses).
    pub(crate) header: Vec<String>,
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
        let mut r = Report { header: vec!["ringleader doctor: node 0 of 1".into()], checks: vec![] };
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
}
