//! The store server: a thin tokio layer around the sans-IO server state
//! machine (the crate's `state` module).
//!
//! Built the mini-redis way: an accept loop that backs off when `accept`
//! fails, one task per connection that decodes frames and writes answers, and
//! one actor task that owns the state, so no lock is ever held across an
//! await. Deadlines (parked waits, overdue hellos, idle runs) come from
//! `ServerState::poll_timeout`. Which connections stay open is the state's
//! decision (it caps those waiting for their hello and closes the oldest,
//! and admits others by the runs' world sizes), so a storm of silent
//! sockets cannot hold the door shut. Frames over 64 KiB wait for room in a
//! store-wide budget of input bytes before they are read, and answers are
//! weighed out as they are written, so that what a connection has queued
//! stays bounded.
//!
//! The server runs on its own thread with a current-thread runtime: it must
//! keep answering while the thread that started it (rank 0's training loop)
//! is busy or blocked in a collective, and it must not depend on the caller
//! having a runtime. Binding happens before that thread starts, so a taken
//! port is reported at once by [`StoreServer::bind`].

mod connection;
mod event;
mod holder;
mod runtime;

pub use holder::port_holder;

use crate::state::Limits;
use ringleader_core::{Error, Result};
use std::fmt;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use tokio::sync::oneshot;

/// Who the server admits, and how much it lets them use.
///
/// ```
/// use ringleader_store::ServerOptions;
/// let mut opts = ServerOptions::new("job-42");
/// opts.token = Some("s3cret".into());
/// assert!(!format!("{opts:?}").contains("s3cret"));
/// ```
#[derive(Clone)]
pub struct ServerOptions {
    /// The run this store serves; clients of another run are refused with
    /// [`Error::ForeignRun`]. `*` serves any number of runs side by side,
    /// each created when its first rank connects, each with its own keys,
    /// ranks and abort record (the standalone `ringleader store`).
    pub run_id: String,
    /// Shared secret every client must prove it knows; `None` admits anyone.
    pub token: Option<String>,
    /// Budgets and caps (see [`Limits`]).
    pub limits: Limits,
}

impl ServerOptions {
    /// A server for `run_id`, without a token, with the default limits.
    pub fn new(run_id: impl Into<String>) -> ServerOptions {
        ServerOptions { run_id: run_id.into(), token: None, limits: Limits::default() }
    }
}

impl fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerOptions")
            .field("run_id", &self.run_id)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("limits", &self.limits)
            .finish()
    }
}

/// A running store server. Dropping it (or [`StoreServer::shutdown`]) stops
/// it: connections close, so clients see the store go away.
///
/// ```
/// use ringleader_store::{ServerOptions, StoreServer};
/// let server = StoreServer::bind("127.0.0.1:0", ServerOptions::new("*")).unwrap();
/// assert_ne!(server.local_addr().port(), 0);
/// server.shutdown();
/// ```
pub struct StoreServer {
    addr: SocketAddr,
    traffic: Arc<connection::Counters>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreServer").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl StoreServer {
    /// Binds `addr` (`host:port`; port 0 picks a free one) and starts serving
    /// on a thread of its own.
    ///
    /// A taken port is [`Error::PortInUse`], naming the process that holds
    /// it where `/proc` shows it; an address that cannot be bound for
    /// another reason is [`Error::InvalidArgument`].
    pub fn bind(addr: &str, opts: ServerOptions) -> Result<StoreServer> {
        if opts.run_id != "*" {
            ringleader_core::config::check_run_id("run id", &opts.run_id)?;
        }
        let listener = bind_listener(addr)?;
        let local = listener.local_addr().map_err(|e| bad_addr(addr, e))?;
        listener.set_nonblocking(true).map_err(|e| bad_addr(addr, e))?;
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| cannot_start(addr, e))?;
        let (stop, stopped) = oneshot::channel();
        let traffic = Arc::new(connection::Counters::default());
        let counted = traffic.clone();
        let thread = std::thread::Builder::new()
            .name("ringleader-store".into())
            .spawn(move || rt.block_on(runtime::serve(listener, opts, stopped, counted)))
            .map_err(|e| cannot_start(addr, e))?;
        tracing::info!(addr = %local, "store listening");
        Ok(StoreServer { addr: local, traffic, stop: Some(stop), thread: Some(thread) })
    }

    /// The address actually bound (with the port chosen when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the server's connections have read and written since it
    /// started (every connection, handshakes included).
    pub fn traffic(&self) -> Traffic {
        let c = &self.traffic;
        Traffic {
            bytes_in: c.bytes_in.load(Ordering::Relaxed),
            bytes_out: c.bytes_out.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting, closes every connection and waits for the server
    /// thread to end.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!(addr = %self.addr, "the store thread panicked");
            }
        }
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// A server's traffic so far ([`StoreServer::traffic`]): what its load
/// costs the network, next to its thread's CPU time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Bytes read from every connection.
    pub bytes_in: u64,
    /// Bytes written to every connection.
    pub bytes_out: u64,
    /// Requests received (handshakes not counted).
    pub requests: u64,
    /// Socket writes (each carries one or more answers).
    pub writes: u64,
}

/// Binds the first address `addr` resolves to that can be bound.
fn bind_listener(addr: &str) -> Result<TcpListener> {
    let targets: Vec<SocketAddr> = addr.to_socket_addrs().map_err(|e| bad_addr(addr, e))?.collect();
    let mut last = None;
    for target in &targets {
        match TcpListener::bind(target) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some((target.port(), e)),
        }
    }
    Err(match last {
        Some((port, e)) if e.kind() == std::io::ErrorKind::AddrInUse => {
            Error::PortInUse { addr: addr.to_string(), holder: port_holder(port) }
        }
        Some((_, e)) => bad_addr(addr, e),
        None => Error::invalid("store address", format!("{addr:?} resolves to no address")),
    })
}

fn bad_addr(addr: &str, e: std::io::Error) -> Error {
    Error::invalid("store address", format!("cannot listen on {addr}: {e}"))
}

/// The runtime or its thread could not start: the machine is out of
/// threads or descriptors. Core has no variant for local resource
/// exhaustion, so this reports it as the store being unreachable.
fn cannot_start(addr: &str, e: std::io::Error) -> Error {
    Error::StoreProtocol { addr: addr.to_string(), detail: format!("cannot start the store server: {e}") }
}
