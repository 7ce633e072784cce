//! The key-value store of ringleader: rendezvous, and the liveness record
//! that lets a hang explain itself.
//!
//! Ranks of a job meet at one store (hosted by rank 0 or by the launcher).
//! Besides the usual rendezvous operations (set, blocking get, counters,
//! compare-and-set, wait), the store knows *who is connected*: every rank
//! holds one **member** connection for its whole life, and the store tells
//! apart a rank that left cleanly ([`Presence::Left`]) from one whose
//! connection vanished without a word ([`Presence::Vanished`]: killed by the
//! OOM killer, crashed, `kill -9`). A long-poll ([`StoreClient::changes`])
//! reports such changes within milliseconds, which is what lets the watchdog
//! say "rank 3 (node-b pid 4242) died" instead of waiting for a timeout; it
//! answers only what changed since the reader's last answer (heartbeats are
//! not changes), so the job's news costs the store O(world size), not the
//! O(world size²) of every rank re-reading the whole status
//! ([`StoreClient::status`], which a rank reads once). The example
//! `store_load` simulates thousands of ranks against a real store to
//! measure that.
//!
//! # Who may do what
//!
//! Every connection starts with a handshake: the store's challenge (which
//! names no run), the client's hello (run id, role, rank, world size, host,
//! pid), and, when the store has a token (`RINGLEADER_TOKEN`), a proof of
//! the token from each side; the token never crosses the wire. A client
//! without the token is refused (`auth-failed`) before anything is said
//! about the runs the store serves. Admitted connections then act by their
//! role:
//!
//! | | member | rank's helper | other helper | tool |
//! |---|---|---|---|---|
//! | who | a rank's [`Role::Member`] connection | a [`Role::Aux`] naming a rank whose member connection (same host, same pid) is connected | any other [`Role::Aux`]: a launcher, a doctor, a user program | a [`Role::Tool`]: `ringleader status` |
//! | read keys and the job's status | yes | yes | yes | yes |
//! | write keys outside `rl/` | yes | yes | yes | no |
//! | write ringleader's keys (`rl/...`) | yes | yes | only [`keys::tool_may_write`]'s | only [`keys::tool_may_write`]'s |
//! | abort the job | yes | yes | no | no |
//! | heartbeat, leave | its own rank | no | no | no |
//!
//! [`keys::tool_may_write`] names what launchers and tools record: how
//! ranks ended, that a launcher records them, dump requests, duplicate-rank
//! notes and doctor reports. A member names its rank and a world size
//! (at most 65,536) it is below, and claims a rank no other process of its
//! run holds; only a tool may use the run id `*` (the store's run, when it
//! serves one). A store hosted by a job serves that run alone; the
//! standalone `ringleader store` serves several runs side by side, each
//! with its own keys, ranks, abort record and verdict, created when its
//! first member or helper connects and dropped a while after its last
//! connection closed.
//!
//! Nobody can exhaust the store: writes are checked against a memory budget
//! per run and per store and key limits per run and per connection before
//! they are stored, answers are sized before they are built (refused past
//! the frame limit or what may be queued for a connection), parked waits
//! are capped per connection, connections that have not said hello have
//! their own small cap (one more closes the oldest) and a few seconds to
//! say it, a rank has a few helper connections at most, and connections
//! besides the ranks' own are admitted in proportion to the world sizes and
//! closed after a long silence. See [`Limits`].
//!
//! **Without a token** the store cannot tell a stranger from a rank: anyone
//! who reaches its port can read every key and the status (and so learn the
//! run id), write keys outside `rl/` and the launchers' keys, and, by
//! claiming a rank no process holds yet or posing as a rank's helper (the
//! host and pid are in the status), do what that rank may. The limits
//! still hold. Set `RINGLEADER_TOKEN` wherever the store's port is
//! reachable by others.
//!
//! # What it does not do
//! It moves no tensor data (that is `ringleader-transport`), persists
//! nothing, and knows nothing about collectives: heartbeats carry an opaque
//! payload that higher layers fill.
//!
//! # Layout
//! - `codec`: the wire format, sans-IO. Frames are `u32 LE length | payload`;
//!   every length read from the wire is bounded before anything is allocated.
//! - `state`: the server as a pure state machine in the style of quinn-proto:
//!   it owns the runs (map, waiters, liveness table), the connections and
//!   every budget, reads no clock (callers pass `now`) and does no IO, so
//!   expiry is tested with a synthetic clock, and fuzzed with random
//!   request sequences.
//! - [`server`]: a thin tokio layer (the mini-redis structure): an accept
//!   loop and the actor that owns the state (`server/runtime.rs`), one task
//!   per connection (`server/connection.rs`), and the events the second
//!   sends the first (`server/event.rs`, so neither imports the other).
//! - [`client`]: a blocking client on a std socket in which every wait is
//!   bounded by a deadline and woken by an [`AbortSignal`](ringleader_core::AbortSignal).
//! - [`job`]: the liveness vocabulary shared by both sides.
//!
//! Every failure is a [`ringleader_core::Error`]; the server decides
//! handshake rejections and the client returns the very variant it decided.
//!
//! ```
//! use ringleader_store::{ClientOptions, ServerOptions, StoreClient, StoreServer};
//! use std::time::Duration;
//! # fn main() -> ringleader_core::Result<()> {
//! let server = StoreServer::bind("127.0.0.1:0", ServerOptions::new("job-42"))?;
//! let addr = server.local_addr().to_string();
//! let mut rank0 = StoreClient::connect(&addr, ClientOptions::new("job-42").member(0, 2))?;
//! rank0.set("addr/0", b"10.0.0.1:40000")?;
//! let v = rank0.get("addr/0", Duration::from_secs(1))?;
//! assert_eq!(v, b"10.0.0.1:40000");
//! rank0.leave()?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod auth;
pub mod client;
mod codec;
pub mod job;
pub mod keys;
pub mod server;
mod state;

pub use client::{ClientOptions, ClockOffset, StoreClient};
pub use job::{JobChanges, JobStatus, Presence, RankStatus, Role};
pub use server::{port_holder, ServerOptions, StoreServer, Traffic};
pub use state::Limits;

/// Entry points for fuzz targets only; not part of the supported API
/// (rustls does the same for its deframer fuzzer).
#[doc(hidden)]
pub mod fuzzing {
    /// Decodes `data` as every message direction; whatever decodes must
    /// re-encode to the same bytes. Panics on a violation, which is what a
    /// fuzzer looks for.
    pub fn decode(data: &[u8]) {
        crate::codec::fuzz_round_trip(data);
    }

    /// Reads `data` as a script of connections, hellos, requests, writes,
    /// closes and passing time, plays it against the server state machine
    /// and checks after every step that its books balance and every bound
    /// holds. Panics on a violation.
    pub fn state_machine(data: &[u8]) {
        crate::state::fuzz::run(data);
    }
}
