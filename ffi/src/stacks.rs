//! `rl_set_stack_dump`: where a language runtime's own stack dump goes, so
//! that a failed job's verdict shows a culprit's line of user code.
//!
//! The Python package arms `faulthandler` on a real-time signal with a
//! private file (a memfd, or an unlinked 0600 file in a private folder)
//! and registers both here; when the job fails, the library raises that
//! signal on its capturing thread, reads the text back and parses it (see
//! the `ringleader` crate's `stacks` module). Native stacks need no
//! registration.

use crate::error::{guard, invalid, RL_OK};
use std::ffi::{c_char, c_int, CStr};

/// Registers the runtime's stack dump: on `signal`, a handler already
/// installed by the caller writes every thread's stack as text to `fd`
/// (Python's `faulthandler.register(signal, file=fd, all_threads=True)`
/// format). `main_ident` is the runtime's main thread
/// (`threading.main_thread().ident`), whose innermost frame of user code
/// the verdict shows; `internal` lists path prefixes of code that is not
/// the user's (the binding, torch, the standard library), one per line,
/// or NULL. `signal` 0 unregisters. `fd` must stay open, readable,
/// writable and seekable for as long as it is registered; the library
/// truncates it before each capture.
///
/// # Safety
/// `internal` NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn rl_set_stack_dump(
    fd: c_int,
    signal: c_int,
    main_ident: u64,
    internal: *const c_char,
) -> c_int {
    guard(|| {
        if signal < 0 || (signal > 0 && fd < 0) {
            return invalid("stack dump", "the signal must be 0 (off) or a signal number with an open file");
        }
        let prefixes = if internal.is_null() {
            Vec::new()
        } else {
            // SAFETY: non-null and NUL-terminated (the caller's promise).
            let text = unsafe { CStr::from_ptr(internal) };
            let Ok(text) = text.to_str() else {
                return invalid("stack dump", "the internal prefixes are not UTF-8");
            };
            text.lines().filter(|l| !l.is_empty()).map(str::to_string).collect()
        };
        rl::stacks::set_python_dump(fd, signal, main_ident, prefixes);
        RL_OK
    })
}
