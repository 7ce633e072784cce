//! Byte channels between ranks, and the driver that runs algorithms on them.
//!
//! The layers, bottom up:
//! - [`frame`] and [`hello`]: the wire formats, sans-IO, tested without sockets;
//! - [`tcp`]: choosing a listen address, building the full mesh at init, the
//!   nonblocking socket;
//! - [`shm`]: rings in shared memory between ranks on one host, and
//!   [`stream_copy`], the cache-bypassing copy large receives use;
//! - `rdma` (feature `rdma`): reliable-connected verbs queue pairs, with
//!   the protocol written against a small trait that the `ibverbs` binding
//!   and a software model of the queues both implement;
//! - [`link`]: one ordered stream to one peer, whatever it is made of;
//! - [`driver`]: runs a collective's [`plan::Plan`] (sends, receives,
//!   reductions and their dependencies) over the links, full duplex, on one
//!   thread, waking on abort.
//!
//! Algorithms live in the `ringleader` crate and only build plans: they never
//! see a socket (the seam gloo draws between algorithms and transports).
// Unsafe code is confined to the shared-memory module (mapped memory
// shared with other processes), the streaming copy (SIMD intrinsics) and
// the verbs binding (rdma::ibv);
// everything else is safe Rust.
#![deny(unsafe_code)]

pub mod driver;
pub mod frame;
pub mod hello;
pub mod link;
pub mod plan;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod shm;
pub mod stream_copy;
pub mod tcp;

pub use driver::{Driver, Idle, Watch};
pub use link::{AnyLink, Link};
pub use plan::{Buf, Chan, OpInfo, Plan, RecvMode, Region};
pub use tcp::{DataListener, ListenOptions, Mesh, MeshOptions};
