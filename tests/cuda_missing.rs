//! Without a CUDA driver (this machine, CI), a collective on device buffers
//! is a clear `invalid-argument` error naming the missing library, and the
//! communicator stays usable for host buffers. Needs the `cuda` feature.
#![cfg(feature = "cuda")]
#![allow(missing_docs)]

use ringleader::cuda::DeviceCall;
use ringleader::{Communicator, Config, DType, ErrorKind, RawOp, ReduceOp};
use std::time::Duration;

#[test]
fn a_device_call_without_a_driver_names_what_is_missing() {
    // SAFETY: only probes for the library.
    if ringleader::cuda::driver().is_ok() {
        eprintln!("skipped: this machine has a CUDA driver (scripts/gpu_check.sh tests it)");
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut cfg = Config::new(0, 1, "127.0.0.1", port);
    cfg.run_id = format!("cuda-missing-{port}");
    cfg.init_timeout = Duration::from_secs(20);
    let c = Communicator::init(cfg).unwrap();
    let call = DeviceCall {
        op: RawOp::AllReduce { op: ReduceOp::Sum },
        dtype: DType::F32,
        input: 0,
        input_count: 0,
        output: 0x7f00_0000_0000,
        output_count: 16,
        stream: std::ptr::null_mut(),
    };
    // SAFETY: the call fails before touching the (fake) pointer.
    let e = unsafe { c.call_device_raw(call) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let s = e.to_string();
    assert!(s.contains("libcuda.so.1") && s.contains("LD_LIBRARY_PATH"), "{s}");
    let mut x = [1.0f32; 4];
    c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
    assert!(ringleader::cuda::schedule::pipeline(3, 2).len() == 12);
    c.destroy().unwrap();
}
