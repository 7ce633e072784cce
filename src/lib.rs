//! ringleader: collective communication whose hangs explain themselves.
//!
//! A [`Communicator`] joins a job (rendezvous through a TCP store), connects
//! to every peer, and runs all_reduce, all_gather, reduce_scatter,
//! broadcast, reduce, all_to_all, barrier and send/recv over them. Every
//! collective is numbered and fingerprinted, so ranks that disagree fail at
//! once with `mismatch`; a flight recorder keeps the last operations; a
//! monitor thread heartbeats, watches the running operation and hears about
//! dead or departed ranks; and every failure ends in one verdict, the same on
//! every rank, naming the culprit ranks, the collective and the cause.
//!
//! ```no_run
//! use ringleader::{Communicator, ReduceOp};
//! # fn main() -> ringleader::Result<()> {
//! let comm = Communicator::from_env()?;
//! let mut x = vec![1.0f32; 4];
//! comm.all_reduce(&mut x, ReduceOp::Sum)?;
//! assert_eq!(x[0], comm.world_size() as f32);
//! # Ok(()) }
//! ```
//!
//! Layout: `call.rs` checks and describes a call; [`algo`](crate) builds
//! each collective's schedule as a plan (pure, simulated in tests); the
//! engine runs plans in submission order through the transport's driver,
//! on the caller's thread when the communicator is idle (`sched.rs` says
//! who runs what, in which order), and keeps what it worked out for each
//! call shape (`known.rs`), so that a repeated small collective runs as a
//! compiled straight line of fastbox frames (the driver's express runs);
//! the monitor, failure and monitored-barrier
//! modules turn trouble into verdicts, and [`stacks`] captures where the
//! process's threads are when the job fails (the verdict shows a
//! culprit's own line from it).
//!
//! The data plane is the `ringleader-transport` crate: links of every
//! transport behind one `Link` interface, their set-up over the TCP mesh
//! (`plane`), and the driver that runs plans over them; its crate docs map
//! which file to open for a new transport, a change to how a rank waits,
//! or a zero-copy protocol. Here, `comm.rs` joins a job (rendezvous, then
//! the transport's set-up), `rdma.rs` wires RDMA in (its endpoints go
//! through the store), and `p2p.rs` runs the send/recv lane on the link
//! per pair that set-up keeps apart for it: its queues and bookkeeping
//! here, its frames and sleeps in the driver (`driver::lane`), which also
//! writes the goodbye frames of a rank that leaves: only the driver
//! touches the links.

// Unsafe code is confined to the few places that turn a caller's raw
// buffers into slices (rawbuf.rs, and the engine and send/recv lane that
// use it), the raw entry points the C ABI calls (comm, cuda) and the CUDA
// device staging; each carries a scoped allow and a SAFETY argument.
#![deny(unsafe_code)]

mod agreement;
mod algo;
mod arrivals;
mod call;
mod comm;
#[cfg(feature = "cuda")]
pub mod cuda;
mod dumps;
mod engine;
mod failure;
mod heartbeat;
mod known;
mod log;
mod monitor;
mod monitored;
mod p2p;
mod pidwatch;
mod rawbuf;
#[cfg(feature = "rdma")]
mod rdma;
mod rendezvous;
mod running;
mod sched;
pub mod stacks;
mod sticky;
mod watchdog;
mod work;

pub use call::{Call, RawOp};
pub use comm::Communicator;
pub use half::{bf16, f16};
pub use ringleader_core::{
    AlgoChoice, Config, DType, Diagnosis, Element, Error, ErrorKind, OpKind, Rank, ReduceOp, Result, TransportKind,
};
pub use ringleader_diag::{callsite, CallSite, Entry, State};
pub use work::Work;
