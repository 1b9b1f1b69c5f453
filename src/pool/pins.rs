//! Pins: prefix keys whose cached blocks are never evicted (docs/retention.md, "Pin").
//!
//! A cached block carrying a pinned key holds one extra reference, the pin's, so the
//! eviction order never sees it and it counts as used. Pinning a key that is not cached
//! yet takes effect when a block is cached under it.

use rustc_hash::FxHashMap;

use super::{BlockPool, HashKey};
use crate::error::{KvError, Result};
use crate::types::{BlockId, NULL_BLOCK_ID};

/// The pinned keys and the blocks their pins hold.
///
/// NOTE 1: `held[b]` iff block `b` carries a key in `count` and holds the pin's
/// reference; `held` is empty until the first pin.
#[derive(Debug, Clone, Default)]
pub struct Pins {
    count: FxHashMap<HashKey, u32>,
    held: Vec<bool>,
    num_held: usize,
}

impl Pins {
    /// Whether a pin's reference is on `b`.
    #[inline]
    pub fn holds(&self, b: BlockId) -> bool {
        self.held.get(b as usize).copied().unwrap_or(false)
    }

    /// Whether `key` is pinned.
    #[inline]
    pub fn is_pinned(&self, key: &HashKey) -> bool {
        !self.count.is_empty() && self.count.contains_key(key)
    }

    /// Blocks a pin holds.
    pub fn num_held(&self) -> usize {
        self.num_held
    }

    /// Number of pinned keys.
    pub fn num_keys(&self) -> usize {
        self.count.len()
    }
}

impl BlockPool {
    /// Pins each key (counted: a key pinned twice needs two unpins). Every block cached
    /// under it now or later keeps a reference for the pin.
    pub fn pin(&mut self, keys: &[HashKey]) {
        if self.pins.held.is_empty() && !keys.is_empty() {
            self.pins.held = vec![false; self.num_blocks()];
        }
        for key in keys {
            let n = self.pins.count.entry(*key).or_insert(0);
            *n += 1;
            if *n == 1 {
                // The key's blocks are taken only on its first pin.
                for b in self.map.blocks_of(key).to_vec() {
                    self.hold_for_pin(b);
                }
            }
        }
    }

    /// Drops one pin of each key. A key not pinned (as often as it is listed) is a
    /// `KeyError` and nothing changes. A block no pinned key covers any more drops the
    /// pin's reference; if no request holds it, it is freed with the default tag.
    pub fn unpin(&mut self, keys: &[HashKey]) -> Result<()> {
        let mut need: FxHashMap<HashKey, u32> = FxHashMap::default();
        for key in keys {
            *need.entry(*key).or_insert(0) += 1;
        }
        for (key, n) in &need {
            if self.pins.count.get(key).copied().unwrap_or(0) < *n {
                return Err(KvError::NotPinned(format!(
                    "{:?} in group {}",
                    key.hash, key.group
                )));
            }
        }
        for key in keys {
            let n = self.pins.count.get_mut(key).expect("checked above");
            *n -= 1;
            if *n > 0 {
                continue;
            }
            self.pins.count.remove(key);
            for b in self.map.blocks_of(key).to_vec() {
                if self.pins.holds(b) && !self.carries_pinned_key(b) {
                    self.release_pin(b);
                }
            }
        }
        Ok(())
    }

    /// Whether any key `b` carries is pinned.
    fn carries_pinned_key(&self, b: BlockId) -> bool {
        let primary = self.hash_of[b as usize].iter();
        let extra = self.secondary.get(&b).into_iter().flatten();
        primary.chain(extra).any(|k| self.pins.is_pinned(k))
    }

    /// Takes the pin's reference on cached block `b` (once).
    pub(super) fn hold_for_pin(&mut self, b: BlockId) {
        if b == NULL_BLOCK_ID || self.pins.holds(b) {
            return;
        }
        if self.ref_cnt[b as usize] == 0 {
            self.unlink_free(b);
        }
        self.ref_cnt[b as usize] += 1;
        self.pins.held[b as usize] = true;
        self.pins.num_held += 1;
    }

    /// Drops the pin's reference on `b`; a block no request holds is freed, with the
    /// default tag if still cached, to the front of the queue if not.
    pub(super) fn release_pin(&mut self, b: BlockId) {
        self.pins.held[b as usize] = false;
        self.pins.num_held -= 1;
        let rc = &mut self.ref_cnt[b as usize];
        *rc -= 1;
        if *rc > 0 {
            return;
        }
        if self.enable_caching && self.hash_of[b as usize].is_some() {
            self.link_cached_default(b);
        } else {
            self.queue.prepend_n(&[b]);
        }
    }

    /// Blocks held by a pin and nothing else, or `None` if a request holds any block
    /// (then the prefix cache cannot be reset).
    pub(super) fn pin_only_blocks(&self) -> Option<Vec<BlockId>> {
        let in_use = self.num_blocks() - 1 - self.num_free_blocks();
        if in_use != self.pins.num_held {
            return None;
        }
        let blocks: Vec<BlockId> = (1..self.num_blocks() as BlockId)
            .filter(|&b| self.pins.holds(b))
            .collect();
        blocks
            .iter()
            .all(|&b| self.ref_cnt[b as usize] == 1)
            .then_some(blocks)
    }

    /// Drops every pin's reference on `blocks` (held by pins alone), leaving them
    /// unlinked with ref count 0; the pins stay registered.
    pub(super) fn drop_pin_holds(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            self.pins.held[b as usize] = false;
            self.ref_cnt[b as usize] = 0;
        }
        self.pins.num_held = 0;
    }

    /// Blocks held by pins.
    pub fn num_pinned_blocks(&self) -> usize {
        self.pins.num_held()
    }

    /// Number of pinned keys.
    pub fn num_pinned_keys(&self) -> usize {
        self.pins.num_keys()
    }

    /// Checks NOTE 1 of [`Pins`].
    pub(super) fn check_pins(&self) -> std::result::Result<(), String> {
        let mut held = 0;
        for b in 0..self.pins.held.len() as BlockId {
            if self.pins.holds(b) {
                held += 1;
                if self.ref_cnt[b as usize] == 0 || !self.carries_pinned_key(b) {
                    return Err(format!("block {b} is held by a pin it does not carry"));
                }
            } else if b != NULL_BLOCK_ID && self.carries_pinned_key(b) {
                return Err(format!(
                    "block {b} carries a pinned key but no pin holds it"
                ));
            }
        }
        if held != self.pins.num_held {
            return Err(format!(
                "{held} blocks pin-held, counted {}",
                self.pins.num_held
            ));
        }
        Ok(())
    }
}
