//! `ringleader perf --device cuda`: the benchmark loop on device buffers
//! (feature `cuda`), and NCCL on the same sizes in the same run.
//!
//! Rank r uses GPU `LOCAL_RANK % (visible GPUs)`. Per size: zeroed device
//! buffers, warm-up, the adaptive iteration count agreed through an
//! all_reduce(max), barrier, timed iterations of `-m` calls (with `-z 1` a
//! stream synchronization after each call, with `-z 0` one after the
//! loop), the time combined over the ranks as `-a` says, then (unless
//! `-c 0`) checked calls on the [`Pattern`] copied in and out. Only the
//! form ringleader's API has is measured (in place for all_reduce,
//! broadcast and reduce, out of place for the others); the table prints
//! N/A for the other column group. NCCL (cudarc's bindings, `libnccl.so` loaded at run time) then
//! runs the same sizes, when every rank has a GPU of its own; with fewer
//! GPUs than ranks, or without the library, a line says why it is skipped.

use super::bench::{across_ranks, adaptive_iters};
use super::check::{Pattern, Sample, POISON};
use super::report::{Row, Setup};
use super::sizes::Shape;
use super::spec::{native, Measured, Spec, Variant};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use cudarc::nccl::safe::{Comm as Nccl, Id, NcclType, ReduceOp as NcclOp};
use half::{bf16, f16};
use ringleader::{Communicator, DType, Element, OpKind, ReduceOp};
use std::sync::Arc;
use std::time::Instant;

/// Elements the device benchmark handles.
pub(crate) trait DevSample: Sample + DeviceRepr + ValidAsZeroBits + NcclType {}
impl<T: Sample + DeviceRepr + ValidAsZeroBits + NcclType> DevSample for T {}

type R<T> = std::result::Result<T, String>;

/// The GPU and stream of this rank.
pub(crate) struct Gpu {
    stream: Arc<CudaStream>,
    /// GPUs visible to this process.
    pub(crate) count: usize,
    /// This rank's GPU.
    pub(crate) ordinal: usize,
}

/// Opens this rank's GPU (`LOCAL_RANK % count`); the error says what is missing.
pub(crate) fn open_gpu() -> R<Gpu> {
    ringleader::cuda::driver().map_err(|e| e.to_string())?;
    let count = CudaContext::device_count().map_err(|e| format!("cuDeviceGetCount: {e:?}"))? as usize;
    if count == 0 {
        return Err("no CUDA device is visible (CUDA_VISIBLE_DEVICES?)".into());
    }
    let local: usize = std::env::var("LOCAL_RANK").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let ordinal = local % count;
    let ctx = CudaContext::new(ordinal).map_err(|e| format!("opening GPU {ordinal}: {e:?}"))?;
    let stream = ctx.new_stream().map_err(|e| format!("creating a stream on GPU {ordinal}: {e:?}"))?;
    Ok(Gpu { stream, count, ordinal })
}

fn cu<T>(r: std::result::Result<T, cudarc::driver::DriverError>, what: &str) -> R<T> {
    r.map_err(|e| format!("{what}: {e:?}"))
}

/// Which library a measurement runs on.
#[derive(Clone, Copy)]
enum Lib<'a> {
    Ringleader,
    Nccl(&'a Nccl),
}

/// One call of the benchmarked collective on device buffers.
fn call<T: DevSample + Element>(
    lib: Lib<'_>,
    comm: &Communicator,
    spec: &Spec,
    gpu: &Gpu,
    input: &mut CudaSlice<T>,
    output: &mut CudaSlice<T>,
) -> R<()> {
    let s = &gpu.stream;
    match lib {
        Lib::Ringleader => match spec.op {
            OpKind::AllReduce => comm.all_reduce_device(input, spec.redop, s),
            OpKind::AllGather => comm.all_gather_device(input, output, s),
            OpKind::ReduceScatter => comm.reduce_scatter_device(input, output, spec.redop, s),
            OpKind::Broadcast => comm.broadcast_device(input, spec.root, s),
            OpKind::Reduce => comm.reduce_device(input, spec.root, spec.redop, s),
            OpKind::AllToAll => comm.all_to_all_device(input, output, s),
            other => return Err(format!("{other} is not benchmarked")),
        }
        .map_err(|e| e.to_string()),
        Lib::Nccl(n) => {
            let op = match spec.redop {
                ReduceOp::Sum => NcclOp::Sum,
                ReduceOp::Prod => NcclOp::Prod,
                ReduceOp::Min => NcclOp::Min,
                ReduceOp::Max => NcclOp::Max,
                ReduceOp::Avg => NcclOp::Avg,
            };
            let root = spec.root as i32;
            let r = match spec.op {
                // In place, as ringleader's: the send buffer is the receive buffer.
                OpKind::AllReduce => {
                    let src = input.clone();
                    n.all_reduce(&src, input, &op)
                }
                OpKind::AllGather => n.all_gather(input, output),
                OpKind::ReduceScatter => n.reduce_scatter(input, output, &op),
                OpKind::Broadcast => {
                    let src = input.clone();
                    n.broadcast(Some(&src), input, root)
                }
                OpKind::Reduce => {
                    let src = input.clone();
                    n.reduce(&src, Some(input), &op, root)
                }
                other => return Err(format!("NCCL has no {other} here")),
            };
            r.map(|_| ()).map_err(|e| format!("NCCL: {e:?}"))
        }
    }
}

fn max_over_ranks(comm: &Communicator, v: f64) -> R<f64> {
    let mut b = [v];
    comm.all_reduce(&mut b, ReduceOp::Max).map_err(|e| e.to_string())?;
    Ok(b[0])
}

/// Elements of the input and output buffers of `op`'s native form (the
/// output is unused by the in-place collectives).
fn lens(op: OpKind, shape: &Shape) -> (usize, usize) {
    match op {
        OpKind::AllGather => (shape.chunk, shape.total),
        OpKind::ReduceScatter => (shape.total, shape.chunk),
        OpKind::AllToAll => (shape.total, shape.total),
        _ => (shape.total, 0),
    }
}

/// Measures one size on device buffers; every rank returns the same row.
fn measure<T: DevSample + Element>(
    lib: Lib<'_>,
    comm: &Communicator,
    spec: &Spec,
    gpu: &Gpu,
    shape: &Shape,
    setup: &Setup<'_>,
) -> R<Row> {
    let s = &gpu.stream;
    let (in_len, out_len) = lens(spec.op, shape);
    // In-place collectives leave `output` unused (one element, never read).
    let mut input: CudaSlice<T> = cu(s.alloc_zeros(in_len.max(1)), "cuMemAlloc")?;
    let mut output: CudaSlice<T> = cu(s.alloc_zeros(out_len.max(1)), "cuMemAlloc")?;
    let agg = spec.agg_iters.max(1);
    let iteration = |input: &mut CudaSlice<T>, output: &mut CudaSlice<T>| -> R<()> {
        for _ in 0..agg {
            call(lib, comm, spec, gpu, input, output)?;
            if spec.blocking {
                cu(s.synchronize(), "cuStreamSynchronize")?;
            }
        }
        Ok(())
    };
    let warm = if spec.iters.is_none() { spec.warmup.max(1) } else { spec.warmup };
    let t = Instant::now();
    for _ in 0..warm {
        iteration(&mut input, &mut output)?;
    }
    cu(s.synchronize(), "cuStreamSynchronize")?;
    let iters = match spec.iters {
        Some(i) => i,
        None => adaptive_iters(max_over_ranks(comm, t.elapsed().as_secs_f64() / warm as f64)?),
    };
    comm.barrier().map_err(|e| e.to_string())?;
    let t = Instant::now();
    for _ in 0..iters {
        iteration(&mut input, &mut output)?;
    }
    cu(s.synchronize(), "cuStreamSynchronize")?;
    let time_s = across_ranks(comm, t.elapsed().as_secs_f64() / (iters.max(1) * agg) as f64, spec.average)?;

    let me = comm.rank();
    let n = comm.world_size();
    let mut wrong = None;
    if spec.check > 0 {
        let pattern = Pattern::new(spec.op, spec.redop, spec.dtype, n, spec.root);
        let poison = T::from_i64(POISON);
        let mut mine = 0;
        for _ in 0..spec.check {
            let mut hin: Vec<T> = (0..in_len).map(|i| T::from_i64(pattern.input(me, i))).collect();
            let mut hout = vec![poison; out_len];
            cu(s.memcpy_htod(&hin, &mut input), "cuMemcpyHtoD")?;
            if !hout.is_empty() {
                cu(s.memcpy_htod(&hout, &mut output), "cuMemcpyHtoD")?;
            }
            call(lib, comm, spec, gpu, &mut input, &mut output)?;
            cu(s.memcpy_dtoh(&input, &mut hin), "cuMemcpyDtoH")?;
            if !hout.is_empty() {
                cu(s.memcpy_dtoh(&output, &mut hout), "cuMemcpyDtoH")?;
            }
            cu(s.synchronize(), "cuStreamSynchronize")?;
            let result = if out_len == 0 { &hin } else { &hout };
            mine += pattern.wrong(me, result, shape.chunk);
        }
        let mut total = [mine as i64];
        comm.all_reduce(&mut total, ReduceOp::Sum).map_err(|e| e.to_string())?;
        wrong = Some(total[0].max(0) as u64);
    }
    let m = Measured { time_s, iters, wrong, emulated: false };
    Ok(match native(spec.op) {
        Variant::InPlace => Row::new(setup, shape, None, Some(m)),
        Variant::OutOfPlace => Row::new(setup, shape, Some(m), None),
    })
}

/// Runs every size of `spec` on device buffers, then NCCL's; `on_row`
/// gets each row (and NCCL's rows with `nccl = true`), `note` the lines
/// that explain a skip.
pub(crate) fn run_all(
    comm: &Communicator,
    spec: &Spec,
    gpu: &Gpu,
    on_row: &mut dyn FnMut(&Row, bool),
    note: &mut dyn FnMut(String),
) -> R<Vec<Row>> {
    let rows = sizes(Lib::Ringleader, comm, spec, gpu, "cuda", on_row, false)?;
    match nccl_comm(comm, gpu) {
        Ok(n) => {
            if spec.op == OpKind::AllToAll {
                note("# NCCL skipped: it has no all_to_all collective (nccl-tests builds it from send/recv)".into());
            } else {
                sizes(Lib::Nccl(&n), comm, spec, gpu, "nccl", on_row, true)?;
            }
        }
        Err(why) => note(format!("# NCCL skipped: {why}")),
    }
    Ok(rows)
}

#[allow(clippy::too_many_arguments)]
fn sizes(
    lib: Lib<'_>,
    comm: &Communicator,
    spec: &Spec,
    gpu: &Gpu,
    transport: &str,
    on_row: &mut dyn FnMut(&Row, bool),
    nccl: bool,
) -> R<Vec<Row>> {
    let n = comm.world_size();
    let t = if nccl { "nccl".to_string() } else { format!("{}+{transport}", comm.transport_name()) };
    let setup = Setup::new(spec, n, &t);
    let mut rows = Vec::new();
    for &bytes in &spec.sizes {
        let Some(shape) = Shape::of(spec.op, bytes, spec.dtype.size(), n) else { continue };
        let row = match spec.dtype {
            DType::F32 => measure::<f32>(lib, comm, spec, gpu, &shape, &setup)?,
            DType::F64 => measure::<f64>(lib, comm, spec, gpu, &shape, &setup)?,
            DType::F16 => measure::<f16>(lib, comm, spec, gpu, &shape, &setup)?,
            DType::BF16 => measure::<bf16>(lib, comm, spec, gpu, &shape, &setup)?,
            DType::I8 => measure::<i8>(lib, comm, spec, gpu, &shape, &setup)?,
            DType::U8 => measure::<u8>(lib, comm, spec, gpu, &shape, &setup)?,
            DType::I32 => measure::<i32>(lib, comm, spec, gpu, &shape, &setup)?,
            DType::I64 => measure::<i64>(lib, comm, spec, gpu, &shape, &setup)?,
        };
        on_row(&row, nccl);
        rows.push(row);
    }
    Ok(rows)
}

/// Why NCCL cannot run here, if it cannot: it needs a GPU per rank.
pub(crate) fn nccl_skip_reason(ranks: usize, gpus: usize, lib_present: bool) -> Option<String> {
    if gpus < ranks {
        return Some(format!(
            "{ranks} ranks share {gpus} GPU{}; NCCL needs one GPU per rank (ringleader's ranks may share one)",
            if gpus == 1 { "" } else { "s" }
        ));
    }
    if !lib_present {
        return Some("libnccl.so cannot be loaded (install NCCL or put its lib directory on LD_LIBRARY_PATH; a pip wheel's nvidia/nccl/lib works)".into());
    }
    None
}

/// An NCCL communicator over the same ranks, its id sent from rank 0
/// through ringleader (a host broadcast).
fn nccl_comm(comm: &Communicator, gpu: &Gpu) -> R<Nccl> {
    // SAFETY: only tries to load the library.
    let present = unsafe { cudarc::nccl::sys::is_culib_present() };
    // Every rank must decide alike: the smallest GPU count decides.
    let gpus = -max_over_ranks(comm, -(gpu.count as f64))? as usize;
    let ok = if nccl_skip_reason(comm.world_size(), gpus, present).is_none() { 1.0 } else { 0.0 };
    if max_over_ranks(comm, -ok)? != -1.0 {
        return Err(nccl_skip_reason(comm.world_size(), gpus, present)
            .unwrap_or_else(|| "another rank cannot load libnccl.so".into()));
    }
    let mut raw = [0u8; 128];
    if comm.rank() == 0 {
        let id = Id::new().map_err(|e| format!("ncclGetUniqueId: {e:?}"))?;
        for (d, s) in raw.iter_mut().zip(id.internal()) {
            *d = *s as u8;
        }
    }
    comm.broadcast(&mut raw, 0).map_err(|e| e.to_string())?;
    let id = Id::uninit(raw.map(|b| b as std::ffi::c_char));
    Nccl::from_rank(gpu.stream.clone(), comm.rank(), comm.world_size(), id)
        .map_err(|e| format!("ncclCommInitRank on GPU {}: {e:?}", gpu.ordinal))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_is_skipped_with_a_reason_on_shared_gpus_or_without_the_library() {
        let one = nccl_skip_reason(4, 1, true).unwrap();
        assert!(one.contains("4 ranks share 1 GPU;") && one.contains("one GPU per rank"), "{one}");
        assert!(nccl_skip_reason(2, 8, false).unwrap().contains("libnccl.so"));
        assert_eq!(nccl_skip_reason(2, 2, true), None);
    }

    #[test]
    fn without_a_driver_opening_the_gpu_names_what_is_missing() {
        if ringleader::cuda::driver().is_ok() {
            return;
        }
        let e = open_gpu().err().unwrap();
        assert!(e.contains("libcuda.so.1"), "{e}");
    }
}
