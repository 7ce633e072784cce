//! A real server on 127.0.0.1:0 and blocking clients on threads: every
//! operation, and every way connecting or waiting can fail.

mod common;

use common::{client, opts, server, server_with, within, RUN};
use ringleader_core::{AbortSignal, Error, ErrorKind};
use ringleader_store::{Presence, Role, ServerOptions, StoreClient, StoreServer};
use std::io::Write;
use std::net::TcpListener;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(10);

#[test]
fn every_operation_works_against_a_real_server() {
    within(LIMIT, || {
        let (_server, addr) = server();
        let mut c = client(&addr);
        c.set("a", b"1").unwrap();
        assert_eq!(c.get("a", Duration::from_secs(1)).unwrap(), b"1");
        assert_eq!(c.try_get("a").unwrap(), Some(b"1".to_vec()));
        assert_eq!(c.try_get("nope").unwrap(), None);
        assert_eq!(c.add("n", 5).unwrap(), 5);
        assert_eq!(c.add("n", -2).unwrap(), 3);
        assert_eq!(c.get("n", Duration::ZERO).unwrap(), b"3");
        assert_eq!(c.compare_set("cas", None, b"x").unwrap(), b"x");
        assert_eq!(c.compare_set("cas", Some(b"y"), b"z").unwrap(), b"x");
        assert_eq!(c.compare_set("cas", Some(b"x"), b"z").unwrap(), b"z");
        c.wait(&["a", "n"], Duration::from_secs(1)).unwrap();
        assert!(c.check(&["a", "cas"]).unwrap());
        assert!(!c.check(&["a", "nope"]).unwrap());
        c.multi_set(&[("m/1", b"one"), ("m/2", b"two")]).unwrap();
        let values = c.multi_get(&["m/2", "m/1"], Duration::from_secs(1)).unwrap();
        assert_eq!(values, vec![b"two".to_vec(), b"one".to_vec()]);
        c.append("log", b"ab").unwrap();
        c.append("log", b"cd").unwrap();
        assert_eq!(c.get("log", Duration::ZERO).unwrap(), b"abcd");
        assert_eq!(c.keys_with_prefix("m/").unwrap(), ["m/1", "m/2"]);
        assert_eq!(c.num_keys().unwrap(), 6);
        assert!(c.delete("a").unwrap());
        assert!(!c.delete("a").unwrap());
        assert_eq!(c.num_keys().unwrap(), 5);
    });
}

#[test]
fn the_clock_offset_to_a_store_on_this_host_is_within_half_a_round_trip() {
    within(LIMIT, || {
        let (_server, addr) = server();
        let mut c = client(&addr);
        let o = c.clock_offset(5).unwrap();
        // One clock on both sides: the store read it between the sample's
        // send and its answer, so the midpoint misses by at most half the
        // round trip (and a nanosecond of rounding).
        assert!(o.rtt_ns > 0 && o.rtt_ns < 1_000_000_000, "{o:?}");
        assert!(o.offset_ns.unsigned_abs() <= o.rtt_ns / 2 + 1, "{o:?}");
    });
}

#[test]
fn a_get_blocks_until_another_client_sets_the_key() {
    within(LIMIT, || {
        let (_server, addr) = server();
        let a2 = addr.clone();
        let waiter = std::thread::spawn(move || client(&a2).get("late", Duration::from_secs(5)));
        std::thread::sleep(Duration::from_millis(100));
        client(&addr).set("late", b"here").unwrap();
        assert_eq!(waiter.join().unwrap().unwrap(), b"here");
    });
}

#[test]
fn a_timed_out_wait_names_the_missing_keys_and_the_store() {
    within(LIMIT, || {
        let (_server, addr) = server();
        let mut c = client(&addr);
        let timeout = Duration::from_millis(300);
        let start = Instant::now();
        let err = c.get("missing", timeout).unwrap_err();
        let elapsed = start.elapsed();
        assert!(elapsed >= timeout && elapsed < timeout + Duration::from_millis(500), "{elapsed:?}");
        let Error::StoreTimeout { addr: a, keys, waited } = &err else { panic!("{err}") };
        assert_eq!((a, keys.as_slice()), (&addr, &["missing".to_string()][..]));
        assert!(*waited >= timeout);
        assert!(err.to_string().contains(&addr) && err.to_string().contains("missing"), "{err}");

        c.set("present", b"").unwrap();
        let start = Instant::now();
        let err = c.wait(&["present", "absent"], timeout).unwrap_err();
        assert!(start.elapsed() < timeout + Duration::from_millis(500));
        assert!(matches!(&err, Error::StoreTimeout { keys, .. } if keys == &["absent"]), "{err}");
        assert_eq!(err.kind(), ErrorKind::Timeout);

        // The connection is still good after a timeout.
        assert_eq!(c.get("present", Duration::ZERO).unwrap(), b"");
    });
}

#[test]
fn an_abort_wakes_a_blocked_get_at_once_with_its_reason() {
    within(LIMIT, || {
        let (_server, addr) = server();
        let signal = AbortSignal::new().unwrap();
        let mut o = opts();
        o.abort = Some(signal.clone());
        let mut c = StoreClient::connect(&addr, o).unwrap();
        let blocked = std::thread::spawn(move || {
            let result = c.get("never", Duration::from_secs(30));
            (result, Instant::now(), c)
        });
        std::thread::sleep(Duration::from_millis(200));
        let fired = Instant::now();
        signal.abort(Error::aborted("the watchdog gave up on all_reduce #7"));
        let (result, woke, mut c) = blocked.join().unwrap();
        assert!(woke - fired < Duration::from_millis(100), "woke after {:?}", woke - fired);
        let err = result.unwrap_err();
        assert_eq!(err.to_string(), "[aborted] the watchdog gave up on all_reduce #7");
        // Every later call fails fast with the same reason.
        assert_eq!(c.num_keys().unwrap_err().kind(), ErrorKind::Aborted);
    });
}

/// A port nothing listens on (bound, then released).
fn closed_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

#[test]
fn a_closed_port_is_unreachable_after_the_connect_timeout() {
    within(LIMIT, || {
        let addr = closed_port();
        let mut o = opts();
        o.connect_timeout = Duration::from_millis(500);
        let start = Instant::now();
        let err = StoreClient::connect(&addr, o).unwrap_err();
        let elapsed = start.elapsed();
        let Error::StoreUnreachable { addr: a, attempts, waited, last_error } = &err else { panic!("{err}") };
        assert_eq!(a, &addr);
        assert!(*attempts > 1, "{attempts} attempts");
        assert!(*waited >= Duration::from_millis(500), "{waited:?}");
        assert!(elapsed < Duration::from_millis(1500), "{elapsed:?}");
        assert!(last_error.contains("refused"), "{last_error}");
    });
}

/// A listener that accepts connections and then behaves as `serve` says;
/// the accepted sockets stay open until the listener thread ends.
fn fake_server(serve: impl Fn(&mut std::net::TcpStream) + Send + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for mut stream in listener.incoming().flatten().take(4) {
            serve(&mut stream);
            held.push(stream);
        }
        std::thread::sleep(Duration::from_secs(10));
    });
    addr
}

#[test]
fn a_listener_that_never_speaks_is_not_a_store() {
    within(LIMIT, || {
        let addr = fake_server(|_| {});
        let mut o = opts();
        o.connect_timeout = Duration::from_secs(30);
        let start = Instant::now();
        let err = StoreClient::connect(&addr, o).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
        let Error::StoreProtocol { addr: a, detail } = &err else { panic!("{err}") };
        assert_eq!(a, &addr);
        assert!(detail.contains("does not speak the ringleader store protocol"), "{detail}");
        assert!(detail.contains("TCPStore"), "{detail}");
    });
}

#[test]
fn a_listener_that_sends_garbage_is_not_a_store() {
    within(LIMIT, || {
        let addr = fake_server(|s| {
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        });
        let start = Instant::now();
        let err = StoreClient::connect(&addr, opts()).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(1), "{:?}", start.elapsed());
        assert!(matches!(&err, Error::StoreProtocol { detail, .. } if detail.contains("does not speak")), "{err}");
    });
}

#[test]
fn a_store_of_another_protocol_version_is_named() {
    within(LIMIT, || {
        let addr = fake_server(|s| {
            let mut payload = vec![0x81];
            payload.extend(b"RLST");
            payload.extend(99u16.to_le_bytes());
            payload.extend(3u32.to_le_bytes());
            payload.extend(b"9.9");
            payload.extend(b"whatever comes next in protocol 99");
            let _ = s.write_all(&(payload.len() as u32).to_le_bytes());
            let _ = s.write_all(&payload);
        });
        let err = StoreClient::connect(&addr, opts()).unwrap_err();
        let Error::VersionMismatch { detail, versions } = &err else { panic!("{err}") };
        assert!(detail.contains("protocol 99"), "{detail}");
        assert_eq!(versions[0], (format!("the store at {addr}"), "9.9".to_string()));
    });
}

#[test]
fn a_taken_port_names_the_process_holding_it() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let err = StoreServer::bind(&addr, ServerOptions::new(RUN)).unwrap_err();
    let Error::PortInUse { addr: a, holder } = &err else { panic!("{err}") };
    assert_eq!(a, &addr);
    let holder = holder.as_deref().unwrap_or_default();
    assert!(holder.starts_with(&format!("pid {} ", std::process::id())), "{holder}");
    assert!(err.to_string().contains(&format!("pid {}", std::process::id())), "{err}");
}

#[test]
fn a_client_of_another_run_is_refused() {
    within(LIMIT, || {
        let (_server, addr) = server();
        let mut o = opts();
        o.run_id = "yesterday".into();
        let err = StoreClient::connect(&addr, o).unwrap_err();
        let Error::ForeignRun { addr: a, ours, theirs } = &err else { panic!("{err}") };
        assert_eq!((a, ours.as_str(), theirs.as_str()), (&addr, "yesterday", RUN));

        let mut tool = opts();
        (tool.run_id, tool.role) = ("*".into(), Role::Tool);
        StoreClient::connect(&addr, tool).expect("a tool may watch any run");
    });
}

#[test]
fn tokens_must_match_on_both_sides() {
    within(LIMIT, || {
        let mut server_opts = ServerOptions::new(RUN);
        server_opts.token = Some("s3cret".into());
        let (_guarded, guarded) = server_with(server_opts);
        let (_open, open) = server();
        let with_token = |t: &str| {
            let mut o = opts();
            o.token = Some(t.into());
            o
        };
        let auth_failed = |r: Result<StoreClient, Error>| match r {
            Err(Error::AuthFailed { detail, .. }) => detail,
            other => panic!("{other:?}"),
        };
        let none = auth_failed(StoreClient::connect(&guarded, opts()));
        assert!(none.contains("has none"), "{none}");
        let wrong = auth_failed(StoreClient::connect(&guarded, with_token("guess")));
        assert!(wrong.contains("differs"), "{wrong}");
        let unknown = auth_failed(StoreClient::connect(&open, with_token("s3cret")));
        assert!(unknown.contains("does not know the job's token"), "{unknown}");
        let mut ok = StoreClient::connect(&guarded, with_token("s3cret")).unwrap();
        ok.set("k", b"v").unwrap();
    });
}

#[test]
fn a_duplicate_member_is_refused_naming_both_processes() {
    within(LIMIT, || {
        let (_server, addr) = server();
        let member = |pid| {
            let mut o = opts().member(1, 2);
            (o.host, o.pid) = ("node-a".into(), pid);
            StoreClient::connect(&addr, o)
        };
        let _first = member(1111).unwrap();
        let err = member(2222).unwrap_err();
        let Error::DuplicateRank { rank, first, second } = &err else { panic!("{err}") };
        assert_eq!((*rank, first.as_str(), second.as_str()), (1, "node-a pid 1111", "node-a pid 2222"));
    });
}

#[test]
fn a_member_that_leaves_is_left() {
    within(LIMIT, || {
        let (_server, addr) = server();
        let mut member = StoreClient::connect(&addr, opts().member(0, 1)).unwrap();
        member.heartbeat(b"step 12").unwrap();
        member.leave().unwrap();
        drop(member);
        let status = client(&addr).status(None, Duration::ZERO).unwrap();
        let r0 = status.rank(0).unwrap();
        assert_eq!((r0.liveness, r0.pid), (Presence::Left, std::process::id()));
        assert_eq!(r0.heartbeat, b"step 12");
        assert!(r0.heartbeat_age.unwrap() < Duration::from_secs(5));
        assert!(client(&addr).leave().is_err(), "only members leave");
    });
}

#[test]
fn a_member_dropped_without_leaving_vanishes_and_wakes_a_long_poll() {
    within(LIMIT, || {
        let (_server, addr) = server();
        let member = StoreClient::connect(&addr, opts().member(3, 4)).unwrap();
        let mut watcher = client(&addr);
        let seen = watcher.status(None, Duration::ZERO).unwrap().generation;
        let poll = std::thread::spawn(move || {
            let status = watcher.status(Some(seen), Duration::from_secs(5));
            (status, Instant::now())
        });
        std::thread::sleep(Duration::from_millis(200));
        let dropped = Instant::now();
        drop(member);
        let (status, returned) = poll.join().unwrap();
        let status = status.unwrap();
        assert!(returned - dropped < Duration::from_millis(100), "{:?}", returned - dropped);
        assert_eq!(status.with(Presence::Vanished), vec![3]);
        assert_eq!(status.rank(3).unwrap().pid, std::process::id());
        assert!(status.generation > seen);
    });
}

#[test]
fn a_status_poll_that_times_out_answers_the_status() {
    within(LIMIT, || {
        let (_server, addr) = server();
        let mut c = client(&addr);
        let seen = c.status(None, Duration::ZERO).unwrap().generation;
        let start = Instant::now();
        let status = c.status(Some(seen), Duration::from_millis(200)).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(200));
        assert_eq!(status.generation, seen);
    });
}

#[test]
fn the_first_abort_record_wins_and_wakes_watchers() {
    within(LIMIT, || {
        let (_server, addr) = server();
        let mut c = StoreClient::connect(&addr, opts().member(0, 2)).unwrap();
        let mut watcher = client(&addr);
        let seen = watcher.status(None, Duration::ZERO).unwrap().generation;
        let poll = std::thread::spawn(move || watcher.status(Some(seen), Duration::from_secs(5)));
        std::thread::sleep(Duration::from_millis(100));
        // Only a job's ranks abort it.
        let err = client(&addr).abort_job(b"a stranger says stop").unwrap_err();
        assert!(err.to_string().contains("may not abort the job"), "{err}");
        assert!(c.abort_job(b"rank 1 died in all_reduce #3").unwrap());
        assert!(!c.abort_job(b"rank 2 timed out").unwrap());
        let status = poll.join().unwrap().unwrap();
        assert_eq!(status.abort.as_deref(), Some(&b"rank 1 died in all_reduce #3"[..]));
    });
}

#[test]
fn misuse_is_an_invalid_argument_and_leaves_the_connection_usable() {
    within(LIMIT, || {
        let (_server, addr) = server();
        let mut c = client(&addr);
        let err = c.set(&"k".repeat(5000), b"").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        c.set("text", b"abc").unwrap();
        let err = c.add("text", 1).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument { detail, .. } if detail.contains("not a decimal integer")),
            "{err}"
        );
        assert!(c.heartbeat(b"").is_err(), "an aux connection sends no heartbeats");
        assert_eq!(c.num_keys().unwrap(), 1);
        let err = StoreClient::connect("no-port", opts()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    });
}

#[test]
fn a_server_shutting_down_breaks_its_connections_cleanly() {
    within(LIMIT, || {
        let (server, addr) = server();
        let mut c = client(&addr);
        c.set("k", b"v").unwrap();
        server.shutdown();
        let err = c.get("k", Duration::from_secs(1)).unwrap_err();
        assert!(matches!(&err, Error::StoreProtocol { detail, .. } if detail.contains("closed")), "{err}");
        let err = c.num_keys().unwrap_err();
        assert!(err.to_string().contains("broke earlier"), "{err}");
        let mut o = opts();
        o.connect_timeout = Duration::from_millis(200);
        assert!(matches!(StoreClient::connect(&addr, o), Err(Error::StoreUnreachable { .. })));
    });
}

#[test]
fn many_clients_count_together() {
    within(LIMIT, || {
        let (_server, addr) = server();
        let threads: Vec<_> = (0..16)
            .map(|_| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let mut c = client(&addr);
                    for _ in 0..20 {
                        c.add("count", 1).unwrap();
                    }
                    c.wait(&["go"], Duration::from_secs(5))
                })
            })
            .collect();
        let mut c = client(&addr);
        while c.get("count", Duration::from_secs(1)).unwrap() != b"320" {
            std::thread::sleep(Duration::from_millis(5));
        }
        c.set("go", b"").unwrap();
        for t in threads {
            t.join().unwrap().unwrap();
        }
    });
}

#[test]
fn large_values_and_the_answers_after_them_arrive_whole() {
    within(Duration::from_secs(60), || {
        let (_server, addr) = server();
        let mut c = client(&addr);
        // 8 MiB arrives in many reads, and a small answer after it in the
        // same buffer: both whole, the bytes after each frame kept for the
        // next.
        let big: Vec<u8> = (0..8usize << 20).map(|i| (i * 31 % 251) as u8).collect();
        c.set("big", &big).unwrap();
        c.set("small", b"s").unwrap();
        let start = Instant::now();
        for _ in 0..10 {
            assert!(c.get("big", Duration::ZERO).unwrap() == big);
            assert_eq!(c.get("small", Duration::ZERO).unwrap(), b"s");
        }
        let per_get = start.elapsed() / 10;
        // About 10 ms here.
        assert!(per_get < Duration::from_millis(500), "{per_get:?} per 8 MiB get");
        let values = c.multi_get(&["small", "big", "small"], Duration::ZERO).unwrap();
        assert_eq!(values, vec![b"s".to_vec(), big, b"s".to_vec()]);
    });
}
