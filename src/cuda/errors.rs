//! CUDA failures as ringleader errors: every one names what failed, the
//! CUDA error (name and number), and what to check, and has a kind.
//!
//! Misuse (a pointer that is not device memory, a missing driver, no
//! device) is `invalid-argument`; anything that goes wrong on the device
//! during a collective is `aborted`: the communicator is aborted with that
//! reason, so the other ranks stop too and hear why, instead of waiting
//! for this rank's data.

use ringleader_core::{Error, ErrorKind};

/// `(code, name, hint)` of the CUDA driver errors worth naming.
const KNOWN: &[(u32, &str, &str)] = &[
    (1, "CUDA_ERROR_INVALID_VALUE", "an argument is invalid (a device pointer of another context, a bad size?)"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY", "the device is out of memory (pinned host memory for staging, or scratch)"),
    (3, "CUDA_ERROR_NOT_INITIALIZED", "the driver was not initialized"),
    (4, "CUDA_ERROR_DEINITIALIZED", "the driver is shutting down"),
    (
        34,
        "CUDA_ERROR_STUB_LIBRARY",
        "libcuda.so is the toolkit's stub, not the driver: put the driver's library first on LD_LIBRARY_PATH",
    ),
    (35, "CUDA_ERROR_INSUFFICIENT_DRIVER", "the installed NVIDIA driver is older than this CUDA runtime"),
    (100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is visible (CUDA_VISIBLE_DEVICES?)"),
    (101, "CUDA_ERROR_INVALID_DEVICE", "the device ordinal does not exist"),
    (201, "CUDA_ERROR_INVALID_CONTEXT", "no valid context is current"),
    (218, "CUDA_ERROR_INVALID_PTX", "the generated reduction kernel was rejected"),
    (400, "CUDA_ERROR_INVALID_HANDLE", "a stream or event handle is invalid (a stream of another device?)"),
    (600, "CUDA_ERROR_NOT_READY", "not finished yet"),
    (
        700,
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "a kernel or copy touched memory outside its buffer (buffer smaller than the count?)",
    ),
    (719, "CUDA_ERROR_LAUNCH_FAILED", "a kernel failed; the context is unusable"),
    (999, "CUDA_ERROR_UNKNOWN", "an unknown error"),
];

/// The name and hint of CUDA error `code`.
pub fn describe(code: u32) -> (String, &'static str) {
    match KNOWN.iter().find(|k| k.0 == code) {
        Some(&(_, name, hint)) => (name.to_string(), hint),
        None => (format!("CUDA error {code}"), "see the CUDA driver API documentation"),
    }
}

/// Whether a failure with `code` is the caller's to fix (wrong arguments,
/// no driver or device) rather than a fault during the operation.
pub fn is_misuse(code: u32) -> bool {
    matches!(code, 1 | 3 | 34 | 35 | 100 | 101 | 201 | 400)
}

/// The error for CUDA call `what` failing with `code` during `during`
/// (e.g. `all_reduce on device buffers`).
///
/// ```ignore
/// let e = cuda_error("cuMemcpyDtoHAsync", 700, "all_reduce");
/// assert_eq!(e.kind(), ErrorKind::Aborted);
/// ```
pub fn cuda_error(what: &str, code: u32, during: &str) -> Error {
    let (name, hint) = describe(code);
    let msg = format!("{what} failed with {name} ({code}) during {during}: {hint}");
    if is_misuse(code) {
        Error::invalid("CUDA", msg)
    } else {
        Error::aborted(format!("CUDA error: {msg}"))
    }
}

/// The kind [`cuda_error`] gives `code`.
pub fn kind_of(code: u32) -> ErrorKind {
    if is_misuse(code) {
        ErrorKind::InvalidArgument
    } else {
        ErrorKind::Aborted
    }
}

/// The error for a missing CUDA library (`lib`: `libcuda.so`, `libnvrtc.so`).
pub fn missing_library(lib: &str, needed_for: &str) -> Error {
    Error::invalid(
        "CUDA",
        format!(
            "{needed_for} needs {lib}, which cannot be loaded: no NVIDIA driver (or CUDA toolkit) on this machine, \
             or its directory is not on LD_LIBRARY_PATH; host buffers work without it"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_named_and_classified() {
        let e = cuda_error("cuMemcpyDtoHAsync", 700, "all_reduce on device buffers");
        assert_eq!(e.kind(), ErrorKind::Aborted);
        let s = e.to_string();
        assert!(
            s.starts_with("[aborted] CUDA error: cuMemcpyDtoHAsync failed with CUDA_ERROR_ILLEGAL_ADDRESS (700)"),
            "{s}"
        );
        assert!(s.contains("during all_reduce on device buffers"), "{s}");
        let e = cuda_error("cuPointerGetAttribute", 1, "all_gather");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("CUDA_ERROR_INVALID_VALUE"));
        assert_eq!(describe(12345).0, "CUDA error 12345");
        assert_eq!(kind_of(100), ErrorKind::InvalidArgument);
        assert_eq!(kind_of(719), ErrorKind::Aborted);
    }

    #[test]
    fn a_missing_library_says_what_and_how_to_fix() {
        let e = missing_library("libcuda.so.1", "all_reduce on device buffers");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let s = e.to_string();
        assert!(s.contains("libcuda.so.1") && s.contains("LD_LIBRARY_PATH") && s.contains("host buffers work"), "{s}");
    }
}
