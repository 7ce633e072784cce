//! `ringleader status` against a store hosted in the test, with a member
//! connection that heartbeats a [`Beat`] as a rank stuck in a collective
//! would. (`store.rs` runs it against a `ringleader store` process.)

mod common;

use common::{run, run_env, start};
use ringleader_core::{DType, Fingerprint, OpKind, ReduceOp};
use ringleader_diag::snapshot::{Beat, Running};
use ringleader_store::{keys, ClientOptions, ServerOptions, StoreClient, StoreServer};
use serde_json::Value;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(20);

/// A store of run `job-9` with rank 0 of 2 connected and stuck in
/// all_reduce #3 (waiting for rank 1), and rank 1's ending recorded.
fn stuck_job() -> (StoreServer, StoreClient, String) {
    let server = StoreServer::bind("127.0.0.1:0", ServerOptions::new("job-9")).unwrap();
    let addr = server.local_addr().to_string();
    let mut rank0 = StoreClient::connect(&addr, ClientOptions::new("job-9").member(0, 2)).unwrap();
    let beat = Beat {
        last_started: 3,
        last_completed: 2,
        running: Some(Running {
            seq: 3,
            fingerprint: Fingerprint::new(OpKind::AllReduce, DType::F32, 1024).with_reduce_op(ReduceOp::Sum),
            running_ms: 12_000,
            awaited_peers: vec![1],
        }),
        p2p: Vec::new(),
        running_site: None,
        last_completed_site: None,
    };
    rank0.heartbeat(&beat.encode()).unwrap();
    rank0.set(&keys::exit(1), b"killed by signal 9 (SIGKILL)").unwrap();
    (server, rank0, addr)
}

#[test]
fn shows_what_each_rank_runs_and_how_ranks_ended() {
    let (server, _rank0, addr) = stuck_job();
    let f = run(&["status", "--store", &addr], LIMIT);
    assert_eq!(f.code, Some(0), "{f:#?}");
    let out = &f.stdout;
    assert!(out.contains("1 rank known, 1 connected, world size 2"), "{out}");
    let row = out.lines().find(|l| l.starts_with("0 ")).unwrap_or_else(|| panic!("no row for rank 0: {out}"));
    assert!(row.contains(&std::process::id().to_string()), "pid: {row}");
    assert!(row.contains("connected"), "{row}");
    assert!(row.contains("all_reduce #3 (f32 x 1024, sum) for 12."), "{row}");
    assert!(row.contains("waiting for rank 1"), "{row}");
    assert!(row.trim_end().ends_with("#2"), "last completed: {row}");
    assert!(out.contains("rank 1 never connected"), "{out}");
    assert!(out.contains("rank 1 killed by signal 9 (SIGKILL)"), "{out}");
    server.shutdown();
}

#[test]
fn dump_request_bumps_the_counter() {
    let (server, mut rank0, addr) = stuck_job();
    for expected in 1..=2 {
        let f = run(&["status", "--store", &addr, "--dump"], LIMIT);
        assert_eq!(f.code, Some(0), "{f:#?}");
        assert!(
            f.stdout.contains(&format!("requested a flight-recorder dump from every rank (request #{expected})")),
            "{f:#?}"
        );
        assert_eq!(rank0.add(keys::DUMP_REQUEST, 0).unwrap(), expected);
    }
    server.shutdown();
}

#[test]
fn watch_repeats_until_stopped() {
    let (server, _rank0, addr) = stuck_job();
    let f = start(&["status", "--store", &addr, "--watch", "0.2"]).stop_after(Duration::from_millis(1500));
    let views = f.stdout.matches("job at ").count();
    assert!(views >= 2, "expected repeated views: {f:#?}");
    server.shutdown();
}

#[test]
fn unreachable_store_or_wrong_secret_fails_with_the_kind() {
    // A port nothing listens on.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = free.local_addr().unwrap().to_string();
    drop(free);
    let f = run(&["status", "--store", &addr], LIMIT);
    assert_eq!(f.code, Some(1), "{f:#?}");
    assert!(f.stderr.contains("[store-unreachable]"), "{f:#?}");

    let mut opts = ServerOptions::new("*");
    opts.token = Some("s3cret".into());
    let server = StoreServer::bind("127.0.0.1:0", opts).unwrap();
    let addr = server.local_addr().to_string();
    let f = run(&["status", "--store", &addr], LIMIT);
    assert_eq!(f.code, Some(1), "{f:#?}");
    assert!(f.stderr.contains("[auth-failed]"), "{f:#?}");
    let f = run(&["status", "--store", &addr, "--token-env", "RL_TEST_UNSET_VAR"], LIMIT);
    assert_eq!(f.code, Some(2), "{f:#?}");
    assert!(f.stderr.contains("RL_TEST_UNSET_VAR"), "{f:#?}");
    server.shutdown();
}

/// Parses `--json` output, failing the test with the output if it does not.
fn parse(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

#[test]
fn json_holds_every_rank_and_the_job() {
    let (server, _rank0, addr) = stuck_job();
    let mut rank1 = StoreClient::connect(&addr, ClientOptions::new("job-9").member(1, 2)).unwrap();
    rank1
        .heartbeat(
            &Beat {
                last_started: 2,
                last_completed: 2,
                running: None,
                p2p: Vec::new(),
                running_site: None,
                last_completed_site: None,
            }
            .encode(),
        )
        .unwrap();
    rank1.leave().unwrap();
    let f = run(&["status", "--store", &addr, "--json"], LIMIT);
    assert_eq!(f.code, Some(0), "{f:#?}");
    let j = parse(&f.stdout);
    assert_eq!(j["store"], addr.as_str());
    assert_eq!((&j["world_size"], &j["ranks_known"], &j["ranks_connected"]), (&2.into(), &2.into(), &1.into()));
    assert_eq!(j["never_connected"], serde_json::json!([]));
    let ranks = j["ranks"].as_array().unwrap();
    assert_eq!(ranks.iter().map(|r| r["rank"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1]);
    let r0 = &ranks[0];
    assert_eq!(r0["pid"], std::process::id());
    assert_eq!(r0["liveness"], "connected");
    assert_eq!(r0["state"], "running");
    assert_eq!(r0["current"]["op"], "all_reduce");
    assert_eq!(r0["current"]["seq"], 3);
    assert_eq!(r0["current"]["call"], "all_reduce(f32 x 1024, sum)");
    assert!(r0["current"]["for_s"].as_f64().unwrap() >= 12.0, "{r0}");
    assert_eq!(r0["current"]["waiting_for"], serde_json::json!([1]));
    assert_eq!((&r0["last_started"], &r0["last_completed"]), (&3.into(), &2.into()));
    assert!(r0["heartbeat_age_s"].as_f64().is_some(), "{r0}");
    let r1 = &ranks[1];
    assert_eq!((&r1["liveness"], &r1["state"], &r1["current"]), (&"left".into(), &"idle".into(), &Value::Null));
    assert_eq!(j["exits"], serde_json::json!([{"rank": 1, "ending": "killed by signal 9 (SIGKILL)"}]));
    assert_eq!((&j["abort"], &j["verdict"], &j["dump_request"]), (&Value::Null, &Value::Null, &Value::Null));

    // --dump: the note goes to stderr, stdout stays JSON.
    let f = run(&["status", "--store", &addr, "--json", "--dump"], LIMIT);
    assert_eq!(f.code, Some(0), "{f:#?}");
    assert_eq!(parse(&f.stdout)["dump_request"], 1);
    assert!(f.stderr.contains("requested a flight-recorder dump"), "{f:#?}");
    server.shutdown();
}

#[test]
fn json_watch_prints_one_object_per_line() {
    let (server, _rank0, addr) = stuck_job();
    let f = start(&["status", "--store", &addr, "--json", "--watch", "0.2"]).stop_after(Duration::from_millis(1500));
    let views: Vec<Value> = f.stdout.lines().map(parse).collect();
    assert!(views.len() >= 2, "expected repeated views: {f:#?}");
    assert!(views.iter().all(|v| v["ranks"][0]["rank"] == 0), "{f:#?}");
    server.shutdown();
}

#[test]
fn the_store_address_defaults_to_the_launchers_variable() {
    let (server, _rank0, addr) = stuck_job();
    let f = run_env(&["status", "--json"], &[("RINGLEADER_STORE_ADDR", &addr)], LIMIT);
    assert_eq!(f.code, Some(0), "{f:#?}");
    let j = parse(&f.stdout);
    assert_eq!(j["store"], addr.as_str());
    assert_eq!(j["ranks"][0]["state"], "running");
    // --store wins over the variable.
    let f = run_env(&["status", "--store", &addr], &[("RINGLEADER_STORE_ADDR", "127.0.0.1:1")], LIMIT);
    assert_eq!(f.code, Some(0), "{f:#?}");
    server.shutdown();

    let f = run(&["status"], LIMIT);
    assert_eq!(f.code, Some(2), "{f:#?}");
    assert!(f.stderr.contains("--store") && f.stderr.contains("RINGLEADER_STORE_ADDR"), "{f:#?}");
}
