//! The launcher and ringleader's store: node 0 hosts it in-process
//! ([`host_store`]), and every node's launcher records how its failed ranks
//! ended under `rl/exit/{rank}` ([`ExitRecorder`]), so the survivors'
//! diagnosis can say "rank 1 was killed by signal 9 (SIGKILL, OOM killer)",
//! and watches for the ranks' verdict ([`watch_verdict`]), so that a failed
//! job ends promptly.

use crate::error::Result;
use ringleader_core::error::fmt_ranks;
use ringleader_store::{ClientOptions, Presence, Role, ServerOptions, StoreClient, StoreServer};
use std::cell::Cell;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

/// The key under which the ending of `rank` is recorded.
pub(crate) fn exit_key(rank: usize) -> String {
    ringleader_store::keys::exit(rank)
}

/// Hosts ringleader's store in this process on `addr` (`host:port`, port 0
/// for an ephemeral one) for run `run_id` (`*`: any run), admitting only
/// clients that know `token` if one is given. The server runs on a thread of
/// its own until the returned handle is shut down or dropped.
pub(crate) fn host_store(addr: &str, run_id: &str, token: Option<String>) -> Result<StoreServer> {
    let mut opts = ServerOptions::new(run_id);
    opts.token = token;
    Ok(StoreServer::bind(addr, opts)?)
}

/// Node 0 of several, after its own ranks ended: keeps the store it hosts
/// up while ranks of other nodes are still connected to it, at most `bound`,
/// so that they finish their own diagnosis (a conflicting registration, a
/// verdict) instead of losing the store under their feet.
pub(crate) fn linger(addr: &str, run_id: &str, token: Option<String>, bound: Duration) {
    let deadline = Instant::now() + bound;
    let mut opts = ClientOptions::new(run_id);
    opts.role = Role::Tool;
    opts.token = token;
    opts.connect_timeout = Duration::from_secs(1);
    opts.op_timeout = Duration::from_secs(2);
    let Ok(mut client) = StoreClient::connect(addr, opts) else {
        return;
    };
    let mut seen = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(status) = client.status(seen, left.min(Duration::from_secs(1))) else {
            return;
        };
        let connected = status.with(Presence::Connected);
        if connected.is_empty() {
            return;
        }
        if left.is_zero() {
            eprintln!(
                "ringleader launch: stopping ringleader's store although {} of other nodes {} still connected \
                 ({:.0} s after this node's ranks ended)",
                fmt_ranks(&connected),
                if connected.len() == 1 { "is" } else { "are" },
                bound.as_secs_f64()
            );
            return;
        }
        seen = Some(status.generation);
    }
}

/// Records rank endings in the store from a background thread, so that a
/// slow or unreachable store never delays the teardown.
#[derive(Debug)]
pub(crate) struct ExitRecorder {
    tx: Sender<(usize, String)>,
    /// One message per ending handled (written or given up on).
    handled: Receiver<()>,
    queued: Cell<usize>,
    addr: String,
}

impl ExitRecorder {
    /// Starts the recording thread for the store at `addr` (it connects
    /// right away, in the background).
    pub(crate) fn start(addr: String, run_id: String, token: Option<String>) -> ExitRecorder {
        let (tx, rx) = mpsc::channel::<(usize, String)>();
        let (handled_tx, handled) = mpsc::channel();
        let thread_addr = addr.clone();
        let spawned = std::thread::Builder::new()
            .name("exit-recorder".into())
            .spawn(move || record_all(&thread_addr, &run_id, token, rx, handled_tx));
        if let Err(e) = spawned {
            eprintln!("ringleader launch: warning: endings will not be recorded in the store: {e}");
        }
        ExitRecorder { tx, handled, queued: Cell::new(0), addr }
    }

    /// Queues `text` (how `rank` ended) for the store.
    pub(crate) fn record(&self, rank: usize, text: String) {
        if self.tx.send((rank, text)).is_ok() {
            self.queued.set(self.queued.get() + 1);
        }
    }

    /// Waits up to `timeout` for the queued endings to be written (not at all
    /// when none were queued).
    pub(crate) fn finish(self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        for _ in 0..self.queued.get() {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.handled.recv_timeout(left).is_err() {
                eprintln!(
                    "ringleader launch: warning: how the ranks ended could not be recorded \
                     in the store at {} within {:.0} s",
                    self.addr,
                    timeout.as_secs_f64()
                );
                return;
            }
        }
    }
}

/// The recorder thread: connects at once (so that recording a failure later
/// is one round trip), then writes each ending it is sent, reconnecting once
/// if the connection broke in the meantime.
fn record_all(addr: &str, run_id: &str, token: Option<String>, rx: Receiver<(usize, String)>, handled: Sender<()>) {
    let mut client = connect(addr, run_id, token.clone()).ok();
    if let Some(c) = client.as_mut() {
        // Tells the ranks that endings will be recorded here.
        let _ = c.set(ringleader_store::keys::LAUNCHER, b"1");
    }
    for (rank, text) in rx {
        let key = exit_key(rank);
        let written = match client.as_mut().map(|c| c.set(&key, text.as_bytes())) {
            Some(Ok(())) => Ok(()),
            _ => connect(addr, run_id, token.clone()).and_then(|mut c| {
                c.set(&key, text.as_bytes())?;
                client = Some(c);
                Ok(())
            }),
        };
        if let Err(e) = written {
            eprintln!(
                "ringleader launch: warning: cannot record how rank {rank} ended \
                 in the store at {addr}: {e}"
            );
        }
        let _ = handled.send(());
    }
}

/// How long one wait for the verdict lasts before the watcher asks again
/// (the store bounds every wait; asking again costs one round trip).
const VERDICT_POLL: Duration = Duration::from_secs(30);

/// Watches the store at `addr` for the job's verdict from a background
/// thread and calls `on_verdict` with its headline once it is published.
///
/// Ranks waiting in the failed collective read the verdict and exit by
/// themselves; a rank in the user's own code (sleeping, stuck in a data
/// loader) never reads it, so the launcher must end it, and learning of the
/// verdict at once lets it do so within seconds rather than after a grace
/// period sized for a rank that fails without one. The thread ends when the
/// verdict arrives, when the store goes away, or with the process.
pub(crate) fn watch_verdict(
    addr: String,
    run_id: String,
    token: Option<String>,
    on_verdict: impl FnOnce(String) + Send + 'static,
) {
    let spawned = std::thread::Builder::new().name("verdict-watch".into()).spawn(move || {
        let Ok(mut client) = connect(&addr, &run_id, token) else {
            return;
        };
        loop {
            match client.get(ringleader_store::keys::VERDICT, VERDICT_POLL) {
                Ok(v) => {
                    let headline = serde_json::from_slice::<ringleader_core::Diagnosis>(&v)
                        .map(|d| d.headline.lines().next().unwrap_or_default().to_string())
                        .unwrap_or_default();
                    on_verdict(headline);
                    return;
                }
                Err(ringleader_core::Error::StoreTimeout { .. }) => {}
                // The store went away (the job is over) or refused us: the
                // teardown falls back to the exit-driven grace period.
                Err(_) => return,
            }
        }
    });
    if let Err(e) = spawned {
        eprintln!("ringleader launch: warning: not watching for the verdict: {e}");
    }
}

/// How long the recorder keeps trying to reach the store (node 0 may start
/// after this node).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long it waits for the store to answer a `set`.
const OP_TIMEOUT: Duration = Duration::from_secs(5);

/// An auxiliary (non-member) connection of run `run_id` to the store at `addr`.
fn connect(addr: &str, run_id: &str, token: Option<String>) -> Result<StoreClient> {
    let mut opts = ClientOptions::new(run_id);
    opts.token = token;
    opts.connect_timeout = CONNECT_TIMEOUT;
    opts.op_timeout = OP_TIMEOUT;
    Ok(StoreClient::connect(addr, opts)?)
}
