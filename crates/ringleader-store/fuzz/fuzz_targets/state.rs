//! Plays arbitrary bytes as a script against the store's server state
//! machine: connections open, say hello (member, helper or tool; of one run
//! or another; with the token, a wrong one or none; with oversized fields),
//! send requests, let answers out, close, and time passes.
//!
//! Nothing may panic, the state's books must balance after every step, and
//! no answer carrying data may be queued past the caps (the checks live in
//! `ringleader_store::fuzzing::state_machine`). Seeds: `corpus/state/seed-*`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ringleader_store::fuzzing::state_machine(data);
});
