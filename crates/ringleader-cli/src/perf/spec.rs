//! The benchmark's vocabulary, shared by the loop that measures
//! ([`super::bench`]), the device variant ([`super::device`]) and the
//! report that prints ([`super::report`]): what to measure ([`Spec`]), the
//! two forms of each collective ([`Variant`]), which collectives move data
//! ([`moves_data`]: all but barrier), how the ranks' times combine
//! ([`Average`]) and what one measurement is ([`Measured`]).

use ringleader_core::{DType, OpKind, ReduceOp};

/// The two column groups of nccl-tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Variant {
    /// A send buffer and a separate receive buffer.
    OutOfPlace,
    /// One buffer: the input is (part of) the output buffer.
    InPlace,
}

/// Whether `op` moves data: every collective `perf` measures but barrier,
/// which has no buffers, hence no size (one row of size 0), nothing to
/// check and a single form.
pub(crate) fn moves_data(op: OpKind) -> bool {
    op != OpKind::Barrier
}

/// Whether `variant` of `op` is measured: both forms of a collective that
/// moves data (the one its API lacks emulated), the native form alone of
/// barrier (without buffers there is nothing to be in or out of place, so
/// measuring it twice would print one number as two).
pub(crate) fn has_form(op: OpKind, variant: Variant) -> bool {
    moves_data(op) || variant == native(op)
}

/// The form ringleader's API has for `op`: in place for all_reduce,
/// broadcast and reduce (and barrier, whose call passes an empty buffer
/// in place), out of place for the others.
pub(crate) fn native(op: OpKind) -> Variant {
    if matches!(op, OpKind::AllGather | OpKind::ReduceScatter | OpKind::AllToAll) {
        Variant::OutOfPlace
    } else {
        Variant::InPlace
    }
}

/// How `variant` of `op` is run when ringleader's API has no such form:
/// the copy each operation adds (timed); `None` for the native form.
pub(crate) fn emulation(op: OpKind, variant: Variant) -> Option<&'static str> {
    if variant == native(op) {
        return None;
    }
    Some(match op {
        OpKind::AllReduce => "each rank copies the send buffer into the receive buffer, then all_reduces that in place",
        OpKind::Broadcast => "the root copies its send buffer into its receive buffer, then every rank broadcasts in place",
        OpKind::Reduce => {
            "the root copies its send buffer into its receive buffer and reduces that in place; the other ranks \
             pass their send buffer, which ringleader's reduce leaves unchanged"
        }
        OpKind::AllGather => {
            "each rank copies its slice of the output buffer into a separate input buffer, then all_gathers into the output"
        }
        OpKind::ReduceScatter => {
            "reduce_scatter writes a separate output buffer, which each rank then copies into its slice of the input buffer"
        }
        OpKind::AllToAll => "each rank copies the buffer into a separate send buffer, which all_to_all then reads",
        // barrier: no other form to emulate ([`has_form`]).
        _ => return None,
    })
}

/// How the ranks' times combine into the one reported (nccl-tests' `-a`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Average {
    /// `-a 0`: rank 0's time.
    Rank0,
    /// `-a 1`: the mean over the ranks.
    Mean,
    /// `-a 2`: the fastest rank's.
    Min,
    /// `-a 3`: the slowest rank's.
    Max,
}

impl Average {
    /// The mode of nccl-tests' `-a` code (0 to 3).
    pub(crate) fn from_code(code: u8) -> Option<Average> {
        Some(match code {
            0 => Average::Rank0,
            1 => Average::Mean,
            2 => Average::Min,
            3 => Average::Max,
            _ => return None,
        })
    }

    /// nccl-tests' `-a` code.
    pub(crate) fn code(self) -> u8 {
        self as u8
    }

    /// Its name in the header and the JSON lines.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Average::Rank0 => "rank0",
            Average::Mean => "mean",
            Average::Min => "min",
            Average::Max => "max",
        }
    }
}

/// What to benchmark.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    /// The collective.
    pub(crate) op: OpKind,
    /// Element type.
    pub(crate) dtype: DType,
    /// Reduce op of the reducing collectives.
    pub(crate) redop: ReduceOp,
    /// Root of broadcast and reduce.
    pub(crate) root: usize,
    /// Requested sizes in bytes.
    pub(crate) sizes: Vec<u64>,
    /// Timed iterations per size and column group; `None`: adaptive.
    pub(crate) iters: Option<usize>,
    /// Warm-up iterations per size and column group.
    pub(crate) warmup: usize,
    /// Operations per iteration (nccl-tests' `-m`).
    pub(crate) agg_iters: usize,
    /// Each operation completes before the next starts (nccl-tests' `-z 1`).
    pub(crate) blocking: bool,
    /// Checked iterations per size and column group; 0: no check (`-c 0`,
    /// and always for barrier: no data).
    pub(crate) check: usize,
    /// How the ranks' times combine (`-a`).
    pub(crate) average: Average,
}

/// One column group's measurement, agreed on by every rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Measured {
    /// Time per operation, combined over the ranks as `-a` says.
    pub(crate) time_s: f64,
    /// Timed iterations.
    pub(crate) iters: usize,
    /// Wrong elements over every rank and checked iteration; `None`
    /// when checking is off.
    pub(crate) wrong: Option<u64>,
    /// Whether the form was emulated ([`emulation`]).
    pub(crate) emulated: bool,
}
