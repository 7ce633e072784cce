//! Finding the store: resolve, connect with backoff, handshake.
//!
//! At job start the store may not be up yet (rank 0 is still importing
//! torch), so refused and unreachable connections are retried until the
//! connect timeout. Anything that shows the peer will never become our store
//! (it is another program, another run, another version, or refuses us) ends
//! the attempt at once with the error that says so.

use super::channel::{pause, Channel, Failure};
use super::ClientOptions;
use crate::auth::{self, Transcript};
use crate::codec::{self, Challenge, ClientHello, ClientMsg, ServerMsg, Welcome, WireError, MAGIC, PROTOCOL_VERSION};
use crate::job::Role;
use ringleader_core::{Error, Result};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// One TCP connect attempt gives up after this, so a dropped SYN is retried.
const MAX_ATTEMPT: Duration = Duration::from_secs(5);
/// Even the last attempt gets this long, so that it ends with a real answer
/// (refused, unreachable) rather than an instant timeout.
const MIN_ATTEMPT: Duration = Duration::from_millis(100);
/// A store greets at once; a peer silent for this long is something else.
pub(super) const GREETING_TIMEOUT: Duration = Duration::from_secs(3);

const NOT_OUR_PROTOCOL: &str = "does not speak the ringleader store protocol (is it another program, \
     e.g. torch's TCPStore, listening on that port?)";

/// How one attempt failed.
enum Attempt {
    /// The store may still come up: try again after a pause.
    Retry(String),
    /// Trying again cannot help.
    Fatal(Error),
}

/// Connects and completes the handshake, retrying as the module docs say.
pub(super) fn connect(addr: &str, opts: &ClientOptions) -> Result<Channel> {
    validate(addr, opts)?;
    let start = Instant::now();
    let deadline = super::deadline(start, opts.connect_timeout);
    let mut backoff = FIRST_BACKOFF;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let last_error = match attempt(addr, opts, deadline) {
            Ok(channel) => return Ok(channel),
            Err(Attempt::Fatal(e)) => return Err(e),
            Err(Attempt::Retry(why)) => why,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let waited = start.elapsed();
            return Err(Error::StoreUnreachable { addr: addr.into(), attempts, waited, last_error });
        }
        tracing::debug!(addr, attempts, %last_error, "store not reachable yet");
        pause(backoff.min(left), opts.abort.as_ref())?;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Refuses what no store could accept, before any network traffic.
fn validate(addr: &str, opts: &ClientOptions) -> Result<()> {
    let port = addr.rsplit_once(':').map(|(_, p)| p.parse::<u16>());
    if !matches!(port, Some(Ok(p)) if p != 0) {
        return Err(Error::invalid("store address", format!("{addr:?} is not HOST:PORT")));
    }
    if opts.role == Role::Member && (opts.rank.is_none() || opts.world_size.is_none()) {
        return Err(Error::invalid("rank", "a member connection must name its rank and the world size"));
    }
    if !(opts.role == Role::Tool && opts.run_id == "*") {
        ringleader_core::config::check_run_id("run id", &opts.run_id)?;
    }
    for (what, n) in [("rank", opts.rank), ("world_size", opts.world_size)] {
        if n.is_some_and(|n| u32::try_from(n).is_err()) {
            return Err(Error::invalid(what, format!("{} is too large", n.unwrap_or_default())));
        }
    }
    Ok(())
}

fn attempt(addr: &str, opts: &ClientOptions, deadline: Instant) -> Result<Channel, Attempt> {
    let targets = resolve(addr)?;
    let mut last = String::new();
    for target in targets {
        let now = Instant::now();
        let until = deadline.clamp(now + MIN_ATTEMPT, now + MAX_ATTEMPT);
        match Channel::connect(target, until, opts.abort.clone()) {
            Ok(channel) => return handshake(channel, addr, opts),
            Err(Failure::Aborted(e)) => return Err(Attempt::Fatal(e)),
            Err(Failure::Deadline) => last = format!("connecting to {target} timed out"),
            Err(f) => last = format!("connecting to {target}: {}", describe(f)),
        }
    }
    Err(Attempt::Retry(last))
}

/// DNS may lag behind a job's start (a node's name not yet published), so a
/// failed lookup is retried like a refused connection.
fn resolve(addr: &str) -> Result<Vec<SocketAddr>, Attempt> {
    match addr.to_socket_addrs() {
        Ok(targets) => {
            let targets: Vec<_> = targets.collect();
            match targets.is_empty() {
                true => Err(Attempt::Retry(format!("{addr} resolves to no address"))),
                false => Ok(targets),
            }
        }
        Err(e) => Err(Attempt::Retry(format!("cannot resolve {addr}: {e}"))),
    }
}

fn describe(f: Failure) -> String {
    match f {
        Failure::Aborted(e) => e.to_string(),
        Failure::Deadline => "timed out".into(),
        Failure::Closed => "the connection was closed".into(),
        Failure::Io(e) => e.to_string(),
        Failure::Codec(e) => e.to_string(),
        Failure::Unexpected(what) => what,
    }
}

fn handshake(mut channel: Channel, addr: &str, opts: &ClientOptions) -> Result<Channel, Attempt> {
    let challenge = greeting(&mut channel, addr)?;
    check_version(&challenge, addr, opts).map_err(Attempt::Fatal)?;
    let hello = hello(opts, &challenge);
    let client_nonce = hello.client_nonce;
    let mut frame = Vec::new();
    codec::encode_client(&ClientMsg::Hello(hello), &mut frame)
        .map_err(|e| Attempt::Fatal(Error::invalid("store client options", e.to_string())))?;
    let deadline = Instant::now() + GREETING_TIMEOUT;
    let sent = channel.send(&frame, deadline);
    let reply = sent.and_then(|()| channel.recv(deadline, codec::decode_server));
    let welcome = match reply.map_err(|f| after_hello(f, addr))? {
        ServerMsg::Welcome(w) => w,
        // Full for now (connections, runs): like a store not up yet.
        ServerMsg::Reject(WireError::Busy { detail }) => {
            return Err(Attempt::Retry(format!("the store is busy: {detail}")))
        }
        ServerMsg::Reject(reason) => return Err(Attempt::Fatal(reason.into_error(addr))),
        other => return Err(protocol(addr, format!("answered our hello with {}", super::brief(&other)))),
    };
    check_welcome(&welcome, &challenge, &client_nonce, addr, opts).map_err(Attempt::Fatal)?;
    Ok(channel)
}

/// The server's challenge. Silence, garbage or the wrong magic means we
/// reached something that is not a store, and retrying will not change that;
/// a close before any byte may be a store shutting down or restarting.
fn greeting(channel: &mut Channel, addr: &str) -> Result<Challenge, Attempt> {
    let deadline = Instant::now() + GREETING_TIMEOUT;
    channel.recv(deadline, codec::decode_greeting).map_err(|f| match f {
        Failure::Aborted(e) => Attempt::Fatal(e),
        Failure::Closed => Attempt::Retry("the connection was closed before the store greeted us".into()),
        Failure::Io(e) => Attempt::Retry(format!("the connection failed before the store greeted us: {e}")),
        Failure::Deadline => {
            let secs = GREETING_TIMEOUT.as_secs_f64();
            protocol(
                addr,
                format!("accepted the connection but sent no greeting within {secs:.1} s: it {NOT_OUR_PROTOCOL}"),
            )
        }
        Failure::Codec(e) => {
            protocol(addr, format!("answered with bytes that are not a store greeting ({e}): it {NOT_OUR_PROTOCOL}"))
        }
        Failure::Unexpected(what) => protocol(addr, what),
    })
}

fn after_hello(f: Failure, addr: &str) -> Attempt {
    match f {
        Failure::Aborted(e) => Attempt::Fatal(e),
        // A store closes connections that wait too long for their hello
        // (it answers `busy` first, but our hello may cross that): retry.
        Failure::Closed => Attempt::Retry("the store closed the connection during the handshake".into()),
        Failure::Deadline => protocol(addr, format!("did not answer our hello within {GREETING_TIMEOUT:?}")),
        other => protocol(addr, format!("the handshake failed: {}", describe(other))),
    }
}

fn protocol(addr: &str, detail: String) -> Attempt {
    Attempt::Fatal(Error::StoreProtocol { addr: addr.into(), detail })
}

fn check_version(challenge: &Challenge, addr: &str, opts: &ClientOptions) -> Result<()> {
    if challenge.magic != MAGIC {
        return Err(Error::StoreProtocol {
            addr: addr.into(),
            detail: format!("sent the wrong magic: it {NOT_OUR_PROTOCOL}"),
        });
    }
    if challenge.protocol_version == PROTOCOL_VERSION {
        return Ok(());
    }
    Err(Error::VersionMismatch {
        detail: format!(
            "the store at {addr} speaks store protocol {} and this process protocol {PROTOCOL_VERSION}",
            challenge.protocol_version
        ),
        versions: vec![
            (format!("the store at {addr}"), challenge.library_version.clone()),
            (format!("{} pid {}", opts.host, opts.pid), opts.library_version.clone()),
        ],
    })
}

fn transcript<'a>(challenge: &'a Challenge, client_nonce: &'a [u8; 32], opts: &'a ClientOptions) -> Transcript<'a> {
    Transcript {
        server_nonce: &challenge.nonce,
        client_nonce,
        run_id: &opts.run_id,
        role: opts.role,
        rank: opts.rank.map(|r| r as u32),
    }
}

fn hello(opts: &ClientOptions, challenge: &Challenge) -> ClientHello {
    let client_nonce = auth::nonce();
    let mac = opts.token.as_deref().map(|token| transcript(challenge, &client_nonce, opts).client_mac(token));
    ClientHello {
        magic: MAGIC,
        protocol_version: PROTOCOL_VERSION,
        library_version: opts.library_version.clone(),
        run_id: opts.run_id.clone(),
        role: opts.role,
        rank: opts.rank.map(|r| r as u32),
        world_size: opts.world_size.map(|w| w as u32),
        host: opts.host.clone(),
        pid: opts.pid,
        client_nonce,
        mac,
    }
}

/// A client with a token authenticates the store too: a store that accepted
/// us without checking a token is not our job's store.
fn check_welcome(
    welcome: &Welcome,
    challenge: &Challenge,
    client_nonce: &[u8; 32],
    addr: &str,
    opts: &ClientOptions,
) -> Result<()> {
    let Some(token) = opts.token.as_deref() else {
        return Ok(());
    };
    let detail = match &welcome.server_mac {
        None => "the store does not know the job's token (it runs without one)",
        Some(mac) if transcript(challenge, client_nonce, opts).verify_server(token, mac) => return Ok(()),
        Some(_) => "the store's proof of the token is wrong (it has a different token)",
    };
    Err(Error::AuthFailed { addr: addr.into(), detail: detail.into() })
}
