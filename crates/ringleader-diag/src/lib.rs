//! Diagnosis: the flight recorder, the dump format and the verdict engine.
//!
//! - [`callsite`]: where the user's code made a call, kept per record;
//! - [`clock`]: the recorder's timestamps (a TSC read where the CPU allows);
//! - [`recorder`]: the always-on ring of the last N operations of a
//!   communicator, and lock-free progress counters beside it;
//! - [`snapshot`]: what a rank publishes about itself when a collective fails
//!   (and writes as its dump), and the heartbeat payload;
//! - [`deadlock`]: the wait-for graph of ranks blocked in send/recv, and
//!   the cycle (or the chain's end) it finds;
//! - [`stacks`]: where a rank's threads are when the job fails (Python
//!   and native stacks), and the culprit's innermost frame of its own code;
//! - [`straggler`]: who arrived last at recent collectives, and by how much;
//! - [`trace`]: the flight records as a Perfetto / Chrome trace;
//! - [`mod@verdict`]: a pure function from every rank's snapshot and the store's
//!   view of the job to one [`ringleader_core::Diagnosis`].
//!
//! Nothing here does IO, which is why `ringleader analyze` (dumps read from
//! disk) and the watchdog (snapshots gathered through the store) share it.
#![deny(unsafe_code)]

pub mod callsite;
pub mod clock;
pub mod deadlock;
pub mod recorder;
pub mod snapshot;
pub mod stacks;
pub mod straggler;
pub mod trace;
pub mod verdict;

pub use callsite::CallSite;
pub use recorder::{Entry, FlightRecorder, Started, State};
pub use snapshot::{Beat, Liveness, Observation, PeerView, Snapshot};
pub use verdict::{verdict, Evidence};
