//! Feeds arbitrary bytes to the data-plane handshake decoder.
//!
//! Decoding must never panic nor read past a bounded run id; a hello that
//! decodes must encode back to the very bytes it used, and verifying and
//! judging it against a challenge's nonce (the bytes after the hello, when
//! there are enough) must never panic. Seeds: `corpus/hello/seed-*`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringleader_transport::hello::{Hello, MAX_RUN_ID, NONCE_LEN};

fuzz_target!(|data: &[u8]| {
    let Ok(Some((h, used))) = Hello::decode(data) else { return };
    assert!(h.run_id.len() <= MAX_RUN_ID, "a run id of {} bytes decoded", h.run_id.len());
    assert_eq!(h.encode(), data[..used], "{h:?} encodes differently");
    let mut nonce = [0u8; NONCE_LEN];
    if let Some(rest) = data[used..].get(..NONCE_LEN) {
        nonce.copy_from_slice(rest);
    }
    let _ = h.verify(Some("token"), &nonce);
    let _ = h.verify(None, &nonce);
    let _ = h.judge(h.dst, h.world, &h.run_id, None, &nonce);
    let _ = h.judge(0, 1, "run", Some("token"), &nonce);
});
