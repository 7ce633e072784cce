//! The store server as a sans-IO state machine, in the style of quinn-proto.
//!
//! [`ServerState`] owns the runs (each with its key-value map, parked waits
//! and liveness table), the connections and every budget. It does no IO and
//! reads no clock: the caller passes `now` to every call and takes the
//! messages to send out of its return value (possibly to *other*
//! connections, whose waits a write just completed). The IO layer drives it
//! like this:
//!
//! 1. [`ServerState::connection_opened`] on accept; send what it returns
//!    (the challenge, and perhaps a refusal to the oldest pending connection).
//! 2. [`ServerState::handle_hello`] with the client's first frame.
//! 3. [`ServerState::handle`] for every request after that.
//! 4. [`ServerState::written`] once answers left for the socket, with their
//!    [`weight`], so that what is queued for a connection stays bounded.
//! 5. [`ServerState::connection_closed`] when the socket closes, for any reason.
//! 6. Whenever [`ServerState::poll_timeout`] passes, [`ServerState::handle_timeout`].
//!
//! A [`ServerMsg::Reject`] in the output means: send it, then close.
//!
//! Because time is an argument, the tests drive expiry with a synthetic
//! clock and never sleep; the fuzz target drives random request sequences
//! through it and checks [`ServerState::check_invariants`] after each step.

pub(crate) mod fuzz;
mod limits;
mod membership;
mod ops;
mod run;
mod waiters;

pub use limits::Limits;

use crate::codec::{Response, ServerMsg, WireError};
use crate::job::Presence;
use membership::Conn;
use ops::Cx;
use run::Run;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

/// Identifies one connection for the lifetime of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ConnId(pub(crate) u64);

/// Messages to send, in order, each to its connection.
pub(crate) type Outbox = Vec<(ConnId, ServerMsg)>;

/// Fixed part of an answer's weight (at least its framing).
pub(super) const BASE: u64 = 64;
/// Weight per item of a list in an answer, beside the item's bytes (at least
/// its length prefix).
pub(super) const ITEM: u64 = 8;

/// The whole server, minus the sockets.
#[derive(Debug)]
pub(crate) struct ServerState {
    /// The one run this store serves; `None`: any run, each created when
    /// its first member or helper arrives.
    serves: Option<String>,
    token: Option<String>,
    limits: Limits,
    conns: HashMap<ConnId, Conn>,
    /// Connections waiting for their hello, oldest first, with their deadline.
    pending: BTreeMap<ConnId, Instant>,
    runs: HashMap<String, Run>,
    /// Bytes charged over every run.
    used: u64,
    /// Bytes of answers queued over every connection.
    queued: u64,
    /// Admitted connections other than the ranks' own (members, helpers).
    others: usize,
    /// When each of those is closed for silence.
    idle: BTreeSet<(Instant, ConnId)>,
}

impl ServerState {
    /// A server for `run_id` (`*`: any run), admitting only clients that
    /// prove they know `token`, if one is given.
    pub(crate) fn new(run_id: &str, token: Option<&str>, limits: Limits) -> Self {
        let serves = (run_id != "*").then(|| run_id.to_string());
        let runs = serves.iter().map(|id| (id.clone(), Run::default())).collect();
        ServerState {
            serves,
            token: token.map(str::to_string),
            limits,
            conns: HashMap::new(),
            pending: BTreeMap::new(),
            runs,
            used: 0,
            queued: 0,
            others: 0,
            idle: BTreeSet::new(),
        }
    }

    /// Handles one request of an admitted connection; requests of other
    /// connections are dropped.
    pub(crate) fn handle(&mut self, conn: ConnId, id: u64, req: crate::codec::Request, now: Instant) -> Outbox {
        let Some(Conn::Ready(session)) = self.conns.get(&conn) else {
            return Outbox::new();
        };
        let (run, access) = (session.run.clone(), session.access);
        self.touch(conn, now);
        let Some(mut cx) = self.cx(&run, now) else {
            return Outbox::new();
        };
        let mut out = Outbox::new();
        let answer = match membership::permits(access, &req) {
            Err(refused) => Some(Response::Error(refused)),
            Ok(()) => cx.apply(conn, id, req, &mut out),
        };
        if let Some(resp) = answer {
            let mut first = Outbox::new();
            cx.deliver(conn, id, resp, &mut first);
            first.append(&mut out);
            out = first;
        }
        out
    }

    /// The connection's socket took answers weighing `weight` in all (the
    /// sum of [`weight`] over the messages written).
    pub(crate) fn written(&mut self, conn: ConnId, weight: u64) {
        if let Some(Conn::Ready(s)) = self.conns.get_mut(&conn) {
            let n = weight.min(s.queued);
            s.queued -= n;
            self.queued -= n.min(self.queued);
        }
    }

    /// The earliest deadline: of a parked wait, of a pending hello, of an
    /// idle run.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let waits = self.runs.values().filter_map(|r| r.waiters.next_deadline());
        let hello = self.pending.values().next().copied();
        let linger = self.limits.run_linger;
        let idle = match self.serves {
            Some(_) => None,
            None => self.runs.values().filter_map(|r| r.idle_since.and_then(|t| t.checked_add(linger))).min(),
        };
        let silent = self.idle.first().map(|(at, _)| *at);
        let after = self.limits.silent_after;
        let beats = self.runs.values().filter_map(|r| r.beats.first().and_then(|(t, _)| t.checked_add(after)));
        waits.chain(hello).chain(idle).chain(silent).chain(beats).min()
    }

    /// Answers every wait whose deadline passed (key waits with the keys
    /// still missing, status polls with the current status), closes the
    /// connections whose hello is overdue and drops runs idle too long.
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> Outbox {
        let mut out = Outbox::new();
        self.expire_pending(now, &mut out);
        self.expire_idle(now, &mut out);
        let ids: Vec<String> = self.runs.keys().cloned().collect();
        for id in ids {
            if let Some(mut cx) = self.cx(&id, now) {
                cx.expire_waits(&mut out);
                cx.expire_silence(&mut out);
            }
        }
        if self.serves.is_none() {
            let linger = self.limits.run_linger;
            let idle: Vec<String> = self
                .runs
                .iter()
                .filter(|(_, r)| r.idle_since.and_then(|t| t.checked_add(linger)).is_some_and(|t| t <= now))
                .map(|(id, _)| id.clone())
                .collect();
            for id in idle {
                tracing::info!(run = %id, "store dropped a run without connections");
                self.drop_run(&id);
            }
        }
        out
    }

    /// Forgets run `id` and releases what it held.
    fn drop_run(&mut self, id: &str) {
        if let Some(run) = self.runs.remove(id) {
            self.used -= run.used.min(self.used);
        }
    }

    /// The context in which requests of run `run` are served.
    fn cx(&mut self, run: &str, now: Instant) -> Option<Cx<'_>> {
        let ServerState { runs, conns, used, queued, limits, .. } = self;
        Some(Cx { run: runs.get_mut(run)?, conns, used, queued, limits, now })
    }

    /// The job of run `run` as seen at `now` (the default status if no such run).
    #[cfg(test)]
    pub(crate) fn status_of(&self, run: &str, now: Instant) -> crate::job::JobStatus {
        self.runs.get(run).map(|r| r.status(now)).unwrap_or_default()
    }

    /// The earliest deadline of a parked wait, over every run.
    #[cfg(test)]
    pub(crate) fn next_wait(&self) -> Option<Instant> {
        self.runs.values().filter_map(|r| r.waiters.next_deadline()).min()
    }

    /// Number of parked waits over every run.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.runs.values().map(|r| r.waiters.len()).sum()
    }

    /// Bytes charged over every run, and bytes of answers queued.
    #[cfg(test)]
    pub(crate) fn usage(&self) -> (u64, u64) {
        (self.used, self.queued)
    }

    /// The runs served now.
    #[cfg(test)]
    pub(crate) fn run_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.runs.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Checks that the books balance and every bound holds; the message
    /// says what does not. The fuzz target calls it after every step.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let mut used = 0;
        for (id, run) in &self.runs {
            let counted = run.recount();
            if counted != run.used {
                return Err(format!("run {id:?} is charged {} bytes but holds {counted}", run.used));
            }
            if run.used > self.limits.run_bytes {
                return Err(format!("run {id:?} holds {} bytes, over its budget", run.used));
            }
            if run.data.len() as u64 > self.limits.run_keys {
                return Err(format!("run {id:?} holds {} keys, over its limit", run.data.len()));
            }
            let conns = self.conns.values().filter(|c| matches!(c, Conn::Ready(s) if s.run == *id)).count();
            if conns != run.conns {
                return Err(format!("run {id:?} counts {} connections, {conns} are open", run.conns));
            }
            let mut helpers: BTreeMap<u32, usize> = BTreeMap::new();
            for c in self.conns.values() {
                if let Conn::Ready(membership::Session { run: r, access: membership::Access::RankAux(rank), .. }) = c {
                    if r == id {
                        *helpers.entry(*rank).or_default() += 1;
                    }
                }
            }
            if helpers != run.helpers || helpers.values().any(|n| *n > self.limits.helpers_per_rank) {
                return Err(format!("run {id:?} counts helpers {:?}, {helpers:?} are open", run.helpers));
            }
            for (rank, e) in &run.ranks {
                let indexed = run.beats.contains(&(e.beat_at, *rank));
                if indexed != (e.liveness == Presence::Connected && !e.silent) {
                    return Err(format!("rank {rank} of run {id:?}: indexed by heartbeat {indexed}, {e:?}"));
                }
            }
            if run.beats.len() > run.ranks.len() {
                return Err(format!("run {id:?} indexes {} heartbeats for {} ranks", run.beats.len(), run.ranks.len()));
            }
            for w in run.waiters.iter() {
                if !matches!(self.conns.get(&w.conn), Some(Conn::Ready(s)) if s.run == *id) {
                    return Err(format!("a wait of run {id:?} belongs to a connection that is gone"));
                }
            }
            used += run.used;
        }
        if used != self.used {
            return Err(format!("the store is charged {} bytes, its runs {used}", self.used));
        }
        let mut held: HashMap<ConnId, u64> = HashMap::new();
        for run in self.runs.values() {
            for e in run.data.values() {
                *held.entry(e.owner).or_default() += 1;
            }
        }
        let (mut queued, mut others) = (0, 0);
        for (conn, c) in &self.conns {
            let Conn::Ready(s) = c else { continue };
            queued += s.queued;
            if let Some(at) = s.idle_at {
                others += 1;
                if !self.idle.contains(&(at, *conn)) {
                    return Err("a silent-connection deadline is not indexed".into());
                }
            }
            let holds = held.get(conn).copied().unwrap_or(0);
            if s.keys != holds || s.keys > self.limits.conn_keys {
                return Err(format!(
                    "a connection counts {} keys, holds {holds} (limit {})",
                    s.keys, self.limits.conn_keys
                ));
            }
        }
        if queued != self.queued || others != self.others {
            return Err(format!(
                "queued {} / {queued} and others {} / {others} disagree with the connections",
                self.queued, self.others
            ));
        }
        if self.idle.len() != self.others {
            return Err(format!("{} silent-connection deadlines for {} connections", self.idle.len(), self.others));
        }
        if self.pending.len() > self.limits.pending.max(1) {
            return Err(format!("{} connections pending, over the limit", self.pending.len()));
        }
        if self.pending.keys().any(|c| !matches!(self.conns.get(c), Some(Conn::Greeted { .. }))) {
            return Err("a pending connection is not waiting for its hello".into());
        }
        Ok(())
    }
}

/// What an answer weighs in the books of queued answers: an upper bound of
/// its encoded size, computed the same way before an answer is built (to
/// refuse it) and after it is written (to release it). Handshake messages
/// weigh nothing.
pub(crate) fn weight(msg: &ServerMsg) -> u64 {
    match msg {
        ServerMsg::Response { resp, .. } => response_weight(resp),
        _ => 0,
    }
}

fn response_weight(resp: &Response) -> u64 {
    let texts = |ks: &[String]| ks.iter().map(|k| ITEM + k.len() as u64).sum::<u64>();
    match resp {
        Response::Value(v) | Response::MaybeValue(Some(v)) => BASE + v.len() as u64,
        Response::Values(vs) => BASE + vs.iter().map(|v| ITEM + v.len() as u64).sum::<u64>(),
        Response::Keys(ks) | Response::Timeout { missing: ks } => BASE + texts(ks),
        Response::Changes(c) => {
            let ranks: u64 =
                c.ranks.iter().map(|r| run::RANK + (r.host.len() + r.version.len() + r.heartbeat.len()) as u64).sum();
            BASE + ranks + c.abort.as_ref().map_or(0, |a| a.len() as u64)
        }
        Response::Status(s) => {
            let ranks: u64 =
                s.ranks.iter().map(|r| run::RANK + (r.host.len() + r.version.len() + r.heartbeat.len()) as u64).sum();
            BASE + ranks + s.abort.as_ref().map_or(0, |a| a.len() as u64)
        }
        Response::Error(e) => BASE + error_weight(e),
        Response::Ok | Response::MaybeValue(None) | Response::Int(_) | Response::Bool(_) | Response::Count(_) => BASE,
    }
}

fn error_weight(e: &WireError) -> u64 {
    let text = |s: &String| ITEM + s.len() as u64;
    match e {
        WireError::VersionMismatch { detail, versions } => {
            text(detail) + versions.iter().map(|(a, b)| text(a) + text(b)).sum::<u64>()
        }
        WireError::ForeignRun { store_run, client_run } => text(store_run) + text(client_run),
        WireError::AuthFailed { detail } | WireError::Protocol { detail } | WireError::Busy { detail } => text(detail),
        WireError::DuplicateRank { first, second, .. } => text(first) + text(second),
        WireError::InvalidArgument { what, detail } => text(what) + text(detail),
    }
}

fn invalid(what: impl Into<String>, detail: String) -> Response {
    Response::Error(WireError::InvalidArgument { what: what.into(), detail })
}

#[cfg(test)]
mod tests;
