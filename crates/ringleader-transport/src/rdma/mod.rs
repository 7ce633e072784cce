//! RDMA verbs: reliable-connected queue pairs carrying the same byte streams
//! (frames, fingerprints, driver) as TCP and shared memory.
//!
//! Layers, bottom up:
//! - [`Qp`] and [`Device`]: the small slice of the verbs interface the
//!   protocol needs (post a send or a receive on a numbered slot of
//!   registered memory, poll completions, arm the completion channel whose
//!   descriptor is polled beside the abort eventfd). Two implementations:
//!   [`ibv`] (rdma-core through the `ibverbs-sys` bindings, unsafe code
//!   confined there) and [`model`] (a software model of the queues with a
//!   wire thread per queue pair, fault injection, and peers that
//!   disappear), so every line of the protocol runs in tests on machines
//!   without RDMA hardware;
//! - [`link`]: [`RdmaLink`], the protocol: a byte stream chunked into
//!   messages of at most one slot, credit-based flow control (a sender may
//!   only consume receive buffers the peer granted; grants ride on data
//!   messages or, when no data flows back, on credit-only messages), an
//!   ordering check on every message, and error completions turned into
//!   errors that say what the verbs said and what it usually means;
//! - [`regcache`]: the registration cache behind [`ibv`].
//!
//! Queue pairs are set up through the store by the runtime (the
//! `ringleader` crate publishes each rank's [`Endpoint`]s and connects them);
//! this module only creates, describes and connects them.

pub mod link;
pub mod model;
pub mod regcache;

#[allow(unsafe_code)]
pub mod ibv;

pub use link::{LinkParams, RdmaLink};

use rustix::fd::BorrowedFd;
use std::fmt;
use std::io;

/// Which queue a completion belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcKind {
    /// A send work request finished (its slot may be reused).
    Send,
    /// A message arrived in a receive slot.
    Recv,
}

/// The status of a work completion: the verbs statuses the protocol tells
/// apart; the rest keep their numeric code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcStatus {
    /// The request completed.
    Success,
    /// Flushed: the queue pair is in the error state after an earlier error.
    Flushed,
    /// The peer stopped acknowledging (transport retry counter exceeded).
    RetryExceeded,
    /// The peer had no receive posted for too long (RNR retry counter exceeded).
    RnrRetryExceeded,
    /// The peer refused the access (remote access or operation error).
    RemoteError,
    /// A local protection or length error (a bug in the posting side).
    LocalError,
    /// Any other `ibv_wc_status`, by number.
    Other(u32),
}

impl WcStatus {
    /// What the status means, in words, with what usually causes it.
    ///
    /// ```
    /// use ringleader_transport::rdma::WcStatus;
    /// assert!(WcStatus::RetryExceeded.describe().contains("did it die"));
    /// ```
    pub fn describe(self) -> String {
        match self {
            WcStatus::Success => "success".into(),
            WcStatus::Flushed => "flushed: the queue pair entered the error state after an earlier error".into(),
            WcStatus::RetryExceeded => "transport retry counter exceeded: the peer stopped acknowledging \
                (did it die, or did its port go down?)"
                .into(),
            WcStatus::RnrRetryExceeded => "receiver-not-ready retry counter exceeded: the peer posted no \
                receive buffer (is it stuck outside the collective?)"
                .into(),
            WcStatus::RemoteError => "remote access or operation error: the peer refused the request".into(),
            WcStatus::LocalError => "local protection or length error".into(),
            WcStatus::Other(n) => format!("work completion status {n}"),
        }
    }
}

/// One work completion, as the protocol sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    /// Send or receive.
    pub kind: WcKind,
    /// The slot the request was posted on.
    pub slot: usize,
    /// How it ended.
    pub status: WcStatus,
    /// Bytes received (receives only).
    pub len: usize,
    /// Immediate data (receives only).
    pub imm: u32,
}

/// Where a queue pair can be reached: what two ranks exchange through the
/// store before connecting.
///
/// ```
/// use ringleader_transport::rdma::Endpoint;
/// let e = Endpoint { lid: 3, qpn: 0x1234, psn: 77, gid: [9; 16] };
/// assert_eq!(Endpoint::from_wire(&e.to_wire()), Some(e));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// Local identifier of the port (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Queue pair number.
    pub qpn: u32,
    /// First packet sequence number.
    pub psn: u32,
    /// Global identifier (RoCE, or InfiniBand across subnets).
    pub gid: [u8; 16],
}

impl Endpoint {
    /// `lid:qpn:psn:gid` in hex, as stored.
    pub fn to_wire(&self) -> String {
        let gid: String = self.gid.iter().map(|b| format!("{b:02x}")).collect();
        format!("{:x}:{:x}:{:x}:{gid}", self.lid, self.qpn, self.psn)
    }

    /// Inverse of [`Endpoint::to_wire`]; `None` for anything malformed.
    pub fn from_wire(s: &str) -> Option<Endpoint> {
        let mut it = s.split(':');
        let lid = u16::from_str_radix(it.next()?, 16).ok()?;
        let qpn = u32::from_str_radix(it.next()?, 16).ok()?;
        let psn = u32::from_str_radix(it.next()?, 16).ok()?;
        let hex = it.next()?;
        if it.next().is_some() || hex.len() != 32 {
            return None;
        }
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Endpoint { lid, qpn, psn, gid })
    }
}

/// One reliable-connected queue pair with its registered slots: `slots`
/// send buffers and `slots` receive buffers of `chunk` bytes each, its own
/// completion queue, and a completion channel.
///
/// The protocol ([`RdmaLink`]) is the only user; it never posts a slot
/// twice before its completion.
pub trait Qp: Send + fmt::Debug {
    /// This queue pair's address, to give to the peer.
    fn endpoint(&self) -> Endpoint;
    /// Moves the queue pair to ready-to-send toward `remote`. Receives
    /// should be posted first.
    fn connect(&mut self, remote: &Endpoint) -> io::Result<()>;
    /// Send buffer `slot`, to fill before [`Qp::post_send`].
    fn send_buf(&mut self, slot: usize) -> &mut [u8];
    /// Receive buffer `slot`, valid after its receive completed.
    fn recv_buf(&self, slot: usize) -> &[u8];
    /// Sends the first `len` bytes of send slot `slot` with immediate data `imm`.
    fn post_send(&mut self, slot: usize, len: usize, imm: u32) -> io::Result<()>;
    /// Posts receive slot `slot`.
    fn post_recv(&mut self, slot: usize) -> io::Result<()>;
    /// Appends the completions available now to `out`.
    fn poll(&mut self, out: &mut Vec<Wc>) -> io::Result<()>;
    /// Asks for an event on the completion channel at the next completion.
    /// Poll again after arming: a completion may have slipped in between.
    fn arm(&mut self) -> io::Result<()>;
    /// Consumes the events the completion channel holds (nonblocking).
    fn ack_events(&mut self) -> io::Result<()>;
    /// The completion channel's descriptor: readable once an armed queue
    /// has a completion. It never reports writable.
    fn fd(&self) -> BorrowedFd<'_>;
}

/// An RDMA device (one port of one adapter), opened.
pub trait Device: Send + Sync + fmt::Debug {
    /// Its name, for messages (`mlx5_0:1`, `model`).
    fn name(&self) -> String;
    /// A fresh queue pair with `slots` send and receive slots of `chunk` bytes.
    fn create_qp(&self, slots: usize, chunk: usize) -> io::Result<Box<dyn Qp>>;
}

/// Why no RDMA device could be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoDevice(pub String);

impl fmt::Display for NoDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Opens the device named `name` (`RINGLEADER_RDMA_DEVICE`): the software
/// model for `model` (tests; every rank must be a thread of one process),
/// else the named adapter (`mlx5_0`, `mlx5_0:1`), else the first adapter
/// with an active port.
pub fn open(name: Option<&str>) -> Result<Box<dyn Device>, NoDevice> {
    match name {
        Some("model") => Ok(Box::new(model::Fabric::global().device())),
        other => ibv::open(other).map(|d| Box::new(d) as Box<dyn Device>),
    }
}

#[cfg(test)]
mod tests;
