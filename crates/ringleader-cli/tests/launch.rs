//! `ringleader launch` and `ringleader store` with real processes: the built
//! binary starting `sh -c` ranks. Every process a test starts runs under a
//! hard time limit ([`Running::finish`]): past it, the launcher's process
//! group is killed (its ranks follow through their parent-death signal) and
//! the test fails.

use ringleader_store::{ClientOptions, ServerOptions, StoreClient, StoreServer};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::{alive, gone_soon, start_env as start, Finished, Scratch, BIN};

fn launch(args: &[&str], limit: Duration) -> Finished {
    let mut all = vec!["launch"];
    all.extend_from_slice(args);
    start(&all, &[]).finish(limit)
}

const LIMIT: Duration = Duration::from_secs(20);

#[test]
fn two_ranks_prefixed_output_and_exit_0() {
    let f = launch(
        &[
            "--nproc-per-node",
            "2",
            "--",
            "sh",
            "-c",
            "echo out $RANK; echo err $RANK >&2; printf 'no newline %s' $RANK",
        ],
        LIMIT,
    );
    assert_eq!(f.code, Some(0), "{f:#?}");
    for r in 0..2 {
        assert!(f.stdout.contains(&format!("[rank{r}]: out {r}\n")), "{f:#?}");
        assert!(f.stdout.contains(&format!("[rank{r}]: no newline {r}\n")), "{f:#?}");
        assert!(f.stderr.contains(&format!("[rank{r}]: err {r}\n")), "{f:#?}");
    }
    assert_eq!(f.stdout.lines().count(), 4, "{f:#?}");
}

#[test]
fn lines_stay_whole_under_concurrent_writers() {
    let script = "i=0; while [ $i -lt 300 ]; do \
                  echo \"line $i xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"; \
                  i=$((i+1)); done";
    let f = launch(&["--nproc-per-node", "3", "--", "sh", "-c", script], LIMIT);
    assert_eq!(f.code, Some(0), "{}", f.stderr);
    assert_eq!(f.stdout.lines().count(), 900);
    for line in f.stdout.lines() {
        let rest = line
            .strip_prefix("[rank0]: ")
            .or_else(|| line.strip_prefix("[rank1]: "))
            .or_else(|| line.strip_prefix("[rank2]: "))
            .unwrap_or_else(|| panic!("bad prefix: {line:?}"));
        assert!(rest.starts_with("line ") && rest.ends_with("xxxx"), "{line:?}");
        assert_eq!(rest.matches("line").count(), 1, "{line:?}");
    }
}

const ENV_SCRIPT: &str = "echo \"R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK LW=$LOCAL_WORLD_SIZE \
    G=$GROUP_RANK RR=$ROLE_RANK MA=$MASTER_ADDR MP=$MASTER_PORT TID=$TORCHELASTIC_RUN_ID \
    RID=$RINGLEADER_RUN_ID SA=$RINGLEADER_STORE_ADDR PU=$PYTHONUNBUFFERED OMP=$OMP_NUM_THREADS\"; \
    grep SigBlk /proc/self/status";

/// `KEY=value` pairs of the line rank `rank` printed.
fn env_of(stdout: &str, rank: usize) -> std::collections::HashMap<String, String> {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("[rank{rank}]: R=")))
        .unwrap_or_else(|| panic!("no env line of rank {rank} in {stdout}"));
    format!("R={line}")
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn single_node_environment() {
    let f = launch(&["--nproc-per-node", "2", "--", "sh", "-c", ENV_SCRIPT], LIMIT);
    assert_eq!(f.code, Some(0), "{f:#?}");
    let (e0, e1) = (env_of(&f.stdout, 0), env_of(&f.stdout, 1));
    for (r, e) in [(0, &e0), (1, &e1)] {
        let r = r.to_string();
        assert_eq!(e["R"], r);
        assert_eq!(e["L"], r);
        assert_eq!(e["RR"], r);
        assert_eq!(e["W"], "2");
        assert_eq!(e["LW"], "2");
        assert_eq!(e["G"], "0");
        assert_eq!(e["MA"], "127.0.0.1");
        assert_eq!(e["PU"], "1");
        assert_eq!(e["OMP"], "1");
        assert_eq!(e["TID"], e["RID"]);
    }
    assert!(!e0["RID"].is_empty());
    assert_eq!(e0["RID"], e1["RID"], "one run id for the job");
    assert_eq!(e0["MP"], e1["MP"]);
    assert_eq!(e0["SA"], e1["SA"]);
    let master_port: u16 = e0["MP"].parse().unwrap();
    let (host, store_port) = e0["SA"].rsplit_once(':').unwrap();
    assert_eq!(host, "127.0.0.1");
    assert_ne!(store_port.parse::<u16>().unwrap(), master_port);
    assert_ne!(master_port, 0);
    // Ranks start with no signal blocked (the launcher blocks SIGINT/SIGTERM).
    assert_eq!(f.stdout.matches("SigBlk:\t0000000000000000").count(), 2, "{f:#?}");
}

#[test]
fn second_node_environment_and_inherited_settings() {
    let args = [
        "launch",
        "--nproc-per-node",
        "2",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        "23456",
        "--",
        "sh",
        "-c",
        ENV_SCRIPT,
    ];
    let f = start(&args, &[("OMP_NUM_THREADS", "7")]).finish(LIMIT);
    assert_eq!(f.code, Some(0), "{f:#?}");
    for (local, global) in [(0, "2"), (1, "3")] {
        let e = env_of(&f.stdout, local + 2);
        assert_eq!(e["R"], global);
        assert_eq!(e["L"], local.to_string());
        assert_eq!(e["W"], "4");
        assert_eq!(e["G"], "1");
        assert_eq!(e["MP"], "23456");
        assert_eq!(e["SA"], "127.0.0.1:23457", "store on MASTER_PORT + 1");
        assert_eq!(e["OMP"], "7", "an inherited OMP_NUM_THREADS is kept");
        assert!(e["RID"].starts_with("rl-"), "derived from the master address");
    }
    let other = start(&args, &[]).finish(LIMIT);
    assert_eq!(
        env_of(&other.stdout, 2)["RID"],
        env_of(&f.stdout, 2)["RID"],
        "every launch with the same master derives the same run id"
    );
}

#[test]
fn failing_rank_tears_down_the_others() {
    let dir = Scratch::new("fail");
    let d = dir.path();
    let script = format!(
        "if [ $RANK = 1 ]; then \
           while [ ! -f {d}/ready ]; do sleep 0.01; done; echo bye; exit 3; \
         fi; \
         sleep 60 & echo $! > {d}/bg; echo $$ > {d}/pid; touch {d}/ready; wait"
    );
    let f = launch(&["--nproc-per-node", "2", "--grace", "1", "--", "sh", "-c", &script], LIMIT);
    assert_eq!(f.code, Some(3), "{f:#?}");
    assert!(f.elapsed < Duration::from_secs(5), "{f:#?}");
    assert!(f.stderr.contains("rank 1 (pid ") && f.stderr.contains("exited with code 3"), "{f:#?}");
    assert!(f.stdout.contains("[rank1]: bye"), "{f:#?}");
    assert!(f.stderr.contains("SIGTERM"), "{f:#?}");
    let (pid, bg) = (dir.read_pid("pid"), dir.read_pid("bg"));
    assert!(gone_soon(pid), "rank 0 (pid {pid}) survived the teardown");
    assert!(gone_soon(bg), "rank 0's child (pid {bg}) survived the teardown");
}

#[test]
fn rank_killed_by_sigkill() {
    let f =
        launch(&["--nproc-per-node", "2", "--", "sh", "-c", "if [ $RANK = 1 ]; then kill -9 $$; fi; exit 0"], LIMIT);
    assert_eq!(f.code, Some(137), "{f:#?}");
    let line = f.stderr.lines().find(|l| l.contains("rank 1 (pid ")).unwrap_or_else(|| panic!("{f:#?}"));
    assert!(line.contains("killed by signal 9 (SIGKILL"), "{line:?} in {f:#?}");
}

#[test]
fn sigint_to_the_launcher_tears_down_the_ranks() {
    let dir = Scratch::new("sigint");
    let d = dir.path();
    let script = format!("echo $$ > {d}/pid$RANK.tmp; mv {d}/pid$RANK.tmp {d}/pid$RANK; exec sleep 60");
    let run = start(&["launch", "--nproc-per-node", "2", "--", "sh", "-c", &script], &[]);
    dir.wait_for(&["pid0", "pid1"], LIMIT);
    let pids = [dir.read_pid("pid0"), dir.read_pid("pid1")];
    run.signal(libc::SIGINT);
    let f = run.finish(LIMIT);
    assert_eq!(f.code, Some(130), "{f:#?}");
    assert!(f.stderr.contains("got SIGINT"), "{f:#?}");
    for pid in pids {
        assert!(gone_soon(pid), "rank pid {pid} survived SIGINT");
    }
}

#[test]
fn second_sigint_kills_at_once() {
    let dir = Scratch::new("sigint2");
    let d = dir.path();
    let script = format!("trap '' INT TERM; touch {d}/ready$RANK; sleep 60");
    let run = start(&["launch", "--nproc-per-node", "2", "--grace", "30", "--", "sh", "-c", &script], &[]);
    dir.wait_for(&["ready0", "ready1"], LIMIT);
    run.signal(libc::SIGINT);
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    run.signal(libc::SIGINT);
    let f = run.finish(LIMIT);
    assert!(t.elapsed() < Duration::from_secs(3), "{f:#?}");
    assert_eq!(f.code, Some(130), "{f:#?}");
    assert!(f.stderr.contains("killing"), "{f:#?}");
}

#[test]
fn rank_ignoring_sigterm_gets_sigkill() {
    let dir = Scratch::new("ignore-term");
    let d = dir.path();
    let script = format!(
        "if [ $RANK = 1 ]; then \
           while [ ! -f {d}/ready ]; do sleep 0.01; done; exit 1; \
         fi; \
         trap '' TERM; echo $$ > {d}/pid; touch {d}/ready; sleep 60"
    );
    let f = launch(&["--nproc-per-node", "2", "--grace", "0.5", "--", "sh", "-c", &script], LIMIT);
    assert_eq!(f.code, Some(1), "{f:#?}");
    // 0.5 s grace, SIGTERM (ignored), SIGKILL 3 s later.
    assert!(f.elapsed >= Duration::from_millis(3400), "{f:#?}");
    assert!(f.elapsed < Duration::from_secs(8), "{f:#?}");
    assert!(f.stderr.contains("sending SIGKILL to rank 0"), "{f:#?}");
    assert!(f.stderr.contains("rank 0 (pid ") && f.stderr.contains("signal 9 (SIGKILL"), "{f:#?}");
    assert!(gone_soon(dir.read_pid("pid")));
}

#[test]
fn usage_errors() {
    let f = launch(&["--nproc-per-node", "2", "--nnodes", "2", "--", "true"], LIMIT);
    assert_eq!(f.code, Some(2), "{f:#?}");
    assert!(f.stderr.contains("--master-addr"), "{f:#?}");

    let f = launch(&["--nproc-per-node", "1", "--", "/nonexistent/ringleader-test-cmd"], LIMIT);
    assert_eq!(f.code, Some(127), "{f:#?}");
    assert!(f.stderr.contains("cannot start"), "{f:#?}");
}

/// A memory cgroup with a small limit, made for one test and removed after;
/// `None` where cgroups cannot be written (not root, read-only, no memory
/// controller).
struct SmallCgroup {
    dir: PathBuf,
}

impl SmallCgroup {
    fn create(name: &str) -> Option<SmallCgroup> {
        let name = format!("{name}-{}", std::process::id());
        let v1 = PathBuf::from("/sys/fs/cgroup/memory").join(&name);
        let v2 = PathBuf::from("/sys/fs/cgroup").join(&name);
        for (dir, limit, swap) in
            [(v1, "memory.limit_in_bytes", "memory.memsw.limit_in_bytes"), (v2, "memory.max", "memory.swap.max")]
        {
            if std::fs::create_dir(&dir).is_err() {
                continue;
            }
            let cg = SmallCgroup { dir };
            if std::fs::write(cg.dir.join(limit), "64M").is_ok() {
                let _ = std::fs::write(cg.dir.join(swap), "64M");
                let _ = std::fs::write(cg.dir.join("memory.swap.max"), "0");
                return Some(cg);
            }
        }
        None
    }
}

impl Drop for SmallCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn oom_kill_is_named() {
    let Some(cg) = SmallCgroup::create("rl-oom-test") else {
        eprintln!("skipped: cannot create a memory cgroup here (needs root and cgroupfs)");
        return;
    };
    // Rank 1 moves itself into the small cgroup and becomes awk, which
    // doubles a string until the OOM killer ends it.
    let script = format!(
        "if [ $RANK = 1 ]; then echo $$ > {}/cgroup.procs || exit 99; \
           exec awk 'BEGIN {{ s = \"x\"; while (1) s = s s }}'; fi; exit 0",
        cg.dir.display()
    );
    let f = launch(&["--nproc-per-node", "2", "--", "sh", "-c", &script], LIMIT);
    if f.code == Some(99) {
        eprintln!("skipped: cannot move a process into {}", cg.dir.display());
        return;
    }
    assert_eq!(f.code, Some(137), "{f:#?}");
    let line = f.stderr.lines().find(|l| l.contains("rank 1 (pid ")).unwrap_or_else(|| panic!("{f:#?}"));
    assert!(line.contains("SIGKILL, OOM killer: "), "{line:?}");
}

fn store_client(addr: &str, run_id: &str, token: Option<&str>) -> ringleader_core::Result<StoreClient> {
    let mut opts = ClientOptions::new(run_id);
    opts.token = token.map(str::to_string);
    opts.connect_timeout = Duration::from_secs(5);
    opts.op_timeout = Duration::from_secs(5);
    StoreClient::connect(addr, opts)
}

#[test]
fn node_0_hosts_the_store_for_its_ranks() {
    let dir = Scratch::new("hosted-store");
    let d = dir.path();
    let script = format!(
        "echo \"$RINGLEADER_STORE_ADDR $RINGLEADER_RUN_ID $RINGLEADER_TOKEN\" > {d}/store.tmp; \
         mv {d}/store.tmp {d}/store; \
         while [ ! -f {d}/checked ]; do sleep 0.01; done"
    );
    let run = start(&["launch", "--nproc-per-node", "1", "--", "sh", "-c", &script], &[]);
    dir.wait_for(&["store"], LIMIT);
    let line = std::fs::read_to_string(dir.0.join("store")).unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    let [addr, run_id, token] = words[..] else { panic!("{line}") };
    // No RINGLEADER_TOKEN was set: the launcher made one and gave it to its
    // ranks; a client without it is refused.
    assert_eq!(token.len(), 32, "{line}");
    let stranger = store_client(addr, run_id, None).map(|_| ());
    let checked = (|| {
        let mut c = store_client(addr, run_id, Some(token))?;
        c.set("probe", b"yes")?;
        c.get("probe", Duration::from_secs(2))
    })();
    // `ringleader status` from another terminal of this user finds the secret.
    let status = Command::new(BIN).args(["status", "--store", addr]).env_remove("RINGLEADER_TOKEN").output().unwrap();
    std::fs::write(dir.0.join("checked"), "").unwrap();
    let f = run.finish(LIMIT);
    assert_eq!(checked.unwrap(), b"yes");
    assert!(
        matches!(&stranger, Err(e) if e.kind() == ringleader_core::ErrorKind::AuthFailed),
        "a client without the launcher's token: {stranger:?}"
    );
    let status_out = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success() && status_out.contains(&format!("job at {addr}")), "{status:?}");
    assert_eq!(f.code, Some(0), "{f:#?}");
}

#[test]
fn endings_are_recorded_in_the_store() {
    // This test plays node 0 (hosting the store); the launcher is node 1.
    let mut server_opts = ServerOptions::new("rec-test");
    server_opts.token = Some("rec-secret".into());
    let server = StoreServer::bind("127.0.0.1:0", server_opts).unwrap();
    let store_port = server.local_addr().port().to_string();
    let master_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let f = start(
        &[
            "launch",
            "--nproc-per-node",
            "2",
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            &master_port,
            "--store-port",
            &store_port,
            "--run-id",
            "rec-test",
            "--",
            "sh",
            "-c",
            "if [ $RANK = 2 ]; then exit 3; fi; kill -9 $$",
        ],
        &[("RINGLEADER_TOKEN", "rec-secret")],
    )
    .finish(LIMIT);
    assert!(matches!(f.code, Some(3) | Some(137)), "{f:#?}");
    assert!(!f.stderr.contains("warning"), "{f:#?}");
    let addr = format!("127.0.0.1:{store_port}");
    let mut c = store_client(&addr, "rec-test", Some("rec-secret")).unwrap();
    let get = |c: &mut StoreClient, k: &str| String::from_utf8(c.get(k, Duration::from_secs(2)).unwrap()).unwrap();
    assert_eq!(get(&mut c, "rl/exit/2"), "exited with code 3");
    assert_eq!(get(&mut c, "rl/exit/3"), "killed by signal 9 (SIGKILL)");
    server.shutdown();
}

#[test]
fn standalone_store_serves_until_sigterm() {
    let run = start(
        &["store", "--port", "0", "--host", "127.0.0.1", "--token-env", "RL_TEST_TOKEN"],
        &[("RL_TEST_TOKEN", "s3cret")],
    );
    let line = run.stdout_line(LIMIT).ok_or("no first line");
    let checked = line.as_ref().ok().and_then(|l| {
        let addr = l.trim().strip_prefix("ringleader store listening on ")?.to_string();
        let refused = store_client(&addr, "any-run", None).is_err();
        let mut c = store_client(&addr, "any-run", Some("s3cret")).ok()?;
        c.set("k", b"v").ok()?;
        Some((refused, c.get("k", Duration::from_secs(2)).ok()?))
    });
    run.signal(libc::SIGTERM);
    let f = run.finish(LIMIT);
    assert_eq!(checked, Some((true, b"v".to_vec())), "first line {line:?}, {f:#?}");
    assert_eq!(f.code, Some(0), "{f:#?}");
}

/// Not a test of its own: the rank program of
/// `store_warnings_reach_the_launchers_stderr` (this test binary, run by the
/// launcher); without RL_TEST_VANISHING_RANK it returns at once. Rank 0 joins
/// the launcher's store as a member and kills itself with SIGKILL; rank 1
/// joins, waits (bounded) until the store has seen rank 0 vanish, leaves
/// and exits 0.
#[test]
fn vanishing_rank() {
    if std::env::var_os("RL_TEST_VANISHING_RANK").is_none() {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let rank: usize = var("RANK").parse().unwrap();
    let world: usize = var("WORLD_SIZE").parse().unwrap();
    let mut opts = ClientOptions::new(var("RINGLEADER_RUN_ID")).member(rank, world);
    opts.token = std::env::var("RINGLEADER_TOKEN").ok();
    opts.connect_timeout = Duration::from_secs(10);
    opts.op_timeout = Duration::from_secs(10);
    let mut member = StoreClient::connect(&var("RINGLEADER_STORE_ADDR"), opts).unwrap();
    if rank == 0 {
        // SAFETY: kill(2) on this very process.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    let deadline = Instant::now() + LIMIT;
    while !member.status(None, Duration::ZERO).unwrap().with(ringleader_store::Presence::Vanished).contains(&0) {
        assert!(Instant::now() < deadline, "rank 0 never vanished");
        std::thread::sleep(Duration::from_millis(20));
    }
    member.leave().unwrap();
    std::process::exit(0);
}

#[test]
fn store_warnings_reach_the_launchers_stderr() {
    let exe = std::env::current_exe().unwrap();
    let rank_cmd = [exe.to_str().unwrap(), "--exact", "vanishing_rank", "--nocapture", "--test-threads", "1"];
    // RINGLEADER_LOG empty: the default (warn).
    for (log, shown) in [("", true), ("off", false)] {
        let mut args = vec!["launch", "--nproc-per-node", "2", "--grace", "10", "--"];
        args.extend_from_slice(&rank_cmd);
        let f = start(&args, &[("RL_TEST_VANISHING_RANK", "1"), ("RINGLEADER_LOG", log)]).finish(LIMIT);
        assert_eq!(f.code, Some(137), "{f:#?}");
        let line = f.stderr.lines().find(|l| l.contains("rank 0 (pid ")).unwrap_or_else(|| panic!("{f:#?}"));
        assert!(line.contains("killed by signal 9 (SIGKILL"), "{line:?} in {f:#?}");
        let warned = f
            .stderr
            .lines()
            .any(|l| l.starts_with("[ringleader store] warning: rank vanished without leaving rank=0 "));
        assert_eq!(warned, shown, "RINGLEADER_LOG={log:?}: {f:#?}");
        if !shown {
            assert!(!f.stderr.contains("[ringleader "), "RINGLEADER_LOG=off printed: {f:#?}");
        }
        // Every line whole: a rank's (prefixed), the launcher's or the store's.
        for l in f.stderr.lines() {
            assert!(
                l.starts_with("[rank") || l.starts_with("ringleader launch: ") || l.starts_with("[ringleader store] "),
                "{l:?} in {f:#?}"
            );
        }
    }
}

#[test]
fn sighup_to_the_launcher_leaves_the_job_running_to_its_end() {
    let dir = Scratch::new("sighup");
    let d = dir.path();
    let script = format!(
        "trap 'echo rank got SIGHUP' HUP; touch {d}/ready$RANK; \
         while [ ! -f {d}/go ]; do sleep 0.01; done; echo done"
    );
    let run = start(&["launch", "--nproc-per-node", "2", "--", "sh", "-c", &script], &[]);
    dir.wait_for(&["ready0", "ready1"], LIMIT);
    run.signal(libc::SIGHUP);
    // Wait (bounded) until the launcher has taken the signal: it is no
    // longer pending for the process.
    let status = format!("/proc/{}/status", run.pid());
    let hup = 1u64 << (libc::SIGHUP - 1);
    let deadline = Instant::now() + LIMIT;
    loop {
        let text = std::fs::read_to_string(&status).expect("the launcher died of SIGHUP");
        let pending = text.lines().find_map(|l| l.strip_prefix("ShdPnd:")).map(|v| v.trim()).unwrap_or("0");
        if u64::from_str_radix(pending, 16).unwrap() & hup == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "SIGHUP stayed pending");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(alive(run.pid() as i32), "the launcher died of SIGHUP");
    // The launcher said it ignores it; the job finishes on its own.
    std::fs::write(dir.0.join("go"), b"").unwrap();
    let f = run.finish(LIMIT);
    assert_eq!(f.code, Some(0), "{f:#?}");
    assert!(f.stderr.contains("got SIGHUP") && f.stderr.contains("ignoring it"), "{f:#?}");
    assert!(f.stdout.contains("[rank0]: done") && f.stdout.contains("[rank1]: done"), "{f:#?}");
    assert!(!f.stdout.contains("rank got SIGHUP"), "SIGHUP reached a rank: {f:#?}");
}

#[test]
fn a_grandchild_of_a_rank_does_not_outlive_the_job() {
    let dir = Scratch::new("grandchild");
    let d = dir.path();
    // Each rank leaves a background process behind and exits 0.
    let script = format!("sleep 1000 & echo $! > {d}/bg$RANK.tmp; mv {d}/bg$RANK.tmp {d}/bg$RANK; exit 0");
    let f = launch(&["--nproc-per-node", "2", "--", "sh", "-c", &script], LIMIT);
    assert_eq!(f.code, Some(0), "{f:#?}");
    // Its pipes closed with it: the launcher did not wait for them.
    assert!(f.elapsed < Duration::from_secs(5), "{f:#?}");
    for r in 0..2 {
        let bg = dir.read_pid(&format!("bg{r}"));
        assert!(gone_soon(bg), "rank {r}'s background process (pid {bg}) outlived the job");
    }
}
