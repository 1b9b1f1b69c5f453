//! A set of block ids as a bitset over the pool, for duplicate checks in O(n) with no
//! allocation per call.

use crate::types::BlockId;

/// Empty between calls: [`IdSet::first_repeat`] clears what it sets.
#[derive(Debug, Clone)]
pub struct IdSet {
    words: Vec<u64>,
}

impl IdSet {
    /// A set for ids `0..n`.
    pub fn new(n: usize) -> Self {
        Self {
            words: vec![0; n.div_ceil(64)],
        }
    }

    /// The first id that `ids` yields twice, if any; the ids must be below `n`.
    pub fn first_repeat(&mut self, ids: impl Iterator<Item = BlockId> + Clone) -> Option<BlockId> {
        let mut repeat = None;
        let mut inserted = 0;
        for b in ids.clone() {
            let (w, bit) = (b as usize / 64, 1u64 << (b % 64));
            if self.words[w] & bit != 0 {
                repeat = Some(b);
                break;
            }
            self.words[w] |= bit;
            inserted += 1;
        }
        for b in ids.take(inserted) {
            self.words[b as usize / 64] &= !(1u64 << (b % 64));
        }
        repeat
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_first_repeat_and_stays_empty() {
        let mut s = IdSet::new(130);
        assert_eq!(s.first_repeat([1u32, 64, 129, 0].into_iter()), None);
        assert_eq!(s.first_repeat([5u32, 7, 5, 7].into_iter()), Some(5));
        assert_eq!(s.first_repeat([7u32, 5, 129, 129].into_iter()), Some(129));
        assert!(s.words.iter().all(|&w| w == 0));
    }
}
