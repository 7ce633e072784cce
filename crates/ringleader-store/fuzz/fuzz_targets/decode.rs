//! Feeds arbitrary bytes to every decoder of the store's wire codec.
//!
//! Decoding must never panic nor allocate beyond the codec's limits, and
//! whatever decodes must re-encode to the very same bytes (the oracle lives
//! in `ringleader_store::fuzzing::decode`). Seeds: `corpus/decode/seed-*`,
//! one valid frame of every message kind.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ringleader_store::fuzzing::decode(data);
});
