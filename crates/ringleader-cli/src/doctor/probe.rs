//! The data-plane probe: each doctor listens on a few data ports, where the
//! ranks of its node would (the same interface choice as the library's), and
//! every doctor connects to every doctor's ports, all at once, each attempt
//! bounded.

use ringleader_core::Error;
use ringleader_transport::{DataListener, ListenOptions};
use serde::{Deserialize, Serialize};
use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// What a probe connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Target {
    /// A data port.
    Data,
    /// Node 0's MASTER_PORT.
    MasterPort,
}

/// One connection attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Probe {
    /// The node that connected.
    pub(crate) from: usize,
    /// The node that listened.
    pub(crate) to: usize,
    /// `ip:port`.
    pub(crate) addr: String,
    /// What listened there.
    pub(crate) what: Target,
    /// Whether the connection was made.
    pub(crate) ok: bool,
    /// How long it took, or what failed.
    pub(crate) detail: String,
}

/// At most this many connection attempts run at once.
const PARALLEL: usize = 64;

/// The ports to try in `range`: its ends and up to `count - 2` evenly
/// spaced between them (all of them when it is small).
pub(crate) fn ports_to_try(range: (u16, u16), count: usize) -> Vec<u16> {
    let (lo, hi) = range;
    let span = usize::from(hi - lo) + 1;
    let count = count.max(1);
    if span <= count {
        return (lo..=hi).collect();
    }
    let mut ports: Vec<u16> =
        (0..count).map(|i| if count == 1 { lo } else { lo + ((span - 1) * i / (count - 1)) as u16 }).collect();
    ports.dedup();
    ports
}

/// Listeners on up to `count` ports: of `range` where given (a port in use
/// is passed over, and said so in the returned notes), else ephemeral ones.
pub(crate) fn open_listeners(
    ifname: Option<&str>,
    range: Option<(u16, u16)>,
    store_endpoint: &str,
    count: usize,
) -> Result<(Vec<DataListener>, Vec<String>), Error> {
    let opts = |port_range| ListenOptions {
        ifname: ifname.map(str::to_string),
        port_range,
        store_endpoint: store_endpoint.to_string(),
    };
    let mut listeners = Vec::new();
    let mut notes = Vec::new();
    match range {
        None => {
            for _ in 0..count.max(1) {
                listeners.push(DataListener::bind(&opts(None))?);
            }
        }
        Some(r) => {
            let mut last = None;
            for port in ports_to_try(r, count) {
                match DataListener::bind(&opts(Some((port, port)))) {
                    Ok(l) => listeners.push(l),
                    Err(e @ Error::PortInUse { .. }) => {
                        let holder =
                            ringleader_store::port_holder(port).map(|h| format!(" by {h}")).unwrap_or_default();
                        notes.push(format!("port {port} is in use here{holder}"));
                        last = Some(e);
                    }
                    Err(e) => return Err(e),
                }
            }
            if listeners.is_empty() {
                return Err(last.unwrap_or_else(|| Error::invalid("RINGLEADER_PORT_RANGE", "no port to try")));
            }
        }
    }
    Ok((listeners, notes))
}

/// One connection to make: to node `to` at `addr`.
#[derive(Debug, Clone)]
pub(crate) struct ProbeTarget {
    /// The node listening.
    pub(crate) to: usize,
    /// Its `ip:port`.
    pub(crate) addr: String,
    /// What listens there.
    pub(crate) what: Target,
    /// The address is a loopback one on another host: fail without trying.
    pub(crate) remote_loopback: bool,
}

/// Connects from node `from` to every target, `PARALLEL` at a time, each
/// attempt bounded by `timeout`.
pub(crate) fn probe_all(from: usize, targets: &[ProbeTarget], timeout: Duration) -> Vec<Probe> {
    let mut probes = Vec::with_capacity(targets.len());
    for batch in targets.chunks(PARALLEL) {
        let handles: Vec<_> =
            batch.iter().cloned().map(|t| std::thread::spawn(move || probe_one(from, t, timeout))).collect();
        probes.extend(handles.into_iter().filter_map(|h| h.join().ok()));
    }
    probes
}

fn probe_one(from: usize, t: ProbeTarget, timeout: Duration) -> Probe {
    let done = |ok: bool, detail: String| Probe { from, to: t.to, addr: t.addr.clone(), what: t.what, ok, detail };
    if t.remote_loopback {
        return done(false, "a loopback address, which no other host can reach".into());
    }
    let addr: SocketAddr = match t.addr.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(a)) => a,
        Ok(None) => return done(false, "resolves to no address".into()),
        Err(e) => return done(false, format!("cannot resolve: {e}")),
    };
    let start = Instant::now();
    match TcpStream::connect_timeout(&addr, timeout) {
        Ok(_) => done(true, format!("connected in {:.1} ms", start.elapsed().as_secs_f64() * 1e3)),
        Err(e) => done(false, describe_connect_error(&e, timeout)),
    }
}

/// A failed connect, in words that point at the cause.
pub(crate) fn describe_connect_error(e: &io::Error, timeout: Duration) -> String {
    match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
            format!("no answer within {:.1} s: packets dropped, by a firewall?", timeout.as_secs_f64())
        }
        io::ErrorKind::ConnectionRefused => {
            "connection refused: nothing listens there, or a firewall rejects it".into()
        }
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_spread_over_the_range() {
        assert_eq!(ports_to_try((40000, 40100), 3), [40000, 40050, 40100]);
        assert_eq!(ports_to_try((40000, 40001), 3), [40000, 40001]);
        assert_eq!(ports_to_try((40000, 40009), 1), [40000]);
        assert_eq!(ports_to_try((5, 5), 3), [5]);
    }

    #[test]
    fn probes_tell_open_from_closed_ports() {
        let (ls, notes) = open_listeners(None, None, "127.0.0.1:1", 2).unwrap();
        assert_eq!((ls.len(), notes.len()), (2, 0));
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        let t = |addr: String, remote_loopback| ProbeTarget { to: 1, addr, what: Target::Data, remote_loopback };
        let targets = [t(ls[0].addr().to_string(), false), t(closed, false), t(ls[1].addr().to_string(), true)];
        let p = probe_all(0, &targets, Duration::from_secs(2));
        assert!(p[0].ok, "{p:?}");
        assert!(!p[1].ok && p[1].detail.contains("refused"), "{p:?}");
        assert!(!p[2].ok && p[2].detail.contains("loopback"), "{p:?}");
    }

    #[test]
    fn a_taken_port_of_the_range_is_passed_over() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let e = open_listeners(None, Some((port, port)), "127.0.0.1:1", 3).unwrap_err();
        assert_eq!(e.kind(), ringleader_core::ErrorKind::PortInUse);
    }
}
