//! Send/recv deadlocks as a wait-for graph.
//!
//! Every rank blocked in point-to-point operations waits for particular
//! peers: a receive from rank 1 waits for rank 1 to send, a send to rank 1
//! waits for rank 1 to receive. A wait whose peer has the matching operation
//! pending (rank 1 sends to us while we receive from it) is data in flight,
//! not a dependency on the peer's program; every other wait is an edge of
//! the graph. Following the edges from a waiting rank ends either back at a
//! rank already on the path (a cycle: every rank on it waits for the next,
//! none can move) or at a rank that waits for nobody (outside any operation,
//! in a collective, or dead): the end of the chain is the rank to look at.
//!
//! Pure: the verdict engine ([`crate::verdict()`]) fills in what each rank is
//! doing and words the result.

use ringleader_core::{OpKind, Rank};

/// One wait of a rank, in global ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// `send` or `recv`.
    pub op: OpKind,
    /// The peer waited for.
    pub peer: Rank,
    /// The operation's per-peer sequence number.
    pub seq: u64,
}

impl Wait {
    /// `waits to receive from rank 1` or `waits to send to rank 1`.
    pub fn words(&self) -> String {
        match self.op {
            OpKind::Send => format!("waits to send to rank {}", self.peer),
            _ => format!("waits to receive from rank {}", self.peer),
        }
    }

    /// Whether `other`, a wait of rank `peer_of_other`, is the operation
    /// that completes this wait of rank `me`.
    fn matched_by(&self, me: Rank, other: &Wait) -> bool {
        other.peer == me && other.op != self.op && other.op.is_p2p()
    }
}

/// What the graph found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// Each rank waits for the next, the last for the first; starts at its
    /// lowest rank.
    Cycle(Vec<(Rank, Wait)>),
    /// Each rank waits for the next; `end` waits for nobody.
    Chain {
        /// The ranks that wait, in order, each with its wait.
        path: Vec<(Rank, Wait)>,
        /// The rank the last one waits for.
        end: Rank,
    },
}

impl Finding {
    /// `rank 0 waits to receive from rank 1, which waits to receive from
    /// rank 0`: the path in words (for a chain, up to its end rank, whose
    /// state the caller adds).
    pub fn words(&self) -> String {
        let path = match self {
            Finding::Cycle(p) => p,
            Finding::Chain { path, .. } => path,
        };
        let mut s = String::new();
        for (i, (rank, wait)) in path.iter().enumerate() {
            if i == 0 {
                s += &format!("rank {rank} {}", wait.words());
            } else {
                s += &format!(", which {}", wait.words());
            }
        }
        s
    }

    /// The same finding with every rank renamed by `global` (group ranks
    /// to global ones).
    pub fn renamed(self, global: impl Fn(Rank) -> Rank) -> Finding {
        let rename = |p: Vec<(Rank, Wait)>| -> Vec<(Rank, Wait)> {
            p.into_iter().map(|(r, w)| (global(r), Wait { peer: global(w.peer), ..w })).collect()
        };
        match self {
            Finding::Cycle(p) => Finding::Cycle(rename(p)),
            Finding::Chain { path, end } => Finding::Chain { path: rename(path), end: global(end) },
        }
    }

    /// The ranks to blame: every rank of a cycle, the end of a chain.
    pub fn culprits(&self) -> Vec<Rank> {
        match self {
            Finding::Cycle(p) => {
                let mut r: Vec<Rank> = p.iter().map(|(r, _)| *r).collect();
                r.sort_unstable();
                r
            }
            Finding::Chain { end, .. } => vec![*end],
        }
    }
}

/// Builds the wait-for graph of `waits` (per global rank, oldest first; an
/// empty list: the rank waits in no send or receive) and follows it from the
/// lowest rank with a wait that no peer matches. `None` when no rank waits
/// for a peer's program (nothing to report, or only data in flight).
///
/// ```
/// use ringleader_core::OpKind;
/// use ringleader_diag::deadlock::{find, Finding, Wait};
/// let recv = |peer| vec![Wait { op: OpKind::Recv, peer, seq: 1 }];
/// let f = find(&[recv(1), recv(0)]).unwrap();
/// assert!(matches!(f, Finding::Cycle(_)));
/// assert_eq!(f.words(), "rank 0 waits to receive from rank 1, which waits to receive from rank 0");
/// ```
pub fn find(waits: &[Vec<Wait>]) -> Option<Finding> {
    // The edge out of each rank: its oldest wait that the peer does not
    // match.
    let edge = |r: Rank| -> Option<Wait> {
        waits.get(r)?.iter().copied().find(|w| {
            let theirs = waits.get(w.peer).map(Vec::as_slice).unwrap_or_default();
            !theirs.iter().any(|o| w.matched_by(r, o))
        })
    };
    let start = (0..waits.len()).find(|&r| edge(r).is_some())?;
    let mut path: Vec<(Rank, Wait)> = Vec::new();
    let mut at = start;
    loop {
        if let Some(i) = path.iter().position(|(r, _)| *r == at) {
            let mut cycle = path.split_off(i);
            let low = cycle.iter().enumerate().min_by_key(|(_, (r, _))| *r).map_or(0, |(i, _)| i);
            cycle.rotate_left(low);
            return Some(Finding::Cycle(cycle));
        }
        match edge(at) {
            Some(w) => {
                path.push((at, w));
                at = w.peer;
            }
            None => return Some(Finding::Chain { path, end: at }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(op: OpKind, peer: Rank) -> Wait {
        Wait { op, peer, seq: 1 }
    }

    #[test]
    fn two_ranks_receiving_first_are_a_cycle() {
        let f = find(&[vec![w(OpKind::Recv, 1)], vec![w(OpKind::Recv, 0)]]).unwrap();
        assert_eq!(f.words(), "rank 0 waits to receive from rank 1, which waits to receive from rank 0");
        assert_eq!(f.culprits(), vec![0, 1]);
    }

    #[test]
    fn a_cycle_of_three_starts_at_its_lowest_rank_and_ignores_ranks_off_it() {
        // Rank 0 waits for rank 2, which is in the cycle 1 -> 2 -> 3 -> 1.
        let waits = vec![
            vec![w(OpKind::Recv, 2)],
            vec![w(OpKind::Send, 2)],
            vec![w(OpKind::Send, 3)],
            vec![w(OpKind::Recv, 1)],
        ];
        let f = find(&waits).unwrap();
        assert_eq!(
            f.words(),
            "rank 1 waits to send to rank 2, which waits to send to rank 3, which waits to receive from rank 1"
        );
        assert_eq!(f.culprits(), vec![1, 2, 3]);
    }

    #[test]
    fn a_chain_ends_at_the_rank_that_waits_for_nobody() {
        let waits = vec![vec![w(OpKind::Recv, 1)], vec![w(OpKind::Recv, 2)], vec![]];
        let f = find(&waits).unwrap();
        assert_eq!(f, Finding::Chain { path: vec![(0, w(OpKind::Recv, 1)), (1, w(OpKind::Recv, 2))], end: 2 });
        assert_eq!(f.words(), "rank 0 waits to receive from rank 1, which waits to receive from rank 2");
        assert_eq!(f.culprits(), vec![2]);
    }

    #[test]
    fn matched_pairs_are_data_in_flight_not_a_deadlock() {
        // Rank 0 sends to 1, which receives from 0: nothing waits for a program.
        assert_eq!(find(&[vec![w(OpKind::Send, 1)], vec![w(OpKind::Recv, 0)]]), None);
        assert_eq!(find(&[vec![], vec![]]), None);
        // A matched wait is skipped for the next, unmatched one.
        let waits = vec![vec![w(OpKind::Send, 1), w(OpKind::Recv, 1)], vec![w(OpKind::Recv, 0)]];
        let f = find(&waits).unwrap();
        assert_eq!(f.words(), "rank 0 waits to receive from rank 1");
        assert_eq!(f.culprits(), vec![1]);
    }

    #[test]
    fn waits_on_ranks_outside_the_world_end_the_chain() {
        let f = find(&[vec![w(OpKind::Recv, 5)]]).unwrap();
        assert_eq!(f.culprits(), vec![5]);
    }
}
