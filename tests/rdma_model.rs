//! Real collectives over RDMA links backed by the software model of the
//! verbs queues (`RINGLEADER_RDMA_DEVICE=model`): queue pairs set up
//! through the store, the driver and the point-to-point lane unchanged,
//! the same checks and errors. Ranks are threads of this process (the
//! model's fabric is process-wide). Needs the `rdma` feature.
#![cfg(feature = "rdma")]
#![allow(missing_docs)]

use ringleader::{Communicator, Config, ErrorKind, ReduceOp, TransportKind};
use std::time::Duration;

fn world<T: Send + 'static>(n: usize, transport: TransportKind, f: fn(Communicator) -> T) -> Vec<T> {
    std::env::set_var("RINGLEADER_RDMA_DEVICE", "model");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let run_id = format!("rdma-model-{}-{port}", std::process::id());
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let run_id = run_id.clone();
            std::thread::spawn(move || {
                let mut cfg = Config::new(rank, n, "127.0.0.1", port);
                cfg.run_id = run_id;
                cfg.transport = transport;
                cfg.init_timeout = Duration::from_secs(30);
                cfg.timeout = Duration::from_secs(20);
                f(Communicator::init(cfg).expect("init over the RDMA model"))
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn every_collective_runs_over_model_rdma_links() {
    let out = world(3, TransportKind::Rdma, |c| {
        assert_eq!(c.transport_name(), "rdma");
        let (r, n) = (c.rank(), c.world_size());
        let big = 300_001; // uneven, and several chunks per ring step
        let mut x: Vec<f32> = (0..big).map(|i| (i % 97) as f32 + r as f32).collect();
        c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
        for i in [0, 1, big / 2, big - 1] {
            assert_eq!(x[i], 3.0 * (i % 97) as f32 + 3.0, "all_reduce element {i}");
        }
        let mut g = vec![0i64; 5 * n];
        c.all_gather(&[r as i64; 5], &mut g).unwrap();
        assert_eq!(g, (0..n).flat_map(|k| [k as i64; 5]).collect::<Vec<_>>());
        let mut rs = vec![0i32; 4];
        c.reduce_scatter(&vec![1i32; 4 * n], &mut rs, ReduceOp::Sum).unwrap();
        assert_eq!(rs, [n as i32; 4]);
        let mut b = vec![r as u8; 100_000];
        c.broadcast(&mut b, 2).unwrap();
        assert!(b.iter().all(|&v| v == 2));
        let mut m = vec![r as f64 + 1.0; 10];
        c.reduce(&mut m, 0, ReduceOp::Max).unwrap();
        if r == 0 {
            assert_eq!(m, [3.0; 10]);
        }
        let inp: Vec<i32> = (0..n).map(|j| (r * 10 + j) as i32).collect();
        let mut a2a = vec![0i32; n];
        c.all_to_all(&inp, &mut a2a).unwrap();
        assert_eq!(a2a, (0..n).map(|j| (j * 10 + r) as i32).collect::<Vec<_>>());
        // Point-to-point on its own lane: a ring of sends and receives.
        let next = (r + 1) % n;
        let prev = (r + n - 1) % n;
        let w = c.send_async(vec![r as i64; 70_000], next).unwrap();
        let mut got = vec![0i64; 70_000];
        c.recv(&mut got, prev).unwrap();
        w.wait(None).unwrap();
        assert!(got.iter().all(|&v| v == prev as i64));
        c.barrier().unwrap();
        c.destroy().unwrap();
        r
    });
    assert_eq!(out, [0, 1, 2]);
}

#[test]
fn a_mismatch_over_rdma_is_the_same_verdict_as_over_tcp() {
    let out = world(2, TransportKind::Rdma, |c| {
        let mut x = vec![1.0f32; if c.rank() == 0 { 1000 } else { 2000 }];
        let e = c.all_reduce(&mut x, ReduceOp::Sum).unwrap_err();
        (e.kind(), e.to_string())
    });
    for (kind, msg) in out {
        assert_eq!(kind, ErrorKind::Mismatch, "{msg}");
        assert!(msg.contains("all_reduce(f32 x 1000, sum)") && msg.contains("all_reduce(f32 x 2000, sum)"), "{msg}");
    }
}

#[test]
fn auto_uses_the_model_device_for_remote_pairs_only() {
    // Under auto, ranks on one host take shared memory; RDMA is for the rest.
    let out = world(2, TransportKind::Auto, |c| {
        let name = c.transport_name().to_string();
        let mut x = [c.rank() as f32];
        c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
        c.destroy().unwrap();
        (name, x[0])
    });
    for (name, v) in out {
        assert_eq!((name.as_str(), v), ("shm", 1.0));
    }
}
