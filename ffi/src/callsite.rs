//! `rl_set_call_site`: where the caller's code makes its next calls, kept
//! per thread and recorded with every operation the thread starts, so that
//! verdicts and dumps name the caller's own line (`train.py:24 in step`).
//!
//! Per thread rather than an argument of every collective: the collectives'
//! signatures stay as they are, and a binding that calls from one place in
//! a loop sets the tag once, not once per call.

use crate::error::{guard, invalid, RL_OK};
use rl::callsite::{self, CallSite, Tag};
use std::cell::Cell;
use std::ffi::{c_char, c_int, CStr};

thread_local! {
    static SITE: Cell<Option<Tag>> = const { Cell::new(None) };
}

/// The call site set on this thread, for the operation being started.
pub(crate) fn current() -> Option<CallSite> {
    SITE.with(Cell::get).map(CallSite::Tag)
}

/// Records `tag` (e.g. `train.c:42 in step`; at most 256 bytes are kept) as
/// where this thread's following operations are called from, until it is
/// set again; NULL clears it. Distinct tags are kept for the life of the
/// process (up to 16384, later ones are recorded as a fixed note), so tag by
/// code location, not by anything that changes per call.
///
/// # Safety
/// `tag` NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn rl_set_call_site(tag: *const c_char) -> c_int {
    guard(|| {
        if tag.is_null() {
            SITE.with(|s| s.set(None));
            return RL_OK;
        }
        // SAFETY: non-null and NUL-terminated (the caller's promise).
        let text = unsafe { CStr::from_ptr(tag) };
        let Ok(text) = text.to_str() else {
            return invalid("call site", "the tag is not UTF-8");
        };
        let interned = callsite::intern(text);
        SITE.with(|s| s.set(Some(interned)));
        RL_OK
    })
}
