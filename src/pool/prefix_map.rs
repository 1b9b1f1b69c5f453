//! The prefix cache map: (block hash, group id) -> cached blocks, with vLLM's duplicate
//! rule (no dedup; the earliest-inserted block still cached answers a lookup).

use std::collections::hash_map::Entry as MapEntry;
use std::hash::{Hash, Hasher};

use rustc_hash::FxHashMap;

use crate::types::{BlockHash, BlockId, GroupId};

/// vLLM's `BlockHashWithGroupId`: a block hash qualified by its KV cache group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashKey {
    /// The block hash.
    pub hash: BlockHash,
    /// The KV cache group the block belongs to.
    pub group: GroupId,
}

impl Hash for HashKey {
    /// Digests are uniformly distributed, so their first 8 bytes (and the group) are
    /// enough to spread keys over buckets; equality still compares every byte. One
    /// `write_u64` instead of hashing 40 bytes makes prefix lookups markedly cheaper.
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        let bytes = self.hash.as_bytes();
        let mut head = [0u8; 8];
        let n = bytes.len().min(8);
        head[..n].copy_from_slice(&bytes[..n]);
        state.write_u64(u64::from_le_bytes(head) ^ (u64::from(self.group) << 56));
    }
}

/// NOTE 1: almost every key maps to one block, stored inline; a second block under the
/// same key promotes the entry to an insertion-ordered list (block tables are
/// append-only, so equal content cached twice keeps both blocks).
#[derive(Debug, Clone)]
enum Entry {
    One(BlockId),
    Many(Vec<BlockId>),
}

/// `BlockHashToBlockMap` of vLLM 0.33.
#[derive(Debug, Clone, Default)]
pub struct PrefixMap {
    map: FxHashMap<HashKey, Entry>,
}

impl PrefixMap {
    /// The first-inserted block still cached under `key`.
    #[inline]
    pub fn get_one(&self, key: &HashKey) -> Option<BlockId> {
        match self.map.get(key)? {
            Entry::One(b) => Some(*b),
            Entry::Many(v) => v.first().copied(),
        }
    }

    /// The blocks cached under `key`, first-inserted first.
    pub fn blocks_of(&self, key: &HashKey) -> &[BlockId] {
        match self.map.get(key) {
            None => &[],
            Some(Entry::One(b)) => std::slice::from_ref(b),
            Some(Entry::Many(v)) => v,
        }
    }

    /// Whether `key` maps to `block`.
    pub fn contains(&self, key: &HashKey, block: BlockId) -> bool {
        match self.map.get(key) {
            None => false,
            Some(Entry::One(b)) => *b == block,
            Some(Entry::Many(v)) => v.contains(&block),
        }
    }

    /// Adds `block` under `key`, after any blocks already there.
    pub fn insert(&mut self, key: HashKey, block: BlockId) {
        match self.map.entry(key) {
            MapEntry::Vacant(v) => {
                v.insert(Entry::One(block));
            }
            MapEntry::Occupied(mut o) => match o.get_mut() {
                Entry::One(first) => {
                    let first = *first;
                    o.insert(Entry::Many(vec![first, block]));
                }
                Entry::Many(v) => v.push(block),
            },
        }
    }

    /// Removes `block` from `key`; returns whether it was there. A key whose list
    /// empties is dropped.
    pub fn pop(&mut self, key: &HashKey, block: BlockId) -> bool {
        let MapEntry::Occupied(mut o) = self.map.entry(*key) else {
            return false;
        };
        match o.get_mut() {
            Entry::One(b) => {
                if *b != block {
                    return false;
                }
                o.remove();
                true
            }
            Entry::Many(v) => {
                let Some(pos) = v.iter().position(|&b| b == block) else {
                    return false;
                };
                v.remove(pos);
                if v.is_empty() {
                    o.remove();
                }
                true
            }
        }
    }

    /// Number of distinct keys.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no key is cached.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every `(key, block)` pair, each key's blocks in insertion order (for invariant
    /// checks; the order across keys is unspecified).
    pub fn entries(&self) -> impl Iterator<Item = (HashKey, BlockId)> + '_ {
        self.map.iter().flat_map(|(k, e)| {
            let blocks: &[BlockId] = match e {
                Entry::One(b) => std::slice::from_ref(b),
                Entry::Many(v) => v,
            };
            blocks.iter().map(move |&b| (*k, b))
        })
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.map = FxHashMap::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8, group: GroupId) -> HashKey {
        HashKey {
            hash: BlockHash::from_slice(&[b; 4]).unwrap(),
            group,
        }
    }

    #[test]
    fn duplicates_answer_first_inserted_and_pop_by_id() {
        let mut m = PrefixMap::default();
        m.insert(key(1, 0), 5);
        m.insert(key(1, 0), 7);
        m.insert(key(1, 1), 9);
        assert_eq!(m.len(), 2);
        assert_eq!(m.get_one(&key(1, 0)), Some(5));
        assert!(!m.pop(&key(1, 0), 8));
        assert!(m.pop(&key(1, 0), 5));
        assert_eq!(m.get_one(&key(1, 0)), Some(7));
        m.insert(key(1, 0), 5);
        assert_eq!(m.get_one(&key(1, 0)), Some(7));
        assert!(m.pop(&key(1, 0), 7) && m.pop(&key(1, 0), 5));
        assert_eq!(m.get_one(&key(1, 0)), None);
        assert!(
            !m.pop(&key(1, 1), 5),
            "mismatched id on a single entry is a no-op"
        );
        assert!(m.contains(&key(1, 1), 9));
        assert_eq!(m.len(), 1);
    }
}
