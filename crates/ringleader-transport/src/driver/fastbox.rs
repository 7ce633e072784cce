//! Small frames whole in a fastbox, where the link has one
//! ([`crate::link::Fastbox`]): sent in one call instead of written and
//! published into the stream, received in one call with the header checked
//! exactly as a stream frame's (the same errors) and the payload copied or
//! reduced from where it was taken. A collective's frames go through
//! [`send`] and [`recv`]; the send/recv lane's through [`send`] and
//! [`recv_whole`] (see `lane.rs`).

use super::frame_io::{check_decoded, lost};
use super::strategy::{reduce_piece, rw};
use crate::link::{BoxHead, Link, FASTBOX_MAX};
use crate::plan::{Buf, OpInfo, RecvItem, RecvMode};
use ringleader_core::{Error, OpKind, Rank, Result};

/// Sends frame `tag`, carrying `data`, to `peer` in the link's fastbox if
/// it has one free; `false`: it goes through the stream. `fingerprint`:
/// `op`'s, encoded once for the run ([`ringleader_core::Fingerprint::words`]).
#[inline(always)]
pub(super) fn send(
    link: &mut dyn Link,
    peer: Rank,
    op: &OpInfo,
    fingerprint: [u64; 2],
    tag: u32,
    data: &[u8],
) -> Result<bool> {
    // Larger frames do not ask the link: the ring path stays as it was.
    if data.len() > FASTBOX_MAX {
        return Ok(false);
    }
    let Some(fb) = link.fastbox() else { return Ok(false) };
    // A frame larger than this link's cells is refused there (`false`).
    let head = BoxHead { seq: op.seq, fingerprint, tag };
    fb.try_send(&head, data).map_err(|e| lost(peer, op, &format!("sending failed: {e}")))
}

/// Receives `item`, frame `tag`, if it lies in the link's fastbox: checks
/// its header and lands its payload from where it lies. `false`: the frame
/// is in the stream, or has not arrived.
#[inline(always)]
pub(super) fn recv(
    link: &mut dyn Link,
    bufs: &mut [Buf<'_>],
    item: &RecvItem,
    tag: u32,
    op: &OpInfo,
    fingerprint: [u64; 2],
) -> Result<bool> {
    let peer = item.chan.peer;
    let Some(fb) = link.fastbox() else { return Ok(false) };
    let (head, data) = match fb.peek() {
        Ok(Some(frame)) => frame,
        Ok(None) => return Ok(false),
        Err(e) => return Err(lost(peer, op, &format!("receiving failed: {e}"))),
    };
    let expected =
        head.seq == op.seq && head.fingerprint == fingerprint && head.tag == tag && data.len() == item.region.len;
    let checked = if expected { Ok(()) } else { check(&head, data.len(), peer, item, tag, op) };
    if checked.is_ok() {
        land(bufs, item, data, op);
    }
    // Freed either way, as a stream frame is read whole whatever its
    // header says.
    fb.release();
    checked.map(|()| true)
}

/// Receives the frame a point-to-point `op` expects (tag 0, `dst.len()`
/// bytes) if it lies in the link's fastbox: its header checked as a stream
/// frame's would be, its payload copied into `dst`. `false`: the frame is
/// in the stream, or has not arrived.
pub(super) fn recv_whole(link: &mut dyn Link, dst: &mut [u8], op: &OpInfo) -> Result<bool> {
    let peer = link.peer();
    let Some(fb) = link.fastbox() else { return Ok(false) };
    let (head, data) = match fb.peek() {
        Ok(Some(frame)) => frame,
        Ok(None) => return Ok(false),
        Err(e) => return Err(lost(peer, op, &format!("receiving failed: {e}"))),
    };
    // The frame of the matching send: its fingerprint is this receive's
    // with the op a send's and the rank this one (which the check does not
    // compare: the low 32 bits are op, dtype and reduce op, the high word
    // the count). Anything else is decoded and checked as a stream
    // frame's header, for the same errors.
    let want = op.fingerprint.words();
    let sent = (want[0] & !0xff) | u64::from(OpKind::Send.code());
    let low = |w: u64| w & 0xffff_ffff;
    let exact = head.seq == op.seq
        && head.tag == 0
        && data.len() == dst.len()
        && head.fingerprint[1] == want[1]
        && low(head.fingerprint[0]) == low(sent);
    let checked = if exact {
        Ok(())
    } else {
        head.header(data.len())
            .map_err(|e| Error::PeerProtocol { peer, detail: e.to_string() })
            .and_then(|h| check_decoded(&h, peer, 0, dst.len(), op).map(|_| ()))
    };
    if checked.is_ok() {
        dst.copy_from_slice(data);
    }
    fb.release();
    checked.map(|()| true)
}

/// Checks a fastbox frame's header (and its length, `len`) that is not
/// exactly what `op` expects as frame `tag` of `item` (the same sequence
/// number, encoded fingerprint, tag and length): decoded and checked as a
/// stream frame's header would be, for the same errors (without checks, a
/// different call can still pass).
#[cold]
fn check(head: &BoxHead, len: usize, peer: Rank, item: &RecvItem, tag: u32, op: &OpInfo) -> Result<()> {
    let h = head.header(len).map_err(|e| Error::PeerProtocol { peer, detail: e.to_string() })?;
    check_decoded(&h, peer, tag, item.region.len, op)?;
    Ok(())
}

/// Copies or reduces a fastbox frame's payload into `item`'s region.
#[inline]
fn land(bufs: &mut [Buf<'_>], item: &RecvItem, data: &[u8], op: &OpInfo) {
    // (A barrier's frames carry nothing, and land nowhere.)
    if data.is_empty() {
        return;
    }
    match item.mode {
        RecvMode::Copy => rw(bufs, item.region.buf)[item.region.range()].copy_from_slice(data),
        RecvMode::Reduce { with } => reduce_piece(bufs, item, with, 0, data, op),
    }
}
