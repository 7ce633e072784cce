//! Message sizes the way nccl-tests takes them (`-b 8 -e 64M -f 2`), and
//! the buffer shapes each collective needs for a size.

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

/// The buffers one rank needs for one size, and what the table reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Elements in this rank's input (the in-place buffer for all_reduce,
    /// broadcast and reduce).
    pub(crate) in_len: usize,
    /// Elements in this rank's output (0 for the in-place ops).
    pub(crate) out_len: usize,
    /// Elements reported in the count column: the buffer for the in-place
    /// ops, the total output of all_gather, the total input of
    /// reduce_scatter, the send buffer of all_to_all.
    pub(crate) count: u64,
    /// Bytes reported (and used for algbw): `count` elements.
    pub(crate) bytes: u64,
}

impl Shape {
    /// The shape of `op` over `n` ranks for a requested size of `bytes`
    /// (rounded down to whole elements, and to a multiple of `n` elements
    /// where the data is split among ranks); `None` when that leaves no
    /// element.
    pub(crate) fn of(op: OpKind, bytes: u64, elem_size: usize, n: usize) -> Option<Shape> {
        let elems = bytes / elem_size as u64;
        let per_rank = elems / n as u64;
        let (in_len, out_len, count) = match op {
            OpKind::AllGather => (per_rank, per_rank * n as u64, per_rank * n as u64),
            OpKind::ReduceScatter => (per_rank * n as u64, per_rank, per_rank * n as u64),
            OpKind::AllToAll => (per_rank * n as u64, per_rank * n as u64, per_rank * n as u64),
            _ => (elems, 0, elems),
        };
        (count > 0).then_some(Shape {
            in_len: usize::try_from(in_len).ok()?,
            out_len: usize::try_from(out_len).ok()?,
            count,
            bytes: count * elem_size as u64,
        })
    }

    /// Elements per rank's chunk for the ops that split data among ranks.
    pub(crate) fn per_rank(&self, n: usize) -> usize {
        self.count as usize / n
    }
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
    fn shapes() {
        let s = Shape::of(OpKind::AllReduce, 10, 4, 3).unwrap();
        assert_eq!((s.in_len, s.out_len, s.count, s.bytes), (2, 0, 2, 8));
        let s = Shape::of(OpKind::AllGather, 64, 4, 3).unwrap();
        assert_eq!((s.in_len, s.out_len, s.count, s.bytes), (5, 15, 15, 60));
        assert_eq!(s.per_rank(3), 5);
        let s = Shape::of(OpKind::ReduceScatter, 64, 4, 3).unwrap();
        assert_eq!((s.in_len, s.out_len, s.count), (15, 5, 15));
        let s = Shape::of(OpKind::AllToAll, 64, 4, 2).unwrap();
        assert_eq!((s.in_len, s.out_len, s.count), (16, 16, 16));
        assert_eq!(Shape::of(OpKind::AllGather, 8, 4, 4), None);
        assert_eq!(Shape::of(OpKind::Broadcast, 2, 4, 1), None);
    }
}
