//! `RINGLEADER_TRANSPORT=rdma` where RDMA cannot be had (a build without the
//! `rdma` feature, or no device, as on machines without RDMA hardware) is a
//! clear `invalid-argument` error at init, never a hang or a silent fallback.
#![allow(missing_docs)]

use ringleader::{Communicator, Config, ErrorKind, TransportKind};
use std::time::Duration;

#[test]
fn asking_for_rdma_without_it_is_an_invalid_argument() {
    std::env::remove_var("RINGLEADER_RDMA_DEVICE");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let mut cfg = Config::new(rank, 2, "127.0.0.1", port);
                cfg.run_id = format!("rdma-missing-{port}");
                cfg.transport = TransportKind::Rdma;
                cfg.init_timeout = Duration::from_secs(20);
                Communicator::init(cfg).map(|c| c.transport_name().to_string())
            })
        })
        .collect();
    for h in handles {
        match h.join().unwrap() {
            // A machine with an RDMA adapter and the feature: it just works.
            Ok(name) => assert_eq!(name, "rdma"),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
                let s = e.to_string();
                assert!(s.contains("RINGLEADER_TRANSPORT") && s.contains("rdma was asked for"), "{s}");
                if cfg!(feature = "rdma") {
                    assert!(s.contains("no usable RDMA device"), "{s}");
                } else {
                    assert!(s.contains("without the `rdma` cargo feature"), "{s}");
                }
            }
        }
    }
}
