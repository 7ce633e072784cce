//! Running a collective on device buffers: staging through pinned host
//! memory per [`schedule`](super::schedule), ordered after the caller's
//! stream, with reductions on the host (in the transport) or on the GPU.
//!
//! Per CUDA context this keeps two nonblocking streams (copies to the host,
//! copies back and kernels), events, two pinned staging buffers, device
//! scratch for GPU reductions and the compiled kernels; they live as long
//! as the process. Calls on one context are serialized.

// Device memory is reached through raw CUDA driver calls and pointers the
// caller lends: each `unsafe` block here states why its pointers are valid.
#![allow(unsafe_code)]

use super::errors::{cuda_error, missing_library};
use super::kernels::{kernel_source, launch_dims};
use super::schedule::{chunks, pipeline, reduce_site, staging_bytes, ReduceSite, Step, CHUNK_BYTES};
use crate::call::{Call, RawOp};
use crate::comm::Communicator;
use cudarc::driver::{result, sys};
use parking_lot::Mutex;
use ringleader_core::{DType, Error, OpKind, Result};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// A collective on device buffers, for language bindings (the C ABI, the
/// PyTorch backend): CUDA device pointers of one context and the stream
/// whose queued work the collective follows and whose later work waits for
/// it. Counts and in-place rules are those of [`Call`].
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct DeviceCall {
    /// What to do (send, recv and the barriers are refused).
    pub op: RawOp,
    /// Element type of both buffers.
    pub dtype: DType,
    /// Input device pointer (`CUdeviceptr`), 0 for in-place operations.
    pub input: u64,
    /// Elements in `input`.
    pub input_count: usize,
    /// Output (or in-place) device pointer.
    pub output: u64,
    /// Elements in `output`.
    pub output_count: usize,
    /// The caller's stream (`CUstream`; null: the legacy default stream).
    pub stream: *mut c_void,
}

fn code(e: result::DriverError) -> u32 {
    e.0 as u32
}

/// Loads the driver library and initializes it, once; the error says what
/// is missing.
pub fn driver() -> Result<()> {
    static INIT: OnceLock<std::result::Result<(), u32>> = OnceLock::new();
    // SAFETY: only tries to load the library (dlopen); nothing is called.
    if !unsafe { sys::is_culib_present() } {
        return Err(missing_library("libcuda.so.1 (the NVIDIA driver)", "a collective on device buffers"));
    }
    match INIT.get_or_init(|| result::init().map_err(code)) {
        Ok(()) => Ok(()),
        Err(c) => Err(cuda_error("cuInit", *c, "initialization")),
    }
}

/// Whether NVRTC (GPU reductions) can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to load the library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Pinned host memory.
struct Pinned {
    ptr: *mut u8,
    len: usize,
}

/// What one context keeps between calls.
struct CtxState {
    ctx: sys::CUcontext,
    copy_in: sys::CUstream,
    copy_out: sys::CUstream,
    ev_start: sys::CUevent,
    ev_in: [sys::CUevent; 2],
    ev_out: [sys::CUevent; 2],
    staging: [Pinned; 2],
    scratch: [(sys::CUdeviceptr, usize); 2],
    kernels: HashMap<String, sys::CUfunction>,
}

// SAFETY: CUDA handles may be used from any thread once the context is
// made current there; the state is only used under its mutex.
unsafe impl Send for CtxState {}

type States = Mutex<HashMap<usize, Arc<Mutex<CtxState>>>>;

fn states() -> &'static States {
    static S: OnceLock<States> = OnceLock::new();
    S.get_or_init(Default::default)
}

/// Wraps a CUDA result into the error for `what` during `during`.
fn ck<T>(r: std::result::Result<T, result::DriverError>, what: &str, during: &str) -> Result<T> {
    r.map_err(|e| cuda_error(what, code(e), during))
}

/// The context owning device pointer `ptr`, made current on this thread.
fn context_of(ptr: u64, during: &str) -> Result<sys::CUcontext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out-parameter for the CONTEXT attribute.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ctx as *mut sys::CUcontext).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
            ptr,
        )
    };
    if let Err(e) = r.result() {
        return Err(Error::invalid(
            "device buffer",
            format!("{ptr:#x} is not CUDA device memory ({}) in {during}", super::errors::describe(code(e)).0),
        ));
    }
    // SAFETY: a live context the pointer belongs to.
    ck(unsafe { result::ctx::set_current(ctx) }, "cuCtxSetCurrent", during)?;
    Ok(ctx)
}

fn state_for(ctx: sys::CUcontext, during: &str) -> Result<Arc<Mutex<CtxState>>> {
    let mut all = states().lock();
    if let Some(s) = all.get(&(ctx as usize)) {
        return Ok(s.clone());
    }
    let stream = || ck(result::stream::create(result::stream::StreamKind::NonBlocking), "cuStreamCreate", during);
    let event = || ck(result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING), "cuEventCreate", during);
    let s = CtxState {
        ctx,
        copy_in: stream()?,
        copy_out: stream()?,
        ev_start: event()?,
        ev_in: [event()?, event()?],
        ev_out: [event()?, event()?],
        staging: [Pinned { ptr: std::ptr::null_mut(), len: 0 }, Pinned { ptr: std::ptr::null_mut(), len: 0 }],
        scratch: [(0, 0), (0, 0)],
        kernels: HashMap::new(),
    };
    let s = Arc::new(Mutex::new(s));
    all.insert(ctx as usize, s.clone());
    Ok(s)
}

impl CtxState {
    /// Makes both staging buffers at least `bytes` long.
    fn ensure_staging(&mut self, bytes: usize, during: &str) -> Result<()> {
        if self.staging[0].len >= bytes {
            return Ok(());
        }
        // SAFETY: the copy streams are ours; after this no copy uses the old buffers.
        ck(unsafe { result::stream::synchronize(self.copy_out) }, "cuStreamSynchronize", during)?;
        ck(unsafe { result::stream::synchronize(self.copy_in) }, "cuStreamSynchronize", during)?;
        for p in &mut self.staging {
            if !p.ptr.is_null() {
                // SAFETY: allocated by malloc_host below, no longer in use.
                let _ = unsafe { result::free_host(p.ptr.cast()) };
                p.ptr = std::ptr::null_mut();
                p.len = 0;
            }
            // SAFETY: a plain pinned allocation.
            let ptr = ck(unsafe { result::malloc_host(bytes, 0) }, "cuMemHostAlloc (pinned staging)", during)?;
            *p = Pinned { ptr: ptr.cast(), len: bytes };
        }
        Ok(())
    }

    /// Makes both device scratch buffers at least `bytes` long.
    fn ensure_scratch(&mut self, bytes: usize, during: &str) -> Result<()> {
        if self.scratch[0].1 >= bytes {
            return Ok(());
        }
        // SAFETY: as in ensure_staging.
        ck(unsafe { result::stream::synchronize(self.copy_out) }, "cuStreamSynchronize", during)?;
        for s in &mut self.scratch {
            if s.0 != 0 {
                // SAFETY: allocated below, no longer in use.
                let _ = unsafe { result::free_sync(s.0) };
            }
            // SAFETY: a plain device allocation.
            *s = (ck(unsafe { result::malloc_sync(bytes) }, "cuMemAlloc (reduction scratch)", during)?, bytes);
        }
        Ok(())
    }

    /// The reduction kernel for `dtype`/`op`, compiled on first use.
    fn kernel(&mut self, dtype: DType, op: ringleader_core::ReduceOp, during: &str) -> Result<sys::CUfunction> {
        let (name, src) = kernel_source(dtype, op);
        if let Some(f) = self.kernels.get(&name) {
            return Ok(*f);
        }
        let ptx = cudarc::nvrtc::compile_ptx(&src).map_err(|e| {
            Error::aborted(format!("CUDA error: NVRTC could not compile {name} during {during}: {e:?}"))
        })?;
        let image = CString::new(ptx.to_src()).map_err(|_| Error::aborted("CUDA error: PTX with a NUL byte"))?;
        // SAFETY: a NUL-terminated PTX image; the context is current.
        let module = ck(unsafe { result::module::load_data(image.as_ptr().cast()) }, "cuModuleLoadData", during)?;
        let cname = CString::new(name.clone()).expect("kernel names have no NUL");
        // SAFETY: the module was just loaded and is never unloaded.
        let f = ck(unsafe { result::module::get_function(module, cname) }, "cuModuleGetFunction", during)?;
        self.kernels.insert(name, f);
        Ok(f)
    }
}

/// What a device call does, resolved: the collective, its per-rank count,
/// whether it works in place, and whether this rank is the root.
fn resolve(c: &DeviceCall, world: usize, rank: usize) -> Result<(OpKind, usize, bool, bool)> {
    let (ic, oc) = (c.input_count, c.output_count);
    let bad = |what: &str, d: String| Err(Error::invalid(what, d));
    Ok(match c.op {
        RawOp::AllReduce { .. } => (OpKind::AllReduce, oc, true, true),
        RawOp::Broadcast { root } => (OpKind::Broadcast, oc, true, root == rank),
        RawOp::Reduce { root, .. } => (OpKind::Reduce, oc, true, root == rank),
        RawOp::AllGather if ic.checked_mul(world) == Some(oc) => (OpKind::AllGather, ic, false, true),
        RawOp::ReduceScatter { .. } if oc.checked_mul(world) == Some(ic) => (OpKind::ReduceScatter, oc, false, true),
        RawOp::AllToAll if ic == oc && ic % world == 0 => (OpKind::AllToAll, ic / world, false, true),
        RawOp::AllGather | RawOp::ReduceScatter { .. } | RawOp::AllToAll => {
            return bad(
                "device buffers",
                format!("{:?}: input holds {ic} and output {oc} elements, which do not fit a world of {world}", c.op),
            )
        }
        other => {
            return bad("device buffers", format!("{other:?} is not supported on device buffers; use host buffers"))
        }
    })
}

/// Waits on the host for `ev`, polling, bounded by the communicator's
/// timeout: a stuck device becomes an error, not a hang.
fn wait_event(comm: &Communicator, ev: sys::CUevent, during: &str) -> Result<()> {
    let deadline = Instant::now() + comm.config().timeout;
    let mut polls = 0u32;
    loop {
        // SAFETY: a live event of this context.
        match unsafe { result::event::query(ev) } {
            Ok(()) => return Ok(()),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => {}
            Err(e) => return Err(cuda_error("cuEventQuery", code(e), during)),
        }
        if Instant::now() >= deadline {
            return Err(Error::aborted(format!(
                "CUDA error: a staging copy did not complete within {:.0} s during {during} (is the GPU hung?)",
                comm.config().timeout.as_secs_f64()
            )));
        }
        polls += 1;
        if polls < 2000 {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }
}

/// Runs `c` on `comm`. A CUDA failure once the call is under way aborts the
/// communicator (the other ranks stop and hear why) and returns the named
/// error.
pub(crate) fn run(comm: &Communicator, c: DeviceCall) -> Result<()> {
    driver()?;
    let (world, rank) = (comm.world_size(), comm.rank());
    let (op, count, inplace, root_here) = resolve(&c, world, rank)?;
    let during = format!("{op} on device buffers");
    let host = |input: *const u8, ic: usize, output: *mut u8, oc: usize| Call {
        op: c.op,
        dtype: c.dtype,
        input,
        input_count: ic,
        output,
        output_count: oc,
        site: None,
    };
    if count == 0 {
        // Still a numbered collective, so every rank's sequence agrees.
        // SAFETY: no memory is touched for zero elements.
        return unsafe { comm.call_raw(host(std::ptr::null(), 0, std::ptr::null_mut(), 0)) };
    }
    let first = if inplace { c.output } else { c.input };
    let ctx = context_of(first, &during)?;
    let r = staged(comm, &c, op, count, inplace, root_here, ctx, &during);
    if let Err(e) = &r {
        if e.to_string().starts_with("[aborted] CUDA error") {
            comm.abort(&e.to_string());
        }
    }
    r
}

#[allow(clippy::too_many_arguments)]
fn staged(
    comm: &Communicator,
    c: &DeviceCall,
    op: OpKind,
    count: usize,
    inplace: bool,
    root_here: bool,
    ctx: sys::CUcontext,
    during: &str,
) -> Result<()> {
    let world = comm.world_size();
    let esz = c.dtype.size();
    let half = matches!(c.dtype, DType::F16 | DType::BF16);
    let site = match c.op {
        // Every rank must pick the same site (the chunks' collectives
        // differ): where the size alone would pick the GPU, the ranks agree
        // on whether all of them can load NVRTC.
        RawOp::AllReduce { .. } if reduce_site(count * esz, world, half, true) == ReduceSite::Device => {
            let mut all = [i32::from(nvrtc_present())];
            comm.all_reduce(&mut all, ringleader_core::ReduceOp::Min)?;
            reduce_site(count * esz, world, half, all[0] == 1)
        }
        _ => ReduceSite::Host,
    };
    // GPU reductions gather the chunks, copy them to scratch and reduce there.
    let layout = if site == ReduceSite::Device { OpKind::AllGather } else { op };
    let chunk_elems = (CHUNK_BYTES / esz).clamp(1, count);
    let plan = chunks(layout, count, esz, world, chunk_elems, root_here);
    let state = state_for(ctx, during)?;
    let mut st = state.lock();
    st.ensure_staging(staging_bytes(layout, esz, world, chunk_elems), during)?;
    let kernel = match (site, c.op) {
        (ReduceSite::Device, RawOp::AllReduce { op: rop }) => {
            st.ensure_scratch(world * chunk_elems * esz, during)?;
            Some(st.kernel(c.dtype, rop, during)?)
        }
        _ => None,
    };
    let (src, dst) = if inplace { (c.output, c.output) } else { (c.input, c.output) };
    let user = c.stream as sys::CUstream;
    // The copies start after the work the caller queued so far.
    // SAFETY: live events and streams; `user` is the caller's stream.
    unsafe {
        ck(result::event::record(st.ev_start, user), "cuEventRecord (caller's stream)", during)?;
        ck(
            result::stream::wait_event(st.copy_in, st.ev_start, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT),
            "cuStreamWaitEvent",
            during,
        )?;
    }
    let mut out_recorded = [false; 2];
    let mut last_out = 0;
    for step in pipeline(plan.len(), 2) {
        match step {
            Step::CopyIn { k, buf } => {
                let stage = st.staging[buf].ptr;
                // SAFETY: the staging buffer holds `staging_bytes` bytes and
                // every piece lies inside it (schedule tests); the device
                // ranges lie inside the caller's buffers (counts checked);
                // the buffer's previous copy-out is ordered before this.
                unsafe {
                    if out_recorded[buf] {
                        ck(
                            result::stream::wait_event(
                                st.copy_in,
                                st.ev_out[buf],
                                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                            ),
                            "cuStreamWaitEvent",
                            during,
                        )?;
                    }
                    for p in &plan[k].copy_in {
                        let dst_host = std::slice::from_raw_parts_mut(stage.add(p.host), p.len);
                        ck(
                            result::memcpy_dtoh_async(dst_host, src + p.dev as u64, st.copy_in),
                            "cuMemcpyDtoHAsync",
                            during,
                        )?;
                    }
                    ck(result::event::record(st.ev_in[buf], st.copy_in), "cuEventRecord", during)?;
                }
            }
            Step::WaitIn { buf, .. } => wait_event(comm, st.ev_in[buf], during)?,
            Step::Collective { k, buf } => {
                let ch = &plan[k];
                let stage = st.staging[buf].ptr;
                // SAFETY: in-bounds of the staging buffer (see CopyIn).
                let out = unsafe { stage.add(ch.out_at) };
                let call = match (layout, c.op) {
                    (OpKind::AllGather, RawOp::AllReduce { .. }) => {
                        Call { op: RawOp::AllGather, ..host_call(c, stage, ch.elems, out, world * ch.elems) }
                    }
                    (OpKind::AllGather, _) => host_call(c, stage, ch.elems, out, world * ch.elems),
                    (OpKind::ReduceScatter, _) => host_call(c, stage, world * ch.elems, out, ch.elems),
                    (OpKind::AllToAll, _) => host_call(c, stage, world * ch.elems, out, world * ch.elems),
                    _ => host_call(c, std::ptr::null(), 0, stage, ch.elems),
                };
                // SAFETY: both ranges lie in the pinned staging buffer, which
                // nothing else touches until the copy-out is issued below.
                unsafe { comm.call_raw(call)? };
            }
            Step::CopyOut { k, buf } => {
                let ch = &plan[k];
                let stage = st.staging[buf].ptr;
                // SAFETY: as for CopyIn, in the other direction; the kernel
                // reads `world x elems` elements of scratch and writes
                // `elems` elements of the caller's buffer at the chunk.
                unsafe {
                    if let Some(f) = kernel {
                        let b = ch.elems * esz;
                        let gathered = std::slice::from_raw_parts(stage.add(ch.out_at), world * b);
                        let scratch = st.scratch[buf].0;
                        ck(result::memcpy_htod_async(scratch, gathered, st.copy_out), "cuMemcpyHtoDAsync", during)?;
                        let mut out_ptr = dst + ch.copy_in[0].dev as u64;
                        let mut in_ptr = scratch;
                        let mut n_elems = ch.elems as u64;
                        let mut n_ranks = world as i32;
                        let mut params: [*mut c_void; 4] = [
                            (&mut out_ptr as *mut u64).cast(),
                            (&mut in_ptr as *mut u64).cast(),
                            (&mut n_elems as *mut u64).cast(),
                            (&mut n_ranks as *mut i32).cast(),
                        ];
                        let (grid, block) = launch_dims(ch.elems);
                        ck(
                            result::launch_kernel(f, (grid, 1, 1), (block, 1, 1), 0, st.copy_out, &mut params),
                            "cuLaunchKernel",
                            during,
                        )?;
                    } else {
                        for p in &ch.copy_out {
                            let from = std::slice::from_raw_parts(stage.add(p.host), p.len);
                            ck(
                                result::memcpy_htod_async(dst + p.dev as u64, from, st.copy_out),
                                "cuMemcpyHtoDAsync",
                                during,
                            )?;
                        }
                    }
                    ck(result::event::record(st.ev_out[buf], st.copy_out), "cuEventRecord", during)?;
                }
                out_recorded[buf] = true;
                last_out = buf;
            }
        }
    }
    // Later work on the caller's stream waits for the last copy back (the
    // copy-out stream runs them in order).
    // SAFETY: live handles.
    unsafe {
        ck(
            result::stream::wait_event(user, st.ev_out[last_out], sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT),
            "cuStreamWaitEvent (caller's stream)",
            during,
        )?;
    }
    let _ = st.ctx;
    Ok(())
}

fn host_call(c: &DeviceCall, input: *const u8, ic: usize, output: *mut u8, oc: usize) -> Call {
    Call { op: c.op, dtype: c.dtype, input, input_count: ic, output, output_count: oc, site: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringleader_core::{ErrorKind, ReduceOp};

    fn call(op: RawOp, ic: usize, oc: usize) -> DeviceCall {
        DeviceCall {
            op,
            dtype: DType::F32,
            input: 0,
            input_count: ic,
            output: 0,
            output_count: oc,
            stream: std::ptr::null_mut(),
        }
    }

    #[test]
    fn calls_resolve_to_chunkable_collectives_or_are_refused() {
        assert_eq!(resolve(&call(RawOp::AllGather, 3, 12), 4, 0).unwrap(), (OpKind::AllGather, 3, false, true));
        assert_eq!(resolve(&call(RawOp::ReduceScatter { op: ReduceOp::Sum }, 12, 3), 4, 0).unwrap().1, 3);
        assert_eq!(resolve(&call(RawOp::AllToAll, 12, 12), 4, 0).unwrap().1, 3);
        assert_eq!(
            resolve(&call(RawOp::Reduce { root: 2, op: ReduceOp::Max }, 0, 5), 4, 2).unwrap(),
            (OpKind::Reduce, 5, true, true)
        );
        assert!(!resolve(&call(RawOp::Broadcast { root: 1 }, 0, 5), 4, 2).unwrap().3);
        for bad in [call(RawOp::AllGather, 3, 11), call(RawOp::Send { peer: 1 }, 3, 0), call(RawOp::Barrier, 0, 0)] {
            assert_eq!(resolve(&bad, 4, 0).unwrap_err().kind(), ErrorKind::InvalidArgument);
        }
    }

    #[test]
    fn without_a_driver_a_device_call_is_a_clear_invalid_argument() {
        // SAFETY: only probes for the library.
        if unsafe { sys::is_culib_present() } {
            eprintln!("skipped: this machine has a CUDA driver");
            return;
        }
        let e = driver().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let s = e.to_string();
        assert!(s.contains("libcuda.so.1") && s.contains("NVIDIA driver") && s.contains("LD_LIBRARY_PATH"), "{s}");
    }
}
