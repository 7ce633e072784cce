//! The accept loop and the actor that owns the state.

use super::connection;
use super::event::Event;
use super::ServerOptions;
use crate::auth;
use crate::codec::ServerMsg;
use crate::state::{ConnId, Outbox, ServerState};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// Events queued for the actor before connection tasks wait (backpressure).
const EVENT_QUEUE: usize = 1024;
const FIRST_ACCEPT_BACKOFF: Duration = Duration::from_millis(5);
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// Serves until `stop` fires (or its sender is dropped). Returning drops the
/// runtime, which cancels every connection task and so closes its socket.
pub(super) async fn serve(
    listener: std::net::TcpListener,
    opts: ServerOptions,
    stop: oneshot::Receiver<()>,
    traffic: Arc<connection::Counters>,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(%e, "the store cannot watch its listening socket");
            return;
        }
    };
    let (events, inbox) = mpsc::channel(EVENT_QUEUE);
    let input = connection::InputBudget::new(opts.limits.input_bytes);
    let state = ServerState::new(&opts.run_id, opts.token.as_deref(), opts.limits);
    tokio::spawn(actor(state, inbox));
    tokio::select! {
        () = accept_loop(listener, events, input, traffic) => {}
        _ = stop => tracing::info!("store shutting down"),
    }
}

/// Accepts every connection: the state decides which stay (it closes the
/// oldest of too many that have not said hello, and refuses what is over
/// its limits), so the door is never held shut by idle sockets.
async fn accept_loop(
    listener: TcpListener,
    events: mpsc::Sender<Event>,
    input: connection::InputBudget,
    traffic: Arc<connection::Counters>,
) {
    for n in 1.. {
        let (stream, peer) = accept(&listener).await;
        tokio::spawn(connection::run(ConnId(n), stream, peer, events.clone(), input.clone(), traffic.clone()));
    }
}

/// Accepts one connection, backing off while `accept` fails (out of
/// descriptors, say) instead of spinning.
async fn accept(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    let mut backoff = FIRST_ACCEPT_BACKOFF;
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(e) => {
                tracing::warn!(%e, ?backoff, "store accept failed; backing off");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_ACCEPT_BACKOFF);
            }
        }
    }
}

/// Owns the state: applies events in arrival order, fires deadlines, and
/// routes the answers to the connections' outboxes.
async fn actor(mut state: ServerState, mut inbox: mpsc::Receiver<Event>) {
    let mut routes = HashMap::new();
    loop {
        let out = tokio::select! {
            event = inbox.recv() => match event {
                Some(event) => apply(&mut state, &mut routes, event),
                None => return,
            },
            () = sleep_until(state.poll_timeout()) => state.handle_timeout(Instant::now()),
        };
        for (conn, msg) in out {
            if let Some(outbox) = routes.get(&conn) {
                // A closed outbox means the connection task is ending; its
                // `Closed` event follows.
                let _ = outbox.send(msg);
            }
        }
    }
}

fn apply(
    state: &mut ServerState,
    routes: &mut HashMap<ConnId, mpsc::UnboundedSender<ServerMsg>>,
    event: Event,
) -> Outbox {
    let now = Instant::now();
    match event {
        Event::Opened { conn, outbox } => {
            routes.insert(conn, outbox);
            state.connection_opened(conn, auth::nonce(), now)
        }
        Event::Hello { conn, hello } => state.handle_hello(conn, hello, now),
        Event::Request { conn, id, req, input } => {
            let out = state.handle(conn, id, req, now);
            // The state holds the bytes now (counted in its budget).
            drop(input);
            out
        }
        Event::Written { conn, weight } => {
            state.written(conn, weight);
            Outbox::new()
        }
        Event::Closed { conn } => {
            routes.remove(&conn);
            state.connection_closed(conn, now)
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}
