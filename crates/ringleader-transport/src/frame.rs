//! Data-plane framing, sans-IO.
//!
//! Every message between ranks starts with a fixed 40-byte header that names
//! the collective it belongs to (sequence number and [`Fingerprint`]) and its
//! position in that collective's stream on this channel (`tag`). The receiver
//! compares the header with what it expects *before* touching the payload, so
//! a peer in a different call is caught at once, as a [`HeaderCheck::Mismatch`], rather
//! than read as data. Layout (little endian):
//!
//! ```text
//!  0  magic   u16  0x4c52 ("RL")
//!  2  version u8   FRAME_VERSION
//!  3  kind    u8   0 = data, 1 = goodbye (the peer left cleanly),
//!                  2 = single-copy descriptor (shared memory only),
//!                  3 = spliced data (TCP: to be acknowledged),
//!                  4 = consumed (the acknowledgement, no payload)
//!  4  tag     u32  frame index on this channel within the collective
//!  8  seq     u64  collective sequence number (per pair for send/recv)
//! 16  fp      16   Fingerprint::encode
//! 32  len     u64  payload bytes that follow
//! ```
//!
//! A single-copy descriptor carries, instead of the `len` payload bytes, the
//! 8-byte address where they lie in the sender's memory (see
//! [`crate::shm`]); it is checked like a data frame.
//!
//! A spliced frame is a data frame whose payload the sender's kernel sends
//! from the sender's own pages (TCP, `vmsplice`): the sender must not let
//! them change until the receiver has the bytes, so the receiver answers
//! each one with a `consumed` frame. Those come between the receiver's own
//! frames on the same connection and carry the collective's sequence
//! number, fingerprint and the spliced frame's tag.
//!
//! The payload is followed by zero padding up to a multiple of 8 bytes, so
//! every header and payload starts 8-byte aligned in the stream (shared
//! memory reduces straight out of its rings, which needs aligned elements).

use ringleader_core::Fingerprint;

/// Size of an encoded [`FrameHeader`].
pub const HEADER_LEN: usize = 40;
/// Frame format version; peers with another version are refused at connect.
pub const FRAME_VERSION: u8 = 3;
const MAGIC: u16 = 0x4c52;
/// Frames are padded to a multiple of this, so every header and payload
/// starts 8-byte aligned in a stream and ring slices can be reduced in place.
pub const ALIGN: usize = 8;

/// Bytes of padding after a payload of `len` bytes (to the next multiple
/// of [`ALIGN`]).
#[inline]
pub(crate) fn pad(len: usize) -> usize {
    (ALIGN - len % ALIGN) % ALIGN
}

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// Payload of a collective.
    Data,
    /// The peer destroyed its communicator; no more frames follow.
    Goodbye,
    /// Payload of a collective, left in the sender's memory for the
    /// receiver to copy (shared memory only): an address follows.
    Remote,
    /// Payload of a collective sent from the sender's pages: the receiver
    /// answers with [`FrameKind::Consumed`] once it has every byte.
    Spliced,
    /// The receiver has every byte of the spliced frame `tag`; no payload.
    Consumed,
}

/// One frame header.
///
/// ```
/// use ringleader_core::{DType, Fingerprint, OpKind};
/// use ringleader_transport::frame::{FrameHeader, HEADER_LEN};
/// let fp = Fingerprint::new(OpKind::AllGather, DType::I32, 3);
/// let h = FrameHeader::data(7, fp, 2, 12);
/// let bytes = h.encode();
/// assert_eq!(bytes.len(), HEADER_LEN);
/// assert_eq!(FrameHeader::decode(&bytes).unwrap(), h);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Data or goodbye.
    pub kind: FrameKind,
    /// Frame index on this channel within the collective.
    pub tag: u32,
    /// Collective sequence number.
    pub seq: u64,
    /// The sender's call.
    pub fingerprint: Fingerprint,
    /// Payload length in bytes.
    pub len: u64,
}

/// Why a header could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The first bytes are not our magic: not a ringleader peer, or a corrupt stream.
    #[error("bad magic {0:#06x} (not a ringleader data stream)")]
    BadMagic(u16),
    /// A different frame version.
    #[error("frame version {0}, this build speaks {FRAME_VERSION}")]
    Version(u8),
    /// Unknown kind, op, dtype or reduce op code.
    #[error("malformed header: {0}")]
    Malformed(&'static str),
}

impl FrameHeader {
    /// A data frame header.
    pub fn data(seq: u64, fingerprint: Fingerprint, tag: u32, len: u64) -> FrameHeader {
        FrameHeader { kind: FrameKind::Data, tag, seq, fingerprint, len }
    }

    /// The header of a single-copy descriptor for `len` payload bytes.
    pub fn remote(seq: u64, fingerprint: Fingerprint, tag: u32, len: u64) -> FrameHeader {
        FrameHeader { kind: FrameKind::Remote, tag, seq, fingerprint, len }
    }

    /// The header of a spliced data frame (see the module docs).
    pub fn spliced(seq: u64, fingerprint: Fingerprint, tag: u32, len: u64) -> FrameHeader {
        FrameHeader { kind: FrameKind::Spliced, tag, seq, fingerprint, len }
    }

    /// The acknowledgement of the spliced frame `tag` of collective `seq`.
    pub fn consumed(seq: u64, fingerprint: Fingerprint, tag: u32) -> FrameHeader {
        FrameHeader { kind: FrameKind::Consumed, tag, seq, fingerprint, len: 0 }
    }

    /// The header of a goodbye frame (sent when a communicator is destroyed).
    pub fn goodbye(seq: u64, fingerprint: Fingerprint) -> FrameHeader {
        FrameHeader { kind: FrameKind::Goodbye, tag: 0, seq, fingerprint, len: 0 }
    }

    /// Encodes to the fixed layout in the module docs.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2] = FRAME_VERSION;
        b[3] = match self.kind {
            FrameKind::Data => 0,
            FrameKind::Goodbye => 1,
            FrameKind::Remote => 2,
            FrameKind::Spliced => 3,
            FrameKind::Consumed => 4,
        };
        b[4..8].copy_from_slice(&self.tag.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..32].copy_from_slice(&self.fingerprint.encode());
        b[32..40].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes a header; never panics, whatever the bytes.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<FrameHeader, DecodeError> {
        let magic = u16::from_le_bytes([b[0], b[1]]);
        if magic != MAGIC {
            return Err(DecodeError::BadMagic(magic));
        }
        if b[2] != FRAME_VERSION {
            return Err(DecodeError::Version(b[2]));
        }
        let kind = match b[3] {
            0 => FrameKind::Data,
            1 => FrameKind::Goodbye,
            2 => FrameKind::Remote,
            3 => FrameKind::Spliced,
            4 => FrameKind::Consumed,
            _ => return Err(DecodeError::Malformed("unknown frame kind")),
        };
        let fingerprint =
            Fingerprint::decode(&b[16..32]).ok_or(DecodeError::Malformed("unknown op, dtype or reduce op"))?;
        Ok(FrameHeader {
            kind,
            tag: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            seq: u64::from_le_bytes(b[8..16].try_into().unwrap_or_default()),
            fingerprint,
            len: u64::from_le_bytes(b[32..40].try_into().unwrap_or_default()),
        })
    }
}

/// What a receiver expects the next frame on a channel to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    /// Our sequence number for the collective.
    pub seq: u64,
    /// Our call.
    pub fingerprint: Fingerprint,
    /// Frame index on this channel.
    pub tag: u32,
    /// Payload bytes we have room for.
    pub len: u64,
}

/// How a received header differs from what was expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderCheck {
    /// The frame is the one expected.
    Ok,
    /// The peer says goodbye: it destroyed its communicator.
    Goodbye {
        /// The last collective the peer had started.
        seq: u64,
    },
    /// The peer is in another collective, or the same one with other arguments.
    Mismatch {
        /// The peer's sequence number.
        seq: u64,
        /// The peer's call.
        fingerprint: Fingerprint,
    },
    /// Same call, but the frame's position or size disagrees: the ranks
    /// computed different schedules (a ringleader bug or a version skew).
    Schedule {
        /// The tag received.
        tag: u32,
        /// The length received.
        len: u64,
    },
}

/// Compares a received header with the expectation. With `checks` off, only
/// what keeps the stream intact (tag and length) is compared.
///
/// ```
/// use ringleader_core::{DType, Fingerprint, OpKind};
/// use ringleader_transport::frame::{check, Expect, FrameHeader, HeaderCheck};
/// let ours = Fingerprint::new(OpKind::AllReduce, DType::F32, 1);
/// let theirs = Fingerprint::new(OpKind::AllReduce, DType::F32, 2);
/// let want = Expect { seq: 2, fingerprint: ours, tag: 0, len: 4 };
/// assert_eq!(check(&FrameHeader::data(2, ours, 0, 4), &want, true), HeaderCheck::Ok);
/// assert!(matches!(check(&FrameHeader::data(2, theirs, 0, 8), &want, true), HeaderCheck::Mismatch { .. }));
/// ```
pub fn check(h: &FrameHeader, want: &Expect, checks: bool) -> HeaderCheck {
    if h.kind == FrameKind::Goodbye {
        return HeaderCheck::Goodbye { seq: h.seq };
    }
    if checks && (h.seq != want.seq || !h.fingerprint.matches(&want.fingerprint)) {
        return HeaderCheck::Mismatch { seq: h.seq, fingerprint: h.fingerprint };
    }
    if h.tag != want.tag || h.len != want.len {
        // Without checks a different call shows up here; report what we know.
        if !checks && (h.seq != want.seq || !h.fingerprint.matches(&want.fingerprint)) {
            return HeaderCheck::Mismatch { seq: h.seq, fingerprint: h.fingerprint };
        }
        return HeaderCheck::Schedule { tag: h.tag, len: h.len };
    }
    HeaderCheck::Ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringleader_core::{DType, OpKind, ReduceOp};

    fn fp(n: u64) -> Fingerprint {
        Fingerprint::new(OpKind::AllReduce, DType::F32, n).with_reduce_op(ReduceOp::Sum)
    }

    #[test]
    fn payloads_are_padded_to_the_alignment() {
        assert_eq!((pad(0), pad(1), pad(8), pad(13)), (0, 7, 0, 3));
    }

    #[test]
    fn remote_descriptors_round_trip_and_check_like_data() {
        let h = FrameHeader::remote(3, fp(2), 1, 1 << 20);
        assert_eq!(FrameHeader::decode(&h.encode()).unwrap(), h);
        let want = Expect { seq: 3, fingerprint: fp(2), tag: 1, len: 1 << 20 };
        assert_eq!(check(&h, &want, true), HeaderCheck::Ok);
        assert!(matches!(check(&FrameHeader::remote(4, fp(2), 1, 1 << 20), &want, true), HeaderCheck::Mismatch { .. }));
    }

    #[test]
    fn spliced_frames_check_like_data_and_acknowledgements_round_trip() {
        let h = FrameHeader::spliced(3, fp(2), 1, 1 << 20);
        assert_eq!(FrameHeader::decode(&h.encode()).unwrap(), h);
        let want = Expect { seq: 3, fingerprint: fp(2), tag: 1, len: 1 << 20 };
        assert_eq!(check(&h, &want, true), HeaderCheck::Ok);
        assert!(matches!(
            check(&FrameHeader::spliced(4, fp(2), 1, 1 << 20), &want, true),
            HeaderCheck::Mismatch { .. }
        ));
        let ack = FrameHeader::consumed(3, fp(2), 1);
        assert_eq!(FrameHeader::decode(&ack.encode()).unwrap(), ack);
        assert_eq!((ack.kind, ack.len), (FrameKind::Consumed, 0));
    }

    #[test]
    fn goodbye_round_trips() {
        let h = FrameHeader::goodbye(9, fp(1));
        assert_eq!(FrameHeader::decode(&h.encode()).unwrap(), h);
        let want = Expect { seq: 10, fingerprint: fp(1), tag: 0, len: 4 };
        assert_eq!(check(&h, &want, true), HeaderCheck::Goodbye { seq: 9 });
    }

    #[test]
    fn bad_headers_are_errors() {
        let mut b = FrameHeader::data(1, fp(1), 0, 4).encode();
        b[0] = 0;
        assert!(matches!(FrameHeader::decode(&b), Err(DecodeError::BadMagic(_))));
        let mut b = FrameHeader::data(1, fp(1), 0, 4).encode();
        b[2] = 99;
        assert_eq!(FrameHeader::decode(&b), Err(DecodeError::Version(99)));
        let mut b = FrameHeader::data(1, fp(1), 0, 4).encode();
        b[16] = 200;
        assert!(matches!(FrameHeader::decode(&b), Err(DecodeError::Malformed(_))));
    }

    #[test]
    fn seq_and_schedule_disagreements() {
        let want = Expect { seq: 5, fingerprint: fp(4), tag: 1, len: 16 };
        assert!(matches!(
            check(&FrameHeader::data(6, fp(4), 1, 16), &want, true),
            HeaderCheck::Mismatch { seq: 6, .. }
        ));
        assert_eq!(check(&FrameHeader::data(5, fp(4), 2, 16), &want, true), HeaderCheck::Schedule { tag: 2, len: 16 });
        // Checks off: a different count still cannot corrupt the stream.
        assert!(matches!(check(&FrameHeader::data(5, fp(8), 1, 32), &want, false), HeaderCheck::Mismatch { .. }));
        assert_eq!(check(&FrameHeader::data(5, fp(8), 1, 16), &want, false), HeaderCheck::Ok);
    }

    proptest::proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::array::uniform32(proptest::num::u8::ANY), tail in proptest::array::uniform8(proptest::num::u8::ANY)) {
            let mut b = [0u8; HEADER_LEN];
            b[..32].copy_from_slice(&bytes);
            b[32..].copy_from_slice(&tail);
            let _ = FrameHeader::decode(&b);
            b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
            b[2] = FRAME_VERSION;
            let _ = FrameHeader::decode(&b);
        }
    }

    /// One header of every kind, for the fuzz target's seed corpus.
    fn seeds() -> Vec<Vec<u8>> {
        let send = Fingerprint::new(OpKind::Send, DType::U8, 3).with_root(1);
        [
            FrameHeader::data(7, fp(1024), 2, 4096),
            FrameHeader::goodbye(9, fp(0)),
            FrameHeader::remote(3, fp(1 << 20), 0, 4 << 20),
            FrameHeader::spliced(4, send, 1, 1 << 18),
            FrameHeader::consumed(4, send, 1),
        ]
        .iter()
        .map(|h| {
            // The header, then an expectation (fingerprint, seq, tag, len) for `check`.
            let mut b = h.encode().to_vec();
            b.extend(h.fingerprint.encode());
            b.extend(h.seq.to_le_bytes());
            b.extend(u64::from(h.tag).to_le_bytes());
            b.extend(h.len.to_le_bytes());
            b
        })
        .collect()
    }

    /// The committed seeds decode: the fuzzer starts from valid headers.
    #[test]
    fn the_seed_corpus_decodes() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/frame");
        let Ok(entries) = std::fs::read_dir(&dir) else { return };
        for entry in entries {
            let data = std::fs::read(entry.unwrap().path()).unwrap();
            let head: [u8; HEADER_LEN] = data[..HEADER_LEN].try_into().unwrap();
            assert!(FrameHeader::decode(&head).is_ok(), "{data:?}");
        }
    }

    /// Regenerates the seeds: `cargo test -p ringleader-transport write_frame_seeds -- --ignored`.
    #[test]
    #[ignore]
    fn write_frame_seeds() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/frame");
        std::fs::create_dir_all(&dir).unwrap();
        for (i, seed) in seeds().iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:02}")), seed).unwrap();
        }
    }
}
