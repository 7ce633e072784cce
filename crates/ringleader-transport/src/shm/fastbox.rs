//! Fastboxes: small frames whole in a cell beside each ring (the header
//! in its first cache line, the payload from there on), in the ring's
//! order.
//!
//! A small frame through the ring costs more than its bytes: the writer
//! reads the reader's position (a line the reader wrote), the reader reads
//! the writer's position, then the header and payload (often across two
//! lines), and publishes its own position twice (header, then payload),
//! each time with the fence that keeps a sleeping writer's wake-up. In a
//! fastbox the writer fills a cell (header fields, payload) and stamps it;
//! the reader, which polls the cell anyway, finds everything in the line(s)
//! it fetched. The writer learns which cells are free from a count the
//! reader publishes, read only when the writer runs out of cells; a writer
//! with no free cell can always write to the ring instead (whether it
//! waits for a cell a while first is the driver's choice), and taking a
//! cell needs no wake-up.
//!
//! Order: a cell records the ring position it sits at (every ring byte
//! written before it). The reader takes it only once its ring reads reach
//! that position, and its ring reads stop there while the cell waits (see
//! [`ShmLink::box_limit`]), so no frame overtakes another, whichever way
//! each travels.
//!
//! Everything read from a cell is bounded before use (the peer may be
//! buggy): the length against the cell, the position against the ring.

use super::segment::{corrupt, ring_bell, BoxLines, Cell, BOX_PAYLOAD};
use super::RING_BYTES;
use crate::link::{BoxHead, FASTBOX_MAX};
use ringleader_core::Rank;
use std::sync::atomic::Ordering;

const _: () = assert!(BOX_PAYLOAD <= FASTBOX_MAX);

/// A link's fastboxes, both ways: the cells of its outgoing ring (in the
/// peer's segment) it writes, and those of its incoming ring (in ours) it
/// reads (see the module docs). The driver reaches it through
/// [`crate::Link::fastbox`]; it is a plain type, not a trait object, so a
/// small frame costs no indirect call beyond that one.
pub struct Fastbox {
    lines: BoxLines,
    peer: Rank,
    /// Fastbox frames written...
    sent: u64,
    /// ...of which the peer had taken this many when last asked...
    taken: u64,
    /// ...and fastbox frames read.
    read: u64,
    /// Whether the next frame's cell was handed out by `peek` and is not
    /// released yet.
    peeked: bool,
}

impl std::fmt::Debug for Fastbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fastbox").field("peer", &self.peer).field("sent", &self.sent).field("read", &self.read).finish()
    }
}

impl Fastbox {
    pub(super) fn new(lines: BoxLines, peer: Rank) -> Fastbox {
        Fastbox { lines, peer, sent: 0, taken: 0, read: 0, peeked: false }
    }

    /// The cell fastbox frame `count` (1, 2, ...) of a ring occupies.
    #[inline]
    fn index(&self, count: u64) -> usize {
        ((count - 1) & (self.lines.cells() as u64 - 1)) as usize
    }

    /// The largest payload a fastbox frame carries (at most
    /// [`FASTBOX_MAX`]).
    pub fn capacity(&self) -> usize {
        BOX_PAYLOAD
    }

    /// Sends a data frame, `head` and `payload`, in the next free cell of
    /// the outgoing ring; `Ok(false)` when none is free or it does not fit
    /// (then it goes through the stream).
    #[inline]
    pub fn try_send(&mut self, head: &BoxHead, payload: &[u8]) -> std::io::Result<bool> {
        if payload.len() > BOX_PAYLOAD {
            return Ok(false);
        }
        let next = self.sent + 1;
        let h = self.lines.tx();
        let cells = self.lines.cells() as u64;
        if next - self.taken > cells {
            // Pairs with the reader's release: it has copied the cell out.
            let taken = h.box_read.load(Ordering::Acquire);
            if taken > self.sent || taken < self.taken {
                return Err(corrupt(self.peer));
            }
            self.taken = taken;
            if next - taken > cells {
                return Ok(false);
            }
        }
        let cell = self.lines.tx_cell(self.index(next));
        // Every ring byte written so far precedes this frame.
        cell.pos.store(h.head.load(Ordering::Relaxed), Ordering::Relaxed);
        cell.seq.store(head.seq, Ordering::Relaxed);
        cell.fingerprint[0].store(head.fingerprint[0], Ordering::Relaxed);
        cell.fingerprint[1].store(head.fingerprint[1], Ordering::Relaxed);
        cell.tag.store(head.tag, Ordering::Relaxed);
        cell.len.store(payload.len() as u32, Ordering::Relaxed);
        // (A barrier's frames carry nothing: no call to copy nothing.)
        if !payload.is_empty() {
            // SAFETY: the cell's payload holds BOX_PAYLOAD bytes (checked
            // above against the length) of atomics, whose memory may be
            // written through a shared reference; the reader touches them
            // only after it sees the stamp below, and the writer writes
            // only cells the reader has released (`box_read`).
            unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), cell.payload.as_ptr() as *mut u8, payload.len()) };
        }
        // Publishes the fields above to a reader that sees the stamp.
        cell.stamp.store(next, Ordering::Release);
        self.sent = next;
        ring_bell(self.lines.bell());
        Ok(true)
    }

    /// The incoming cell of the next fastbox frame, if it holds it, with
    /// its ring position (checked: at or past our reads, within a ring).
    #[inline]
    fn next(&self, tail: u64) -> std::io::Result<Option<(&Cell, u64)>> {
        let next = self.read + 1;
        let cell = self.lines.rx_cell(self.index(next));
        // Pairs with the writer's release of the stamp.
        if cell.stamp.load(Ordering::Acquire) != next {
            return Ok(None);
        }
        let pos = cell.pos.load(Ordering::Relaxed);
        if pos.wrapping_sub(tail) > RING_BYTES as u64 {
            return Err(corrupt(self.peer));
        }
        Ok(Some((cell, pos)))
    }

    /// How many ring bytes from `tail` on may be read: up to a fastbox
    /// frame that waits in the ring's order (`None`: no limit). Called after
    /// loading the ring's head, so a cell written before the bytes seen
    /// there is seen too.
    pub(super) fn limit(&self, tail: u64) -> std::io::Result<Option<u64>> {
        Ok(self.next(tail)?.map(|(_, pos)| pos.wrapping_sub(tail)))
    }

    /// Whether the next frame is in a cell (rather than in the ring).
    pub(super) fn ready(&self) -> bool {
        let tail = self.lines.rx().tail.load(Ordering::Relaxed);
        matches!(self.next(tail), Ok(Some((_, pos))) if pos == tail)
    }

    /// The next frame if it is in a cell (every ring byte before it has
    /// been read): its header fields and its payload, where it lies. The
    /// cell stays this rank's until [`Fastbox::release`]; until then every
    /// call answers the same frame.
    #[inline]
    pub fn peek(&mut self) -> std::io::Result<Option<(BoxHead, &[u8])>> {
        let tail = self.lines.rx().tail.load(Ordering::Relaxed);
        let Some((cell, pos)) = self.next(tail)? else { return Ok(None) };
        if pos != tail {
            return Ok(None);
        }
        let len = cell.len.load(Ordering::Relaxed) as usize;
        if len > BOX_PAYLOAD {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("rank {} left a fastbox frame of {len} bytes", self.peer),
            ));
        }
        let head = BoxHead {
            seq: cell.seq.load(Ordering::Relaxed),
            fingerprint: [cell.fingerprint[0].load(Ordering::Relaxed), cell.fingerprint[1].load(Ordering::Relaxed)],
            tag: cell.tag.load(Ordering::Relaxed),
        };
        let at = cell.payload.as_ptr() as *const u8;
        self.peeked = true;
        // SAFETY: `len` is within the cell's payload (checked); the writer
        // filled those bytes before the stamp this rank acquired, and
        // leaves them alone until the cell is released, which needs `self`
        // mutably, after the slice's last use (its lifetime is `self`'s
        // borrow). The mapping lives as long as the link holding this.
        let payload = unsafe { std::slice::from_raw_parts(at, len) };
        Ok(Some((head, payload)))
    }

    /// Frees the cell of the frame [`Fastbox::peek`] handed out, once its
    /// payload is used: the writer may reuse it. Nothing if no frame is
    /// handed out.
    #[inline]
    pub fn release(&mut self) {
        if !std::mem::take(&mut self.peeked) {
            return;
        }
        self.read += 1;
        // The cell is copied out: the writer may reuse it.
        self.lines.rx().box_read.store(self.read, Ordering::Release);
    }
}
