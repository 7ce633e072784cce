//! Return codes and the thread-local last error.
//!
//! Every fallible entry point returns an `int`: 0 on success, else the
//! [`ErrorKind::code`] of the failure (1..=18); [`RL_ERR_INTERNAL`] (18,
//! `internal`) is a bug in ringleader: a panic caught at the C boundary or
//! inside the library (the engine thread, the send/recv lane, a transport). The details of the last failure
//! on the calling thread stay readable through the `rl_last_error_*`
//! functions until the next failure on that thread.

use ringleader_core::{Error, ErrorKind};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Success.
pub const RL_OK: c_int = 0;
/// `internal`: a panic inside ringleader was caught (a bug; please report
/// it). The code of `ErrorKind::Internal`.
pub const RL_ERR_INTERNAL: c_int = 18;
/// The code a caught panic had before `internal` became a kind of its own;
/// `rl_error_kind_name` still names it `"internal"`, nothing returns it.
const RL_ERR_INTERNAL_OLD: c_int = -1;

/// The error codes of the C ABI: 0 is success, 1..=18 are the error kinds
/// of docs/DESIGN.md §1 in the order of `ErrorKind::ALL` (18, `internal`,
/// a bug in ringleader).
///
/// Functions return `int` rather than this enum, so that a future code is
/// never an invalid enum value on either side.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RlErrorCode {
    /// Success.
    Ok = 0,
    /// `missed-collective`: a rank did not enter a collective the others are in.
    MissedCollective = 1,
    /// `mismatch`: ranks called a collective with different arguments.
    Mismatch = 2,
    /// `peer-died`: a rank's process ended without leaving the job.
    PeerDied = 3,
    /// `peer-stalled`: a rank is alive but makes no progress.
    PeerStalled = 4,
    /// `straggler`: a rank is slow (a warning; never returned by a call).
    Straggler = 5,
    /// `timeout`: a wait ran out and nothing better is known.
    Timeout = 6,
    /// `rendezvous-incomplete`: not every rank joined in time.
    RendezvousIncomplete = 7,
    /// `world-size-mismatch`: ranks were launched with different world sizes.
    WorldSizeMismatch = 8,
    /// `duplicate-rank`: two processes claim the same rank.
    DuplicateRank = 9,
    /// `version-mismatch`: ranks run different versions.
    VersionMismatch = 10,
    /// `store-unreachable`: the store cannot be reached.
    StoreUnreachable = 11,
    /// `port-in-use`: the port to listen on is taken.
    PortInUse = 12,
    /// `data-port-unreachable`: a data port between two ranks is blocked.
    DataPortUnreachable = 13,
    /// `foreign-run`: a peer or store belongs to another run.
    ForeignRun = 14,
    /// `auth-failed`: a peer failed the shared-secret check.
    AuthFailed = 15,
    /// `aborted`: the communicator was aborted.
    Aborted = 16,
    /// `invalid-argument`: the caller passed something unusable.
    InvalidArgument = 17,
    /// `internal`: a bug in ringleader (a panic, caught and named).
    Internal = 18,
}

/// The last failure on this thread.
#[derive(Default)]
struct LastError {
    code: c_int,
    message: Option<CString>,
    ranks: Vec<i64>,
    seq: i64,
    op: c_int,
}

thread_local! {
    static LAST: RefCell<LastError> = RefCell::new(LastError { seq: -1, op: -1, ..LastError::default() });
}

/// A C string without interior NULs (they are replaced, never truncated on).
pub(crate) fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "\u{FFFD}")).unwrap_or_default()
}

/// Records `e` as this thread's last error and returns its code.
pub(crate) fn fail(e: &Error) -> c_int {
    let code = e.kind().code();
    LAST.with(|l| {
        *l.borrow_mut() = LastError {
            code,
            message: Some(c_string(&e.to_string())),
            ranks: e.ranks().into_iter().map(|r| r as i64).collect(),
            seq: e.seq().map_or(-1, |s| s as i64),
            op: e.op().map_or(-1, |o| c_int::from(o.code())),
        };
    });
    code
}

/// Shorthand: records an `invalid-argument` error.
pub(crate) fn invalid(what: &str, detail: impl Into<String>) -> c_int {
    fail(&Error::invalid(what, detail))
}

/// Runs `body` so that no panic crosses the C boundary; a panic becomes
/// [`RL_ERR_INTERNAL`] with its message as the last error.
pub(crate) fn guard(body: impl FnOnce() -> c_int) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(code) => code,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            LAST.with(|l| {
                *l.borrow_mut() = LastError {
                    code: RL_ERR_INTERNAL,
                    message: Some(c_string(&format!("[internal] a bug in ringleader: {what}"))),
                    ranks: Vec::new(),
                    seq: -1,
                    op: -1,
                };
            });
            RL_ERR_INTERNAL
        }
    }
}

/// Like [`guard`] for functions that return a value rather than a code:
/// `fallback` when a panic was caught.
pub(crate) fn guard_value<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}

/// Maps a result to a code, recording the error.
pub(crate) fn code_of(r: ringleader_core::Result<()>) -> c_int {
    match r {
        Ok(()) => RL_OK,
        Err(e) => fail(&e),
    }
}

/// The stable name of an error code (`"peer-died"`), `"ok"` for 0,
/// `"internal"` for 18 (and for -1, its code in earlier builds),
/// `"unknown"` otherwise. The string is static.
#[no_mangle]
pub extern "C" fn rl_error_kind_name(code: c_int) -> *const c_char {
    static_name(kind_name(code))
}

fn kind_name(code: c_int) -> &'static CStr {
    match code {
        RL_OK => c"ok",
        RL_ERR_INTERNAL | RL_ERR_INTERNAL_OLD => c"internal",
        c => match ErrorKind::from_code(c) {
            Some(ErrorKind::MissedCollective) => c"missed-collective",
            Some(ErrorKind::Mismatch) => c"mismatch",
            Some(ErrorKind::PeerDied) => c"peer-died",
            Some(ErrorKind::PeerStalled) => c"peer-stalled",
            Some(ErrorKind::Straggler) => c"straggler",
            Some(ErrorKind::Timeout) => c"timeout",
            Some(ErrorKind::RendezvousIncomplete) => c"rendezvous-incomplete",
            Some(ErrorKind::WorldSizeMismatch) => c"world-size-mismatch",
            Some(ErrorKind::DuplicateRank) => c"duplicate-rank",
            Some(ErrorKind::VersionMismatch) => c"version-mismatch",
            Some(ErrorKind::StoreUnreachable) => c"store-unreachable",
            Some(ErrorKind::PortInUse) => c"port-in-use",
            Some(ErrorKind::DataPortUnreachable) => c"data-port-unreachable",
            Some(ErrorKind::ForeignRun) => c"foreign-run",
            Some(ErrorKind::AuthFailed) => c"auth-failed",
            Some(ErrorKind::Aborted) => c"aborted",
            Some(ErrorKind::InvalidArgument) => c"invalid-argument",
            Some(ErrorKind::Internal) => c"internal",
            _ => c"unknown",
        },
    }
}

fn static_name(s: &'static CStr) -> *const c_char {
    s.as_ptr()
}

/// The code of the last failure on this thread (0 if none yet).
#[no_mangle]
pub extern "C" fn rl_last_error_code() -> c_int {
    guard_value(RL_ERR_INTERNAL, || LAST.with(|l| l.borrow().code))
}

/// The kind name of the last failure on this thread (`"peer-died"`; `"ok"`
/// if none yet). The string is static.
#[no_mangle]
pub extern "C" fn rl_last_error_kind() -> *const c_char {
    rl_error_kind_name(rl_last_error_code())
}

/// The message of the last failure on this thread: the verdict text, which
/// starts with the kind in brackets (`[missed-collective] ...`) and may span
/// several lines. `""` if none yet. The pointer stays valid until the next
/// failure on this thread; copy the text to keep it.
#[no_mangle]
pub extern "C" fn rl_last_error_message() -> *const c_char {
    guard_value(c"".as_ptr(), || LAST.with(|l| l.borrow().message.as_ref().map_or(c"".as_ptr(), |m| m.as_ptr())))
}

/// The ranks the last failure names (culprits, missing or conflicting
/// ranks): copies at most `cap` of them into `out` (which may be NULL when
/// `cap` is 0) and returns how many there are in all.
///
/// # Safety
/// `out` must be valid for writes of `cap` elements (or NULL with `cap` 0).
#[no_mangle]
pub unsafe extern "C" fn rl_last_error_ranks(out: *mut i64, cap: usize) -> usize {
    guard_value(0, || {
        LAST.with(|l| {
            let l = l.borrow();
            if !out.is_null() {
                let n = cap.min(l.ranks.len());
                // SAFETY: the caller guarantees `out` is valid for `cap` writes and n <= cap;
                // the source is a live Vec that cannot overlap caller memory.
                unsafe { std::ptr::copy_nonoverlapping(l.ranks.as_ptr(), out, n) };
            }
            l.ranks.len()
        })
    })
}

/// The sequence number of the collective the last failure concerns, or -1.
#[no_mangle]
pub extern "C" fn rl_last_error_seq() -> i64 {
    guard_value(-1, || LAST.with(|l| l.borrow().seq))
}

/// The operation (an `rl_op` code) the last failure concerns, or -1.
#[no_mangle]
pub extern "C" fn rl_last_error_op() -> c_int {
    guard_value(-1, || LAST.with(|l| l.borrow().op))
}

/// Test-only (not in the header): arms the fault hook of
/// `ringleader_core::fault`, so that the next time `point` (`engine`,
/// `driver` or `p2p`) is reached for operation `seq`, ringleader panics
/// there; the binding tests use it to show a panic ends in `internal`, not
/// a hang. Nothing but this call arms it.
///
/// # Safety
/// `point` must be NULL or NUL-terminated.
#[doc(hidden)]
#[no_mangle]
pub unsafe extern "C" fn rl_testonly_inject_panic(point: *const c_char, seq: u64) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees NULL or a NUL-terminated string.
        let name = match unsafe { crate::config::opt_str("point", point) } {
            Ok(Some(n)) => n,
            Ok(None) => return invalid("point", "is NULL"),
            Err(code) => return code,
        };
        match ringleader_core::fault::Point::parse(&name) {
            Some(p) => {
                ringleader_core::fault::arm(p, seq);
                RL_OK
            }
            None => invalid("point", format!("{name:?} is not engine, driver or p2p")),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_the_core_kinds() {
        let enum_codes = [
            (RlErrorCode::MissedCollective, ErrorKind::MissedCollective),
            (RlErrorCode::Mismatch, ErrorKind::Mismatch),
            (RlErrorCode::PeerDied, ErrorKind::PeerDied),
            (RlErrorCode::PeerStalled, ErrorKind::PeerStalled),
            (RlErrorCode::Straggler, ErrorKind::Straggler),
            (RlErrorCode::Timeout, ErrorKind::Timeout),
            (RlErrorCode::RendezvousIncomplete, ErrorKind::RendezvousIncomplete),
            (RlErrorCode::WorldSizeMismatch, ErrorKind::WorldSizeMismatch),
            (RlErrorCode::DuplicateRank, ErrorKind::DuplicateRank),
            (RlErrorCode::VersionMismatch, ErrorKind::VersionMismatch),
            (RlErrorCode::StoreUnreachable, ErrorKind::StoreUnreachable),
            (RlErrorCode::PortInUse, ErrorKind::PortInUse),
            (RlErrorCode::DataPortUnreachable, ErrorKind::DataPortUnreachable),
            (RlErrorCode::ForeignRun, ErrorKind::ForeignRun),
            (RlErrorCode::AuthFailed, ErrorKind::AuthFailed),
            (RlErrorCode::Aborted, ErrorKind::Aborted),
            (RlErrorCode::InvalidArgument, ErrorKind::InvalidArgument),
            (RlErrorCode::Internal, ErrorKind::Internal),
        ];
        assert_eq!(enum_codes.len(), ErrorKind::ALL.len());
        for (c, k) in enum_codes {
            assert_eq!(c as c_int, k.code(), "{k}");
            // SAFETY: rl_error_kind_name returns a static NUL-terminated string.
            let name = unsafe { CStr::from_ptr(rl_error_kind_name(c as c_int)) };
            assert_eq!(name.to_str().unwrap(), k.as_str());
        }
    }

    #[test]
    fn last_error_keeps_the_structured_fields() {
        let e = Error::Timeout {
            op: ringleader_core::OpKind::Barrier,
            seq: 4,
            waited: std::time::Duration::from_secs(1),
            awaited: vec![2, 3],
        };
        assert_eq!(fail(&e), ErrorKind::Timeout.code());
        assert_eq!(rl_last_error_seq(), 4);
        assert_eq!(rl_last_error_op(), c_int::from(ringleader_core::OpKind::Barrier.code()));
        let mut ranks = [0i64; 1];
        // SAFETY: `ranks` holds one element and cap is 1.
        assert_eq!(unsafe { rl_last_error_ranks(ranks.as_mut_ptr(), 1) }, 2);
        assert_eq!(ranks, [2]);
        // SAFETY: the message pointer is valid until the next failure on this thread.
        let msg = unsafe { CStr::from_ptr(rl_last_error_message()) }.to_str().unwrap().to_string();
        assert!(msg.starts_with("[timeout]"), "{msg}");
    }

    #[test]
    fn a_panic_becomes_internal() {
        let code = guard(|| panic!("boom"));
        assert_eq!(code, RL_ERR_INTERNAL);
        assert_eq!(ErrorKind::from_code(code), Some(ErrorKind::Internal));
        // SAFETY: static string.
        assert_eq!(unsafe { CStr::from_ptr(rl_error_kind_name(-1)) }.to_str().unwrap(), "internal");
        // SAFETY: valid until the next failure on this thread.
        let msg = unsafe { CStr::from_ptr(rl_last_error_message()) }.to_str().unwrap().to_string();
        assert!(msg.contains("boom"), "{msg}");
    }
}
