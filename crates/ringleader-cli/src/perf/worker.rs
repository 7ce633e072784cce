//! A worker of `ringleader perf`: one rank, over the real communicator.
//!
//! It joins with `Communicator::from_env()` (the parent set the torchrun
//! environment), runs the benchmark loop, and on rank 0 prints the table and
//! appends the JSON lines. Its exit code: 0 when every result was right,
//! [`WRONG_RESULTS`] when some were wrong, 1 when the communicator failed
//! (its error, with the runtime's diagnosis, goes to stderr).

use super::bench::{self, Collectives, CommResult, Event};
use super::report::{self, Setup};
use super::{PerfArgs, WRONG_RESULTS};
use ringleader::{Communicator, Element, OpKind, ReduceOp};
use std::fs::File;
use std::io::Write;

impl Collectives for Communicator {
    fn rank(&self) -> usize {
        Communicator::rank(self)
    }

    fn world_size(&self) -> usize {
        Communicator::world_size(self)
    }

    fn transport(&self) -> &str {
        self.transport_name()
    }

    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> CommResult<()> {
        Communicator::all_reduce(self, buf, op).map_err(|e| e.to_string())
    }

    fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> CommResult<()> {
        Communicator::all_gather(self, input, output).map_err(|e| e.to_string())
    }

    fn reduce_scatter<T: Element>(&self, input: &[T], output: &mut [T], op: ReduceOp) -> CommResult<()> {
        Communicator::reduce_scatter(self, input, output, op).map_err(|e| e.to_string())
    }

    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> CommResult<()> {
        Communicator::broadcast(self, buf, root).map_err(|e| e.to_string())
    }

    fn reduce<T: Element>(&self, buf: &mut [T], root: usize, op: ReduceOp) -> CommResult<()> {
        Communicator::reduce(self, buf, root, op).map_err(|e| e.to_string())
    }

    fn all_to_all<T: Element>(&self, input: &[T], output: &mut [T]) -> CommResult<()> {
        Communicator::all_to_all(self, input, output).map_err(|e| e.to_string())
    }

    fn barrier(&self) -> CommResult<()> {
        Communicator::barrier(self).map_err(|e| e.to_string())
    }
}

/// Runs one worker; returns its exit code.
pub(crate) fn run(args: &PerfArgs) -> i32 {
    let comm = match Communicator::from_env() {
        Ok(c) => c,
        Err(e) => {
            let rank = std::env::var("RANK").unwrap_or_else(|_| "?".into());
            eprintln!("ringleader perf: rank {rank} cannot join: {e}");
            return 1;
        }
    };
    let rank = Communicator::rank(&comm);
    let mut json = None;
    if rank == 0 {
        if let Some(p) = &args.json {
            match File::options().create(true).append(true).open(p) {
                Ok(f) => json = Some(f),
                Err(e) => {
                    eprintln!("ringleader perf: cannot append to {}: {e}", p.display());
                    return 1;
                }
            }
        }
        let setup = Setup {
            op: args.op,
            nproc: Communicator::world_size(&comm),
            dtype: args.dtype,
            redop: args.redop,
            root: args.root,
            transport: comm.transport_name(),
        };
        let store = std::env::var("RINGLEADER_STORE_ADDR").ok();
        print!("{}", report::header(&setup, args.iters, args.warmup, store.as_deref()));
    }
    let spec = args.spec();
    let mut json_error = None;
    if args.device == "cuda" {
        #[cfg(feature = "cuda")]
        return device_run(comm, &spec, json);
    }
    let result = bench::run_all(&comm, &spec, &mut |event| {
        if rank != 0 {
            return;
        }
        match event {
            Event::Row(row) => {
                println!("{}", row.table_line(spec.dtype));
                if let Some(f) = json.as_mut() {
                    if let Err(e) = writeln!(f, "{}", row.json_line()) {
                        json_error.get_or_insert(e);
                    }
                }
            }
            Event::Skipped(bytes) => println!(
                "# skipping {bytes} B: it holds no {} element{} to send",
                spec.dtype,
                if matches!(spec.op, OpKind::AllGather | OpKind::ReduceScatter | OpKind::AllToAll) {
                    " per rank"
                } else {
                    ""
                }
            ),
        }
    });
    conclude(comm, result, json_error)
}

/// Prints the footer, reports a failed JSON write, leaves the group and
/// turns the outcome into the worker's exit code.
fn conclude(comm: Communicator, result: CommResult<Vec<report::Row>>, json_error: Option<std::io::Error>) -> i32 {
    let rank = Communicator::rank(&comm);
    match result {
        Ok(rows) => {
            if rank == 0 {
                print!("{}", report::footer(&rows));
            }
            if let Some(e) = json_error {
                eprintln!("ringleader perf: writing the JSON lines failed: {e}");
            }
            let wrong = rows.iter().any(|r| r.wrong > 0);
            if let Err(e) = comm.destroy() {
                eprintln!("ringleader perf: rank {rank}: destroy: {e}");
            }
            if wrong {
                WRONG_RESULTS
            } else {
                0
            }
        }
        Err(e) => {
            // The runtime has printed its diagnosis in full; one line here.
            let first = e.lines().next().unwrap_or_default();
            eprintln!("ringleader perf: rank {rank} stopped: {first}");
            1
        }
    }
}

/// The `--device cuda` run: ringleader on device buffers, then NCCL.
#[cfg(feature = "cuda")]
fn device_run(comm: Communicator, spec: &super::bench::Spec, mut json: Option<File>) -> i32 {
    let rank = Communicator::rank(&comm);
    let gpu = match super::device::open_gpu() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("ringleader perf: rank {rank}: --device cuda: {e}");
            return 1;
        }
    };
    if rank == 0 {
        println!(
            "# device buffers: CUDA, {} rank(s) on {} visible GPU(s) (rank r on GPU LOCAL_RANK % {}); staged through pinned host memory",
            Communicator::world_size(&comm),
            gpu.count,
            gpu.count
        );
    }
    let mut json_error = None;
    let mut nccl_header = false;
    let result = super::device::run_all(
        &comm,
        spec,
        &gpu,
        &mut |row, nccl| {
            if rank != 0 {
                return;
            }
            if nccl && !nccl_header {
                nccl_header = true;
                println!("# NCCL, same sizes, same buffers' shapes:");
            }
            println!("{}", row.table_line(spec.dtype));
            if let Some(f) = json.as_mut() {
                if let Err(e) = writeln!(f, "{}", row.json_line()) {
                    json_error.get_or_insert(e);
                }
            }
        },
        &mut |line| {
            if rank == 0 {
                println!("{line}");
            }
        },
    );
    conclude(comm, result, json_error)
}
