//! Frames on a link: writing a frame a piece at a time, reading, checking a
//! received header against what the plan expects, and turning what went
//! wrong into the error that names the peer and the operation; and the
//! goodbye a rank that leaves writes on every link ([`say_goodbye`]).
//!
//! The wire format itself is [`crate::frame`] (sans-IO); this is where it
//! meets a link.

use super::Links;
use crate::frame::{check, pad, Expect, FrameHeader, FrameKind, HeaderCheck, ALIGN, HEADER_LEN};
use crate::link::{Link, ReadOutcome};
use crate::plan::OpInfo;
use ringleader_core::{DType, Error, Fingerprint, OpKind, Rank, Result};
use std::io::IoSlice;

/// How a copied payload's bytes reach its region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Landing {
    /// Through the cache: the region is small, or read again soon.
    Cached,
    /// Around the cache (streaming stores): a large region that nothing
    /// reads again during the plan.
    Streamed,
}

/// The zero padding written after payloads.
pub(super) static PAD: [u8; ALIGN] = [0; ALIGN];

/// Writes what the link takes of a frame (header, payload, padding) from
/// byte `off` of the frame on; 0 when the link is full.
pub(super) fn write_frame(
    link: &mut dyn Link,
    hdr: &[u8; HEADER_LEN],
    data: &[u8],
    off: usize,
) -> std::io::Result<usize> {
    let tail = &PAD[..pad(data.len())];
    if off < HEADER_LEN {
        link.try_write(&[IoSlice::new(&hdr[off..]), IoSlice::new(data), IoSlice::new(tail)])
    } else if off < HEADER_LEN + data.len() {
        link.try_write(&[IoSlice::new(&data[off - HEADER_LEN..]), IoSlice::new(tail)])
    } else {
        link.try_write(&[IoSlice::new(&tail[off - HEADER_LEN - data.len()..])])
    }
}

/// The error for a link to `peer` that broke during `op`.
pub(super) fn lost(peer: Rank, op: &OpInfo, detail: &str) -> Error {
    Error::PeerLost { peer, op: op.fingerprint.op, seq: op.seq, detail: detail.to_string() }
}

/// Reads into `buf`; `0` when nothing is there. `at` (bytes of this frame
/// already read) only words the error when the peer hangs up.
pub(super) fn read_some(link: &mut dyn Link, buf: &mut [u8], op: &OpInfo, at: usize) -> Result<usize> {
    read_into(link, buf, op, at, Landing::Cached)
}

/// [`read_some`], with streaming stores into `buf` for
/// [`Landing::Streamed`] where the link's bytes lie in mapped memory.
pub(super) fn read_into(
    link: &mut dyn Link,
    buf: &mut [u8],
    op: &OpInfo,
    at: usize,
    landing: Landing,
) -> Result<usize> {
    let streamed = match landing {
        Landing::Streamed => link.mapped().map(|m| m.read_streaming(buf)),
        Landing::Cached => None,
    };
    let read = match streamed {
        Some(r) => r.map(|n| if n == 0 { ReadOutcome::WouldBlock } else { ReadOutcome::Data(n) }),
        None => link.try_read(buf),
    };
    match read {
        Ok(ReadOutcome::Data(n)) => Ok(n),
        Ok(ReadOutcome::WouldBlock) => Ok(0),
        Ok(ReadOutcome::Closed) if at == 0 => Err(lost(link.peer(), op, "the peer closed the connection")),
        Ok(ReadOutcome::Closed) => Err(lost(
            link.peer(),
            op,
            &format!("the peer closed the connection in the middle of a frame ({at} bytes in)"),
        )),
        Err(e) => Err(lost(link.peer(), op, &format!("receiving failed: {e}"))),
    }
}

/// Checks a received header against what `op` expects as frame `tag` of
/// `len` bytes: a different call is a mismatch naming both fingerprints.
/// Returns the frame's kind (data, spliced data or a single-copy descriptor).
pub(super) fn check_header(raw: &[u8; HEADER_LEN], peer: Rank, tag: u32, len: usize, op: &OpInfo) -> Result<FrameKind> {
    check_decoded(&decode_header(raw, peer)?, peer, tag, len, op)
}

/// Decodes a header from `peer`; garbage is a protocol error naming it.
pub(super) fn decode_header(raw: &[u8; HEADER_LEN], peer: Rank) -> Result<FrameHeader> {
    FrameHeader::decode(raw).map_err(|e| Error::PeerProtocol { peer, detail: e.to_string() })
}

/// [`check_header`] for a header already decoded.
pub(super) fn check_decoded(h: &FrameHeader, peer: Rank, tag: u32, len: usize, op: &OpInfo) -> Result<FrameKind> {
    let want = Expect { seq: op.seq, fingerprint: op.fingerprint, tag, len: len as u64 };
    match check(h, &want, op.checks) {
        HeaderCheck::Ok if h.kind == FrameKind::Consumed => Err(Error::PeerProtocol {
            peer,
            detail: format!("an acknowledgement arrived where frame {tag} of collective {} was expected", op.seq),
        }),
        HeaderCheck::Ok => Ok(h.kind),
        HeaderCheck::Goodbye { seq } => {
            Err(Error::PeerLeft { peer, op: op.fingerprint.op, seq: op.seq, their_seq: seq })
        }
        HeaderCheck::Mismatch { seq, fingerprint } => {
            Err(Error::FrameMismatch { peer, seq: op.seq, ours: op.fingerprint, their_seq: seq, theirs: fingerprint })
        }
        HeaderCheck::Schedule { tag: t, len: l } => Err(Error::ScheduleMismatch {
            peer,
            op: op.fingerprint.op,
            seq: op.seq,
            detail: format!("it sent frame {t} of {l} bytes where frame {tag} of {len} bytes was expected"),
        }),
    }
}

/// Tells the peer at the end of every link in `links` that no more frames
/// will come: a goodbye frame, whose reader fails its operation with "left"
/// (naming `last_seq`, the last collective this rank started) instead of
/// "lost". Written only where the link takes it at once, without waiting:
/// a rank that leaves does not wait for its peers.
pub fn say_goodbye(links: &mut Links, last_seq: u64) {
    // The fingerprint is filler (a zero-byte barrier's): a goodbye is read
    // for its kind and sequence number only.
    let hdr = FrameHeader::goodbye(last_seq, Fingerprint::new(OpKind::Barrier, DType::U8, 0)).encode();
    for link in links.iter_mut().flatten() {
        let _ = link.try_write(&[IoSlice::new(&hdr)]);
    }
}
