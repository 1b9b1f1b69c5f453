//! HiSparse's GPU copies of published host pages (vLLM 0.33's `HiSparseCoordinator.copies`
//! and `_copy_by_block`): a page the host published may still have readable resident
//! blocks; a later request hitting that host page can adopt them instead of reading the
//! host, until the device pool reuses one of them.

use rustc_hash::FxHashMap;

use crate::pool::HashKey;
use crate::types::BlockId;

/// Host page hash -> its resident blocks (one per resident group), and back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyIndex {
    by_hash: FxHashMap<HashKey, Vec<BlockId>>,
    by_block: FxHashMap<BlockId, HashKey>,
}

impl CopyIndex {
    /// Records `blocks` as the copies of the host page `hash`, replacing its old ones
    /// (vLLM's `_record_copy`).
    pub fn record(&mut self, hash: HashKey, blocks: Vec<BlockId>) {
        self.drop_hash(&hash);
        for &b in &blocks {
            self.by_block.insert(b, hash);
        }
        self.by_hash.insert(hash, blocks);
    }

    /// Forgets the copies of the host page `hash` (vLLM's `_drop_copy`).
    pub fn drop_hash(&mut self, hash: &HashKey) {
        if let Some(blocks) = self.by_hash.remove(hash) {
            for b in blocks {
                self.by_block.remove(&b);
            }
        }
    }

    /// Forgets the copies that `block` belongs to: the pool reused it.
    pub fn drop_block(&mut self, block: BlockId) {
        if let Some(hash) = self.by_block.get(&block).copied() {
            self.drop_hash(&hash);
        }
    }

    /// The copies of the host page `hash`.
    pub fn get(&self, hash: &HashKey) -> Option<&[BlockId]> {
        self.by_hash.get(hash).map(Vec::as_slice)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// Every host page hash and its copies (in no particular order).
    pub fn iter(&self) -> impl Iterator<Item = (&HashKey, &[BlockId])> + '_ {
        self.by_hash.iter().map(|(h, b)| (h, b.as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::BlockHash;

    fn key(n: u8) -> HashKey {
        HashKey {
            hash: BlockHash::from_slice(&[n; 32]).unwrap(),
            group: 0,
        }
    }

    #[test]
    fn a_reused_block_drops_its_page_and_a_new_copy_replaces_the_old() {
        let mut c = CopyIndex::default();
        c.record(key(1), vec![4, 14]);
        c.record(key(2), vec![5, 15]);
        assert_eq!(c.get(&key(1)), Some(&[4, 14][..]));
        c.drop_block(14);
        assert_eq!(c.get(&key(1)), None);
        c.drop_block(4); // already gone: nothing
        c.record(key(2), vec![6, 16]);
        assert_eq!(c.get(&key(2)), Some(&[6, 16][..]));
        c.drop_block(5); // an old copy no longer indexed
        assert_eq!(c.get(&key(2)), Some(&[6, 16][..]));
        c.drop_block(16);
        assert!(c.is_empty());
    }
}
