//! CUDA device buffers (feature `cuda`).
//!
//! Collectives take cudarc device slices (Rust) or device pointers and a
//! stream ([`DeviceCall`], for the C ABI). The data is staged through pinned
//! host memory in double-buffered chunks ([`schedule`]): while chunk k is on
//! the wire, chunk k+1 is copied to the host and chunk k-1 back to the
//! device. Each chunk is an ordinary collective of the communicator, so the
//! flight recorder, the fingerprint checks and the verdicts are the ones of
//! host buffers. An all_reduce reduces on the GPU (a kernel generated per
//! type and op, [`kernels`], compiled at run time by NVRTC) or on the host,
//! whichever [`schedule::reduce_site`] picks for its size.
//!
//! Ordering follows the caller's stream: the copies wait (on the GPU) for
//! the work queued on it before the call, and work queued on it after the
//! call waits for the last copy back, through events; the call itself
//! returns once every chunk went through the transport.
//!
//! The CUDA libraries are loaded at run time (cudarc's `dynamic-loading`),
//! so this builds and the rest of ringleader runs without a CUDA install;
//! a device call on a machine without a driver is an `invalid-argument`
//! error naming the missing library ([`errors`]). A CUDA failure during a
//! call aborts the communicator with that error, so no rank hangs on it.

mod device;
pub mod errors;
pub mod kernels;
pub mod schedule;

pub use device::{driver, nvrtc_present, DeviceCall};

use crate::call::RawOp;
use crate::comm::Communicator;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};
use ringleader_core::{Element, Rank, ReduceOp, Result};

impl Communicator {
    /// Runs a collective on device buffers, for language bindings. In-place
    /// operations work on `output`; the others read `input` and write
    /// `output`.
    ///
    /// # Safety
    /// The pointers must be device memory of one context, valid for
    /// `input_count` / `output_count` elements of `dtype`, not overlapping,
    /// and `stream` a stream of that context (or null). Nothing may write
    /// the buffers until work queued on `stream` after the call runs.
    #[doc(hidden)]
    #[allow(unsafe_code)]
    pub unsafe fn call_device_raw(&self, call: DeviceCall) -> Result<()> {
        device::run(self, call)
    }

    fn device_call<T: Element>(
        &self,
        op: RawOp,
        input: (u64, usize),
        output: (u64, usize),
        stream: &CudaStream,
    ) -> Result<()> {
        let call = DeviceCall {
            op,
            dtype: T::DTYPE,
            input: input.0,
            input_count: input.1,
            output: output.0,
            output_count: output.1,
            stream: stream.cu_stream().cast(),
        };
        // SAFETY: the slices' pointers and lengths come from cudarc, which
        // keeps them alive and (through the borrows) unaliased for the call.
        #[allow(unsafe_code)]
        unsafe {
            self.call_device_raw(call)
        }
    }

    /// [`Communicator::all_reduce`] on a device buffer, ordered on `stream`.
    pub fn all_reduce_device<T: Element + DeviceRepr>(
        &self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<()> {
        let n = buf.len();
        let (p, _sync) = buf.device_ptr_mut(stream);
        self.device_call::<T>(RawOp::AllReduce { op }, (0, 0), (p, n), stream)
    }

    /// [`Communicator::all_gather`] on device buffers.
    pub fn all_gather_device<T: Element + DeviceRepr>(
        &self,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<()> {
        let (ni, no) = (input.len(), output.len());
        let (i, _si) = input.device_ptr(stream);
        let (o, _so) = output.device_ptr_mut(stream);
        self.device_call::<T>(RawOp::AllGather, (i, ni), (o, no), stream)
    }

    /// [`Communicator::reduce_scatter`] on device buffers.
    pub fn reduce_scatter_device<T: Element + DeviceRepr>(
        &self,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<()> {
        let (ni, no) = (input.len(), output.len());
        let (i, _si) = input.device_ptr(stream);
        let (o, _so) = output.device_ptr_mut(stream);
        self.device_call::<T>(RawOp::ReduceScatter { op }, (i, ni), (o, no), stream)
    }

    /// [`Communicator::broadcast`] on a device buffer.
    pub fn broadcast_device<T: Element + DeviceRepr>(
        &self,
        buf: &mut CudaSlice<T>,
        root: Rank,
        stream: &CudaStream,
    ) -> Result<()> {
        let n = buf.len();
        let (p, _sync) = buf.device_ptr_mut(stream);
        self.device_call::<T>(RawOp::Broadcast { root }, (0, 0), (p, n), stream)
    }

    /// [`Communicator::reduce`] on a device buffer.
    pub fn reduce_device<T: Element + DeviceRepr>(
        &self,
        buf: &mut CudaSlice<T>,
        root: Rank,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<()> {
        let n = buf.len();
        let (p, _sync) = buf.device_ptr_mut(stream);
        self.device_call::<T>(RawOp::Reduce { root, op }, (0, 0), (p, n), stream)
    }

    /// [`Communicator::all_to_all`] on device buffers.
    pub fn all_to_all_device<T: Element + DeviceRepr>(
        &self,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<()> {
        let (ni, no) = (input.len(), output.len());
        let (i, _si) = input.device_ptr(stream);
        let (o, _so) = output.device_ptr_mut(stream);
        self.device_call::<T>(RawOp::AllToAll, (i, ni), (o, no), stream)
    }
}
