//! Zero-copy protocol two: spliced socket frames with acknowledgements.
//!
//! A large frame whose source no receive of the plan writes goes into the
//! socket by reference to the sender's pages (`vmsplice`, see
//! [`crate::tcp::TcpLink::try_splice`]): the receiver's kernel makes the
//! only copy. The sender must not let those pages change before the
//! receiver has every byte, so the receiver answers each spliced frame with
//! a `consumed` frame (header only, between its own frames on the same
//! connection), and the plan ends only once every spliced frame is
//! acknowledged. When the driver splices is decided in [`super::send`].

use super::chan::ChanRun;
use super::frame_io::{decode_header, read_some, PAD};
use crate::frame::{pad, FrameHeader, FrameKind, HEADER_LEN};
use crate::link::Link;
use crate::plan::OpInfo;
use ringleader_core::{Error, Rank, Result};
use std::io::IoSlice;

/// Whether a frame of `len` bytes from a buffer no receive of the plan
/// writes may be spliced on `link`, with splicing from `min` bytes on.
pub(super) fn allowed(link: &mut dyn Link, min: Option<usize>, len: usize) -> bool {
    min.is_some_and(|min| len >= min) && link.splice().is_some_and(|s| s.available())
}

/// [`super::frame_io::write_frame`] for a spliced frame: the header and
/// padding are copied into the socket, the payload goes by reference.
#[allow(unsafe_code)]
pub(super) fn write_frame(
    link: &mut dyn Link,
    hdr: &[u8; HEADER_LEN],
    data: &[u8],
    off: usize,
) -> std::io::Result<usize> {
    if off < HEADER_LEN {
        link.try_write(&[IoSlice::new(&hdr[off..])])
    } else if off < HEADER_LEN + data.len() {
        let rest = &data[off - HEADER_LEN..];
        match link.splice() {
            // SAFETY: `data` is a region of a buffer the caller lends for
            // the whole run, that no receive of the plan writes (only such
            // sends are spliced: `SendPolicy::payload`), and a run ends only
            // once the peer has acknowledged every spliced frame
            // (`ChanRun::finished` waits for `unacked == 0`). A run that
            // fails stops waiting, but a failed run leaves its links in the
            // middle of frames: they carry no data again.
            Some(s) => unsafe { s.try_splice(rest) },
            None => link.try_write(&[IoSlice::new(rest)]),
        }
    } else {
        link.try_write(&[IoSlice::new(&PAD[off - HEADER_LEN - data.len()..pad(data.len())])])
    }
}

/// Owes the peer the acknowledgement of its spliced frame `tag` of `op`:
/// every byte is ours now, so the sender may let its pages change.
pub(super) fn owe(c: &mut ChanRun, op: &OpInfo, tag: u32) {
    c.owed.push_back(FrameHeader::consumed(op.seq, op.fingerprint, tag).encode());
}

/// Writes the acknowledgements `c` owes its peer, between frames only.
/// Returns whether the channel may go on to its data frames (nothing owed
/// is left half written).
pub(super) fn write_owed(c: &mut ChanRun, link: &mut dyn Link, moved: &mut bool) -> std::io::Result<bool> {
    if c.st.out.off != 0 {
        return Ok(true);
    }
    while let Some(hdr) = c.owed.front() {
        let n = link.try_write(&[IoSlice::new(&hdr[c.st.owed_off..])])?;
        if n == 0 {
            return Ok(c.st.owed_off == 0);
        }
        *moved = true;
        c.st.owed_off += n;
        if c.st.owed_off == HEADER_LEN {
            c.owed.pop_front();
            c.st.owed_off = 0;
        }
    }
    Ok(true)
}

/// Takes the header just read as an acknowledgement, if it is one.
pub(super) fn take_ack(c: &mut ChanRun, h: &FrameHeader, peer: Rank) -> Result<bool> {
    if h.kind != FrameKind::Consumed {
        return Ok(false);
    }
    if c.st.unacked == 0 {
        let detail =
            format!("rank {peer} acknowledged frame {} of collective {}, which was never spliced", h.tag, h.seq);
        return Err(Error::PeerProtocol { peer, detail });
    }
    c.st.unacked -= 1;
    c.st.inc.off = 0;
    Ok(true)
}

/// Reads acknowledgements once every receive of the channel is done: all
/// that can still come from the peer in this plan.
pub(super) fn read_trailing_acks(c: &mut ChanRun, link: &mut dyn Link, op: &OpInfo, moved: &mut bool) -> Result<()> {
    while c.st.unacked > 0 {
        let inc = &mut c.st.inc;
        let n = read_some(link, &mut inc.hdr[inc.off..], op, inc.off)?;
        if n == 0 {
            return Ok(());
        }
        *moved = true;
        inc.off += n;
        if inc.off == HEADER_LEN && !take_ack(c, &decode_header(&c.st.inc.hdr, link.peer())?, link.peer())? {
            let detail = "a frame arrived after the last one this collective expects from it".to_string();
            return Err(Error::PeerProtocol { peer: link.peer(), detail });
        }
    }
    Ok(())
}
