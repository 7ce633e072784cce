//! Sub-groups: a communicator over some of the job's ranks, and how its
//! ranks are named to a person.
//!
//! Frameworks train in sub-groups (FSDP shards, tensor and pipeline
//! parallelism): `torch.distributed.new_group([1, 2, 3])` makes a
//! communicator whose ranks are numbered 0, 1, 2 inside it. The algorithms
//! work with those group ranks, but a person reading a verdict thinks in the
//! job's (global) ranks, the ones in their launcher's log. So everything a
//! user reads names global ranks, and says which group it happened in: a
//! [`Group`] maps group ranks to global ranks and describes the group.
//!
//! [`fmt_ranks`] writes rank lists as ranges (`ranks 0-36, 38-63 (63
//! ranks)`), bounded, so a list of ranks reads the same at 4 and at 16,000
//! ranks.

use crate::types::Rank;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// A communicator's place in the job, when it spans only some of the ranks
/// (or numbers them differently).
///
/// ```
/// use ringleader_core::Group;
/// let g = Group::new("1", vec![1, 2, 3]);
/// assert_eq!(g.global(2), 3);
/// assert_eq!(g.to_string(), "group 1 (ranks 1-3)");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    /// The group's name (torch's group name, e.g. `"1"`, or its description).
    pub name: String,
    /// `ranks[g]` is the global rank of group rank `g`.
    pub ranks: Vec<Rank>,
}

impl Group {
    /// A group named `name` whose group rank `g` is global rank `ranks[g]`.
    pub fn new(name: impl Into<String>, ranks: Vec<Rank>) -> Group {
        Group { name: name.into(), ranks }
    }

    /// The global rank of group rank `r` (`r` itself when the group does not
    /// know it, so a number is never lost).
    pub fn global(&self, r: Rank) -> Rank {
        self.ranks.get(r).copied().unwrap_or(r)
    }

    /// The global ranks of group ranks `rs`, in the same order.
    pub fn globals(&self, rs: &[Rank]) -> Vec<Rank> {
        rs.iter().map(|&r| self.global(r)).collect()
    }
}

impl std::fmt::Display for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut sorted = self.ranks.clone();
        sorted.sort_unstable();
        write!(f, "group {} ({})", self.name, fmt_ranks(&sorted))
    }
}

/// The global rank of group rank `r` under an optional group.
///
/// ```
/// use ringleader_core::group::{global, Group};
/// assert_eq!(global(None, 2), 2);
/// assert_eq!(global(Some(&Group::new("g", vec![4, 5, 6])), 2), 6);
/// ```
pub fn global(group: Option<&Group>, r: Rank) -> Rank {
    group.map_or(r, |g| g.global(r))
}

/// At most this many ranges are written out; the rest are counted.
pub const MAX_RANGES: usize = 8;

/// Writes a set of ranks for a person, in a size that does not grow with
/// the world: sorted, runs of consecutive ranks as ranges, the number of
/// ranks when there are more than three, and at most [`MAX_RANGES`] ranges
/// (then how many more ranks there are).
///
/// ```
/// use ringleader_core::group::fmt_ranks;
/// assert_eq!(fmt_ranks(&[3]), "rank 3");
/// assert_eq!(fmt_ranks(&[4, 1]), "ranks 1, 4");
/// assert_eq!(fmt_ranks(&[0, 1, 2, 5]), "ranks 0-2, 5 (4 ranks)");
/// let ring: Vec<usize> = (0..37).chain(38..64).collect();
/// assert_eq!(fmt_ranks(&ring), "ranks 0-36, 38-63 (63 ranks)");
/// let evens: Vec<usize> = (0..4000).step_by(2).collect();
/// assert_eq!(fmt_ranks(&evens), "ranks 0, 2, 4, 6, 8, 10, 12, 14 and 1992 more (2000 ranks)");
/// ```
pub fn fmt_ranks(ranks: &[Rank]) -> String {
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut items: Vec<String> = Vec::new();
    let mut shown = 0;
    let mut i = 0;
    while i < sorted.len() && items.len() < MAX_RANGES {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        // Two neighbours read better as a list than as a range.
        match j - i {
            0 => items.push(sorted[i].to_string()),
            1 => items.extend([sorted[i].to_string(), sorted[j].to_string()]),
            _ => items.push(format!("{}-{}", sorted[i], sorted[j])),
        }
        shown += j - i + 1;
        i = j + 1;
    }
    let mut s = match sorted.len() {
        1 => format!("rank {}", items.join(", ")),
        _ => format!("ranks {}", items.join(", ")),
    };
    if shown < sorted.len() {
        let _ = write!(s, " and {} more", sorted.len() - shown);
    }
    if sorted.len() > 3 {
        let _ = write!(s, " ({} ranks)", sorted.len());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_every_shape() {
        assert_eq!(fmt_ranks(&[]), "ranks ");
        assert_eq!(fmt_ranks(&[0, 1, 2, 3]), "ranks 0-3 (4 ranks)");
        assert_eq!(fmt_ranks(&[0, 2, 4]), "ranks 0, 2, 4");
        assert_eq!(fmt_ranks(&[2, 2, 1]), "ranks 1, 2");
        let every: Vec<Rank> = (0..16384).collect();
        assert_eq!(fmt_ranks(&every), "ranks 0-16383 (16384 ranks)");
        // The size is bounded whatever the set.
        let scattered: Vec<Rank> = (0..16384).filter(|r| r % 3 != 1).collect();
        assert!(fmt_ranks(&scattered).len() < 120, "{}", fmt_ranks(&scattered));
    }

    #[test]
    fn unknown_group_ranks_keep_their_number() {
        let g = Group::new("x", vec![7]);
        assert_eq!(g.global(0), 7);
        assert_eq!(g.global(5), 5);
    }
}
