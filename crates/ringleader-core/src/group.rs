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
//! [`fmt_rank_ranges`] writes rank lists as ranges (`ranks 0-36, 38-63`), so
//! a list of ranks reads the same at 4 and at 16,000 ranks.

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
        write!(f, "group {} ({})", self.name, fmt_rank_ranges(&sorted))
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

/// Writes ranks as ranges: `[0, 1, 2, 5]` is `ranks 0-2, 5`, `[3]` is
/// `rank 3`. Runs of consecutive ranks become one range; the order given is
/// kept otherwise (sort first for the canonical form).
///
/// ```
/// use ringleader_core::group::fmt_rank_ranges;
/// assert_eq!(fmt_rank_ranges(&[0, 1, 2, 5]), "ranks 0-2, 5");
/// assert_eq!(fmt_rank_ranges(&[3]), "rank 3");
/// assert_eq!(fmt_rank_ranges(&[4, 5]), "ranks 4, 5");
/// ```
pub fn fmt_rank_ranges(ranks: &[Rank]) -> String {
    let mut s = String::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        if !s.is_empty() {
            s.push_str(", ");
        }
        // Two neighbours read better as a list than as a range.
        match j - i {
            0 => write!(s, "{}", ranks[i]),
            1 => write!(s, "{}, {}", ranks[i], ranks[j]),
            _ => write!(s, "{}-{}", ranks[i], ranks[j]),
        }
        .expect("writing to a String");
        i = j + 1;
    }
    match ranks.len() {
        1 => format!("rank {s}"),
        _ => format!("ranks {s}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_every_shape() {
        assert_eq!(fmt_rank_ranges(&[]), "ranks ");
        assert_eq!(fmt_rank_ranges(&[0, 1, 2, 3]), "ranks 0-3");
        assert_eq!(fmt_rank_ranges(&[0, 2, 4]), "ranks 0, 2, 4");
        let big: Vec<Rank> = (0..37).chain(38..64).collect();
        assert_eq!(fmt_rank_ranges(&big), "ranks 0-36, 38-63");
    }

    #[test]
    fn unknown_group_ranks_keep_their_number() {
        let g = Group::new("x", vec![7]);
        assert_eq!(g.global(0), 7);
        assert_eq!(g.global(5), 5);
    }
}
