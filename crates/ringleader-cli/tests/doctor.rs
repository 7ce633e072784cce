//! `ringleader doctor` on one node (the multi-node checks are in
//! `multinode.rs`): every check runs, and a taken store port is named with
//! the process that holds it.

mod common;

use common::run;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(20);

#[test]
fn one_node_doctor_passes() {
    let f = run(&["doctor", "--timeout", "5"], LIMIT);
    assert_eq!(f.code, Some(0), "{f:#?}");
    for row in
        ["MASTER_ADDR resolves", "store port free", "data ports listen", "store reachable", "data ports reachable"]
    {
        assert!(f.stdout.lines().any(|l| l.starts_with(&format!("  ok    {row}"))), "{row}: {}", f.stdout);
    }
    assert!(f.stdout.lines().any(|l| l.contains("OOM kills")), "{}", f.stdout);
    assert!(f.stdout.trim_end().ends_with("ready to launch"), "{}", f.stdout);
}

#[test]
fn a_taken_store_port_is_named_with_its_holder() {
    let holder = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = holder.local_addr().unwrap().port().to_string();
    let f = run(&["doctor", "--store-port", &port, "--timeout", "3"], LIMIT);
    assert_eq!(f.code, Some(1), "{f:#?}");
    let row = f.stdout.lines().find(|l| l.starts_with("  FAIL  store port free")).unwrap_or_default();
    assert!(row.contains(&format!("pid {}", std::process::id())), "{}", f.stdout);
    assert!(f.stdout.contains("skip  cross-node checks"), "{}", f.stdout);
}

#[test]
fn a_malformed_port_range_is_a_usage_error() {
    let out = std::process::Command::new(common::BIN)
        .args(["doctor", "--timeout", "1"])
        .env("RINGLEADER_PORT_RANGE", "9-1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("RINGLEADER_PORT_RANGE"), "{out:?}");
}

/// The checks of a `--json` report, by name: (status, detail).
fn checks_of(j: &serde_json::Value) -> std::collections::HashMap<String, (String, String)> {
    let field = |c: &serde_json::Value, k: &str| c[k].as_str().unwrap_or_else(|| panic!("{k} in {c}")).to_string();
    j["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (field(c, "name"), (field(c, "status"), field(c, "detail"))))
        .collect()
}

#[test]
fn json_report_has_every_check_and_the_same_exit_status() {
    let f = run(&["doctor", "--timeout", "5", "--json"], LIMIT);
    assert_eq!(f.code, Some(0), "{f:#?}");
    let j: serde_json::Value = serde_json::from_str(&f.stdout).unwrap_or_else(|e| panic!("{e}: {f:#?}"));
    let checks = checks_of(&j);
    for row in
        ["MASTER_ADDR resolves", "store port free", "data ports listen", "store reachable", "data ports reachable"]
    {
        assert_eq!(checks.get(row).map(|c| c.0.as_str()), Some("ok"), "{row}: {j}");
    }
    assert!(checks.contains_key("OOM kills"), "{j}");
    // OOM kills on this machine may warn; nothing fails.
    assert!(j["status"] == "ok" || j["status"] == "warn", "{j}");
    assert_eq!((&j["failed"], &j["node"], &j["nnodes"]), (&0.into(), &0.into(), &1.into()), "{j}");

    let holder = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = holder.local_addr().unwrap().port().to_string();
    let f = run(&["doctor", "--store-port", &port, "--timeout", "3", "--json"], LIMIT);
    assert_eq!(f.code, Some(1), "{f:#?}");
    let j: serde_json::Value = serde_json::from_str(&f.stdout).unwrap_or_else(|e| panic!("{e}: {f:#?}"));
    assert_eq!(j["status"], "fail", "{j}");
    let checks = checks_of(&j);
    let (status, detail) = &checks["store port free"];
    assert_eq!(status, "fail", "{j}");
    assert!(detail.contains(&format!("pid {}", std::process::id())), "{j}");
    assert_eq!(checks["cross-node checks"].0, "skip", "{j}");
    let fix = j["checks"].as_array().unwrap().iter().find(|c| c["name"] == "store port free").unwrap()["fix"].clone();
    assert!(fix.as_str().is_some_and(|f| !f.is_empty()), "{j}");
}
