//! Multi-process test harness: every rank is a real process (this test
//! binary, re-invoked to run one named scenario), the store runs in the test
//! process as the launcher would host it, and every job has a hard time
//! limit after which all its processes are killed and the test fails.

#![allow(dead_code, unreachable_pub, missing_docs)]

use ringleader_store::{ServerOptions, StoreServer};
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The environment variable that turns this test binary into a worker.
pub const SCENARIO: &str = "RL_TEST_SCENARIO";

/// How one rank ended.
#[derive(Debug)]
pub struct Outcome {
    pub rank: usize,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Time from the job's start to this rank's exit.
    pub elapsed: Duration,
}

impl Outcome {
    /// Lines of stdout starting with `tag `, without the tag.
    pub fn lines(&self, tag: &str) -> Vec<String> {
        let prefix = format!("{tag} ");
        self.stdout.lines().filter_map(|l| l.strip_prefix(&prefix).map(str::to_string)).collect()
    }

    /// The single `ERROR` line a failing scenario printed, parsed.
    pub fn error(&self) -> Option<ErrLine> {
        self.lines("ERROR").first().map(|l| serde_json::from_str(l).expect("ERROR line is JSON"))
    }
}

/// What a worker reports about the error it got.
#[derive(Debug, serde::Deserialize, serde::Serialize)]
pub struct ErrLine {
    pub kind: String,
    pub ranks: Vec<usize>,
    pub seq: Option<u64>,
    pub op: Option<String>,
    pub elapsed_ms: u64,
    /// Wall clock when the error arrived, ms since the Unix epoch.
    pub at_ms: u64,
    /// The whole verdict (a verdict's full text, on every rank).
    pub message: String,
    /// What the error displays: the whole verdict on one rank per host, one
    /// line pointing there on the others.
    pub shown: String,
}

/// Wall clock now, ms since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A directory for marker files shared by the test and its workers.
pub fn mark_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("rl-marks-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// In a worker: creates marker `name` in `$RL_MARK_DIR`.
pub fn mark(name: &str) {
    if let Ok(d) = std::env::var("RL_MARK_DIR") {
        let _ = std::fs::write(std::path::Path::new(&d).join(name), b"");
    }
}

/// In a test: waits (at most `secs`) for marker `name` in `dir`.
pub fn wait_mark(dir: &std::path::Path, name: &str, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !dir.join(name).exists() {
        assert!(Instant::now() < deadline, "marker {name} never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `sig` to process `pid`.
pub fn signal(pid: u32, sig: i32) {
    let _ = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status();
}

/// A job to run.
pub struct JobSpec<'a> {
    pub world: usize,
    pub scenario: &'a str,
    pub env: Vec<(String, String)>,
    /// Per-rank extra environment.
    pub rank_env: Box<dyn Fn(usize) -> Vec<(String, String)> + 'a>,
    pub limit: Duration,
    /// Host the store in the test process (as `ringleader launch` does);
    /// otherwise rank 0 hosts it.
    pub external_store: bool,
    /// Ranks not started at all (a node that never launched).
    pub absent: Vec<usize>,
}

impl<'a> JobSpec<'a> {
    pub fn new(world: usize, scenario: &'a str) -> JobSpec<'a> {
        JobSpec {
            world,
            scenario,
            env: Vec::new(),
            rank_env: Box::new(|_| Vec::new()),
            limit: Duration::from_secs(60),
            external_store: true,
            absent: Vec::new(),
        }
    }

    /// Does not start `rank`.
    pub fn without(mut self, rank: usize) -> Self {
        self.absent.push(rank);
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn limit(mut self, secs: u64) -> Self {
        self.limit = Duration::from_secs(secs);
        self
    }

    pub fn rank0_hosts_store(mut self) -> Self {
        self.external_store = false;
        self
    }

    pub fn per_rank(mut self, f: impl Fn(usize) -> Vec<(String, String)> + 'a) -> Self {
        self.rank_env = Box::new(f);
        self
    }
}

/// A free TCP port on loopback (closed again; good enough for tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A running job.
pub struct Running {
    pub children: Vec<Child>,
    pub start: Instant,
    pub limit: Duration,
    _store: Option<StoreServer>,
    pub store_addr: String,
    /// The run id the ranks were given.
    pub run_id: String,
}

/// Starts every rank of `spec`.
pub fn start(spec: &JobSpec<'_>) -> Running {
    let run_id = format!("test-{}-{}", std::process::id(), free_port());
    let (store, store_addr, port) = if spec.external_store {
        let s = StoreServer::bind("127.0.0.1:0", ServerOptions::new(run_id.clone())).unwrap();
        let addr = s.local_addr().to_string();
        (Some(s), addr.clone(), free_port())
    } else {
        let p = free_port();
        (None, format!("127.0.0.1:{p}"), p)
    };
    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let children = (0..spec.world)
        .filter(|r| !spec.absent.contains(r))
        .map(|rank| {
            let mut c = Command::new(&exe);
            c.args(["--exact", "worker", "--nocapture", "--test-threads", "1", "-q"])
                .env(SCENARIO, spec.scenario)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", spec.world.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("RINGLEADER_RUN_ID", &run_id)
                .env("RINGLEADER_INIT_TIMEOUT", "30")
                .env("RINGLEADER_DUMP_DIR", std::env::temp_dir().join(format!("rl-test-dumps-{run_id}")))
                .env_remove("RINGLEADER_STORE_ADDR")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if spec.external_store {
                c.env("RINGLEADER_STORE_ADDR", &store_addr);
            }
            for (k, v) in spec.env.iter().chain((spec.rank_env)(rank).iter()) {
                c.env(k, v);
            }
            c.spawn().expect("spawning a worker")
        })
        .collect();
    Running { children, start, limit: spec.limit, _store: store, store_addr, run_id }
}

impl Running {
    pub fn pid(&self, rank: usize) -> u32 {
        self.children[rank].id()
    }

    /// Waits for every rank (killing all at the limit, which fails the test).
    pub fn finish(mut self) -> Vec<Outcome> {
        let n = self.children.len();
        let mut outs: Vec<Option<Outcome>> = (0..n).map(|_| None).collect();
        // Drain pipes on threads so a chatty worker cannot block on a full pipe.
        let readers: Vec<_> = self
            .children
            .iter_mut()
            .map(|c| {
                let mut o = c.stdout.take().unwrap();
                let mut e = c.stderr.take().unwrap();
                (
                    std::thread::spawn(move || {
                        let mut s = String::new();
                        let _ = o.read_to_string(&mut s);
                        s
                    }),
                    std::thread::spawn(move || {
                        let mut s = String::new();
                        let _ = e.read_to_string(&mut s);
                        s
                    }),
                )
            })
            .collect();
        let mut times = vec![None; n];
        loop {
            for (i, c) in self.children.iter_mut().enumerate() {
                if times[i].is_none() {
                    if let Ok(Some(st)) = c.try_wait() {
                        times[i] = Some((st, self.start.elapsed()));
                    }
                }
            }
            if times.iter().all(Option::is_some) {
                break;
            }
            if self.start.elapsed() > self.limit {
                for c in self.children.iter_mut() {
                    let _ = c.kill();
                }
                let mut report = String::new();
                for (i, (ro, re)) in readers.into_iter().enumerate() {
                    let _ = self.children[i].wait();
                    report += &format!(
                        "--- rank {i} stdout:\n{}\n--- rank {i} stderr:\n{}\n",
                        ro.join().unwrap(),
                        re.join().unwrap()
                    );
                }
                panic!("job exceeded its hard limit of {:?}; killed every rank\n{report}", self.limit);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for (i, (ro, re)) in readers.into_iter().enumerate() {
            use std::os::unix::process::ExitStatusExt;
            let (st, elapsed) = times[i].unwrap();
            outs[i] = Some(Outcome {
                rank: i,
                code: st.code(),
                signal: st.signal(),
                stdout: ro.join().unwrap(),
                stderr: re.join().unwrap(),
                elapsed,
            });
        }
        outs.into_iter().map(Option::unwrap).collect()
    }
}

/// Runs a job to the end.
pub fn run(spec: JobSpec<'_>) -> Vec<Outcome> {
    start(&spec).finish()
}

/// Panics with every rank's output unless all ranks exited 0.
pub fn assert_all_ok(outs: &[Outcome]) {
    if outs.iter().all(|o| o.code == Some(0)) {
        return;
    }
    let mut report = String::new();
    for o in outs {
        report += &format!(
            "--- rank {} ({:?}/{:?}) stdout:\n{}\n--- stderr:\n{}\n",
            o.rank, o.code, o.signal, o.stdout, o.stderr
        );
    }
    panic!("some ranks failed:\n{report}");
}

/// In a worker: prints the error as the `ERROR` line tests parse.
pub fn report_error(e: &ringleader::Error, start: Instant) {
    let line = ErrLine {
        kind: e.kind().as_str().to_string(),
        ranks: e.ranks(),
        seq: e.seq(),
        op: e.op().map(|o| o.name().to_string()),
        elapsed_ms: start.elapsed().as_millis() as u64,
        at_ms: now_ms(),
        message: match e.diagnosis() {
            Some(d) => ringleader::Diagnosis { summary: None, ..d.clone() }.to_string(),
            None => e.to_string(),
        },
        shown: e.to_string(),
    };
    println!("ERROR {}", serde_json::to_string(&line).unwrap());
}

/// Whether this process is a worker, and for which scenario.
pub fn scenario() -> Option<String> {
    std::env::var(SCENARIO).ok()
}
