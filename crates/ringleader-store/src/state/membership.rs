//! Who may talk to the store, and which rank each member connection stands
//! for.
//!
//! The handshake admits a connection only if it speaks our protocol, belongs
//! to our run and (when the store has a token) proves it knows the token. A
//! member connection then stands for its rank's life: `Leave` marks the rank
//! [`Liveness::Left`], a close without it marks the rank
//! [`Liveness::Vanished`]. Ranks never come back: a second claim on a rank is
//! refused whatever became of the first, because a job whose rank restarted
//! mid-run has lost that rank's state (there is no elastic training here).

use super::{invalid, Caller, ConnId, Outbox, ServerState};
use crate::auth::Transcript;
use crate::codec::{Challenge, Hello, Response, ServerMsg, Welcome, WireError, MAGIC, PROTOCOL_VERSION};
use crate::job::{Liveness, RankStatus, Role};
use ringleader_core::VERSION;
use std::time::Instant;

/// Largest heartbeat payload: every status answer carries one per rank.
pub(crate) const MAX_HEARTBEAT: usize = 16 << 10;
/// Largest job abort record.
pub(crate) const MAX_ABORT_RECORD: usize = 64 << 10;

/// Where a connection is in its life.
#[derive(Debug)]
pub(super) enum Conn {
    /// Challenged with `nonce`; waiting for the hello.
    Greeted { nonce: [u8; 32] },
    /// Admitted; `member_of` is the rank whose life it stands for, until it leaves.
    Ready { member_of: Option<u32> },
}

/// One rank that connected as a member.
#[derive(Debug)]
pub(super) struct RankEntry {
    liveness: Liveness,
    host: String,
    pid: u32,
    version: String,
    world_size: Option<u32>,
    /// When `liveness` last changed.
    changed: Instant,
    /// When the last heartbeat arrived, and its payload.
    heartbeat: Option<(Instant, Vec<u8>)>,
}

impl RankEntry {
    pub(super) fn status(&self, rank: u32, now: Instant) -> RankStatus {
        RankStatus {
            rank: rank as usize,
            liveness: self.liveness,
            host: self.host.clone(),
            pid: self.pid,
            version: self.version.clone(),
            world_size: self.world_size.map(|w| w as usize),
            since_change: now.saturating_duration_since(self.changed),
            heartbeat_age: self.heartbeat.as_ref().map(|(t, _)| now.saturating_duration_since(*t)),
            heartbeat: self.heartbeat.as_ref().map(|(_, p)| p.clone()).unwrap_or_default(),
        }
    }

    fn describe(&self, now: Instant) -> String {
        let who = format!("{} pid {}", self.host, self.pid);
        match self.liveness {
            Liveness::Connected => who,
            gone => format!(
                "{who}, which {gone} {:.1} s ago (a rank cannot rejoin a running job)",
                now.saturating_duration_since(self.changed).as_secs_f64()
            ),
        }
    }
}

impl ServerState {
    /// A new connection: answers the challenge to send it first.
    pub(crate) fn connection_opened(&mut self, conn: ConnId, nonce: [u8; 32]) -> Outbox {
        self.conns.insert(conn, Conn::Greeted { nonce });
        let challenge = Challenge {
            magic: MAGIC,
            protocol_version: PROTOCOL_VERSION,
            library_version: VERSION.to_string(),
            run_id: self.run_id.clone(),
            nonce,
        };
        vec![(conn, ServerMsg::Challenge(challenge))]
    }

    /// The client's hello: admits it (a welcome, and for a member a job
    /// event) or rejects it (the IO layer sends the rejection, then closes).
    pub(crate) fn handle_hello(&mut self, conn: ConnId, hello: Hello, now: Instant) -> Outbox {
        let Some(Conn::Greeted { nonce }) = self.conns.get(&conn) else {
            return Outbox::new();
        };
        let nonce = *nonce;
        match self.admit(&hello, &nonce, now) {
            Err(reason) => {
                tracing::warn!(host = %hello.host, pid = hello.pid, rank = ?hello.rank, ?reason, "store refused a connection");
                self.conns.remove(&conn);
                vec![(conn, ServerMsg::Reject(reason))]
            }
            Ok(server_mac) => {
                let mut out = vec![(conn, ServerMsg::Welcome(Welcome { server_mac }))];
                self.register(conn, hello, now, &mut out);
                out
            }
        }
    }

    /// Checks a hello; answers the server's proof of the token, if any.
    fn admit(&self, hello: &Hello, nonce: &[u8; 32], now: Instant) -> Result<Option<[u8; 32]>, WireError> {
        if hello.magic != MAGIC {
            return Err(WireError::Protocol { detail: "the hello has the wrong magic".into() });
        }
        if hello.protocol_version != PROTOCOL_VERSION {
            return Err(version_mismatch(hello));
        }
        self.check_run(hello)?;
        let server_mac = self.check_token(hello, nonce)?;
        self.check_rank(hello, now)?;
        Ok(server_mac)
    }

    fn check_run(&self, hello: &Hello) -> Result<(), WireError> {
        let any = self.run_id == "*" || (hello.role == Role::Tool && hello.run_id == "*");
        if any || hello.run_id == self.run_id {
            return Ok(());
        }
        Err(WireError::ForeignRun { store_run: self.run_id.clone(), client_run: hello.run_id.clone() })
    }

    fn check_token(&self, hello: &Hello, nonce: &[u8; 32]) -> Result<Option<[u8; 32]>, WireError> {
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
        Err(WireError::AuthFailed { detail: format!("{detail} ({} pid {})", hello.host, hello.pid) })
    }

    fn check_rank(&self, hello: &Hello, now: Instant) -> Result<(), WireError> {
        if let (Some(rank), Some(world)) = (hello.rank, hello.world_size) {
            if rank >= world {
                return Err(rank_invalid(format!("rank {rank} is not below the world size {world}")));
            }
        }
        if hello.role != Role::Member {
            return Ok(());
        }
        let Some(rank) = hello.rank else {
            return Err(rank_invalid("a member connection must name its rank".into()));
        };
        match self.ranks.get(&rank) {
            None => Ok(()),
            Some(first) => Err(WireError::DuplicateRank {
                rank,
                first: first.describe(now),
                second: format!("{} pid {}", hello.host, hello.pid),
            }),
        }
    }

    /// Records an admitted connection; a member's arrival is a job event.
    fn register(&mut self, conn: ConnId, hello: Hello, now: Instant, out: &mut Outbox) {
        let member_of = (hello.role == Role::Member).then_some(hello.rank).flatten();
        self.conns.insert(conn, Conn::Ready { member_of });
        let Some(rank) = member_of else {
            return;
        };
        tracing::info!(rank, host = %hello.host, pid = hello.pid, version = %hello.library_version, "rank connected");
        let entry = RankEntry {
            liveness: Liveness::Connected,
            host: hello.host,
            pid: hello.pid,
            version: hello.library_version,
            world_size: hello.world_size,
            changed: now,
            heartbeat: None,
        };
        self.ranks.insert(rank, entry);
        self.bump(now, out);
    }

    pub(super) fn is_ready(&self, conn: ConnId) -> bool {
        matches!(self.conns.get(&conn), Some(Conn::Ready { .. }))
    }

    fn member_of(&self, conn: ConnId) -> Option<u32> {
        match self.conns.get(&conn)? {
            Conn::Ready { member_of } => *member_of,
            Conn::Greeted { .. } => None,
        }
    }

    /// A connection closed, cleanly or not: a member that did not leave vanished.
    pub(crate) fn connection_closed(&mut self, conn: ConnId, now: Instant) -> Outbox {
        let mut out = Outbox::new();
        self.waiters.remove_conn(conn);
        let member_of = self.member_of(conn);
        self.conns.remove(&conn);
        if let Some(rank) = member_of {
            self.change(rank, Liveness::Vanished, now, &mut out);
        }
        out
    }

    pub(super) fn leave(&mut self, conn: ConnId, now: Instant, out: &mut Outbox) -> Response {
        let Some(rank) = self.member_of(conn) else {
            return invalid("leave", "only a rank's member connection can leave the job".into());
        };
        self.conns.insert(conn, Conn::Ready { member_of: None });
        self.change(rank, Liveness::Left, now, out);
        Response::Ok
    }

    pub(super) fn heartbeat(&mut self, caller: Caller, payload: Vec<u8>) -> Response {
        if payload.len() > MAX_HEARTBEAT {
            return invalid("heartbeat", format!("{} bytes is over the {MAX_HEARTBEAT}-byte limit", payload.len()));
        }
        let entry = self.member_of(caller.conn).and_then(|r| self.ranks.get_mut(&r));
        let Some(entry) = entry else {
            return invalid("heartbeat", "only a rank's member connection sends heartbeats".into());
        };
        entry.heartbeat = Some((caller.now, payload));
        Response::Ok
    }

    fn change(&mut self, rank: u32, liveness: Liveness, now: Instant, out: &mut Outbox) {
        let Some(entry) = self.ranks.get_mut(&rank) else {
            return;
        };
        if entry.liveness != Liveness::Connected {
            return;
        }
        match liveness {
            Liveness::Vanished => {
                tracing::warn!(rank, host = %entry.host, pid = entry.pid, "rank vanished without leaving")
            }
            _ => tracing::info!(rank, host = %entry.host, pid = entry.pid, "rank left"),
        }
        entry.liveness = liveness;
        entry.changed = now;
        self.bump(now, out);
    }
}

fn rank_invalid(detail: String) -> WireError {
    WireError::InvalidArgument { what: "rank".into(), detail }
}

fn version_mismatch(hello: &Hello) -> WireError {
    let who = match hello.host.is_empty() {
        true => "the connecting process".to_string(),
        false => format!("{} pid {}", hello.host, hello.pid),
    };
    WireError::VersionMismatch {
        detail: format!(
            "the store speaks store protocol {PROTOCOL_VERSION} and {who} protocol {}",
            hello.protocol_version
        ),
        versions: vec![("the store".into(), VERSION.to_string()), (who, hello.library_version.clone())],
    }
}
