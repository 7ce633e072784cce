//! The messages of the store protocol and their encodings.
//!
//! A connection starts with the server's [`Challenge`], the client's
//! [`ClientHello`] and the server's [`Welcome`] (or [`WireError`] rejection); after
//! that the client sends [`Request`]s, each tagged with an id that the
//! matching [`Response`] echoes. Ids let a client that gave up on a wait
//! (deadline, abort) skip the late answer instead of mistaking it for the
//! answer to its next request.

use super::wire::{Dec, Enc};
use super::{CodecError, MAX_ITEMS, MAX_KEY, MAX_TEXT, MAX_VALUE};
use crate::job::{JobChanges, JobStatus, Presence, RankStatus, Role};
use ringleader_core::Error;
use std::time::Duration;

/// The server's first message. `magic`, `protocol_version` and
/// `library_version` come first in every protocol version, so that peers of
/// different versions can always name the mismatch. It says nothing about
/// the runs the store serves: whoever connects gets it before proving
/// anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Challenge {
    pub(crate) magic: u32,
    pub(crate) protocol_version: u16,
    pub(crate) library_version: String,
    pub(crate) nonce: [u8; 32],
}

/// The client's answer to the challenge: who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientHello {
    pub(crate) magic: u32,
    pub(crate) protocol_version: u16,
    pub(crate) library_version: String,
    pub(crate) run_id: String,
    pub(crate) role: Role,
    pub(crate) rank: Option<u32>,
    pub(crate) world_size: Option<u32>,
    pub(crate) host: String,
    pub(crate) pid: u32,
    pub(crate) client_nonce: [u8; 32],
    /// HMAC over the nonces and identity, when the client has a token.
    pub(crate) mac: Option<[u8; 32]>,
}

/// The server accepted the hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Welcome {
    /// HMAC proving the server knows the token, when it has one.
    pub(crate) server_mac: Option<[u8; 32]>,
}

/// A refusal decided by the server, with the fields the client needs to
/// rebuild the same [`ringleader_core::Error`] variant (the client adds the
/// address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WireError {
    VersionMismatch {
        detail: String,
        versions: Vec<(String, String)>,
    },
    ForeignRun {
        store_run: String,
        client_run: String,
    },
    AuthFailed {
        detail: String,
    },
    DuplicateRank {
        rank: u32,
        first: String,
        second: String,
    },
    InvalidArgument {
        what: String,
        detail: String,
    },
    /// Anything else the client could not have prevented.
    Protocol {
        detail: String,
    },
    /// The store cannot take this connection now (too many connections, too
    /// many runs); trying again later may succeed.
    Busy {
        detail: String,
    },
}

/// One store operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    Set {
        key: String,
        value: Vec<u8>,
    },
    Get {
        key: String,
        timeout: Duration,
    },
    TryGet {
        key: String,
    },
    Add {
        key: String,
        delta: i64,
    },
    CompareSet {
        key: String,
        expected: Option<Vec<u8>>,
        desired: Vec<u8>,
    },
    Wait {
        keys: Vec<String>,
        timeout: Duration,
    },
    Check {
        keys: Vec<String>,
    },
    Delete {
        key: String,
    },
    NumKeys,
    MultiGet {
        keys: Vec<String>,
        timeout: Duration,
    },
    MultiSet {
        pairs: Vec<(String, Vec<u8>)>,
    },
    Append {
        key: String,
        value: Vec<u8>,
    },
    KeysWithPrefix {
        prefix: String,
    },
    Heartbeat {
        payload: Vec<u8>,
    },
    Leave,
    AbortJob {
        record: Vec<u8>,
    },
    Status {
        since: Option<u64>,
        timeout: Duration,
    },
    /// The ranks whose liveness changed after generation `since` (and the
    /// abort record, if set after it), parked until there is one.
    Changes {
        since: u64,
        timeout: Duration,
    },
    /// The store's wall clock, for a client measuring its clock's offset.
    /// Empty on the wire: the server's connection task stamps
    /// `received_ns` (nanoseconds since the Unix epoch) as the request
    /// arrives, so the state machine answers it without reading a clock.
    Clock {
        received_ns: u64,
    },
}

/// The answer to one [`Request`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Response {
    Ok,
    Value(Vec<u8>),
    MaybeValue(Option<Vec<u8>>),
    Int(i64),
    Bool(bool),
    Count(u64),
    Values(Vec<Vec<u8>>),
    Keys(Vec<String>),
    Status(JobStatus),
    Changes(JobChanges),
    /// A wait expired; these keys were still missing.
    Timeout {
        missing: Vec<String>,
    },
    Error(WireError),
}

/// Everything a client sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClientMsg {
    Hello(ClientHello),
    Request { id: u64, req: Request },
}

/// Everything a server sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ServerMsg {
    Challenge(Challenge),
    Welcome(Welcome),
    Reject(WireError),
    Response { id: u64, resp: Response },
}

pub(crate) const TAG_HELLO: u8 = 0x01;
const TAG_REQUEST: u8 = 0x02;
pub(crate) const TAG_CHALLENGE: u8 = 0x81;
const TAG_WELCOME: u8 = 0x82;
const TAG_REJECT: u8 = 0x83;
const TAG_RESPONSE: u8 = 0x84;

type R<T> = Result<T, CodecError>;

impl ClientMsg {
    pub(crate) fn encode(&self, e: &mut Enc<'_>) -> R<()> {
        match self {
            ClientMsg::Hello(h) => {
                e.u8(TAG_HELLO)?;
                h.encode(e)
            }
            ClientMsg::Request { id, req } => Self::encode_request(e, *id, req),
        }
    }

    pub(crate) fn encode_request(e: &mut Enc<'_>, id: u64, req: &Request) -> R<()> {
        e.u8(TAG_REQUEST)?;
        e.u64(id)?;
        req.encode(e)
    }

    pub(crate) fn decode(d: &mut Dec<'_>) -> R<Self> {
        match d.u8("message tag")? {
            TAG_HELLO => Ok(ClientMsg::Hello(ClientHello::decode(d)?)),
            TAG_REQUEST => Ok(ClientMsg::Request { id: d.u64("request id")?, req: Request::decode(d)? }),
            tag => Err(CodecError::UnknownTag { what: "client message", tag }),
        }
    }
}

impl ServerMsg {
    pub(crate) fn encode(&self, e: &mut Enc<'_>) -> R<()> {
        match self {
            ServerMsg::Challenge(c) => {
                e.u8(TAG_CHALLENGE)?;
                c.encode(e)
            }
            ServerMsg::Welcome(w) => {
                e.u8(TAG_WELCOME)?;
                e.opt(w.server_mac.as_ref(), |e, m| e.array32(m))
            }
            ServerMsg::Reject(w) => {
                e.u8(TAG_REJECT)?;
                w.encode(e)
            }
            ServerMsg::Response { id, resp } => {
                e.u8(TAG_RESPONSE)?;
                e.u64(*id)?;
                resp.encode(e)
            }
        }
    }

    pub(crate) fn decode(d: &mut Dec<'_>) -> R<Self> {
        match d.u8("message tag")? {
            TAG_CHALLENGE => Ok(ServerMsg::Challenge(Challenge::decode(d)?)),
            TAG_WELCOME => {
                Ok(ServerMsg::Welcome(Welcome { server_mac: d.opt("server mac", |d| d.array32("server mac"))? }))
            }
            TAG_REJECT => Ok(ServerMsg::Reject(WireError::decode(d)?)),
            TAG_RESPONSE => Ok(ServerMsg::Response { id: d.u64("request id")?, resp: Response::decode(d)? }),
            tag => Err(CodecError::UnknownTag { what: "server message", tag }),
        }
    }
}

impl Challenge {
    fn encode(&self, e: &mut Enc<'_>) -> R<()> {
        e.u32(self.magic)?;
        e.u16(self.protocol_version)?;
        e.str("library version", &self.library_version, MAX_TEXT)?;
        e.array32(&self.nonce)?;
        Ok(())
    }

    pub(crate) fn decode(d: &mut Dec<'_>) -> R<Self> {
        Ok(Challenge {
            magic: d.u32("magic")?,
            protocol_version: d.u16("protocol version")?,
            library_version: d.string("library version", MAX_TEXT)?,
            nonce: d.array32("nonce")?,
        })
    }

    /// Reads only the fields every protocol version shares, for a server of
    /// another version: the rest of its challenge may be laid out differently.
    pub(crate) fn decode_foreign(d: &mut Dec<'_>) -> R<Self> {
        let challenge = Challenge {
            magic: d.u32("magic")?,
            protocol_version: d.u16("protocol version")?,
            library_version: d.string("library version", MAX_TEXT).unwrap_or_else(|_| "an unknown version".into()),
            nonce: [0; 32],
        };
        d.skip_rest();
        Ok(challenge)
    }
}

impl ClientHello {
    /// Like [`Challenge::decode_foreign`]: only the shared leading fields.
    pub(crate) fn decode_foreign(d: &mut Dec<'_>) -> R<Self> {
        let hello = ClientHello {
            magic: d.u32("magic")?,
            protocol_version: d.u16("protocol version")?,
            library_version: d.string("library version", MAX_TEXT).unwrap_or_else(|_| "an unknown version".into()),
            run_id: String::new(),
            role: Role::Tool,
            rank: None,
            world_size: None,
            host: String::new(),
            pid: 0,
            client_nonce: [0; 32],
            mac: None,
        };
        d.skip_rest();
        Ok(hello)
    }

    fn encode(&self, e: &mut Enc<'_>) -> R<()> {
        e.u32(self.magic)?;
        e.u16(self.protocol_version)?;
        e.str("library version", &self.library_version, MAX_TEXT)?;
        e.str("run id", &self.run_id, MAX_TEXT)?;
        e.u8(self.role.code())?;
        e.opt(self.rank.as_ref(), |e, r| e.u32(*r))?;
        e.opt(self.world_size.as_ref(), |e, w| e.u32(*w))?;
        e.str("host", &self.host, MAX_TEXT)?;
        e.u32(self.pid)?;
        e.array32(&self.client_nonce)?;
        e.opt(self.mac.as_ref(), |e, m| e.array32(m))
    }

    pub(crate) fn decode(d: &mut Dec<'_>) -> R<Self> {
        Ok(ClientHello {
            magic: d.u32("magic")?,
            protocol_version: d.u16("protocol version")?,
            library_version: d.string("library version", MAX_TEXT)?,
            run_id: d.string("run id", MAX_TEXT)?,
            role: decode_role(d)?,
            rank: d.opt("rank", |d| d.u32("rank"))?,
            world_size: d.opt("world size", |d| d.u32("world size"))?,
            host: d.string("host", MAX_TEXT)?,
            pid: d.u32("pid")?,
            client_nonce: d.array32("client nonce")?,
            mac: d.opt("mac", |d| d.array32("mac"))?,
        })
    }
}

fn decode_role(d: &mut Dec<'_>) -> R<Role> {
    let tag = d.u8("role")?;
    Role::from_code(tag).ok_or(CodecError::UnknownTag { what: "role", tag })
}

impl WireError {
    fn encode(&self, e: &mut Enc<'_>) -> R<()> {
        match self {
            WireError::VersionMismatch { detail, versions } => {
                e.u8(1)?;
                e.str("detail", detail, MAX_TEXT)?;
                e.list("versions", versions, MAX_ITEMS, |e, (who, v)| {
                    e.str("who", who, MAX_TEXT)?;
                    e.str("version", v, MAX_TEXT)
                })
            }
            WireError::ForeignRun { store_run, client_run } => {
                e.u8(2)?;
                e.str("run id", store_run, MAX_TEXT)?;
                e.str("run id", client_run, MAX_TEXT)
            }
            WireError::AuthFailed { detail } => {
                e.u8(3)?;
                e.str("detail", detail, MAX_TEXT)
            }
            WireError::DuplicateRank { rank, first, second } => {
                e.u8(4)?;
                e.u32(*rank)?;
                e.str("first", first, MAX_TEXT)?;
                e.str("second", second, MAX_TEXT)
            }
            WireError::InvalidArgument { what, detail } => {
                e.u8(5)?;
                e.str("what", what, MAX_TEXT)?;
                e.str("detail", detail, MAX_TEXT)
            }
            WireError::Protocol { detail } => {
                e.u8(6)?;
                e.str("detail", detail, MAX_TEXT)
            }
            WireError::Busy { detail } => {
                e.u8(7)?;
                e.str("detail", detail, MAX_TEXT)
            }
        }
    }

    fn decode(d: &mut Dec<'_>) -> R<Self> {
        let text = |d: &mut Dec<'_>, what| d.string(what, MAX_TEXT);
        Ok(match d.u8("error kind")? {
            1 => WireError::VersionMismatch {
                detail: text(d, "detail")?,
                versions: d.list("versions", MAX_ITEMS, |d| Ok((text(d, "who")?, text(d, "version")?)))?,
            },
            2 => WireError::ForeignRun { store_run: text(d, "run id")?, client_run: text(d, "run id")? },
            3 => WireError::AuthFailed { detail: text(d, "detail")? },
            4 => {
                WireError::DuplicateRank { rank: d.u32("rank")?, first: text(d, "first")?, second: text(d, "second")? }
            }
            5 => WireError::InvalidArgument { what: text(d, "what")?, detail: text(d, "detail")? },
            6 => WireError::Protocol { detail: text(d, "detail")? },
            7 => WireError::Busy { detail: text(d, "detail")? },
            tag => return Err(CodecError::UnknownTag { what: "error kind", tag }),
        })
    }

    /// The core error this refusal stands for, as seen by a client of the
    /// store at `addr` whose own run id is `our_run`.
    pub(crate) fn into_error(self, addr: &str) -> Error {
        let addr = addr.to_string();
        match self {
            WireError::VersionMismatch { detail, versions } => Error::VersionMismatch { detail, versions },
            WireError::ForeignRun { store_run, client_run } => {
                Error::ForeignRun { addr, ours: client_run, theirs: store_run }
            }
            WireError::AuthFailed { detail } => Error::AuthFailed { addr, detail },
            WireError::DuplicateRank { rank, first, second } => {
                Error::DuplicateRank { rank: rank as usize, first, second }
            }
            WireError::InvalidArgument { what, detail } => Error::InvalidArgument { what, detail },
            WireError::Protocol { detail } | WireError::Busy { detail } => Error::StoreProtocol { addr, detail },
        }
    }
}

impl Request {
    /// The operation's name, for messages and logs.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Request::Set { .. } => "set",
            Request::Get { .. } => "get",
            Request::TryGet { .. } => "try_get",
            Request::Add { .. } => "add",
            Request::CompareSet { .. } => "compare_set",
            Request::Wait { .. } => "wait",
            Request::Check { .. } => "check",
            Request::Delete { .. } => "delete",
            Request::NumKeys => "num_keys",
            Request::MultiGet { .. } => "multi_get",
            Request::MultiSet { .. } => "multi_set",
            Request::Append { .. } => "append",
            Request::KeysWithPrefix { .. } => "keys_with_prefix",
            Request::Heartbeat { .. } => "heartbeat",
            Request::Leave => "leave",
            Request::AbortJob { .. } => "abort_job",
            Request::Status { .. } => "status",
            Request::Changes { .. } => "changes",
            Request::Clock { .. } => "clock",
        }
    }

    /// The keys the request is about (for timeout errors); keyless
    /// operations name themselves in parentheses.
    pub(crate) fn keys(&self) -> Vec<String> {
        match self {
            Request::Set { key, .. }
            | Request::Get { key, .. }
            | Request::TryGet { key }
            | Request::Add { key, .. }
            | Request::CompareSet { key, .. }
            | Request::Delete { key }
            | Request::Append { key, .. } => vec![key.clone()],
            Request::Wait { keys, .. } | Request::Check { keys } | Request::MultiGet { keys, .. } => keys.clone(),
            Request::MultiSet { pairs } => pairs.iter().map(|(k, _)| k.clone()).collect(),
            _ => vec![format!("({})", self.name())],
        }
    }

    fn encode(&self, e: &mut Enc<'_>) -> R<()> {
        match self {
            Request::Set { key, value } => tagged(e, 1, |e| key_value(e, key, value)),
            Request::Get { key, timeout } => tagged(e, 2, |e| {
                e.str("key", key, MAX_KEY)?;
                e.duration(*timeout)
            }),
            Request::TryGet { key } => tagged(e, 3, |e| e.str("key", key, MAX_KEY)),
            Request::Add { key, delta } => tagged(e, 4, |e| {
                e.str("key", key, MAX_KEY)?;
                e.i64(*delta)
            }),
            Request::CompareSet { key, expected, desired } => tagged(e, 5, |e| {
                e.str("key", key, MAX_KEY)?;
                e.opt(expected.as_deref(), |e, v| e.bytes("value", v, MAX_VALUE))?;
                e.bytes("value", desired, MAX_VALUE)
            }),
            Request::Wait { keys, timeout } => tagged(e, 6, |e| keys_timeout(e, keys, *timeout)),
            Request::Check { keys } => tagged(e, 7, |e| key_list(e, keys)),
            Request::Delete { key } => tagged(e, 8, |e| e.str("key", key, MAX_KEY)),
            Request::NumKeys => tagged(e, 9, |_| Ok(())),
            Request::MultiGet { keys, timeout } => tagged(e, 10, |e| keys_timeout(e, keys, *timeout)),
            Request::MultiSet { pairs } => {
                tagged(e, 11, |e| e.list("keys", pairs, MAX_ITEMS, |e, (k, v)| key_value(e, k, v)))
            }
            Request::Append { key, value } => tagged(e, 12, |e| key_value(e, key, value)),
            Request::KeysWithPrefix { prefix } => tagged(e, 13, |e| e.str("key", prefix, MAX_KEY)),
            Request::Heartbeat { payload } => tagged(e, 14, |e| e.bytes("value", payload, MAX_VALUE)),
            Request::Leave => tagged(e, 15, |_| Ok(())),
            Request::AbortJob { record } => tagged(e, 16, |e| e.bytes("value", record, MAX_VALUE)),
            Request::Status { since, timeout } => tagged(e, 17, |e| {
                e.opt(since.as_ref(), |e, g| e.u64(*g))?;
                e.duration(*timeout)
            }),
            Request::Changes { since, timeout } => tagged(e, 18, |e| {
                e.u64(*since)?;
                e.duration(*timeout)
            }),
            Request::Clock { .. } => tagged(e, 19, |_| Ok(())),
        }
    }

    fn decode(d: &mut Dec<'_>) -> R<Self> {
        let key = |d: &mut Dec<'_>| d.string("key", MAX_KEY);
        let value = |d: &mut Dec<'_>| d.bytes("value", MAX_VALUE);
        let keys = |d: &mut Dec<'_>| d.list("keys", MAX_ITEMS, key);
        Ok(match d.u8("request tag")? {
            1 => Request::Set { key: key(d)?, value: value(d)? },
            2 => Request::Get { key: key(d)?, timeout: d.duration("timeout")? },
            3 => Request::TryGet { key: key(d)? },
            4 => Request::Add { key: key(d)?, delta: d.i64("delta")? },
            5 => Request::CompareSet { key: key(d)?, expected: d.opt("expected", value)?, desired: value(d)? },
            6 => Request::Wait { keys: keys(d)?, timeout: d.duration("timeout")? },
            7 => Request::Check { keys: keys(d)? },
            8 => Request::Delete { key: key(d)? },
            9 => Request::NumKeys,
            10 => Request::MultiGet { keys: keys(d)?, timeout: d.duration("timeout")? },
            11 => Request::MultiSet { pairs: d.list("keys", MAX_ITEMS, |d| Ok((key(d)?, value(d)?)))? },
            12 => Request::Append { key: key(d)?, value: value(d)? },
            13 => Request::KeysWithPrefix { prefix: key(d)? },
            14 => Request::Heartbeat { payload: value(d)? },
            15 => Request::Leave,
            16 => Request::AbortJob { record: value(d)? },
            17 => Request::Status {
                since: d.opt("generation", |d| d.u64("generation"))?,
                timeout: d.duration("timeout")?,
            },
            18 => Request::Changes { since: d.u64("generation")?, timeout: d.duration("timeout")? },
            19 => Request::Clock { received_ns: 0 },
            tag => return Err(CodecError::UnknownTag { what: "request", tag }),
        })
    }
}

fn tagged(e: &mut Enc<'_>, tag: u8, body: impl FnOnce(&mut Enc<'_>) -> R<()>) -> R<()> {
    e.u8(tag)?;
    body(e)
}

fn key_value(e: &mut Enc<'_>, key: &str, value: &[u8]) -> R<()> {
    e.str("key", key, MAX_KEY)?;
    e.bytes("value", value, MAX_VALUE)
}

fn key_list(e: &mut Enc<'_>, keys: &[String]) -> R<()> {
    e.list("keys", keys, MAX_ITEMS, |e, k| e.str("key", k, MAX_KEY))
}

fn keys_timeout(e: &mut Enc<'_>, keys: &[String], timeout: Duration) -> R<()> {
    key_list(e, keys)?;
    e.duration(timeout)?;
    Ok(())
}

impl Response {
    fn encode(&self, e: &mut Enc<'_>) -> R<()> {
        match self {
            Response::Ok => tagged(e, 1, |_| Ok(())),
            Response::Value(v) => tagged(e, 2, |e| e.bytes("value", v, MAX_VALUE)),
            Response::MaybeValue(v) => tagged(e, 3, |e| e.opt(v.as_deref(), |e, v| e.bytes("value", v, MAX_VALUE))),
            Response::Int(i) => tagged(e, 4, |e| e.i64(*i)),
            Response::Bool(b) => tagged(e, 5, |e| e.bool(*b)),
            Response::Count(n) => tagged(e, 6, |e| e.u64(*n)),
            Response::Values(vs) => {
                tagged(e, 7, |e| e.list("values", vs, MAX_ITEMS, |e, v| e.bytes("value", v, MAX_VALUE)))
            }
            Response::Keys(ks) => tagged(e, 8, |e| key_list(e, ks)),
            Response::Status(s) => tagged(e, 9, |e| encode_status(e, s)),
            Response::Timeout { missing } => tagged(e, 10, |e| key_list(e, missing)),
            Response::Error(w) => tagged(e, 11, |e| w.encode(e)),
            Response::Changes(c) => tagged(e, 12, |e| {
                e.u64(c.generation)?;
                e.list("ranks", &c.ranks, MAX_ITEMS, encode_rank_status)?;
                e.opt(c.abort.as_deref(), |e, a| e.bytes("abort record", a, MAX_VALUE))?;
                e.bool(c.more)
            }),
        }
    }

    fn decode(d: &mut Dec<'_>) -> R<Self> {
        let value = |d: &mut Dec<'_>| d.bytes("value", MAX_VALUE);
        let keys = |d: &mut Dec<'_>| d.list("keys", MAX_ITEMS, |d| d.string("key", MAX_KEY));
        Ok(match d.u8("response tag")? {
            1 => Response::Ok,
            2 => Response::Value(value(d)?),
            3 => Response::MaybeValue(d.opt("value", value)?),
            4 => Response::Int(d.i64("integer")?),
            5 => Response::Bool(d.bool("boolean")?),
            6 => Response::Count(d.u64("count")?),
            7 => Response::Values(d.list("values", MAX_ITEMS, value)?),
            8 => Response::Keys(keys(d)?),
            9 => Response::Status(decode_status(d)?),
            10 => Response::Timeout { missing: keys(d)? },
            11 => Response::Error(WireError::decode(d)?),
            12 => Response::Changes(JobChanges {
                generation: d.u64("generation")?,
                ranks: d.list("ranks", MAX_ITEMS, decode_rank_status)?,
                abort: d.opt("abort record", |d| d.bytes("abort record", MAX_VALUE))?,
                more: d.bool("more")?,
            }),
            tag => return Err(CodecError::UnknownTag { what: "response", tag }),
        })
    }
}

fn encode_status(e: &mut Enc<'_>, s: &JobStatus) -> R<()> {
    e.u64(s.generation)?;
    e.list("ranks", &s.ranks, MAX_ITEMS, encode_rank_status)?;
    e.opt(s.abort.as_deref(), |e, a| e.bytes("abort record", a, MAX_VALUE))
}

fn encode_rank_status(e: &mut Enc<'_>, r: &RankStatus) -> R<()> {
    let rank = u32::try_from(r.rank).map_err(|_| CodecError::TooLarge {
        what: "rank",
        len: r.rank,
        max: u32::MAX as usize,
    })?;
    e.u32(rank)?;
    e.u8(r.liveness.code())?;
    e.str("host", &r.host, MAX_TEXT)?;
    e.u32(r.pid)?;
    e.str("library version", &r.version, MAX_TEXT)?;
    e.opt(r.world_size.as_ref(), |e, w| e.u32(*w as u32))?;
    e.duration(r.since_change)?;
    e.opt(r.heartbeat_age.as_ref(), |e, a| e.duration(*a))?;
    e.bytes("heartbeat", &r.heartbeat, MAX_VALUE)
}

fn decode_status(d: &mut Dec<'_>) -> R<JobStatus> {
    Ok(JobStatus {
        generation: d.u64("generation")?,
        ranks: d.list("ranks", MAX_ITEMS, decode_rank_status)?,
        abort: d.opt("abort record", |d| d.bytes("abort record", MAX_VALUE))?,
    })
}

fn decode_rank_status(d: &mut Dec<'_>) -> R<RankStatus> {
    Ok(RankStatus {
        rank: d.u32("rank")? as usize,
        liveness: {
            let tag = d.u8("liveness")?;
            Presence::from_code(tag).ok_or(CodecError::UnknownTag { what: "liveness", tag })?
        },
        host: d.string("host", MAX_TEXT)?,
        pid: d.u32("pid")?,
        version: d.string("library version", MAX_TEXT)?,
        world_size: d.opt("world size", |d| d.u32("world size"))?.map(|w| w as usize),
        since_change: d.duration("age")?,
        heartbeat_age: d.opt("heartbeat age", |d| d.duration("heartbeat age"))?,
        heartbeat: d.bytes("heartbeat", MAX_VALUE)?,
    })
}
