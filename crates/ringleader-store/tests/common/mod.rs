//! Helpers shared by the integration tests: a real server on 127.0.0.1:0,
//! client options with short timeouts, and a hard time limit for anything
//! that might hang.

#![allow(dead_code)] // each test binary uses a different subset

use ringleader_store::{ClientOptions, ServerOptions, StoreClient, StoreServer};
use std::sync::mpsc;
use std::time::Duration;

pub(crate) const RUN: &str = "test-run";

/// A server for [`RUN`] and its address.
pub(crate) fn server() -> (StoreServer, String) {
    server_with(ServerOptions::new(RUN))
}

pub(crate) fn server_with(opts: ServerOptions) -> (StoreServer, String) {
    let server = StoreServer::bind("127.0.0.1:0", opts).expect("bind a test server");
    let addr = server.local_addr().to_string();
    (server, addr)
}

/// Aux client options for [`RUN`] with test-sized timeouts.
pub(crate) fn opts() -> ClientOptions {
    let mut o = ClientOptions::new(RUN);
    o.connect_timeout = Duration::from_secs(2);
    o.op_timeout = Duration::from_secs(2);
    o
}

pub(crate) fn client(addr: &str) -> StoreClient {
    StoreClient::connect(addr, opts()).expect("connect a test client")
}

/// Runs `f` on a thread and fails the test if it does not finish within
/// `limit`, so that a hang is a failure rather than a stuck test run.
pub(crate) fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        // The closure panicked: re-raise its panic.
        Err(mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the worker sends before it ends"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("the test did not finish within {limit:?}"),
    }
}
