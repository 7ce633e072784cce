//! Several hosts on one machine: each test builds its own network namespaces
//! with `scripts/netns.sh` (one per node, joined by a bridge, addresses
//! 10.77.0.1, 10.77.0.2, ...; removed when the test ends, even when it fails,
//! and stale ones at the next start), and runs one `ringleader launch` or
//! `ringleader doctor` per node inside them, each under its own host name.
//! The ranks are this test binary, re-invoked as a worker that joins the job
//! and runs one all_reduce. Every process runs under a hard time limit.
//!
//! Where namespaces cannot be created (not root, no iproute2) the tests say so
//! on stderr and pass without checking anything.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{Finished, Running, BIN};

const NETNS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/netns.sh");
/// Turns this test binary into a worker rank.
const SCENARIO: &str = "RL_MULTINODE_WORKER";
/// The hard limit of every launcher and doctor.
const LIMIT: Duration = Duration::from_secs(25);
/// The store port of every test job (namespaces keep tests apart).
const STORE_PORT: &str = "29501";

/// A rank: joins, all_reduces `rank + 1` and prints the sum, or prints the
/// error it got as `ERROR {json}`.
#[test]
fn worker() {
    if std::env::var_os(SCENARIO).is_none() {
        return;
    }
    let start = Instant::now();
    let report = |e: &ringleader::Error| {
        let line = serde_json::json!({
            "kind": e.kind().as_str(),
            "ranks": e.ranks(),
            "elapsed_ms": start.elapsed().as_millis() as u64,
            "message": e.to_string(),
        });
        println!("ERROR {line}");
        3
    };
    let code = match ringleader::Communicator::from_env() {
        Ok(c) => {
            let mut x = [c.rank() as f32 + 1.0];
            match c.all_reduce(&mut x, ringleader::ReduceOp::Sum) {
                Ok(()) => {
                    println!("SUM {}", x[0]);
                    let _ = c.destroy();
                    0
                }
                Err(e) => report(&e),
            }
        }
        Err(e) => report(&e),
    };
    std::process::exit(code);
}

/// The command line that runs a worker rank.
fn worker_cmd() -> Vec<String> {
    let exe = std::env::current_exe().unwrap().to_string_lossy().into_owned();
    vec![exe, "--exact".into(), "worker".into(), "--nocapture".into(), "--test-threads".into(), "1".into(), "-q".into()]
}

/// Namespaces for one test; removed on drop.
struct Cluster {
    name: String,
    _lock: Option<File>,
}

impl Cluster {
    /// `n` nodes named `name-0`...; `None` (after saying why) where
    /// namespaces cannot be created.
    fn new(name: &str, n: usize) -> Option<Cluster> {
        // One test of this name at a time on this machine (two test runs at
        // once); without a lock file (another user's), go on unlocked.
        let lock = File::create(std::env::temp_dir().join(format!("ringleader-netns-{name}.lock"))).ok();
        if let Some(l) = &lock {
            // SAFETY: flock(2) on a descriptor we own.
            assert_eq!(unsafe { libc::flock(l.as_raw_fd(), libc::LOCK_EX) }, 0);
        }
        let out = Command::new(NETNS).args(["up", name, &n.to_string()]).output().expect("run scripts/netns.sh");
        match out.status.code() {
            Some(0) => Some(Cluster { name: name.into(), _lock: lock }),
            Some(77) => {
                eprintln!("SKIPPED {name}: {}", String::from_utf8_lossy(&out.stderr).trim());
                None
            }
            _ => panic!("scripts/netns.sh up {name} {n} failed: {out:?}"),
        }
    }

    fn ns(&self, i: usize) -> String {
        format!("{}-{i}", self.name)
    }

    fn host(&self, i: usize) -> String {
        format!("{}-n{i}", self.name)
    }

    fn ip(i: usize) -> String {
        format!("10.77.0.{}", i + 1)
    }

    /// `/etc/hosts` of node `i` (bind-mounted by `ip netns exec`).
    fn hosts_file(&self, i: usize, entries: &str) {
        let dir = std::path::Path::new("/etc/netns").join(self.ns(i));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("hosts"), format!("127.0.0.1 localhost\n{entries}\n")).unwrap();
    }

    /// An nftables firewall on node `i` (replacing any earlier one) that
    /// drops everything incoming except loopback, replies, and TCP to the
    /// `allowed` ports (nft set syntax, e.g. `29501, 41000-41009`).
    fn firewall(&self, i: usize, allowed: &str) {
        let rules = format!(
            "flush ruleset\ntable inet rltest {{\n chain input {{\n  type filter hook input priority 0; policy drop;\n  \
             iif lo accept\n  ct state established,related accept\n  tcp dport {{ {allowed} }} accept\n }}\n}}\n"
        );
        let mut c = Command::new("ip")
            .args(["netns", "exec", &self.ns(i), "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("nft");
        std::io::Write::write_all(c.stdin.as_mut().unwrap(), rules.as_bytes()).unwrap();
        drop(c.stdin.take());
        assert!(c.wait().unwrap().success(), "nft failed on node {i}");
    }

    /// Starts `ringleader ARGS` on node `i` under its host name, with `env`
    /// on top of a clean one.
    fn start(&self, i: usize, args: &[&str], env: &[(&str, &str)]) -> Running {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns(i), "unshare", "--uts", "sh", "-c", r#"hostname "$0" && exec "$@""#]);
        cmd.arg(self.host(i)).arg(BIN).args(args);
        self.spawn(cmd, env)
    }

    /// Runs a shell command line on node `i` under its host name.
    fn start_sh(&self, i: usize, line: &str, env: &[(&str, &str)]) -> Running {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns(i), "unshare", "--uts", "sh", "-c", r#"hostname "$0" && eval "$1""#]);
        cmd.arg(self.host(i)).arg(line);
        self.spawn(cmd, env)
    }

    fn spawn(&self, mut cmd: Command, env: &[(&str, &str)]) -> Running {
        for (k, _) in std::env::vars() {
            let ours = ["RINGLEADER_", "SLURM_", "TORCHELASTIC_"].iter().any(|p| k.starts_with(p));
            if ours || ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"].contains(&k.as_str()) {
                cmd.env_remove(k);
            }
        }
        let dumps = std::env::temp_dir().join(format!("rl-multinode-dumps-{}", self.name));
        cmd.env(SCENARIO, "1").env("RINGLEADER_DUMP_DIR", dumps).env("RINGLEADER_TIMEOUT", "10");
        for (k, v) in env {
            cmd.env(k, v);
        }
        Running::spawn(cmd)
    }

    /// `ringleader launch` of a 2-rank node `i` of `nnodes` whose node 0 is
    /// at `master`, running the worker; `more` goes before `--`.
    fn launch(&self, i: usize, nnodes: usize, master: &str, more: &[&str], env: &[(&str, &str)]) -> Running {
        let (nn, node) = (nnodes.to_string(), i.to_string());
        let mut args = vec!["launch", "--nproc-per-node", "2", "--nnodes", &nn, "--node-rank", &node];
        args.extend(["--master-addr", master, "--grace", "1"]);
        args.extend(more);
        args.push("--");
        let w = worker_cmd();
        args.extend(w.iter().map(String::as_str));
        self.start(i, &args, env)
    }

    /// `ringleader doctor` on node `i` of 2 with node 0 at `master`.
    fn doctor(&self, i: usize, master: &str, env: &[(&str, &str)]) -> Running {
        let node = i.to_string();
        let args = ["doctor", "--nnodes", "2", "--node-rank", &node, "--master-addr", master, "--timeout", "4"];
        self.start(i, &args, env)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(NETNS).args(["down", &self.name]).status();
    }
}

fn finish_all(nodes: Vec<Running>) -> Vec<Finished> {
    nodes.into_iter().map(|n| n.finish(LIMIT)).collect()
}

/// What a rank printed: `[rankR]: TAG rest` lines of a launcher's stdout.
fn tagged(out: &str, tag: &str) -> BTreeMap<usize, String> {
    out.lines()
        .filter_map(|l| {
            let (rank, rest) = l.strip_prefix("[rank")?.split_once("]: ")?;
            Some((rank.parse().ok()?, rest.strip_prefix(tag)?.strip_prefix(' ')?.to_string()))
        })
        .collect()
}

/// Every rank's error line, parsed, from several launchers' output.
fn errors(nodes: &[Finished]) -> BTreeMap<usize, serde_json::Value> {
    nodes
        .iter()
        .flat_map(|f| tagged(&f.stdout, "ERROR"))
        .map(|(r, l)| (r, serde_json::from_str(&l).expect("ERROR line is JSON")))
        .collect()
}

fn sums(nodes: &[Finished]) -> BTreeMap<usize, String> {
    nodes.iter().flat_map(|f| tagged(&f.stdout, "SUM")).collect()
}

/// Every rank of `ranks` reported an error of `kind`; their messages.
fn expect_kind(nodes: &[Finished], ranks: &[usize], kind: &str) -> BTreeMap<usize, String> {
    let errs = errors(nodes);
    for r in ranks {
        let e = errs.get(r).unwrap_or_else(|| panic!("rank {r} reported no error: {nodes:#?}"));
        assert_eq!(e["kind"], kind, "rank {r}: {e}\n{nodes:#?}");
    }
    for f in nodes {
        assert_ne!(f.code, Some(0), "a launcher whose ranks failed exits non-zero: {f:#?}");
    }
    ranks.iter().map(|r| (*r, errs[r]["message"].as_str().unwrap().to_string())).collect()
}

fn assert_job_ran(nodes: &[Finished]) {
    let s = sums(nodes);
    assert_eq!(s.len(), 4, "{nodes:#?}");
    assert!(s.values().all(|v| v == "10"), "1+2+3+4 on every rank: {s:?}");
    assert!(nodes.iter().all(|f| f.code == Some(0)), "{nodes:#?}");
}

#[test]
fn printed_commands_run_a_two_node_job_and_doctor_passes() {
    let Some(c) = Cluster::new("rlmn1", 2) else { return };
    let hosts = format!("{},{}", Cluster::ip(0), Cluster::ip(1));
    let mut args = vec!["launch", "--print-commands", "--hosts", &hosts, "--nproc-per-node", "2", "--grace", "1", "--"];
    let w = worker_cmd();
    args.extend(w.iter().map(String::as_str));
    let out = Command::new(BIN).args(&args).env("RINGLEADER_INIT_TIMEOUT", "5").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let printed = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = printed.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), 2, "{printed}");
    assert!(lines[1].contains("--node-rank 1 --master-addr 10.77.0.1"), "{printed}");
    assert!(lines.iter().all(|l| l.starts_with("RINGLEADER_INIT_TIMEOUT=5 ")), "{printed}");

    let nodes = finish_all((0..2).map(|i| c.start_sh(i, lines[i], &[])).collect());
    assert_job_ran(&nodes);
    assert!(nodes[1].stderr.contains("node 1 of 2: ranks 2-3 of 4"), "{nodes:#?}");

    let doctors = finish_all((0..2).map(|i| c.doctor(i, "10.77.0.1", &[])).collect());
    for (i, d) in doctors.iter().enumerate() {
        assert_eq!(d.code, Some(0), "{}{}", d.stdout, d.stderr);
        for row in [
            "store reachable",
            "all doctors joined",
            "MASTER_ADDR alike",
            "versions equal",
            "settings alike",
            "data ports reachable",
        ] {
            assert!(
                d.stdout.lines().any(|l| l.starts_with(&format!("  ok    {row}"))),
                "node {i}: {row}\n{}",
                d.stdout
            );
        }
        assert!(d.stdout.contains(&format!("node 0 ({}), node 1 ({})", c.host(0), c.host(1))), "{}", d.stdout);
    }
}

#[test]
fn inside_slurm_the_launcher_needs_no_flags() {
    let Some(c) = Cluster::new("rlmn2", 2) else { return };
    let names = format!("10.77.0.1 {}\n10.77.0.2 {}", c.host(0), c.host(1));
    let list = format!("{}-n[0-1]", c.name);
    let w = worker_cmd();
    let nodes = finish_all(
        (0..2)
            .map(|i| {
                c.hosts_file(i, &names);
                let id = i.to_string();
                let env = [
                    ("SLURM_JOB_ID", "4242"),
                    ("SLURM_NODEID", id.as_str()),
                    ("SLURM_NNODES", "2"),
                    ("SLURM_JOB_NODELIST", list.as_str()),
                    ("SLURM_STEP_NODELIST", list.as_str()),
                    ("SLURM_STEP_TASKS_PER_NODE", "1(x2)"),
                    ("SLURM_GPUS_ON_NODE", "2"),
                    ("RINGLEADER_INIT_TIMEOUT", "5"),
                ];
                let mut args = vec!["launch", "--grace", "1", "--"];
                args.extend(w.iter().map(String::as_str));
                c.start(i, &args, &env)
            })
            .collect(),
    );
    assert_job_ran(&nodes);
    let note = format!("inside Slurm job 4242: took 2 nodes, node rank 1 (SLURM_NODEID), master {}", c.host(0));
    assert!(nodes[1].stderr.contains(&note), "{nodes:#?}");
    assert!(nodes[1].stderr.contains("MASTER_PORT 24242 (from the job id)"), "{nodes:#?}");
}

#[test]
fn a_firewall_on_the_data_ports_is_named_and_an_allowed_range_runs() {
    let Some(c) = Cluster::new("rlmn3", 2) else { return };
    // Node 0 accepts the store port, nothing else.
    c.firewall(0, STORE_PORT);
    let env = [("RINGLEADER_INIT_TIMEOUT", "4")];
    let nodes = finish_all((0..2).map(|i| c.launch(i, 2, "10.77.0.1", &[], &env)).collect());
    let msgs = expect_kind(&nodes, &[0, 1, 2, 3], "data-port-unreachable");
    let m = &msgs[&0];
    for pair in ["rank 2 cannot reach rank 0 at 10.77.0.1:", "rank 3 cannot reach rank 1 at 10.77.0.1:"] {
        assert!(m.contains(pair), "{m}");
    }
    assert_eq!(m.matches("cannot reach").count(), 4, "2 x 2 pairs blocked: {m}");
    assert!(m.contains("RINGLEADER_PORT_RANGE") && m.contains("RINGLEADER_IFNAME"), "{m}");
    assert!(msgs.values().all(|x| x == m), "every rank reports the same: {msgs:#?}");
    for e in errors(&nodes).values() {
        assert_eq!(e["ranks"], serde_json::json!([0, 1, 2, 3]), "{e}");
        assert!(e["elapsed_ms"].as_u64().unwrap() < 4500, "within the init timeout: {e}");
    }

    let doctors = finish_all((0..2).map(|i| c.doctor(i, "10.77.0.1", &[])).collect());
    let blocked = format!("node 1 ({}) cannot reach node 0 ({}) at 10.77.0.1:", c.host(1), c.host(0));
    for d in &doctors {
        assert_eq!(d.code, Some(1), "{}{}", d.stdout, d.stderr);
        let row = d.stdout.lines().find(|l| l.starts_with("  FAIL  data ports reachable")).unwrap_or_default();
        assert!(row.contains(&blocked), "{}", d.stdout);
        assert!(d.stdout.contains("RINGLEADER_PORT_RANGE=LO-HI"), "{}", d.stdout);
        assert!(d.stdout.lines().any(|l| l.starts_with("  ok    store reachable")), "{}", d.stdout);
    }

    // Now it accepts 41000-41009 too, and the job is told to use them.
    c.firewall(0, &format!("{STORE_PORT}, 41000-41009"));
    let allowed = [("RINGLEADER_INIT_TIMEOUT", "4"), ("RINGLEADER_PORT_RANGE", "41000-41009")];
    let doctors = finish_all((0..2).map(|i| c.doctor(i, "10.77.0.1", &allowed)).collect());
    for d in &doctors {
        assert_eq!(d.code, Some(0), "{}{}", d.stdout, d.stderr);
        assert!(d.stdout.lines().any(|l| l.starts_with("  ok    data ports reachable")), "{}", d.stdout);
        assert!(d.stdout.contains(":41000, "), "listening in the range: {}", d.stdout);
    }
    let nodes = finish_all((0..2).map(|i| c.launch(i, 2, "10.77.0.1", &[], &allowed)).collect());
    assert_job_ran(&nodes);
}

#[test]
fn a_wrong_master_addr_is_store_unreachable_and_the_others_name_the_missing_ranks() {
    let Some(c) = Cluster::new("rlmn4", 2) else { return };
    let env = [("RINGLEADER_INIT_TIMEOUT", "3")];
    let nodes = finish_all(vec![c.launch(0, 2, "10.77.0.1", &[], &env), c.launch(1, 2, "10.77.0.9", &[], &env)]);
    let far = expect_kind(&nodes[1..], &[2, 3], "store-unreachable");
    assert!(far[&2].contains("10.77.0.9:29501"), "{far:?}");
    let near = expect_kind(&nodes[..1], &[0, 1], "rendezvous-incomplete");
    let host0 = c.host(0);
    for m in near.values() {
        assert!(m.contains("2 of 4 ranks joined") && m.contains("missing ranks 2, 3"), "{m}");
        assert!(m.contains(&format!("rank 0 ({host0} pid")) && m.contains(&format!("rank 1 ({host0} pid")), "{m}");
    }

    let doctors = finish_all(vec![c.doctor(0, "10.77.0.1", &[]), c.doctor(1, "10.77.0.9", &[])]);
    assert_eq!(doctors[1].code, Some(1));
    let row = doctors[1].stdout.lines().find(|l| l.starts_with("  FAIL  store reachable")).unwrap_or_default();
    assert!(row.contains("10.77.0.9:29501") && row.contains("[store-unreachable]"), "{}", doctors[1].stdout);
    assert_eq!(doctors[0].code, Some(1));
    let row = doctors[0].stdout.lines().find(|l| l.starts_with("  FAIL  all doctors joined")).unwrap_or_default();
    assert!(row.contains("node 1 did not join at 10.77.0.1:29501"), "{}", doctors[0].stdout);
}

#[test]
fn a_node_launched_with_another_nproc_per_node_is_world_size_mismatch() {
    let Some(c) = Cluster::new("rlmn5", 2) else { return };
    let env = [("RINGLEADER_INIT_TIMEOUT", "4")];
    let n1 = {
        let w = worker_cmd();
        let mut args = vec!["launch", "--nproc-per-node", "3", "--nnodes", "2", "--node-rank", "1"];
        args.extend(["--master-addr", "10.77.0.1", "--grace", "1", "--"]);
        args.extend(w.iter().map(String::as_str));
        c.start(1, &args, &env)
    };
    let nodes = finish_all(vec![c.launch(0, 2, "10.77.0.1", &[], &env), n1]);
    let msgs = expect_kind(&nodes, &[0, 1, 3, 4, 5], "world-size-mismatch");
    for m in msgs.values() {
        assert!(m.contains("says 4") && m.contains("says 6"), "{m}");
        assert!(m.contains(&c.host(0)) && m.contains(&c.host(1)), "{m}");
    }
    assert!(errors(&nodes).values().all(|e| e["elapsed_ms"].as_u64().unwrap() < 3500), "at once, not at the timeout");
}

#[test]
fn a_missing_node_is_rendezvous_incomplete_naming_who_joined() {
    let Some(c) = Cluster::new("rlmn6", 2) else { return };
    let env = [("RINGLEADER_INIT_TIMEOUT", "3")];
    let nodes = finish_all(vec![c.launch(0, 2, "10.77.0.1", &[], &env)]);
    let msgs = expect_kind(&nodes, &[0, 1], "rendezvous-incomplete");
    for m in msgs.values() {
        assert!(m.contains("2 of 4 ranks joined within 3.0 s; missing ranks 2, 3"), "{m}");
        assert!(m.contains(&format!("joined: rank 0 ({} pid", c.host(0))), "{m}");
    }
    assert_eq!(errors(&nodes)[&0]["ranks"], serde_json::json!([2, 3]));
}

#[test]
fn a_duplicate_node_rank_is_duplicate_rank_on_every_rank() {
    let Some(c) = Cluster::new("rlmn7", 2) else { return };
    let env = [("RINGLEADER_INIT_TIMEOUT", "4")];
    // Both nodes believe they are node 0.
    let nodes = finish_all(vec![c.launch(0, 2, "10.77.0.1", &[], &env), c.start_dup(&env)]);
    let lines: usize = nodes.iter().map(|f| tagged(&f.stdout, "ERROR").len()).sum();
    assert_eq!(lines, 4, "ranks 0 and 1 twice, every one fails: {nodes:#?}");
    for f in &nodes {
        for (r, line) in tagged(&f.stdout, "ERROR") {
            let e: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(e["kind"], "duplicate-rank", "rank {r}: {e}");
            let m = e["message"].as_str().unwrap();
            assert!(m.contains(&c.host(0)) && m.contains(&c.host(1)), "both hosts: {m}");
            assert!(e["elapsed_ms"].as_u64().unwrap() < 3500, "before the timeout: {e}");
        }
    }
}

impl Cluster {
    /// Node 1 launched with `--node-rank 0`.
    fn start_dup(&self, env: &[(&str, &str)]) -> Running {
        let w = worker_cmd();
        let mut args = vec!["launch", "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "0"];
        args.extend(["--master-addr", "10.77.0.1", "--grace", "1", "--"]);
        args.extend(w.iter().map(String::as_str));
        self.start(1, &args, env)
    }
}

#[test]
fn a_token_mismatch_is_auth_failed() {
    let Some(c) = Cluster::new("rlmn8", 2) else { return };
    let e0 = [("RINGLEADER_INIT_TIMEOUT", "3"), ("RINGLEADER_TOKEN", "alpha")];
    let e1 = [("RINGLEADER_INIT_TIMEOUT", "3"), ("RINGLEADER_TOKEN", "beta")];
    let nodes = finish_all(vec![c.launch(0, 2, "10.77.0.1", &[], &e0), c.launch(1, 2, "10.77.0.1", &[], &e1)]);
    let far = expect_kind(&nodes[1..], &[2, 3], "auth-failed");
    assert!(far[&2].contains("RINGLEADER_TOKEN"), "{far:?}");
    assert!(!nodes.iter().any(|f| f.stdout.contains("alpha") || f.stdout.contains("beta")), "the token never shows");
    expect_kind(&nodes[..1], &[0, 1], "rendezvous-incomplete");
}

#[test]
fn a_node_with_another_version_is_version_mismatch() {
    let Some(c) = Cluster::new("rlmn9", 2) else { return };
    let env = [("RINGLEADER_INIT_TIMEOUT", "4")];
    let odd = [("RINGLEADER_INIT_TIMEOUT", "4"), ("RINGLEADER_TEST_ADVERTISE_VERSION", "9.9.9")];
    let nodes = finish_all(vec![c.launch(0, 2, "10.77.0.1", &[], &env), c.launch(1, 2, "10.77.0.1", &[], &odd)]);
    let msgs = expect_kind(&nodes, &[0, 1, 2, 3], "version-mismatch");
    let ours = env!("CARGO_PKG_VERSION");
    for m in msgs.values() {
        assert!(m.contains(&format!("rank 2 ({}) runs 9.9.9", c.host(1))), "{m}");
        assert!(m.contains(&format!("rank 0 ({}) runs {ours}", c.host(0))), "{m}");
    }
    // Node 1's doctor also sees another RINGLEADER_STREAMS, which its ranks would refuse at init.
    let odd_doctor = [odd[1], ("RINGLEADER_STREAMS", "2")];
    let doctors = finish_all(vec![c.doctor(0, "10.77.0.1", &[]), c.doctor(1, "10.77.0.1", &odd_doctor)]);
    for d in &doctors {
        assert_eq!(d.code, Some(1), "{}", d.stdout);
        let row = d.stdout.lines().find(|l| l.starts_with("  FAIL  versions equal")).unwrap_or_default();
        assert!(row.contains(&format!("node 1 ({}) runs 9.9.9", c.host(1))), "{}", d.stdout);
        let row = d.stdout.lines().find(|l| l.starts_with("  FAIL  settings alike")).unwrap_or_default();
        assert!(row.contains(&format!("RINGLEADER_STREAMS: 1 on node 0 ({}); 2 on node 1", c.host(0))), "{}", d.stdout);
    }
}

#[test]
fn a_master_addr_that_resolves_differently_is_named() {
    let Some(c) = Cluster::new("rlmn10", 2) else { return };
    // On node 0 the name maps to loopback (the classic 127.0.1.1 line), on node 1 to node 0.
    c.hosts_file(0, "127.0.0.1 rlmaster");
    c.hosts_file(1, "10.77.0.1 rlmaster");
    let env = [("RINGLEADER_INIT_TIMEOUT", "4")];
    let nodes = finish_all((0..2).map(|i| c.launch(i, 2, "rlmaster", &[], &env)).collect());
    let msgs = expect_kind(&nodes, &[0, 1, 2, 3], "data-port-unreachable");
    for m in msgs.values() {
        assert!(m.contains("rank 2 cannot reach rank 0 at 127.0.0.1:"), "{m}");
        assert!(m.contains("MASTER_ADDR rlmaster resolves differently on different hosts"), "{m}");
        assert!(m.contains(&format!("-> 127.0.0.1 on {} (ranks 0, 1)", c.host(0))), "{m}");
        assert!(m.contains(&format!("-> 10.77.0.1 on {} (ranks 2, 3)", c.host(1))), "{m}");
    }
    assert!(errors(&nodes).values().all(|e| e["elapsed_ms"].as_u64().unwrap() < 3000), "at once");

    let doctors = finish_all((0..2).map(|i| c.doctor(i, "rlmaster", &[])).collect());
    for d in &doctors {
        assert_eq!(d.code, Some(1), "{}", d.stdout);
        assert!(d.stdout.contains("FAIL  MASTER_ADDR alike"), "{}", d.stdout);
    }
    assert!(doctors[0].stdout.contains("FAIL  MASTER_ADDR resolves"), "{}", doctors[0].stdout);
}

#[test]
fn a_node_of_another_run_is_foreign_run() {
    let Some(c) = Cluster::new("rlmn11", 2) else { return };
    let env = [("RINGLEADER_INIT_TIMEOUT", "2")];
    let nodes = finish_all(vec![
        c.launch(0, 2, "10.77.0.1", &["--run-id", "job-a"], &env),
        c.launch(1, 2, "10.77.0.1", &["--run-id", "job-b"], &env),
    ]);
    let far = expect_kind(&nodes[1..], &[2, 3], "foreign-run");
    assert!(far[&2].contains("\"job-a\"") && far[&2].contains("\"job-b\""), "both run ids: {far:?}");
    expect_kind(&nodes[..1], &[0, 1], "rendezvous-incomplete");
}

#[test]
fn a_taken_store_port_on_node_0_is_port_in_use_naming_the_holder() {
    let Some(c) = Cluster::new("rlmn12", 2) else { return };
    // A stale store of an earlier run holds the port on node 0.
    let stale = c.start(0, &["store", "--port", STORE_PORT], &[]);
    let deadline = Instant::now() + Duration::from_secs(5);
    let probe = |ns: &str| {
        let out = Command::new("ip").args(["netns", "exec", ns, "ss", "-ltnH"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).contains(&format!(":{STORE_PORT} "))
    };
    while !probe(&c.ns(0)) {
        assert!(Instant::now() < deadline, "the stale store never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    let node0 = c.launch(0, 2, "10.77.0.1", &[], &[("RINGLEADER_INIT_TIMEOUT", "2")]).finish(LIMIT);
    assert_eq!(node0.code, Some(1), "{node0:#?}");
    assert!(node0.stderr.contains("[port-in-use] cannot listen on 0.0.0.0:29501"), "{node0:#?}");
    assert!(node0.stderr.contains("(ringleader)"), "names the holder: {node0:#?}");
    let doctor = c.doctor(0, "10.77.0.1", &[]).finish(LIMIT);
    assert_eq!(doctor.code, Some(1), "{doctor:#?}");
    let row = doctor.stdout.lines().find(|l| l.starts_with("  FAIL  store port free")).unwrap_or_default();
    assert!(row.contains("(ringleader)"), "{}", doctor.stdout);
    stale.terminate(LIMIT);
}
