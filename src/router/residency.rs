//! What each engine caches, by (group, medium): for every external block hash, which
//! engines hold it, kept as the `left-right` crate's two copies of one [`Fleet`].
//!
//! NOTE 1: an inverted index. Engines are numbered by slot in shards of 64; per shard and
//! table (a (group, medium) pair, [`table_of`]) a map gives each hash the mask of the
//! shard's engines holding it. A query probes each of its blocks once per shard and
//! table, whatever the number of engines ([`Probe`]), where a map per engine would probe
//! once per engine. An entry is 16 bytes (hash, mask): a block held by one engine costs
//! that at the table's load factor, and one held by many engines no more.
//!
//! NOTE 2: counts, not a set. vLLM may cache one hash in two blocks (the last block of a
//! prompt of an exact multiple of the block size is cached again by its next request) and
//! drops each with its own `BlockRemoved`; the hash stays cached until the last one goes.
//! The mask holds the first copy, and a side map counts an engine's extra copies.
//!
//! NOTE 3: every operation is applied to both copies (`Absorb`), so it must change them
//! the same way: Fx hashing is deterministic, and nothing here reads time or randomness.

use std::cell::RefCell;
use std::sync::Arc;

use left_right::Absorb;
use rustc_hash::FxHashMap;

use super::engine::EngineInfo;
use super::wire::Medium;
use crate::hashing::BlockHashView;
use crate::types::BlockHash;

/// Engines per shard (the bits of a mask).
pub const SHARD: usize = 64;

/// The table of (group, medium).
#[inline]
pub fn table_of(group: u32, medium: Medium) -> u32 {
    group * Medium::COUNT as u32 + medium.index() as u32
}

/// One block-level change of one engine, on table `table`.
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
    /// Everything the engine holds is dropped (`AllBlocksCleared`).
    Clear,
}

/// The engines of one shard, by table (NOTE 1).
#[derive(Debug, Clone, Default)]
pub struct Shard {
    /// Per table: hash -> mask of the shard's engines holding it.
    tables: Vec<FxHashMap<u64, u64>>,
    /// (hash, table, engine's bit index) -> copies beyond the first (NOTE 2).
    extra: FxHashMap<(u64, u32, u8), u32>,
}

impl Shard {
    /// The mask of the shard's engines holding `hash` in `table`.
    #[inline]
    pub fn holders(&self, table: u32, hash: u64) -> u64 {
        self.tables
            .get(table as usize)
            .and_then(|t| t.get(&hash))
            .copied()
            .unwrap_or(0)
    }

    /// Adds a copy; returns nothing (a store always adds one).
    fn store(&mut self, table: u32, hash: u64, bit: u8) {
        let t = table as usize;
        if self.tables.len() <= t {
            self.tables.resize_with(t + 1, FxHashMap::default);
        }
        let mask = self.tables[t].entry(hash).or_insert(0);
        if *mask & (1 << bit) != 0 {
            *self.extra.entry((hash, table, bit)).or_insert(0) += 1;
        } else {
            *mask |= 1 << bit;
        }
    }

    /// Drops a copy; returns whether the engine held one.
    fn remove(&mut self, table: u32, hash: u64, bit: u8) -> bool {
        if let Some(extra) = self.extra.get_mut(&(hash, table, bit)) {
            *extra -= 1;
            if *extra == 0 {
                self.extra.remove(&(hash, table, bit));
            }
            return true;
        }
        let Some(map) = self.tables.get_mut(table as usize) else {
            return false;
        };
        match map.get_mut(&hash) {
            Some(mask) if *mask & (1 << bit) != 0 => {
                *mask &= !(1 << bit);
                if *mask == 0 {
                    map.remove(&hash);
                }
                true
            }
            _ => false,
        }
    }

    /// Drops everything engine `bit` holds.
    fn clear(&mut self, bit: u8) {
        for map in &mut self.tables {
            map.retain(|_, mask| {
                *mask &= !(1 << bit);
                *mask != 0
            });
        }
        self.extra.retain(|k, _| k.2 != bit);
    }

    /// Bytes of table memory (buckets and control bytes; one copy).
    fn memory_bytes(&self) -> usize {
        let tables: usize = self.tables.iter().map(|t| t.capacity() * 17).sum();
        tables + self.extra.capacity() * 25
    }
}

/// A registered engine: what it is and how many blocks it holds.
#[derive(Debug, Clone)]
pub struct Slot {
    /// Its registration.
    pub info: Arc<EngineInfo>,
    /// Blocks held, over every group and medium (copies counted).
    pub blocks: usize,
}

/// Every engine of the index; one of the two copies `left-right` keeps.
#[derive(Debug, Clone, Default)]
pub struct Fleet {
    slots: Vec<Option<Slot>>,
    by_id: FxHashMap<Arc<str>, u32>,
    shards: Vec<Shard>,
}

/// Where an engine's bits are: its shard and bit index.
#[inline]
pub fn place(slot: u32) -> (usize, u8) {
    (slot as usize / SHARD, (slot as usize % SHARD) as u8)
}

impl Fleet {
    /// The engine registered as `id`, with its slot.
    #[inline]
    pub fn get(&self, id: &str) -> Option<(u32, &Slot)> {
        let slot = *self.by_id.get(id)?;
        Some((slot, self.slots[slot as usize].as_ref()?))
    }

    /// Every engine with its slot, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Slot)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((i as u32, s.as_ref()?)))
    }

    /// Shard `i` (empty if no engine of it ever held a block).
    pub fn shard(&self, i: usize) -> Option<&Shard> {
        self.shards.get(i)
    }

    /// Bytes of table memory (one copy).
    pub fn memory_bytes(&self) -> usize {
        self.shards.iter().map(Shard::memory_bytes).sum()
    }

    fn apply(&mut self, op: &FleetOp) {
        match op {
            FleetOp::Add { slot, info } => {
                let i = *slot as usize;
                if self.slots.len() <= i {
                    self.slots.resize_with(i + 1, || None);
                }
                self.by_id.insert(info.id.clone(), *slot);
                self.slots[i] = Some(Slot {
                    info: info.clone(),
                    blocks: 0,
                });
            }
            FleetOp::Remove { slot } => {
                self.clear(*slot);
                if let Some(s) = self.slots[*slot as usize].take() {
                    self.by_id.remove(&s.info.id);
                }
            }
            FleetOp::Apply { slot, ops } => {
                let (shard, bit) = place(*slot);
                if self.shards.len() <= shard {
                    self.shards.resize_with(shard + 1, Shard::default);
                }
                let mut delta = 0isize;
                for op in ops.iter() {
                    match *op {
                        BlockOp::Store { table, hash } => {
                            self.shards[shard].store(table, hash, bit);
                            delta += 1;
                        }
                        BlockOp::Remove { table, hash } => {
                            delta -= isize::from(self.shards[shard].remove(table, hash, bit));
                        }
                        BlockOp::Clear => {
                            self.clear(*slot);
                            delta = 0;
                        }
                    }
                }
                if let Some(s) = self.slots[*slot as usize].as_mut() {
                    s.blocks = s.blocks.saturating_add_signed(delta);
                }
            }
        }
    }

    fn clear(&mut self, slot: u32) {
        let (shard, bit) = place(slot);
        if let Some(s) = self.shards.get_mut(shard) {
            s.clear(bit);
        }
        if let Some(s) = self.slots[slot as usize].as_mut() {
            s.blocks = 0;
        }
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
    /// Drops the engine in `slot` and what it holds.
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

/// One query's reads of one shard: the holders of each of the request's hashes, looked up
/// once per table and remembered, so each engine of the shard reads a bit (NOTE 1).
#[derive(Debug)]
pub struct Probe<'a> {
    shard: Option<&'a Shard>,
    hashes: &'a [BlockHash],
    /// Per table used so far: the holders of each hash (`None`: not looked up yet).
    memo: RefCell<Vec<(u32, Vec<Option<u64>>)>>,
    /// Per (table, view): where each engine's leading run ends ([`Probe::leading_run`]).
    runs: RefCell<Vec<(RunKey, [u32; SHARD])>>,
}

/// A view of the request's hashes in one table: (table, first hash's address, stride,
/// length).
type RunKey = (u32, usize, usize, usize);

impl<'a> Probe<'a> {
    /// A probe of `shard` for a request hashed as `hashes`.
    pub fn new(shard: Option<&'a Shard>, hashes: &'a [BlockHash]) -> Self {
        Self {
            shard,
            hashes,
            memo: RefCell::new(Vec::new()),
            runs: RefCell::new(Vec::new()),
        }
    }

    /// How many of `view`'s blocks, from its first, engine `bit` holds in `table` before
    /// its first miss. One walk of the view answers every engine of the shard: each step
    /// drops the engines that miss it, until none is left.
    pub fn leading_run(&self, table: u32, view: BlockHashView<'_>, bit: u8) -> usize {
        let Some(first) = view.get(0) else { return 0 };
        let key = (
            table,
            first as *const BlockHash as usize,
            view.scale_factor(),
            view.len(),
        );
        if let Some((_, ends)) = self.runs.borrow().iter().find(|(k, _)| *k == key) {
            return ends[bit as usize] as usize;
        }
        let mut ends = [view.len() as u32; SHARD];
        let mut live = u64::MAX;
        for (i, h) in view.iter().enumerate() {
            let held = self.holders(table, h);
            let mut dropped = live & !held;
            while dropped != 0 {
                ends[dropped.trailing_zeros() as usize] = i as u32;
                dropped &= dropped - 1;
            }
            live &= held;
            if live == 0 {
                break;
            }
        }
        self.runs.borrow_mut().push((key, ends));
        ends[bit as usize] as usize
    }

    /// The holders of `hash` in `table`: remembered when `hash` is one of the request's.
    #[inline]
    pub fn holders(&self, table: u32, hash: &BlockHash) -> u64 {
        let Some(shard) = self.shard else { return 0 };
        let Some(j) = self.position(hash) else {
            return shard.holders(table, hash.external());
        };
        let mut memo = self.memo.borrow_mut();
        let k = match memo.iter().position(|(t, _)| *t == table) {
            Some(k) => k,
            None => {
                memo.push((table, vec![None; self.hashes.len()]));
                memo.len() - 1
            }
        };
        *memo[k].1[j].get_or_insert_with(|| shard.holders(table, hash.external()))
    }

    /// The index of `hash` in the request's hashes, if it is one of them (by address: the
    /// hit rules hand out references into the slice).
    #[inline]
    fn position(&self, hash: &BlockHash) -> Option<usize> {
        let size = std::mem::size_of::<BlockHash>();
        let offset =
            (hash as *const BlockHash as usize).wrapping_sub(self.hashes.as_ptr() as usize);
        (offset.is_multiple_of(size) && offset / size < self.hashes.len()).then_some(offset / size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_stays_until_its_last_copy_goes() {
        let mut s = Shard::default();
        for _ in 0..3 {
            s.store(0, 7, 5);
        }
        s.store(0, 7, 9);
        assert_eq!(s.holders(0, 7), (1 << 5) | (1 << 9));
        assert!(s.remove(0, 7, 5));
        assert!(s.remove(0, 7, 5));
        assert_eq!(s.holders(0, 7), (1 << 5) | (1 << 9));
        assert!(s.remove(0, 7, 5));
        assert_eq!(s.holders(0, 7), 1 << 9);
        assert!(!s.remove(0, 7, 5));
        s.clear(9);
        assert_eq!(s.holders(0, 7), 0);
        assert!(s.tables[0].is_empty());
    }

    #[test]
    fn a_probe_remembers_what_it_looked_up() {
        let mut s = Shard::default();
        let hashes = [BlockHash::from_slice(&[1; 32]).unwrap()];
        s.store(3, hashes[0].external(), 2);
        let p = Probe::new(Some(&s), &hashes);
        assert_eq!(p.holders(3, &hashes[0]), 1 << 2);
        assert_eq!(p.holders(4, &hashes[0]), 0);
        let elsewhere = hashes[0];
        assert_eq!(p.holders(3, &elsewhere), 1 << 2);
        assert_eq!(p.memo.borrow().len(), 2);
    }
}
