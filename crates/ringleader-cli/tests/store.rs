//! `ringleader store` as a process: the shared secret from RINGLEADER_TOKEN
//! (or the variable `--token-env` names), the store's own warnings on its
//! stderr (filtered by RINGLEADER_LOG), and `ringleader status --json`
//! against it, with member connections played by this test. Every process
//! runs under a hard time limit.

mod common;

use common::{run_env, start_env, Running};
use ringleader_core::ErrorKind;
use ringleader_diag::snapshot::Beat;
use ringleader_store::{ClientOptions, Presence, StoreClient};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(20);

/// Starts `ringleader store` on an ephemeral port of 127.0.0.1 with `extra`
/// arguments and the variables `env`; answers it, its address and the line
/// that says whether a token is in force.
fn store(extra: &[&str], env: &[(&str, &str)]) -> (Running, String, String) {
    let mut args = vec!["store", "--port", "0", "--host", "127.0.0.1"];
    args.extend_from_slice(extra);
    let run = start_env(&args, env);
    let first = run.stdout_line(LIMIT);
    let token_line = run.stdout_line(LIMIT);
    let addr = first.as_deref().and_then(|l| l.strip_prefix("ringleader store listening on ")).map(str::to_string);
    match (addr, token_line) {
        (Some(addr), Some(token_line)) => (run, addr, token_line),
        (addr, token_line) => {
            let f = run.stop_after(Duration::ZERO);
            panic!("no address ({addr:?}) or token line ({token_line:?}) from `ringleader store`: {f:#?}")
        }
    }
}

/// A client of the store at `addr` (a member of a job of 2 when `rank` is
/// given) presenting `token`.
fn client(addr: &str, token: Option<&str>, rank: Option<usize>) -> ringleader_core::Result<StoreClient> {
    let mut opts = ClientOptions::new("job-7");
    if let Some(r) = rank {
        opts = opts.member(r, 2);
    }
    opts.token = token.map(str::to_string);
    opts.connect_timeout = Duration::from_secs(5);
    opts.op_timeout = Duration::from_secs(5);
    StoreClient::connect(addr, opts)
}

/// Waits (bounded) until the store sees `rank` vanished.
fn wait_vanished(watcher: &mut StoreClient, rank: usize) {
    let deadline = Instant::now() + LIMIT;
    while !watcher.status(None, Duration::ZERO).unwrap().with(Presence::Vanished).contains(&rank) {
        assert!(Instant::now() < deadline, "rank {rank} never vanished");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ringleader_token_is_required_by_default_and_warnings_reach_stderr() {
    let (run, addr, token_line) = store(&[], &[("RINGLEADER_TOKEN", "s3cret")]);
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert!(token_line.contains("token required") && token_line.contains("RINGLEADER_TOKEN"), "{token_line}");

        let refused = client(&addr, None, None).err().map(|e| e.kind());
        assert_eq!(refused, Some(ErrorKind::AuthFailed));
        let wrong = client(&addr, Some("guess"), None).err().map(|e| e.kind());
        assert_eq!(wrong, Some(ErrorKind::AuthFailed));
        let mut admitted = client(&addr, Some("s3cret"), None).unwrap();
        admitted.set("k", b"v").unwrap();
        assert_eq!(admitted.get("k", Duration::from_secs(2)).unwrap(), b"v");

        // A job of two: rank 0 idle, rank 1 gone without a goodbye (as a
        // kill -9 leaves it: the socket closes, no leave).
        let mut rank0 = client(&addr, Some("s3cret"), Some(0)).unwrap();
        rank0
            .heartbeat(
                &Beat {
                    last_started: 5,
                    last_completed: 5,
                    running: None,
                    p2p: Vec::new(),
                    running_site: None,
                    last_completed_site: None,
                }
                .encode(),
            )
            .unwrap();
        drop(client(&addr, Some("s3cret"), Some(1)).unwrap());
        wait_vanished(&mut admitted, 1);

        // `status` finds the store through RINGLEADER_STORE_ADDR and the secret in RINGLEADER_TOKEN.
        let env = [("RINGLEADER_STORE_ADDR", addr.as_str()), ("RINGLEADER_TOKEN", "s3cret")];
        let f = run_env(&["status", "--json"], &env, LIMIT);
        assert_eq!(f.code, Some(0), "{f:#?}");
        let j: serde_json::Value = serde_json::from_str(&f.stdout).unwrap_or_else(|e| panic!("{e}: {f:#?}"));
        let ranks: Vec<(u64, &str)> = j["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["rank"].as_u64().unwrap(), r["liveness"].as_str().unwrap()))
            .collect();
        assert_eq!(ranks, [(0, "connected"), (1, "vanished")], "{j}");
        assert_eq!((&j["ranks"][0]["state"], &j["ranks"][0]["last_completed"]), (&"idle".into(), &5.into()));
        let f = run_env(&["status"], &env[..1], LIMIT);
        assert_eq!(f.code, Some(1), "{f:#?}");
        assert!(f.stderr.contains("[auth-failed]"), "{f:#?}");
        drop(rank0);
    }));
    run.signal(libc::SIGTERM);
    let f = run.finish(LIMIT);
    if let Err(e) = checked {
        eprintln!("`ringleader store` printed: {f:#?}");
        std::panic::resume_unwind(e);
    }
    assert_eq!(f.code, Some(0), "{f:#?}");
    assert!(!f.stdout.contains("s3cret") && !f.stderr.contains("s3cret"), "the secret was printed: {f:#?}");
    let warnings: Vec<&str> = f.stderr.lines().filter(|l| l.starts_with("[ringleader store] warning: ")).collect();
    assert!(warnings.iter().any(|l| l.contains("store refused a connection")), "{f:#?}");
    assert!(warnings.iter().any(|l| l.contains("rank vanished without leaving rank=1")), "{f:#?}");
    for line in f.stderr.lines() {
        assert!(line.starts_with("[ringleader store] ") || line.starts_with("ringleader store: "), "{line:?}: {f:#?}");
    }
}

#[test]
fn without_a_token_any_client_is_admitted_and_log_off_is_quiet() {
    let (run, addr, token_line) = store(&["--run-id", "job-7"], &[("RINGLEADER_LOG", "off")]);
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert!(token_line.contains("no token") && token_line.contains("of run job-7"), "{token_line}");
        let mut watcher = client(&addr, None, None).unwrap();
        drop(client(&addr, None, Some(1)).unwrap());
        wait_vanished(&mut watcher, 1);
    }));
    run.signal(libc::SIGTERM);
    let f = run.finish(LIMIT);
    if let Err(e) = checked {
        eprintln!("`ringleader store` printed: {f:#?}");
        std::panic::resume_unwind(e);
    }
    assert_eq!(f.code, Some(0), "{f:#?}");
    assert!(!f.stderr.contains("[ringleader"), "RINGLEADER_LOG=off printed: {f:#?}");
}

#[test]
fn token_env_names_another_variable() {
    let env = [("RINGLEADER_TOKEN", "not-this-one"), ("RL_TEST_STORE_TOKEN", "this-one")];
    let (run, addr, token_line) = store(&["--token-env", "RL_TEST_STORE_TOKEN"], &env);
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert!(token_line.contains("RL_TEST_STORE_TOKEN"), "{token_line}");
        assert_eq!(client(&addr, Some("not-this-one"), None).err().map(|e| e.kind()), Some(ErrorKind::AuthFailed));
        assert!(client(&addr, Some("this-one"), None).is_ok());
    }));
    run.signal(libc::SIGTERM);
    let f = run.finish(LIMIT);
    if let Err(e) = checked {
        eprintln!("`ringleader store` printed: {f:#?}");
        std::panic::resume_unwind(e);
    }
    assert_eq!(f.code, Some(0), "{f:#?}");

    // A --token-env variable that is unset is a usage error.
    let f = run_env(&["store", "--port", "0", "--token-env", "RL_TEST_UNSET_VAR"], &[], LIMIT);
    assert_eq!(f.code, Some(2), "{f:#?}");
    assert!(f.stderr.contains("RL_TEST_UNSET_VAR"), "{f:#?}");
}
