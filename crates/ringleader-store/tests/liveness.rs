//! A real process holding a member connection is killed with SIGKILL: the
//! store must report its rank as vanished, with its pid, within a second.
//!
//! The child is this very test binary, re-run with an environment variable
//! that turns `child_member_process` from a no-op into the child's body.

mod common;

use common::{client, opts, server, within};
use ringleader_store::{Presence, StoreClient};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "RINGLEADER_STORE_TEST_CHILD_ADDR";
const READY: &str = "CHILD-MEMBER-READY";

/// The child's body when run by `a_killed_member_process_vanishes`; a no-op
/// in a normal test run.
#[test]
fn child_member_process() {
    let Ok(addr) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut member = StoreClient::connect(&addr, opts().member(1, 2)).unwrap();
    member.heartbeat(b"child alive").unwrap();
    println!("{READY}");
    // The parent kills us long before this ends; the bound keeps an
    // orphaned child from lingering if the parent itself dies.
    std::thread::sleep(Duration::from_secs(20));
}

/// Kills the child when dropped, so a failing test leaves no process behind.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_child(addr: &str) -> KillOnDrop {
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["child_member_process", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    KillOnDrop(child)
}

/// Waits for the child's ready line, at most `limit`.
fn await_ready(child: &mut KillOnDrop, limit: Duration) {
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let ready = BufReader::new(stdout).lines().map_while(Result::ok).any(|l| l.contains(READY));
        let _ = tx.send(ready);
    });
    assert_eq!(rx.recv_timeout(limit), Ok(true), "the child did not become ready");
}

#[test]
fn a_killed_member_process_vanishes() {
    within(Duration::from_secs(20), || {
        let (_server, addr) = server();
        let mut child = spawn_child(&addr);
        await_ready(&mut child, Duration::from_secs(10));
        let pid = child.0.id();

        let mut watcher = client(&addr);
        let before = watcher.status(None, Duration::ZERO).unwrap();
        let r1 = before.rank(1).unwrap();
        assert_eq!((r1.liveness, r1.pid, r1.heartbeat.as_slice()), (Presence::Connected, pid, &b"child alive"[..]));

        let killed = Instant::now();
        child.0.kill().unwrap(); // SIGKILL: no chance to say goodbye
        let after = watcher.status(Some(before.generation), Duration::from_secs(5)).unwrap();
        assert!(killed.elapsed() < Duration::from_secs(1), "{:?}", killed.elapsed());
        let r1 = after.rank(1).unwrap();
        assert_eq!((r1.liveness, r1.pid), (Presence::Vanished, pid));
    });
}
