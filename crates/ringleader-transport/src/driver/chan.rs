//! Per-channel run state: where each link stands in the plan and in the
//! frame it is moving.
//!
//! A [`ChanRun`] keeps what outlives a plan (queue capacity, the staging
//! buffer) beside a [`ChanState`] that is reset in one assignment when a
//! plan first uses the channel ([`ChanRun::begin`]), so no field can be
//! forgotten between plans.

use crate::frame::HEADER_LEN;
use std::collections::VecDeque;

/// Bytes of the address a single-copy descriptor carries (the payload
/// held in the writer's memory), which an incoming frame keeps as it
/// arrives.
pub(super) const ADDR_LEN: usize = 8;

/// Bytes reduced per piece when a reduce-receive arrives: small enough to
/// stay in cache between the copy out of the socket and the reduction.
pub(super) const STAGING: usize = 256 << 10;

/// How a frame's payload travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Payload {
    /// In the stream, after the header (copied in and out of the link).
    #[default]
    Inline,
    /// Left in the sender's memory; the stream carries its address and the
    /// receiver copies it across ([`super::single_copy`]).
    SingleCopy,
    /// In the stream, sent from the sender's pages; the receiver
    /// acknowledges it ([`super::splice`]).
    Spliced,
}

/// The frame being sent on a channel.
#[derive(Debug, Clone, Copy)]
pub(super) struct Outgoing {
    /// Bytes written, header included.
    pub off: usize,
    /// Its header, encoded when the frame starts.
    pub hdr: [u8; HEADER_LEN],
    /// How its payload travels.
    pub payload: Payload,
}

impl Default for Outgoing {
    fn default() -> Outgoing {
        Outgoing { off: 0, hdr: [0; HEADER_LEN], payload: Payload::Inline }
    }
}

/// The frame being received on a channel.
#[derive(Debug, Clone, Copy)]
pub(super) struct Incoming {
    /// Bytes read, header included.
    pub off: usize,
    /// Its header, as it arrives.
    pub hdr: [u8; HEADER_LEN],
    /// How its payload travels (known once the header is in).
    pub payload: Payload,
    /// Bytes of a reduce-receive waiting in the staging buffer.
    pub staged: usize,
    /// A single-copy frame's address in the peer, as it arrives...
    pub addr: [u8; ADDR_LEN],
    /// ...and how many bytes of its payload are copied.
    pub remote_got: usize,
}

impl Default for Incoming {
    fn default() -> Incoming {
        Incoming {
            off: 0,
            hdr: [0; HEADER_LEN],
            payload: Payload::Inline,
            staged: 0,
            addr: [0; ADDR_LEN],
            remote_got: 0,
        }
    }
}

/// A channel's place in the current plan.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ChanState {
    /// The current plan uses this channel.
    pub active: bool,
    /// Position in [`ChanRun::sends`] (also the next send's frame tag).
    pub send_pos: usize,
    /// Position in [`ChanRun::recvs`] (also the next receive's frame tag).
    pub recv_pos: usize,
    /// The frame being sent.
    pub out: Outgoing,
    /// The frame being received.
    pub inc: Incoming,
    /// Spliced frames sent and not yet acknowledged by the peer.
    pub unacked: u32,
    /// Bytes written of the first acknowledgement in [`ChanRun::owed`].
    pub owed_off: usize,
}

/// One channel's run state (see the module docs).
#[derive(Debug, Default)]
pub(super) struct ChanRun {
    /// The plan's sends on this channel, in order (indices into the plan).
    pub sends: Vec<u32>,
    /// The plan's receives on this channel, in order.
    pub recvs: Vec<u32>,
    /// Single-copy sends written but not yet copied by the peer: (ticket,
    /// send index), in order.
    pub acks: VecDeque<(u64, u32)>,
    /// Acknowledgements of spliced frames to write at the next frame
    /// boundary (their headers).
    pub owed: VecDeque<[u8; HEADER_LEN]>,
    /// Staging for reduce-receives and streamed socket receives; allocated
    /// on first use and kept for later plans.
    pub staging: Vec<u64>,
    /// Everything else, reset per plan.
    pub st: ChanState,
}

impl ChanRun {
    /// Starts the channel's part in a new plan.
    pub(super) fn begin(&mut self) {
        self.sends.clear();
        self.recvs.clear();
        self.acks.clear();
        self.owed.clear();
        self.st = ChanState { active: true, ..ChanState::default() };
    }

    /// Every send and receive of the plan is done, and nothing is owed
    /// either way.
    pub(super) fn finished(&self) -> bool {
        self.st.send_pos == self.sends.len()
            && self.st.recv_pos == self.recvs.len()
            && self.acks.is_empty()
            && self.st.unacked == 0
            && self.owed.is_empty()
    }
}

/// A channel's staging buffer as bytes, allocated on first use.
pub(super) fn staging(buf: &mut Vec<u64>) -> &mut [u8] {
    if buf.is_empty() {
        *buf = vec![0u64; STAGING / 8];
    }
    bytemuck::cast_slice_mut(buf)
}
