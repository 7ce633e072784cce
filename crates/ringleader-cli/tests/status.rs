//! `ringleader status` against a store hosted in the test, with a member
//! connection that heartbeats a [`Beat`] as a rank stuck in a collective
//! would.

mod common;

use common::{run, start};
use ringleader_core::{DType, Fingerprint, OpKind, ReduceOp};
use ringleader_diag::snapshot::{Beat, Running};
use ringleader_store::{keys, ClientOptions, ServerOptions, StoreClient, StoreServer};
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
