//! What each engine caches, by (group, medium): counted sets of external block hashes,
//! kept as the `left-right` crate's two copies of one [`Fleet`].
//!
//! NOTE 1: counts, not a set. vLLM may cache one hash in two blocks (the last block of a
//! prompt of an exact multiple of the block size is cached again by its next request) and
//! drops each with its own `BlockRemoved`; the hash stays cached until the last one goes.
//! Almost every hash is held once, so a plain set holds the first copy and a side map
//! counts the extra ones: 8 bytes a residency, plus the table's load factor.
//!
//! NOTE 2: every operation is applied to both copies (`Absorb`), so it must change them
//! the same way: Fx hashing is deterministic, and nothing here reads time or randomness.

use std::sync::Arc;

use left_right::Absorb;
use rustc_hash::{FxHashMap, FxHashSet};

use super::engine::EngineInfo;
use super::wire::Medium;

/// A multiset of external hashes (NOTE 1).
#[derive(Debug, Clone, Default)]
pub struct CountedSet {
    once: FxHashSet<u64>,
    /// Copies beyond the first, by hash.
    more: FxHashMap<u64, u32>,
}

impl CountedSet {
    /// Whether at least one block holds `hash`.
    #[inline]
    pub fn contains(&self, hash: u64) -> bool {
        self.once.contains(&hash)
    }

    fn insert(&mut self, hash: u64) {
        if !self.once.insert(hash) {
            *self.more.entry(hash).or_insert(0) += 1;
        }
    }

    fn remove(&mut self, hash: u64) {
        match self.more.get_mut(&hash) {
            Some(extra) if *extra > 1 => *extra -= 1,
            Some(_) => {
                self.more.remove(&hash);
            }
            None => {
                self.once.remove(&hash);
            }
        }
    }

    fn clear(&mut self) {
        self.once.clear();
        self.more.clear();
    }

    /// Blocks held (copies counted).
    pub fn num_blocks(&self) -> usize {
        self.once.len() + self.more.values().map(|&c| c as usize).sum::<usize>()
    }

    /// Bytes of table memory (buckets and control bytes).
    fn memory_bytes(&self) -> usize {
        let slot = |key: usize, cap: usize| cap * (key + 1);
        slot(8, self.once.capacity()) + slot(16, self.more.capacity())
    }
}

/// One block-level change, on table `table` (`group * Medium::COUNT + medium`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockOp {
    /// One more block holds `hash`.
    Store {
        /// Table index.
        table: u32,
        /// External hash.
        hash: u64,
    },
    /// One block fewer holds `hash`.
    Remove {
        /// Table index.
        table: u32,
        /// External hash.
        hash: u64,
    },
    /// Every table of the engine is emptied (`AllBlocksCleared`).
    Clear,
}

/// The table of (group, medium).
#[inline]
pub fn table_of(group: u32, medium: Medium) -> u32 {
    group * Medium::COUNT as u32 + medium.index() as u32
}

/// One engine's tables.
#[derive(Debug, Clone)]
pub struct EngineResidency {
    tables: Box<[CountedSet]>,
}

impl EngineResidency {
    fn new(num_groups: usize) -> Self {
        Self {
            tables: vec![CountedSet::default(); num_groups * Medium::COUNT].into_boxed_slice(),
        }
    }

    /// The hashes of `group` held in `medium`.
    #[inline]
    pub fn table(&self, group: u32, medium: Medium) -> &CountedSet {
        &self.tables[table_of(group, medium) as usize]
    }

    fn apply(&mut self, op: &BlockOp) {
        match *op {
            BlockOp::Store { table, hash } => self.tables[table as usize].insert(hash),
            BlockOp::Remove { table, hash } => self.tables[table as usize].remove(hash),
            BlockOp::Clear => self.tables.iter_mut().for_each(CountedSet::clear),
        }
    }

    /// Blocks held, over every group and medium.
    pub fn num_blocks(&self) -> usize {
        self.tables.iter().map(CountedSet::num_blocks).sum()
    }

    /// Bytes of table memory (one copy).
    pub fn memory_bytes(&self) -> usize {
        self.tables.iter().map(CountedSet::memory_bytes).sum()
    }
}

/// A registered engine: what it is and what it holds.
#[derive(Debug, Clone)]
pub struct Slot {
    /// Its registration.
    pub info: Arc<EngineInfo>,
    /// What it holds.
    pub residency: EngineResidency,
}

/// Every engine of the index, by slot; one of the two copies `left-right` keeps.
#[derive(Debug, Clone, Default)]
pub struct Fleet {
    slots: Vec<Option<Slot>>,
    by_id: FxHashMap<Arc<str>, u32>,
}

impl Fleet {
    /// The engine registered as `id`.
    #[inline]
    pub fn get(&self, id: &str) -> Option<&Slot> {
        let slot = *self.by_id.get(id)?;
        self.slots[slot as usize].as_ref()
    }

    /// Every engine, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = &Slot> {
        self.slots.iter().flatten()
    }
}

/// A change to the fleet, applied to both copies.
#[derive(Debug, Clone)]
pub enum FleetOp {
    /// Registers an engine in slot `slot` (free in both copies).
    Add {
        /// The slot.
        slot: u32,
        /// Its registration.
        info: Arc<EngineInfo>,
    },
    /// Drops the engine in `slot`.
    Remove {
        /// The slot.
        slot: u32,
    },
    /// Applies one batch's block changes to the engine in `slot`.
    Apply {
        /// The slot.
        slot: u32,
        /// The changes, in order (shared by the two copies).
        ops: Arc<[BlockOp]>,
    },
}

impl Fleet {
    fn apply(&mut self, op: &FleetOp) {
        match op {
            FleetOp::Add { slot, info } => {
                let i = *slot as usize;
                if self.slots.len() <= i {
                    self.slots.resize_with(i + 1, || None);
                }
                let residency = EngineResidency::new(info.num_groups());
                self.by_id.insert(info.id.clone(), *slot);
                self.slots[i] = Some(Slot {
                    info: info.clone(),
                    residency,
                });
            }
            FleetOp::Remove { slot } => {
                if let Some(s) = self.slots[*slot as usize].take() {
                    self.by_id.remove(&s.info.id);
                }
            }
            FleetOp::Apply { slot, ops } => {
                if let Some(s) = self.slots[*slot as usize].as_mut() {
                    ops.iter().for_each(|op| s.residency.apply(op));
                }
            }
        }
    }
}

impl Absorb<FleetOp> for Fleet {
    fn absorb_first(&mut self, op: &mut FleetOp, _other: &Self) {
        self.apply(op);
    }

    fn absorb_second(&mut self, op: FleetOp, _other: &Self) {
        self.apply(&op);
    }

    fn sync_with(&mut self, first: &Self) {
        self.clone_from(first);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_stays_until_its_last_copy_goes() {
        let mut s = CountedSet::default();
        s.insert(7);
        s.insert(7);
        s.insert(7);
        assert_eq!(s.num_blocks(), 3);
        s.remove(7);
        s.remove(7);
        assert!(s.contains(7));
        s.remove(7);
        assert!(!s.contains(7));
        assert_eq!(s.num_blocks(), 0);
        s.remove(7);
        assert_eq!(s.num_blocks(), 0);
    }
}
