//! Configuration: who this process is in the job and how patient to be.
//!
//! Rank discovery follows docs/DESIGN.md §3, in order: explicit arguments, the
//! torchrun variables (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, ...), Slurm
//! (`SLURM_PROCID`, ...), Open MPI (`OMPI_COMM_WORLD_RANK`, ...). Reading is
//! done through a lookup function so tests need not touch the process
//! environment.

use crate::error::{Error, Result};
use crate::types::Rank;
use std::path::PathBuf;
use std::time::Duration;

/// The library version every rank advertises at rendezvous.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Which data-plane transport to use between two ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// Shared memory between ranks on one host, TCP otherwise (RDMA when built and present).
    Auto,
    /// TCP everywhere.
    Tcp,
    /// Shared memory only (every rank on one host).
    Shm,
    /// RDMA verbs.
    Rdma,
}

impl TransportKind {
    /// Parses `auto`, `tcp`, `shm`, `rdma`.
    pub fn parse(s: &str) -> Option<TransportKind> {
        Some(match s.to_ascii_lowercase().as_str() {
            "auto" | "" => TransportKind::Auto,
            "tcp" => TransportKind::Tcp,
            "shm" => TransportKind::Shm,
            "rdma" => TransportKind::Rdma,
            _ => return None,
        })
    }

    /// The setting as `RINGLEADER_TRANSPORT` spells it.
    ///
    /// ```
    /// use ringleader_core::config::TransportKind;
    /// assert_eq!(TransportKind::parse("TCP").map(TransportKind::name), Some("tcp"));
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Auto => "auto",
            TransportKind::Tcp => "tcp",
            TransportKind::Shm => "shm",
            TransportKind::Rdma => "rdma",
        }
    }
}

/// Explicitly given identity, which wins over anything in the environment.
///
/// ```
/// use ringleader_core::config::{Config, Explicit};
/// let ex = Explicit { rank: Some(0), world_size: Some(1), master_addr: Some("127.0.0.1".into()),
///                     master_port: Some(29500), ..Default::default() };
/// let cfg = Config::discover(&ex, |_| None).unwrap();
/// assert_eq!((cfg.rank, cfg.world_size, cfg.source), (0, 1, "explicit"));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Explicit {
    /// This process's rank.
    pub rank: Option<Rank>,
    /// Number of ranks.
    pub world_size: Option<usize>,
    /// Address of the store host (rank 0 or the launcher).
    pub master_addr: Option<String>,
    /// Port of the store.
    pub master_port: Option<u16>,
}

/// Everything a communicator needs to start. Fields are public: build one
/// with [`Config::new`] or [`Config::from_env`] and adjust what you need.
///
/// ```
/// use ringleader_core::Config;
/// use std::time::Duration;
/// let mut cfg = Config::new(0, 2, "127.0.0.1", 29500);
/// cfg.timeout = Duration::from_secs(30);
/// assert_eq!(cfg.fr_size, 2000);
/// ```
#[derive(Debug, Clone)]
pub struct Config {
    /// This process's rank.
    pub rank: Rank,
    /// Number of ranks.
    pub world_size: usize,
    /// Rank on this host, where known.
    pub local_rank: Option<usize>,
    /// Ranks on this host, where known.
    pub local_world_size: Option<usize>,
    /// Host of the store (rank 0 hosts it unless `store_addr` points elsewhere).
    pub master_addr: String,
    /// Port of the store.
    pub master_port: u16,
    /// A store that already runs (the launcher's), `host:port`
    /// (`RINGLEADER_STORE_ADDR`). When set, rank 0 does not host one.
    pub store_addr: Option<String>,
    /// Identifies the job, so processes of another job are refused (`RINGLEADER_RUN_ID`).
    pub run_id: String,
    /// Hard collective timeout (`RINGLEADER_TIMEOUT`, default 600 s).
    pub timeout: Duration,
    /// Stall warning delay (`RINGLEADER_STALL_WARN`, default 60 s).
    pub stall_warn: Duration,
    /// Rendezvous timeout (`RINGLEADER_INIT_TIMEOUT`, default 300 s).
    pub init_timeout: Duration,
    /// Flight recorder entries (`RINGLEADER_FR_SIZE`, default 2000; 0 turns
    /// it off; at most [`MAX_FR_SIZE`]).
    pub fr_size: usize,
    /// The folder under which dumps go (`RINGLEADER_DUMP_DIR`, default
    /// `$TMPDIR/ringleader-dumps-$UID`, see [`default_dump_dir`]); each run
    /// writes into a subfolder of its own ([`Config::run_dump_dir`]).
    pub dump_dir: PathBuf,
    /// Consistency checks (`RINGLEADER_CHECKS`, default on).
    pub checks: bool,
    /// Data-plane transport (`RINGLEADER_TRANSPORT`, default auto).
    pub transport: TransportKind,
    /// Interface name or prefix for data ports (`RINGLEADER_IFNAME`).
    pub ifname: Option<String>,
    /// Inclusive range of data ports to listen on (`RINGLEADER_PORT_RANGE`, e.g. `40000-40100`).
    pub port_range: Option<(u16, u16)>,
    /// Shared secret (`RINGLEADER_TOKEN`).
    pub token: Option<String>,
    /// TCP streams per peer (`RINGLEADER_STREAMS`, default 1). Every rank of a job must use the
    /// same number: rendezvous checks.
    pub streams: usize,
    /// Algorithm override (`RINGLEADER_ALGO`: `ring`, `rd` (recursive doubling), or unset for
    /// automatic), parsed once, here. Every rank of a job must use the same one: rendezvous
    /// checks.
    pub algo: Option<AlgoChoice>,
    /// Shared-memory frames from this many bytes on are copied once, straight
    /// from the sender's memory, where the kernel allows it
    /// (`RINGLEADER_SHM_SINGLE_COPY`: a size such as `256K`, or `off`).
    pub shm_single_copy: Option<usize>,
    /// TCP frames from this many bytes on are sent from the sender's pages
    /// (`vmsplice`), not copied into the socket, where the buffer is safe
    /// to lend (`RINGLEADER_TCP_SPLICE`: a size such as `256K`, or `off`).
    pub tcp_splice: Option<usize>,
    /// The version this process advertises. Only tests change it
    /// (`RINGLEADER_TEST_ADVERTISE_VERSION`), to provoke a version mismatch.
    pub advertised_version: String,
    /// Where the identity came from: `explicit`, `torchrun`, `slurm` or `openmpi`.
    pub source: &'static str,
    /// Abort the running operation on SIGINT (after the process's own
    /// handler ran), so Ctrl-C interrupts a blocked collective. Language
    /// bindings whose runtime handles SIGINT itself (Python) turn this on.
    pub interrupt_on_sigint: bool,
    /// The sub-group this communicator spans, when it is not the whole job
    /// numbered as the job numbers it: every rank a user reads is then named
    /// by its global rank, and messages name the group. Set by bindings that
    /// know it (the PyTorch backend for `new_group`); `None` for the world.
    pub group: Option<crate::Group>,
}

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
const DEFAULT_STALL_WARN: Duration = Duration::from_secs(60);
const DEFAULT_INIT_TIMEOUT: Duration = Duration::from_secs(300);

/// The most flight-recorder entries `RINGLEADER_FR_SIZE` may ask for: the
/// ring (64 bytes an entry, rounded up to a power of two) is allocated when
/// the communicator starts, so a typo must not ask for gigabytes.
pub const MAX_FR_SIZE: usize = 1 << 20;
/// Measured on a 2-core VM: below it (in cache) the ring's two copies,
/// overlapped by two processes, beat one copy plus an acknowledgement.
pub const DEFAULT_SHM_SINGLE_COPY: usize = 1 << 20;
/// Below it, waiting for the receiver's acknowledgement costs more than
/// the copy into the socket that splicing saves.
pub const DEFAULT_TCP_SPLICE: usize = 256 << 10;

/// Longest run id, in bytes (`RINGLEADER_RUN_ID`): the store and the
/// data-plane handshake carry it, and both refuse longer ones.
pub const MAX_RUN_ID: usize = 256;

/// Refuses a run id that ranks could not agree on: empty, longer than
/// [`MAX_RUN_ID`] bytes, or `*` (which names "any run" to the store's
/// tools). `var` names where it came from, for the message.
///
/// ```
/// use ringleader_core::config::check_run_id;
/// assert!(check_run_id("RINGLEADER_RUN_ID", "job-42").is_ok());
/// let e = check_run_id("RINGLEADER_RUN_ID", &"x".repeat(300)).unwrap_err();
/// assert!(e.to_string().contains("RINGLEADER_RUN_ID") && e.to_string().contains("256"));
/// ```
pub fn check_run_id(var: &str, id: &str) -> Result<()> {
    if id.is_empty() {
        return Err(Error::invalid(var, "the run id is empty"));
    }
    if id.len() > MAX_RUN_ID {
        return Err(Error::invalid(
            var,
            format!("the run id is {} bytes long, over the limit of {MAX_RUN_ID} bytes", id.len()),
        ));
    }
    if id == "*" {
        return Err(Error::invalid(var, "`*` is not a run id (it means \"any run\" to the store's tools)"));
    }
    Ok(())
}

impl Config {
    /// This rank's number in the job: `rank`, or its global rank when the
    /// communicator spans a sub-group ([`Config::group`]).
    pub fn global_rank(&self) -> Rank {
        crate::group::global(self.group.as_ref(), self.rank)
    }

    /// The global rank of rank `r` of this communicator.
    pub fn global(&self, r: Rank) -> Rank {
        crate::group::global(self.group.as_ref(), r)
    }

    /// Where this run's dumps go: a subfolder of [`Config::dump_dir`] named
    /// after the run id (characters other than letters, digits, `-`, `_`
    /// and `.` become `_`). A run id that many jobs share (`default`, and
    /// torchrun's `none` without `--rdzv-id`) gets the store's port
    /// appended, so two such jobs on one host keep their own dumps.
    ///
    /// ```
    /// let mut c = ringleader_core::Config::new(0, 2, "127.0.0.1", 29500);
    /// c.dump_dir = "/tmp/d".into();
    /// assert_eq!(c.run_dump_dir(), std::path::Path::new("/tmp/d/default-29500"));
    /// c.run_id = "job/7".into();
    /// assert_eq!(c.run_dump_dir(), std::path::Path::new("/tmp/d/job_7"));
    /// ```
    pub fn run_dump_dir(&self) -> PathBuf {
        let mut name: String = self
            .run_id
            .chars()
            .take(128)
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
            .collect();
        if name.is_empty() || name.chars().all(|c| c == '.') {
            name = format!("run{name}").replace('.', "_");
        }
        if matches!(self.run_id.as_str(), "default" | "none" | "") {
            let port = self
                .store_addr
                .as_deref()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse::<u16>().ok())
                .unwrap_or(self.master_port);
            name = format!("{name}-{port}");
        }
        self.dump_dir.join(name)
    }

    /// A configuration with every optional setting at its default.
    pub fn new(rank: Rank, world_size: usize, master_addr: &str, master_port: u16) -> Config {
        Config {
            rank,
            world_size,
            local_rank: None,
            local_world_size: None,
            master_addr: master_addr.to_string(),
            master_port,
            store_addr: None,
            run_id: "default".into(),
            timeout: DEFAULT_TIMEOUT,
            stall_warn: DEFAULT_STALL_WARN,
            init_timeout: DEFAULT_INIT_TIMEOUT,
            fr_size: 2000,
            dump_dir: default_dump_dir(),
            checks: true,
            transport: TransportKind::Auto,
            ifname: None,
            port_range: None,
            token: None,
            streams: 1,
            algo: None,
            shm_single_copy: Some(DEFAULT_SHM_SINGLE_COPY),
            tcp_splice: Some(DEFAULT_TCP_SPLICE),
            advertised_version: VERSION.to_string(),
            source: "explicit",
            interrupt_on_sigint: false,
            group: None,
        }
    }

    /// Reads the process environment (see the module docs for the order).
    pub fn from_env() -> Result<Config> {
        Config::discover(&Explicit::default(), |k| std::env::var(k).ok())
    }

    /// Discovers identity and settings: `explicit` first, then `lookup`
    /// (a view of the environment).
    pub fn discover(explicit: &Explicit, lookup: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let env = Env(&lookup);
        let id = Identity::discover(explicit, &env)?;
        if id.world_size == 0 {
            return Err(Error::invalid(id.world_var, "the world size must be at least 1"));
        }
        if id.rank >= id.world_size {
            return Err(Error::invalid(
                id.rank_var,
                format!("rank {} is not below the world size {}", id.rank, id.world_size),
            ));
        }
        let mut cfg = Config::new(id.rank, id.world_size, &id.master_addr, id.master_port);
        cfg.local_rank = id.local_rank;
        cfg.local_world_size = id.local_world_size;
        cfg.source = id.source;
        cfg.apply_settings(&env)?;
        Ok(cfg)
    }

    fn apply_settings(&mut self, env: &Env<'_>) -> Result<()> {
        if let Some(t) = env.secs("RINGLEADER_TIMEOUT")? {
            self.timeout = t;
        }
        if let Some(t) = env.secs("RINGLEADER_STALL_WARN")? {
            self.stall_warn = t;
        }
        if let Some(t) = env.secs("RINGLEADER_INIT_TIMEOUT")? {
            self.init_timeout = t;
        }
        if let Some(n) = env.parse::<usize>("RINGLEADER_FR_SIZE")? {
            if n > MAX_FR_SIZE {
                return Err(Error::invalid(
                    "RINGLEADER_FR_SIZE",
                    format!("{n} entries is more than the {MAX_FR_SIZE} the recorder keeps (64 bytes each, allocated at start)"),
                ));
            }
            self.fr_size = n;
        }
        if let Some(d) = env.get("RINGLEADER_DUMP_DIR").filter(|d| !d.is_empty()) {
            self.dump_dir = PathBuf::from(d);
        }
        if let Some(c) = env.get("RINGLEADER_CHECKS") {
            self.checks = parse_bool(&c).ok_or_else(|| {
                Error::invalid("RINGLEADER_CHECKS", format!("{c:?} is not one of 0, 1, on, off, true, false"))
            })?;
        }
        if let Some(t) = env.get("RINGLEADER_TRANSPORT") {
            self.transport = TransportKind::parse(&t).ok_or_else(|| {
                Error::invalid("RINGLEADER_TRANSPORT", format!("{t:?} is not one of auto, tcp, shm, rdma"))
            })?;
        }
        self.ifname = env.get("RINGLEADER_IFNAME").filter(|s| !s.is_empty());
        if let Some(r) = env.get("RINGLEADER_PORT_RANGE") {
            self.port_range = Some(parse_port_range(&r)?);
        }
        self.token = env.get("RINGLEADER_TOKEN").filter(|s| !s.is_empty());
        if let Some(s) = env.get("RINGLEADER_STREAMS") {
            self.streams = parse_streams(&s)?;
        }
        if let Some(a) = env.get("RINGLEADER_ALGO") {
            self.algo = parse_algo(&a)?;
        }
        for (name, slot) in
            [("RINGLEADER_SHM_SINGLE_COPY", &mut self.shm_single_copy), ("RINGLEADER_TCP_SPLICE", &mut self.tcp_splice)]
        {
            if let Some(v) = env.get(name) {
                *slot = parse_single_copy(&v).ok_or_else(|| {
                    Error::invalid(
                        name,
                        format!("{v:?} is neither off nor a size in bytes (such as 262144, 256K or 1M)"),
                    )
                })?;
            }
        }
        if let Some(a) = env.get("RINGLEADER_STORE_ADDR").filter(|s| !s.is_empty()) {
            self.store_addr = Some(a);
        }
        let run_id = ["RINGLEADER_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"]
            .into_iter()
            .find_map(|var| env.get(var).filter(|s| !s.is_empty()).map(|id| (var, id)));
        if let Some((var, id)) = run_id {
            check_run_id(var, &id)?;
            self.run_id = id;
        }
        if let Some(v) = env.get("RINGLEADER_TEST_ADVERTISE_VERSION") {
            self.advertised_version = v;
        }
        Ok(())
    }

    /// The store's `host:port`: `store_addr` when set, else `master_addr:master_port`.
    pub fn store_endpoint(&self) -> String {
        self.store_addr.clone().unwrap_or_else(|| join_host_port(&self.master_addr, self.master_port))
    }
}

/// The default dump folder: `ringleader-dumps-<uid>` in the temporary
/// directory (`$TMPDIR`, else `/tmp`), one per user, so users of a shared
/// host never write into each other's folder (ringleader creates it with
/// mode 0700 and refuses one it does not own, or a symbolic link).
pub fn default_dump_dir() -> PathBuf {
    std::env::temp_dir().join(format!("ringleader-dumps-{}", rustix::process::getuid().as_raw()))
}

/// A `RINGLEADER_STREAMS` value: TCP connections per pair of ranks, 1 to 16.
///
/// ```
/// use ringleader_core::config::parse_streams;
/// assert_eq!(parse_streams("4").unwrap(), 4);
/// assert!(parse_streams("0").is_err() && parse_streams("two").is_err());
/// ```
pub fn parse_streams(v: &str) -> Result<usize> {
    match v.trim().parse::<usize>() {
        Ok(s) if (1..=16).contains(&s) => Ok(s),
        Ok(s) => Err(Error::invalid("RINGLEADER_STREAMS", format!("{s} is not between 1 and 16"))),
        Err(_) => Err(Error::invalid("RINGLEADER_STREAMS", format!("{v:?} is not a valid number"))),
    }
}

/// An algorithm a job forces on its collectives instead of choosing one
/// per message size (`RINGLEADER_ALGO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlgoChoice {
    /// The ring (bandwidth-bound messages).
    Ring,
    /// Recursive doubling (latency-bound messages).
    RecursiveDoubling,
}

impl AlgoChoice {
    /// Its canonical name (`ring`, `rd`), as ranks compare it at rendezvous.
    pub fn name(self) -> &'static str {
        match self {
            AlgoChoice::Ring => "ring",
            AlgoChoice::RecursiveDoubling => "rd",
        }
    }
}

/// The algorithm a `RINGLEADER_ALGO` value forces: `None` for automatic
/// (`auto` or empty), [`AlgoChoice::Ring`] for `ring` / `chain` / `large`,
/// [`AlgoChoice::RecursiveDoubling`] for `rd` / `tree` / `small`. Anything
/// else is an error, so a typo fails instead of silently meaning automatic.
///
/// ```
/// use ringleader_core::config::{parse_algo, AlgoChoice};
/// assert_eq!(parse_algo("chain").unwrap(), Some(AlgoChoice::Ring));
/// assert_eq!(parse_algo("auto").unwrap(), None);
/// assert!(parse_algo("rign").is_err());
/// ```
pub fn parse_algo(v: &str) -> Result<Option<AlgoChoice>> {
    match v.trim() {
        "" | "auto" => Ok(None),
        "ring" | "chain" | "large" => Ok(Some(AlgoChoice::Ring)),
        "rd" | "tree" | "small" => Ok(Some(AlgoChoice::RecursiveDoubling)),
        _ => Err(Error::invalid("RINGLEADER_ALGO", format!("{v:?} is not one of auto, ring (or chain), rd (or tree)"))),
    }
}

/// `host:port`, bracketing IPv6 literals.
///
/// ```
/// assert_eq!(ringleader_core::config::join_host_port("::1", 80), "[::1]:80");
/// assert_eq!(ringleader_core::config::join_host_port("a", 80), "a:80");
/// ```
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `off`/`0`/`false` (never), or a size with an optional K/M/G suffix
/// (binary units).
///
/// ```
/// use ringleader_core::config::parse_single_copy;
/// assert_eq!(parse_single_copy("256K"), Some(Some(256 << 10)));
/// assert_eq!(parse_single_copy("off"), Some(None));
/// assert_eq!(parse_single_copy("lots"), None);
/// ```
pub fn parse_single_copy(s: &str) -> Option<Option<usize>> {
    let t = s.trim();
    if parse_bool(t) == Some(false) {
        return Some(None);
    }
    let (digits, shift) = match t.to_ascii_uppercase().chars().last()? {
        'K' => (&t[..t.len() - 1], 10),
        'M' => (&t[..t.len() - 1], 20),
        'G' => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: usize = digits.parse().ok()?;
    n.checked_mul(1 << shift).filter(|&b| b > 0).map(Some)
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "on" | "true" | "yes" => Some(true),
        "0" | "off" | "false" | "no" => Some(false),
        _ => None,
    }
}

/// Parses `LO-HI` (inclusive) or a single port.
///
/// ```
/// use ringleader_core::config::parse_port_range;
/// assert_eq!(parse_port_range("40000-40100").unwrap(), (40000, 40100));
/// assert!(parse_port_range("9-1").is_err());
/// ```
pub fn parse_port_range(s: &str) -> Result<(u16, u16)> {
    let bad =
        |why: &str| Error::invalid("RINGLEADER_PORT_RANGE", format!("{s:?}: {why} (expected LO-HI, e.g. 40000-40100)"));
    let (lo, hi) = match s.split_once('-') {
        Some((a, b)) => (a.trim(), b.trim()),
        None => (s.trim(), s.trim()),
    };
    let lo: u16 = lo.parse().map_err(|_| bad("not a port number"))?;
    let hi: u16 = hi.parse().map_err(|_| bad("not a port number"))?;
    if lo == 0 || lo > hi {
        return Err(bad("the range is empty"));
    }
    Ok((lo, hi))
}

struct Env<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Env<'_> {
    fn get(&self, k: &str) -> Option<String> {
        (self.0)(k).map(|v| v.trim().to_string())
    }

    fn parse<T: std::str::FromStr>(&self, k: &str) -> Result<Option<T>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| Error::invalid(k, format!("{v:?} is not a valid number"))),
        }
    }

    fn require<T: std::str::FromStr>(&self, k: &str) -> Result<T> {
        self.parse(k)?.ok_or_else(|| Error::invalid(k, "is not set"))
    }

    fn secs(&self, k: &str) -> Result<Option<Duration>> {
        match self.parse::<f64>(k)? {
            Some(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Some(Duration::from_secs_f64(s))),
            Some(s) => Err(Error::invalid(k, format!("{s} is not a positive number of seconds"))),
            None => Ok(None),
        }
    }
}

struct Identity {
    rank: Rank,
    world_size: usize,
    local_rank: Option<usize>,
    local_world_size: Option<usize>,
    master_addr: String,
    master_port: u16,
    source: &'static str,
    rank_var: &'static str,
    world_var: &'static str,
}

impl Identity {
    fn discover(ex: &Explicit, env: &Env<'_>) -> Result<Identity> {
        let mut id = if ex.rank.is_some() && ex.world_size.is_some() {
            Identity::partial("explicit", ex.rank.unwrap_or(0), ex.world_size.unwrap_or(1), "rank", "world_size")
        } else if env.get("RANK").is_some() || env.get("WORLD_SIZE").is_some() {
            let mut id =
                Identity::partial("torchrun", env.require("RANK")?, env.require("WORLD_SIZE")?, "RANK", "WORLD_SIZE");
            id.local_rank = env.parse("LOCAL_RANK")?;
            id.local_world_size = env.parse("LOCAL_WORLD_SIZE")?;
            id
        } else if env.get("SLURM_PROCID").is_some() {
            Identity::slurm(env)?
        } else if env.get("OMPI_COMM_WORLD_RANK").is_some() {
            let mut id = Identity::partial(
                "openmpi",
                env.require("OMPI_COMM_WORLD_RANK")?,
                env.require("OMPI_COMM_WORLD_SIZE")?,
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
            );
            id.local_rank = env.parse("OMPI_COMM_WORLD_LOCAL_RANK")?;
            id.local_world_size = env.parse("OMPI_COMM_WORLD_LOCAL_SIZE")?;
            id
        } else {
            return Err(Error::invalid(
                "RANK",
                "is not set, and neither are Slurm's SLURM_PROCID nor Open MPI's OMPI_COMM_WORLD_RANK; \
                 start the program with `ringleader launch` or torchrun, or pass rank and world size explicitly",
            ));
        };
        if let Some(r) = ex.rank {
            id.rank = r;
        }
        if let Some(w) = ex.world_size {
            id.world_size = w;
        }
        if let Some(a) = &ex.master_addr {
            id.master_addr = a.clone();
        } else if let Some(a) = env.get("MASTER_ADDR").filter(|a| !a.is_empty()) {
            id.master_addr = a;
        }
        if let Some(p) = ex.master_port {
            id.master_port = p;
        } else if let Some(p) = env.parse::<u16>("MASTER_PORT")? {
            id.master_port = p;
        }
        if id.master_addr.is_empty() {
            return Err(Error::invalid("MASTER_ADDR", "is not set (the host that runs rank 0 or the launcher)"));
        }
        if id.master_port == 0 {
            return Err(Error::invalid("MASTER_PORT", "is not set (the store's port, e.g. 29500)"));
        }
        Ok(id)
    }

    fn partial(
        source: &'static str,
        rank: Rank,
        world_size: usize,
        rank_var: &'static str,
        world_var: &'static str,
    ) -> Identity {
        Identity {
            rank,
            world_size,
            local_rank: None,
            local_world_size: None,
            master_addr: String::new(),
            master_port: 0,
            source,
            rank_var,
            world_var,
        }
    }

    fn slurm(env: &Env<'_>) -> Result<Identity> {
        let mut id = Identity::partial(
            "slurm",
            env.require("SLURM_PROCID")?,
            env.require("SLURM_NTASKS")?,
            "SLURM_PROCID",
            "SLURM_NTASKS",
        );
        id.local_rank = env.parse("SLURM_LOCALID")?;
        id.local_world_size = match env.parse("SLURM_NTASKS_PER_NODE") {
            Ok(Some(n)) => Some(n),
            // SLURM_TASKS_PER_NODE looks like "4(x2),3": the first node's count.
            _ => env
                .get("SLURM_TASKS_PER_NODE")
                .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next().and_then(|n| n.parse().ok())),
        };
        let nodes = env.get("SLURM_STEP_NODELIST").or_else(|| env.get("SLURM_JOB_NODELIST"));
        if let Some(first) = nodes.as_deref().and_then(first_slurm_host) {
            id.master_addr = first;
        }
        // Every task of the step derives the same port from the job id.
        if let Some(job) = env.parse::<u64>("SLURM_JOB_ID").ok().flatten() {
            id.master_port = slurm_master_port(job);
        }
        Ok(id)
    }
}

/// The MASTER_PORT every task of Slurm job `job_id` derives alike, without
/// talking: `20000 + job_id % 20000`.
///
/// ```
/// assert_eq!(ringleader_core::config::slurm_master_port(123456), 23456);
/// ```
pub fn slurm_master_port(job_id: u64) -> u16 {
    20000 + (job_id % 20000) as u16
}

/// The first host of a Slurm host list such as `node[03-05,9],gpu1`.
///
/// ```
/// use ringleader_core::config::first_slurm_host;
/// assert_eq!(first_slurm_host("node[03-05,9],gpu1").as_deref(), Some("node03"));
/// assert_eq!(first_slurm_host("a,b").as_deref(), Some("a"));
/// ```
pub fn first_slurm_host(list: &str) -> Option<String> {
    let list = list.trim();
    let end = list
        .char_indices()
        .scan(0i32, |depth, (i, c)| {
            match c {
                '[' => *depth += 1,
                ']' => *depth -= 1,
                _ => {}
            }
            Some((i, c, *depth))
        })
        .find(|&(_, c, d)| c == ',' && d == 0)
        .map_or(list.len(), |(i, _, _)| i);
    let first = &list[..end];
    match first.split_once('[') {
        None => (!first.is_empty()).then(|| first.to_string()),
        Some((prefix, rest)) => {
            let inner = rest.trim_end_matches(']');
            let head = inner.split([',', '-']).next()?;
            Some(format!("{prefix}{head}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn torchrun_variables() {
        let e = env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "10.1.1.1"),
            ("MASTER_PORT", "29500"),
            ("RINGLEADER_TIMEOUT", "2.5"),
        ]);
        let c = Config::discover(&Explicit::default(), e).unwrap();
        assert_eq!((c.rank, c.world_size, c.local_rank), (3, 4, Some(1)));
        assert_eq!(c.store_endpoint(), "10.1.1.1:29500");
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.source, "torchrun");
    }

    #[test]
    fn missing_or_malformed_values_name_the_variable() {
        let e = env(&[("RANK", "0"), ("WORLD_SIZE", "two"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")]);
        let err = Config::discover(&Explicit::default(), e).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.to_string().contains("WORLD_SIZE"), "{err}");

        let e = env(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "1")]);
        let err = Config::discover(&Explicit::default(), e).unwrap_err();
        assert!(err.to_string().contains("MASTER_ADDR"), "{err}");

        let e = env(&[("RANK", "2"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")]);
        assert!(Config::discover(&Explicit::default(), e).unwrap_err().to_string().contains("RANK"));

        let e = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
            ("RINGLEADER_TIMEOUT", "-1"),
        ]);
        assert!(Config::discover(&Explicit::default(), e).unwrap_err().to_string().contains("RINGLEADER_TIMEOUT"));

        let err = Config::discover(&Explicit::default(), env(&[])).unwrap_err();
        assert!(err.to_string().contains("RANK"));

        let base = [("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")];
        let too_many = (MAX_FR_SIZE + 1).to_string();
        let e = env(&[&base[..], &[("RINGLEADER_FR_SIZE", too_many.as_str())]].concat());
        let err = Config::discover(&Explicit::default(), e).unwrap_err();
        assert!(err.to_string().contains("RINGLEADER_FR_SIZE") && err.to_string().contains("1048576"), "{err}");
        let most = MAX_FR_SIZE.to_string();
        let e = env(&[&base[..], &[("RINGLEADER_FR_SIZE", most.as_str())]].concat());
        assert_eq!(Config::discover(&Explicit::default(), e).unwrap().fr_size, MAX_FR_SIZE);
    }

    #[test]
    fn shm_single_copy_and_tcp_splice_take_a_size_or_off() {
        let base = [("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")];
        let with = |name, v| {
            let mut pairs = base.to_vec();
            pairs.push((name, v));
            Config::discover(&Explicit::default(), env(&pairs))
        };
        let default = Config::discover(&Explicit::default(), env(&base)).unwrap();
        assert_eq!((default.shm_single_copy, default.tcp_splice), (Some(1 << 20), Some(256 << 10)));
        type Field = fn(&Config) -> Option<usize>;
        let fields: [(&str, Field); 2] =
            [("RINGLEADER_SHM_SINGLE_COPY", |c| c.shm_single_copy), ("RINGLEADER_TCP_SPLICE", |c| c.tcp_splice)];
        for (name, field) in fields {
            assert_eq!(field(&with(name, "4M").unwrap()), Some(4 << 20));
            assert_eq!(field(&with(name, "65536").unwrap()), Some(65536));
            assert_eq!(field(&with(name, "off").unwrap()), None);
            let err = with(name, "big").unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument);
            assert!(err.to_string().contains(name), "{err}");
        }
    }

    #[test]
    fn algo_takes_a_known_name_and_refuses_typos() {
        let base = [("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")];
        let with = |v| {
            let mut pairs = base.to_vec();
            pairs.push(("RINGLEADER_ALGO", v));
            Config::discover(&Explicit::default(), env(&pairs))
        };
        assert_eq!(with("chain").unwrap().algo, Some(AlgoChoice::Ring));
        assert_eq!(with("tree").unwrap().algo, Some(AlgoChoice::RecursiveDoubling));
        assert_eq!(with("auto").unwrap().algo, None);
        assert_eq!(with("").unwrap().algo, None);
        let err = with("rign").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.to_string().contains("RINGLEADER_ALGO") && err.to_string().contains("\"rign\""), "{err}");
    }

    #[test]
    fn a_run_id_over_the_limit_is_refused_naming_its_variable() {
        let with = |var: &str, id: &str| {
            let pairs = [("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1"), (var, id)];
            Config::discover(&Explicit::default(), env(&pairs))
        };
        let longest = "r".repeat(MAX_RUN_ID);
        assert_eq!(with("RINGLEADER_RUN_ID", &longest).unwrap().run_id, longest);
        for var in ["RINGLEADER_RUN_ID", "TORCHELASTIC_RUN_ID"] {
            let err = with(var, &"r".repeat(MAX_RUN_ID + 1)).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument);
            let s = err.to_string();
            assert!(s.contains(var) && s.contains("257 bytes") && s.contains("256 bytes"), "{s}");
        }
        assert!(with("RINGLEADER_RUN_ID", "*").is_err());
    }

    #[test]
    fn slurm_variables() {
        let e = env(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_TASKS_PER_NODE", "4(x2)"),
            ("SLURM_JOB_NODELIST", "gpu[07-08]"),
            ("SLURM_JOB_ID", "123456"),
        ]);
        let c = Config::discover(&Explicit::default(), e).unwrap();
        assert_eq!((c.rank, c.world_size, c.local_world_size), (5, 8, Some(4)));
        assert_eq!(c.master_addr, "gpu07");
        assert_eq!(c.master_port, 20000 + (123456 % 20000) as u16);
        assert_eq!(c.run_id, "123456");
    }

    #[test]
    fn openmpi_needs_master() {
        let e = env(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2")]);
        let err = Config::discover(&Explicit::default(), e).unwrap_err();
        assert!(err.to_string().contains("MASTER_ADDR"));
        let e = env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "x"),
            ("MASTER_PORT", "7"),
        ]);
        assert_eq!(Config::discover(&Explicit::default(), e).unwrap().source, "openmpi");
    }

    #[test]
    fn explicit_wins() {
        let e = env(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "9")]);
        let ex = Explicit { rank: Some(0), ..Default::default() };
        let c = Config::discover(&ex, e).unwrap();
        assert_eq!((c.rank, c.world_size), (0, 2));
    }
}
