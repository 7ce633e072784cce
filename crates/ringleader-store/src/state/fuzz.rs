//! Random request sequences against the server state machine: the body of
//! the `state` fuzz target, and of a property test that runs without a
//! fuzzer.
//!
//! The input bytes are read as a script: open a connection, say hello (as a
//! member, helper or tool, of one run or another, with the token or not,
//! with fields too long), send a request, let the socket take some answers,
//! close, let time pass. The driver plays the IO layer faithfully (a
//! refusal closes its connection; `written` reports the weights of answers
//! actually sent), and after every step checks that nothing panicked, that
//! the state's books balance ([`ServerState::check_invariants`]) and that
//! no answer carrying data was queued past the caps. Limits are small so
//! that the script reaches them.

use super::{weight, ConnId, Limits, ServerState};
use crate::auth::Transcript;
use crate::codec::{ClientHello, Request, Response, ServerMsg, MAGIC, PROTOCOL_VERSION};
use crate::job::Role;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

const TOKEN: &str = "fuzz-token";

/// The limits the script runs under: small enough to be reached.
pub(crate) fn limits() -> Limits {
    Limits {
        run_bytes: 16 << 10,
        store_bytes: 24 << 10,
        run_keys: 24,
        conn_keys: 8,
        conn_waits: 3,
        conn_queued_bytes: 6 << 10,
        queued_bytes: 10 << 10,
        input_bytes: 1 << 20,
        pending: 3,
        hello_timeout: Duration::from_millis(500),
        helpers_per_rank: 1,
        conns_per_rank: 1,
        conns_margin: 1,
        conns_floor: 4,
        conns_max: 8,
        idle_timeout: Duration::from_secs(3),
        runs: 3,
        run_linger: Duration::from_secs(2),
        silent_after: Duration::from_secs(1),
    }
}

/// Reads the script.
struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }

    fn pick<T: Clone>(&mut self, from: &[T]) -> Option<T> {
        let i = self.byte()? as usize % from.len();
        Some(from[i].clone())
    }

    fn flag(&mut self) -> Option<bool> {
        Some(self.byte()? & 1 == 1)
    }
}

const KEYS: &[&str] = &["a", "b", "c", "rl/rank/0", "rl/exit/1", "rl/dump_request", "rl/verdict", "rl/mb/1/result"];
const RUNS: &[&str] = &["job", "other", "third", "*", ""];

fn key(s: &mut Script<'_>) -> Option<String> {
    s.pick(KEYS).map(str::to_string)
}

fn value(s: &mut Script<'_>) -> Option<Vec<u8>> {
    let n = s.byte()? as usize;
    let len = if n & 0x80 != 0 { (n & 0x7f) * 97 } else { n & 0x0f };
    // Decimal digits now and then, so that `add` has something to count on.
    Some(if n & 0x40 != 0 { n.to_string().into_bytes() } else { vec![b'v'; len] })
}

fn timeout(s: &mut Script<'_>) -> Option<Duration> {
    Some(match s.byte()? % 4 {
        0 => Duration::ZERO,
        1 => Duration::from_millis(300),
        2 => Duration::from_secs(3),
        _ => Duration::MAX,
    })
}

fn keys(s: &mut Script<'_>) -> Option<Vec<String>> {
    let n = s.byte()? % 5;
    (0..n).map(|_| key(s)).collect()
}

fn request(s: &mut Script<'_>) -> Option<Request> {
    Some(match s.byte()? % 18 {
        0 => Request::Set { key: key(s)?, value: value(s)? },
        1 => Request::Get { key: key(s)?, timeout: timeout(s)? },
        2 => Request::TryGet { key: key(s)? },
        3 => Request::Add { key: key(s)?, delta: i64::from(s.byte()?) - 128 },
        4 => {
            let expected = if s.flag()? { Some(value(s)?) } else { None };
            Request::CompareSet { key: key(s)?, expected, desired: value(s)? }
        }
        5 => Request::Wait { keys: keys(s)?, timeout: timeout(s)? },
        6 => Request::Check { keys: keys(s)? },
        7 => Request::Delete { key: key(s)? },
        8 => Request::NumKeys,
        9 => Request::MultiGet { keys: keys(s)?, timeout: timeout(s)? },
        10 => {
            let n = s.byte()? % 4;
            Request::MultiSet { pairs: (0..n).map(|_| Some((key(s)?, value(s)?))).collect::<Option<_>>()? }
        }
        11 => Request::Append { key: key(s)?, value: value(s)? },
        12 => Request::KeysWithPrefix { prefix: s.pick(&["", "rl/", "a", "zz"])?.to_string() },
        13 => Request::Heartbeat { payload: value(s)? },
        14 => Request::Leave,
        15 => Request::AbortJob { record: value(s)? },
        16 => Request::Changes { since: u64::from(s.byte()?), timeout: timeout(s)? },
        _ => Request::Status { since: if s.flag()? { Some(u64::from(s.byte()?)) } else { None }, timeout: timeout(s)? },
    })
}

/// A hello from the script, with a valid proof of the token or not.
fn hello(s: &mut Script<'_>, nonce: &[u8; 32]) -> Option<ClientHello> {
    let role = s.pick(&[Role::Member, Role::Aux, Role::Tool])?;
    let rank = match s.byte()? % 5 {
        0 => None,
        4 => Some(9999),
        r => Some(u32::from(r) - 1),
    };
    let world_size = match s.byte()? % 4 {
        0 => None,
        1 => Some(0),
        2 => Some(4),
        _ => Some(70_000),
    };
    let mut run_id = s.pick(RUNS)?.to_string();
    let mut host = "node-a".to_string();
    match s.byte()? % 8 {
        0 => run_id = "r".repeat(300),
        1 => host = "h".repeat(300),
        _ => {}
    }
    let mut h = ClientHello {
        magic: MAGIC,
        protocol_version: PROTOCOL_VERSION,
        library_version: "0.1.0".into(),
        run_id,
        role,
        rank,
        world_size,
        host,
        pid: u32::from(s.byte()? % 3),
        client_nonce: [s.byte()?; 32],
        mac: None,
    };
    if s.flag()? {
        let t =
            Transcript { server_nonce: nonce, client_nonce: &h.client_nonce, run_id: &h.run_id, role, rank: h.rank };
        h.mac = Some(t.client_mac(if s.flag()? { TOKEN } else { "wrong" }));
    }
    Some(h)
}

/// The IO layer as the driver plays it.
struct Driver {
    state: ServerState,
    limits: Limits,
    now: Instant,
    next: u64,
    /// Open connections: their nonce, and the weights of the answers
    /// queued for them (oldest first; whether each carries data).
    open: BTreeMap<ConnId, ([u8; 32], Queued)>,
}

/// The weights of the answers queued for a connection, oldest first, and
/// whether each carries data (an error does not).
type Queued = VecDeque<(u64, bool)>;

impl Driver {
    /// Routes `out` as the IO layer would; a refusal closes its connection.
    fn route(&mut self, out: Vec<(ConnId, ServerMsg)>) {
        for (conn, msg) in out {
            let Some((_, queue)) = self.open.get_mut(&conn) else {
                panic!("a message to {conn:?}, which is not open: {msg:?}");
            };
            let w = weight(&msg);
            if w > 0 {
                let data = !matches!(msg, ServerMsg::Response { resp: Response::Error(_), .. });
                queue.push_back((w, data));
            }
            if matches!(msg, ServerMsg::Reject(_)) {
                self.close(conn);
            }
        }
    }

    fn close(&mut self, conn: ConnId) {
        if self.open.remove(&conn).is_some() {
            let out = self.state.connection_closed(conn, self.now);
            self.route(out);
        }
    }

    /// What answers carrying data are queued, per connection and in all,
    /// stays within the caps.
    fn check_queues(&self) {
        let mut all = 0;
        for (conn, (_, queue)) in &self.open {
            // Every answer carrying data fitted when it was queued; errors
            // (small) may come on top.
            let data: u64 = queue.iter().filter(|(_, d)| *d).map(|(w, _)| w).sum();
            assert!(data <= self.limits.conn_queued_bytes, "{conn:?} has {data} bytes of answers queued");
            all += data;
        }
        assert!(all <= self.limits.queued_bytes, "{all} bytes of answers queued");
    }

    /// An open connection; `Some(None)` when none is, `None` at the end
    /// of the script.
    fn pick(&self, s: &mut Script<'_>) -> Option<Option<ConnId>> {
        let conns: Vec<ConnId> = self.open.keys().copied().collect();
        if conns.is_empty() {
            return Some(None);
        }
        s.pick(&conns).map(Some)
    }

    fn step(&mut self, s: &mut Script<'_>) -> Option<()> {
        match s.byte()? % 8 {
            0 => {
                self.next += 1;
                let conn = ConnId(self.next);
                let nonce = [s.byte()?; 32];
                self.open.insert(conn, (nonce, VecDeque::new()));
                let out = self.state.connection_opened(conn, nonce, self.now);
                self.route(out);
            }
            1 => {
                let Some(conn) = self.pick(s)? else { return Some(()) };
                let nonce = self.open.get(&conn)?.0;
                let h = hello(s, &nonce)?;
                let out = self.state.handle_hello(conn, h, self.now);
                self.route(out);
            }
            2..=4 => {
                let Some(conn) = self.pick(s)? else { return Some(()) };
                let req = request(s)?;
                let out = self.state.handle(conn, u64::from(s.byte()?), req, self.now);
                self.route(out);
            }
            5 => {
                let Some(conn) = self.pick(s)? else { return Some(()) };
                let n = s.byte()? % 4;
                let queue = &mut self.open.get_mut(&conn)?.1;
                let sent: u64 = (0..n).filter_map(|_| queue.pop_front()).map(|(w, _)| w).sum();
                self.state.written(conn, sent);
            }
            6 => {
                let Some(conn) = self.pick(s)? else { return Some(()) };
                self.close(conn);
            }
            _ => {
                let ms = u64::from(s.byte()?) * 20;
                self.now = self.now.checked_add(Duration::from_millis(ms))?;
                if self.state.poll_timeout().is_some_and(|t| t <= self.now) {
                    let out = self.state.handle_timeout(self.now);
                    self.route(out);
                }
            }
        }
        Some(())
    }
}

/// Runs the script in `data`; panics on any violation.
pub(crate) fn run(data: &[u8]) {
    let mut s = Script(data);
    let (Some(mode), Some(token)) = (s.byte(), s.byte()) else { return };
    let run_id = if mode & 1 == 0 { "*" } else { "job" };
    let limits = limits();
    let state = ServerState::new(run_id, (token & 1 == 1).then_some(TOKEN), limits.clone());
    let mut d = Driver { state, limits, now: Instant::now(), next: 0, open: BTreeMap::new() };
    while d.step(&mut s).is_some() {
        if let Err(e) = d.state.check_invariants() {
            panic!("{e}");
        }
        d.check_queues();
    }
    if let Err(e) = d.state.check_invariants() {
        panic!("{e}");
    }
    // Closing everything leaves nothing charged but what runs hold.
    let conns: Vec<ConnId> = d.open.keys().copied().collect();
    for conn in conns {
        d.close(conn);
    }
    if let Err(e) = d.state.check_invariants() {
        panic!("{e}");
    }
    assert_eq!(d.state.queued, 0, "answers still counted after every connection closed");
}
