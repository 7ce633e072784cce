//! The shared vocabulary of ringleader.
//!
//! Every other crate speaks in these terms: a [`Rank`] in a job, the
//! [`DType`] and [`ReduceOp`] of a call, the [`OpKind`] and [`Fingerprint`]
//! that identify one collective, the [`Error`] with its stable [`ErrorKind`],
//! the [`Config`] read from the environment, and the [`AbortSignal`] that every
//! wait watches. It also holds the reduction kernels ([`reduce`]), since both
//! the algorithms and the benchmarks need them.
//!
//! This crate does no networking.
//!
//! ```
//! use ringleader_core::{DType, Fingerprint, OpKind, ReduceOp};
//! let fp = Fingerprint::new(OpKind::AllReduce, DType::F32, 4).with_reduce_op(ReduceOp::Sum);
//! assert_eq!(fp.bytes(), 16);
//! ```
// Safe code throughout, but for one reviewed exception: calling the AVX2
// build of the reduction loops once the CPU is known to have AVX2
// (`reduce.rs`).
#![deny(unsafe_code)]

pub mod abort;
pub mod config;
pub mod error;
#[doc(hidden)]
pub mod fault;
pub mod group;
pub mod rankset;
pub mod reduce;
pub mod types;

pub use abort::AbortSignal;
pub use config::{AlgoChoice, Config, TransportKind, VERSION};
pub use error::{Diagnosis, Error, ErrorKind, Member, Result};
pub use group::Group;
pub use rankset::RankSet;
pub use reduce::Element;
pub use types::{DType, Fingerprint, OpKind, Rank, ReduceOp};
