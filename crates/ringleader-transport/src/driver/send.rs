//! Sending: a channel's queued sends, one frame after another, each as far
//! as the link takes it (a small one whole in a fastbox where the link has
//! one free); and the choice of how each payload travels.

use super::chan::Payload;
use super::frame_io::{lost, write_frame};
use super::{fastbox, single_copy, splice, Driver};
use crate::frame::{pad, FrameHeader, HEADER_LEN};
use crate::link::Link;
use crate::plan::{Buf, OpInfo, Plan, Region};

use ringleader_core::Result;

impl Driver {
    /// Writes queued sends on one link until it would block or the next send
    /// waits for a receive. Returns whether any byte moved.
    pub(super) fn pump_sends(
        &mut self,
        ci: usize,
        link: &mut dyn Link,
        bufs: &[Buf<'_>],
        plan: &Plan,
        op: &OpInfo,
    ) -> Result<bool> {
        let c = &mut self.chans[ci];
        let mut moved = single_copy::settle(c, link, &mut self.send_done);
        if !splice::write_owed(c, link, &mut moved)
            .map_err(|e| lost(link.peer(), op, &format!("sending failed: {e}")))?
        {
            return Ok(moved);
        }
        while let Some(&si) = c.sends.get(c.st.send_pos) {
            let item = plan.sends[si as usize];
            if item.after.is_some_and(|r| !self.recv_done[r as usize]) {
                break;
            }
            let data = &bufs[item.region.buf as usize].bytes()[item.region.range()];
            if c.st.out.off == 0
                && fastbox::send(link, item.chan.peer, op, self.boxed.fingerprint, c.st.send_pos as u32, data)?
            {
                moved = true;
                c.st.send_pos += 1;
                self.send_done[si as usize] = true;
                continue;
            }
            if c.st.out.off == 0 {
                let payload = self.policy.payload(link, si, item.region);
                let (tag, len) = (c.st.send_pos as u32, item.region.len as u64);
                let hdr = match payload {
                    Payload::SingleCopy => FrameHeader::remote(op.seq, op.fingerprint, tag, len),
                    Payload::Spliced => FrameHeader::spliced(op.seq, op.fingerprint, tag, len),
                    Payload::Inline => FrameHeader::data(op.seq, op.fingerprint, tag, len),
                };
                c.st.out = super::chan::Outgoing { off: 0, hdr: hdr.encode(), payload };
            }
            // A single-copy frame carries the payload's address instead.
            let addr = (data.as_ptr() as u64).to_le_bytes();
            let body: &[u8] = if c.st.out.payload == Payload::SingleCopy { &addr } else { data };
            let total = HEADER_LEN + body.len() + pad(body.len());
            let out = &mut c.st.out;
            let n = match out.payload {
                Payload::Spliced => splice::write_frame(link, &out.hdr, body, out.off),
                _ => write_frame(link, &out.hdr, body, out.off),
            }
            .map_err(|e| lost(link.peer(), op, &format!("sending failed: {e}")))?;
            if n == 0 {
                break;
            }
            moved = true;
            out.off += n;
            if out.off == total {
                let payload = out.payload;
                c.st.out = Default::default();
                c.st.send_pos += 1;
                match payload {
                    Payload::SingleCopy if single_copy::sent(c, link, si) => {}
                    _ => self.send_done[si as usize] = true,
                }
                // No receive of this plan writes a spliced frame's bytes, so
                // only the end of the plan waits for the peer to have them.
                c.st.unacked += u32::from(payload == Payload::Spliced);
            }
        }
        Ok(moved)
    }
}

/// What decides how a plan's sends travel, computed when the plan starts.
#[derive(Debug, Default)]
pub(super) struct SendPolicy {
    /// Splice socket frames from this size on (`None`: never).
    pub splice_min: Option<usize>,
    /// This rank receives in the current plan. Only then may its sends go
    /// single-copy or spliced: a rank that only sends (a broadcast's root)
    /// is idle otherwise, so its copy into the ring or socket is free and
    /// overlaps the reader's copy out, which beats one copy done by the
    /// reader alone (and a spliced send would hold it until acknowledged).
    busy: bool,
    /// Sends a receive of this rank waits for (`after_send`): they always
    /// go through the ring, since a single-copy send completes only when
    /// the peer has received it, and two ranks each waiting for their own
    /// send before receiving the other's would wait forever.
    gates: Vec<bool>,
    /// Bit b: buffer b is written by some receive of the current plan, so
    /// its bytes may change before a peer has them and are never spliced.
    written: u64,
}

impl SendPolicy {
    /// Sizes the scratch for plans of up to `sends` sends.
    pub(super) fn fit(&mut self, sends: usize) {
        self.gates.reserve(sends.saturating_sub(self.gates.len()));
    }

    /// Takes in the plan about to run.
    pub(super) fn prepare(&mut self, plan: &Plan) {
        self.busy = plan.recvs.iter().any(|r| r.region.len > 0);
        self.gates.clear();
        self.gates.resize(plan.sends.len(), false);
        for r in &plan.recvs {
            if let Some(s) = r.after_send {
                self.gates[s as usize] = true;
            }
        }
        self.written = plan.recvs.iter().fold(0, |m, r| m | 1u64.checked_shl(r.region.buf as u32).unwrap_or(u64::MAX));
    }

    /// How send `si` of `region` travels on `link`.
    fn payload(&self, link: &mut dyn Link, si: u32, region: Region) -> Payload {
        if self.busy && !self.gates[si as usize] && single_copy::allowed(link, region.len) {
            return Payload::SingleCopy;
        }
        let written = self.written & 1u64.checked_shl(region.buf as u32).unwrap_or(u64::MAX) != 0;
        // A rank that only sends (a broadcast's root) copies into the socket
        // for free, and then need not wait for the receiver's word: it runs
        // ahead into its next call while the receiver copies out.
        if self.busy && !written && splice::allowed(link, self.splice_min, region.len) {
            return Payload::Spliced;
        }
        Payload::Inline
    }
}
