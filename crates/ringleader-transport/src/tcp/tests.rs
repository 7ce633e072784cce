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

/// Writes `bytes` on `link` whole (the socket takes small writes at once).
fn write_all(link: &mut TcpLink, bytes: &[u8]) {
    let mut off = 0;
    let start = Instant::now();
    while off < bytes.len() {
        off += link.try_write(&[std::io::IoSlice::new(&bytes[off..])]).unwrap();
        assert!(start.elapsed() < Duration::from_secs(5), "the socket took nothing for 5 s");
    }
}

/// Reads exactly `n` bytes from `link`, in reads of at most `piece`.
fn read_exact(link: &mut TcpLink, n: usize, piece: usize) -> Vec<u8> {
    use crate::link::ReadOutcome;
    let (mut out, mut buf) = (Vec::new(), vec![0u8; piece]);
    let start = Instant::now();
    while out.len() < n {
        let want = piece.min(n - out.len());
        match link.try_read(&mut buf[..want]).unwrap() {
            ReadOutcome::Data(k) => out.extend_from_slice(&buf[..k]),
            ReadOutcome::WouldBlock => {
                assert!(start.elapsed() < Duration::from_secs(5), "{} of {n} bytes came", out.len())
            }
            ReadOutcome::Closed => panic!("closed after {} of {n} bytes", out.len()),
        }
    }
    out
}

#[test]
fn a_small_frames_header_and_payload_come_out_of_one_system_call() {
    use crate::link::{Link, ReadOutcome};
    let (mut a, mut b) = link::test_pair();
    let frame: Vec<u8> = (0..48u8).collect();
    write_all(&mut a, &frame);
    // The header's read (40 bytes) takes the payload too, when it has
    // arrived: wait until all 48 bytes are in the socket first.
    let start = Instant::now();
    let mut peek = [0u8; 48];
    while rustix::net::recv(&b.stream, &mut peek, rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT)
        .map_or(0, |(_, n)| n)
        < 48
    {
        assert!(start.elapsed() < Duration::from_secs(5), "the frame did not arrive");
    }
    let mut hdr = [0u8; 40];
    assert_eq!(b.try_read(&mut hdr).unwrap(), ReadOutcome::Data(40));
    assert!(Link::buffered(&b), "the payload waits in the link");
    let left = rustix::net::recv(&b.stream, &mut peek, rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT);
    assert!(matches!(left, Err(rustix::io::Errno::AGAIN)), "the socket still held bytes: {left:?}");
    let mut payload = [0u8; 8];
    assert_eq!(b.try_read(&mut payload).unwrap(), ReadOutcome::Data(8));
    assert_eq!([&hdr[..], &payload[..]].concat(), frame);
    assert!(!Link::buffered(&b));
    assert_eq!(b.try_read(&mut payload).unwrap(), ReadOutcome::WouldBlock);
}

#[test]
fn reads_of_every_size_see_the_stream_in_order() {
    // Small reads go through the read-ahead, large ones straight into the
    // caller's buffer, mixed: every byte once, in order, and the close.
    use crate::link::ReadOutcome;
    let (mut a, mut b) = link::test_pair();
    let data: Vec<u8> = (0..3 * link::READ_AHEAD + 123).map(|i| (i * 7 % 251) as u8).collect();
    let writer = std::thread::spawn(move || {
        for chunk in data.chunks(1000) {
            write_all(&mut a, chunk);
        }
        data
    });
    let mut got = read_exact(&mut b, 40, 40);
    got.extend(read_exact(&mut b, 2 * link::READ_AHEAD, 2 * link::READ_AHEAD));
    got.extend(read_exact(&mut b, 7, 7));
    got.extend(read_exact(&mut b, link::READ_AHEAD + 123 - 47, 1000));
    let data = writer.join().unwrap();
    assert_eq!(got.len(), data.len());
    assert!(got == data, "bytes out of order");
    let start = Instant::now();
    loop {
        match b.try_read(&mut [0u8; 8]).unwrap() {
            ReadOutcome::Closed => break,
            ReadOutcome::WouldBlock => assert!(start.elapsed() < Duration::from_secs(5), "no close seen"),
            ReadOutcome::Data(n) => panic!("{n} bytes after the end"),
        }
    }
}

#[test]
fn a_wait_to_read_does_not_sleep_while_the_link_holds_read_bytes() {
    use crate::driver::wait::Sleeper;
    use rustix::event::PollFlags;
    let (mut a, mut b) = link::test_pair();
    write_all(&mut a, &[1u8; 48]);
    let _ = read_exact(&mut b, 40, 40);
    // The 8 bytes left are in `b`, none in its socket: a poll would sleep
    // the whole second.
    let abort = AbortSignal::new().unwrap();
    let mut sleeper = Sleeper::new(&[abort.fd()]);
    sleeper.link(&b, PollFlags::IN);
    let start = Instant::now();
    sleeper.sleep(Duration::from_secs(1), None, || false).unwrap();
    assert!(start.elapsed() < Duration::from_millis(200), "slept {:?}", start.elapsed());
    assert_eq!(read_exact(&mut b, 8, 8), [1u8; 8]);
}
