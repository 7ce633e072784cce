//! Zero-copy protocol one: single copy over shared memory.
//!
//! A large frame between two busy ranks on one host skips the ring: the
//! sender writes only a descriptor (the header and the payload's address in
//! its own memory), the receiver copies the payload straight from the
//! sender's process into its destination (`process_vm_readv`, a piece at a
//! time so the driver turns to its other links in between) and then
//! acknowledges it; the send completes at the acknowledgement. A sender
//! that fails with descriptors outstanding abandons them, so the receiver
//! never trusts bytes that may have changed. What the link provides for it
//! (the copy, the counters) is in [`crate::shm`]; when the driver uses it
//! is decided in [`super::send`].

use super::chan::{staging, ChanRun, ADDR_LEN, STAGING};
use super::frame_io::lost;
use super::strategy::{reduce_piece, rw};
use crate::frame::HEADER_LEN;
use crate::link::{Link, ReadOutcome};
use crate::plan::{Buf, OpInfo, RecvItem, RecvMode};
use ringleader_core::{Error, Result};

/// Bytes copied per `process_vm_readv` of a single-copy frame: the driver
/// turns to its other links in between.
const REMOTE_PIECE: usize = 2 << 20;

/// Whether a frame of `len` bytes may go single-copy on `link`.
#[inline]
pub(super) fn allowed(link: &dyn Link, len: usize) -> bool {
    link.single_copy().and_then(|s| s.min_len()).is_some_and(|min| len >= min.max(1))
}

/// Records that send `si`'s descriptor is written: it completes when the
/// peer has copied it. Returns `false` when the link has no single copy
/// (then the send is complete now).
pub(super) fn sent(c: &mut ChanRun, link: &mut dyn Link, si: u32) -> bool {
    match link.single_copy_mut() {
        Some(s) => {
            c.acks.push_back((s.sent(), si));
            true
        }
        None => false,
    }
}

/// Whether the oldest outstanding single-copy send has been copied.
pub(super) fn acked(c: &ChanRun, link: &dyn Link) -> bool {
    c.acks.front().is_some_and(|&(ticket, _)| link.single_copy().is_some_and(|s| s.acked() >= ticket))
}

/// Completes the single-copy sends the peer has copied. Returns whether any
/// did.
pub(super) fn settle(c: &mut ChanRun, link: &dyn Link, send_done: &mut [bool]) -> bool {
    let Some(&(ticket, _)) = c.acks.front() else { return false };
    let acked = link.single_copy().map_or(0, |s| s.acked());
    if acked < ticket {
        return false;
    }
    while let Some(&(t, si)) = c.acks.front() {
        if t > acked {
            break;
        }
        send_done[si as usize] = true;
        c.acks.pop_front();
    }
    true
}

/// Gives up on the channel's outstanding single-copy sends: the plan
/// failed while the peer may still copy from our buffers.
pub(super) fn abandon(c: &mut ChanRun, link: &dyn Link) {
    if !c.acks.is_empty() {
        if let Some(s) = link.single_copy() {
            s.abandon();
        }
        c.acks.clear();
    }
}

/// Receives a single-copy frame whose header is read: its address, then its
/// payload, a piece per call, straight from the peer's memory into the
/// region (copy) or through the staging buffer (reduce); then acknowledges
/// it. Returns whether the frame is complete.
pub(super) fn recv(
    c: &mut ChanRun,
    link: &mut dyn Link,
    bufs: &mut [Buf<'_>],
    item: &RecvItem,
    op: &OpInfo,
    moved: &mut bool,
) -> Result<bool> {
    let peer = link.peer();
    if link.single_copy().is_none() {
        let detail = "a single-copy frame arrived on a link that is not shared memory".to_string();
        return Err(Error::PeerProtocol { peer, detail });
    }
    let inc = &mut c.st.inc;
    let addr_end = HEADER_LEN + ADDR_LEN;
    while inc.off < addr_end {
        match link.try_read(&mut inc.addr[inc.off - HEADER_LEN..]).map_err(|e| lost(peer, op, &e.to_string()))? {
            ReadOutcome::Data(n) => inc.off += n,
            ReadOutcome::WouldBlock => return Ok(false),
            ReadOutcome::Closed => return Err(lost(peer, op, "the peer closed the connection in a single-copy frame")),
        }
        *moved = true;
    }
    let Some(l) = link.single_copy_mut() else { unreachable!("checked above") };
    let addr = u64::from_le_bytes(inc.addr);
    let failed = |e: std::io::Error| lost(peer, op, &format!("copying from its memory failed: {e}"));
    let left = item.region.len - inc.remote_got;
    if left > 0 {
        let at = addr.wrapping_add(inc.remote_got as u64);
        let n = match item.mode {
            RecvMode::Copy => {
                let dst = &mut rw(bufs, item.region.buf)[item.region.range()];
                l.read_remote(at, &mut dst[inc.remote_got..inc.remote_got + left.min(REMOTE_PIECE)]).map_err(failed)?
            }
            RecvMode::Reduce { with } => {
                let stage = staging(&mut c.staging);
                let esz = op.fingerprint.dtype.size();
                // Whole elements only: a short read leaves the rest for the next call.
                let n = l.read_remote(at, &mut stage[..left.min(STAGING)]).map_err(failed)? / esz * esz;
                reduce_piece(bufs, item, with, inc.remote_got, &stage[..n], op);
                n
            }
        };
        *moved = true;
        inc.remote_got += n;
        if inc.remote_got < item.region.len {
            return Ok(false);
        }
    }
    l.finish_remote().map_err(|e| lost(peer, op, &e.to_string()))?;
    Ok(true)
}
