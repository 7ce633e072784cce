//! The server without sockets: a synthetic clock (`at(ms)`) drives expiry.

use super::membership::{MAX_HEARTBEAT, MAX_HOST, MAX_WORLD};
use super::*;
use crate::auth::Transcript;
use crate::codec::{ClientHello, Request, Welcome, MAGIC, PROTOCOL_VERSION};
use crate::job::{JobStatus, Presence, Role};
use std::time::Duration;

struct Harness {
    state: ServerState,
    t0: Instant,
    next_conn: u64,
}

fn hello(role: Role, rank: Option<u32>, pid: u32) -> ClientHello {
    ClientHello {
        magic: MAGIC,
        protocol_version: PROTOCOL_VERSION,
        library_version: "0.1.0".into(),
        run_id: "job".into(),
        role,
        rank,
        world_size: rank.map(|_| 4),
        host: "node-a".into(),
        pid,
        client_nonce: [5; 32],
        mac: None,
    }
}

impl Harness {
    fn new() -> Self {
        Self::with(ServerState::new("job", None, Limits::default()))
    }

    fn with(state: ServerState) -> Self {
        Harness { state, t0: Instant::now(), next_conn: 0 }
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    /// Opens a connection and sends `hello`; answers the connection, the
    /// server's reply to it, and the rest of the output.
    fn open(&mut self, mut hello: ClientHello, token: Option<&str>, ms: u64) -> (ConnId, ServerMsg, Outbox) {
        self.next_conn += 1;
        let conn = ConnId(self.next_conn);
        let opened = self.state.connection_opened(conn, [self.next_conn as u8; 32], self.at(ms));
        // (Another connection may be closed to make room: not ours.)
        let challenge: Vec<_> = opened.into_iter().filter(|(to, _)| *to == conn).collect();
        let [(to, ServerMsg::Challenge(c))] = &challenge[..] else { panic!("{challenge:?}") };
        assert_eq!(*to, conn);
        if let Some(token) = token {
            hello.mac = Some(transcript(&c.nonce, &hello).client_mac(token));
        }
        let mut out = self.state.handle_hello(conn, hello, self.at(ms));
        let (to, reply) = out.remove(0);
        assert_eq!(to, conn);
        (conn, reply, out)
    }

    fn member(&mut self, rank: u32, pid: u32, ms: u64) -> ConnId {
        let (conn, reply, _) = self.open(hello(Role::Member, Some(rank), pid), None, ms);
        assert!(matches!(reply, ServerMsg::Welcome(_)), "{reply:?}");
        conn
    }

    fn aux(&mut self) -> ConnId {
        let (conn, reply, _) = self.open(hello(Role::Aux, None, 1), None, 0);
        assert!(matches!(reply, ServerMsg::Welcome(_)), "{reply:?}");
        conn
    }

    /// The job of run `job` as seen at `ms`.
    fn status(&self, ms: u64) -> JobStatus {
        self.state.status_of("job", self.at(ms))
    }

    fn send(&mut self, conn: ConnId, id: u64, req: Request, ms: u64) -> Outbox {
        let now = self.at(ms);
        self.state.handle(conn, id, req, now)
    }

    /// Sends a request that must be answered at once, and only that.
    fn ask(&mut self, conn: ConnId, req: Request, ms: u64) -> Response {
        let out = self.send(conn, 1, req, ms);
        answer(&out, conn, 1)
    }
}

fn transcript<'a>(server_nonce: &'a [u8; 32], h: &'a ClientHello) -> Transcript<'a> {
    Transcript { server_nonce, client_nonce: &h.client_nonce, run_id: &h.run_id, role: h.role, rank: h.rank }
}

/// The one message of `out`, which must answer request `id` of `conn`.
fn answer(out: &[(ConnId, ServerMsg)], conn: ConnId, id: u64) -> Response {
    match out {
        [(to, ServerMsg::Response { id: got, resp })] if *to == conn && *got == id => resp.clone(),
        other => panic!("expected one answer to {conn:?}#{id}, got {other:?}"),
    }
}

fn set(key: &str, value: &[u8]) -> Request {
    Request::Set { key: key.into(), value: value.to_vec() }
}

fn get(key: &str, ms: u64) -> Request {
    Request::Get { key: key.into(), timeout: Duration::from_millis(ms) }
}

fn status_since(since: u64, ms: u64) -> Request {
    Request::Status { since: Some(since), timeout: Duration::from_millis(ms) }
}

fn strings(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

#[test]
fn set_then_get_answers_at_once() {
    let mut h = Harness::new();
    let c = h.aux();
    assert_eq!(h.ask(c, set("k", b"v"), 0), Response::Ok);
    assert_eq!(h.ask(c, get("k", 100), 0), Response::Value(b"v".to_vec()));
    assert_eq!(h.state.next_wait(), None);
}

#[test]
fn a_get_waits_until_another_connection_sets_the_key() {
    let mut h = Harness::new();
    let (waiter, setter) = (h.aux(), h.aux());
    assert!(h.send(waiter, 7, get("k", 1000), 0).is_empty());
    let out = h.send(setter, 1, set("k", b"v"), 10);
    assert_eq!(out.len(), 2);
    assert_eq!(answer(&out[..1], setter, 1), Response::Ok);
    assert_eq!(answer(&out[1..], waiter, 7), Response::Value(b"v".to_vec()));
    assert_eq!(h.state.waiting(), 0);
    assert_eq!(h.state.next_wait(), None);
}

#[test]
fn a_wait_expires_on_the_synthetic_clock() {
    let mut h = Harness::new();
    let c = h.aux();
    let req = Request::Wait { keys: strings(&["a", "b"]), timeout: Duration::from_millis(100) };
    assert!(h.send(c, 3, req, 0).is_empty());
    h.ask(c, set("a", b""), 20);
    assert_eq!(h.state.next_wait(), Some(h.at(100)));
    assert!(h.state.handle_timeout(h.at(99)).is_empty());
    let out = h.state.handle_timeout(h.at(100));
    assert_eq!(answer(&out, c, 3), Response::Timeout { missing: strings(&["b"]) });
    assert_eq!((h.state.waiting(), h.state.next_wait()), (0, None));
}

#[test]
fn a_zero_timeout_answers_at_once() {
    let mut h = Harness::new();
    let c = h.aux();
    assert_eq!(h.ask(c, get("k", 0), 0), Response::Timeout { missing: strings(&["k"]) });
}

#[test]
fn waiters_are_woken_by_every_kind_of_write() {
    let writes = [
        set("k", b"1"),
        Request::Add { key: "k".into(), delta: 1 },
        Request::MultiSet { pairs: vec![("x".into(), vec![]), ("k".into(), b"1".to_vec())] },
        Request::Append { key: "k".into(), value: b"1".to_vec() },
        Request::CompareSet { key: "k".into(), expected: None, desired: b"1".to_vec() },
    ];
    for write in writes {
        let mut h = Harness::new();
        let (waiter, writer) = (h.aux(), h.aux());
        assert!(h.send(waiter, 9, get("k", 1000), 0).is_empty());
        let out = h.send(writer, 1, write.clone(), 1);
        assert_eq!(answer(&out[1..], waiter, 9), Response::Value(b"1".to_vec()), "{write:?}");
    }
}

#[test]
fn a_failed_compare_set_wakes_nobody() {
    let mut h = Harness::new();
    let (waiter, writer) = (h.aux(), h.aux());
    h.send(waiter, 9, get("k", 1000), 0);
    let req = Request::CompareSet { key: "k".into(), expected: Some(b"x".to_vec()), desired: b"y".to_vec() };
    assert_eq!(h.ask(writer, req, 1), Response::Value(vec![]));
    assert_eq!(h.state.waiting(), 1);
}

#[test]
fn a_multi_key_wait_needs_every_key_at_once() {
    let mut h = Harness::new();
    let (waiter, writer) = (h.aux(), h.aux());
    let req = Request::MultiGet { keys: strings(&["a", "b"]), timeout: Duration::from_secs(1) };
    assert!(h.send(waiter, 4, req, 0).is_empty());
    h.ask(writer, set("a", b"A"), 1);
    h.ask(writer, Request::Delete { key: "a".into() }, 2);
    assert_eq!(h.ask(writer, set("b", b"B"), 3), Response::Ok, "a was deleted again");
    let out = h.send(writer, 1, set("a", b"A2"), 4);
    assert_eq!(answer(&out[1..], waiter, 4), Response::Values(vec![b"A2".to_vec(), b"B".to_vec()]));
}

#[test]
fn compare_set_semantics() {
    let mut h = Harness::new();
    let c = h.aux();
    let cas = |expected: Option<&[u8]>, desired: &[u8]| Request::CompareSet {
        key: "k".into(),
        expected: expected.map(<[u8]>::to_vec),
        desired: desired.to_vec(),
    };
    assert_eq!(h.ask(c, cas(Some(b"x"), b"y"), 0), Response::Value(vec![]), "absent, expected a value");
    assert_eq!(h.ask(c, Request::TryGet { key: "k".into() }, 0), Response::MaybeValue(None));
    assert_eq!(h.ask(c, cas(None, b"first"), 0), Response::Value(b"first".to_vec()), "only if absent");
    assert_eq!(h.ask(c, cas(None, b"second"), 0), Response::Value(b"first".to_vec()));
    assert_eq!(h.ask(c, cas(Some(b"other"), b"third"), 0), Response::Value(b"first".to_vec()));
    assert_eq!(h.ask(c, cas(Some(b"first"), b"third"), 0), Response::Value(b"third".to_vec()));
}

#[test]
fn add_counts_in_decimal_ascii_and_refuses_non_numbers() {
    let mut h = Harness::new();
    let c = h.aux();
    let add = |key: &str, delta| Request::Add { key: key.into(), delta };
    assert_eq!(h.ask(c, add("n", 5), 0), Response::Int(5));
    assert_eq!(h.ask(c, add("n", -7), 0), Response::Int(-2));
    assert_eq!(h.ask(c, get("n", 0), 0), Response::Value(b"-2".to_vec()));
    h.ask(c, set("text", b"hello"), 0);
    let Response::Error(WireError::InvalidArgument { what, detail }) = h.ask(c, add("text", 1), 0) else { panic!() };
    assert!(what.contains("text") && detail.contains("not a decimal integer"), "{what}: {detail}");
    h.ask(c, set("big", i64::MAX.to_string().as_bytes()), 0);
    assert!(matches!(h.ask(c, add("big", 1), 0), Response::Error(WireError::InvalidArgument { .. })));
}

#[test]
fn keys_check_delete_and_prefixes() {
    let mut h = Harness::new();
    let c = h.aux();
    for k in ["rank/0", "rank/1", "rankx", "other"] {
        h.ask(c, set(k, b""), 0);
    }
    assert_eq!(h.ask(c, Request::NumKeys, 0), Response::Count(4));
    // The clock's answer is the time its connection stamped on it.
    assert_eq!(h.ask(c, Request::Clock { received_ns: 1_700_000_000_123 }, 0), Response::Count(1_700_000_000_123));
    let prefixed = h.ask(c, Request::KeysWithPrefix { prefix: "rank/".into() }, 0);
    assert_eq!(prefixed, Response::Keys(strings(&["rank/0", "rank/1"])));
    assert_eq!(h.ask(c, Request::Check { keys: strings(&["rank/0", "other"]) }, 0), Response::Bool(true));
    assert_eq!(h.ask(c, Request::Delete { key: "other".into() }, 0), Response::Bool(true));
    assert_eq!(h.ask(c, Request::Delete { key: "other".into() }, 0), Response::Bool(false));
    assert_eq!(h.ask(c, Request::Check { keys: strings(&["rank/0", "other"]) }, 0), Response::Bool(false));
    h.ask(c, Request::Append { key: "log".into(), value: b"a".to_vec() }, 0);
    h.ask(c, Request::Append { key: "log".into(), value: b"b".to_vec() }, 0);
    assert_eq!(h.ask(c, get("log", 0), 0), Response::Value(b"ab".to_vec()));
}

#[test]
fn a_closed_connection_takes_its_waits_along() {
    let mut h = Harness::new();
    let c = h.aux();
    h.send(c, 1, get("k", 1000), 0);
    assert!(h.state.connection_closed(c, h.at(1)).is_empty());
    assert_eq!((h.state.waiting(), h.state.next_wait()), (0, None));
    assert!(h.send(c, 2, Request::NumKeys, 2).is_empty(), "a closed connection is not answered");
}

#[test]
fn requests_before_the_hello_are_dropped() {
    let mut h = Harness::new();
    h.state.connection_opened(ConnId(99), [0; 32], h.at(0));
    assert!(h.send(ConnId(99), 1, Request::NumKeys, 0).is_empty());
}

#[test]
fn members_connect_leave_and_vanish() {
    let mut h = Harness::new();
    let (r0, r1) = (h.member(0, 100, 0), h.member(1, 101, 0));
    let s = h.status(1000);
    assert_eq!((s.generation, s.with(Presence::Connected)), (2, vec![0, 1]));
    assert_eq!(h.ask(r0, Request::Leave, 1000), Response::Ok);
    assert!(h.state.connection_closed(r0, h.at(1100)).is_empty(), "no event: it already left");
    h.state.connection_closed(r1, h.at(2000));
    let s = h.status(3000);
    assert_eq!((s.with(Presence::Left), s.with(Presence::Vanished)), (vec![0], vec![1]));
    let r1 = s.rank(1).unwrap();
    assert_eq!((r1.pid, r1.since_change), (101, Duration::from_secs(1)));
    assert_eq!(s.generation, 4);
}

#[test]
fn a_status_poll_is_woken_by_vanish_leave_and_abort() {
    let mut h = Harness::new();
    let watcher = h.aux();
    let (r0, r1) = (h.member(0, 100, 0), h.member(1, 101, 0));
    let gen = match h.ask(watcher, Request::Status { since: None, timeout: Duration::ZERO }, 0) {
        Response::Status(s) => s.generation,
        other => panic!("{other:?}"),
    };

    assert!(h.send(watcher, 2, status_since(gen, 5000), 10).is_empty());
    let out = h.state.connection_closed(r1, h.at(20));
    let Response::Status(s) = answer(&out, watcher, 2) else { panic!() };
    assert_eq!((s.generation, s.with(Presence::Vanished)), (gen + 1, vec![1]));

    assert!(h.send(watcher, 3, status_since(gen + 1, 5000), 30).is_empty());
    let out = h.send(r0, 1, Request::Leave, 40);
    let Response::Status(s) = answer(&out[1..], watcher, 3) else { panic!() };
    assert_eq!(s.with(Presence::Left), vec![0]);

    assert!(h.send(watcher, 4, status_since(s.generation, 5000), 50).is_empty());
    let out = h.send(r0, 5, Request::AbortJob { record: b"rank 1 died".to_vec() }, 60);
    assert_eq!(answer(&out[..1], r0, 5), Response::Bool(true));
    let Response::Status(s) = answer(&out[1..], watcher, 4) else { panic!() };
    assert_eq!(s.abort.as_deref(), Some(&b"rank 1 died"[..]));
    let again = Request::AbortJob { record: b"second".to_vec() };
    assert_eq!(h.ask(r0, again, 70), Response::Bool(false), "the first record wins");
}

#[test]
fn a_status_poll_times_out_with_the_status_not_an_error() {
    let mut h = Harness::new();
    let c = h.aux();
    h.member(2, 7, 0);
    assert!(h.send(c, 8, status_since(1, 250), 0).is_empty());
    let out = h.state.handle_timeout(h.at(250));
    let Response::Status(s) = answer(&out, c, 8) else { panic!("{out:?}") };
    assert_eq!((s.generation, s.with(Presence::Connected)), (1, vec![2]));
    let Response::Status(_) = h.ask(c, status_since(0, 250), 300) else {
        panic!("an older generation answers at once")
    };
}

#[test]
fn heartbeats_are_aged_by_the_server_clock() {
    let mut h = Harness::new();
    let (member, aux) = (h.member(0, 100, 0), h.aux());
    assert_eq!(h.ask(member, Request::Heartbeat { payload: b"seq 7".to_vec() }, 1000), Response::Ok);
    let r0 = h.status(3500).ranks.remove(0);
    assert_eq!((r0.heartbeat_age, r0.heartbeat), (Some(Duration::from_millis(2500)), b"seq 7".to_vec()));
    let refused = h.ask(aux, Request::Heartbeat { payload: vec![] }, 0);
    assert!(matches!(refused, Response::Error(WireError::InvalidArgument { .. })), "{refused:?}");
    let refused = h.ask(aux, Request::Leave, 0);
    assert!(matches!(refused, Response::Error(WireError::InvalidArgument { .. })), "{refused:?}");
    let big = Request::Heartbeat { payload: vec![0; MAX_HEARTBEAT + 1] };
    assert!(matches!(h.ask(member, big, 0), Response::Error(_)));
}

#[test]
fn a_second_member_for_a_rank_is_refused_naming_both() {
    let mut h = Harness::new();
    let first = h.member(1, 100, 0);
    let (_, reply, _) = h.open(hello(Role::Member, Some(1), 200), None, 0);
    let ServerMsg::Reject(WireError::DuplicateRank { rank, first: a, second: b }) = reply else { panic!("{reply:?}") };
    assert_eq!((rank, a.as_str(), b.as_str()), (1, "node-a pid 100", "node-a pid 200"));

    let (_, reply, _) = h.open(hello(Role::Aux, Some(1), 300), None, 0);
    assert!(matches!(reply, ServerMsg::Welcome(_)), "aux connections of a rank are fine");

    h.state.connection_closed(first, h.at(1000));
    let (_, reply, _) = h.open(hello(Role::Member, Some(1), 400), None, 3000);
    let ServerMsg::Reject(WireError::DuplicateRank { first, .. }) = reply else { panic!("{reply:?}") };
    assert!(first.contains("vanished 2.0 s ago") && first.contains("cannot rejoin"), "{first}");
}

#[test]
fn the_handshake_checks_protocol_run_and_rank() {
    let mut h = Harness::new();
    let mut old = hello(Role::Aux, None, 1);
    old.protocol_version = PROTOCOL_VERSION + 1;
    let (_, reply, _) = h.open(old, None, 0);
    let ServerMsg::Reject(WireError::VersionMismatch { detail, versions }) = reply else { panic!("{reply:?}") };
    assert!(detail.contains(&format!("protocol {}", PROTOCOL_VERSION + 1)), "{detail}");
    assert_eq!(versions[1].1, "0.1.0");

    let mut foreign = hello(Role::Member, Some(0), 1);
    foreign.run_id = "other".into();
    let (_, reply, _) = h.open(foreign, None, 0);
    let expected = WireError::ForeignRun { store_run: "job".into(), client_run: "other".into() };
    assert_eq!(reply, ServerMsg::Reject(expected));

    let (_, reply, _) = h.open(hello(Role::Member, None, 1), None, 0);
    assert!(matches!(reply, ServerMsg::Reject(WireError::InvalidArgument { .. })), "{reply:?}");
    let mut beyond = hello(Role::Member, Some(4), 1);
    beyond.world_size = Some(4);
    let (_, reply, _) = h.open(beyond, None, 0);
    assert!(matches!(reply, ServerMsg::Reject(WireError::InvalidArgument { .. })), "{reply:?}");
    assert_eq!(h.status(0).generation, 0, "refused members are no events");
}

#[test]
fn wildcard_runs() {
    let mut any = Harness::with(ServerState::new("*", None, Limits::default()));
    let mut foreign = hello(Role::Member, Some(0), 1);
    foreign.run_id = "whatever".into();
    assert!(matches!(any.open(foreign, None, 0).1, ServerMsg::Welcome(_)));

    let mut h = Harness::new();
    let mut tool = hello(Role::Tool, None, 1);
    tool.run_id = "*".into();
    assert!(matches!(h.open(tool.clone(), None, 0).1, ServerMsg::Welcome(_)));
    tool.role = Role::Aux;
    let refused = h.open(tool, None, 0).1;
    assert!(
        matches!(&refused, ServerMsg::Reject(WireError::InvalidArgument { what, .. }) if what == "run id"),
        "{refused:?}"
    );
}

#[test]
fn tokens_are_proven_both_ways() {
    let mut h = Harness::with(ServerState::new("job", Some("secret"), Limits::default()));
    let (_, reply, _) = h.open(hello(Role::Aux, None, 1), None, 0);
    assert!(matches!(reply, ServerMsg::Reject(WireError::AuthFailed { .. })), "no token: {reply:?}");
    let (_, reply, _) = h.open(hello(Role::Aux, None, 1), Some("wrong"), 0);
    assert!(matches!(reply, ServerMsg::Reject(WireError::AuthFailed { .. })), "wrong token: {reply:?}");

    let h2 = hello(Role::Member, Some(0), 1);
    let (conn, reply, _) = h.open(h2.clone(), Some("secret"), 0);
    let ServerMsg::Welcome(Welcome { server_mac: Some(mac) }) = reply else { panic!("{reply:?}") };
    let nonce = [conn.0 as u8; 32];
    assert!(transcript(&nonce, &h2).verify_server("secret", &mac));

    let mut open = Harness::new();
    let (_, reply, _) = open.open(hello(Role::Aux, None, 1), Some("secret"), 0);
    assert_eq!(reply, ServerMsg::Welcome(Welcome { server_mac: None }), "the client then refuses the store");
}

// ---- roles ----

fn refused_access(resp: &Response) -> bool {
    matches!(resp, Response::Error(WireError::InvalidArgument { what, .. }) if what == "store access")
}

#[test]
fn tools_read_everything_and_write_only_the_keys_of_launchers_and_tools() {
    let mut h = Harness::new();
    let rank = h.member(0, 100, 0);
    h.ask(rank, set("rl/rank/0", b"me"), 0);
    let (tool, reply, _) = h.open(hello(Role::Tool, None, 7), None, 0);
    assert!(matches!(reply, ServerMsg::Welcome(_)));
    assert_eq!(h.ask(tool, get("rl/rank/0", 0), 0), Response::Value(b"me".to_vec()));
    assert!(matches!(h.ask(tool, status_since(0, 0), 0), Response::Status(_)));
    for write in [
        set("rl/rank/0", b"forged"),
        set("user-key", b""),
        Request::Delete { key: "rl/rank/0".into() },
        Request::MultiSet { pairs: vec![("rl/exit/1".into(), vec![]), ("rl/verdict".into(), vec![])] },
        Request::AbortJob { record: b"stop".to_vec() },
        Request::Heartbeat { payload: vec![] },
        Request::Leave,
    ] {
        assert!(matches!(h.ask(tool, write.clone(), 0), Response::Error(_)), "{write:?}");
    }
    assert_eq!(h.ask(tool, get("rl/rank/0", 0), 0), Response::Value(b"me".to_vec()), "nothing changed");
    assert_eq!(h.ask(tool, set("rl/exit/1", b"killed by signal 9"), 0), Response::Ok);
    assert_eq!(h.ask(tool, Request::Add { key: "rl/dump_request".into(), delta: 1 }, 0), Response::Int(1));
    assert_eq!(h.status(0).abort, None);
}

#[test]
fn a_ranks_helper_writes_as_the_rank_and_other_helpers_stay_out_of_its_keys() {
    let mut h = Harness::new();
    let rank = h.member(1, 100, 0);
    // Same rank, host and pid as the member: that rank's helper.
    let (helper, reply, _) = h.open(hello(Role::Aux, Some(1), 100), None, 0);
    assert!(matches!(reply, ServerMsg::Welcome(_)));
    assert_eq!(h.ask(helper, set("rl/rank/1", b"{}"), 0), Response::Ok);
    // Another process naming rank 1, or no rank: not the rank's.
    let (stranger, _, _) = h.open(hello(Role::Aux, Some(1), 666), None, 0);
    let anonymous = h.aux();
    for c in [stranger, anonymous] {
        assert!(refused_access(&h.ask(c, set("rl/verdict", b"forged"), 0)));
        assert!(refused_access(&h.ask(c, Request::Delete { key: "rl/rank/1".into() }, 0)));
        assert!(refused_access(&h.ask(c, Request::AbortJob { record: b"x".to_vec() }, 0)));
        assert_eq!(h.ask(c, set("my/own", b""), 0), Response::Ok, "keys outside rl/ are anyone's");
        assert_eq!(h.ask(c, set("rl/conflict/1", b"{}"), 0), Response::Ok, "duplicate-rank notes");
    }
    assert_eq!(h.ask(helper, Request::AbortJob { record: b"rank 1 failed".to_vec() }, 0), Response::Bool(true));
    assert!(matches!(h.ask(helper, Request::Heartbeat { payload: vec![] }, 0), Response::Error(_)));
    assert_eq!(h.ask(rank, Request::Heartbeat { payload: vec![] }, 0), Response::Ok);
}

#[test]
fn members_must_name_a_rank_below_a_world_size_in_bounds() {
    let mut h = Harness::new();
    for (rank, world) in [(Some(3), None), (Some(9999), Some(4)), (Some(0), Some(0)), (Some(0), Some(MAX_WORLD + 1))] {
        let mut m = hello(Role::Member, rank, 1);
        m.world_size = world;
        let (_, reply, _) = h.open(m, None, 0);
        assert!(matches!(reply, ServerMsg::Reject(WireError::InvalidArgument { .. })), "{rank:?}/{world:?}: {reply:?}");
    }
    assert!(h.status(0).ranks.is_empty(), "no phantom rank was recorded");
    let mut last = hello(Role::Member, Some(MAX_WORLD - 1), 1);
    last.world_size = Some(MAX_WORLD);
    assert!(matches!(h.open(last, None, 0).1, ServerMsg::Welcome(_)));
}

#[test]
fn oversized_hello_fields_are_refused_by_name() {
    let mut h = Harness::new();
    let mut long_host = hello(Role::Member, Some(0), 1);
    long_host.host = "h".repeat(MAX_HOST + 1);
    let (_, reply, _) = h.open(long_host, None, 0);
    let ServerMsg::Reject(WireError::InvalidArgument { what, detail }) = reply else { panic!("{reply:?}") };
    assert_eq!(what, "host");
    assert!(detail.contains("256 bytes") && detail.contains("255"), "{detail}");
    let mut long_run = hello(Role::Aux, None, 1);
    long_run.run_id = "r".repeat(257);
    let (_, reply, _) = h.open(long_run, None, 0);
    assert!(
        matches!(&reply, ServerMsg::Reject(WireError::InvalidArgument { what, .. }) if what == "run id"),
        "{reply:?}"
    );
    assert!(h.status(0).ranks.is_empty());
}

#[test]
fn strangers_without_the_token_learn_no_run_id() {
    let mut h = Harness::with(ServerState::new("secret-run-7", Some("secret"), Limits::default()));
    let mut probe = hello(Role::Tool, None, 1);
    probe.run_id = "*".into();
    let (conn, reply, _) = h.open(probe.clone(), None, 0);
    let challenge = format!("{:?}", h.state.connection_opened(ConnId(1000), [0; 32], h.at(0)));
    assert!(!challenge.contains("secret-run-7"), "{challenge}");
    assert!(matches!(reply, ServerMsg::Reject(WireError::AuthFailed { .. })), "{reply:?}");
    assert!(!format!("{reply:?}").contains("secret-run-7"));
    // A wrong run id is refused for the token first, not as foreign.
    probe.run_id = "guess".into();
    let (_, reply, _) = h.open(probe, Some("wrong"), 0);
    assert!(matches!(reply, ServerMsg::Reject(WireError::AuthFailed { .. })), "{reply:?}");
    assert!(h.send(conn, 1, Request::NumKeys, 0).is_empty(), "a refused connection gets nothing");
    // With the token, a tool learns it when it names another run.
    let mut tool = hello(Role::Tool, None, 1);
    tool.run_id = "guess".into();
    let (_, reply, _) = h.open(tool, Some("secret"), 0);
    assert!(matches!(reply, ServerMsg::Reject(WireError::ForeignRun { store_run, .. }) if store_run == "secret-run-7"));
}

// ---- budgets ----

fn small(limits: impl FnOnce(&mut Limits)) -> Harness {
    let mut l = Limits::default();
    limits(&mut l);
    Harness::with(ServerState::new("job", None, l))
}

fn error_text(resp: &Response) -> String {
    match resp {
        Response::Error(WireError::InvalidArgument { what, detail }) => format!("{what}: {detail}"),
        other => panic!("not an invalid-argument error: {other:?}"),
    }
}

#[test]
fn a_multi_get_amplification_is_refused_before_the_answer_is_built() {
    let mut h = Harness::new();
    let c = h.aux();
    h.ask(c, set("big", &vec![7; 1 << 20]), 0);
    let (used, queued) = h.state.usage();
    let keys = vec!["big".to_string(); 65536];
    for req in [
        Request::MultiGet { keys: keys.clone(), timeout: Duration::ZERO },
        Request::MultiGet { keys: keys.clone(), timeout: Duration::from_secs(9) },
    ] {
        let text = error_text(&h.ask(c, req, 0));
        assert!(text.contains("frame limit") && text.contains("fewer keys"), "{text}");
    }
    let (used2, queued2) = h.state.usage();
    assert_eq!(used2, used);
    assert!(queued2 - queued < 1024, "only the errors were queued");
    // Parked, then woken by the write: the same check.
    let mut many = keys.clone();
    many.push("late".into());
    assert!(h.send(c, 5, Request::MultiGet { keys: many, timeout: Duration::from_secs(9) }, 0).is_empty());
    let out = h.send(c, 6, set("late", b""), 1);
    assert!(error_text(&answer(&out[1..], c, 5)).contains("frame limit"));
    h.state.check_invariants().unwrap();
}

#[test]
fn answers_queued_for_a_connection_are_bounded_until_written() {
    let mut h = small(|l| l.conn_queued_bytes = 3 << 20);
    let c = h.aux();
    h.ask(c, set("v", &vec![1; 1 << 20]), 0);
    assert!(matches!(h.ask(c, get("v", 0), 0), Response::Value(_)));
    assert!(matches!(h.ask(c, get("v", 0), 0), Response::Value(_)));
    let text = error_text(&h.ask(c, get("v", 0), 0));
    assert!(text.contains("not read yet") && text.contains("per connection"), "{text}");
    // The socket took the first two answers: there is room again.
    let written = 2 * weight(&ServerMsg::Response { id: 0, resp: Response::Value(vec![1; 1 << 20]) });
    h.state.written(c, written);
    assert!(matches!(h.ask(c, get("v", 0), 0), Response::Value(_)));
    h.state.check_invariants().unwrap();
}

#[test]
fn the_memory_budget_refuses_writes_by_name_and_deletes_make_room() {
    let mut h = small(|l| l.run_bytes = 10_000);
    let c = h.aux();
    assert_eq!(h.ask(c, set("a", &[0; 6000]), 0), Response::Ok);
    let text = error_text(&h.ask(c, set("b", &[0; 6000]), 0));
    assert!(text.starts_with("store budget") && text.contains("memory budget of 10000 bytes"), "{text}");
    assert_eq!(h.ask(c, Request::TryGet { key: "b".into() }, 0), Response::MaybeValue(None), "nothing stored");
    let text = error_text(&h.ask(c, Request::Append { key: "a".into(), value: vec![0; 6000] }, 0));
    assert!(text.contains("memory budget"), "{text}");
    assert_eq!(h.ask(c, Request::Delete { key: "a".into() }, 0), Response::Bool(true));
    assert_eq!(h.ask(c, set("b", &[0; 6000]), 0), Response::Ok);
    // Parked waits count too.
    let text =
        error_text(&h.ask(c, Request::Wait { keys: vec!["k".repeat(4000); 1], timeout: Duration::from_secs(1) }, 0));
    assert!(text.contains("memory budget"), "{text}");
    h.state.check_invariants().unwrap();
}

#[test]
fn key_counts_are_capped_per_run_and_per_connection() {
    let mut h = small(|l| {
        l.conn_keys = 3;
        l.run_keys = 5;
    });
    let (a, b) = (h.aux(), h.aux());
    for k in ["a1", "a2", "a3"] {
        assert_eq!(h.ask(a, set(k, b""), 0), Response::Ok);
    }
    assert_eq!(h.ask(a, set("a1", b"overwrite"), 0), Response::Ok, "not a new key");
    let text = error_text(&h.ask(a, set("a4", b""), 0));
    assert!(text.contains("limit of 3 keys per connection"), "{text}");
    // Another connection deletes one of a's keys: a may create one again.
    assert_eq!(h.ask(b, Request::Delete { key: "a2".into() }, 0), Response::Bool(true));
    assert_eq!(h.ask(a, set("a4", b""), 0), Response::Ok);
    let pairs = vec![("b1".to_string(), vec![]), ("b2".to_string(), vec![])];
    assert_eq!(h.ask(b, Request::MultiSet { pairs }, 0), Response::Ok);
    let text = error_text(&h.ask(b, set("b3", b""), 0));
    assert!(text.contains("limit of 5 keys"), "{text}");
    h.state.check_invariants().unwrap();
}

#[test]
fn parked_waits_are_capped_per_connection() {
    let mut h = small(|l| l.conn_waits = 2);
    let c = h.aux();
    assert!(h.send(c, 1, get("x", 1000), 0).is_empty());
    assert!(h.send(c, 2, status_since(0, 1000), 0).is_empty());
    let text = error_text(&h.ask(c, get("y", 1000), 0));
    assert!(text.contains("2 waits parked"), "{text}");
    let other = h.aux();
    assert!(h.send(other, 1, get("y", 1000), 0).is_empty(), "the cap is per connection");
    h.state.check_invariants().unwrap();
}

// ---- connections ----

#[test]
fn silent_connections_are_capped_and_closed_after_the_hello_timeout() {
    let mut h = small(|l| {
        l.pending = 3;
        l.hello_timeout = Duration::from_secs(2);
    });
    let mut evicted = Vec::new();
    for n in 1..=5 {
        let out = h.state.connection_opened(ConnId(100 + n), [0; 32], h.at(n * 10));
        evicted.extend(out.into_iter().filter(|(_, m)| matches!(m, ServerMsg::Reject(WireError::Busy { .. }))));
    }
    let evicted: Vec<ConnId> = evicted.into_iter().map(|(c, _)| c).collect();
    assert_eq!(evicted, [ConnId(101), ConnId(102)], "the oldest go first");
    // A rank still gets in, at once (closing 103, the oldest silent one).
    h.next_conn = 200;
    let rank = h.member(0, 1, 60);
    assert_eq!(h.ask(rank, Request::NumKeys, 60), Response::Count(0));
    assert_eq!(h.state.poll_timeout(), Some(h.at(2040)), "the oldest silent one's deadline");
    let out = h.state.handle_timeout(h.at(2050));
    let closed: Vec<ConnId> = out.iter().map(|(c, _)| *c).collect();
    assert_eq!(closed, [ConnId(104), ConnId(105)]);
    assert!(out
        .iter()
        .all(|(_, m)| matches!(m, ServerMsg::Reject(WireError::Protocol { detail }) if detail.contains("no hello"))));
    h.state.check_invariants().unwrap();
}

#[test]
fn connections_besides_members_follow_the_world_size() {
    let mut h = small(|l| {
        l.conns_floor = 2;
        l.conns_per_rank = 2;
        l.conns_margin = 1;
    });
    h.aux();
    h.aux();
    let (_, reply, _) = h.open(hello(Role::Tool, None, 1), None, 0);
    assert!(
        matches!(&reply, ServerMsg::Reject(WireError::Busy { detail }) if detail.contains("admits 2")),
        "{reply:?}"
    );
    // A member is admitted regardless, and its world size (4) raises the limit to 2 x 4 + 1.
    h.member(0, 1, 0);
    for _ in 0..7 {
        h.aux();
    }
    let (_, reply, _) = h.open(hello(Role::Aux, None, 1), None, 0);
    assert!(matches!(reply, ServerMsg::Reject(WireError::Busy { .. })), "{reply:?}");
    h.state.check_invariants().unwrap();
}

// ---- several runs ----

fn of_run(run: &str, mut h: ClientHello) -> ClientHello {
    h.run_id = run.into();
    h
}

#[test]
fn a_store_of_any_run_keeps_runs_apart() {
    let mut h = Harness::with(ServerState::new("*", None, Limits::default()));
    let (a0, reply, _) = h.open(of_run("run-a", hello(Role::Member, Some(0), 10)), None, 0);
    assert!(matches!(reply, ServerMsg::Welcome(_)));
    let (b0, reply, _) = h.open(of_run("run-b", hello(Role::Member, Some(0), 20)), None, 0);
    assert!(matches!(reply, ServerMsg::Welcome(_)), "rank 0 of another run is no duplicate");
    assert_eq!(h.state.run_ids(), ["run-a", "run-b"]);
    h.ask(a0, set("rl/verdict", b"a's verdict"), 0);
    assert_eq!(h.ask(b0, Request::TryGet { key: "rl/verdict".into() }, 0), Response::MaybeValue(None));
    assert!(h.send(b0, 2, status_since(1, 60_000), 0).is_empty());
    let out = h.send(a0, 3, Request::AbortJob { record: b"a failed".to_vec() }, 1);
    assert_eq!(out.len(), 1, "b's status poll is not woken by a's abort: {out:?}");
    assert_eq!(h.state.status_of("run-b", h.at(1)).abort, None);
    assert_eq!(h.state.status_of("run-b", h.at(1)).ranks[0].pid, 20);
    // A tool must name the run when there are several.
    let (_, reply, _) = h.open(of_run("*", hello(Role::Tool, None, 1)), None, 1);
    let ServerMsg::Reject(WireError::InvalidArgument { detail, .. }) = reply else { panic!("{reply:?}") };
    assert!(detail.contains("2 runs") && !detail.contains("run-a"), "no token, no run ids: {detail}");
    let (tool, reply, _) = h.open(of_run("run-b", hello(Role::Tool, None, 1)), None, 1);
    assert!(matches!(reply, ServerMsg::Welcome(_)));
    let Response::Status(s) = h.ask(tool, status_since(0, 0), 1) else { panic!() };
    assert_eq!((s.abort, s.ranks.len()), (None, 1));
    let (_, reply, _) = h.open(of_run("run-z", hello(Role::Tool, None, 1)), None, 1);
    assert!(matches!(reply, ServerMsg::Reject(WireError::InvalidArgument { .. })), "tools create no runs");
    h.state.check_invariants().unwrap();
}

#[test]
fn idle_runs_are_dropped_and_make_room_for_new_ones() {
    let mut h = Harness::with(ServerState::new(
        "*",
        None,
        // Members that never beat would go silent first: not this test's deadline.
        Limits { runs: 2, run_linger: Duration::from_secs(60), silent_after: Duration::MAX, ..Limits::default() },
    ));
    let (a, _, _) = h.open(of_run("run-a", hello(Role::Member, Some(0), 1)), None, 0);
    let (b, _, _) = h.open(of_run("run-b", hello(Role::Member, Some(0), 1)), None, 0);
    h.ask(a, set("k", &[0; 1000]), 0);
    let (_, reply, _) = h.open(of_run("run-c", hello(Role::Member, Some(0), 1)), None, 0);
    assert!(matches!(reply, ServerMsg::Reject(WireError::Busy { .. })), "both runs have connections: {reply:?}");
    h.state.connection_closed(a, h.at(1000));
    let (_, reply, _) = h.open(of_run("run-c", hello(Role::Member, Some(0), 1)), None, 2000);
    assert!(matches!(reply, ServerMsg::Welcome(_)), "{reply:?}");
    assert_eq!(h.state.run_ids(), ["run-b", "run-c"], "run-a, idle, made room");
    h.state.connection_closed(b, h.at(3000));
    assert_eq!(h.state.poll_timeout(), Some(h.at(63_000)));
    h.state.handle_timeout(h.at(63_000));
    assert_eq!(h.state.run_ids(), ["run-c"]);
    h.state.check_invariants().unwrap();
    assert!(h.state.usage().0 < 1000, "run-a's key is gone with it");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 512, ..Default::default() })]
    /// The fuzz target's script, on random input, without a fuzzer.
    #[test]
    fn random_request_sequences_keep_the_books_balanced(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
        super::fuzz::run(&data);
    }
}

#[test]
fn a_rank_has_a_few_helpers_and_they_do_not_count_against_the_others() {
    let mut h = small(|l| {
        l.helpers_per_rank = 2;
        l.conns_floor = 1;
        l.conns_per_rank = 0;
        l.conns_margin = 0;
    });
    h.member(0, 100, 0);
    for _ in 0..2 {
        let (_, reply, _) = h.open(hello(Role::Aux, Some(0), 100), None, 0);
        assert!(matches!(reply, ServerMsg::Welcome(_)), "{reply:?}");
    }
    let (_, reply, _) = h.open(hello(Role::Aux, Some(0), 100), None, 0);
    assert!(matches!(&reply, ServerMsg::Reject(WireError::Busy { detail }) if detail.contains("rank 0 has 2 helper")));
    h.aux();
    let (_, reply, _) = h.open(hello(Role::Tool, None, 1), None, 0);
    assert!(matches!(reply, ServerMsg::Reject(WireError::Busy { .. })), "one other connection: {reply:?}");
    h.state.check_invariants().unwrap();
}

#[test]
fn connections_other_than_the_ranks_are_closed_after_a_long_silence() {
    let mut h = small(|l| {
        l.idle_timeout = Duration::from_secs(60);
        // Its rank never beats: its silence is not this test's deadline.
        l.silent_after = Duration::MAX;
    });
    let rank = h.member(0, 1, 0);
    let (helper, _, _) = h.open(hello(Role::Aux, Some(0), 1), None, 0);
    let (quiet, talkative, waiting) = (h.aux(), h.aux(), h.aux());
    assert!(h.send(waiting, 1, get("never", 3_600_000), 0).is_empty());
    h.ask(talkative, Request::NumKeys, 30_000);
    assert_eq!(h.state.poll_timeout(), Some(h.at(60_000)));
    let out = h.state.handle_timeout(h.at(60_000));
    let closed: Vec<ConnId> = out.iter().map(|(c, _)| *c).collect();
    assert_eq!(closed, [quiet], "{out:?}");
    assert!(matches!(&out[0].1, ServerMsg::Reject(WireError::Protocol { detail }) if detail.contains("silent")));
    let out = h.state.handle_timeout(h.at(90_000));
    assert_eq!(out.iter().map(|(c, _)| *c).collect::<Vec<_>>(), [talkative]);
    for c in [rank, helper, waiting] {
        assert!(!h.send(c, 9, Request::NumKeys, 100_000).is_empty(), "{c:?} is still open");
    }
    h.state.check_invariants().unwrap();
}

fn changes_since(since: u64, ms: u64) -> Request {
    Request::Changes { since, timeout: Duration::from_millis(ms) }
}

#[test]
fn a_changes_poll_carries_only_the_ranks_that_changed_and_ignores_heartbeats() {
    let mut h = Harness::new();
    let watcher = h.aux();
    let members: Vec<ConnId> = (0..4).map(|r| h.member(r, 100 + r, 0)).collect();
    let gen = h.status(0).generation;
    assert_eq!(gen, 4, "one event per member that joined");
    let Response::Changes(start) = h.ask(watcher, changes_since(0, 0), 5) else { panic!() };
    assert_eq!((start.generation, start.ranks.len()), (gen, 0), "joins advance the generation, unlisted");

    assert!(h.send(watcher, 2, changes_since(gen, 5000), 10).is_empty());
    let beat = h.send(members[0], 9, Request::Heartbeat { payload: b"#7".to_vec() }, 15);
    assert_eq!(answer(&beat, members[0], 9), Response::Ok, "a heartbeat wakes no one");
    let out = h.state.connection_closed(members[1], h.at(20));
    let Response::Changes(c) = answer(&out, watcher, 2) else { panic!("{out:?}") };
    assert_eq!((c.generation, c.more, c.abort.as_deref()), (gen + 1, false, None));
    assert_eq!(c.ranks.len(), 1);
    assert_eq!((c.ranks[0].rank, c.ranks[0].liveness, c.ranks[0].pid), (1, Presence::Vanished, 101));

    // Nothing new: the poll parks, and its timeout answers no changes.
    assert!(h.send(watcher, 3, changes_since(c.generation, 250), 30).is_empty());
    let out = h.state.handle_timeout(h.at(280));
    let Response::Changes(quiet) = answer(&out, watcher, 3) else { panic!("{out:?}") };
    assert_eq!((quiet.generation, quiet.ranks.len(), quiet.abort), (c.generation, 0, None));

    // The abort record is a change of its own.
    assert!(h.send(watcher, 4, changes_since(c.generation, 5000), 300).is_empty());
    let out = h.send(members[2], 5, Request::AbortJob { record: b"rank 1 died".to_vec() }, 310);
    let Response::Changes(a) = answer(&out[1..], watcher, 4) else { panic!("{out:?}") };
    assert_eq!((a.ranks.len(), a.abort.as_deref()), (0, Some(&b"rank 1 died"[..])));

    // A view that starts empty at generation 0 holds, after the changes,
    // every rank that is not connected, as the status has them, and the
    // abort record: the joins are not listed.
    let mut view = JobStatus::default();
    h.send(members[3], 6, Request::Leave, 320);
    loop {
        let Response::Changes(c) = h.ask(watcher, changes_since(view.generation, 0), 330) else { panic!() };
        let more = c.more;
        view.apply(c);
        if !more {
            break;
        }
    }
    let mut now = h.status(330);
    now.ranks.retain(|r| r.liveness != Presence::Connected);
    let liveness = |s: &JobStatus| s.ranks.iter().map(|r| (r.rank, r.liveness, r.pid)).collect::<Vec<_>>();
    assert_eq!(liveness(&view), vec![(1, Presence::Vanished, 101), (3, Presence::Left, 103)]);
    assert_eq!(liveness(&view), liveness(&now));
    assert_eq!((view.generation, view.abort.clone()), (now.generation, now.abort.clone()));
}

#[test]
fn changes_come_in_bounded_chunks_that_add_up_to_every_rank() {
    let mut h = Harness::new();
    let world = 200;
    for r in 0..world {
        let mut hi = hello(Role::Member, Some(r), 1000 + r);
        hi.world_size = Some(world);
        let (conn, reply, _) = h.open(hi, None, 0);
        assert!(matches!(reply, ServerMsg::Welcome(_)), "{reply:?}");
        let big = Request::Heartbeat { payload: vec![b'b'; MAX_HEARTBEAT] };
        assert_eq!(h.ask(conn, big, 1), Response::Ok);
        assert_eq!(h.ask(conn, Request::Leave, 1), Response::Ok);
    }
    let watcher = h.aux();
    let (mut since, mut seen, mut answers) = (0, Vec::new(), 0);
    loop {
        let out = h.send(watcher, 1, changes_since(since, 0), 2);
        let resp = answer(&out, watcher, 1);
        assert!(weight(&out[0].1) <= ops::CHANGES_CHUNK + MAX_HEARTBEAT as u64, "an answer stays bounded");
        let Response::Changes(c) = resp else { panic!("{resp:?}") };
        assert!(c.generation > since, "every answer advances");
        seen.extend(c.ranks.iter().map(|r| r.rank));
        since = c.generation;
        answers += 1;
        h.state.written(watcher, weight(&out[0].1));
        if !c.more {
            break;
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..world as usize).collect::<Vec<_>>());
    assert!(answers >= 3, "{world} ranks of 16 KiB heartbeats need several answers, got {answers}");
    assert_eq!(since, h.status(2).generation);
}

#[test]
fn a_changes_poll_from_ahead_of_the_store_reads_from_the_start() {
    let mut h = Harness::new();
    let watcher = h.aux();
    let (r0, _, r3) = (h.member(0, 100, 0), h.member(1, 101, 0), h.member(3, 103, 0));
    h.state.connection_closed(r3, h.at(1));
    h.ask(r0, Request::Leave, 1);
    // A reader that knew an earlier store of the same address asks past
    // this one's generation: it gets every departure at once, not a wait.
    let Response::Changes(c) = h.ask(watcher, changes_since(1000, 5000), 2) else { panic!() };
    let got: Vec<(usize, Presence)> = c.ranks.iter().map(|r| (r.rank, r.liveness)).collect();
    assert_eq!(got, vec![(3, Presence::Vanished), (0, Presence::Left)]);
    assert_eq!(c.generation, 5);
}

#[test]
fn a_rank_that_stops_heartbeating_is_pushed_as_silent_and_again_when_it_beats() {
    let mut h = Harness::new();
    let watcher = h.aux();
    let members: Vec<ConnId> = (0..4).map(|r| h.member(r, 100 + r, 0)).collect();
    let gen = h.status(0).generation;
    let beat = |h: &mut Harness, r: usize, ms: u64| {
        let out = h.send(members[r], 9, Request::Heartbeat { payload: b"#1".to_vec() }, ms);
        out.into_iter().filter(|(c, _)| *c != members[r]).collect::<Vec<_>>()
    };
    // Ranks 0, 1 and 3 beat every 500 ms; rank 2 stops after 1 s.
    assert!(h.send(watcher, 2, changes_since(gen, 60_000), 10).is_empty());
    let mut ms = 0;
    while ms < 3_900 {
        ms += 500;
        for r in [0, 1, 3] {
            assert!(beat(&mut h, r, ms).is_empty(), "a heartbeat wakes no one");
        }
        if ms <= 1_000 {
            assert!(beat(&mut h, 2, ms).is_empty());
        }
        let deadline = h.state.poll_timeout().expect("a silence deadline");
        assert!(deadline >= h.at(ms), "{deadline:?}");
        if deadline <= h.at(ms + 500) {
            let out = h.state.handle_timeout(deadline);
            if !out.is_empty() {
                let Response::Changes(c) = answer(&out, watcher, 2) else { panic!("{out:?}") };
                assert_eq!(c.ranks.len(), 1, "{c:?}");
                let r = &c.ranks[0];
                assert_eq!((r.rank, r.liveness, r.pid), (2, Presence::Connected, 102));
                assert_eq!(deadline, h.at(1_000 + 3_000), "silent 3 s after its last heartbeat");
                assert!(r.heartbeat_age.unwrap() >= Duration::from_secs(3), "{r:?}");
                h.state.check_invariants().unwrap();
                // It beats again: that is news too.
                assert!(h.send(watcher, 3, changes_since(c.generation, 60_000), 4_100).is_empty());
                let out = beat(&mut h, 2, 4_200);
                let Response::Changes(back) = answer(&out, watcher, 3) else { panic!("{out:?}") };
                assert_eq!(back.ranks.len(), 1);
                assert_eq!(back.ranks[0].heartbeat_age, Some(Duration::ZERO));
                h.state.check_invariants().unwrap();
                // A reader from generation 0 lists it (it went silent once),
                // not the ranks that never did.
                let Response::Changes(all) = h.ask(watcher, changes_since(0, 0), 4_300) else { panic!() };
                assert_eq!(all.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(), [2]);
                return;
            }
        }
    }
    panic!("rank 2 was never pushed as silent");
}
