//! Store load simulator: N simulated ranks against the real store server,
//! over real sockets, doing what ringleader's ranks do to the store.
//!
//! ```text
//! cargo run --release -p ringleader-store --example store_load -- --ranks 4096 [--liveness poll|changes]
//!     [--verdict each|once] [--rendezvous main|poll|counter] [--poll-ms 100] [--steady 10]
//!     [--snapshot-bytes 4096] [--frozen 1]
//! ```
//!
//! The store runs in a child process (this program with `serve`), so its
//! CPU time is its own (`/proc/<pid>/stat`) and the descriptors of both
//! ends do not share one process's limit. The simulated ranks run in
//! worker processes (this program with `ranks`) of at most
//! [`RANKS_PER_WORKER`] ranks each, one thread and one member connection
//! per rank, at most [`CONNECTING`] of a worker's ranks in their
//! handshake at once (as a launcher that staggers its starts); workers
//! report each rank's milestones to the driver on
//! their stdout and take its orders (freeze, kill, stop) on their stdin.
//!
//! 1. **Rendezvous** as `src/rendezvous.rs` does it (`main`): register,
//!    claim the world size, count in, wait for the last one's go (looking
//!    for a conflict note between slices), then read every registration in
//!    chunks (the data plane's full mesh needs every address); or as it did
//!    before 2026-12-02 (`poll`): wait for every registration, re-reading
//!    them all while waiting; or (`counter`) the count and the go alone,
//!    which lets the later phases be measured at sizes where reading every
//!    registration on every rank (O(N²) bytes) takes too long.
//! 2. **Steady state**: the monitor's traffic (a heartbeat and a look at
//!    the dump-request key twice a second; status long-polls of `--poll-ms`
//!    in `poll` mode, as main's monitor does, or change long-polls
//!    (`StoreClient::changes`) of `--poll-ms` in `changes` mode). `--frozen` ranks stop sending anything (a stopped
//!    process) while their sockets stay open.
//! 3. **Death**: one rank's connection is closed without a goodbye (its
//!    thread's wait is aborted and its client dropped). Every other rank
//!    acts on the news as a rank in a collective with it does: `each`
//!    mode runs main's agreement (abort the job, publish a snapshot, re-read
//!    every snapshot until all live ranks published, offer a verdict);
//!    `once` mode publishes a snapshot and waits for the one verdict the
//!    lowest live rank offers once it read the snapshots in chunks.
//!
//! It prints the rendezvous time, the store's CPU (cores) and bytes per
//! second in the steady state, the time from the death until every rank
//! knew, and the time from the death to the published verdict (and until
//! every rank read it).

use ringleader_core::{AbortSignal, Error};
use ringleader_store::{keys, ClientOptions, Presence, ServerOptions, StoreClient, StoreServer};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const RUN: &str = "sim";
/// Rank threads per worker process: a thread takes four memory mappings
/// (stack, guard, signal stack, guard), and a process may have 65,530.
const RANKS_PER_WORKER: usize = 4096;
/// What main's monitor waits per status poll, and how often it beats.
const TICK: Duration = Duration::from_millis(100);
const BEAT: Duration = Duration::from_millis(500);
/// How long the agreement waits for snapshots (src/failure.rs's GATHER).
const GATHER: Duration = Duration::from_secs(2);
/// A heartbeat older than this: the rank stopped answering.
const STALE: Duration = Duration::from_secs(3);
/// Beside a heartbeat payload of the size of a running operation's beat.
const BEAT_BYTES: usize = 120;
/// A registration (src/rendezvous.rs's PeerInfo as JSON) is about this long.
const REGISTRATION_BYTES: usize = 400;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LivenessMode {
    /// Main's monitor: the whole status every 100 ms.
    Poll,
    /// The store pushes the changes (`StoreClient::changes`).
    Changes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum VerdictMode {
    /// Main's agreement: every rank reads every snapshot and offers a verdict.
    Each,
    /// One rank reads the snapshots in chunks and publishes the verdict once.
    Once,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RendezvousMode {
    /// What src/rendezvous.rs does: count in, wait for the go, read every
    /// registration once.
    Main,
    /// What src/rendezvous.rs did before: every rank re-reads every
    /// registration while it waits.
    Poll,
    /// A counter and a go key.
    Counter,
}

#[derive(Debug, Clone)]
struct Opts {
    ranks: usize,
    rendezvous: RendezvousMode,
    poll: Duration,
    liveness: LivenessMode,
    verdict: VerdictMode,
    steady: Duration,
    snapshot_bytes: usize,
    frozen: usize,
}

fn parse() -> Opts {
    parse_from(std::env::args().skip(1).collect())
}

fn parse_from(args: Vec<String>) -> Opts {
    let mut o = Opts {
        ranks: 1024,
        rendezvous: RendezvousMode::Main,
        poll: TICK,
        liveness: LivenessMode::Poll,
        verdict: VerdictMode::Each,
        steady: Duration::from_secs(10),
        snapshot_bytes: 4096,
        frozen: 1,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().map(String::as_str).unwrap_or_else(|| panic!("{a} needs a value"));
        let num = || v.parse::<usize>().unwrap_or_else(|_| panic!("{a}: {v:?} is not a number"));
        match a.as_str() {
            "--ranks" => o.ranks = num(),
            "--steady" => o.steady = Duration::from_secs(num() as u64),
            "--snapshot-bytes" => o.snapshot_bytes = num(),
            "--frozen" => o.frozen = num(),
            "--poll-ms" => o.poll = Duration::from_millis(num() as u64),
            "--rendezvous" => {
                o.rendezvous = match v {
                    "main" => RendezvousMode::Main,
                    "poll" => RendezvousMode::Poll,
                    "counter" => RendezvousMode::Counter,
                    _ => panic!("--rendezvous main|poll|counter"),
                }
            }
            "--liveness" => {
                o.liveness = match v {
                    "poll" => LivenessMode::Poll,
                    "changes" => LivenessMode::Changes,
                    _ => panic!("--liveness poll|changes"),
                }
            }
            "--verdict" => {
                o.verdict = match v {
                    "each" => VerdictMode::Each,
                    "once" => VerdictMode::Once,
                    _ => panic!("--verdict each|once"),
                }
            }
            _ => panic!("unknown argument {a}"),
        }
    }
    assert!(o.ranks >= o.frozen + 3, "--ranks must leave a victim and survivors beside the frozen ranks");
    o
}

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("serve") => serve(),
        Some("ranks") => worker(),
        _ => drive(&parse()),
    }
}

/// Microseconds since the Unix epoch: the time base driver and workers share.
fn unix_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// A worker: `ranks FROM TO BASE_US ADDR VICTIM FROZEN,... -- OPTIONS`; runs
/// ranks FROM..TO, prints `J|K|V rank us` when a rank joined, knew of the
/// death, read the verdict; `A` (decided alone), `R` (connect retried),
/// `E text` (an error); obeys `freeze`, `kill`, `stop` on stdin.
fn worker() {
    let args: Vec<String> = std::env::args().collect();
    let num = |i: usize| args[i].parse::<usize>().expect("worker argument");
    let (from, to, base) = (num(2), num(3), num(4) as u64);
    let addr = args[5].clone();
    let victim = num(6);
    let frozen: Vec<usize> = args[7].split(',').filter(|s| !s.is_empty()).map(|s| s.parse().expect("rank")).collect();
    let opts = parse_from(args[9..].to_vec());
    let n = opts.ranks;
    let signals =
        (0..n).map(|r| (r == victim || frozen.contains(&r)).then(|| AbortSignal::new().expect("eventfd"))).collect();
    let shared = Arc::new(Shared::new(opts, addr, base, signals, true));
    let threads: Vec<_> = (from..to)
        .map(|r| {
            let sh = shared.clone();
            std::thread::Builder::new()
                .name(format!("rank-{r}"))
                .stack_size(256 << 10)
                .spawn(move || rank(&sh, r))
                .expect("spawning a rank thread")
        })
        .collect();
    let mut line = String::new();
    let stdin = std::io::stdin();
    while stdin.lock().read_line(&mut line).is_ok_and(|n| n > 0) {
        match line.trim() {
            "freeze" => {
                for &f in frozen.iter().filter(|f| (from..to).contains(*f)) {
                    shared.frozen[f].store(true, Ordering::Release);
                    if let Some(s) = &shared.signals[f] {
                        s.abort(Error::aborted("frozen"));
                    }
                }
            }
            "kill" => {
                shared.victim.store(victim, Ordering::Release);
                if let (true, Some(s)) = ((from..to).contains(&victim), &shared.signals[victim]) {
                    s.abort(Error::aborted("killed"));
                }
            }
            _ => break,
        }
        line.clear();
    }
    shared.stop.store(true, Ordering::Release);
    for s in shared.signals.iter().flatten() {
        s.abort(Error::aborted("the end"));
    }
    for t in threads {
        let _ = t.join();
    }
    std::process::exit(0);
}

/// The child: a store, and its traffic counters on request (one line on
/// stdin, one line back); ends when stdin closes.
fn serve() {
    let server = StoreServer::bind("127.0.0.1:0", ServerOptions::new(RUN)).expect("binding the store");
    println!("port {}", server.local_addr().port());
    let mut line = String::new();
    let stdin = std::io::stdin();
    while stdin.lock().read_line(&mut line).is_ok_and(|n| n > 0) {
        let t = server.traffic();
        println!("traffic {} {} {} {}", t.bytes_in, t.bytes_out, t.requests, t.writes);
        line.clear();
    }
    // The driver is gone: no need to close thousands of connections politely.
    std::process::exit(0);
}

/// The store child and how to read its costs.
struct Store {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    addr: String,
    ticks: f64,
}

/// CPU seconds and traffic bytes at one instant.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    cpu: f64,
    bytes_in: u64,
    bytes_out: u64,
    requests: u64,
}

impl Store {
    fn start() -> Store {
        let exe = std::env::current_exe().expect("own path");
        let mut child =
            Command::new(exe).arg("serve").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("store child");
        let stdin = child.stdin.take().expect("piped");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("the store's port");
        let port = line.trim().strip_prefix("port ").expect("port line").to_string();
        let ticks = Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0);
        Store { child, stdin, stdout, addr: format!("127.0.0.1:{port}"), ticks }
    }

    fn sample(&mut self) -> Sample {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the command name (which may hold spaces): utime is the 14th field.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<f64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0.0)).collect();
        let cpu = (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / self.ticks;
        writeln!(self.stdin).expect("asking the store");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("the store's traffic");
        let n: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap_or(0)).collect();
        Sample { at: Instant::now(), cpu, bytes_in: n[0], bytes_out: n[1], requests: n[2] }
    }
}

/// What the rank threads and the driver share.
struct Shared {
    opts: Opts,
    addr: String,
    /// The run's start, in [`unix_us`].
    base: u64,
    /// A worker: report milestones on stdout.
    reports: bool,
    stop: AtomicBool,
    /// Set once the victim died: ranks look for it in the news.
    victim: AtomicUsize,
    /// Microseconds since `start`, 0 = not yet.
    joined: Vec<AtomicU64>,
    knows: Vec<AtomicU64>,
    verdict: Vec<AtomicU64>,
    /// Ranks that could not agree through the store (main's "deciding alone").
    alone: AtomicUsize,
    /// Connections the store did not greet in time (a real rank's init fails there).
    reconnects: AtomicUsize,
    errors: AtomicUsize,
    first_error: Mutex<Option<String>>,
    /// Abort signals of the victim and the frozen ranks.
    signals: Vec<Option<AbortSignal>>,
    frozen: Vec<AtomicBool>,
    /// Connections of this process in their handshake now.
    connecting: Mutex<usize>,
    turn: std::sync::Condvar,
}

/// Handshakes one worker process runs at once.
const CONNECTING: usize = 16;

/// A rank's turn to connect; the next one's when dropped.
struct Turn<'a>(&'a Shared);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        *self.0.connecting.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        self.0.turn.notify_one();
    }
}

const NOBODY: usize = usize::MAX;

impl Shared {
    fn new(opts: Opts, addr: String, base: u64, signals: Vec<Option<AbortSignal>>, reports: bool) -> Shared {
        let n = opts.ranks;
        Shared {
            opts,
            addr,
            base,
            reports,
            stop: AtomicBool::new(false),
            victim: AtomicUsize::new(NOBODY),
            joined: (0..n).map(|_| AtomicU64::new(0)).collect(),
            knows: (0..n).map(|_| AtomicU64::new(0)).collect(),
            verdict: (0..n).map(|_| AtomicU64::new(0)).collect(),
            alone: AtomicUsize::new(0),
            reconnects: AtomicUsize::new(0),
            errors: AtomicUsize::new(0),
            first_error: Mutex::new(None),
            signals,
            frozen: (0..n).map(|_| AtomicBool::new(false)).collect(),
            connecting: Mutex::new(0),
            turn: std::sync::Condvar::new(),
        }
    }

    fn connect_turn(&self) -> Turn<'_> {
        let mut n = self.connecting.lock().unwrap_or_else(|p| p.into_inner());
        while *n >= CONNECTING {
            n = self.turn.wait(n).unwrap_or_else(|p| p.into_inner());
        }
        *n += 1;
        Turn(self)
    }

    fn now_us(&self) -> u64 {
        unix_us().saturating_sub(self.base).max(1)
    }

    /// Records milestone `what` (`J`, `K`, `V`) of rank `r` now.
    fn stamp(&self, what: char, r: usize) {
        let at = self.now_us();
        let slot = match what {
            'J' => &self.joined[r],
            'K' => &self.knows[r],
            _ => &self.verdict[r],
        };
        if slot.swap(at, Ordering::AcqRel) == 0 && self.reports {
            println!("{what} {r} {at}");
        }
    }

    /// Reads one line of a worker's report into these books.
    fn report(&self, line: &str) {
        let mut f = line.splitn(3, ' ');
        match (f.next(), f.next(), f.next()) {
            (Some(k @ ("J" | "K" | "V")), Some(r), Some(at)) => {
                let (Ok(r), Ok(at)) = (r.parse::<usize>(), at.parse::<u64>()) else { return };
                let slot = match k {
                    "J" => &self.joined,
                    "K" => &self.knows,
                    _ => &self.verdict,
                };
                if let Some(s) = slot.get(r) {
                    s.store(at, Ordering::Release);
                }
            }
            (Some("A"), _, _) => {
                self.alone.fetch_add(1, Ordering::Relaxed);
            }
            (Some("R"), _, _) => {
                self.reconnects.fetch_add(1, Ordering::Relaxed);
            }
            (Some("E"), _, _) => self.note_error(line[2..].to_string()),
            _ => {}
        }
    }

    fn decided_alone(&self) {
        self.alone.fetch_add(1, Ordering::Relaxed);
        if self.reports {
            println!("A");
        }
    }

    fn reconnected(&self) {
        self.reconnects.fetch_add(1, Ordering::Relaxed);
        if self.reports {
            println!("R");
        }
    }

    fn error(&self, rank: usize, what: &str, e: &Error) {
        let text = format!("rank {rank} {what}: {e}").replace('\n', " ");
        if self.reports {
            let first = self.first_error.lock().unwrap_or_else(|p| p.into_inner()).is_none();
            // Every error counts; the driver keeps the first text.
            println!("E {}", if first { &text[..] } else { "-" });
        }
        self.note_error(text);
    }

    fn note_error(&self, text: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() && text != "-" {
            let mut text = text;
            if let Some((cut, _)) = text.char_indices().nth(300) {
                text.truncate(cut);
                text.push_str("...");
            }
            *first = Some(text);
        }
    }
}

fn drive(opts: &Opts) {
    let n = opts.ranks;
    let mut store = Store::start();
    let victim = n / 2 + 1;
    let frozen: Vec<usize> = (0..opts.frozen).map(|i| n / 3 + i).collect();
    let base = unix_us();
    let shared = Arc::new(Shared::new(opts.clone(), store.addr.clone(), base, (0..n).map(|_| None).collect(), false));
    println!(
        "store_load: {n} ranks, rendezvous {:?}, liveness {:?} every {} ms, verdict {:?}, snapshots of {} bytes, {} \
         frozen, victim rank {victim}",
        opts.rendezvous,
        opts.liveness,
        opts.poll.as_millis(),
        opts.verdict,
        opts.snapshot_bytes,
        opts.frozen
    );
    let exe = std::env::current_exe().expect("own path");
    let frozen_list = frozen.iter().map(|f| f.to_string()).collect::<Vec<_>>().join(",");
    let own_args: Vec<String> = std::env::args().skip(1).collect();
    let mut workers = Vec::new();
    let mut readers = Vec::new();
    for from in (0..n).step_by(RANKS_PER_WORKER) {
        let to = (from + RANKS_PER_WORKER).min(n);
        let mut child = Command::new(&exe)
            .args(["ranks", &from.to_string(), &to.to_string(), &base.to_string(), &store.addr])
            .args([victim.to_string(), frozen_list.clone(), "--".into()])
            .args(&own_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("a worker");
        let out = BufReader::new(child.stdout.take().expect("piped"));
        let sh = shared.clone();
        readers.push(std::thread::spawn(move || {
            for line in out.lines() {
                let Ok(line) = line else { break };
                sh.report(&line);
            }
        }));
        workers.push(child);
    }
    let order = |workers: &mut Vec<Child>, what: &str| {
        for w in workers.iter_mut() {
            if let Some(i) = w.stdin.as_mut() {
                let _ = writeln!(i, "{what}");
            }
        }
    };

    // 1. Rendezvous.
    let joined_by = wait_all(&shared, Duration::from_secs(300), |r| shared.joined[r].load(Ordering::Relaxed) != 0, &[]);
    let joined = max_us(&shared.joined, &[]);
    println!(
        "rendezvous: {} of {n} ranks joined in {:.2} s ({} failed connects retried){}",
        count(&shared.joined),
        secs(joined),
        shared.reconnects.load(Ordering::Relaxed),
        if joined_by { "" } else { " (gave up waiting)" }
    );

    // 2. Steady state, with the frozen ranks stopped from its start.
    order(&mut workers, "freeze");
    std::thread::sleep(Duration::from_secs(2));
    let a = store.sample();
    std::thread::sleep(opts.steady);
    let b = store.sample();
    let dt = (b.at - a.at).as_secs_f64();
    println!(
        "steady: store CPU {:.3} cores, {:.1} MB/s out, {:.2} MB/s in, {:.0} requests/s (over {dt:.1} s)",
        (b.cpu - a.cpu) / dt,
        (b.bytes_out - a.bytes_out) as f64 / dt / 1e6,
        (b.bytes_in - a.bytes_in) as f64 / dt / 1e6,
        (b.requests - a.requests) as f64 / dt
    );

    // 3. A death.
    let mut watcher = StoreClient::connect(&shared.addr, ClientOptions::new(RUN)).expect("watcher");
    let killed_at = shared.now_us();
    order(&mut workers, "kill");
    let published = watcher.get(keys::VERDICT, Duration::from_secs(60)).ok().map(|_| shared.now_us());
    let mut skip = frozen.clone();
    skip.push(victim);
    let all_knew = wait_all(&shared, Duration::from_secs(60), |r| shared.knows[r].load(Ordering::Relaxed) != 0, &skip);
    let all_read =
        wait_all(&shared, Duration::from_secs(60), |r| shared.verdict[r].load(Ordering::Relaxed) != 0, &skip);
    let after = store.sample();
    let survivors = n - skip.len();
    let (p50, max) = spread(&shared.knows, &skip, killed_at);
    println!(
        "death: {} of {survivors} survivors knew (median {:.3} s, last {:.3} s after the death){}",
        count_except(&shared.knows, &skip),
        p50,
        max,
        if all_knew { "" } else { " (gave up waiting)" }
    );
    let (v50, vmax) = spread(&shared.verdict, &skip, killed_at);
    println!(
        "verdict: published {} after the death; {} of {survivors} ranks read it (median {:.3} s, last {:.3} s); \
         {} decided alone{}",
        published.map_or("never".to_string(), |t| format!("{:.3} s", secs(t - killed_at))),
        count_except(&shared.verdict, &skip),
        v50,
        vmax,
        shared.alone.load(Ordering::Relaxed),
        if all_read { "" } else { " (gave up waiting)" }
    );
    println!(
        "failure phase: store CPU {:.2} s, {:.1} MB out in {:.1} s",
        after.cpu - b.cpu,
        (after.bytes_out - b.bytes_out) as f64 / 1e6,
        (after.at - b.at).as_secs_f64()
    );
    let errors = shared.errors.load(Ordering::Relaxed);
    if errors > 0 {
        println!(
            "errors: {errors}, the first: {}",
            shared.first_error.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_default()
        );
    }
    order(&mut workers, "stop");
    for mut w in workers {
        drop(w.stdin.take());
        let _ = w.wait();
    }
    for r in readers {
        let _ = r.join();
    }
    drop(store.stdin);
    let _ = store.child.wait();
}

/// Waits until `done(r)` for every rank not in `skip`, up to `limit`.
fn wait_all(sh: &Shared, limit: Duration, done: impl Fn(usize) -> bool, skip: &[usize]) -> bool {
    let until = Instant::now() + limit;
    let mut note = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if (0..sh.opts.ranks).filter(|r| !skip.contains(r)).all(&done) {
            return true;
        }
        if Instant::now() >= note {
            note += Duration::from_secs(10);
            let done = (0..sh.opts.ranks).filter(|r| !skip.contains(r) && done(*r)).count();
            let first = sh.first_error.lock().unwrap_or_else(|p| p.into_inner()).clone();
            eprintln!(
                "  ... {done} of {} ranks there after {:.0} s; {} errors (first: {})",
                sh.opts.ranks - skip.len(),
                secs(sh.now_us()),
                sh.errors.load(Ordering::Relaxed),
                first.unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

fn count(v: &[AtomicU64]) -> usize {
    count_except(v, &[])
}

fn count_except(v: &[AtomicU64], skip: &[usize]) -> usize {
    v.iter().enumerate().filter(|(r, t)| !skip.contains(r) && t.load(Ordering::Relaxed) != 0).count()
}

fn max_us(v: &[AtomicU64], skip: &[usize]) -> u64 {
    v.iter().enumerate().filter(|(r, _)| !skip.contains(r)).map(|(_, t)| t.load(Ordering::Relaxed)).max().unwrap_or(0)
}

/// Median and largest time after `from` (seconds) over the ranks that got there.
fn spread(v: &[AtomicU64], skip: &[usize], from: u64) -> (f64, f64) {
    let mut t: Vec<u64> = v
        .iter()
        .enumerate()
        .filter(|(r, _)| !skip.contains(r))
        .map(|(_, t)| t.load(Ordering::Relaxed))
        .filter(|&t| t != 0)
        .map(|t| t.saturating_sub(from))
        .collect();
    if t.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    t.sort_unstable();
    (secs(t[t.len() / 2]), secs(t[t.len() - 1]))
}

fn secs(us: u64) -> f64 {
    us as f64 / 1e6
}

/// One simulated rank.
fn rank(sh: &Shared, r: usize) {
    let n = sh.opts.ranks;
    let mut opts = ClientOptions::new(RUN).member(r, n);
    opts.host = format!("node-{:03}", r / 8);
    opts.pid = 100_000 + r as u32;
    opts.connect_timeout = Duration::from_secs(120);
    opts.abort = sh.signals[r].clone();
    // A real rank fails its init when the store does not greet it in
    // time; the simulated one counts that and tries again, so that the
    // later phases still see the whole world.
    let mut store = loop {
        let connected = {
            // At most a few connections of a worker at once in their
            // handshake: 16,384 at once exceed the store's pending-hello
            // cap many times over, and it closes the oldest.
            let _turn = sh.connect_turn();
            StoreClient::connect(&sh.addr, opts.clone())
        };
        match connected {
            Ok(s) => break s,
            Err(e) if !sh.stop.load(Ordering::Acquire) => {
                sh.error(r, "connect", &e);
                sh.reconnected();
            }
            Err(e) => return sh.error(r, "connect", &e),
        }
    };
    let joined = match sh.opts.rendezvous {
        RendezvousMode::Main => rendezvous_main(&mut store, r, n),
        RendezvousMode::Poll => rendezvous_poll(&mut store, r, n),
        RendezvousMode::Counter => rendezvous_counter(&mut store, r, n),
    };
    if let Err(e) = joined {
        return sh.error(r, "rendezvous", &e);
    }
    let _ = store.heartbeat(&beat(0));
    sh.stamp('J', r);
    let mut monitor = Monitor { generation: None, view: None, last_beat: Instant::now(), seq: 1, failed: false };
    loop {
        if sh.stop.load(Ordering::Acquire) {
            let _ = store.leave();
            return;
        }
        if sh.frozen[r].load(Ordering::Acquire) {
            // A stopped process: its socket stays open, nothing is sent.
            while !sh.stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(50));
            }
            return;
        }
        match monitor.tick(sh, r, &mut store) {
            Ok(()) => {}
            Err(Error::Aborted { .. }) if sh.victim.load(Ordering::Acquire) == r => {
                // Killed: the socket closes without a goodbye.
                drop(store);
                return;
            }
            Err(Error::Aborted { .. }) if sh.frozen[r].load(Ordering::Acquire) => {}
            Err(e) => {
                sh.error(r, "monitor", &e);
                if store.leave().is_err() {
                    return;
                }
                std::thread::sleep(TICK);
            }
        }
    }
}

/// What `src/rendezvous.rs` does with the store: register, claim the world
/// size, count in, wait for the go in slices (looking for the conflict
/// notes between them), read every registration in chunks of 256.
fn rendezvous_main(store: &mut StoreClient, r: usize, n: usize) -> Result<(), Error> {
    store.set(&keys::rank(r), &vec![b'r'; REGISTRATION_BYTES])?;
    store.compare_set(keys::WORLD_SIZE, None, n.to_string().as_bytes())?;
    if store.add(keys::REGISTERED, 1)? >= n as i64 {
        store.set(keys::ALL_REGISTERED, b"1")?;
    }
    loop {
        match store.wait(&[keys::ALL_REGISTERED], Duration::from_secs(1)) {
            Ok(()) => break,
            Err(Error::StoreTimeout { .. }) => {}
            Err(e) => return Err(e),
        }
        store.check(&[keys::WORLD_CONFLICT])?;
        store.keys_with_prefix(keys::CONFLICT_PREFIX)?;
    }
    let names: Vec<String> = (0..n).map(keys::rank).collect();
    for chunk in names.chunks(256) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        store.multi_get(&refs, Duration::from_secs(600))?;
    }
    Ok(())
}

/// What `src/rendezvous.rs` did before: register, wait for every
/// registration (reading them all between slices of the wait), read them all.
fn rendezvous_poll(store: &mut StoreClient, r: usize, n: usize) -> Result<(), Error> {
    let mine = vec![b'r'; REGISTRATION_BYTES];
    store.set(&keys::rank(r), &mine)?;
    let names: Vec<String> = (0..n).map(keys::rank).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    loop {
        match store.wait(&refs, Duration::from_secs(1)) {
            Ok(()) => break,
            Err(Error::StoreTimeout { .. }) => {}
            Err(e) => return Err(e),
        }
        let present = store.keys_with_prefix(keys::RANK_PREFIX)?;
        let present: Vec<&str> = present.iter().map(String::as_str).collect();
        store.multi_get(&present, Duration::from_secs(5))?;
        store.keys_with_prefix("rl/conflict/")?;
    }
    store.multi_get(&refs, Duration::from_secs(5))?;
    let present = store.keys_with_prefix(keys::RANK_PREFIX)?;
    let present: Vec<&str> = present.iter().map(String::as_str).collect();
    store.multi_get(&present, Duration::from_secs(5))?;
    Ok(())
}

/// Register, count in, wait for the last one's go: O(N) for the store.
fn rendezvous_counter(store: &mut StoreClient, r: usize, n: usize) -> Result<(), Error> {
    store.set(&keys::rank(r), &vec![b'r'; REGISTRATION_BYTES])?;
    if store.add("sim/joined", 1)? == n as i64 {
        store.set("sim/go", b"1")?;
    }
    store.get("sim/go", Duration::from_secs(600))?;
    Ok(())
}

fn beat(seq: u64) -> Vec<u8> {
    let mut b = format!("{{\"last_started\":{seq},\"last_completed\":{},\"running\":null}}", seq.saturating_sub(1))
        .into_bytes();
    b.resize(BEAT_BYTES, b' ');
    b
}

/// A rank's monitor, as far as the store sees it.
struct Monitor {
    generation: Option<u64>,
    /// The job as the changes built it (`changes` mode).
    view: Option<ringleader_store::JobStatus>,
    last_beat: Instant,
    seq: u64,
    failed: bool,
}

impl Monitor {
    fn tick(&mut self, sh: &Shared, r: usize, store: &mut StoreClient) -> Result<(), Error> {
        if self.last_beat.elapsed() >= BEAT {
            self.last_beat = Instant::now();
            self.seq += 1;
            store.heartbeat(&beat(self.seq))?;
            store.try_get(keys::DUMP_REQUEST)?;
        }
        let died = match sh.opts.liveness {
            LivenessMode::Poll => {
                let status = store.status(self.generation, sh.opts.poll)?;
                self.generation = Some(status.generation);
                // Read after the answer: the death may be what woke it.
                let victim = sh.victim.load(Ordering::Acquire);
                victim != NOBODY && status.ranks.iter().any(|x| x.rank == victim && x.liveness == Presence::Vanished)
            }
            LivenessMode::Changes => {
                let view = self.view.get_or_insert_with(ringleader_store::JobStatus::default);
                let mut wait = if view.generation == 0 { Duration::ZERO } else { sh.opts.poll };
                loop {
                    let changes = store.changes(view.generation, wait)?;
                    wait = Duration::ZERO;
                    let more = changes.more;
                    view.apply(changes);
                    if !more {
                        break;
                    }
                }
                let victim = sh.victim.load(Ordering::Acquire);
                victim != NOBODY && view.rank(victim).is_some_and(|x| x.liveness == Presence::Vanished)
            }
        };
        if died && sh.knows[r].load(Ordering::Relaxed) == 0 {
            sh.stamp('K', r);
        }
        if died && !self.failed {
            self.failed = true;
            match sh.opts.verdict {
                VerdictMode::Each => agree_each(sh, r, store)?,
                VerdictMode::Once => agree_once(sh, r, store)?,
            }
        }
        Ok(())
    }
}

/// Main's agreement (src/failure.rs `agree` and `gather`): abort the job,
/// publish the snapshot, re-read every snapshot until every live rank
/// published one, read them all again as evidence, offer a verdict.
fn agree_each(sh: &Shared, r: usize, store: &mut StoreClient) -> Result<(), Error> {
    let outcome = (|| -> Result<(), Error> {
        store.abort_job(format!("{{\"rank\":{r},\"observation\":\"peer-lost\"}}").as_bytes())?;
        store.set(&keys::snapshot(r), &vec![b's'; sh.opts.snapshot_bytes])?;
        if store.try_get(keys::VERDICT)?.is_none() {
            let deadline = Instant::now() + GATHER;
            loop {
                let status = store.status(None, Duration::ZERO)?;
                let snaps = fetch_prefix(store, keys::SNAPSHOT_PREFIX)?;
                let missing: Vec<String> = status
                    .ranks
                    .iter()
                    .filter(|x| x.rank != r && x.liveness == Presence::Connected)
                    .filter(|x| x.heartbeat_age.is_some_and(|a| a < STALE))
                    .map(|x| keys::snapshot(x.rank))
                    .filter(|k| !snaps.contains(k))
                    .collect();
                if missing.is_empty() || Instant::now() >= deadline || store.try_get(keys::VERDICT)?.is_some() {
                    break;
                }
                let refs: Vec<&str> = missing.iter().map(String::as_str).collect();
                match store.wait(&refs, Duration::from_millis(20)) {
                    Ok(()) | Err(Error::StoreTimeout { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            if store.try_get(keys::VERDICT)?.is_none() {
                fetch_prefix(store, keys::EXIT_PREFIX)?;
                fetch_prefix(store, keys::SNAPSHOT_PREFIX)?;
                store.compare_set(keys::VERDICT, None, &vec![b'v'; 1024])?;
            }
        }
        Ok(())
    })();
    match outcome {
        Ok(()) => sh.stamp('V', r),
        Err(e @ Error::Aborted { .. }) => return Err(e),
        Err(e) => {
            // The runtime decides alone when the store cannot agree.
            sh.error(r, "agreement", &e);
            sh.decided_alone();
            sh.stamp('V', r);
        }
    }
    Ok(())
}

/// One verdict, computed once (src/agreement.rs): every rank publishes a
/// compact snapshot and offers the abort record; the one whose offer set
/// it reads the live ranks' snapshots in chunks, waiting (bounded) for
/// those not there yet, and publishes the verdict; the others wait for it.
fn agree_once(sh: &Shared, r: usize, store: &mut StoreClient) -> Result<(), Error> {
    const CHUNK: usize = 512;
    let outcome = (|| -> Result<(), Error> {
        let decides = store.abort_job(format!("{{\"rank\":{r},\"observation\":\"peer-lost\"}}").as_bytes())?;
        store.set(&keys::snapshot(r), &vec![b's'; sh.opts.snapshot_bytes])?;
        if decides {
            // Fresh heartbeat ages, once: a stopped rank writes no snapshot.
            let status = store.status(None, Duration::ZERO)?;
            let live: Vec<String> = status
                .ranks
                .iter()
                .filter(|x| x.liveness == Presence::Connected && x.heartbeat_age.is_some_and(|a| a < STALE))
                .map(|x| keys::snapshot(x.rank))
                .collect();
            let deadline = Instant::now() + GATHER;
            for chunk in live.chunks(CHUNK) {
                let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
                let left = deadline.saturating_duration_since(Instant::now());
                let present: Vec<&str> = match store.wait(&refs, left) {
                    Ok(()) => refs,
                    Err(Error::StoreTimeout { keys, .. }) => {
                        refs.into_iter().filter(|k| !keys.iter().any(|m| m == k)).collect()
                    }
                    Err(e) => return Err(e),
                };
                if !present.is_empty() {
                    store.multi_get(&present, Duration::ZERO)?;
                }
            }
            store.compare_set(keys::VERDICT, None, &vec![b'v'; 1024])?;
        } else {
            store.get(keys::VERDICT, Duration::from_secs(30))?;
        }
        Ok(())
    })();
    match outcome {
        Ok(()) => sh.stamp('V', r),
        Err(e @ Error::Aborted { .. }) => return Err(e),
        Err(e) => {
            sh.error(r, "agreement", &e);
            sh.decided_alone();
            sh.stamp('V', r);
        }
    }
    Ok(())
}

/// The names of the keys under `prefix`, after reading them all (as
/// src/failure.rs's `fetch_prefix` does).
fn fetch_prefix(store: &mut StoreClient, prefix: &str) -> Result<Vec<String>, Error> {
    let names = store.keys_with_prefix(prefix)?;
    if !names.is_empty() {
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        store.multi_get(&refs, Duration::from_secs(2))?;
    }
    Ok(names)
}
