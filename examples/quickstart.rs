//! A few collectives on every rank, each checked.
//!
//! ```text
//! ringleader launch --nproc-per-node 4 -- target/release/examples/quickstart
//! ```

use ringleader::{Communicator, ReduceOp};

fn main() -> ringleader::Result<()> {
    let comm = Communicator::from_env()?;
    let (rank, n) = (comm.rank(), comm.world_size());

    let mut grads = vec![rank as f32 + 1.0; 1 << 20];
    comm.all_reduce(&mut grads, ReduceOp::Sum)?;
    assert!(grads.iter().all(|g| *g == (n * (n + 1) / 2) as f32));

    let mut gathered = vec![0i64; n];
    comm.all_gather(&[rank as i64 * 10], &mut gathered)?;

    let mut weights = vec![0.0f64; 1000];
    if rank == 0 {
        weights.iter_mut().enumerate().for_each(|(i, w)| *w = i as f64);
    }
    comm.broadcast(&mut weights, 0)?;
    assert_eq!(weights[999], 999.0);

    comm.barrier()?;
    println!("rank {rank}/{n}: all_reduce of 4 MiB, all_gather {gathered:?}, broadcast ok");
    comm.destroy()
}
