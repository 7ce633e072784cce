//! The mesh's failure reports and the socket link.

use super::*;
use crate::hello::{Challenge, Hello, Reply};
use ringleader_core::{AbortSignal, Error};

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn closed_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

#[test]
fn every_failing_pair_is_named_in_one_error() {
    // Rank 2 of 3: ranks 0 and 1 never listen, so both of its pairs fail,
    // and it keeps trying both until the timeout.
    let listener =
        DataListener::bind(&ListenOptions { store_endpoint: "127.0.0.1:1".into(), ..Default::default() }).unwrap();
    let addrs = [closed_port(), closed_port(), listener.addr().to_string()];
    let opts = MeshOptions {
        rank: 2,
        world: 3,
        streams: 2,
        run_id: "r".into(),
        token: None,
        timeout: Duration::from_millis(300),
    };
    let abort = AbortSignal::new().unwrap();
    let start = Instant::now();
    let e = Mesh::establish(listener, &addrs, &opts, &abort).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(2));
    let Error::DataPortsUnreachable { pairs, .. } = &e else { panic!("{e}") };
    assert_eq!(pairs.iter().map(|p| (p.src, p.dst)).collect::<Vec<_>>(), [(2, 0), (2, 1)], "one entry per pair");
    assert_eq!(pairs[1].addr, addrs[1]);
    assert!(pairs[0].detail.contains("refused"), "{e}");
    assert_eq!(e.ranks(), [0, 1, 2]);
}

/// Connects to `addr` as a stranger would: reads the challenge, sends
/// `hello_for(nonce)`, returns the reply byte (None if none came).
fn knock(addr: &str, hello_for: impl Fn(&[u8; crate::hello::NONCE_LEN]) -> Vec<u8>) -> Option<u8> {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut c = [0u8; Challenge::LEN];
    s.read_exact(&mut c).ok()?;
    let nonce = Challenge::decode(&c).unwrap().unwrap().nonce;
    s.write_all(&hello_for(&nonce)).ok()?;
    let mut r = [0u8; 1];
    s.read_exact(&mut r).ok().map(|_| r[0])
}

#[test]
fn strangers_and_replays_are_refused_without_ending_the_start() {
    // Rank 0 of 2 accepts; before the real rank 1 connects, a process of
    // another run, one without the token, and a replay of a hello made
    // for another connection's nonce all knock and are refused.
    let listener =
        DataListener::bind(&ListenOptions { store_endpoint: "127.0.0.1:1".into(), ..Default::default() }).unwrap();
    let addr = listener.addr().to_string();
    let opts = MeshOptions {
        rank: 0,
        world: 2,
        streams: 1,
        run_id: "job".into(),
        token: Some("secret".into()),
        timeout: Duration::from_secs(20),
    };
    let addrs = [addr.clone(), closed_port()];
    let acceptor = std::thread::spawn(move || {
        let opts = opts;
        Mesh::establish(listener, &addrs, &opts, &AbortSignal::new().unwrap())
    });
    let foreign = knock(&addr, |n| Hello::new("other-job", 1, 0, 0, 2, Some("secret"), n).encode());
    assert_eq!(foreign, Some(Reply::ForeignRun.code()));
    let no_token = knock(&addr, |n| Hello::new("job", 1, 0, 0, 2, None, n).encode());
    assert_eq!(no_token, Some(Reply::AuthFailed.code()));
    let recorded = Hello::new("job", 1, 0, 0, 2, Some("secret"), &[9u8; crate::hello::NONCE_LEN]).encode();
    let replay = knock(&addr, |_| recorded.clone());
    assert_eq!(replay, Some(Reply::AuthFailed.code()), "a hello made for another nonce");
    // The real rank 1 still gets in, and rank 0's mesh completes.
    let real = knock(&addr, |n| Hello::new("job", 1, 0, 0, 2, Some("secret"), n).encode());
    assert_eq!(real, Some(Reply::Ok.code()));
    let mesh = acceptor.join().unwrap().expect("the mesh completes despite the strangers");
    assert_eq!(mesh.links[1].len(), 1);
}

#[test]
fn an_acceptor_names_the_ranks_that_never_connected() {
    let listener =
        DataListener::bind(&ListenOptions { store_endpoint: "127.0.0.1:1".into(), ..Default::default() }).unwrap();
    let me = listener.addr().to_string();
    let opts = MeshOptions {
        rank: 0,
        world: 2,
        streams: 1,
        run_id: "r".into(),
        token: None,
        timeout: Duration::from_millis(200),
    };
    let e = Mesh::establish(listener, &[me.clone(), closed_port()], &opts, &AbortSignal::new().unwrap()).unwrap_err();
    let s = e.to_string();
    assert!(s.contains(&format!("rank 1 cannot reach rank 0 at {me} (seen from rank 0: no connection")), "{s}");
}

#[test]
fn a_loopback_link_names_the_cpu_its_peer_last_sent_from() {
    use crate::link::{Link, ReadOutcome};
    use rustix::thread::{sched_setaffinity, CpuSet};
    let cpus = crate::cpu::allowed();
    let (mut a, b) = link::test_pair();
    let b = std::sync::Mutex::new(b);
    for &cpu in cpus.iter().take(2) {
        // The peer sends from `cpu` alone (its own thread's mask).
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut one = CpuSet::new();
                one.set(cpu);
                sched_setaffinity(None, &one).unwrap();
                let mut b = b.lock().unwrap();
                assert_eq!(b.try_write(&[std::io::IoSlice::new(&[7u8; 8])]).unwrap(), 8);
            });
        });
        let mut got = [0u8; 8];
        let start = Instant::now();
        while a.try_read(&mut got).unwrap() == ReadOutcome::WouldBlock {
            assert!(start.elapsed() < Duration::from_secs(5), "nothing arrived");
        }
        assert_eq!(Link::peer_cpu(&a), Some(cpu as u32), "allowed CPUs {cpus:?}");
    }
}
