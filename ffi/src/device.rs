//! Collectives on CUDA device buffers: `rl_*_device`.
//!
//! The collectives of [`crate::comm`] on device pointers (`CUdeviceptr`
//! values passed as `void *`) of one CUDA context, ordered on the caller's
//! stream (`CUstream`; NULL is the legacy default stream): a collective
//! starts after the work already queued on that stream, and work queued on
//! it after the call waits for the results (through events, on the GPU).
//! The call returns once every chunk has gone through the transport, so
//! there is no work handle. The flight recorder, the consistency checks and
//! the verdicts are those of host buffers.
//!
//! Why a separate set of functions rather than a flag on the host ones: a
//! device pointer must never reach host code, and a C caller holding a
//! `CUdeviceptr` should not be able to pass it where a host pointer goes
//! by forgetting one argument.
//!
//! A library built without the `cuda` feature, or run on a machine without
//! the NVIDIA driver, answers `invalid-argument` naming what is missing;
//! `rl_cuda_check` asks that question up front.

use crate::comm::{comm_ref, rank_arg, Buf, RlComm};
use crate::error::guard;
use crate::types::{dtype, reduce_op};
use ringleader_core::DType;
use rl::{Communicator, RawOp};
use std::ffi::{c_int, c_void};

/// Checks and runs one device call.
///
/// # Safety
/// `comm` NULL or live; the buffers device memory valid for their counts
/// (see the public functions); `stream` NULL or a stream of their context.
unsafe fn submit_device(
    comm: *const RlComm,
    op: RawOp,
    dtype_code: c_int,
    input: Buf,
    output: Buf,
    stream: *mut c_void,
) -> c_int {
    let c = tri!(comm_ref(comm));
    let dt = tri!(dtype(dtype_code));
    tri!(input.check(dt));
    tri!(output.check(dt));
    // SAFETY: forwarded caller guarantees.
    unsafe { run(&c, op, dt, input, output, stream) }
}

/// # Safety
/// As [`submit_device`].
#[cfg(feature = "cuda")]
unsafe fn run(c: &Communicator, op: RawOp, dt: DType, input: Buf, output: Buf, stream: *mut c_void) -> c_int {
    let call = rl::cuda::DeviceCall {
        op,
        dtype: dt,
        input: input.ptr as u64,
        input_count: input.count,
        output: output.ptr as u64,
        output_count: output.count,
        stream,
    };
    // SAFETY: the caller guarantees the device pointers, counts and stream;
    // the facade checks counts against the operation and that the pointers
    // are device memory of one context.
    crate::error::code_of(unsafe { c.call_device_raw(call) })
}

/// # Safety
/// Nothing is touched.
#[cfg(not(feature = "cuda"))]
unsafe fn run(c: &Communicator, op: RawOp, _dt: DType, _i: Buf, _o: Buf, _s: *mut c_void) -> c_int {
    let _ = (c, op);
    not_built()
}

#[cfg(not(feature = "cuda"))]
fn not_built() -> c_int {
    crate::error::invalid(
        "device buffers",
        "this libringleader was built without the `cuda` feature \
         (rebuild with `cargo build --release -p ringleader-ffi --features cuda`)",
    )
}

/// Whether collectives on device buffers can run here: 0 when the library
/// was built with the `cuda` feature and the NVIDIA driver loads and
/// initializes; otherwise an error code, with the last error naming what is
/// missing (the feature, `libcuda.so.1`, or the driver's own error).
///
/// ```c
/// if (rl_cuda_check() != RL_OK) fprintf(stderr, "%s\n", rl_last_error_message());
/// ```
#[no_mangle]
pub extern "C" fn rl_cuda_check() -> c_int {
    guard(cuda_check)
}

#[cfg(feature = "cuda")]
fn cuda_check() -> c_int {
    match rl::cuda::driver() {
        Ok(()) => crate::error::RL_OK,
        Err(e) => crate::error::fail(&e),
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_check() -> c_int {
    not_built()
}

/// [`rl_all_reduce`](crate::comm::rl_all_reduce) on device memory: reduces
/// `buf` (`count` elements of `dtype`) across ranks in place, ordered on
/// `stream`.
///
/// # Safety
/// `comm` NULL or live; `buf` device memory valid for `count` elements,
/// not written by anything else until work queued on `stream` after the
/// call runs; `stream` NULL or a stream of `buf`'s context.
#[no_mangle]
pub unsafe extern "C" fn rl_all_reduce_device(
    comm: *const RlComm,
    buf: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    stream: *mut c_void,
) -> c_int {
    guard(|| {
        let op = tri!(reduce_op(op));
        let out = Buf::new("buf", buf, count);
        // SAFETY: forwarded caller guarantees.
        unsafe { submit_device(comm, RawOp::AllReduce { op }, dtype, Buf::none(), out, stream) }
    })
}

/// [`rl_all_gather`](crate::comm::rl_all_gather) on device memory.
///
/// # Safety
/// As `rl_all_reduce_device`; `input` valid for `in_count` elements,
/// `output` for `out_count`, in one context, not overlapping.
#[no_mangle]
pub unsafe extern "C" fn rl_all_gather_device(
    comm: *const RlComm,
    input: *const c_void,
    in_count: usize,
    output: *mut c_void,
    out_count: usize,
    dtype: c_int,
    stream: *mut c_void,
) -> c_int {
    guard(|| {
        let (i, o) = (Buf::new("input", input, in_count), Buf::new("output", output, out_count));
        // SAFETY: forwarded caller guarantees.
        unsafe { submit_device(comm, RawOp::AllGather, dtype, i, o, stream) }
    })
}

/// [`rl_reduce_scatter`](crate::comm::rl_reduce_scatter) on device memory.
///
/// # Safety
/// As `rl_all_gather_device`.
#[no_mangle]
pub unsafe extern "C" fn rl_reduce_scatter_device(
    comm: *const RlComm,
    input: *const c_void,
    in_count: usize,
    output: *mut c_void,
    out_count: usize,
    dtype: c_int,
    op: c_int,
    stream: *mut c_void,
) -> c_int {
    guard(|| {
        let op = tri!(reduce_op(op));
        let (i, o) = (Buf::new("input", input, in_count), Buf::new("output", output, out_count));
        // SAFETY: forwarded caller guarantees.
        unsafe { submit_device(comm, RawOp::ReduceScatter { op }, dtype, i, o, stream) }
    })
}

/// [`rl_broadcast`](crate::comm::rl_broadcast) on device memory.
///
/// # Safety
/// As `rl_all_reduce_device`.
#[no_mangle]
pub unsafe extern "C" fn rl_broadcast_device(
    comm: *const RlComm,
    buf: *mut c_void,
    count: usize,
    dtype: c_int,
    root: i64,
    stream: *mut c_void,
) -> c_int {
    guard(|| {
        let root = tri!(rank_arg("root", root));
        let out = Buf::new("buf", buf, count);
        // SAFETY: forwarded caller guarantees.
        unsafe { submit_device(comm, RawOp::Broadcast { root }, dtype, Buf::none(), out, stream) }
    })
}

/// [`rl_reduce`](crate::comm::rl_reduce) on device memory.
///
/// # Safety
/// As `rl_all_reduce_device`.
#[no_mangle]
pub unsafe extern "C" fn rl_reduce_device(
    comm: *const RlComm,
    buf: *mut c_void,
    count: usize,
    dtype: c_int,
    root: i64,
    op: c_int,
    stream: *mut c_void,
) -> c_int {
    guard(|| {
        let root = tri!(rank_arg("root", root));
        let op = tri!(reduce_op(op));
        let out = Buf::new("buf", buf, count);
        // SAFETY: forwarded caller guarantees.
        unsafe { submit_device(comm, RawOp::Reduce { root, op }, dtype, Buf::none(), out, stream) }
    })
}

/// [`rl_all_to_all`](crate::comm::rl_all_to_all) on device memory.
///
/// # Safety
/// As `rl_all_gather_device`.
#[no_mangle]
pub unsafe extern "C" fn rl_all_to_all_device(
    comm: *const RlComm,
    input: *const c_void,
    in_count: usize,
    output: *mut c_void,
    out_count: usize,
    dtype: c_int,
    stream: *mut c_void,
) -> c_int {
    guard(|| {
        let (i, o) = (Buf::new("input", input, in_count), Buf::new("output", output, out_count));
        // SAFETY: forwarded caller guarantees.
        unsafe { submit_device(comm, RawOp::AllToAll, dtype, i, o, stream) }
    })
}
