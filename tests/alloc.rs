//! The hot path allocates nothing: once warmed up, a collective run from
//! the caller's thread makes no heap allocation on that thread, over TCP and
//! over shared memory, also when a peer turns late after the warm-up. Two
//! ranks run as two threads of this process.
#![allow(missing_docs)]

use ringleader::{Communicator, Config, ReduceOp, TransportKind};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

/// Allocations on this thread per call of `f`, after a warm-up.
fn per_call(mut f: impl FnMut()) -> f64 {
    for _ in 0..20 {
        f();
    }
    let before = allocs();
    for _ in 0..200 {
        f();
    }
    (allocs() - before) as f64 / 200.0
}

fn job(transport: TransportKind) -> Vec<(String, f64)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let run_id = format!("alloc-{}-{port}", std::process::id());
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let run_id = run_id.clone();
            std::thread::spawn(move || {
                let mut cfg = Config::new(rank, 2, "127.0.0.1", port);
                cfg.run_id = run_id;
                cfg.transport = transport;
                cfg.init_timeout = Duration::from_secs(20);
                let c = Communicator::init(cfg).unwrap();
                let mut small = [1.0f32; 2];
                let mut big = vec![1.0f32; 1 << 18];
                let inp = vec![1.0f32; 1 << 16];
                let mut out = vec![0.0f32; 1 << 17];
                let r = vec![
                    ("all_reduce 8 B, a peer late after the warm-up".to_string(), {
                        // First, so nothing before it warmed the general
                        // loop. In the warm-up rank 0 is always late, so it
                        // never waits; then rank 1 is now and then late, and
                        // rank 0 waits long enough to leave its fast path for
                        // the general loop, which its warm-up never ran.
                        let mut calls = 0;
                        per_call(|| {
                            calls += 1;
                            let late = if calls <= 20 { rank == 0 } else { rank == 1 && calls % 25 == 0 };
                            if late {
                                std::thread::sleep(Duration::from_millis(3));
                            }
                            c.all_reduce(&mut small, ReduceOp::Max).unwrap()
                        })
                    }),
                    ("all_reduce 8 B".to_string(), per_call(|| c.all_reduce(&mut small, ReduceOp::Max).unwrap())),
                    ("all_reduce 1 MiB".to_string(), per_call(|| c.all_reduce(&mut big, ReduceOp::Max).unwrap())),
                    ("all_gather 256 KiB".to_string(), per_call(|| c.all_gather(&inp, &mut out).unwrap())),
                    ("broadcast 1 MiB".to_string(), per_call(|| c.broadcast(&mut big, 0).unwrap())),
                    ("barrier".to_string(), per_call(|| c.barrier().unwrap())),
                ];
                c.destroy().unwrap();
                r
            })
        })
        .collect();
    let mut results: Vec<Vec<(String, f64)>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    results.remove(0)
}

#[test]
fn collectives_allocate_nothing_per_call_over_tcp_and_shared_memory() {
    for t in [TransportKind::Tcp, TransportKind::Shm] {
        let r = job(t);
        eprintln!("{t:?}: {r:?}");
        for (what, n) in r {
            assert_eq!(n, 0.0, "{t:?} {what}: {n} allocations per call");
        }
    }
}
