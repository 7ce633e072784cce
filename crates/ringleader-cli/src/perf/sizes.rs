//! Message sizes the way nccl-tests takes them (`-b 8 -e 64M -f 2`), and
//! the buffer shapes each collective needs for a size.

use super::spec::moves_data;
use ringleader_core::OpKind;

/// Parses a byte count with an optional binary suffix, as nccl-tests does:
/// `8`, `64K`, `64M`, `1G` (K = 2^10, M = 2^20, G = 2^30; lower case and a
/// trailing `B` or `iB` are accepted).
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).or_else(|| t.strip_suffix('b')).unwrap_or(t);
    let (digits, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        Some('T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    digits
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(|| format!("{s:?} is not a size (examples: 8, 4096, 64K, 64M, 1G)"))
}

/// The sizes from `min` to `max` (inclusive), each `factor` times the one
/// before, as nccl-tests' `-b -e -f`.
pub(crate) fn size_steps(min: u64, max: u64, factor: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut s = min;
    while s <= max {
        out.push(s);
        if factor < 2 || s == 0 {
            break;
        }
        match s.checked_mul(factor) {
            Some(next) => s = next,
            None => break,
        }
    }
    out
}

/// How one size maps onto one collective over `n` ranks, and the `size` and
/// `count` columns nccl-tests prints for it.
///
/// nccl-tests' definitions (its `getCollByteCount` per test): `count` is
/// the count argument of the collective, per rank; `size` is the larger of
/// the send and receive buffers in bytes, which is also what algbw divides
/// by. So:
///
/// | op | count (per rank) | size (bytes) |
/// |---|---|---|
/// | all_reduce, broadcast, reduce | the buffer | count x type size |
/// | all_gather | each rank's input | n x count x type size (the output) |
/// | reduce_scatter | each rank's output | n x count x type size (the input) |
/// | all_to_all | what each rank sends to each peer | n x count x type size (the send buffer) |
/// | barrier | 0 | 0 (it moves no data, whatever size was asked for) |
///
/// nccl-tests also rounds the per-rank count of the split ops down to an
/// alignment (16 bytes or 4 elements, depending on its version); this
/// rounds only to whole elements per rank, so the two differ at sizes that
/// are not a multiple of that alignment times the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Elements of the whole buffer: the buffer of all_reduce, broadcast
    /// and reduce; n x `chunk` for the others (all_gather's output,
    /// reduce_scatter's input, all_to_all's send and receive buffers).
    pub(crate) total: usize,
    /// Elements of one rank's chunk for the ops that split data among ranks
    /// (`total / n`); `total` for the others.
    pub(crate) chunk: usize,
    /// The `count` column: elements per rank, as above.
    pub(crate) count: u64,
    /// The `size` column, bytes (and what algbw divides by).
    pub(crate) bytes: u64,
}

impl Shape {
    /// The shape of `op` over `n` ranks for a requested size of `bytes`
    /// (rounded down to whole elements, and to a multiple of `n` elements
    /// where the data is split among ranks); `None` when that leaves no
    /// element. An op that moves no data (barrier) has the empty shape at
    /// every size: its one row is measured, not skipped.
    pub(crate) fn of(op: OpKind, bytes: u64, elem_size: usize, n: usize) -> Option<Shape> {
        if !moves_data(op) {
            return Some(Shape { total: 0, chunk: 0, count: 0, bytes: 0 });
        }
        let elems = bytes / elem_size as u64;
        let per_rank = elems / n.max(1) as u64;
        let (total, chunk) = if splits(op) { (per_rank * n as u64, per_rank) } else { (elems, elems) };
        (total > 0).then_some(Shape {
            total: usize::try_from(total).ok()?,
            chunk: usize::try_from(chunk).ok()?,
            count: chunk,
            bytes: total * elem_size as u64,
        })
    }
}

/// Whether `op` splits its data among the ranks (all_gather,
/// reduce_scatter, all_to_all).
pub(crate) fn splits(op: OpKind) -> bool {
    matches!(op, OpKind::AllGather | OpKind::ReduceScatter | OpKind::AllToAll)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_nccl_tests() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2MB"), Ok(2 << 20));
        assert_eq!(parse_size("2MiB"), Ok(2 << 20));
        assert!(parse_size("").is_err());
        assert!(parse_size("x").is_err());
        assert!(parse_size("-8").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn steps() {
        assert_eq!(size_steps(8, 64, 2), [8, 16, 32, 64]);
        assert_eq!(size_steps(8, 100, 4), [8, 32]);
        assert_eq!(size_steps(8, 8, 2), [8]);
        assert_eq!(size_steps(16, 8, 2), Vec::<u64>::new());
        assert_eq!(size_steps(8, 64, 1), [8]);
        assert_eq!(size_steps(1 << 62, u64::MAX, 4), [1 << 62]);
    }

    #[test]
    fn shapes_follow_nccl_tests_columns() {
        let s = Shape::of(OpKind::AllReduce, 10, 4, 3).unwrap();
        assert_eq!((s.total, s.chunk, s.count, s.bytes), (2, 2, 2, 8));
        // all_gather: count = each rank's input, size = the whole output.
        let s = Shape::of(OpKind::AllGather, 64, 4, 3).unwrap();
        assert_eq!((s.total, s.chunk, s.count, s.bytes), (15, 5, 5, 60));
        // reduce_scatter: count = each rank's output, size = the whole input.
        let s = Shape::of(OpKind::ReduceScatter, 64, 4, 3).unwrap();
        assert_eq!((s.total, s.chunk, s.count, s.bytes), (15, 5, 5, 60));
        // all_to_all: count = what goes to each peer, size = the send buffer.
        let s = Shape::of(OpKind::AllToAll, 64, 4, 2).unwrap();
        assert_eq!((s.total, s.chunk, s.count, s.bytes), (16, 8, 8, 64));
        assert_eq!(Shape::of(OpKind::AllGather, 8, 4, 4), None);
        assert_eq!(Shape::of(OpKind::Broadcast, 2, 4, 1), None);
        // barrier: size 0 and count 0 at any size asked for, never skipped.
        for bytes in [0, 8, 1 << 20] {
            let s = Shape::of(OpKind::Barrier, bytes, 4, 2).unwrap();
            assert_eq!((s.total, s.chunk, s.count, s.bytes), (0, 0, 0, 0));
        }
    }
}
