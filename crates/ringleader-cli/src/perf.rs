//! `ringleader perf`: an nccl-tests-style benchmark over N local ranks that
//! it starts itself (docs/DESIGN.md §3, §4), printing nccl-tests' table so that
//! tools which read nccl-tests' output read it too.
//!
//! The command plays two parts:
//! - the **parent** ([`parent`]) hosts a ringleader store in-process, as
//!   `ringleader launch` does, and starts N copies of its own executable as
//!   hidden workers (`ringleader perf ... --worker`) with the torchrun
//!   environment; it forwards their output, enforces an overall time limit,
//!   and names the rank that failed, how, and what it last printed;
//! - each **worker** ([`worker`]) joins with `Communicator::from_env()` and
//!   runs the benchmark loop ([`bench`](mod@bench)): per size, out of place
//!   then in place, warm-up, barrier, timed iterations, the time combined
//!   over the ranks, then checked iterations on fresh inputs ([`check`])
//!   whose wrong elements are summed over the ranks. Rank 0 prints
//!   nccl-tests' table ([`report`]) and appends the JSON lines.
//!
//! Sizes parse as nccl-tests' (`-b 8 -e 64M -f 2`, [`sizes`]), or come as a
//! list (`--sizes 8,1M,64M`). barrier moves no data ([`spec::moves_data`]):
//! it runs one row of size 0 whatever the sizes say, in its one form, with
//! nothing to check. The other options follow nccl-tests' where
//! they fit a CPU library (`-d -o -r -n -w -m -a -c -z`); `-G` (CUDA graphs)
//! is refused unless 0. The exit status is 0 when every result was right,
//! 1 when a result was wrong or a rank failed, 2 for bad arguments.

mod bench;
mod check;
#[cfg(feature = "cuda")]
mod device;
mod parent;
mod report;
#[cfg(test)]
mod sim;
mod sizes;
mod spec;

pub(crate) use sizes::parse_size;
mod worker;

use clap::Args;
use ringleader_core::{DType, Error, OpKind, ReduceOp};
use spec::{moves_data, Average};
use std::path::PathBuf;
use std::time::Duration;

/// The collectives `perf` measures.
const OPS: [OpKind; 7] = [
    OpKind::AllReduce,
    OpKind::AllGather,
    OpKind::ReduceScatter,
    OpKind::Broadcast,
    OpKind::Reduce,
    OpKind::AllToAll,
    OpKind::Barrier,
];

/// Exit code of a worker whose results were wrong (it ran to the end).
pub(crate) const WRONG_RESULTS: i32 = 3;

/// Arguments of `ringleader perf`. Short options follow nccl-tests'.
#[derive(Debug, Clone, Args)]
#[command(after_help = "\
Output: nccl-tests' table. Header lines start with '#' (# nThread ... minBytes ..., # Using devices \
and one line per rank: host, pid, device -1 [cpu], transport and CPU), then one line per size of \
13 fields: size count type redop root, then time algbw busbw #wrong out of place, the same four in \
place; '# Out of bounds values' and '# Avg bus bandwidth' close it. N/A marks a field not measured \
(#wrong with -c 0).

count is per rank, as nccl-tests counts it: the buffer of all_reduce, broadcast and reduce; each \
rank's input of all_gather; each rank's output of reduce_scatter; what each rank sends to each \
peer in all_to_all. size is the larger buffer in bytes (all_gather: n x count elements, the \
output; reduce_scatter: the input; all_to_all: the send buffer).

busbw = algbw x 2(n-1)/n for all_reduce; x (n-1)/n for all_gather, reduce_scatter and all_to_all; \
x 1 for broadcast and reduce.

Out of place and in place: ringleader's all_reduce, broadcast and reduce work in place, its \
all_gather, reduce_scatter and all_to_all out of place (overlapping buffers are refused). The \
other form is run the way a caller gets it, with a copy inside the timed loop: out-of-place \
all_reduce copies the send buffer into the receive buffer, then reduces in place (broadcast and \
reduce: the root copies); in-place all_gather copies the rank's slice of the output into a separate \
input; in-place reduce_scatter writes a separate output, then copies it into the rank's slice of \
the input; in-place all_to_all copies the buffer into a separate send buffer. The header names the \
emulated group. With --device cuda only the API's own form is measured; the other group prints N/A.

barrier moves no data: it runs one row, size 0 and count 0, whatever -b/-e/-f/--sizes say (they are \
ignored, not refused); algbw and busbw are 0, #wrong is N/A (there is nothing to check, as with -c 0), \
and its one form is printed in place (the out-of-place group prints N/A). -d, -o and -r do not apply \
to it; --device cuda is refused (there are no buffers to put on a GPU).

Defaults that differ from nccl-tests': -a 3 (nccl-tests: 1), -z 1 (nccl-tests: 0), -n adaptive \
(nccl-tests: 20), -w 3 (nccl-tests: 5), -b 8 -e 64M -f 2. nccl-tests' --op is the reduce op; here \
--op is the collective (nccl-tests has one program per collective) and the reduce op is -o/--redop.

Example: ringleader perf --op all_reduce --nproc 4 -b 8 -e 64M -f 2 --json results.jsonl")]
pub(crate) struct PerfArgs {
    /// The collective: all_reduce, all_gather, reduce_scatter, broadcast,
    /// reduce, all_to_all or barrier (nccl-tests' program names also:
    /// allreduce, alltoall, all_gather_perf, ...). barrier has no size: one
    /// row of size 0, -b/-e/-f/--sizes ignored.
    #[arg(long, default_value = "all_reduce", value_parser = parse_op, value_name = "OP")]
    pub(crate) op: OpKind,

    /// Ranks to start on this host.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub(crate) nproc: usize,

    /// Smallest size in bytes (K, M, G suffixes: powers of 1024); ignored
    /// by barrier, as are -e, -f and --sizes.
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = sizes::parse_size, value_name = "SIZE")]
    pub(crate) min_bytes: u64,

    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = sizes::parse_size, value_name = "SIZE")]
    pub(crate) max_bytes: u64,

    /// Each size is this many times the one before.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2, value_name = "F")]
    pub(crate) step_factor: u64,

    /// These sizes instead of -b/-e/-f, comma-separated (`8,1M,64M`): the
    /// points of a comparison that no single step factor reaches.
    #[arg(long, value_delimiter = ',', value_parser = sizes::parse_size, value_name = "LIST",
          conflicts_with_all = ["min_bytes", "max_bytes", "step_factor"])]
    pub(crate) sizes: Vec<u64>,

    /// Element type: float, double, half, bfloat16, int8, uint8, int32,
    /// int64 (nccl-tests' names), or f32, f64, f16, bf16, i8, u8, i32, i64.
    #[arg(short = 'd', long, visible_alias = "datatype", default_value = "f32", value_parser = parse_dtype,
          value_name = "TYPE")]
    pub(crate) dtype: DType,

    /// Reduce op of all_reduce, reduce_scatter and reduce: sum, prod, min,
    /// max, avg (nccl-tests' -o).
    #[arg(short = 'o', long, default_value = "sum", value_parser = parse_redop, value_name = "OP")]
    pub(crate) redop: ReduceOp,

    /// Root of broadcast and reduce.
    #[arg(short = 'r', long, default_value_t = 0, value_name = "RANK")]
    pub(crate) root: usize,

    /// Timed iterations per size and column group [default: adaptive,
    /// about 0.3 s each, 5 to 1000].
    #[arg(short = 'n', long, value_name = "I")]
    pub(crate) iters: Option<usize>,

    /// Warm-up iterations per size and column group.
    #[arg(short = 'w', long, visible_alias = "warmup_iters", default_value_t = 3, value_name = "W")]
    pub(crate) warmup: usize,

    /// Operations per iteration (nccl-tests' aggregated iterations): issued
    /// back to back; the time is per operation. Without blocking (-z 0)
    /// each is in flight at once on buffers of its own.
    #[arg(short = 'm', long = "agg_iters", visible_alias = "agg-iters", default_value_t = 1, value_name = "M")]
    pub(crate) agg_iters: usize,

    /// Check the results: 0 off (#wrong prints N/A), N: N checked
    /// iterations per size and column group, on fresh inputs.
    #[arg(short = 'c', long, default_value_t = 1, value_name = "N")]
    pub(crate) check: usize,

    /// How the ranks' times combine: 0 rank 0's, 1 the mean, 2 the fastest
    /// rank's, 3 the slowest rank's (nccl-tests' default is 1).
    #[arg(short = 'a', long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(0..=3),
          value_name = "0-3")]
    pub(crate) average: u8,

    /// 1: each operation completes (a blocking call) before the next
    /// starts; 0: each iteration submits its -m operations through the
    /// asynchronous API, then waits for them (nccl-tests' default is 0).
    #[arg(short = 'z', long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1),
          value_name = "0|1")]
    pub(crate) blocking: u8,

    /// CUDA graph launches (nccl-tests' -G): only 0 is accepted; ringleader
    /// runs its collectives on the CPU, so there is no graph to capture.
    #[arg(short = 'G', long, default_value_t = 0, value_name = "0")]
    pub(crate) cudagraph: u32,

    /// Append one JSON line per size to FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,

    /// Data-plane transport: tcp, shm or auto (RINGLEADER_TRANSPORT).
    #[arg(long, default_value = "auto", value_parser = ["tcp", "shm", "auto"], value_name = "T")]
    pub(crate) transport: String,

    /// Where the buffers live: cpu (host memory) or cuda (device memory,
    /// rank r on GPU LOCAL_RANK % GPUs; NCCL runs the same sizes when every
    /// rank has a GPU of its own). cuda needs a build with the `cuda` feature.
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"], value_name = "D")]
    pub(crate) device: String,

    /// Stop everything after this many seconds.
    #[arg(long, default_value = "600", value_parser = crate::launch::parse_secs, value_name = "SECS")]
    pub(crate) time_limit: Duration,

    /// Run as one rank (set by the parent).
    #[arg(long, hide = true)]
    pub(crate) worker: bool,
}

/// The collective named `s`: ringleader's name, or nccl-tests' (its
/// programs are `all_reduce_perf`, `alltoall_perf`, ...; underscores,
/// case and the `_perf` suffix do not matter).
fn parse_op(s: &str) -> Result<OpKind, String> {
    let squash = |n: &str| n.to_ascii_lowercase().trim_end_matches("_perf").replace('_', "");
    if let Some(op) = OPS.into_iter().find(|o| squash(o.name()) == squash(s)) {
        return Ok(op);
    }
    let names: Vec<&str> = OPS.iter().map(|o| o.name()).collect();
    let mut msg = format!("{s:?} is not one of {}", names.join(", "));
    if ReduceOp::parse(s).is_some() {
        msg += "; --op names the collective here (nccl-tests has one program per collective): the reduce \
                op is -o/--redop";
    }
    Err(msg)
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    DType::parse(s).ok_or_else(|| {
        let mut msg = format!(
            "{s:?} is not one of float, double, half, bfloat16, int8, uint8, int32, int64 \
             (or f32, f64, f16, bf16, i8, u8, i32, i64)"
        );
        let l = s.to_ascii_lowercase();
        if ["uint32", "uint64", "u32", "u64", "f8e4m3", "f8e5m2", "fp8_e4m3", "fp8_e5m2", "all"].contains(&l.as_str()) {
            msg += "; nccl-tests has it, ringleader's collectives do not";
        }
        msg
    })
}

fn parse_redop(s: &str) -> Result<ReduceOp, String> {
    ReduceOp::parse(s).ok_or_else(|| format!("{s:?} is not one of sum, prod, min, max, avg"))
}

impl PerfArgs {
    /// Checks what clap cannot: the values against each other.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.nproc == 0 {
            return Err(Error::invalid("--nproc", "must be at least 1"));
        }
        if self.root >= self.nproc {
            return Err(Error::invalid(
                "--root",
                format!("{} is not a rank of {} (ranks count from 0)", self.root, self.nproc),
            ));
        }
        // barrier ignores the sizes, so it does not judge them either.
        if moves_data(self.op) && self.min_bytes > self.max_bytes {
            return Err(Error::invalid(
                "-b/--minbytes",
                format!("{} is more than -e/--maxbytes {}", self.min_bytes, self.max_bytes),
            ));
        }
        if moves_data(self.op) && self.step_factor < 2 && self.min_bytes < self.max_bytes {
            return Err(Error::invalid("-f/--stepfactor", "must be at least 2"));
        }
        if self.iters == Some(0) {
            return Err(Error::invalid("-n/--iters", "must be at least 1"));
        }
        if self.agg_iters == 0 {
            return Err(Error::invalid("-m/--agg_iters", "must be at least 1"));
        }
        if self.cudagraph != 0 {
            return Err(Error::invalid(
                "-G/--cudagraph",
                format!(
                    "{} graph launches asked for, but CUDA graphs capture GPU kernel launches and ringleader runs \
                     its collectives on the CPU (with --device cuda too: it stages device buffers through host \
                     memory), so there is nothing to capture; leave -G out or pass -G 0",
                    self.cudagraph
                ),
            ));
        }
        if self.device == "cuda" && !cfg!(feature = "cuda") {
            return Err(Error::invalid(
                "--device",
                "cuda needs a ringleader built with the `cuda` feature (cargo build --release -p ringleader-cli --features cuda)",
            ));
        }
        if self.device == "cuda" && !moves_data(self.op) {
            return Err(Error::invalid(
                "--device",
                format!(
                    "{} moves no data, so there are no buffers to put on a GPU: leave --device out",
                    self.op.name()
                ),
            ));
        }
        Ok(())
    }

    /// The sizes to measure, smallest first: `--sizes` if given (each once),
    /// else `-b`/`-e`/`-f`; for barrier, which has no size, the one row of
    /// size 0.
    fn size_list(&self) -> Vec<u64> {
        if !moves_data(self.op) {
            return vec![0];
        }
        if self.sizes.is_empty() {
            return sizes::size_steps(self.min_bytes, self.max_bytes, self.step_factor);
        }
        let mut list = self.sizes.clone();
        list.sort_unstable();
        list.dedup();
        list
    }

    /// The header's `minBytes`, `maxBytes` and step factor (`None` for a
    /// `--sizes` list, and for barrier's list of one size, 0).
    fn sweep(&self) -> (u64, u64, Option<u64>) {
        if !moves_data(self.op) {
            return (0, 0, None);
        }
        match (self.sizes.iter().min(), self.sizes.iter().max()) {
            (Some(&lo), Some(&hi)) => (lo, hi, None),
            _ => (self.min_bytes, self.max_bytes, Some(self.step_factor)),
        }
    }

    /// The benchmark the workers run.
    pub(crate) fn spec(&self) -> spec::Spec {
        spec::Spec {
            op: self.op,
            dtype: self.dtype,
            redop: self.redop,
            root: self.root,
            sizes: self.size_list(),
            iters: self.iters,
            warmup: self.warmup,
            agg_iters: self.agg_iters,
            blocking: self.blocking == 1,
            // Nothing to check where no data moves: #wrong prints N/A, as with -c 0.
            check: if moves_data(self.op) { self.check } else { 0 },
            average: Average::from_code(self.average).unwrap_or(Average::Max),
        }
    }
}

/// Runs `ringleader perf` (parent or worker); returns the process exit code.
pub(crate) fn run(args: PerfArgs) -> i32 {
    if let Err(e) = args.validate() {
        eprintln!("ringleader perf: error: {e}");
        return crate::error::CliError::from(e).exit_code();
    }
    if args.worker {
        worker::run(&args)
    } else {
        parent::run(&args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        perf: PerfArgs,
    }

    fn parse(args: &[&str]) -> Result<PerfArgs, String> {
        let mut all = vec!["perf"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).map(|c| c.perf).map_err(|e| e.to_string())
    }

    #[test]
    fn nccl_tests_style_options() {
        let a = parse(&[
            "--op",
            "reduce_scatter",
            "--nproc",
            "4",
            "-b",
            "1K",
            "-e",
            "1M",
            "-f",
            "4",
            "-d",
            "bf16",
            "-o",
            "max",
            "-n",
            "7",
            "-w",
            "1",
        ])
        .unwrap();
        assert_eq!(a.op, OpKind::ReduceScatter);
        assert_eq!((a.min_bytes, a.max_bytes, a.step_factor), (1024, 1 << 20, 4));
        assert_eq!((a.dtype, a.redop, a.iters, a.warmup), (DType::BF16, ReduceOp::Max, Some(7), 1));
        assert_eq!(a.spec().sizes, [1024, 4096, 16384, 65536, 262144, 1048576]);
        assert!(a.validate().is_ok());
        let d = parse(&[]).unwrap();
        assert_eq!(d.spec().sizes.len(), 24, "8 B to 64 MiB by 2");
        assert_eq!((d.op, d.nproc, d.min_bytes, d.max_bytes), (OpKind::AllReduce, 2, 8, 64 << 20));
        assert_eq!((d.iters, d.warmup, d.transport.as_str(), d.device.as_str()), (None, 3, "auto", "cpu"));
        let g = parse(&["--device", "cuda"]).unwrap();
        assert_eq!(g.device, "cuda");
        assert_eq!(g.validate().is_ok(), cfg!(feature = "cuda"));
        assert!(parse(&["--device", "rocm"]).is_err());
    }

    #[test]
    fn a_size_list_replaces_the_sweep() {
        let a = parse(&["--sizes", "64M,8,1M,8"]).unwrap();
        assert_eq!(a.spec().sizes, [8, 1 << 20, 64 << 20], "sorted, each once");
        assert!(a.validate().is_ok());
        assert!(parse(&["--sizes", "8,1X"]).unwrap_err().contains("1X"));
        for sweep in [&["-b", "8"][..], &["-e", "1M"], &["-f", "4"]] {
            let e = parse(&[&["--sizes", "8,1M"][..], sweep].concat()).unwrap_err();
            assert!(e.contains("--sizes"), "{sweep:?}: {e}");
        }
    }

    #[test]
    fn nccl_tests_flags_and_names() {
        let d = parse(&[]).unwrap();
        let s = d.spec();
        assert_eq!((s.agg_iters, s.blocking, s.check, s.average), (1, true, 1, Average::Max));
        assert_eq!(d.cudagraph, 0);
        let a = parse(&["-m", "4", "-z", "0", "-c", "0", "-a", "1", "-G", "0"]).unwrap();
        let s = a.spec();
        assert_eq!((s.agg_iters, s.blocking, s.check, s.average), (4, false, 0, Average::Mean));
        assert!(a.validate().is_ok());
        let long = parse(&[
            "--agg_iters",
            "2",
            "--blocking",
            "1",
            "--check",
            "3",
            "--average",
            "2",
            "--datatype",
            "double",
            "--warmup_iters",
            "7",
            "--cudagraph",
            "0",
        ])
        .unwrap();
        assert_eq!((long.agg_iters, long.blocking, long.check, long.average), (2, 1, 3, 2));
        assert_eq!((long.dtype, long.warmup), (DType::F64, 7));
        // nccl-tests' type names and ringleader's.
        for (names, dtype) in [
            (["float", "f32"], DType::F32),
            (["double", "f64"], DType::F64),
            (["half", "f16"], DType::F16),
            (["bfloat16", "bf16"], DType::BF16),
            (["int8", "i8"], DType::I8),
            (["uint8", "u8"], DType::U8),
            (["int32", "i32"], DType::I32),
            (["int64", "i64"], DType::I64),
        ] {
            for n in names {
                assert_eq!(parse(&["-d", n]).unwrap().dtype, dtype, "{n}");
            }
        }
        for (name, op) in [
            ("allreduce", OpKind::AllReduce),
            ("all_reduce_perf", OpKind::AllReduce),
            ("alltoall", OpKind::AllToAll),
            ("AllGather", OpKind::AllGather),
            ("reduce_scatter_perf", OpKind::ReduceScatter),
            ("broadcast", OpKind::Broadcast),
            ("reduce", OpKind::Reduce),
        ] {
            assert_eq!(parse(&["--op", name]).unwrap().op, op, "{name}");
        }
        for redop in ["sum", "prod", "min", "max", "avg"] {
            assert_eq!(parse(&["-o", redop]).unwrap().redop.name(), redop);
        }
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(parse(&["--op", "send"]).unwrap_err().contains("barrier"), "the message lists every op");
        assert!(parse(&["--op", "monitored_barrier"]).is_err());
        // nccl-tests' --op is the reduce op: say where that went.
        assert!(parse(&["--op", "max"]).unwrap_err().contains("-o/--redop"));
        assert!(parse(&["-d", "f8"]).is_err());
        assert!(parse(&["-d", "uint64"]).unwrap_err().contains("ringleader's collectives do not"));
        assert!(parse(&["-b", "8X"]).is_err());
        assert!(parse(&["--transport", "rdma"]).is_err());
        assert!(parse(&["-a", "4"]).is_err());
        assert!(parse(&["-z", "2"]).is_err());
        for (args, what) in [
            (&["--nproc", "0"][..], "--nproc"),
            (&["--root", "2"][..], "--root"),
            (&["-b", "64", "-e", "8"][..], "--minbytes"),
            (&["-f", "1"][..], "--stepfactor"),
            (&["-n", "0"][..], "--iters"),
            (&["-m", "0"][..], "--agg_iters"),
            (&["-G", "1"][..], "nothing to capture"),
        ] {
            let e = parse(args).unwrap().validate().unwrap_err().to_string();
            assert!(e.contains(what), "{args:?}: {e}");
        }
        assert!(parse(&["-f", "1", "-b", "8", "-e", "8"]).unwrap().validate().is_ok());
    }

    #[test]
    fn barrier_parses_and_runs_one_row_whatever_the_sizes() {
        for name in ["barrier", "Barrier", "barrier_perf"] {
            assert_eq!(parse(&["--op", name]).unwrap().op, OpKind::Barrier, "{name}");
        }
        // The sizes are ignored, not refused, even ones that would be for
        // another op; -c asks for nothing to check.
        for sizes in [&[][..], &["--sizes", "8,1M"], &["-b", "64", "-e", "8"], &["-b", "8", "-e", "1M", "-f", "1"]] {
            let a = parse(&[&["--op", "barrier", "-c", "3"][..], sizes].concat()).unwrap();
            assert!(a.validate().is_ok(), "{sizes:?}");
            let s = a.spec();
            assert_eq!((s.op, s.sizes.as_slice(), s.check), (OpKind::Barrier, &[0u64][..], 0), "{sizes:?}");
            assert_eq!(a.sweep(), (0, 0, None), "{sizes:?}");
        }
        // No buffers to put on a GPU.
        let e = parse(&["--op", "barrier", "--device", "cuda"]).unwrap().validate().unwrap_err().to_string();
        assert!(e.contains("--device"), "{e}");
        if cfg!(feature = "cuda") {
            assert!(e.contains("moves no data"), "{e}");
        }
        // Every other op keeps -c.
        assert_eq!(parse(&["--op", "broadcast", "-c", "3"]).unwrap().spec().check, 3);
    }

    #[test]
    fn the_header_sweep_is_the_list_or_the_range() {
        assert_eq!(parse(&["-b", "1K", "-e", "1M", "-f", "4"]).unwrap().sweep(), (1024, 1 << 20, Some(4)));
        assert_eq!(parse(&["--sizes", "1M,8"]).unwrap().sweep(), (8, 1 << 20, None));
    }
}
