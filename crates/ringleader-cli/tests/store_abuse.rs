//! A standalone `ringleader store` under attack, and shared by two jobs:
//! every test starts the real store process, drives real sockets (and, for
//! jobs, real rank processes: this test binary re-run as workers), and
//! reads the store's resident memory from /proc before and after. Every
//! process runs under a hard time limit.

mod common;

use common::{run_env, start_env, Running};
use ringleader::{Communicator, ReduceOp};
use ringleader_core::{Error, ErrorKind};
use ringleader_store::{keys, ClientOptions, Role, StoreClient};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(60);
const SCENARIO: &str = "RL_STORE_ABUSE_SCENARIO";
const TOKEN: &str = "s3cret-abuse";

/// Runs `f` on a thread; fails the test if it does not end within `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the worker sends before it ends"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("the test did not finish within {limit:?}"),
    }
}

/// A `ringleader store` on an ephemeral port of 127.0.0.1, stopped (SIGTERM,
/// then bounded) when dropped.
struct Store {
    run: Option<Running>,
    addr: String,
    pid: u32,
}

impl Store {
    fn start(env: &[(&str, &str)]) -> Store {
        let run = start_env(&["store", "--port", "0", "--host", "127.0.0.1"], env);
        let first = run.stdout_line(LIMIT).unwrap_or_default();
        let Some(addr) = first.strip_prefix("ringleader store listening on ").map(str::to_string) else {
            let f = run.stop_after(Duration::ZERO);
            panic!("no address from `ringleader store`: {first:?} {f:#?}");
        };
        let _token_line = run.stdout_line(LIMIT);
        let pid = run.pid();
        Store { run: Some(run), addr, pid }
    }

    /// The store process's resident memory, in KiB.
    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Descriptors the store process holds.
    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid)).map_or(0, |d| d.count())
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Some(run) = self.run.take() {
            run.signal(libc::SIGTERM);
            // Killed if SIGTERM does not end it within 10 s.
            let grace = run.elapsed() + Duration::from_secs(10);
            let f = run.stop_after(grace);
            if std::thread::panicking() {
                eprintln!("`ringleader store` printed: {f:#?}");
            }
        }
    }
}

fn client(
    addr: &str,
    run: &str,
    token: Option<&str>,
    f: impl FnOnce(&mut ClientOptions),
) -> ringleader_core::Result<StoreClient> {
    let mut o = ClientOptions::new(run);
    o.token = token.map(str::to_string);
    o.connect_timeout = Duration::from_secs(10);
    o.op_timeout = Duration::from_secs(10);
    f(&mut o);
    StoreClient::connect(addr, o)
}

fn member(rank: usize, world: usize) -> impl FnOnce(&mut ClientOptions) {
    move |o| {
        o.role = Role::Member;
        (o.rank, o.world_size) = (Some(rank), Some(world));
    }
}

fn tool(o: &mut ClientOptions) {
    o.role = Role::Tool;
}

/// The bytes a fresh connection receives first (the challenge frame).
fn challenge_bytes(addr: &str) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = vec![0u8; 4];
    s.read_exact(&mut buf).unwrap();
    let len = u32::from_le_bytes(buf[..4].try_into().unwrap()) as usize;
    assert!(len < 4096, "a challenge of {len} bytes");
    buf.resize(4 + len, 0);
    s.read_exact(&mut buf[4..]).unwrap();
    buf
}

#[test]
fn a_client_without_the_token_is_refused_and_learns_no_run_id() {
    let store = Store::start(&[("RINGLEADER_TOKEN", TOKEN)]);
    let addr = store.addr.clone();
    within(LIMIT, move || {
        let run = "secret-job-42";
        let mut rank0 = client(&addr, run, Some(TOKEN), member(0, 2)).unwrap();
        rank0.set(keys::VERDICT, b"nothing yet").unwrap();

        let hello = challenge_bytes(&addr);
        assert!(!String::from_utf8_lossy(&hello).contains(run), "the challenge names the run");
        for (token, run_id) in [(None, "*"), (Some("guess"), "*"), (None, run), (Some("guess"), "other")] {
            let err = client(&addr, run_id, token, tool).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::AuthFailed, "{err}");
            assert!(!err.to_string().contains(run), "{err}");
            if run_id != "*" {
                let err = client(&addr, run_id, token, member(1, 2)).unwrap_err();
                assert_eq!(err.kind(), ErrorKind::AuthFailed, "{err}");
            }
        }
        let f = run_env(&["status", "--store", &addr, "--json"], &[], LIMIT);
        assert_eq!(f.code, Some(1), "{f:#?}");
        assert!(f.stderr.contains("[auth-failed]") && !f.stderr.contains(run), "{f:#?}");
        assert!(f.stdout.is_empty(), "{f:#?}");

        // With the token, a tool reads the job but changes nothing of the ranks'.
        let f = run_env(&["status", "--store", &addr, "--json"], &[("RINGLEADER_TOKEN", TOKEN)], LIMIT);
        assert_eq!(f.code, Some(0), "{f:#?}");
        let j: serde_json::Value = serde_json::from_str(&f.stdout).unwrap();
        assert_eq!(j["ranks"][0]["rank"], 0, "{j}");
        let mut viewer = client(&addr, "*", Some(TOKEN), tool).unwrap();
        for e in [viewer.set(keys::VERDICT, b"forged").err(), viewer.abort_job(b"stop").err()] {
            let e = e.expect("a tool may not do that");
            assert!(e.to_string().contains("[invalid-argument] store access"), "{e}");
        }
        assert!(viewer.add(keys::DUMP_REQUEST, 1).is_ok(), "tools may ask for dumps");
        assert_eq!(rank0.get(keys::VERDICT, Duration::ZERO).unwrap(), b"nothing yet");
        assert_eq!(rank0.status(None, Duration::ZERO).unwrap().abort, None);
    });
}

#[test]
fn amplification_phantom_ranks_and_oversized_hellos_leave_memory_bounded() {
    let store = Store::start(&[]);
    let (addr, pid) = (store.addr.clone(), store.pid);
    let rss = move || Store { run: None, addr: String::new(), pid }.rss_kib();
    let before_value = rss();
    within(LIMIT, move || {
        let mut rank0 = client(&addr, "job", None, member(0, 2)).unwrap();
        rank0.set("big", &vec![7u8; 64 << 20]).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let baseline = rss();
        assert!(baseline >= before_value + 60_000, "the value is in memory: {before_value} -> {baseline} KiB");

        // 65,536 keys over one 64 MiB value: 4 TiB of answer, refused unbuilt.
        let keys = vec!["big"; 65536];
        let mut stranger = client(&addr, "job", None, |_| {}).unwrap();
        for timeout in [Duration::ZERO, Duration::from_secs(5)] {
            for _ in 0..5 {
                let e = stranger.multi_get(&keys, timeout).unwrap_err();
                assert!(e.to_string().contains("frame limit"), "{e}");
            }
        }
        // Phantom ranks: no rank without a world size it is below.
        for (rank, world) in [(9999, 4), (0, 100_000)] {
            let e = client(&addr, "job", None, member(rank, world)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        }
        // Oversized host names: refused by name, or cut off at the frame header.
        let e = client(&addr, "job", None, |o| o.host = "h".repeat(10_000)).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "host"), "{e}");
        for _ in 0..20 {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut frame = (64u32 << 20).to_le_bytes().to_vec();
            frame.push(0x01);
            frame.extend(b"RLST");
            let _ = s.write_all(&frame);
            let _ = s.write_all(&vec![b'h'; 1 << 20]);
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink);
        }
        let status = rank0.status(None, Duration::ZERO).unwrap();
        assert_eq!(status.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(), [0], "no phantom was recorded");
        std::thread::sleep(Duration::from_millis(300));
        let after = rss();
        eprintln!("store RSS: {before_value} KiB, {baseline} KiB with the value, {after} KiB after the attacks");
        assert!(after < baseline + (32 << 10), "the store grew from {baseline} to {after} KiB");
        assert_eq!(rank0.get("big", Duration::ZERO).unwrap().len(), 64 << 20, "the store still serves");
    });
    drop(store);
}

#[test]
fn five_thousand_idle_sockets_do_not_lock_ranks_out() {
    let store = Store::start(&[]);
    let addr = store.addr.clone();
    let pid = store.pid;
    let probe = move || Store { run: None, addr: String::new(), pid };
    let baseline = (probe().rss_kib(), probe().fds());
    within(LIMIT, move || {
        let idle: Vec<TcpStream> = (0..5000).filter_map(|_| TcpStream::connect(&addr).ok()).collect();
        assert!(idle.len() >= 4900, "only {} sockets connected", idle.len());
        let start = Instant::now();
        let mut rank0 = client(&addr, "job", None, member(0, 1)).unwrap();
        rank0.set("k", b"v").unwrap();
        let joined = start.elapsed();
        assert!(joined < Duration::from_secs(5), "a rank waited {joined:?} behind idle sockets");
        let (rss, fds) = (probe().rss_kib(), probe().fds());
        eprintln!(
            "5000 idle sockets: the rank joined in {joined:?}; store RSS {} -> {rss} KiB, fds {} -> {fds}",
            baseline.0, baseline.1
        );
        assert!(fds < baseline.1 + 200, "the store holds {fds} descriptors");
        assert!(rss < baseline.0 + (64 << 10), "the store grew from {} to {rss} KiB", baseline.0);
        // The silent ones it kept are closed after the hello timeout (5 s).
        std::thread::sleep(Duration::from_secs(7));
        let fds = probe().fds();
        assert!(fds < baseline.1 + 10, "still {fds} descriptors");
        assert_eq!(rank0.get("k", Duration::ZERO).unwrap(), b"v");
        drop(idle);
    });
    drop(store);
}

// ---- two jobs, and a phantom, on one store: real rank processes ----

/// Entry point of the ranks (a no-op in a normal test run).
#[test]
fn worker() {
    let Ok(s) = std::env::var(SCENARIO) else { return };
    let c = Communicator::from_env().expect("init");
    let mut t = [1.0f32];
    c.all_reduce(&mut t, ReduceOp::Sum).expect("first all_reduce");
    println!("JOINED");
    let until = Instant::now() + Duration::from_millis(3000);
    let mut n = 0;
    let result = loop {
        if s == "dies" && c.rank() == 1 && n == 20 {
            // SAFETY: kill(2) on this very process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        // Rank 0's clock decides when to stop, and every rank learns it in
        // the same all_reduce. Back to back: a rank is inside a collective
        // nearly all the time, when news of another rank's end would abort it.
        let mut step = [1.0f32, f32::from(c.rank() == 0 && Instant::now() >= until)];
        if let Err(e) = c.all_reduce(&mut step, ReduceOp::Sum) {
            break Err(e);
        }
        n += 1;
        if step[1] > 0.0 {
            break Ok(());
        }
    };
    match result {
        Ok(()) => {
            println!("DONE {n}");
            c.destroy().unwrap();
            std::process::exit(0);
        }
        Err(e) => {
            println!("FAILED [{}] {}", e.kind().as_str(), e.to_string().lines().next().unwrap_or(""));
            std::process::exit(1);
        }
    }
}

/// The ranks of one job, started against the store at `addr`.
struct Job(Vec<(Child, mpsc::Receiver<String>)>);

impl Job {
    fn start(addr: &str, run: &str, scenario: &str, env: &[(&str, &str)]) -> Job {
        let exe = std::env::current_exe().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let ranks = (0..2)
            .map(|rank| {
                let mut cmd = Command::new(&exe);
                cmd.args(["--exact", "worker", "--nocapture", "--test-threads", "1", "-q"])
                    .env(SCENARIO, scenario)
                    .env("RANK", rank.to_string())
                    .env("WORLD_SIZE", "2")
                    .env("LOCAL_RANK", rank.to_string())
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string())
                    .env("RINGLEADER_STORE_ADDR", addr)
                    .env("RINGLEADER_RUN_ID", run)
                    .env("RINGLEADER_INIT_TIMEOUT", "20")
                    .env("RINGLEADER_TIMEOUT", "20")
                    .env(
                        "RINGLEADER_DUMP_DIR",
                        std::env::temp_dir().join(format!("rl-abuse-{run}-{}", std::process::id())),
                    )
                    .env_remove("RINGLEADER_TOKEN")
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null());
                for (k, v) in env {
                    cmd.env(k, v);
                }
                let mut child = cmd.spawn().unwrap();
                let out = child.stdout.take().unwrap();
                let (tx, rx) = mpsc::channel();
                std::thread::spawn(move || {
                    let mut text = String::new();
                    let _ = std::io::BufReader::new(out).read_to_string(&mut text);
                    for line in text.lines() {
                        let _ = tx.send(line.to_string());
                    }
                });
                (child, rx)
            })
            .collect();
        Job(ranks)
    }

    /// Each rank's exit code and output, within `limit` (killed past it).
    fn finish(mut self, limit: Duration) -> Vec<(Option<i32>, String)> {
        let deadline = Instant::now() + limit;
        let mut results = Vec::new();
        for (child, rx) in &mut self.0 {
            let code = loop {
                if let Some(st) = child.try_wait().unwrap() {
                    break st.code();
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let out: Vec<String> = rx.iter().collect();
            results.push((code, out.join("\n")));
        }
        results
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        for (child, _) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits (bounded) until `n` ranks of run `run` at `addr` joined (the run
/// exists once its first rank connected).
fn await_ranks(addr: &str, run: &str, token: Option<&str>, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let joined = client(addr, run, token, tool).and_then(|mut v| v.status(None, Duration::ZERO));
        if joined.is_ok_and(|s| s.ranks.len() >= n) {
            return;
        }
        assert!(Instant::now() < deadline, "run {run} never had {n} ranks");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn two_jobs_share_one_standalone_store_and_only_one_fails() {
    let store = Store::start(&[("RINGLEADER_TOKEN", TOKEN)]);
    let addr = store.addr.clone();
    within(LIMIT, move || {
        let env = [("RINGLEADER_TOKEN", TOKEN)];
        let a = Job::start(&addr, "job-a", "dies", &env);
        let b = Job::start(&addr, "job-b", "loops", &env);
        await_ranks(&addr, "job-a", Some(TOKEN), 2);
        await_ranks(&addr, "job-b", Some(TOKEN), 2);
        // Several runs: `status` must be told which, and with the token it
        // may learn their ids.
        let f = run_env(&["status", "--store", &addr], &env, LIMIT);
        assert_eq!(f.code, Some(2), "{f:#?}");
        assert!(f.stderr.contains("serves 2 runs: job-a, job-b"), "{f:#?}");
        let a = a.finish(LIMIT);
        let b = b.finish(LIMIT);
        assert_eq!(a[0].0, Some(1), "{a:?}");
        assert!(a[0].1.contains("FAILED [peer-died]") && a[0].1.contains("rank 1"), "{a:?}");
        // Rank 1 dies after all_reduce #21, long after its last heartbeat
        // (which may have it as far back as #1): the verdict names the one
        // it left unfinished.
        assert!(a[0].1.contains("all_reduce #22"), "{a:?}");
        for (code, out) in &b {
            assert_eq!(*code, Some(0), "job-b must not notice job-a: {b:?}");
            assert!(out.contains("DONE"), "{b:?}");
        }
        for (run, ranks_alive, aborted) in [("job-a", 0, true), ("job-b", 0, false)] {
            let f = run_env(&["status", "--store", &addr, "--run-id", run, "--json"], &env, LIMIT);
            assert_eq!(f.code, Some(0), "{f:#?}");
            let j: serde_json::Value = serde_json::from_str(&f.stdout).unwrap();
            let ranks: Vec<u64> = j["ranks"].as_array().unwrap().iter().map(|r| r["pid"].as_u64().unwrap()).collect();
            assert_eq!(ranks.len(), 2, "{run}: only its own two ranks: {j}");
            assert_eq!(j["ranks_connected"], ranks_alive, "{run}: {j}");
            assert_eq!(!j["abort"].is_null(), aborted, "{run}: {j}");
        }
    });
    drop(store);
}

#[test]
fn a_phantom_rank_does_not_abort_a_running_job() {
    let store = Store::start(&[]);
    let addr = store.addr.clone();
    within(LIMIT, move || {
        let job = Job::start(&addr, "job-p", "loops", &[]);
        await_ranks(&addr, "job-p", None, 2);
        // Without a token a stranger may claim a rank outside the job's
        // world and vanish; the job's ranks ignore it.
        let phantom = client(&addr, "job-p", None, member(9999, 10_000)).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        drop(phantom);
        // Nor may it abort the job or forge its verdict as a non-member.
        let mut stranger = client(&addr, "job-p", None, |_| {}).unwrap();
        assert!(stranger.abort_job(b"stop").is_err());
        assert!(stranger.set(keys::VERDICT, b"forged").is_err());
        for (code, out) in job.finish(LIMIT) {
            assert_eq!(code, Some(0), "{out}");
            assert!(out.contains("DONE"), "{out}");
        }
    });
    drop(store);
}
