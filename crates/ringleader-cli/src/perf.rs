//! `ringleader perf`: an nccl-tests-style benchmark over N local ranks that
//! it starts itself (docs/DESIGN.md §3, §4).
//!
//! The command plays two parts:
//! - the **parent** ([`parent`]) hosts a ringleader store in-process, as
//!   `ringleader launch` does, and starts N copies of its own executable as
//!   hidden workers (`ringleader perf ... --worker`) with the torchrun
//!   environment; it forwards their output, enforces an overall time limit,
//!   and names the rank that failed, how, and what it last printed;
//! - each **worker** ([`worker`]) joins with `Communicator::from_env()` and
//!   runs the benchmark loop ([`bench`](mod@bench)): per size, warm-up, barrier, timed
//!   calls, the slowest rank's mean time (all_reduce max), then one checked
//!   call on fresh inputs ([`check`]) whose wrong elements are summed over
//!   the ranks. Rank 0 prints nccl-tests' table ([`report`]) and appends
//!   the JSON lines.
//!
//! Sizes parse as nccl-tests' (`-b 8 -e 64M -f 2`, [`sizes`]), or come as a
//! list (`--sizes 8,1M,64M`). The exit status is 0 when every result was
//! right, 1 when a result was wrong or a rank failed, 2 for bad arguments.

mod bench;
mod check;
#[cfg(feature = "cuda")]
mod device;
mod parent;
mod report;
#[cfg(test)]
mod sim;
mod sizes;
mod worker;

use clap::Args;
use ringleader_core::{DType, Error, OpKind, ReduceOp};
use std::path::PathBuf;
use std::time::Duration;

/// The collectives `perf` measures.
const OPS: [OpKind; 6] =
    [OpKind::AllReduce, OpKind::AllGather, OpKind::ReduceScatter, OpKind::Broadcast, OpKind::Reduce, OpKind::AllToAll];

/// Exit code of a worker whose results were wrong (it ran to the end).
pub(crate) const WRONG_RESULTS: i32 = 3;

/// Arguments of `ringleader perf`. Short options follow nccl-tests'.
#[derive(Debug, Clone, Args)]
#[command(after_help = "\
busbw = algbw x 2(n-1)/n for all_reduce; x (n-1)/n for all_gather, reduce_scatter and \
all_to_all (size: the total output of all_gather, the total input of reduce_scatter, the \
send buffer of all_to_all); x 1 for broadcast and reduce. time = mean per call on the \
slowest rank.

Example: ringleader perf --op all_reduce --nproc 4 -b 8 -e 64M -f 2 --json results.jsonl")]
pub(crate) struct PerfArgs {
    /// The collective: all_reduce, all_gather, reduce_scatter, broadcast,
    /// reduce or all_to_all.
    #[arg(long, default_value = "all_reduce", value_parser = parse_op, value_name = "OP")]
    pub(crate) op: OpKind,

    /// Ranks to start on this host.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub(crate) nproc: usize,

    /// Smallest size in bytes (K, M, G suffixes: powers of 1024).
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

    /// Element type: f32, f64, f16, bf16, i8, u8, i32, i64.
    #[arg(short = 'd', long, default_value = "f32", value_parser = parse_dtype, value_name = "TYPE")]
    pub(crate) dtype: DType,

    /// Reduce op of all_reduce, reduce_scatter and reduce: sum, prod, min,
    /// max, avg.
    #[arg(short = 'o', long, default_value = "sum", value_parser = parse_redop, value_name = "OP")]
    pub(crate) redop: ReduceOp,

    /// Root of broadcast and reduce.
    #[arg(short = 'r', long, default_value_t = 0, value_name = "RANK")]
    pub(crate) root: usize,

    /// Timed calls per size [default: adaptive, about 0.3 s per size, 5 to 1000].
    #[arg(short = 'n', long, value_name = "I")]
    pub(crate) iters: Option<usize>,

    /// Warm-up calls per size.
    #[arg(short = 'w', long, default_value_t = 3, value_name = "W")]
    pub(crate) warmup: usize,

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

fn parse_op(s: &str) -> Result<OpKind, String> {
    OpKind::parse(s).filter(|op| OPS.contains(op)).ok_or_else(|| {
        let names: Vec<&str> = OPS.iter().map(|o| o.name()).collect();
        format!("{s:?} is not one of {}", names.join(", "))
    })
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    DType::parse(s).ok_or_else(|| format!("{s:?} is not one of f32, f64, f16, bf16, i8, u8, i32, i64"))
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
        if self.min_bytes > self.max_bytes {
            return Err(Error::invalid(
                "-b/--minbytes",
                format!("{} is more than -e/--maxbytes {}", self.min_bytes, self.max_bytes),
            ));
        }
        if self.step_factor < 2 && self.min_bytes < self.max_bytes {
            return Err(Error::invalid("-f/--stepfactor", "must be at least 2"));
        }
        if self.iters == Some(0) {
            return Err(Error::invalid("-n/--iters", "must be at least 1"));
        }
        if self.device == "cuda" && !cfg!(feature = "cuda") {
            return Err(Error::invalid(
                "--device",
                "cuda needs a ringleader built with the `cuda` feature (cargo build --release -p ringleader-cli --features cuda)",
            ));
        }
        Ok(())
    }

    /// The sizes to measure, smallest first: `--sizes` if given (each once),
    /// else `-b`/`-e`/`-f`.
    fn size_list(&self) -> Vec<u64> {
        if self.sizes.is_empty() {
            return sizes::size_steps(self.min_bytes, self.max_bytes, self.step_factor);
        }
        let mut list = self.sizes.clone();
        list.sort_unstable();
        list.dedup();
        list
    }

    /// The benchmark the workers run.
    pub(crate) fn spec(&self) -> bench::Spec {
        bench::Spec {
            op: self.op,
            dtype: self.dtype,
            redop: self.redop,
            root: self.root,
            sizes: self.size_list(),
            iters: self.iters,
            warmup: self.warmup,
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
    fn bad_values_are_refused() {
        assert!(parse(&["--op", "barrier"]).unwrap_err().contains("all_to_all"));
        assert!(parse(&["--op", "send"]).is_err());
        assert!(parse(&["-d", "f8"]).is_err());
        assert!(parse(&["-b", "8X"]).is_err());
        assert!(parse(&["--transport", "rdma"]).is_err());
        for (args, what) in [
            (&["--nproc", "0"][..], "--nproc"),
            (&["--root", "2"][..], "--root"),
            (&["-b", "64", "-e", "8"][..], "--minbytes"),
            (&["-f", "1"][..], "--stepfactor"),
            (&["-n", "0"][..], "--iters"),
        ] {
            let e = parse(args).unwrap().validate().unwrap_err().to_string();
            assert!(e.contains(what), "{args:?}: {e}");
        }
        assert!(parse(&["-f", "1", "-b", "8", "-e", "8"]).unwrap().validate().is_ok());
    }
}
