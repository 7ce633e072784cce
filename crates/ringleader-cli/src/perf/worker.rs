//! A worker of `ringleader perf`: one rank, over the real communicator.
//!
//! It joins with `Communicator::from_env()` (the parent set the torchrun
//! environment), tells rank 0 what it runs on (host, pid, transport, CPU:
//! the `# Using devices` lines), runs the benchmark loop, and on rank 0
//! prints the table and appends the JSON lines. Its exit code: 0 when
//! every result was right, [`WRONG_RESULTS`] when some were wrong, 1 when
//! the communicator failed (its error, with the runtime's diagnosis, goes
//! to stderr).

use super::bench::{self, Call, Collectives, CommResult, Event};
use super::report::{self, Header, Setup};
use super::sizes::splits;
use super::{PerfArgs, WRONG_RESULTS};
use ringleader::{Communicator, Element, ReduceOp, Work};
use std::fs::File;
use std::io::Write;

/// A collective submitted through the asynchronous API.
#[derive(Debug)]
pub(crate) enum Pending<T> {
    /// An in-place one, and the input handed back as it came.
    InPlace(Vec<T>, Work<Vec<T>>),
    /// An out-of-place one.
    Split(Work<(Vec<T>, Vec<T>)>),
    /// A barrier, and the (empty) input and output handed back as they came.
    Barrier(Vec<T>, Vec<T>, Work<()>),
}

impl Collectives for Communicator {
    type Pending<T: Element> = Pending<T>;

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

    fn submit<T: Element>(&self, call: Call, input: Vec<T>, output: Vec<T>) -> CommResult<Pending<T>> {
        let r = match call {
            Call::AllReduce(op) => self.all_reduce_async(output, op).map(|w| Pending::InPlace(input, w)),
            Call::Broadcast(root) => self.broadcast_async(output, root).map(|w| Pending::InPlace(input, w)),
            Call::Reduce(root, op) => self.reduce_async(output, root, op).map(|w| Pending::InPlace(input, w)),
            Call::AllGather => self.all_gather_async(input, output).map(Pending::Split),
            Call::ReduceScatter(op) => self.reduce_scatter_async(input, output, op).map(Pending::Split),
            Call::AllToAll => self.all_to_all_async(input, output).map(Pending::Split),
            Call::Barrier => self.barrier_async().map(|w| Pending::Barrier(input, output, w)),
        };
        r.map_err(|e| e.to_string())
    }

    fn complete<T: Element>(&self, pending: Pending<T>) -> CommResult<(Vec<T>, Vec<T>)> {
        match pending {
            Pending::InPlace(input, w) => w.into_inner().map(|out| (input, out)),
            Pending::Split(w) => w.into_inner(),
            Pending::Barrier(input, output, w) => w.into_inner().map(|()| (input, output)),
        }
        .map_err(|e| e.to_string())
    }
}

/// Bytes of one rank's `# Using devices` line as the ranks exchange it.
const RANK_LINE_BYTES: usize = 256;

/// Every rank's `# Using devices` line, in rank order (every rank calls
/// this: the lines travel by all_gather). `gpu`: this rank's GPU ordinal
/// with `--device cuda`.
fn rank_lines(comm: &Communicator, gpu: Option<usize>) -> CommResult<Vec<String>> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string());
    let host = host.ok().filter(|h| !h.is_empty() && !h.contains(' ')).unwrap_or_else(|| "localhost".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let what = format!("ringleader-{}, {}, {cpus} CPUs allowed", comm.transport_name(), cpu_model());
    let line = match gpu {
        Some(g) => report::rank_line(comm.rank(), std::process::id(), &host, g as i64, "cuda", &what),
        None => report::rank_line(comm.rank(), std::process::id(), &host, -1, "cpu", &what),
    };
    let mut mine = [0u8; RANK_LINE_BYTES];
    let mut end = line.len().min(RANK_LINE_BYTES);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    mine[..end].copy_from_slice(&line.as_bytes()[..end]);
    let mut all = vec![0u8; RANK_LINE_BYTES * Communicator::world_size(comm)];
    Communicator::all_gather(comm, &mine, &mut all).map_err(|e| e.to_string())?;
    Ok(all
        .chunks(RANK_LINE_BYTES)
        .map(|c| String::from_utf8_lossy(&c[..c.iter().position(|&b| b == 0).unwrap_or(c.len())]).into_owned())
        .collect())
}

/// The CPU's model name (`/proc/cpuinfo`), or the architecture.
fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            matches!(k.trim(), "model name" | "Model" | "cpu model")
                .then(|| v.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| format!("{} CPU", std::env::consts::ARCH))
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
    }
    let spec = args.spec();
    #[cfg(feature = "cuda")]
    let gpu = if args.device == "cuda" {
        match super::device::open_gpu() {
            Ok(g) => Some(g),
            Err(e) => {
                eprintln!("ringleader perf: rank {rank}: --device cuda: {e}");
                return 1;
            }
        }
    } else {
        None
    };
    #[cfg(feature = "cuda")]
    let ordinal = gpu.as_ref().map(|g| g.ordinal);
    #[cfg(not(feature = "cuda"))]
    let ordinal = None;
    let ranks = match rank_lines(&comm, ordinal) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ringleader perf: rank {rank} stopped: {}", e.lines().next().unwrap_or_default());
            return 1;
        }
    };
    if rank == 0 {
        let setup = Setup::new(&spec, Communicator::world_size(&comm), comm.transport_name());
        let store = std::env::var("RINGLEADER_STORE_ADDR").ok();
        let (min_bytes, max_bytes, step_factor) = args.sweep();
        let header = Header {
            min_bytes,
            max_bytes,
            step_factor,
            iters: args.iters,
            // The spec's: 0 (validation: 0) for barrier, which has nothing to check.
            check: spec.check,
            ranks: &ranks,
            store: store.as_deref(),
            unmeasured: (args.device == "cuda").then_some(
                "--device cuda: only the form ringleader's API has is measured (in place for all_reduce, broadcast \
                 and reduce, out of place for the others); the other column group prints N/A",
            ),
        };
        print!("{}", report::header(&setup, &header));
    }
    #[cfg(feature = "cuda")]
    if let Some(gpu) = gpu {
        return device_run(comm, &spec, gpu, json);
    }
    let mut json_error = None;
    let result = bench::run_all(&comm, &spec, &mut |event| {
        if rank != 0 {
            return;
        }
        match event {
            Event::Row(row) => {
                println!("{}", row.table_line());
                if let Some(f) = json.as_mut() {
                    if let Err(e) = writeln!(f, "{}", row.json_line()) {
                        json_error.get_or_insert(e);
                    }
                }
            }
            Event::Skipped(bytes) => println!(
                "# skipping {bytes} B: it holds no {} element{} to send",
                spec.dtype,
                if splits(spec.op) { " per rank" } else { "" }
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
            let wrong = rows.iter().any(|r| r.wrong_total() > 0);
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
fn device_run(comm: Communicator, spec: &super::spec::Spec, gpu: super::device::Gpu, mut json: Option<File>) -> i32 {
    let rank = Communicator::rank(&comm);
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
            println!("{}", row.table_line());
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
