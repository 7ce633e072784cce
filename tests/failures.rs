//! Failure paths that must never hang, with real processes: a panic inside
//! ringleader (injected through the test-only hook of
//! `ringleader_core::fault`) on the caller's thread (an inline call), on the
//! engine thread (a queued call), in the transport's driver and on the
//! send/recv lane ends the operation with an `internal` error naming it, on
//! every rank, long before the timeout; and destroying a communicator while
//! another thread is inside a call aborts that call and waits for it; a
//! `/dev/shm` too small for the job (a 64 MiB tmpfs, as containers get by
//! default, mounted in a private mount namespace) is a clear error on every
//! rank before any collective runs, not a SIGBUS; two jobs on one host keep
//! their own dumps.
#![allow(missing_docs)]

mod common;

use common::*;
use ringleader::{Communicator, ReduceOp};
use ringleader_core::fault::{self, Point};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn arg() -> String {
    std::env::var("RL_ARG").unwrap_or_default()
}

/// `point:rank:seq` from RL_PANIC: arms the hook on that rank.
fn arm_from_env(c: &Communicator) {
    let spec = std::env::var("RL_PANIC").unwrap_or_default();
    let parts: Vec<&str> = spec.split(':').collect();
    if let [point, rank, seq] = parts[..] {
        if rank.parse() == Ok(c.rank()) {
            fault::arm(Point::parse(point).expect("panic point"), seq.parse().expect("seq"));
        }
    }
}

/// Five collectives (or sends and receives), the way RL_ARG says; one of
/// them panics on the armed rank. Prints the first error as the ERROR line,
/// and how every later wait ended.
fn panicking() -> i32 {
    let start = Instant::now();
    let c = Communicator::from_env().expect("init");
    arm_from_env(&c);
    let r = match arg().as_str() {
        "sync" => (0..5).try_for_each(|_| c.all_reduce(&mut [1.0f32; 1024], ReduceOp::Sum)),
        "async" => {
            let works: Vec<_> =
                (0..5).map(|_| c.all_reduce_async(vec![1.0f32; 1024], ReduceOp::Sum).expect("submit")).collect();
            let mut first = Ok(());
            let mut works = works.into_iter();
            for w in works.by_ref().take(4) {
                let r = w.wait(None);
                println!("WAITED {}", r.as_ref().map_or_else(|e| e.kind().as_str().to_string(), |_| "ok".into()));
                if first.is_ok() {
                    first = r;
                }
            }
            // The last one is dropped unwaited: dropping waits for it.
            drop(works);
            println!("DROPPED all");
            first
        }
        // Rank 0's sends may all fit in the lane's buffers: it then waits
        // for an answer rank 1 never sends. "p2p": blocking calls (run on
        // the caller's thread); "p2p-lane": rank 1's receives posted in the
        // background before rank 0 sends anything (a barrier between), so
        // that the send/recv lane's thread moves them.
        "p2p" => (0..5)
            .try_for_each(|_| {
                let mut buf = vec![1.0f32; 1024];
                match c.rank() {
                    0 => c.send(&buf, 1),
                    _ => c.recv(&mut buf, 0),
                }
            })
            .and_then(|()| match c.rank() {
                0 => c.recv(&mut [0.0f32; 4], 1),
                _ => c.send(&[0.0f32; 4], 0),
            }),
        "p2p-lane" => match c.rank() {
            0 => c
                .barrier()
                .and_then(|()| (0..5).try_for_each(|_| c.send(&[1.0f32; 1024], 1)))
                .and_then(|()| c.recv(&mut [0.0f32; 4], 1)),
            _ => (0..5)
                .map(|_| c.recv_async(vec![0.0f32; 1024], 0))
                .collect::<ringleader::Result<Vec<_>>>()
                .and_then(|works| {
                    c.barrier()?;
                    works.into_iter().try_for_each(|w| w.wait(None))
                })
                .and_then(|()| c.send(&[0.0f32; 4], 0)),
        },
        other => panic!("unknown mode {other}"),
    };
    match r {
        Ok(()) => {
            println!("DONE");
            0
        }
        Err(e) => {
            report_error(&e, start);
            // Later calls get the same failure at once.
            let again = c.barrier().unwrap_err();
            println!("AGAIN {}", again.kind());
            3
        }
    }
}

/// Rank 1: one thread blocks in an all_reduce rank 0 never joins; the main
/// thread closes the communicator under it.
fn close_racing() -> i32 {
    let c = Arc::new(Communicator::from_env().expect("init"));
    if c.rank() == 0 {
        // Waits for rank 1 to be done, then leaves.
        let dir = std::env::var("RL_MARK_DIR").unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !std::path::Path::new(&dir).join("closed").exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        return 0;
    }
    let inside = c.clone();
    let t = std::thread::spawn(move || {
        let mut buf = vec![1.0f32; 1 << 16];
        let start = Instant::now();
        let r = inside.all_reduce(&mut buf, ReduceOp::Sum);
        (r, start.elapsed())
    });
    // Wait (bounded) until the call is running: its flight-recorder entry
    // says so.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.flight_recorder().iter().any(|e| e.state == ringleader::State::Started) {
        assert!(Instant::now() < deadline, "the all_reduce never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    let t0 = Instant::now();
    c.close().expect("close");
    let closed_in = t0.elapsed();
    // close returned: the operation on the other thread has ended already
    // (its record says how), and the call returns at once; its thread may
    // still be on its last instructions, so its end is waited for, briefly.
    let ended = c.flight_recorder().iter().all(|e| e.state != ringleader::State::Started);
    assert!(ended, "close returned while an operation was still running: {:?}", c.flight_recorder());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !t.is_finished() {
        assert!(Instant::now() < deadline, "the call did not return after close");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (r, _) = t.join().expect("the calling thread");
    let e = r.expect_err("the call was aborted");
    println!("CLOSED {} {}", closed_in.as_millis(), e.kind());
    println!("MESSAGE {e}");
    let later = c.barrier().unwrap_err();
    println!("LATER {}", later.kind());
    mark("closed");
    drop(c);
    0
}

/// Joins, runs a 1 MiB all_reduce, says over what.
fn shm_job() -> i32 {
    let start = Instant::now();
    let r = Communicator::from_env().and_then(|c| {
        c.all_reduce(&mut vec![1.0f32; 1 << 18], ReduceOp::Sum)?;
        println!("TRANSPORT {}", c.transport_name());
        c.destroy()
    });
    match r {
        Ok(()) => 0,
        Err(e) => {
            report_error(&e, start);
            3
        }
    }
}

/// One all_reduce, then a dump on request into the run's folder.
fn dump_job() -> i32 {
    let c = Communicator::from_env().expect("init");
    c.all_reduce(&mut [1.0f32; 8], ReduceOp::Sum).expect("all_reduce");
    let path = c.dump(None).expect("dump");
    println!("DUMPED {}", path.display());
    c.barrier().expect("barrier");
    c.destroy().expect("destroy");
    0
}

#[test]
fn worker() {
    let Some(s) = scenario() else { return };
    let code = match s.as_str() {
        "panicking" => panicking(),
        "close_racing" => close_racing(),
        "shm_job" => shm_job(),
        "dump_job" => dump_job(),
        other => panic!("unknown scenario {other}"),
    };
    std::process::exit(code);
}

fn err_of(o: &Outcome) -> ErrLine {
    o.error().unwrap_or_else(|| panic!("rank {} printed no error:\n{}\n{}", o.rank, o.stdout, o.stderr))
}

/// A panic at `point` (on rank 1, in operation #3) in mode `mode`: every
/// rank fails with `internal`, naming rank 1 and the operation, well before
/// the 30 s timeout.
fn panic_ends_in_internal(point: &str, mode: &str, op: &str) -> Vec<Outcome> {
    let outs = run(JobSpec::new(2, "panicking")
        .env("RL_PANIC", &format!("{point}:1:3"))
        .env("RL_ARG", mode)
        .env("RINGLEADER_TIMEOUT", "30")
        .limit(60));
    for o in &outs {
        let e = err_of(o);
        assert_eq!(e.kind, "internal", "rank {}: {e:?}\n{}", o.rank, o.stderr);
        assert_eq!(e.ranks, vec![1], "{e:?}");
        assert_eq!(e.op.as_deref(), Some(op), "{e:?}");
        assert_eq!(e.seq, Some(3), "{e:?}");
        assert!(e.message.contains("injected fault") && e.message.contains("on rank 1 in"), "{e:?}");
        assert!(e.elapsed_ms < 10_000, "rank {} took {} ms", o.rank, e.elapsed_ms);
        assert_eq!(o.code, Some(3), "{}", o.stderr);
        assert_eq!(o.lines("AGAIN"), vec!["internal".to_string()], "{}", o.stdout);
    }
    outs
}

#[test]
fn a_panic_in_an_inline_call_is_an_internal_error_not_a_hang() {
    let outs = panic_ends_in_internal("engine", "sync", "all_reduce");
    // On the caller's thread, not the engine's.
    let e = err_of(&outs[1]);
    assert!(e.message.contains("panic in thread '") && !e.message.contains("ringleader-engine"), "{e:?}");
}

#[test]
fn a_panic_on_the_engine_thread_completes_every_waiter() {
    let outs = panic_ends_in_internal("engine", "async", "all_reduce");
    assert!(err_of(&outs[1]).message.contains("ringleader-engine-1"), "{:?}", err_of(&outs[1]));
    for o in &outs {
        let waited = o.lines("WAITED");
        assert_eq!(&waited[..2], ["ok", "ok"], "{}", o.stdout);
        assert_eq!(&waited[2..], ["internal", "internal"], "{}", o.stdout);
        assert_eq!(o.lines("DROPPED").len(), 1, "{}", o.stdout);
    }
}

#[test]
fn a_panic_in_the_transport_driver_is_an_internal_error() {
    panic_ends_in_internal("driver", "sync", "all_reduce");
}

#[test]
fn a_panic_on_the_send_recv_lane_is_an_internal_error() {
    let outs = panic_ends_in_internal("p2p", "p2p-lane", "recv");
    assert!(err_of(&outs[1]).message.contains("ringleader-p2p-1"), "{:?}", err_of(&outs[1]));
}

#[test]
fn a_panic_in_a_blocking_recv_run_inline_is_an_internal_error() {
    let outs = panic_ends_in_internal("p2p", "p2p", "recv");
    // On the caller's thread, not the lane's.
    let e = err_of(&outs[1]);
    assert!(e.message.contains("running a recv inline") && !e.message.contains("ringleader-p2p"), "{e:?}");
}

#[test]
fn close_waits_for_a_call_running_on_another_thread() {
    let marks = mark_dir();
    let outs = run(JobSpec::new(2, "close_racing")
        .env("RL_MARK_DIR", marks.to_str().unwrap())
        .env("RINGLEADER_TIMEOUT", "30")
        .limit(60));
    assert_all_ok(&outs);
    let closed = outs[1].lines("CLOSED");
    let (ms, kind) = closed[0].split_once(' ').unwrap();
    assert_eq!(kind, "aborted", "{}", outs[1].stdout);
    assert!(ms.parse::<u64>().unwrap() < 10_000, "close took {ms} ms");
    assert!(outs[1].lines("MESSAGE")[0].contains("destroyed while an operation ran"), "{}", outs[1].stdout);
    assert_eq!(outs[1].lines("LATER"), vec!["aborted".to_string()]);
}

/// Runs [`dev_shm_inner`] in a mount namespace of its own whose `/dev/shm`
/// is a 64 MiB tmpfs (needs root, as CI and the dev machines run; skipped
/// with a note elsewhere).
#[test]
fn a_short_dev_shm_is_a_clear_error_on_every_rank() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: mounting a tmpfs on /dev/shm needs root");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg("mount -t tmpfs -o size=64m tmpfs /dev/shm && exec \"$0\" --exact dev_shm_inner --nocapture --test-threads 1")
        .arg(&exe)
        .env("RL_SHM_INNER", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("unshare");
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    let ereader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (reader.join().unwrap(), ereader.join().unwrap());
    let status = status.unwrap_or_else(|| panic!("past its 120 s limit:\n{stdout}\n{stderr}"));
    if stderr.contains("unshare failed") || stderr.contains("mount: ") && stderr.contains("permission denied") {
        eprintln!("skipped: cannot make a mount namespace here: {stderr}");
        return;
    }
    assert!(status.success() && stdout.contains("DEV_SHM_INNER_OK"), "{status:?}\n{stdout}\n{stderr}");
}

/// Inside the namespace of [`a_short_dev_shm_is_a_clear_error_on_every_rank`].
#[test]
fn dev_shm_inner() {
    if std::env::var("RL_SHM_INNER").is_err() {
        return;
    }
    // 16 streams: each rank's segment holds 17 rings of 2 MiB and their
    // fastbox cells (42.6 MiB); two of them do not fit in 64 MiB.
    let outs = run(JobSpec::new(2, "shm_job").env("RINGLEADER_STREAMS", "16").limit(60));
    for o in &outs {
        let e = err_of(o);
        assert_eq!(e.kind, "invalid-argument", "{e:?}");
        for needle in ["/dev/shm is too small", "64.0 MiB", "need 85.", "RINGLEADER_TRANSPORT=tcp", "--shm-size="] {
            assert!(e.message.contains(needle), "{needle:?} missing from {}", e.message);
        }
        assert!(e.elapsed_ms < 10_000, "{e:?}");
        assert!(!o.stderr.contains("SIGBUS"), "{}", o.stderr);
        println!("rank {}: {}", o.rank, e.message);
    }
    let left: Vec<_> = std::fs::read_dir("/dev/shm").unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "segments left behind: {left:?}");
    // The same job over TCP, and a job that fits, run.
    let outs = run(JobSpec::new(2, "shm_job").env("RINGLEADER_STREAMS", "16").env("RINGLEADER_TRANSPORT", "tcp"));
    assert_all_ok(&outs);
    let outs = run(JobSpec::new(2, "shm_job").env("RINGLEADER_STREAMS", "2").limit(60));
    assert_all_ok(&outs);
    assert_eq!(outs[0].lines("TRANSPORT"), vec!["shm".to_string()]);
    println!("DEV_SHM_INNER_OK");
}

/// Two jobs at once on this host, both with the run id every plain launch
/// gets (`default`) and the default dump folder (TMPDIR points at a scratch
/// folder): each keeps its own dumps, in a private folder of its own.
#[test]
fn two_jobs_on_one_host_keep_their_own_dumps() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = mark_dir();
    let spec = || {
        JobSpec::new(2, "dump_job")
            .rank0_hosts_store()
            .env("RINGLEADER_RUN_ID", "default")
            .env("RINGLEADER_DUMP_DIR", "")
            .env("TMPDIR", tmp.to_str().unwrap())
            .limit(60)
    };
    let (a, b) = (spec(), spec());
    let (a, b) = (start(&a), start(&b));
    let (a, b) = (a.finish(), b.finish());
    assert_all_ok(&a);
    assert_all_ok(&b);
    let root = tmp.join(format!("ringleader-dumps-{}", rustix::process::getuid().as_raw()));
    assert_eq!(std::fs::metadata(&root).unwrap().permissions().mode() & 0o777, 0o700);
    let mut folders = Vec::new();
    for job in [&a, &b] {
        for o in job {
            let path = std::path::PathBuf::from(&o.lines("DUMPED")[0]);
            assert_eq!(path.file_name().unwrap().to_str().unwrap(), format!("ringleader-rank{}.json", o.rank));
            let folder = path.parent().unwrap().to_path_buf();
            assert_eq!(folder.parent().unwrap(), root, "{}", path.display());
            assert!(folder.file_name().unwrap().to_str().unwrap().starts_with("default-"), "{}", path.display());
            assert_eq!(std::fs::metadata(&folder).unwrap().permissions().mode() & 0o777, 0o700);
            let dump: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            assert_eq!(dump["rank"], o.rank);
            folders.push(folder);
        }
    }
    // Both ranks of a job share a folder; the two jobs do not.
    assert_eq!(folders[0], folders[1]);
    assert_eq!(folders[2], folders[3]);
    assert_ne!(folders[0], folders[2]);
    let _ = std::fs::remove_dir_all(&tmp);
}
