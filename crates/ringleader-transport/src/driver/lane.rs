//! The send/recv lane's IO: moving point-to-point frames and waiting for
//! their links, for the runtime's lane thread (its `p2p.rs`).
//!
//! A collective's transfers are known when it starts, so they run as one
//! [`Plan`](crate::plan::Plan). The lane's are not: sends and receives
//! arrive one at a time, each peer's sends in one queue and its receives in
//! another, and every queue's head moves as far as its link takes it while
//! the others wait their turn. So the lane gets two pieces of the driver
//! instead of a plan:
//!
//! - [`Transfer`]: one send or receive, framed like a collective's (header,
//!   payload, padding; frame tag 0), moved a piece at a time without
//!   blocking, or whole in the link's fastbox when it fits one (as a
//!   collective's small frames travel); a received header is checked against the operation (its
//!   sequence number is per pair and direction, its fingerprint the dtype
//!   and count), and what goes wrong becomes the error naming the peer;
//! - [`LaneWait`]: the sleep of a lane that nothing can move, by the
//!   driver's waiting policy ([`super::wait`]) over the links whose queues
//!   are not empty.
//!
//! The lane keeps its queues, its bookkeeping and its timeouts; every byte
//! it moves and every wait goes through here.

use super::fastbox;
use super::frame_io::{check_header, lost, read_some, write_frame};
use super::wait::{Sleeper, LANE_TICK};
use crate::frame::{pad, FrameHeader, FrameKind, ALIGN, HEADER_LEN};
use crate::link::Link;
use crate::plan::OpInfo;
use crate::shm::Waiter;
use ringleader_core::{Error, Result};
use rustix::event::PollFlags;
use rustix::fd::BorrowedFd;
use smallvec::SmallVec;

/// How far one call moved a [`Transfer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moved {
    /// Nothing moved: the link would block.
    Blocked,
    /// Some bytes moved; the frame is not complete yet.
    Partial,
    /// The frame's last bytes moved: the operation is complete, and the
    /// transfer is ready for the next frame.
    Done,
}

/// One point-to-point frame (a send or a receive) moved a piece at a time
/// on its link: how much of it has moved, and its header.
///
/// Each call moves what the link takes (or has) without blocking and says
/// how far it got ([`Moved`]); the next call goes on from there, with the
/// same operation and buffer.
///
/// ```
/// use ringleader_transport::driver::lane::Transfer;
/// let t = Transfer::new();
/// assert!(!t.started());
/// ```
#[derive(Debug, Clone)]
pub struct Transfer {
    /// Bytes of the frame moved, header and padding included.
    off: usize,
    hdr: [u8; HEADER_LEN],
}

impl Default for Transfer {
    fn default() -> Transfer {
        Transfer { off: 0, hdr: [0; HEADER_LEN] }
    }
}

impl Transfer {
    /// A transfer at the start of a frame.
    pub fn new() -> Transfer {
        Transfer::default()
    }

    /// Whether some byte of the current frame has moved.
    pub fn started(&self) -> bool {
        self.off > 0
    }

    /// Forgets a frame moved in part: the operation failed, and its link's
    /// stream can never carry the rest.
    pub fn reset(&mut self) {
        self.off = 0;
    }

    /// The frame's length in bytes for a payload of `len`.
    fn total(len: usize) -> usize {
        HEADER_LEN + len + pad(len)
    }

    /// Where a call that moved bytes (`moved`) left the frame of `total`
    /// bytes; back at the start when it is complete.
    fn progress(&mut self, total: usize, moved: bool) -> Moved {
        if self.off == total {
            self.off = 0;
            Moved::Done
        } else if moved {
            Moved::Partial
        } else {
            Moved::Blocked
        }
    }

    /// Writes what `link` takes of the frame that sends `data` for `op`;
    /// a broken link is an error naming the peer and `op`.
    pub fn send(&mut self, link: &mut dyn Link, data: &[u8], op: &OpInfo) -> Result<Moved> {
        if self.off == 0 {
            // A frame that fits a free fastbox cell goes whole; the cell
            // keeps its place in the stream's order (`shm/fastbox.rs`).
            let peer = link.peer();
            if fastbox::send(link, peer, op, op.fingerprint.words(), 0, data)? {
                return Ok(Moved::Done);
            }
            self.hdr = FrameHeader::data(op.seq, op.fingerprint, 0, data.len() as u64).encode();
        }
        let total = Transfer::total(data.len());
        let mut moved = false;
        while self.off < total {
            let n = write_frame(link, &self.hdr, data, self.off)
                .map_err(|e| lost(link.peer(), op, &format!("sending failed: {e}")))?;
            if n == 0 {
                break;
            }
            moved = true;
            self.off += n;
        }
        Ok(self.progress(total, moved))
    }

    /// Reads what has arrived on `link` of the frame `op` receives into
    /// `dst` (its whole payload). The header is checked once complete: a
    /// different call is a mismatch, a goodbye means the peer left, and a
    /// frame that is not plain data (point-to-point never sends
    /// single-copy or spliced frames) a protocol error.
    pub fn recv(&mut self, link: &mut dyn Link, dst: &mut [u8], op: &OpInfo) -> Result<Moved> {
        if self.off == 0 && fastbox::recv_whole(link, dst, op)? {
            return Ok(Moved::Done);
        }
        let len = dst.len();
        let total = Transfer::total(len);
        let peer = link.peer();
        let mut moved = false;
        while self.off < total {
            let n = if self.off < HEADER_LEN {
                let n = read_some(link, &mut self.hdr[self.off..], op, self.off)?;
                if n > 0 && self.off + n == HEADER_LEN && check_header(&self.hdr, peer, 0, len, op)? != FrameKind::Data
                {
                    let detail = "a single-copy or spliced frame arrived for send/recv".to_string();
                    return Err(Error::PeerProtocol { peer, detail });
                }
                n
            } else if self.off < HEADER_LEN + len {
                read_some(link, &mut dst[self.off - HEADER_LEN..], op, self.off)?
            } else {
                let mut skip = [0u8; ALIGN];
                read_some(link, &mut skip[..total - self.off], op, self.off)?
            };
            if n == 0 {
                break;
            }
            moved = true;
            self.off += n;
        }
        Ok(self.progress(total, moved))
    }
}

/// The sleep of a lane that nothing can move: until one of its descriptors
/// (the abort signal, its submissions) turns readable, a link with a
/// pending send or receive may move, or the lane's tick
/// passes (`LANE_TICK` in `wait.rs`: the lane checks its timeouts that
/// often). Waits as the driver does
/// ([`super::wait`]): on the doorbell when every pending link is in shared
/// memory, else in `poll(2)`, waking every `MIXED_POLL` while both kinds
/// are pending.
pub struct LaneWait<'a> {
    sleeper: Sleeper<'a>,
    /// The pending doorbell links, and whether each has a send (`true`) or
    /// a receive pending: asked again after registering on the doorbell.
    doorbell: SmallVec<[(&'a dyn Link, bool, bool); 8]>,
}

impl std::fmt::Debug for LaneWait<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneWait").field("doorbell_links", &self.doorbell.len()).finish()
    }
}

impl<'a> LaneWait<'a> {
    /// A wait that always ends when one of `always` turns readable.
    pub fn new(always: &[BorrowedFd<'a>]) -> LaneWait<'a> {
        LaneWait { sleeper: Sleeper::new(always), doorbell: SmallVec::new() }
    }

    /// Also ends when `link` can move its pending send (`send`) or receive
    /// (`recv`); a link with neither is not waited for.
    pub fn link(&mut self, link: &'a dyn Link, send: bool, recv: bool) {
        let mut want = PollFlags::empty();
        if send {
            want |= PollFlags::OUT;
        }
        if recv {
            want |= PollFlags::IN;
        }
        if want.is_empty() {
            return;
        }
        if self.sleeper.link(link, want) {
            self.doorbell.push((link, send, recv));
        }
    }

    /// Sleeps (see the type's docs), on `waiter` (this rank's doorbell)
    /// when only shared-memory links are pending; `more` says whether
    /// something else arrived meanwhile (new submissions), asked with the
    /// links after registering on the doorbell so no wake-up is lost. A
    /// failed `poll(2)` ends the wait like a wake-up: the lane looks at
    /// everything again, and its timeouts bound the waiting.
    pub fn sleep(self, waiter: Option<&Waiter>, more: impl Fn() -> bool) {
        let doorbell = self.doorbell;
        let ready =
            || doorbell.iter().any(|&(l, send, recv)| (send && l.ready(true)) || (recv && l.ready(false))) || more();
        let _ = self.sleeper.sleep(LANE_TICK, waiter, ready);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::AnyLink;
    use ringleader_core::{AbortSignal, DType, Fingerprint, OpKind};
    use std::time::{Duration, Instant};

    fn op(kind: OpKind, count: u64) -> OpInfo {
        OpInfo { seq: 1, fingerprint: Fingerprint::new(kind, DType::U8, count), checks: true }
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(7)).collect()
    }

    /// Moves a send on `a` and a receive on `b` (both of `len` bytes, one
    /// thread), sleeping in a [`LaneWait`] whenever neither can move.
    fn exchange(a: &mut dyn Link, b: &mut dyn Link, len: usize, waiter: Option<&Waiter>) -> Vec<u8> {
        let data = pattern(len);
        let mut got = vec![0u8; len];
        let (mut tx, mut rx) = (Transfer::new(), Transfer::new());
        let (mut sent, mut received) = (false, false);
        let abort = AbortSignal::new().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !(sent && received) {
            assert!(Instant::now() < deadline, "the exchange did not finish");
            let mut moved = false;
            if !sent {
                let p = tx.send(a, &data, &op(OpKind::Send, len as u64)).unwrap();
                sent = p == Moved::Done;
                moved |= p != Moved::Blocked;
            }
            if !received {
                let p = rx.recv(b, &mut got, &op(OpKind::Send, len as u64)).unwrap();
                received = p == Moved::Done;
                moved |= p != Moved::Blocked;
            }
            if !moved {
                let mut w = LaneWait::new(&[abort.fd()]);
                w.link(&*a, !sent, false);
                w.link(&*b, false, !received);
                w.sleep(waiter, || false);
            }
        }
        assert!(!tx.started() && !rx.started(), "a finished transfer is ready for the next frame");
        got
    }

    #[test]
    fn a_frame_larger_than_the_link_moves_in_pieces_between_waits() {
        let (mut a, mut b) = crate::tcp::test_pair();
        // Not a multiple of the alignment: the padding moves too.
        let len = (8 << 20) + 5;
        assert_eq!(exchange(&mut a, &mut b, len, None), pattern(len));
        // The links stay in step: the next frame follows.
        assert_eq!(exchange(&mut a, &mut b, 3, None), pattern(3));
    }

    #[test]
    fn over_shared_memory_the_lane_sleeps_on_the_doorbell() {
        let (mut a, mut b, _wa, wb) = crate::shm::test_pair("t-lane-bell");
        let len = (1 << 20) + 1;
        assert_eq!(exchange(&mut a, &mut b, len, Some(&wb)), pattern(len));
    }

    #[test]
    fn small_frames_travel_whole_in_the_fastbox_in_order_with_ring_frames() {
        let (mut a, mut b, _wa, _wb) = crate::shm::test_pair("t-lane-box");
        let sizes = [8, 3000, crate::link::FASTBOX_MAX + 1, 5, 1 << 20, 16];
        let mut tx = Transfer::new();
        // Each fits the rings at once: every send completes in one call.
        for (i, &len) in sizes.iter().enumerate() {
            let data: Vec<u8> = pattern(len).iter().map(|v| v ^ i as u8).collect();
            let mut op = op(OpKind::Send, len as u64);
            op.seq = i as u64 + 1;
            assert_eq!(tx.send(&mut a, &data, &op).unwrap(), Moved::Done, "frame {i}");
            if i == 0 {
                // In a cell, not in the ring.
                let fb = b.fastbox().expect("shared memory has fastboxes");
                assert_eq!(fb.peek().unwrap().map(|(h, d)| (h.seq, d.len())), Some((1, 8)));
                assert!(!tx.started());
            }
        }
        let mut rx = Transfer::new();
        for (i, &len) in sizes.iter().enumerate() {
            let mut got = vec![0u8; len];
            let mut op = op(OpKind::Recv, len as u64);
            op.seq = i as u64 + 1;
            let deadline = Instant::now() + Duration::from_secs(5);
            while rx.recv(&mut b, &mut got, &op).unwrap() != Moved::Done {
                assert!(Instant::now() < deadline, "frame {i} did not arrive");
            }
            let want: Vec<u8> = pattern(len).iter().map(|v| v ^ i as u8).collect();
            assert!(got == want, "frame {i} ({len} bytes) arrived changed or out of order");
        }
        // The same bytes as another call (two i32 for eight u8) are a
        // mismatch naming the peer, as in the stream.
        let seq = sizes.len() as u64 + 1;
        let sent = OpInfo { seq, fingerprint: Fingerprint::new(OpKind::Send, DType::I32, 2), checks: true };
        assert_eq!(tx.send(&mut a, &[7; 8], &sent).unwrap(), Moved::Done);
        let mut recv = op(OpKind::Recv, 8);
        recv.seq = seq;
        let e = loop {
            match rx.recv(&mut b, &mut [0u8; 8], &recv) {
                Ok(Moved::Done) => panic!("a frame of another call was taken"),
                Ok(_) => {}
                Err(e) => break e,
            }
        };
        assert!(matches!(e, Error::FrameMismatch { peer: 0, .. }), "{e:?}");
    }

    #[test]
    fn a_different_call_or_a_goodbye_fails_the_receive_naming_the_peer() {
        let (mut a, mut b) = crate::tcp::test_pair();
        let mut tx = Transfer::new();
        assert_eq!(tx.send(&mut a, &[1, 2, 3], &op(OpKind::Send, 3)).unwrap(), Moved::Done);
        let mut got = [0u8; 4];
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut rx = Transfer::new();
        let e = loop {
            assert!(Instant::now() < deadline);
            match rx.recv(&mut b, &mut got, &op(OpKind::Send, 4)) {
                Ok(_) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => break e,
            }
        };
        assert!(matches!(e, Error::FrameMismatch { peer: 0, .. }), "{e:?}");

        let (a, mut b) = crate::tcp::test_pair();
        let mut links: Vec<Vec<AnyLink>> = vec![vec![], vec![Box::new(a)]];
        crate::driver::say_goodbye(&mut links, 9);
        let mut rx = Transfer::new();
        let e = loop {
            assert!(Instant::now() < deadline);
            match rx.recv(&mut b, &mut got, &op(OpKind::Recv, 4)) {
                Ok(_) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => break e,
            }
        };
        assert!(matches!(e, Error::PeerLeft { peer: 0, their_seq: 9, .. }), "{e:?}");
    }
}
