//! The enums of the C ABI. Their values are the stable codes of
//! `ringleader-core` (`DType::code`, `ReduceOp::code`, `OpKind::code`).
//! Functions take these as plain `int`s and check them, so a bad value is
//! an `invalid-argument` error rather than undefined behaviour.

use crate::error::invalid;
use ringleader_core::{DType, OpKind, ReduceOp};
use std::ffi::{c_char, c_int, CStr};

/// Element types (`rl_dtype`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RlDtype {
    /// IEEE 754 binary32 (`float`).
    F32 = 0,
    /// IEEE 754 binary64 (`double`).
    F64 = 1,
    /// IEEE 754 binary16.
    F16 = 2,
    /// bfloat16.
    Bf16 = 3,
    /// `int8_t`.
    I8 = 4,
    /// `uint8_t`.
    U8 = 5,
    /// `int32_t`.
    I32 = 6,
    /// `int64_t`.
    I64 = 7,
}

/// Reduce operations (`rl_reduce_op`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RlReduceOp {
    /// Sum (integers wrap).
    Sum = 0,
    /// Product (integers wrap).
    Prod = 1,
    /// Minimum.
    Min = 2,
    /// Maximum.
    Max = 3,
    /// Sum divided by the world size (integers: truncating division).
    Avg = 4,
}

/// Operations, as reported by `rl_last_error_op` (`rl_op`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RlOp {
    /// all_reduce.
    AllReduce = 0,
    /// all_gather.
    AllGather = 1,
    /// reduce_scatter.
    ReduceScatter = 2,
    /// broadcast.
    Broadcast = 3,
    /// reduce.
    Reduce = 4,
    /// barrier.
    Barrier = 5,
    /// all_to_all.
    AllToAll = 6,
    /// send.
    Send = 7,
    /// recv.
    Recv = 8,
    /// monitored_barrier.
    MonitoredBarrier = 9,
}

/// Checks a dtype code; `Err` carries the code already recorded.
pub(crate) fn dtype(code: c_int) -> Result<DType, c_int> {
    u8::try_from(code)
        .ok()
        .and_then(DType::from_code)
        .ok_or_else(|| invalid("dtype", format!("{code} is not an rl_dtype (0..=7)")))
}

/// Checks a reduce-op code.
pub(crate) fn reduce_op(code: c_int) -> Result<ReduceOp, c_int> {
    u8::try_from(code)
        .ok()
        .and_then(ReduceOp::from_code)
        .ok_or_else(|| invalid("op", format!("{code} is not an rl_reduce_op (0..=4)")))
}

/// Size in bytes of one element of `dtype`, or 0 for an unknown code.
#[no_mangle]
pub extern "C" fn rl_dtype_size(dtype: c_int) -> usize {
    u8::try_from(dtype).ok().and_then(DType::from_code).map_or(0, DType::size)
}

/// The name of an `rl_op` code (`"all_reduce"`), or `"unknown"`. Static.
#[no_mangle]
pub extern "C" fn rl_op_name(op: c_int) -> *const c_char {
    let name: &'static CStr = match u8::try_from(op).ok().and_then(OpKind::from_code) {
        Some(OpKind::AllReduce) => c"all_reduce",
        Some(OpKind::AllGather) => c"all_gather",
        Some(OpKind::ReduceScatter) => c"reduce_scatter",
        Some(OpKind::Broadcast) => c"broadcast",
        Some(OpKind::Reduce) => c"reduce",
        Some(OpKind::Barrier) => c"barrier",
        Some(OpKind::AllToAll) => c"all_to_all",
        Some(OpKind::Send) => c"send",
        Some(OpKind::Recv) => c"recv",
        Some(OpKind::MonitoredBarrier) => c"monitored_barrier",
        None => c"unknown",
    };
    name.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_values_are_the_core_codes() {
        let dtypes = [
            (RlDtype::F32, DType::F32),
            (RlDtype::F64, DType::F64),
            (RlDtype::F16, DType::F16),
            (RlDtype::Bf16, DType::BF16),
            (RlDtype::I8, DType::I8),
            (RlDtype::U8, DType::U8),
            (RlDtype::I32, DType::I32),
            (RlDtype::I64, DType::I64),
        ];
        assert_eq!(dtypes.len(), DType::ALL.len());
        for (c, d) in dtypes {
            assert_eq!(c as u8, d.code());
            assert_eq!(rl_dtype_size(c as c_int), d.size());
        }
        let ops = [
            (RlReduceOp::Sum, ReduceOp::Sum),
            (RlReduceOp::Prod, ReduceOp::Prod),
            (RlReduceOp::Min, ReduceOp::Min),
            (RlReduceOp::Max, ReduceOp::Max),
            (RlReduceOp::Avg, ReduceOp::Avg),
        ];
        assert_eq!(ops.len(), ReduceOp::ALL.len());
        for (c, o) in ops {
            assert_eq!(c as u8, o.code());
        }
        for k in OpKind::ALL {
            // SAFETY: rl_op_name returns a static NUL-terminated string.
            let name = unsafe { CStr::from_ptr(rl_op_name(c_int::from(k.code()))) };
            assert_eq!(name.to_str().unwrap(), k.name());
        }
        assert_eq!(RlOp::MonitoredBarrier as u8, OpKind::MonitoredBarrier.code());
        assert!(dtype(8).is_err() && dtype(-1).is_err() && reduce_op(5).is_err());
    }
}
