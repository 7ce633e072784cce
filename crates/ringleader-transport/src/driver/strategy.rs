//! Receive strategies: how an inline payload gets from the link into its
//! region.
//!
//! - Copy: straight into the region; into a large region that nothing
//!   reads again during the plan, around the cache (streaming stores: out
//!   of a shared-memory ring directly, from a socket through the staging
//!   buffer, since the kernel's copy cannot stream).
//! - Reduce: `region = (with or region) op payload`, straight out of a
//!   shared-memory ring where the link lends its bytes in place, else a
//!   piece at a time through a staging buffer that stays in cache between
//!   the copy out of the socket and the reduction.

use super::chan::{staging, ChanRun, STAGING};
use super::frame_io::{read_into, read_some, Landing};
use crate::frame::HEADER_LEN;
use crate::link::Link;
use crate::plan::{Buf, OpInfo, RecvItem, Region};
use crate::stream_copy::copy_streaming;
use ringleader_core::reduce::{reduce3_bytes, reduce_bytes};
use ringleader_core::Result;

/// Copies what has arrived of the payload into the region, landing as
/// `landing` says. Returns whether the payload is complete.
pub(super) fn copy(
    c: &mut ChanRun,
    link: &mut dyn Link,
    bufs: &mut [Buf<'_>],
    item: &RecvItem,
    op: &OpInfo,
    landing: Landing,
    moved: &mut bool,
) -> Result<bool> {
    if landing == Landing::Streamed && link.mapped().is_none() {
        return copy_staged(c, link, bufs, item, op, moved);
    }
    let inc = &mut c.st.inc;
    let got = inc.off - HEADER_LEN;
    if got < item.region.len {
        let dst = &mut rw(bufs, item.region.buf)[item.region.range()];
        let n = read_into(link, &mut dst[got..], op, inc.off, landing)?;
        if n > 0 {
            *moved = true;
            inc.off += n;
        }
    }
    Ok(inc.off - HEADER_LEN == item.region.len)
}

/// Receives a socket's payload into a large destination through the
/// staging buffer: the kernel copies into memory that stays in cache, and
/// streaming stores move it on without reading the destination's lines
/// first.
fn copy_staged(
    c: &mut ChanRun,
    link: &mut dyn Link,
    bufs: &mut [Buf<'_>],
    item: &RecvItem,
    op: &OpInfo,
    moved: &mut bool,
) -> Result<bool> {
    let stage = staging(&mut c.staging);
    let inc = &mut c.st.inc;
    loop {
        let got = inc.off - HEADER_LEN;
        if got == item.region.len {
            return Ok(true);
        }
        let room = (item.region.len - got).min(STAGING);
        let n = read_some(link, &mut stage[..room], op, inc.off)?;
        if n == 0 {
            return Ok(false);
        }
        let dst = &mut rw(bufs, item.region.buf)[item.region.range()];
        copy_streaming(&mut dst[got..got + n], &stage[..n]);
        *moved = true;
        inc.off += n;
    }
}

/// Reduces what has arrived of the payload into the region: straight out
/// of the ring for shared memory, else piece by piece through the staging
/// buffer. Returns whether the payload is complete.
pub(super) fn reduce(
    c: &mut ChanRun,
    link: &mut dyn Link,
    bufs: &mut [Buf<'_>],
    item: &RecvItem,
    with: Option<Region>,
    op: &OpInfo,
    moved: &mut bool,
) -> Result<bool> {
    let esz = op.fingerprint.dtype.size();
    let inc = &mut c.st.inc;
    if inc.staged == 0 {
        loop {
            let got = inc.off - HEADER_LEN;
            if got == item.region.len {
                return Ok(true);
            }
            // Only whole elements are taken; a half-written one waits.
            let peer = link.peer();
            let Some(mapped) = link.mapped() else { break };
            let r = mapped.read_in_place(item.region.len - got, &mut |data| {
                let whole = data.len() / esz * esz;
                if whole > 0 {
                    reduce_piece(bufs, item, with, got, &data[..whole], op);
                }
                whole
            });
            match r {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    *moved = true;
                    inc.off += n;
                }
                Err(e) => return Err(super::frame_io::lost(peer, op, &format!("receiving failed: {e}"))),
            }
        }
    }
    let stage = staging(&mut c.staging);
    loop {
        let got = inc.off - HEADER_LEN;
        // Bytes already reduced: everything read except what is staged.
        let reduced = got - inc.staged;
        if reduced == item.region.len {
            return Ok(true);
        }
        let room = (item.region.len - got).min(STAGING - inc.staged);
        let n = read_some(link, &mut stage[inc.staged..inc.staged + room], op, inc.off)?;
        if n == 0 {
            return Ok(false);
        }
        *moved = true;
        inc.off += n;
        inc.staged += n;
        let whole = inc.staged / esz * esz;
        if whole == 0 {
            continue;
        }
        reduce_piece(bufs, item, with, reduced, &stage[..whole], op);
        // Keep a partial trailing element for the next read.
        stage.copy_within(whole..inc.staged, 0);
        inc.staged -= whole;
    }
}

/// Reduces `data`, the bytes of a frame from offset `at` on, into the
/// receive's region: `region = (with or region) op data`.
pub(super) fn reduce_piece(
    bufs: &mut [Buf<'_>],
    item: &RecvItem,
    with: Option<Region>,
    at: usize,
    data: &[u8],
    op: &OpInfo,
) {
    let (dtype, rop, len) = (op.fingerprint.dtype, op.reduce_op(), data.len());
    let dst_at = item.region.off + at;
    match with {
        None => reduce_bytes(dtype, rop, &mut rw(bufs, item.region.buf)[dst_at..dst_at + len], data),
        Some(w) if w.buf == item.region.buf => {
            let (dst, src) = split_two(rw(bufs, w.buf), dst_at, w.off + at, len);
            reduce3_bytes(dtype, rop, dst, src, data);
        }
        Some(w) => {
            let (d, s) = pair(bufs, item.region.buf, w.buf);
            reduce3_bytes(dtype, rop, &mut d[dst_at..dst_at + len], &s[w.off + at..w.off + at + len], data);
        }
    }
}

/// Buffer `i`, writable.
pub(super) fn rw<'b>(bufs: &'b mut [Buf<'_>], i: u8) -> &'b mut [u8] {
    match &mut bufs[i as usize] {
        Buf::Rw(b) => b,
        // Plans are built by this crate's callers and never receive into an
        // input; reaching this is a bug in a plan builder.
        Buf::Ro(_) => panic!("plan receives into read-only buffer {i}"),
    }
}

/// Disjoint `(&mut b[a..a+len], &b[w..w+len])`.
fn split_two(b: &mut [u8], a: usize, w: usize, len: usize) -> (&mut [u8], &[u8]) {
    if a < w {
        let (lo, hi) = b.split_at_mut(w);
        (&mut lo[a..a + len], &hi[..len])
    } else {
        let (lo, hi) = b.split_at_mut(a);
        (&mut hi[..len], &lo[w..w + len])
    }
}

/// `(&mut bufs[d], &bufs[s])` for `d != s`.
fn pair<'b>(bufs: &'b mut [Buf<'_>], d: u8, s: u8) -> (&'b mut [u8], &'b [u8]) {
    let (d, s) = (d as usize, s as usize);
    if d < s {
        let (lo, hi) = bufs.split_at_mut(s);
        (
            match &mut lo[d] {
                Buf::Rw(b) => b,
                Buf::Ro(_) => panic!("reduce into read-only buffer"),
            },
            hi[0].bytes(),
        )
    } else {
        let (lo, hi) = bufs.split_at_mut(d);
        (
            match &mut hi[0] {
                Buf::Rw(b) => b,
                Buf::Ro(_) => panic!("reduce into read-only buffer"),
            },
            lo[s].bytes(),
        )
    }
}
