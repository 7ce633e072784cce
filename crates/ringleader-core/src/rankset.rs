//! A set of ranks, any rank number, that one thread updates and others read
//! without a lock.
//!
//! The data plane publishes whom the running operation waits for (and the
//! send/recv lane whom it has operations pending with) so that the monitor,
//! the heartbeat and the verdict can name them. A 64-bit mask did that in one
//! word but could not name rank 64 or above; this is the same idea over as
//! many words as the world needs. A writer that knows what it published last
//! updates only those bits ([`RankSet::replace`]), so its cost follows the
//! few peers an algorithm talks to, not the world size.

use crate::types::Rank;
use std::sync::atomic::{AtomicU64, Ordering};

/// Ranks `0..world`, as bits.
///
/// ```
/// use ringleader_core::RankSet;
/// let s = RankSet::new(100);
/// s.insert(3);
/// s.insert(99);
/// assert_eq!(s.ranks(), vec![3, 99]);
/// s.replace(&[3, 99], &[64]);
/// assert_eq!(s.ranks(), vec![64]);
/// assert!(s.contains(64) && !s.contains(3));
/// s.insert(1000); // beyond the world: ignored
/// assert_eq!(s.ranks(), vec![64]);
/// ```
#[derive(Debug)]
pub struct RankSet {
    words: Box<[AtomicU64]>,
}

impl RankSet {
    /// An empty set for ranks below `world`.
    pub fn new(world: usize) -> RankSet {
        RankSet { words: (0..world.div_ceil(64).max(1)).map(|_| AtomicU64::new(0)).collect() }
    }

    fn at(&self, r: Rank) -> Option<(&AtomicU64, u64)> {
        self.words.get(r / 64).map(|w| (w, 1u64 << (r % 64)))
    }

    /// Adds `r` (ranks beyond the set's world are ignored).
    pub fn insert(&self, r: Rank) {
        if let Some((w, bit)) = self.at(r) {
            w.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// Removes `r`.
    pub fn remove(&self, r: Rank) {
        if let Some((w, bit)) = self.at(r) {
            w.fetch_and(!bit, Ordering::Relaxed);
        }
    }

    /// Whether `r` is in the set.
    pub fn contains(&self, r: Rank) -> bool {
        self.at(r).is_some_and(|(w, bit)| w.load(Ordering::Relaxed) & bit != 0)
    }

    /// Replaces the ranks `old` (what the caller published last) by `new`.
    pub fn replace(&self, old: &[Rank], new: &[Rank]) {
        for &r in old {
            if !new.contains(&r) {
                self.remove(r);
            }
        }
        for &r in new {
            self.insert(r);
        }
    }

    /// Empties the set.
    pub fn clear(&self) {
        for w in self.words.iter() {
            w.store(0, Ordering::Relaxed);
        }
    }

    /// The ranks in the set, ascending.
    pub fn ranks(&self) -> Vec<Rank> {
        let mut out = Vec::new();
        for (i, w) in self.words.iter().enumerate() {
            let mut bits = w.load(Ordering::Relaxed);
            while bits != 0 {
                let b = bits.trailing_zeros() as usize;
                out.push(i * 64 + b);
                bits &= bits - 1;
            }
        }
        out
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|w| w.load(Ordering::Relaxed) == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_number_fits() {
        let s = RankSet::new(16_384);
        for r in [0, 63, 64, 127, 128, 9_999, 16_383] {
            s.insert(r);
        }
        assert_eq!(s.ranks(), vec![0, 63, 64, 127, 128, 9_999, 16_383]);
        s.replace(&[0, 63, 64], &[64, 65]);
        assert_eq!(s.ranks(), vec![64, 65, 127, 128, 9_999, 16_383]);
        s.clear();
        assert!(s.is_empty() && s.ranks().is_empty());
        assert!(RankSet::new(0).ranks().is_empty());
    }
}
