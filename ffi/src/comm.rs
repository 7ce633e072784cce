//! `rl_comm` and `rl_work`: init, the collectives, work handles, the flight
//! recorder, abort and destroy.
//!
//! Every collective takes an optional `rl_work **work`: NULL runs the call
//! to completion; otherwise the call is queued, `*work` receives a handle,
//! and the buffers must stay valid (and untouched) until the handle
//! reports completion. Buffers are raw pointers with element counts and an
//! `rl_dtype`; in-place operations (all_reduce, broadcast, reduce, recv)
//! work on one buffer, the others read an input and write an output that
//! must not overlap it.

use crate::config::{build, opt_str, RlConfig};
use crate::error::{code_of, fail, guard, guard_value, invalid, RL_OK};
use crate::types::{dtype, reduce_op};
use ringleader_core::{DType, Rank};
use rl::{Call, Communicator, RawOp, Work};
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// A communicator: one rank's membership in a job (opaque).
///
/// A handle is a number in pointer's clothing, never a Rust pointer: every
/// call looks it up in a registry and holds the communicator (an `Arc`) for
/// as long as it runs. So `rl_destroy` racing a call on another thread
/// cannot free the communicator under it (the call is aborted and waited
/// for, and the memory lives until the last holder lets go), and a handle
/// used after `rl_destroy` is refused (`invalid-argument`) rather than
/// dereferenced. Numbers are never reused.
#[derive(Debug)]
pub struct RlComm {
    _opaque: [u8; 0],
}

/// A collective running in the background (opaque).
#[derive(Debug)]
pub struct RlWork {
    work: Work<()>,
}

// Handles cross threads in the bindings (Python calls from any thread).
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Communicator>();
    assert_send_sync::<Work<()>>();
};

/// The live communicators, by handle number.
static REGISTRY: RwLock<BTreeMap<usize, Arc<Communicator>>> = RwLock::new(BTreeMap::new());
/// The next handle number (0 is NULL).
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(1);

fn registry_read() -> std::sync::RwLockReadGuard<'static, BTreeMap<usize, Arc<Communicator>>> {
    REGISTRY.read().unwrap_or_else(|e| e.into_inner())
}

fn registry_write() -> std::sync::RwLockWriteGuard<'static, BTreeMap<usize, Arc<Communicator>>> {
    REGISTRY.write().unwrap_or_else(|e| e.into_inner())
}

/// Registers `comm` and returns its new handle.
fn register(comm: Communicator) -> *mut RlComm {
    let id = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
    registry_write().insert(id, Arc::new(comm));
    // A number, not an address: never dereferenced (see `RlComm`).
    id as *mut RlComm
}

/// The communicator behind handle `p`, held for the duration of a call:
/// `invalid-argument` for NULL or a handle that is not (or no longer) live.
pub(crate) fn comm_ref(p: *const RlComm) -> Result<Arc<Communicator>, c_int> {
    if p.is_null() {
        return Err(invalid("comm", "is NULL"));
    }
    registry_read()
        .get(&(p as usize))
        .cloned()
        .ok_or_else(|| invalid("comm", format!("{p:p} is not a live communicator (destroyed already?)")))
}

/// # Safety
/// `p` must be NULL or a live handle from a collective.
unsafe fn work_ref<'a>(p: *const RlWork) -> Result<&'a Work<()>, c_int> {
    // SAFETY: the caller guarantees `p` is NULL or a live handle.
    unsafe { p.as_ref() }.map(|w| &w.work).ok_or_else(|| invalid("work", "is NULL"))
}

/// Writes a new communicator handle to `out`.
///
/// # Safety
/// `out` must be valid for one write.
unsafe fn init_into(cfg: &RlConfig, out: *mut *mut RlComm) -> c_int {
    if out.is_null() {
        return invalid("out", "is NULL");
    }
    // SAFETY: `out` is non-null and the caller guarantees it is writable.
    unsafe { out.write(std::ptr::null_mut()) };
    // SAFETY: the caller of rl_init guarantees the config's strings are NULL or NUL-terminated.
    let config = tri!(unsafe { build(cfg) });
    match Communicator::init(config) {
        Ok(comm) => {
            // SAFETY: as above.
            unsafe { out.write(register(comm)) };
            RL_OK
        }
        Err(e) => fail(&e),
    }
}

/// Joins the job described by the environment (`RANK`, `WORLD_SIZE`,
/// `MASTER_ADDR`, `MASTER_PORT`, Slurm's or Open MPI's variables, and the
/// `RINGLEADER_*` settings). On success `*out` is a new handle for
/// `rl_destroy`; on failure it is NULL.
///
/// # Safety
/// `out` must be valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn rl_init_env(out: *mut *mut RlComm) -> c_int {
    // SAFETY: forwarded caller guarantee.
    guard(|| unsafe { init_into(&RlConfig::default(), out) })
}

/// Joins the job described by `cfg` (each unset field from the environment,
/// see `rl_config`); `cfg` NULL is `rl_init_env`.
///
/// # Safety
/// `cfg` must be NULL or a valid `rl_config` whose string fields are NULL
/// or NUL-terminated; `out` must be valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn rl_init(cfg: *const RlConfig, out: *mut *mut RlComm) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees `cfg` is NULL or valid.
        let cfg = unsafe { cfg.as_ref() }.copied().unwrap_or_default();
        // SAFETY: forwarded caller guarantee.
        unsafe { init_into(&cfg, out) }
    })
}

/// This process's rank, or -1 when `comm` is NULL.
///
/// # Safety
/// `comm` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn rl_comm_rank(comm: *const RlComm) -> i64 {
    guard_value(-1, || registry_read().get(&(comm as usize)).map_or(-1, |c| c.rank() as i64))
}

/// The number of ranks, or -1 when `comm` is NULL.
///
/// # Safety
/// `comm` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn rl_comm_world_size(comm: *const RlComm) -> i64 {
    guard_value(-1, || registry_read().get(&(comm as usize)).map_or(-1, |c| c.world_size() as i64))
}

/// The hard collective timeout in force, in seconds, or -1 when `comm` is NULL.
///
/// # Safety
/// `comm` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn rl_comm_timeout(comm: *const RlComm) -> f64 {
    guard_value(-1.0, || registry_read().get(&(comm as usize)).map_or(-1.0, |c| c.config().timeout.as_secs_f64()))
}

/// A buffer argument: pointer, element count, and its name for messages.
pub(crate) struct Buf {
    name: &'static str,
    pub(crate) ptr: *const c_void,
    pub(crate) count: usize,
}

impl Buf {
    pub(crate) fn new(name: &'static str, ptr: *const c_void, count: usize) -> Buf {
        Buf { name, ptr, count }
    }

    pub(crate) fn none() -> Buf {
        Buf { name: "", ptr: std::ptr::null(), count: 0 }
    }

    /// NULL with a non-zero count, or a byte size past `isize::MAX`, is refused.
    pub(crate) fn check(&self, dt: DType) -> Result<(), c_int> {
        if self.count > 0 && self.ptr.is_null() {
            return Err(invalid(self.name, format!("is NULL with a count of {}", self.count)));
        }
        match self.count.checked_mul(dt.size()) {
            Some(b) if b <= isize::MAX as usize => Ok(()),
            _ => Err(invalid(self.name, format!("{} elements of {dt} do not fit in memory", self.count))),
        }
    }
}

/// Runs (`work` NULL) or queues (`*work` receives the handle) one call.
///
/// # Safety
/// `comm` NULL or live; the buffers valid as `Communicator::call_raw`
/// requires (until the work completes, when queued); `work` NULL or writable.
unsafe fn submit(
    comm: *const RlComm,
    op: RawOp,
    dtype_code: c_int,
    input: Buf,
    output: Buf,
    work: *mut *mut RlWork,
) -> c_int {
    if !work.is_null() {
        // SAFETY: non-null, and the caller guarantees it is writable.
        unsafe { work.write(std::ptr::null_mut()) };
    }
    let c = tri!(comm_ref(comm));
    let dt = tri!(dtype(dtype_code));
    tri!(input.check(dt));
    tri!(output.check(dt));
    let call = Call {
        op,
        dtype: dt,
        input: input.ptr as *const u8,
        input_count: input.count,
        output: output.ptr as *mut u8,
        output_count: output.count,
        site: crate::callsite::current(),
    };
    if work.is_null() {
        // SAFETY: the caller guarantees the buffers are valid for the call; the facade
        // checks counts against the operation and refuses overlapping buffers.
        return code_of(unsafe { c.call_raw(call) });
    }
    // SAFETY: as above, until the work completes (the caller's promise).
    match unsafe { c.submit_raw(call) } {
        Ok(w) => {
            // SAFETY: `work` is non-null and writable (checked above).
            unsafe { work.write(Box::into_raw(Box::new(RlWork { work: w }))) };
            RL_OK
        }
        Err(e) => fail(&e),
    }
}

pub(crate) fn rank_arg(what: &'static str, r: i64) -> Result<Rank, c_int> {
    usize::try_from(r).map_err(|_| invalid(what, format!("{r} is not a rank")))
}

/// Reduces `buf` (`count` elements of `dtype`) across all ranks, in place,
/// with `op` (an `rl_reduce_op`).
///
/// # Safety
/// `comm` NULL or live; `buf` valid for reads and writes of `count`
/// elements until the call (or its work) completes; `work` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rl_all_reduce(
    comm: *const RlComm,
    buf: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    work: *mut *mut RlWork,
) -> c_int {
    guard(|| {
        let op = tri!(reduce_op(op));
        let out = Buf::new("buf", buf, count);
        // SAFETY: forwarded caller guarantees.
        unsafe { submit(comm, RawOp::AllReduce { op }, dtype, Buf::none(), out, work) }
    })
}

/// Concatenates every rank's `input` (`in_count` elements) in rank order
/// into `output` (`out_count` = world size x `in_count` elements).
///
/// # Safety
/// As `rl_all_reduce`; `input` readable for `in_count` elements, `output`
/// writable for `out_count`, not overlapping.
#[no_mangle]
pub unsafe extern "C" fn rl_all_gather(
    comm: *const RlComm,
    input: *const c_void,
    in_count: usize,
    output: *mut c_void,
    out_count: usize,
    dtype: c_int,
    work: *mut *mut RlWork,
) -> c_int {
    guard(|| {
        let (i, o) = (Buf::new("input", input, in_count), Buf::new("output", output, out_count));
        // SAFETY: forwarded caller guarantees.
        unsafe { submit(comm, RawOp::AllGather, dtype, i, o, work) }
    })
}

/// Reduces `input` (`in_count` = world size x `out_count` elements) across
/// ranks and leaves segment `rank` of the result in `output`.
///
/// # Safety
/// As `rl_all_gather`.
#[no_mangle]
pub unsafe extern "C" fn rl_reduce_scatter(
    comm: *const RlComm,
    input: *const c_void,
    in_count: usize,
    output: *mut c_void,
    out_count: usize,
    dtype: c_int,
    op: c_int,
    work: *mut *mut RlWork,
) -> c_int {
    guard(|| {
        let op = tri!(reduce_op(op));
        let (i, o) = (Buf::new("input", input, in_count), Buf::new("output", output, out_count));
        // SAFETY: forwarded caller guarantees.
        unsafe { submit(comm, RawOp::ReduceScatter { op }, dtype, i, o, work) }
    })
}

/// Copies rank `root`'s `buf` into every rank's `buf`.
///
/// # Safety
/// As `rl_all_reduce`.
#[no_mangle]
pub unsafe extern "C" fn rl_broadcast(
    comm: *const RlComm,
    buf: *mut c_void,
    count: usize,
    dtype: c_int,
    root: i64,
    work: *mut *mut RlWork,
) -> c_int {
    guard(|| {
        let root = tri!(rank_arg("root", root));
        // SAFETY: forwarded caller guarantees.
        unsafe { submit(comm, RawOp::Broadcast { root }, dtype, Buf::none(), Buf::new("buf", buf, count), work) }
    })
}

/// Reduces `buf` across ranks into rank `root`'s `buf` (the others' are
/// left unchanged).
///
/// # Safety
/// As `rl_all_reduce`.
#[no_mangle]
pub unsafe extern "C" fn rl_reduce(
    comm: *const RlComm,
    buf: *mut c_void,
    count: usize,
    dtype: c_int,
    root: i64,
    op: c_int,
    work: *mut *mut RlWork,
) -> c_int {
    guard(|| {
        let root = tri!(rank_arg("root", root));
        let op = tri!(reduce_op(op));
        // SAFETY: forwarded caller guarantees.
        unsafe { submit(comm, RawOp::Reduce { root, op }, dtype, Buf::none(), Buf::new("buf", buf, count), work) }
    })
}

/// Sends segment j of `input` to rank j and receives rank j's segment into
/// segment j of `output` (both `count` elements, a multiple of the world size).
///
/// # Safety
/// As `rl_all_gather`.
#[no_mangle]
pub unsafe extern "C" fn rl_all_to_all(
    comm: *const RlComm,
    input: *const c_void,
    in_count: usize,
    output: *mut c_void,
    out_count: usize,
    dtype: c_int,
    work: *mut *mut RlWork,
) -> c_int {
    guard(|| {
        let (i, o) = (Buf::new("input", input, in_count), Buf::new("output", output, out_count));
        // SAFETY: forwarded caller guarantees.
        unsafe { submit(comm, RawOp::AllToAll, dtype, i, o, work) }
    })
}

/// Sends `buf` to rank `dst`, which must receive the same count and dtype.
///
/// # Safety
/// As `rl_all_reduce` (`buf` is only read).
#[no_mangle]
pub unsafe extern "C" fn rl_send(
    comm: *const RlComm,
    buf: *const c_void,
    count: usize,
    dtype: c_int,
    dst: i64,
    work: *mut *mut RlWork,
) -> c_int {
    guard(|| {
        let peer = tri!(rank_arg("dst", dst));
        // SAFETY: forwarded caller guarantees.
        unsafe { submit(comm, RawOp::Send { peer }, dtype, Buf::new("buf", buf, count), Buf::none(), work) }
    })
}

/// Receives `count` elements from rank `src` into `buf`.
///
/// # Safety
/// As `rl_all_reduce`.
#[no_mangle]
pub unsafe extern "C" fn rl_recv(
    comm: *const RlComm,
    buf: *mut c_void,
    count: usize,
    dtype: c_int,
    src: i64,
    work: *mut *mut RlWork,
) -> c_int {
    guard(|| {
        let peer = tri!(rank_arg("src", src));
        // SAFETY: forwarded caller guarantees.
        unsafe { submit(comm, RawOp::Recv { peer }, dtype, Buf::none(), Buf::new("buf", buf, count), work) }
    })
}

/// Returns once every rank has entered the barrier.
///
/// # Safety
/// `comm` NULL or live; `work` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rl_barrier(comm: *const RlComm, work: *mut *mut RlWork) -> c_int {
    // SAFETY: forwarded caller guarantees; no buffers.
    guard(|| unsafe { submit(comm, RawOp::Barrier, 0, Buf::none(), Buf::none(), work) })
}

/// A barrier in which rank 0 waits at most `timeout_s` seconds for the
/// others and then fails naming those that did not arrive (all of them when
/// `wait_all_ranks` is non-zero, else the first); the other ranks fail
/// pointing at rank 0's report. The communicator stays usable afterwards.
///
/// # Safety
/// `comm` NULL or live; `work` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rl_monitored_barrier(
    comm: *const RlComm,
    timeout_s: f64,
    wait_all_ranks: c_int,
    work: *mut *mut RlWork,
) -> c_int {
    guard(|| {
        if !(timeout_s.is_finite() && timeout_s > 0.0 && timeout_s < 1e9) {
            return invalid("timeout_s", format!("{timeout_s} is not a positive number of seconds"));
        }
        let op = RawOp::MonitoredBarrier { timeout: Duration::from_secs_f64(timeout_s), wait_all: wait_all_ranks != 0 };
        // SAFETY: forwarded caller guarantees; no buffers.
        unsafe { submit(comm, op, 0, Buf::none(), Buf::none(), work) }
    })
}

/// Waits for a queued call, at most `timeout_s` seconds (negative: until it
/// ends, which the communicator's own timeout bounds). Returns the call's
/// result; `timeout` when `timeout_s` passed first, in which case the call
/// keeps running and may be waited for again.
///
/// # Safety
/// `work` NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn rl_work_wait(work: *const RlWork, timeout_s: f64) -> c_int {
    guard(|| {
        // SAFETY: forwarded caller guarantee.
        let w = tri!(unsafe { work_ref(work) });
        if timeout_s.is_nan() {
            return invalid("timeout_s", "is NaN");
        }
        let limit = (0.0..1e9).contains(&timeout_s).then(|| Duration::from_secs_f64(timeout_s));
        code_of(w.wait(limit))
    })
}

/// Sets `*done` to whether the queued call has ended (successfully or
/// not; `rl_work_wait` then returns its result at once).
///
/// # Safety
/// `work` NULL or a live handle; `done` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rl_work_test(work: *const RlWork, done: *mut bool) -> c_int {
    guard(|| {
        // SAFETY: forwarded caller guarantee.
        let w = tri!(unsafe { work_ref(work) });
        if done.is_null() {
            return invalid("done", "is NULL");
        }
        // SAFETY: non-null and writable (caller guarantee).
        unsafe { done.write(w.is_completed()) };
        RL_OK
    })
}

/// Frees a work handle. If its call still runs, waits for it first (the
/// call writes into the caller's buffers until it ends; the communicator's
/// timeout bounds the wait). NULL is ignored.
///
/// # Safety
/// `work` NULL or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn rl_work_free(work: *mut RlWork) {
    guard(|| {
        if !work.is_null() {
            // SAFETY: the caller hands over a live handle made by Box::into_raw.
            let w = unsafe { Box::from_raw(work) };
            let _ = w.work.wait(None);
        }
        RL_OK
    });
}

/// Hands a Rust string to C (free with `rl_string_free`).
///
/// # Safety
/// `out` must be NULL or writable.
unsafe fn give_string(out: *mut *mut c_char, s: &str) {
    if !out.is_null() {
        // SAFETY: non-null and writable (caller guarantee).
        unsafe { out.write(crate::error::c_string(s).into_raw()) };
    }
}

/// Writes this rank's flight-recorder dump (JSON, docs/DESIGN.md §3) to `path`,
/// or to `RINGLEADER_DUMP_DIR/<run>/ringleader-rank<R>.json` when `path` is
/// NULL (default folder `$TMPDIR/ringleader-dumps-$UID`; `<run>` is the run
/// id, with the store's port appended for `default` and `none`).
/// When `written` is not NULL it receives the path written (free it with
/// `rl_string_free`).
///
/// # Safety
/// `comm` NULL or live; `path` NULL or NUL-terminated; `written` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rl_comm_dump(comm: *const RlComm, path: *const c_char, written: *mut *mut c_char) -> c_int {
    guard(|| {
        if !written.is_null() {
            // SAFETY: non-null and writable (caller guarantee).
            unsafe { written.write(std::ptr::null_mut()) };
        }
        let c = tri!(comm_ref(comm));
        // SAFETY: forwarded caller guarantee.
        let path = tri!(unsafe { opt_str("path", path) }).map(PathBuf::from);
        match c.dump(path.as_deref()) {
            Ok(p) => {
                // SAFETY: `written` is NULL or writable.
                unsafe { give_string(written, &p.to_string_lossy()) };
                RL_OK
            }
            Err(e) => fail(&e),
        }
    })
}

/// The flight recorder (the last operations, oldest first) as a JSON array
/// of entries whose fields follow PyTorch's flight recorder. `*out`
/// receives a string to free with `rl_string_free`.
///
/// # Safety
/// `comm` NULL or live; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn rl_comm_flight_recorder_json(comm: *const RlComm, out: *mut *mut c_char) -> c_int {
    guard(|| {
        if out.is_null() {
            return invalid("out", "is NULL");
        }
        // SAFETY: non-null and writable (caller guarantee).
        unsafe { out.write(std::ptr::null_mut()) };
        let c = tri!(comm_ref(comm));
        let json = serde_json::to_string(&c.flight_recorder()).unwrap_or_else(|_| "[]".into());
        // SAFETY: `out` is non-null and writable.
        unsafe { give_string(out, &json) };
        RL_OK
    })
}

/// Frees a string returned by ringleader. NULL is ignored.
///
/// # Safety
/// `s` NULL or a string from ringleader, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn rl_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: the caller hands back a string made by CString::into_raw.
        drop(unsafe { CString::from_raw(s) });
    }
}

/// Aborts the communicator: the running call and every later one fail with
/// `aborted`, and the other ranks learn why. `reason` may be NULL. The
/// handle must still be destroyed.
///
/// # Safety
/// `comm` NULL or live; `reason` NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn rl_abort(comm: *const RlComm, reason: *const c_char) -> c_int {
    guard(|| {
        let c = tri!(comm_ref(comm));
        // SAFETY: forwarded caller guarantee.
        let reason = tri!(unsafe { opt_str("reason", reason) }).unwrap_or_else(|| "no reason given".into());
        c.abort(&reason);
        RL_OK
    })
}

/// Leaves the job cleanly (the other ranks read "left", not "died") and
/// frees the handle. NULL is ignored. A call running on another thread
/// meanwhile is aborted (it returns `aborted`) and waited for, at most the
/// communicator's timeout plus 5 s; calls made with the handle afterwards
/// fail with `invalid-argument`.
///
/// # Safety
/// `comm` NULL or a handle from `rl_init`/`rl_init_env`.
#[no_mangle]
pub unsafe extern "C" fn rl_destroy(comm: *mut RlComm) -> c_int {
    guard(|| {
        if comm.is_null() {
            return RL_OK;
        }
        let Some(c) = registry_write().remove(&(comm as usize)) else {
            return invalid("comm", format!("{comm:p} is not a live communicator (destroyed already?)"));
        };
        // Calls on other threads hold their own reference: the memory
        // outlives them, whatever `close` waited for.
        code_of(c.close())
    })
}

/// The library version (`"0.1.0"`). Static.
#[no_mangle]
pub extern "C" fn rl_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::rl_last_error_message;
    use std::ffi::CStr;

    fn last_message() -> String {
        // SAFETY: valid until the next failure on this thread.
        unsafe { CStr::from_ptr(rl_last_error_message()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn null_handles_and_pointers_are_refused() {
        let mut x = [0f32; 4];
        // SAFETY: NULL communicator; the buffer is valid.
        let code = unsafe { rl_all_reduce(std::ptr::null(), x.as_mut_ptr().cast(), 4, 0, 0, std::ptr::null_mut()) };
        assert_eq!(code, 17);
        assert!(last_message().contains("comm"), "{}", last_message());
        // SAFETY: NULL out pointer is checked.
        assert_eq!(unsafe { rl_init_env(std::ptr::null_mut()) }, 17);
        // SAFETY: NULL work handle is checked.
        assert_eq!(unsafe { rl_work_wait(std::ptr::null(), -1.0) }, 17);
        // SAFETY: NULL is ignored.
        unsafe { rl_work_free(std::ptr::null_mut()) };
        // SAFETY: NULL is ignored.
        assert_eq!(unsafe { rl_destroy(std::ptr::null_mut()) }, 0);
        // SAFETY: a bad dtype is refused before anything is read.
        let code = unsafe { rl_all_reduce(std::ptr::null(), std::ptr::null_mut(), 0, 0, 9, std::ptr::null_mut()) };
        assert_eq!(code, 17);
    }

    #[test]
    fn size_overflow_is_refused() {
        let b = Buf::new("buf", 8 as *const c_void, usize::MAX / 2);
        assert!(b.check(DType::F64).is_err());
        assert!(last_message().contains("buf"));
        assert!(Buf::new("buf", std::ptr::null(), 3).check(DType::F32).is_err());
        assert!(Buf::new("buf", std::ptr::null(), 0).check(DType::F32).is_ok());
    }

    /// Joins a 2-rank job at `store` as `rank`; returns the handle.
    fn join(rank: i64, store: &str, run: &str) -> usize {
        let (store, run) = (CString::new(store).unwrap(), CString::new(run).unwrap());
        let cfg = RlConfig {
            rank,
            world_size: 2,
            store_addr: store.as_ptr(),
            run_id: run.as_ptr(),
            timeout_s: 20.0,
            init_timeout_s: 20.0,
            ..RlConfig::default()
        };
        let mut out = std::ptr::null_mut();
        // SAFETY: the config's strings live until the call returns; `out` is writable.
        let code = unsafe { rl_init(&cfg, &mut out) };
        assert_eq!(code, 0, "{}", last_message());
        out as usize
    }

    /// rl_destroy while another thread is inside rl_all_reduce: the call is
    /// aborted and waited for, nothing is freed under it (run this under
    /// AddressSanitizer to check: see the README's testing section), and
    /// the handle is refused afterwards.
    #[test]
    fn destroy_waits_for_a_call_on_another_thread() {
        let run = format!("ffi-destroy-race-{}", std::process::id());
        let server =
            ringleader_store::StoreServer::bind("127.0.0.1:0", ringleader_store::ServerOptions::new(run.clone()))
                .unwrap();
        let addr = server.local_addr().to_string();
        let (a, r) = (addr.clone(), run.clone());
        let other = std::thread::spawn(move || join(0, &a, &r));
        let h1 = join(1, &addr, &run);
        let h0 = other.join().unwrap();
        // Rank 1 enters an all_reduce that rank 0 never joins.
        let caller = std::thread::spawn(move || {
            let mut buf = vec![1.0f32; 4096];
            // SAFETY: the buffer outlives the call; dtype 0 is f32.
            let code = unsafe {
                rl_all_reduce(h1 as *const RlComm, buf.as_mut_ptr().cast(), buf.len(), 0, 0, std::ptr::null_mut())
            };
            (code, last_message())
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let mut json = std::ptr::null_mut();
            // SAFETY: live handle, writable out pointer; the string is freed below.
            assert_eq!(unsafe { rl_comm_flight_recorder_json(h1 as *const RlComm, &mut json) }, 0);
            // SAFETY: a string from ringleader, freed once read.
            let text = unsafe { CStr::from_ptr(json) }.to_string_lossy().into_owned();
            // SAFETY: as above.
            unsafe { rl_string_free(json) };
            if text.contains("\"state\":\"started\"") {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the all_reduce never started: {text}");
            std::thread::yield_now();
        }
        let t = std::time::Instant::now();
        // SAFETY: a live handle; the other thread's call is what is tested.
        assert_eq!(unsafe { rl_destroy(h1 as *mut RlComm) }, 0, "{}", last_message());
        assert!(t.elapsed() < Duration::from_secs(10), "destroy took {:?}", t.elapsed());
        assert!(caller.is_finished(), "rl_destroy returned while the call still ran");
        let (code, msg) = caller.join().unwrap();
        assert_eq!(code, 16, "{msg}");
        assert!(msg.contains("destroyed while an operation ran"), "{msg}");
        // The handle is dead now: refused, never dereferenced.
        let mut x = [0f32; 4];
        // SAFETY: a dead handle is refused before anything is read.
        let code = unsafe { rl_all_reduce(h1 as *const RlComm, x.as_mut_ptr().cast(), 4, 0, 0, std::ptr::null_mut()) };
        assert_eq!(code, 17);
        assert!(last_message().contains("not a live communicator"), "{}", last_message());
        // SAFETY: as above.
        assert_eq!(unsafe { rl_comm_rank(h1 as *const RlComm) }, -1);
        // SAFETY: as above.
        assert_eq!(unsafe { rl_destroy(h1 as *mut RlComm) }, 17);
        // SAFETY: a live handle.
        assert_eq!(unsafe { rl_destroy(h0 as *mut RlComm) }, 0);
        server.shutdown();
    }

    #[test]
    fn version_is_the_crate_version() {
        // SAFETY: static NUL-terminated string.
        let v = unsafe { CStr::from_ptr(rl_version()) };
        assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }
}
