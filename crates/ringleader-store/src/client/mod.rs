//! The blocking store client.
//!
//! No runtime, no background thread: each call writes one request and waits
//! for its answer on a nonblocking socket with `poll(2)`. Every wait is
//! bounded (waits for keys by the timeout the caller passes, everything else
//! by [`ClientOptions::op_timeout`]) and every wait also watches the optional
//! [`AbortSignal`], so an aborted communicator never stays stuck in the store.
//!
//! The server enforces a wait's timeout itself and answers with the keys
//! still missing; the client allows a short grace on top before giving up on
//! its own (a frozen store). Requests carry ids, so an answer that arrives
//! after the client gave up is recognised and skipped.
//!
//! A member connection ([`ClientOptions::member`]) stands for the rank's
//! life: call [`StoreClient::leave`] before a clean exit, because dropping
//! the client without it tells the store the rank vanished (as a crash would).

mod channel;
mod connect;

use crate::codec::{self, Request, Response, ServerMsg};
use crate::job::{JobChanges, JobStatus, Role};
use channel::{Channel, Failure};
use ringleader_core::{AbortSignal, Error, Rank, Result, VERSION};
use std::fmt;
use std::time::{Duration, Instant};

/// Extra time a client gives the store to answer a wait after its timeout,
/// before concluding that the store itself is stuck.
const WAIT_GRACE: Duration = Duration::from_secs(2);

/// Who the client is and how patient it is.
///
/// ```
/// use ringleader_store::{ClientOptions, Role};
/// let opts = ClientOptions::new("job-42").member(3, 8);
/// assert_eq!((opts.role, opts.rank, opts.world_size), (Role::Member, Some(3), Some(8)));
/// assert_eq!(opts.pid, std::process::id());
/// ```
#[derive(Clone)]
pub struct ClientOptions {
    /// The job's run id (at most 256 bytes); a store of another run refuses
    /// us with [`Error::ForeignRun`]. A [`Role::Tool`] may use `*` for the
    /// store's run (a store serving several runs then asks for the id).
    pub run_id: String,
    /// Shared secret (`RINGLEADER_TOKEN`). Never sent: both sides prove they know it.
    pub token: Option<String>,
    /// What this connection stands for.
    pub role: Role,
    /// This process's rank, if it has one (required for [`Role::Member`]).
    pub rank: Option<Rank>,
    /// The world size this process was launched with.
    pub world_size: Option<usize>,
    /// This host's name, as reported to the store (default: the hostname).
    pub host: String,
    /// This process's id, as reported to the store.
    pub pid: u32,
    /// The library version this process advertises.
    pub library_version: String,
    /// How long to keep retrying while the store is not reachable (default 60 s).
    pub connect_timeout: Duration,
    /// Bound on the store's answer to any call that does not wait for keys
    /// (default 30 s).
    pub op_timeout: Duration,
    /// Ends every wait early, with the signal's reason.
    pub abort: Option<AbortSignal>,
}

impl ClientOptions {
    /// An [`Role::Aux`] connection of run `run_id` with default timeouts,
    /// this host's name and this process's id.
    pub fn new(run_id: impl Into<String>) -> ClientOptions {
        ClientOptions {
            run_id: run_id.into(),
            token: None,
            role: Role::Aux,
            rank: None,
            world_size: None,
            host: hostname(),
            pid: std::process::id(),
            library_version: VERSION.to_string(),
            connect_timeout: Duration::from_secs(60),
            op_timeout: Duration::from_secs(30),
            abort: None,
        }
    }

    /// Makes this the member connection of `rank` in a job of `world_size` ranks.
    pub fn member(mut self, rank: Rank, world_size: usize) -> ClientOptions {
        self.role = Role::Member;
        self.rank = Some(rank);
        self.world_size = Some(world_size);
        self
    }
}

impl fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientOptions")
            .field("run_id", &self.run_id)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("role", &self.role)
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("host", &self.host)
            .field("pid", &self.pid)
            .field("library_version", &self.library_version)
            .field("connect_timeout", &self.connect_timeout)
            .field("op_timeout", &self.op_timeout)
            .field("abort", &self.abort)
            .finish()
    }
}

fn hostname() -> String {
    rustix::system::uname().nodename().to_string_lossy().into_owned()
}

/// A connection to the store. Calls take `&mut self`: one request at a time.
///
/// ```no_run
/// use ringleader_store::{ClientOptions, StoreClient};
/// use std::time::Duration;
/// # fn main() -> ringleader_core::Result<()> {
/// let mut store = StoreClient::connect("node-a:29500", ClientOptions::new("job-42"))?;
/// let n = store.add("joined", 1)?;
/// store.wait(&["go"], Duration::from_secs(60))?;
/// # Ok(()) }
/// ```
pub struct StoreClient {
    channel: Channel,
    addr: String,
    op_timeout: Duration,
    abort: Option<AbortSignal>,
    last_id: u64,
    /// Why the connection can no longer be used, once it cannot.
    broken: Option<String>,
}

impl fmt::Debug for StoreClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreClient").field("addr", &self.addr).field("broken", &self.broken).finish_non_exhaustive()
    }
}

/// A process's wall clock against its store's
/// ([`StoreClient::clock_offset`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockOffset {
    /// The store's clock minus this process's, in nanoseconds.
    pub offset_ns: i64,
    /// The round trip the estimate came from: the offset is right within
    /// half of it.
    pub rtt_ns: u64,
}

impl StoreClient {
    /// Connects to the store at `addr` (`host:port`) and completes the
    /// handshake.
    ///
    /// Refused or unreachable connections are retried with exponential
    /// backoff (50 ms doubling to 1 s) until `opts.connect_timeout`, then
    /// [`Error::StoreUnreachable`]. A peer that is not a store (silent for a
    /// few seconds, or sending something else) is [`Error::StoreProtocol`] at
    /// once. The store's refusals arrive as the variant it decided:
    /// [`Error::VersionMismatch`], [`Error::ForeignRun`],
    /// [`Error::AuthFailed`], [`Error::DuplicateRank`],
    /// [`Error::InvalidArgument`].
    pub fn connect(addr: &str, opts: ClientOptions) -> Result<StoreClient> {
        let channel = connect::connect(addr, &opts)?;
        tracing::debug!(addr, role = ?opts.role, rank = ?opts.rank, "connected to the store");
        Ok(StoreClient {
            channel,
            addr: addr.to_string(),
            op_timeout: opts.op_timeout,
            abort: opts.abort,
            last_id: 0,
            broken: None,
        })
    }

    /// The store's address, as given to [`StoreClient::connect`].
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Stores `value` under `key`, waking whoever waits for it.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        let req = Request::Set { key: key.into(), value: value.to_vec() };
        self.call(req, None, |r| match r {
            Response::Ok => Ok(()),
            r => Err(r),
        })
    }

    /// The value of `key`, waiting up to `timeout` for it to be set;
    /// [`Error::StoreTimeout`] naming the key after that.
    pub fn get(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let req = Request::Get { key: key.into(), timeout };
        self.call(req, Some(timeout), |r| match r {
            Response::Value(v) => Ok(v),
            r => Err(r),
        })
    }

    /// The value of `key` if it is set now.
    pub fn try_get(&mut self, key: &str) -> Result<Option<Vec<u8>>> {
        let req = Request::TryGet { key: key.into() };
        self.call(req, None, |r| match r {
            Response::MaybeValue(v) => Ok(v),
            r => Err(r),
        })
    }

    /// Adds `delta` to the counter at `key` (absent counts as 0) and answers
    /// the new value. The counter is stored as decimal ASCII, as torch's
    /// TCPStore does, so `get` reads it as text.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        let req = Request::Add { key: key.into(), delta };
        self.call(req, None, |r| match r {
            Response::Int(n) => Ok(n),
            r => Err(r),
        })
    }

    /// Stores `desired` under `key` if its current value is `expected`
    /// (`None`: if `key` is absent), atomically. Answers the value stored
    /// afterwards: `desired` when the swap happened, else the current value,
    /// which is empty when `key` is absent (and then nothing was stored).
    pub fn compare_set(&mut self, key: &str, expected: Option<&[u8]>, desired: &[u8]) -> Result<Vec<u8>> {
        let req =
            Request::CompareSet { key: key.into(), expected: expected.map(<[u8]>::to_vec), desired: desired.to_vec() };
        self.call(req, None, |r| match r {
            Response::Value(v) => Ok(v),
            r => Err(r),
        })
    }

    /// Waits up to `timeout` until every one of `keys` is set;
    /// [`Error::StoreTimeout`] naming the missing ones after that.
    pub fn wait(&mut self, keys: &[&str], timeout: Duration) -> Result<()> {
        let req = Request::Wait { keys: owned(keys), timeout };
        self.call(req, Some(timeout), |r| match r {
            Response::Ok => Ok(()),
            r => Err(r),
        })
    }

    /// Whether every one of `keys` is set now.
    pub fn check(&mut self, keys: &[&str]) -> Result<bool> {
        let req = Request::Check { keys: owned(keys) };
        self.call(req, None, |r| match r {
            Response::Bool(b) => Ok(b),
            r => Err(r),
        })
    }

    /// Removes `key`; answers whether it was set.
    pub fn delete(&mut self, key: &str) -> Result<bool> {
        let req = Request::Delete { key: key.into() };
        self.call(req, None, |r| match r {
            Response::Bool(b) => Ok(b),
            r => Err(r),
        })
    }

    /// This process's wall clock against the store's: `samples` round
    /// trips (at least one), keeping the one that took least, whose
    /// midpoint is compared with the time the store read. Add
    /// [`ClockOffset::offset_ns`] to a wall-clock time of this process to
    /// get the store's time for it, within [`ClockOffset::rtt_ns`] / 2.
    /// Ranks of several hosts measured against one store line up on one
    /// timeline.
    pub fn clock_offset(&mut self, samples: usize) -> Result<ClockOffset> {
        let wall = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let mut best: Option<ClockOffset> = None;
        for _ in 0..samples.max(1) {
            let sent = wall();
            let store = self.call(Request::Clock { received_ns: 0 }, None, |r| match r {
                Response::Count(n) => Ok(n),
                r => Err(r),
            })?;
            let back = wall();
            let rtt_ns = back.saturating_sub(sent) as u64;
            let mid = (sent + back) / 2;
            let offset_ns = (i128::from(store) - mid as i128).clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
            if best.is_none_or(|b| rtt_ns < b.rtt_ns) {
                best = Some(ClockOffset { offset_ns, rtt_ns });
            }
        }
        Ok(best.expect("at least one sample"))
    }

    /// How many keys are set.
    pub fn num_keys(&mut self) -> Result<u64> {
        self.call(Request::NumKeys, None, |r| match r {
            Response::Count(n) => Ok(n),
            r => Err(r),
        })
    }

    /// The values of `keys`, in order, waiting up to `timeout` until all
    /// are set.
    pub fn multi_get(&mut self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let req = Request::MultiGet { keys: owned(keys), timeout };
        self.call(req, Some(timeout), |r| match r {
            Response::Values(v) => Ok(v),
            r => Err(r),
        })
    }

    /// Sets every pair at once: a waiter never sees only some of them.
    pub fn multi_set(&mut self, pairs: &[(&str, &[u8])]) -> Result<()> {
        let pairs = pairs.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect();
        self.call(Request::MultiSet { pairs }, None, |r| match r {
            Response::Ok => Ok(()),
            r => Err(r),
        })
    }

    /// Appends `value` to the value at `key` (absent counts as empty).
    pub fn append(&mut self, key: &str, value: &[u8]) -> Result<()> {
        let req = Request::Append { key: key.into(), value: value.to_vec() };
        self.call(req, None, |r| match r {
            Response::Ok => Ok(()),
            r => Err(r),
        })
    }

    /// Every key that starts with `prefix`, sorted.
    pub fn keys_with_prefix(&mut self, prefix: &str) -> Result<Vec<String>> {
        let req = Request::KeysWithPrefix { prefix: prefix.into() };
        self.call(req, None, |r| match r {
            Response::Keys(k) => Ok(k),
            r => Err(r),
        })
    }

    /// Records that this rank is alive, with an opaque `payload` (at most
    /// 16 KiB) that [`StoreClient::status`] reports with the heartbeat's age.
    /// Only a member connection may send heartbeats.
    pub fn heartbeat(&mut self, payload: &[u8]) -> Result<()> {
        let req = Request::Heartbeat { payload: payload.to_vec() };
        self.call(req, None, |r| match r {
            Response::Ok => Ok(()),
            r => Err(r),
        })
    }

    /// Tells the store this rank is leaving cleanly ([`Presence::Left`](crate::Presence::Left)).
    /// Only a member connection may leave; the connection stays usable.
    pub fn leave(&mut self) -> Result<()> {
        self.call(Request::Leave, None, |r| match r {
            Response::Ok => Ok(()),
            r => Err(r),
        })
    }

    /// Sets the job-wide abort record (at most 64 KiB) unless one is set;
    /// answers whether this call set it. Every status poll sees it.
    pub fn abort_job(&mut self, record: &[u8]) -> Result<bool> {
        let req = Request::AbortJob { record: record.to_vec() };
        self.call(req, None, |r| match r {
            Response::Bool(b) => Ok(b),
            r => Err(r),
        })
    }

    /// The job's status: at once when `since` is `None` or older than the
    /// store's generation, else as soon as a newer event happens (a member
    /// connects, leaves or vanishes; the abort record is set) or `timeout`
    /// passes, whichever is first. Passing the timeout is not an error.
    ///
    /// ```no_run
    /// # use ringleader_store::{ClientOptions, Presence, StoreClient};
    /// # use std::time::Duration;
    /// # fn main() -> ringleader_core::Result<()> {
    /// # let mut store = StoreClient::connect("h:1", ClientOptions::new("j"))?;
    /// let mut seen = None;
    /// loop {
    ///     let status = store.status(seen, Duration::from_secs(5))?;
    ///     if !status.with(Presence::Vanished).is_empty() { break; }
    ///     seen = Some(status.generation);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn status(&mut self, since: Option<u64>, timeout: Duration) -> Result<JobStatus> {
        let req = Request::Status { since, timeout };
        self.call(req, Some(timeout), |r| match r {
            Response::Status(s) => Ok(s),
            r => Err(r),
        })
    }

    /// What changed in the job after generation `since` (0, a
    /// [`JobStatus::generation`] or an earlier answer's): the ranks that
    /// left or vanished since, each as it is now, and the abort record if
    /// it was set since (a join advances the generation, and is not listed). Answers at once when there are changes,
    /// else as soon as one happens or `timeout` passes (then with none).
    /// Heartbeats are not changes, so a rank that waits on this costs the
    /// store one small answer per event, not the whole status per poll.
    /// An answer carries at most about 1 MiB of ranks; when
    /// [`JobChanges::more`] is set, ask again at once.
    ///
    /// ```no_run
    /// # use ringleader_store::{ClientOptions, Presence, StoreClient};
    /// # use std::time::Duration;
    /// # fn main() -> ringleader_core::Result<()> {
    /// # let mut store = StoreClient::connect("h:1", ClientOptions::new("j"))?;
    /// let mut view = ringleader_store::JobStatus::default();
    /// while view.with(Presence::Vanished).is_empty() {
    ///     let changes = store.changes(view.generation, Duration::from_secs(5))?;
    ///     view.apply(changes);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn changes(&mut self, since: u64, timeout: Duration) -> Result<JobChanges> {
        let req = Request::Changes { since, timeout };
        self.call(req, Some(timeout), |r| match r {
            Response::Changes(c) => Ok(c),
            r => Err(r),
        })
    }

    /// Sends `req`, waits for its answer and lets `pick` take the expected
    /// variant out of it. `wait` is the server-side wait the request asks for.
    fn call<T>(
        &mut self,
        req: Request,
        wait: Option<Duration>,
        pick: impl FnOnce(Response) -> std::result::Result<T, Response>,
    ) -> Result<T> {
        let start = Instant::now();
        match self.exchange(&req, wait, start)? {
            Response::Error(reason) => Err(reason.into_error(&self.addr)),
            Response::Timeout { missing } => Err(self.timeout(missing, start)),
            resp => pick(resp).map_err(|other| {
                self.fail(
                    Failure::Unexpected(format!("answered {} with {}", req.name(), brief(&other))),
                    &req,
                    start,
                    true,
                )
            }),
        }
    }

    fn exchange(&mut self, req: &Request, wait: Option<Duration>, start: Instant) -> Result<Response> {
        self.usable()?;
        self.last_id += 1;
        let id = self.last_id;
        let mut frame = Vec::new();
        codec::encode_request(id, req, &mut frame)
            .map_err(|e| Error::invalid(format!("store {}", req.name()), e.to_string()))?;
        if let Err(f) = self.channel.send(&frame, deadline(start, self.op_timeout)) {
            return Err(self.fail(f, req, start, true));
        }
        let patience = wait.map_or(self.op_timeout, |w| w.saturating_add(WAIT_GRACE.min(self.op_timeout)));
        self.answer(id, deadline(start, patience)).map_err(|f| self.fail(f, req, start, false))
    }

    /// Reads until the answer to request `id`, skipping late answers to
    /// requests given up on earlier.
    fn answer(&mut self, id: u64, deadline: Instant) -> std::result::Result<Response, Failure> {
        loop {
            match self.channel.recv(deadline, codec::decode_server)? {
                ServerMsg::Response { id: got, resp } if got == id => return Ok(resp),
                ServerMsg::Response { id: got, .. } if got < id => continue,
                other => return Err(Failure::Unexpected(format!("sent {}", brief(&other)))),
            }
        }
    }

    /// Fails fast once aborted or broken.
    fn usable(&self) -> Result<()> {
        if let Some(signal) = &self.abort {
            signal.check()?;
        }
        match &self.broken {
            None => Ok(()),
            Some(why) => Err(Error::StoreProtocol {
                addr: self.addr.clone(),
                detail: format!("this connection broke earlier ({why}); connect again"),
            }),
        }
    }

    fn timeout(&self, keys: Vec<String>, start: Instant) -> Error {
        Error::StoreTimeout { addr: self.addr.clone(), keys, waited: start.elapsed() }
    }

    /// Turns a failed exchange into the error to return. A deadline or an
    /// abort while *waiting* leaves the connection usable (a late answer is
    /// skipped by its id); anything else, or any failure while *sending* (a
    /// partial frame), breaks it.
    fn fail(&mut self, f: Failure, req: &Request, start: Instant, sending: bool) -> Error {
        let keeps = !sending && matches!(f, Failure::Deadline | Failure::Aborted(_));
        let op = req.name();
        let protocol = |detail: String| Error::StoreProtocol { addr: self.addr.clone(), detail };
        let err = match f {
            Failure::Aborted(e) => e,
            Failure::Deadline => self.timeout(req.keys(), start),
            Failure::Closed => protocol(format!("the store closed the connection during {op}")),
            Failure::Io(e) => protocol(format!("the connection failed during {op}: {e}")),
            Failure::Codec(e) => protocol(format!("the store sent a malformed frame during {op}: {e}")),
            Failure::Unexpected(what) => protocol(format!("the store {what}")),
        };
        if !keeps {
            self.broken = Some(err.to_string());
        }
        err
    }
}

/// A message for an error text: its start, not a 100 MiB value.
fn brief(msg: &impl fmt::Debug) -> String {
    let mut text = format!("{msg:?}");
    if let Some((cut, _)) = text.char_indices().nth(120) {
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

fn owned(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

/// `start + d`, saturating far in the future instead of overflowing.
fn deadline(start: Instant, d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(100 * 365 * 86_400);
    start.checked_add(d.min(FAR)).unwrap_or(start)
}
