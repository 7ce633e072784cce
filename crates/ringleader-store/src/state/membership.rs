//! Who may talk to the store, for which run, and what each may do.
//!
//! A connection is first *pending*: it got the challenge (which names no
//! run) and has [`Limits::hello_timeout`](super::Limits) to answer with its
//! hello; pending connections have their own small cap, and one more closes
//! the oldest, so silent sockets never lock a rank out. The hello is checked
//! in this order, so that a refusal tells a stranger nothing it could not
//! already know:
//!
//! 1. the protocol (magic, version);
//! 2. the token, when the store has one (`auth-failed` otherwise, naming
//!    no run);
//! 3. the fields' sizes (run id, host name, version) and the role's needs: a
//!    member names its rank and a world size of at most [`MAX_WORLD`], and
//!    its rank is below it; only a tool may use the run id `*`;
//! 4. the run: a store of one run refuses others (`foreign-run`, naming its
//!    run); a store of any run finds the run, or creates it for a member or
//!    helper, within [`Limits::runs`](super::Limits);
//! 5. a member's rank is not taken in that run (`duplicate-rank`, naming
//!    both processes); ranks never come back, because a job whose rank
//!    restarted mid-run has lost that rank's state;
//! 6. room: a rank has at most a few helper connections, and connections
//!    other than the ranks' own are admitted up to a number that follows
//!    the runs' world sizes (`busy` beyond either; clients retry). Those
//!    others are closed after a long silence.
//!
//! A member connection then stands for its rank's life: `Leave` marks the
//! rank [`Presence::Left`], a close without it [`Presence::Vanished`].
//!
//! What each connection may do is its [`Access`], decided at the hello; see
//! the crate docs ("Who may do what") for the table.

use super::run::{RankEntry, Run, RANK};
use super::{ConnId, Outbox, ServerState};
use crate::auth::Transcript;
use crate::codec::{Challenge, ClientHello, Request, ServerMsg, Welcome, WireError, MAGIC, PROTOCOL_VERSION};
use crate::job::{Presence, Role};
use crate::keys;
use ringleader_core::config::MAX_RUN_ID;
use ringleader_core::VERSION;
use std::time::{Duration, Instant};

/// Largest heartbeat payload: every status answer carries one per rank.
pub(crate) const MAX_HEARTBEAT: usize = 16 << 10;
/// Largest job abort record.
pub(crate) const MAX_ABORT_RECORD: usize = 64 << 10;
/// Largest world size a member may declare (a status answer lists at most
/// this many ranks).
pub(crate) const MAX_WORLD: u32 = 65536;
/// Longest host name in a hello, in bytes (DNS names have at most 253).
pub(crate) const MAX_HOST: usize = 255;
/// Longest library version string in a hello.
pub(crate) const MAX_LIBRARY_VERSION: usize = 128;

/// Where a connection is in its life.
#[derive(Debug)]
pub(super) enum Conn {
    /// Challenged with `nonce`; waiting for the hello.
    Greeted { nonce: [u8; 32] },
    /// Admitted.
    Ready(Session),
}

/// An admitted connection.
#[derive(Debug)]
pub(super) struct Session {
    /// The run it belongs to.
    pub(super) run: String,
    pub(super) access: Access,
    /// The rank whose life it stands for, until it leaves.
    pub(super) member_of: Option<u32>,
    /// Bytes of answers queued for it and not yet written (see `weight`).
    pub(super) queued: u64,
    /// Keys it created that still exist.
    pub(super) keys: u64,
    /// When it will be closed for silence, unless it is a rank's own (see
    /// [`Limits::idle_timeout`](super::Limits)).
    pub(super) idle_at: Option<Instant>,
}

/// What an admitted connection may do, decided from its hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// A rank's member connection: everything.
    Member(u32),
    /// A helper connection of a rank that is a member: the same hello rank,
    /// host and pid as the member connection connected at the time.
    /// Everything but heartbeats and leaving (the member connection's own).
    RankAux(u32),
    /// Any other helper of the run (a launcher, a doctor, a user program):
    /// reads everything; writes its own keys (outside `rl/`) and the keys
    /// launchers and tools write ([`keys::tool_may_write`]).
    Aux,
    /// A viewer (`ringleader status`): reads everything; writes only the
    /// keys launchers and tools write.
    Tool,
}

impl Access {
    fn name(self) -> &'static str {
        match self {
            Access::Member(_) => "member",
            Access::RankAux(_) => "rank's helper",
            Access::Aux => "non-member",
            Access::Tool => "tool",
        }
    }

    /// Whether this connection may write (or delete) `key`.
    fn may_write(self, key: &str) -> bool {
        match self {
            Access::Member(_) | Access::RankAux(_) => true,
            Access::Aux => !key.starts_with(keys::PREFIX) || keys::tool_may_write(key),
            Access::Tool => keys::tool_may_write(key),
        }
    }
}

/// Refuses `req` when `access` does not allow it (heartbeats and leaving are
/// checked where they happen: they need the member connection itself).
pub(super) fn permits(access: Access, req: &Request) -> Result<(), WireError> {
    let denied = |detail: String| Err(WireError::InvalidArgument { what: "store access".into(), detail });
    let written: Vec<&str> = match req {
        Request::Set { key, .. }
        | Request::Add { key, .. }
        | Request::CompareSet { key, .. }
        | Request::Delete { key }
        | Request::Append { key, .. } => vec![key],
        Request::MultiSet { pairs } => pairs.iter().map(|(k, _)| k.as_str()).collect(),
        Request::AbortJob { .. } => {
            return match access {
                Access::Member(_) | Access::RankAux(_) => Ok(()),
                other => denied(format!("a {} connection may not abort the job: only its ranks do", other.name())),
            };
        }
        _ => return Ok(()),
    };
    match written.into_iter().find(|k| !access.may_write(k)) {
        None => Ok(()),
        Some(key) => denied(format!(
            "a {} connection may not {} {key:?}: ringleader's keys ({}...) are written by the job's ranks, and by \
             launchers and tools only where they record endings, dump requests, conflicts and doctor reports",
            access.name(),
            req.name(),
            keys::PREFIX
        )),
    }
}

/// What admitting a hello decided.
struct Admission {
    server_mac: Option<[u8; 32]>,
    run: String,
    /// The run does not exist yet: create it.
    create: bool,
    access: Access,
}

impl ServerState {
    /// A new connection: answers the challenge to send it first, and, when
    /// it is one pending connection too many, the refusal that closes the
    /// oldest.
    pub(crate) fn connection_opened(&mut self, conn: ConnId, nonce: [u8; 32], now: Instant) -> Outbox {
        let mut out = Outbox::new();
        while self.pending.len() >= self.limits.pending.max(1) {
            let Some((oldest, _)) = self.pending.pop_first() else { break };
            self.conns.remove(&oldest);
            tracing::warn!(
                pending = self.limits.pending,
                "store closed the oldest connection that has not said hello: too many are waiting"
            );
            let detail = format!(
                "{} connections were waiting for their hello; this one, the oldest, was closed",
                self.limits.pending
            );
            out.push((oldest, ServerMsg::Reject(WireError::Busy { detail })));
        }
        self.conns.insert(conn, Conn::Greeted { nonce });
        self.pending.insert(conn, later(now, self.limits.hello_timeout));
        let challenge =
            Challenge { magic: MAGIC, protocol_version: PROTOCOL_VERSION, library_version: VERSION.to_string(), nonce };
        out.push((conn, ServerMsg::Challenge(challenge)));
        out
    }

    /// The client's hello: admits it (a welcome, and for a member a job
    /// event) or rejects it (the IO layer sends the rejection, then closes).
    pub(crate) fn handle_hello(&mut self, conn: ConnId, hello: ClientHello, now: Instant) -> Outbox {
        let Some(Conn::Greeted { nonce }) = self.conns.get(&conn) else {
            return Outbox::new();
        };
        let nonce = *nonce;
        self.pending.remove(&conn);
        match self.admit(&hello, &nonce, now) {
            Err(reason) => {
                tracing::warn!(host = %short(&hello.host), pid = hello.pid, rank = ?hello.rank, ?reason, "store refused a connection");
                self.conns.remove(&conn);
                vec![(conn, ServerMsg::Reject(reason))]
            }
            Ok(admission) => {
                let mut out = vec![(conn, ServerMsg::Welcome(Welcome { server_mac: admission.server_mac }))];
                self.register(conn, hello, admission, now, &mut out);
                out
            }
        }
    }

    /// Checks a hello (see the module docs for the order).
    fn admit(&mut self, hello: &ClientHello, nonce: &[u8; 32], now: Instant) -> Result<Admission, WireError> {
        if hello.magic != MAGIC {
            return Err(WireError::Protocol { detail: "the hello has the wrong magic".into() });
        }
        if hello.protocol_version != PROTOCOL_VERSION {
            return Err(version_mismatch(hello));
        }
        let server_mac = self.check_token(hello, nonce)?;
        check_fields(hello)?;
        let (run, create) = self.find_run(hello)?;
        let existing = self.runs.get(&run);
        if let (Some(rank), Some(r)) = (hello.rank.filter(|_| hello.role == Role::Member), existing) {
            if let Some(first) = r.ranks.get(&rank) {
                return Err(WireError::DuplicateRank {
                    rank,
                    first: first.describe(now),
                    second: format!("{} pid {}", hello.host, hello.pid),
                });
            }
        }
        let access = match (hello.role, hello.rank) {
            (Role::Member, Some(rank)) => Access::Member(rank),
            (Role::Aux, Some(rank)) if existing.is_some_and(|r| is_members_helper(r, rank, hello)) => {
                Access::RankAux(rank)
            }
            (Role::Tool, _) => Access::Tool,
            _ => Access::Aux,
        };
        if let (Access::RankAux(rank), Some(run)) = (access, existing) {
            let helpers = run.helpers.get(&rank).copied().unwrap_or(0);
            if helpers >= self.limits.helpers_per_rank {
                return Err(WireError::Busy {
                    detail: format!("rank {rank} has {helpers} helper connections open, the limit per rank"),
                });
            }
        }
        if matches!(access, Access::Aux | Access::Tool) {
            let limit = self.conn_limit();
            if self.others >= limit {
                return Err(WireError::Busy {
                    detail: format!(
                        "the store admits {limit} connections besides the ranks' own ({} per rank of the runs' world \
                         sizes, plus {}), and that many are open",
                        self.limits.conns_per_rank, self.limits.conns_margin
                    ),
                });
            }
        } else {
            let cost = RANK + (hello.host.len() + hello.library_version.len()) as u64;
            let used = existing.map_or(0, |r| r.used);
            if used + cost > self.limits.run_bytes || self.used + cost > self.limits.store_bytes {
                return Err(invalid_arg(
                    "store budget",
                    format!("the run's memory budget of {} bytes is spent", self.limits.run_bytes),
                ));
            }
        }
        Ok(Admission { server_mac, run, create, access })
    }

    fn check_token(&self, hello: &ClientHello, nonce: &[u8; 32]) -> Result<Option<[u8; 32]>, WireError> {
        let Some(token) = &self.token else {
            return Ok(None);
        };
        let transcript = Transcript {
            server_nonce: nonce,
            client_nonce: &hello.client_nonce,
            run_id: &hello.run_id,
            role: hello.role,
            rank: hello.rank,
        };
        let detail = match &hello.mac {
            None => "the store requires a token and the connecting process has none",
            Some(mac) if !transcript.verify_client(token, mac) => {
                "the connecting process's token differs from the store's"
            }
            Some(_) => return Ok(Some(transcript.server_mac(token))),
        };
        Err(WireError::AuthFailed { detail: format!("{detail} ({} pid {})", short(&hello.host), hello.pid) })
    }

    /// The run a hello belongs to, and whether it must be created.
    fn find_run(&mut self, hello: &ClientHello) -> Result<(String, bool), WireError> {
        let any = hello.role == Role::Tool && hello.run_id == "*";
        if let Some(ours) = &self.serves {
            return match any || hello.run_id == *ours {
                true => Ok((ours.clone(), false)),
                false => Err(WireError::ForeignRun { store_run: ours.clone(), client_run: hello.run_id.clone() }),
            };
        }
        if any {
            return match self.runs.len() {
                1 => Ok((self.runs.keys().next().cloned().unwrap_or_default(), false)),
                0 => Err(invalid_arg("run id", "this store serves no run yet".into())),
                n => {
                    // Only a client that proved the token learns the runs' ids.
                    let which = match self.token.is_some() {
                        true => {
                            let mut ids: Vec<&str> = self.runs.keys().map(String::as_str).collect();
                            ids.sort_unstable();
                            format!(": {}", ids.join(", "))
                        }
                        false => String::new(),
                    };
                    Err(invalid_arg("run id", format!("this store serves {n} runs{which}; name the job's run id")))
                }
            };
        }
        if self.runs.contains_key(&hello.run_id) {
            return Ok((hello.run_id.clone(), false));
        }
        if hello.role == Role::Tool {
            return Err(invalid_arg("run id", format!("this store serves no run {:?}", hello.run_id)));
        }
        if self.runs.len() >= self.limits.runs && !self.drop_idlest_run() {
            return Err(WireError::Busy {
                detail: format!("the store serves {} runs, its limit, and each has connections", self.limits.runs),
            });
        }
        Ok((hello.run_id.clone(), true))
    }

    /// Drops the run that has been without connections the longest, if any.
    fn drop_idlest_run(&mut self) -> bool {
        let idlest = self.runs.iter().filter_map(|(id, r)| Some((r.idle_since?, id.clone()))).min();
        match idlest {
            Some((_, id)) => {
                self.drop_run(&id);
                true
            }
            None => false,
        }
    }

    /// Connections other than members admitted at once now.
    fn conn_limit(&self) -> usize {
        self.limits.conns_for(self.runs.values().map(|r| u64::from(r.world)).sum())
    }

    /// Records an admitted connection; a member's arrival is a job event.
    fn register(&mut self, conn: ConnId, hello: ClientHello, a: Admission, now: Instant, out: &mut Outbox) {
        if a.create {
            tracing::info!(run = %a.run, "store serves a new run");
            self.runs.insert(a.run.clone(), Run::default());
        }
        let member_of = match a.access {
            Access::Member(rank) => Some(rank),
            _ => None,
        };
        let Some(run) = self.runs.get_mut(&a.run) else { return };
        run.conns += 1;
        run.idle_since = None;
        if let Access::RankAux(rank) = a.access {
            *run.helpers.entry(rank).or_default() += 1;
        }
        let idle_at = matches!(a.access, Access::Aux | Access::Tool).then(|| later(now, self.limits.idle_timeout));
        if let Some(at) = idle_at {
            self.others += 1;
            self.idle.insert((at, conn));
        }
        let session = Session { run: a.run.clone(), access: a.access, member_of, queued: 0, keys: 0, idle_at };
        self.conns.insert(conn, Conn::Ready(session));
        let Some(rank) = member_of else {
            return;
        };
        tracing::info!(rank, host = %hello.host, pid = hello.pid, version = %hello.library_version, "rank connected");
        let world = hello.world_size.unwrap_or(rank + 1);
        let entry = RankEntry {
            liveness: Presence::Connected,
            host: hello.host,
            pid: hello.pid,
            version: hello.library_version,
            world_size: world,
            changed: now,
            heartbeat: None,
            generation: 0,
            silent: false,
            beat_at: now,
            was_silent: false,
        };
        let cost = entry.cost();
        if let Some(old) = run.ranks.insert(rank, entry) {
            run.beats.remove(&(old.beat_at, rank));
            run.changed.remove(&old.generation);
        }
        run.beats.insert((now, rank));
        run.world = run.world.max(world);
        run.used += cost;
        self.used += cost;
        if let Some(mut cx) = self.cx(&a.run, now) {
            cx.event(Some(rank), out);
        }
    }

    /// A connection closed, cleanly or not: a member that did not leave
    /// vanished; its parked waits go, and their cost with them.
    pub(crate) fn connection_closed(&mut self, conn: ConnId, now: Instant) -> Outbox {
        let mut out = Outbox::new();
        self.pending.remove(&conn);
        let Some(Conn::Ready(session)) = self.conns.remove(&conn) else {
            return out;
        };
        self.queued -= session.queued.min(self.queued);
        if let Some(at) = session.idle_at {
            self.others = self.others.saturating_sub(1);
            self.idle.remove(&(at, conn));
        }
        let Some(mut cx) = self.cx(&session.run, now) else {
            return out;
        };
        if let Access::RankAux(rank) = session.access {
            if let Some(n) = cx.run.helpers.get_mut(&rank) {
                *n -= 1;
                if *n == 0 {
                    cx.run.helpers.remove(&rank);
                }
            }
        }
        for w in cx.run.waiters.remove_conn(conn) {
            cx.release(w.cost);
        }
        cx.run.conns = cx.run.conns.saturating_sub(1);
        if cx.run.conns == 0 {
            cx.run.idle_since = Some(now);
        }
        if let Some(rank) = session.member_of {
            cx.change(rank, Presence::Vanished, &mut out);
        }
        out
    }

    /// A request of `conn` arrived: it is not silent.
    pub(super) fn touch(&mut self, conn: ConnId, now: Instant) {
        let Some(Conn::Ready(s)) = self.conns.get_mut(&conn) else { return };
        let Some(at) = s.idle_at else { return };
        let next = later(now, self.limits.idle_timeout);
        if next != at {
            self.idle.remove(&(at, conn));
            self.idle.insert((next, conn));
            s.idle_at = Some(next);
        }
    }

    /// Closes the connections (other than the ranks' own) silent for too
    /// long; one with a parked wait is not silent.
    pub(super) fn expire_idle(&mut self, now: Instant, out: &mut Outbox) {
        while let Some(&(at, conn)) = self.idle.first() {
            if at > now {
                break;
            }
            let waiting = match self.conns.get(&conn) {
                Some(Conn::Ready(s)) => self.runs.get(&s.run).is_some_and(|r| r.waiters.count_for(conn) > 0),
                _ => false,
            };
            if waiting {
                self.touch(conn, now);
                continue;
            }
            let secs = self.limits.idle_timeout.as_secs_f64();
            tracing::debug!(conn = conn.0, "store closed a connection silent for too long");
            out.push((
                conn,
                ServerMsg::Reject(WireError::Protocol {
                    detail: format!("silent for {secs:.0} s: closed (connect again when needed)"),
                }),
            ));
            let mut rest = self.connection_closed(conn, now);
            out.append(&mut rest);
        }
    }

    /// Closes the pending connections whose hello is overdue.
    pub(super) fn expire_pending(&mut self, now: Instant, out: &mut Outbox) {
        while let Some((&conn, &deadline)) = self.pending.first_key_value() {
            if deadline > now {
                break;
            }
            self.pending.remove(&conn);
            self.conns.remove(&conn);
            let secs = self.limits.hello_timeout.as_secs_f64();
            tracing::debug!(conn = conn.0, "store closed a connection that sent no hello in time");
            out.push((conn, ServerMsg::Reject(WireError::Protocol { detail: format!("no hello within {secs:.1} s") })));
        }
    }
}

/// Whether an auxiliary hello naming `rank` comes from that rank's member
/// process (same host and pid, member connected).
fn is_members_helper(run: &Run, rank: u32, hello: &ClientHello) -> bool {
    run.ranks
        .get(&rank)
        .is_some_and(|m| m.liveness == Presence::Connected && m.host == hello.host && m.pid == hello.pid)
}

/// Sizes of the hello's fields and what its role needs.
fn check_fields(hello: &ClientHello) -> Result<(), WireError> {
    let any = hello.role == Role::Tool && hello.run_id == "*";
    if !any {
        if let Err(e) = ringleader_core::config::check_run_id("run id", &hello.run_id) {
            let detail = match e {
                ringleader_core::Error::InvalidArgument { detail, .. } => detail,
                other => other.to_string(),
            };
            return Err(invalid_arg("run id", detail));
        }
    }
    for (what, len, max) in [
        ("host", hello.host.len(), MAX_HOST),
        ("library version", hello.library_version.len(), MAX_LIBRARY_VERSION),
        ("run id", hello.run_id.len(), MAX_RUN_ID),
    ] {
        if len > max {
            return Err(invalid_arg(what, format!("{len} bytes is over the limit of {max} bytes")));
        }
    }
    if let Some(world) = hello.world_size {
        if world == 0 || world > MAX_WORLD {
            return Err(invalid_arg("world size", format!("{world} is not between 1 and {MAX_WORLD}")));
        }
    }
    match (hello.role, hello.rank, hello.world_size) {
        (_, Some(rank), Some(world)) if rank >= world => {
            Err(invalid_arg("rank", format!("rank {rank} is not below the world size {world}")))
        }
        (Role::Member, None, _) | (Role::Member, _, None) => {
            Err(invalid_arg("rank", "a member connection must name its rank and the world size".into()))
        }
        _ => Ok(()),
    }
}

/// `d` after `now`, or as late as the clock goes (a limit set beyond it).
fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d).or_else(|| now.checked_add(Duration::from_secs(1 << 32))).unwrap_or(now)
}

fn invalid_arg(what: &str, detail: String) -> WireError {
    WireError::InvalidArgument { what: what.into(), detail }
}

/// At most the first 64 bytes of `s` (host names in log lines are the
/// client's word, and may be long).
fn short(s: &str) -> &str {
    let mut end = s.len().min(64);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn version_mismatch(hello: &ClientHello) -> WireError {
    let who = match hello.host.is_empty() {
        true => "the connecting process".to_string(),
        false => format!("{} pid {}", short(&hello.host), hello.pid),
    };
    WireError::VersionMismatch {
        detail: format!(
            "the store speaks store protocol {PROTOCOL_VERSION} and {who} protocol {}",
            hello.protocol_version
        ),
        versions: vec![("the store".into(), VERSION.to_string()), (who, short(&hello.library_version).to_string())],
    }
}
