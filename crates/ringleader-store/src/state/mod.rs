//! The store server as a sans-IO state machine, in the style of quinn-proto.
//!
//! [`ServerState`] owns the key-value map, the parked waits and the liveness
//! table. It does no IO and reads no clock: the caller passes `now` to every
//! call and takes the messages to send out of its return value (possibly to
//! *other* connections, whose waits a write just completed). The IO layer
//! drives it like this:
//!
//! 1. [`ServerState::connection_opened`] on accept; send the challenge it returns.
//! 2. [`ServerState::handle_hello`] with the client's first frame;
//!    a [`ServerMsg::Reject`] among the output means: send it, then close.
//! 3. [`ServerState::handle`] for every request after that.
//! 4. [`ServerState::connection_closed`] when the socket closes, for any reason.
//! 5. Whenever [`ServerState::poll_timeout`] passes, [`ServerState::handle_timeout`].
//!
//! Because time is an argument, the tests drive expiry with a synthetic
//! clock and never sleep.

mod membership;
mod waiters;

use crate::codec::{Request, Response, ServerMsg, WireError, MAX_VALUE};
use crate::job::JobStatus;
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::time::{Duration, Instant};
use waiters::{WaitKind, Waiter, Waiters};

use membership::MAX_ABORT_RECORD;

/// Identifies one connection for the lifetime of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ConnId(pub(crate) u64);

/// Messages to send, in order, each to its connection.
pub(crate) type Outbox = Vec<(ConnId, ServerMsg)>;

/// The whole server, minus the sockets.
#[derive(Debug)]
pub(crate) struct ServerState {
    /// The run this store serves; `*` accepts any.
    run_id: String,
    token: Option<String>,
    data: BTreeMap<String, Vec<u8>>,
    conns: HashMap<ConnId, membership::Conn>,
    ranks: BTreeMap<u32, membership::RankEntry>,
    waiters: Waiters,
    /// Counts job events; status long-polls wait for it to pass theirs.
    generation: u64,
    abort: Option<Vec<u8>>,
}

impl ServerState {
    pub(crate) fn new(run_id: &str, token: Option<&str>) -> Self {
        ServerState {
            run_id: run_id.to_string(),
            token: token.map(str::to_string),
            data: BTreeMap::new(),
            conns: HashMap::new(),
            ranks: BTreeMap::new(),
            waiters: Waiters::default(),
            generation: 0,
            abort: None,
        }
    }

    /// Handles one request of a connection that completed its handshake;
    /// requests of other connections are dropped.
    pub(crate) fn handle(&mut self, conn: ConnId, id: u64, req: Request, now: Instant) -> Outbox {
        if !self.is_ready(conn) {
            return Outbox::new();
        }
        let mut out = Outbox::new();
        if let Some(resp) = self.apply(Caller { conn, id, now }, req, &mut out) {
            out.insert(0, (conn, ServerMsg::Response { id, resp }));
        }
        out
    }

    /// The earliest deadline of a parked wait.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.waiters.next_deadline()
    }

    /// Answers every wait whose deadline passed: key waits with the keys
    /// still missing, status polls with the current status.
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> Outbox {
        self.waiters
            .take_expired(now)
            .into_iter()
            .map(|w| {
                let resp = match w.kind {
                    WaitKind::Status { .. } => Response::Status(self.status(now)),
                    _ => Response::Timeout { missing: self.missing(&w.keys) },
                };
                (w.conn, ServerMsg::Response { id: w.id, resp })
            })
            .collect()
    }

    /// Number of parked waits.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiters.len()
    }

    /// Performs `req`; `None` when it was parked until keys appear, an event
    /// happens or its deadline passes.
    fn apply(&mut self, caller: Caller, req: Request, out: &mut Outbox) -> Option<Response> {
        let Caller { conn, now, .. } = caller;
        Some(match req {
            Request::Set { key, value } => self.set(vec![(key, value)], out),
            Request::Get { key, timeout } => return self.wait_keys(caller, WaitKind::Get, vec![key], timeout),
            Request::TryGet { key } => Response::MaybeValue(self.data.get(&key).cloned()),
            Request::Add { key, delta } => self.add(key, delta, out),
            Request::CompareSet { key, expected, desired } => self.compare_set(key, expected, desired, out),
            Request::Wait { keys, timeout } => return self.wait_keys(caller, WaitKind::Wait, keys, timeout),
            Request::Check { keys } => Response::Bool(keys.iter().all(|k| self.data.contains_key(k))),
            Request::Delete { key } => Response::Bool(self.data.remove(&key).is_some()),
            Request::NumKeys => Response::Count(self.data.len() as u64),
            Request::MultiGet { keys, timeout } => return self.wait_keys(caller, WaitKind::MultiGet, keys, timeout),
            Request::MultiSet { pairs } => self.set(pairs, out),
            Request::Append { key, value } => self.append(key, value, out),
            Request::KeysWithPrefix { prefix } => Response::Keys(self.keys_with_prefix(&prefix)),
            Request::Heartbeat { payload } => self.heartbeat(caller, payload),
            Request::Leave => self.leave(conn, now, out),
            Request::AbortJob { record } => self.abort_job(record, now, out),
            Request::Status { since, timeout } => return self.wait_status(caller, since, timeout),
        })
    }

    fn set(&mut self, pairs: Vec<(String, Vec<u8>)>, out: &mut Outbox) -> Response {
        let keys: Vec<String> = pairs.iter().map(|(k, _)| k.clone()).collect();
        self.data.extend(pairs);
        self.wake(&keys, out);
        Response::Ok
    }

    /// Adds to a counter stored as decimal ASCII (as torch's TCPStore does),
    /// starting from 0 when the key is absent.
    fn add(&mut self, key: String, delta: i64, out: &mut Outbox) -> Response {
        let current = match self.data.get(&key).map(|v| parse_counter(v).ok_or(v)) {
            None => 0,
            Some(Ok(n)) => n,
            Some(Err(v)) => {
                let detail = format!("holds {}, not a decimal integer, so add() cannot count on it", preview(v));
                return key_invalid(&key, detail);
            }
        };
        let Some(new) = current.checked_add(delta) else {
            return key_invalid(&key, format!("adding {delta} to {current} overflows a 64-bit counter"));
        };
        self.data.insert(key.clone(), new.to_string().into_bytes());
        self.wake(&[key], out);
        Response::Int(new)
    }

    /// Stores `desired` if the current value is `expected` (`None`: if the
    /// key is absent). Answers the value stored afterwards, empty if none.
    fn compare_set(&mut self, key: String, expected: Option<Vec<u8>>, desired: Vec<u8>, out: &mut Outbox) -> Response {
        let current = self.data.get(&key);
        if current != expected.as_ref() {
            return Response::Value(current.cloned().unwrap_or_default());
        }
        self.data.insert(key.clone(), desired.clone());
        self.wake(&[key], out);
        Response::Value(desired)
    }

    fn append(&mut self, key: String, value: Vec<u8>, out: &mut Outbox) -> Response {
        let value_len = self.data.get(&key).map_or(0, Vec::len);
        if value_len + value.len() > MAX_VALUE {
            return key_invalid(
                &key,
                format!("appending {} bytes to {value_len} would pass the {MAX_VALUE}-byte value limit", value.len()),
            );
        }
        self.data.entry(key.clone()).or_default().extend_from_slice(&value);
        self.wake(&[key], out);
        Response::Ok
    }

    fn keys_with_prefix(&self, prefix: &str) -> Vec<String> {
        self.data
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .map(|(k, _)| k)
            .take_while(|k| k.starts_with(prefix))
            .cloned()
            .collect()
    }

    fn missing(&self, keys: &[String]) -> Vec<String> {
        keys.iter().filter(|k| !self.data.contains_key(*k)).cloned().collect()
    }

    /// The answer of a key wait whose keys are all present.
    fn answer(&self, kind: WaitKind, keys: &[String]) -> Response {
        let value = |k: &String| self.data.get(k).cloned().unwrap_or_default();
        match kind {
            WaitKind::Get => Response::Value(keys.first().map(value).unwrap_or_default()),
            WaitKind::MultiGet => Response::Values(keys.iter().map(value).collect()),
            WaitKind::Wait | WaitKind::Status { .. } => Response::Ok,
        }
    }

    /// Answers at once when every key is present (or the timeout is zero),
    /// else parks the request.
    fn wait_keys(&mut self, caller: Caller, kind: WaitKind, keys: Vec<String>, timeout: Duration) -> Option<Response> {
        let missing = self.missing(&keys);
        if missing.is_empty() {
            return Some(self.answer(kind, &keys));
        }
        if timeout.is_zero() {
            return Some(Response::Timeout { missing });
        }
        let waiter = caller.park(kind, keys, timeout);
        self.waiters.add(waiter, &missing);
        None
    }

    /// Completes the waits that `keys` may have satisfied.
    fn wake(&mut self, keys: &[String], out: &mut Outbox) {
        for wid in self.waiters.take_for_keys(keys.iter().map(String::as_str)) {
            let Some(w) = self.waiters.get(wid) else {
                continue;
            };
            let missing = self.missing(&w.keys);
            if !missing.is_empty() {
                missing.iter().for_each(|k| self.waiters.index_key(wid, k));
                continue;
            }
            if let Some(w) = self.waiters.remove(wid) {
                let resp = self.answer(w.kind, &w.keys);
                out.push((w.conn, ServerMsg::Response { id: w.id, resp }));
            }
        }
    }

    /// Answers at once when an event newer than `since` happened, else
    /// parks the poll until one does or the timeout passes.
    fn wait_status(&mut self, caller: Caller, since: Option<u64>, timeout: Duration) -> Option<Response> {
        match since {
            Some(since) if since >= self.generation && !timeout.is_zero() => {
                let waiter = caller.park(WaitKind::Status { since }, vec![], timeout);
                self.waiters.add(waiter, &[]);
                None
            }
            _ => Some(Response::Status(self.status(caller.now))),
        }
    }

    /// Records a job event and answers the status polls waiting for one.
    fn bump(&mut self, now: Instant, out: &mut Outbox) {
        self.generation += 1;
        let due = self.waiters.status_due(self.generation);
        if due.is_empty() {
            return;
        }
        let status = self.status(now);
        for w in due.into_iter().filter_map(|wid| self.waiters.remove(wid)) {
            let resp = Response::Status(status.clone());
            out.push((w.conn, ServerMsg::Response { id: w.id, resp }));
        }
    }

    /// Sets the job-wide abort record unless one is set; answers whether this
    /// call set it.
    fn abort_job(&mut self, record: Vec<u8>, now: Instant, out: &mut Outbox) -> Response {
        if record.len() > MAX_ABORT_RECORD {
            return invalid(
                "abort record",
                format!("{} bytes is over the {MAX_ABORT_RECORD}-byte limit", record.len()),
            );
        }
        if self.abort.is_some() {
            return Response::Bool(false);
        }
        tracing::warn!(record = %String::from_utf8_lossy(&record), "job abort record set");
        self.abort = Some(record);
        self.bump(now, out);
        Response::Bool(true)
    }

    /// The job as seen now.
    pub(crate) fn status(&self, now: Instant) -> JobStatus {
        JobStatus {
            generation: self.generation,
            ranks: self.ranks.iter().map(|(r, e)| e.status(*r, now)).collect(),
            abort: self.abort.clone(),
        }
    }
}

/// Who sent the request being handled, and when.
#[derive(Debug, Clone, Copy)]
struct Caller {
    conn: ConnId,
    /// The request id to answer.
    id: u64,
    now: Instant,
}

impl Caller {
    fn park(self, kind: WaitKind, keys: Vec<String>, timeout: Duration) -> Waiter {
        Waiter {
            conn: self.conn,
            id: self.id,
            kind,
            keys,
            // A timeout too large for the clock never expires.
            deadline: self.now.checked_add(timeout),
        }
    }
}

fn invalid(what: impl Into<String>, detail: String) -> Response {
    Response::Error(WireError::InvalidArgument { what: what.into(), detail })
}

fn key_invalid(key: &str, detail: String) -> Response {
    invalid(format!("key {key:?}"), detail)
}

fn parse_counter(v: &[u8]) -> Option<i64> {
    std::str::from_utf8(v).ok()?.trim().parse().ok()
}

/// The start of a value, for messages.
fn preview(v: &[u8]) -> String {
    let head = String::from_utf8_lossy(&v[..v.len().min(32)]).into_owned();
    match v.len() > 32 {
        true => format!("{head:?}... ({} bytes)", v.len()),
        false => format!("{head:?}"),
    }
}

#[cfg(test)]
mod tests;
