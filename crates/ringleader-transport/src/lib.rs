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
//! - [`cpu`]: where a rank's thread runs, and moving it off a core it
//!   shares with a peer it waits for;
//! - [`plane`]: setting up the data plane over the TCP mesh (shared memory
//!   for ranks on one host) and splitting each pair's links into the
//!   collectives' streams and the send/recv lane;
//! - [`driver`]: runs a collective's [`plan::Plan`] (sends, receives,
//!   reductions and their dependencies) over the links, full duplex, on one
//!   thread, waking on abort; moves the send/recv lane's frames and puts
//!   its thread to sleep ([`driver::lane`]: the runtime's `p2p.rs` keeps
//!   only the queues and their bookkeeping); and writes the goodbye frames
//!   of a rank that leaves ([`driver::say_goodbye`]). It is the only code
//!   that moves frames on a link.
//!
//! Algorithms live in the `ringleader` crate and only build plans: they never
//! see a socket (the seam gloo draws between algorithms and transports).
//!
//! # Where to change what
//!
//! - **Add a transport**: a type that implements [`Link`] (`src/link.rs`:
//!   the core every link has, and the capabilities [`link::Mapped`],
//!   [`link::SingleCopy`], [`link::Splice`], [`link::Fastbox`] it may
//!   offer), in a module of its own beside `src/tcp/`, `src/shm/` and
//!   `src/rdma/`, with its set-up returning [`AnyLink`]s
//!   (`links[peer][stream]`) that replace the TCP mesh's where it
//!   applies, as [`plane::attach_shm`] does for shared
//!   memory (`src/plane.rs`; RDMA, whose endpoints go through the store, is
//!   wired in by the `ringleader` crate's `src/rdma.rs`). Nothing in the
//!   driver names a transport.
//! - **Change how a rank waits** when no link can move: `src/driver/wait.rs`
//!   ([`driver::wait`]): every spin, yield and poll constant, the idle
//!   policy ([`Idle`]) and the sleep itself; how a link wakes a sleeper is
//!   its [`link::Wake`].
//! - **Add a zero-copy protocol**: a capability in `src/link.rs` that the
//!   transports able to do it implement, a file of its own under
//!   `src/driver/` beside `single_copy.rs` (the receiver copies out of the
//!   sender's memory) and `splice.rs` (the sender lends its pages, the
//!   receiver acknowledges), a [`driver`] payload kind (`chan.rs`'s
//!   `Payload`) and the choice of it (`send.rs`'s `SendPolicy::payload`).
//! - **Change the wire format**: `src/frame.rs` (data frames) and
//!   `src/hello.rs` (connection set-up); both are sans-IO with fuzz targets.
//! - **Change how a received payload lands** (copied, streamed, reduced):
//!   `src/driver/strategy.rs`.
//! - **Change how sends and receives move** (point-to-point framing, its
//!   header check, the lane's sleep): `src/driver/lane.rs`; the lane's
//!   queues, ordering and timeouts are the `ringleader` crate's `src/p2p.rs`.
//!
//! The largest file of the crate stays under 600 lines: a file that grows
//! past that holds two concepts.
// Unsafe code is confined to the shared-memory module (mapped memory
// shared with other processes), the streaming copy (SIMD intrinsics), the
// verbs binding (rdma::ibv), sending by reference (`Splice::try_splice`,
// whose contract the one call in `driver/splice.rs` argues) and asking
// glibc for the current CPU (`cpu::current`);
// everything else is safe Rust.
#![deny(unsafe_code)]

pub mod cpu;
pub mod driver;
pub mod frame;
pub mod hello;
pub mod link;
pub mod plan;
pub mod plane;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod shm;
pub mod stream_copy;
pub mod tcp;

pub use driver::{Deadline, Driver, Express, Idle, Watch};
pub use link::{AnyLink, Link};
pub use plan::{Buf, Chan, OpInfo, Plan, RecvMode, Region};
pub use tcp::{DataListener, ListenOptions, Mesh, MeshOptions};
