//! Small frames whole in a fastbox, where the link has one
//! ([`crate::link::Fastbox`]): sent in one call instead of written and
//! published into the stream, received in one call with the header checked
//! exactly as a stream frame's (the same errors) and the payload copied or
//! reduced from where it was taken.

use super::frame_io::{check_decoded, lost};
use super::strategy::{reduce_piece, rw};
use crate::frame::FrameHeader;
use crate::link::{Link, FASTBOX_MAX};
use crate::plan::{Buf, OpInfo, RecvItem, RecvMode};
use ringleader_core::{Error, Result};

/// Sends frame `tag`, carrying `data`, in the link's fastbox if it has one
/// free; `false`: it goes through the stream.
#[inline]
pub(super) fn send(link: &mut dyn Link, op: &OpInfo, tag: u32, data: &[u8]) -> Result<bool> {
    // Larger frames do not ask the link: the ring path stays as it was.
    if data.len() > FASTBOX_MAX {
        return Ok(false);
    }
    let peer = link.peer();
    let Some(fb) = link.fastbox() else { return Ok(false) };
    if data.len() > fb.capacity() {
        return Ok(false);
    }
    let hdr = FrameHeader::data(op.seq, op.fingerprint, tag, data.len() as u64);
    fb.try_send(&hdr, data).map_err(|e| lost(peer, op, &format!("sending failed: {e}")))
}

/// Receives `item`, frame `tag`, if it lies in the link's fastbox: checks
/// its header and lands its payload. `false`: the frame is in the stream,
/// or has not arrived.
#[inline]
pub(super) fn recv(link: &mut dyn Link, bufs: &mut [Buf<'_>], item: &RecvItem, tag: u32, op: &OpInfo) -> Result<bool> {
    let peer = link.peer();
    let Some(fb) = link.fastbox() else { return Ok(false) };
    let frame = match fb.try_recv() {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(false),
        Err(e) => return Err(lost(peer, op, &format!("receiving failed: {e}"))),
    };
    let h = frame.header().map_err(|e| Error::PeerProtocol { peer, detail: e.to_string() })?;
    check_decoded(&h, peer, tag, item.region.len, op)?;
    let data = frame.payload();
    match item.mode {
        RecvMode::Copy => rw(bufs, item.region.buf)[item.region.range()].copy_from_slice(data),
        RecvMode::Reduce { with } => reduce_piece(bufs, item, with, 0, data, op),
    }
    Ok(true)
}
