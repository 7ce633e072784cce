//! The seed's classic hang, in Rust: every rank makes one all_reduce, then
//! only rank 0 makes a second one. With gloo this waits 30 minutes in
//! silence; with ringleader rank 0 is told at once that rank 1 never entered
//! all_reduce #2 and left after #1.
//!
//! ```text
//! ringleader launch --nproc-per-node 2 -- target/release/examples/hang_demo
//! ```

use ringleader::{Communicator, ReduceOp};

fn main() {
    let comm = Communicator::from_env().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let rank = comm.rank();
    let mut t = [1.0f32];
    comm.all_reduce(&mut t, ReduceOp::Sum).expect("first all_reduce");
    println!("rank {rank}: first all_reduce done");
    if rank == 0 {
        // THE BUG: only rank 0 makes this call.
        if let Err(e) = comm.all_reduce(&mut t, ReduceOp::Sum) {
            eprintln!("rank {rank}: second all_reduce failed: {e}");
            std::process::exit(1);
        }
        println!("rank 0: second all_reduce done");
    }
    println!("rank {rank}: reached the end");
    comm.destroy().expect("destroy");
}
