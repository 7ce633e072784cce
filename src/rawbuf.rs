//! A caller's buffer as a raw range, for the threads that run operations
//! on it (the engine's, the send/recv lane's).
//!
//! The one place that turns a caller's raw buffer back into a slice; the
//! engine and the lane both use it, and neither depends on the other for it.

use ringleader_transport::Buf;

/// A caller's buffer, as a raw range, so the thread that runs its
/// operation (the engine's, the send/recv lane's) can use it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a RawBuf is only turned back into a slice while the operation it
// belongs to runs, and its submitter keeps the memory alive and unaliased
// until the operation completes (sync calls block; async calls own the
// buffer in their Work, or the C caller promises it).
#[allow(unsafe_code)]
unsafe impl Send for RawBuf {}

impl RawBuf {
    pub(crate) const EMPTY: RawBuf = RawBuf { ptr: std::ptr::null_mut(), len: 0 };

    pub(crate) fn new(ptr: *mut u8, len: usize) -> RawBuf {
        RawBuf { ptr, len }
    }

    /// The memory as a driver buffer.
    ///
    /// # Safety
    /// The range must be valid for `'a`, and not aliased unless `ro`.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn buf<'a>(self, ro: bool) -> Buf<'a> {
        if self.len == 0 || self.ptr.is_null() {
            return Buf::Rw(&mut []);
        }
        if ro {
            // SAFETY: per the function contract.
            Buf::Ro(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
        } else {
            // SAFETY: per the function contract.
            Buf::Rw(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
        }
    }
}
