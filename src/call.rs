//! A call as the user made it, checked and described: what the engine or
//! the send/recv lane runs, its fingerprint, and the buffers it reads and
//! writes.
//!
//! Every call is checked before anything runs (counts that agree with the
//! world size, roots and peers that exist, buffers that are not null and do
//! not overlap), so a bad call fails with `invalid-argument` on the rank
//! that made it, without taking a sequence number. A training loop repeats
//! the same few calls; [`CallKey`] names a call's shape (everything but
//! its buffers' addresses), so that the engine can keep what it worked out
//! for a shape and only check the addresses again (see
//! [`crate::known`]).

use crate::algo::Coll;
use crate::rawbuf::RawBuf;
use ringleader_core::{DType, Error, Fingerprint, OpKind, Rank, ReduceOp, Result};
use ringleader_diag::CallSite;
use std::panic::Location;
use std::time::Duration;

/// What a raw call does (see [`crate::Communicator::call_raw`]).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawOp {
    /// In place on the output buffer.
    AllReduce { op: ReduceOp },
    /// Input to output.
    AllGather,
    /// Input to output.
    ReduceScatter { op: ReduceOp },
    /// In place on the output buffer.
    Broadcast { root: Rank },
    /// In place on the output buffer.
    Reduce { root: Rank, op: ReduceOp },
    /// Input to output.
    AllToAll,
    /// Reads the input.
    Send { peer: Rank },
    /// Writes the output.
    Recv { peer: Rank },
    /// No buffers.
    Barrier,
    /// No buffers.
    MonitoredBarrier { timeout: Duration, wait_all: bool },
}

/// A collective on raw buffers, for language bindings.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// What to do.
    pub op: RawOp,
    /// Element type of both buffers.
    pub dtype: DType,
    /// Input buffer (read only).
    pub input: *const u8,
    /// Elements in `input`.
    pub input_count: usize,
    /// Output (or in-place) buffer.
    pub output: *mut u8,
    /// Elements in `output`.
    pub output_count: usize,
    /// Where the user's code made the call, for the flight recorder.
    pub site: Option<CallSite>,
}

impl Call {
    /// An in-place call on `buf`, made where the caller's caller is.
    #[track_caller]
    pub(crate) fn inplace<T: ringleader_core::Element>(op: RawOp, buf: &mut [T]) -> Call {
        Call {
            op,
            dtype: T::DTYPE,
            input: std::ptr::null(),
            input_count: 0,
            output: buf.as_mut_ptr() as *mut u8,
            output_count: buf.len(),
            site: Some(CallSite::Rust(Location::caller())),
        }
    }

    /// An out-of-place call from `input` to `output`.
    #[track_caller]
    pub(crate) fn outofplace<T: ringleader_core::Element>(op: RawOp, input: &[T], output: &mut [T]) -> Call {
        Call {
            op,
            dtype: T::DTYPE,
            input: input.as_ptr() as *const u8,
            input_count: input.len(),
            output: output.as_mut_ptr() as *mut u8,
            output_count: output.len(),
            site: Some(CallSite::Rust(Location::caller())),
        }
    }

    /// The call's shape, for a collective the engine runs (`None`: a send,
    /// a receive, a monitored barrier, or a root beyond any rank, which
    /// are described afresh each time).
    #[inline]
    pub(crate) fn key(&self) -> Option<CallKey> {
        let (code, root, reduce) = match self.op {
            RawOp::AllReduce { op } => (1, 0, op.code()),
            RawOp::AllGather => (2, 0, 0),
            RawOp::ReduceScatter { op } => (3, 0, op.code()),
            RawOp::Broadcast { root } => (4, root, 0),
            RawOp::Reduce { root, op } => (5, root, op.code()),
            RawOp::AllToAll => (6, 0, 0),
            RawOp::Barrier => (7, 0, 0),
            RawOp::Send { .. } | RawOp::Recv { .. } | RawOp::MonitoredBarrier { .. } => return None,
        };
        let root = u32::try_from(root).ok()?;
        let word = code | u64::from(reduce) << 8 | u64::from(self.dtype.code()) << 16 | u64::from(root) << 32;
        Some(CallKey([word, self.input_count as u64, self.output_count as u64]))
    }
}

/// A collective call's shape: its operation, root, reduce op, element type
/// and counts, everything that decides whether it is valid and how it
/// runs but its buffers' addresses (see [`Call::key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CallKey([u64; 3]);

/// What an engine operation does (sends and receives are the lane's:
/// `p2p.rs`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Task {
    Coll(Coll),
    MonitoredBarrier { timeout: Duration, wait_all: bool },
}

/// An operation for the engine, as submitted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Submission {
    pub task: Task,
    pub fp: Fingerprint,
    pub io: RawBuf,
    pub io_ro: bool,
    pub out: RawBuf,
    /// Where the user's code made the call.
    pub site: Option<CallSite>,
    /// The call's shape (`None` for a monitored barrier).
    pub key: Option<CallKey>,
}

/// A send or receive, before the lane numbers it.
pub(crate) struct P2pRequest {
    pub peer: Rank,
    pub fp: Fingerprint,
    /// What a send reads, or a receive writes.
    pub buf: RawBuf,
    pub site: Option<CallSite>,
}

/// A checked call: an operation for the engine (a collective, a monitored
/// barrier), or a send or receive for the lane.
pub(crate) enum Dispatch {
    Engine(Submission),
    P2p(P2pRequest),
}

/// Checks call `c` of rank `rank` in a world of `n` and describes it (see
/// the module docs).
pub(crate) fn describe(c: &Call, rank: Rank, n: usize) -> Result<Dispatch> {
    if let Some(req) = describe_p2p(c, rank, n) {
        return req.map(Dispatch::P2p);
    }
    let check_root = |what: &str, root: Rank| check_root(what, root, n);
    let times_n = |what: &str, small: usize, big: usize, small_name: &str, big_name: &str| {
        if small.checked_mul(n) != Some(big) {
            return Err(Error::invalid(
                what,
                format!("{big_name} holds {big} elements; it must hold world_size ({n}) x {small_name} ({small})"),
            ));
        }
        Ok(())
    };
    let (ic, oc) = (c.input_count, c.output_count);
    // The collective's schedule (sends and receives were described above).
    let (op, coll) = match c.op {
        RawOp::AllReduce { op } => (OpKind::AllReduce, Coll::AllReduce { count: oc, op }),
        RawOp::AllGather => {
            times_n("all_gather", ic, oc, "input", "output")?;
            (OpKind::AllGather, Coll::AllGather { per_rank: ic })
        }
        RawOp::ReduceScatter { op } => {
            times_n("reduce_scatter", oc, ic, "output", "input")?;
            (OpKind::ReduceScatter, Coll::ReduceScatter { per_rank: oc, op })
        }
        RawOp::Broadcast { root } => {
            check_root("broadcast root", root)?;
            (OpKind::Broadcast, Coll::Broadcast { count: oc, root })
        }
        RawOp::Reduce { root, op } => {
            check_root("reduce root", root)?;
            (OpKind::Reduce, Coll::Reduce { count: oc, root, op })
        }
        RawOp::AllToAll => {
            if ic != oc || ic % n != 0 {
                return Err(Error::invalid(
                    "all_to_all",
                    format!("input ({ic}) and output ({oc}) must hold the same number of elements, a multiple of world_size ({n})"),
                ));
            }
            (OpKind::AllToAll, Coll::AllToAll { per_rank: ic / n })
        }
        // Described by `describe_p2p` above; never here.
        RawOp::Send { .. } | RawOp::Recv { .. } => {
            let what = "a send or receive reached the collectives' checks".into();
            return Err(Error::Internal { rank, op: None, what });
        }
        RawOp::Barrier => (OpKind::Barrier, Coll::Barrier),
        RawOp::MonitoredBarrier { timeout, wait_all } => {
            let fp = Fingerprint::new(OpKind::MonitoredBarrier, DType::U8, 0);
            let task = Task::MonitoredBarrier { timeout, wait_all };
            let (io, out) = (RawBuf::EMPTY, RawBuf::EMPTY);
            return Ok(Dispatch::Engine(Submission { task, fp, io, io_ro: false, out, site: c.site, key: None }));
        }
    };
    let esz = c.dtype.size();
    if ic.checked_mul(esz).is_none() || oc.checked_mul(esz).is_none() {
        return Err(Error::invalid(op.name(), format!("{} elements do not fit this machine's memory", ic.max(oc))));
    }
    check_buffers(op, c)?;
    let (io, io_ro, out) = buffers(op, c);
    let count = match op {
        OpKind::AllGather | OpKind::ReduceScatter | OpKind::AllToAll | OpKind::Send => ic,
        OpKind::Barrier => 0,
        _ => oc,
    };
    let mut fp = Fingerprint::new(op, c.dtype, count as u64);
    match c.op {
        RawOp::AllReduce { op } | RawOp::ReduceScatter { op } => fp = fp.with_reduce_op(op),
        RawOp::Broadcast { root } => fp = fp.with_root(root),
        RawOp::Reduce { root, op } => fp = fp.with_root(root).with_reduce_op(op),
        _ => {}
    }
    let task = Task::Coll(coll);
    Ok(Dispatch::Engine(Submission { task, fp, io, io_ro, out, site: c.site, key: c.key() }))
}

/// [`describe`] for a send or receive (`None` for any other call): the
/// same checks in the same order, with the same errors, without the
/// general dispatch around them, on the path of every small message.
#[inline]
pub(crate) fn describe_p2p(c: &Call, rank: Rank, n: usize) -> Option<Result<P2pRequest>> {
    // A send reads its input; a receive writes its output (in place).
    let (op, peer, what, count, at) = match c.op {
        RawOp::Send { peer } => (OpKind::Send, peer, "send destination", c.input_count, c.input as *mut u8),
        RawOp::Recv { peer } => (OpKind::Recv, peer, "recv source", c.output_count, c.output),
        _ => return None,
    };
    Some(p2p_request(c, op, (peer, what), (count, at), rank, n))
}

#[inline]
fn p2p_request(
    c: &Call,
    op: OpKind,
    (peer, what): (Rank, &str),
    (count, at): (usize, *mut u8),
    rank: Rank,
    n: usize,
) -> Result<P2pRequest> {
    check_root(what, peer, n)?;
    if peer == rank {
        return Err(Error::invalid(what, format!("rank {peer} is this rank itself")));
    }
    // The other buffer is empty: the larger count is this one.
    let Some(bytes) = count.checked_mul(c.dtype.size()) else {
        return Err(Error::invalid(op.name(), format!("{count} elements do not fit this machine's memory")));
    };
    if bytes > 0 && at.is_null() {
        let fault = if op == OpKind::Send { BufferFault::NullInput } else { BufferFault::NullOutput };
        return Err(buffer_error(op, fault));
    }
    let fp = Fingerprint::new(op, c.dtype, count as u64).with_root(peer);
    Ok(P2pRequest { peer, fp, buf: RawBuf::new(at, bytes), site: c.site })
}

/// A root (or peer) that is not a rank of the world of `n`.
fn check_root(what: &str, root: Rank, n: usize) -> Result<()> {
    if root >= n {
        return Err(Error::invalid(what, format!("rank {root} does not exist in a world of {n}")));
    }
    Ok(())
}

/// The buffers operation `op` of call `c` works on: `io` (read only when
/// the flag says so) and `out`. In-place operations work on the output
/// buffer; the others read the input.
#[inline]
pub(crate) fn buffers(op: OpKind, c: &Call) -> (RawBuf, bool, RawBuf) {
    let esz = c.dtype.size();
    let input = RawBuf::new(c.input as *mut u8, c.input_count * esz);
    let output = RawBuf::new(c.output, c.output_count * esz);
    match op {
        OpKind::AllGather | OpKind::ReduceScatter | OpKind::AllToAll => (input, true, output),
        OpKind::Send => (input, true, RawBuf::EMPTY),
        OpKind::Barrier | OpKind::MonitoredBarrier => (RawBuf::EMPTY, false, RawBuf::EMPTY),
        _ => (output, false, RawBuf::EMPTY),
    }
}

/// Null pointers with a non-zero count, and overlapping buffers of an
/// out-of-place operation, are refused before anything runs.
#[inline]
pub(crate) fn check_buffers(op: OpKind, c: &Call) -> Result<()> {
    match buffers_fault(op, c) {
        None => Ok(()),
        Some(fault) => Err(buffer_error(op, fault)),
    }
}

/// What is wrong with call `c`'s buffers for `op`, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BufferFault {
    NullInput,
    NullOutput,
    Overlap,
}

#[inline]
fn buffers_fault(op: OpKind, c: &Call) -> Option<BufferFault> {
    let esz = c.dtype.size();
    let (in_bytes, out_bytes) = (c.input_count * esz, c.output_count * esz);
    let reads_input = matches!(op, OpKind::AllGather | OpKind::ReduceScatter | OpKind::AllToAll | OpKind::Send);
    let writes_output = !matches!(op, OpKind::Send | OpKind::Barrier);
    if reads_input && in_bytes > 0 && c.input.is_null() {
        return Some(BufferFault::NullInput);
    }
    if writes_output && out_bytes > 0 && c.output.is_null() {
        return Some(BufferFault::NullOutput);
    }
    if reads_input && writes_output && in_bytes > 0 && out_bytes > 0 {
        let (i, o) = (c.input as usize, c.output as usize);
        if i < o + out_bytes && o < i + in_bytes {
            return Some(BufferFault::Overlap);
        }
    }
    None
}

#[cold]
fn buffer_error(op: OpKind, fault: BufferFault) -> Error {
    match fault {
        BufferFault::NullInput => Error::invalid(format!("{op} input"), "null pointer with a non-zero count"),
        BufferFault::NullOutput => Error::invalid(format!("{op} output"), "null pointer with a non-zero count"),
        BufferFault::Overlap => Error::invalid(op.name(), "input and output overlap; pass separate buffers"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(op: RawOp, dtype: DType, ic: usize, oc: usize) -> Call {
        let p = 8usize as *mut u8;
        Call { op, dtype, input: p, input_count: ic, output: p, output_count: oc, site: None }
    }

    #[test]
    fn keys_tell_every_shape_apart() {
        let shapes = [
            call(RawOp::AllReduce { op: ReduceOp::Sum }, DType::F32, 0, 4),
            call(RawOp::AllReduce { op: ReduceOp::Max }, DType::F32, 0, 4),
            call(RawOp::AllReduce { op: ReduceOp::Sum }, DType::I32, 0, 4),
            call(RawOp::AllReduce { op: ReduceOp::Sum }, DType::F32, 0, 5),
            call(RawOp::AllGather, DType::F32, 2, 4),
            call(RawOp::AllGather, DType::F32, 1, 4),
            call(RawOp::ReduceScatter { op: ReduceOp::Sum }, DType::F32, 4, 2),
            call(RawOp::Broadcast { root: 0 }, DType::F32, 0, 4),
            call(RawOp::Broadcast { root: 1 }, DType::F32, 0, 4),
            call(RawOp::Reduce { root: 1, op: ReduceOp::Sum }, DType::F32, 0, 4),
            call(RawOp::Reduce { root: 1, op: ReduceOp::Min }, DType::F32, 0, 4),
            call(RawOp::AllToAll, DType::F32, 4, 4),
            call(RawOp::Barrier, DType::U8, 0, 0),
        ];
        for (i, a) in shapes.iter().enumerate() {
            for (j, b) in shapes.iter().enumerate() {
                assert_eq!(a.key() == b.key(), i == j, "{a:?} against {b:?}");
            }
        }
    }

    #[test]
    fn calls_described_afresh_have_no_key() {
        for op in [
            RawOp::Send { peer: 1 },
            RawOp::Recv { peer: 1 },
            RawOp::MonitoredBarrier { timeout: Duration::from_secs(1), wait_all: false },
            RawOp::Broadcast { root: usize::MAX },
        ] {
            assert_eq!(call(op, DType::F32, 1, 1).key(), None);
        }
    }
}
