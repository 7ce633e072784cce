//! Receiving: a channel's queued receives, one frame after another (a
//! small one whole from a fastbox, where the link has it there): the
//! header (checked against what the plan expects, acknowledgements taken
//! aside), then the payload by its path (inline through a
//! [`super::strategy`], or single copy), then the padding.

use super::chan::Payload;
use super::frame_io::{check_decoded, decode_header, read_some, Landing};
use super::{fastbox, single_copy, splice, strategy, Driver};
use crate::frame::{pad, FrameKind, ALIGN, HEADER_LEN};
use crate::link::Link;
use crate::plan::{Buf, OpInfo, Plan, RecvMode};
use crate::stream_copy::STREAM_MIN_BUFFER;
use ringleader_core::Result;

impl Driver {
    /// Reads queued receives on one link until it would block or the next
    /// receive waits for something. Returns whether any byte moved.
    pub(super) fn pump_recvs(
        &mut self,
        ci: usize,
        link: &mut dyn Link,
        bufs: &mut [Buf<'_>],
        plan: &Plan,
        op: &OpInfo,
    ) -> Result<bool> {
        let mut moved = false;
        let c = &mut self.chans[ci];
        loop {
            let Some(&ri) = c.recvs.get(c.st.recv_pos) else {
                if c.st.unacked > 0 {
                    splice::read_trailing_acks(c, link, op, &mut moved)?;
                }
                break;
            };
            let item = plan.recvs[ri as usize];
            if item.after.is_some_and(|r| !self.recv_done[r as usize])
                || item.after_send.is_some_and(|s| !self.send_done[s as usize])
            {
                break;
            }
            let tag = c.st.recv_pos as u32;
            if c.st.inc.off == 0 && fastbox::recv(link, bufs, &item, tag, op, self.boxed.fingerprint)? {
                moved = true;
                c.st.recv_pos += 1;
                self.recv_done[ri as usize] = true;
                continue;
            }
            if c.st.inc.off < HEADER_LEN {
                let inc = &mut c.st.inc;
                match read_some(link, &mut inc.hdr[inc.off..], op, inc.off)? {
                    0 => break,
                    n => {
                        moved = true;
                        inc.off += n;
                    }
                }
                if inc.off < HEADER_LEN {
                    continue;
                }
                let h = decode_header(&inc.hdr, link.peer())?;
                if splice::take_ack(c, &h, link.peer())? {
                    continue;
                }
                c.st.inc.payload = match check_decoded(&h, link.peer(), tag, item.region.len, op)? {
                    FrameKind::Remote => Payload::SingleCopy,
                    FrameKind::Spliced => Payload::Spliced,
                    _ => Payload::Inline,
                };
            }
            if c.st.inc.payload == Payload::SingleCopy {
                if !single_copy::recv(c, link, bufs, &item, op, &mut moved)? {
                    break;
                }
                c.st.inc = Default::default();
                c.st.recv_pos += 1;
                self.recv_done[ri as usize] = true;
                continue;
            }
            let payload_end = HEADER_LEN + item.region.len;
            if c.st.inc.off < payload_end {
                let done = match item.mode {
                    RecvMode::Copy => {
                        // A large destination that nothing reads again
                        // during the plan is written around the cache.
                        let landing = match !self.forwarded[ri as usize]
                            && bufs[item.region.buf as usize].bytes().len() >= STREAM_MIN_BUFFER
                        {
                            true => Landing::Streamed,
                            false => Landing::Cached,
                        };
                        strategy::copy(c, link, bufs, &item, op, landing, &mut moved)?
                    }
                    RecvMode::Reduce { with } => strategy::reduce(c, link, bufs, &item, with, op, &mut moved)?,
                };
                if !done {
                    break;
                }
            }
            let frame_end = payload_end + pad(item.region.len);
            let inc = &mut c.st.inc;
            if inc.off < frame_end {
                let mut skip = [0u8; ALIGN];
                match read_some(link, &mut skip[..frame_end - inc.off], op, inc.off)? {
                    0 => break,
                    n => {
                        moved = true;
                        inc.off += n;
                    }
                }
                if inc.off < frame_end {
                    continue;
                }
            }
            let spliced = inc.payload == Payload::Spliced;
            c.st.inc = Default::default();
            c.st.recv_pos += 1;
            self.recv_done[ri as usize] = true;
            if spliced {
                splice::owe(c, op, tag);
            }
        }
        Ok(moved)
    }
}
