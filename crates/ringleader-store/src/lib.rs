//! The key-value store of ringleader: rendezvous, and the liveness record
//! that lets a hang explain itself.
//!
//! Ranks of a job meet at one store (hosted by rank 0 or by the launcher).
//! Besides the usual rendezvous operations (set, blocking get, counters,
//! compare-and-set, wait), the store knows *who is connected*: every rank
//! holds one **member** connection for its whole life, and the store tells
//! apart a rank that left cleanly ([`Liveness::Left`]) from one whose
//! connection vanished without a word ([`Liveness::Vanished`]: killed by the
//! OOM killer, crashed, `kill -9`). A long-poll ([`StoreClient::status`])
//! reports such changes within milliseconds, which is what lets the watchdog
//! say "rank 3 (node-b pid 4242) died" instead of waiting for a timeout.
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
//!   it owns the map, the waiters and the liveness table, reads no clock
//!   (callers pass `now`) and does no IO, so expiry is tested with a
//!   synthetic clock.
//! - [`server`]: a thin tokio layer (the mini-redis structure): an accept
//!   loop capped by a semaphore, one task per connection, one actor task
//!   that owns the state.
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

pub use client::{ClientOptions, StoreClient};
pub use job::{JobStatus, Liveness, RankStatus, Role};
pub use server::{port_holder, ServerOptions, StoreServer};

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
}
