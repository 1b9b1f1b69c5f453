//! Prefix-cache hits: the lookup every attention type shares ([`HitQuery`]) and
//! [`SingleTypeManager::find_longest_cache_hit`], which the kind hands to the type's own
//! search (`kind.rs`).

use super::SingleTypeManager;
use crate::error::Result;
use crate::hashing::BlockHashView;
use crate::types::{BlockHash, BlockId, GroupId, NULL_BLOCK_ID};

/// What a hit search reads: which block, if any, caches a hash in a group. The block
/// pool answers for a manager; the router's `TierView` answers for an engine known only
/// through its events, so both run the same per-type rules (one copy of each).
pub trait CachedBlocks {
    /// The cached block for `hash` in `group`, if any (first-inserted wins).
    fn cached_block(&self, hash: &BlockHash, group: GroupId) -> Option<BlockId>;

    /// vLLM's `get_cached_block`: one block per group id, or `None` if any group misses.
    fn get_cached_block(&self, hash: &BlockHash, groups: &[GroupId]) -> Option<Vec<BlockId>> {
        groups.iter().map(|&g| self.cached_block(hash, g)).collect()
    }

    /// Appends to `out` the cached blocks of `view`'s leading run in `group` (its blocks
    /// up to the first miss), at most `limit`: the one-group full-attention search. A
    /// source that knows the run (the router's, for all its engines at once) may answer
    /// without a lookup per block.
    #[inline]
    fn extend_leading_run(
        &self,
        view: BlockHashView<'_>,
        limit: usize,
        group: GroupId,
        out: &mut Vec<BlockId>,
    ) {
        out.extend(
            view.iter()
                .take(limit)
                .map_while(|h| self.cached_block(h, group)),
        );
    }
}

/// A prefix-cache lookup, shared by every attention type's `find_longest_cache_hit`.
#[derive(Debug, Clone, Copy)]
pub struct HitQuery<'a> {
    /// The request's hashes at `hash_block_size`.
    pub hashes: &'a [BlockHash],
    /// Tokens per hash.
    pub hash_block_size: usize,
    /// The longest hit allowed, in tokens.
    pub max_length: usize,
    /// Groups that must all hit (one list per group in the output).
    pub groups: &'a [GroupId],
    /// Whether to drop the last matched block (EAGLE).
    pub drop_eagle: bool,
    /// Hit lengths must be multiples of this.
    pub alignment: usize,
}

impl<'a> HitQuery<'a> {
    /// The hashes seen by a group of block size `bs` (a multiple of the hash block size).
    #[inline]
    pub(crate) fn view(&self, bs: usize) -> BlockHashView<'a> {
        BlockHashView::scaled(self.hashes, bs / self.hash_block_size)
    }

    /// The hash of the group block `i` for block size `bs` (0.33: the last hash inside
    /// the block).
    #[inline]
    pub(crate) fn hash(&self, bs: usize, i: usize) -> &'a BlockHash {
        self.view(bs).at(i)
    }

    /// Number of full group blocks the hashes cover.
    #[inline]
    pub(crate) fn num_hashed_blocks(&self, bs: usize) -> usize {
        self.view(bs).len()
    }

    /// Group blocks a hit may cover: within `max_length` and the hashes.
    #[inline]
    pub(crate) fn max_blocks(&self, bs: usize) -> usize {
        (self.max_length / bs).min(self.num_hashed_blocks(bs))
    }

    /// Whether hits may end on a hash boundary inside a block of size `bs` (vLLM's
    /// fine-grained lookup: the alignment, then the hash block size, divides `bs`).
    #[inline]
    pub(crate) fn fine_grained(&self, bs: usize) -> bool {
        self.alignment < bs && bs.is_multiple_of(self.alignment)
    }

    /// The hash-block entry `unit` (0-based) cached in every group: one block per group.
    fn cached_unit<P: CachedBlocks + ?Sized>(&self, pool: &P, unit: usize) -> Option<Vec<BlockId>> {
        pool.get_cached_block(&self.hashes[unit], self.groups)
    }

    /// Fine-grained phase 2 of a left-to-right search that hit `num_blocks` whole
    /// blocks: the highest hash boundary inside the next block that is cached in every
    /// group appends its block to `out`; returns the hit length, if any.
    pub(crate) fn extend_into_partial_block<P: CachedBlocks + ?Sized>(
        &self,
        pool: &P,
        num_blocks: usize,
        bs: usize,
        out: &mut [Vec<BlockId>],
    ) -> Option<usize> {
        let scale = bs / self.alignment;
        let first = num_blocks * scale;
        let end = (first + scale - 1)
            .min(self.max_length / self.alignment)
            .min(self.hashes.len());
        (first..end).rev().find_map(|unit| {
            let blocks = self.cached_unit(pool, unit)?;
            for (o, b) in out.iter_mut().zip(blocks) {
                o.push(b);
            }
            Some((unit + 1) * self.alignment)
        })
    }

    /// Fine-grained right-to-left search of a position-indexed table (align-mode
    /// Mamba): the highest cached hash boundary gives nulls up to its block and the
    /// block; returns the hit length (0 if none).
    pub(crate) fn last_cached_unit<P: CachedBlocks + ?Sized>(
        &self,
        pool: &P,
        bs: usize,
        out: &mut [Vec<BlockId>],
    ) -> usize {
        let scale = bs / self.alignment;
        let units = (self.max_length / self.alignment).min(self.hashes.len());
        for unit in (0..units).rev() {
            if let Some(blocks) = self.cached_unit(pool, unit) {
                for (o, b) in out.iter_mut().zip(blocks) {
                    o.resize(unit / scale, NULL_BLOCK_ID);
                    o.push(b);
                }
                return (unit + 1) * self.alignment;
            }
        }
        0
    }

    /// Looks block `i` up in every group; on a full hit appends one block per group to
    /// `out` and returns true; otherwise leaves `out` as it was.
    #[inline]
    pub(crate) fn push_hit<P: CachedBlocks + ?Sized>(
        &self,
        pool: &P,
        bs: usize,
        i: usize,
        out: &mut [Vec<BlockId>],
    ) -> bool {
        let h = self.hash(bs, i);
        for (j, &g) in self.groups.iter().enumerate() {
            match pool.cached_block(h, g) {
                Some(b) => out[j].push(b),
                None => {
                    for o in &mut out[..j] {
                        o.pop();
                    }
                    return false;
                }
            }
        }
        true
    }
}

impl SingleTypeManager {
    /// The longest prefix hit of `query` for this manager's attention type; fills one
    /// list per group of `query.groups` into `out` and returns the hit length in tokens.
    pub fn find_longest_cache_hit<P: CachedBlocks + ?Sized>(
        &self,
        query: &HitQuery<'_>,
        pool: &P,
        out: &mut [Vec<BlockId>],
    ) -> Result<usize> {
        for o in out.iter_mut() {
            o.clear();
        }
        self.params
            .kind
            .find_longest_cache_hit(query, self.block_size(), pool, out)
    }
}
