//! Feeds arbitrary bytes to the data-frame header decoder.
//!
//! Decoding must never panic; a header that decodes must encode back to the
//! same 40 bytes (but for the padding byte after the reduce op, which the
//! decoder ignores), and comparing it with any expectation (built from the
//! bytes that follow) must never panic either. Seeds: `corpus/frame/seed-*`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringleader_core::Fingerprint;
use ringleader_transport::frame::{check, Expect, FrameHeader, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    let Some(head) = data.get(..HEADER_LEN) else { return };
    let bytes: [u8; HEADER_LEN] = head.try_into().unwrap();
    let Ok(h) = FrameHeader::decode(&bytes) else { return };
    let mut canonical = bytes;
    canonical[16 + 3] = 0;
    assert_eq!(h.encode(), canonical, "{h:?} encodes differently");
    assert_eq!(FrameHeader::decode(&h.encode()), Ok(h));
    let rest = &data[HEADER_LEN..];
    let fingerprint = Fingerprint::decode(rest.get(..16).unwrap_or_default()).unwrap_or(h.fingerprint);
    let num = |at: usize| rest.get(at..at + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
    let want = Expect { seq: num(16), fingerprint, tag: num(24) as u32, len: num(32) };
    for checks in [true, false] {
        let _ = check(&h, &want, checks);
    }
});
