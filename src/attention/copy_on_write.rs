//! Partial prefix-cache hits (vLLM 0.33's fine-grained hits): a hit that ends on a hash
//! boundary inside a block shares that block with the request that cached it. The
//! request's first allocation redirects the shared tail to a private block and queues
//! a copy of it (copy-on-write); both copy endpoints keep a reference until the
//! caller frees them once the copy has run (vLLM's `take_kv_cache_block_copies`).

use super::{RequestBlocks, SingleTypeManager};
use crate::error::{KvError, Result};
use crate::pool::BlockPool;
use crate::types::BlockId;

impl SingleTypeManager {
    /// vLLM's `_has_partial_local_hit`: the local hit `hits` of `num_local_computed`
    /// tokens ends inside one of this group's blocks.
    #[inline]
    pub(crate) fn has_partial_local_hit(
        &self,
        hits: &[BlockId],
        num_local_computed: usize,
    ) -> bool {
        !hits.is_empty() && !num_local_computed.is_multiple_of(self.block_size())
    }

    /// After a new request's hit `hits` was added: a partial hit's tail block is
    /// remembered for the copy, and only the whole blocks before it count as cached, so
    /// `cache_blocks` caches the private copy once it is full.
    pub(super) fn record_partial_hit(
        &self,
        rb: &mut RequestBlocks,
        hits: &[BlockId],
        num_local_computed: usize,
    ) {
        if let (true, Some(&tail)) = (
            self.has_partial_local_hit(hits, num_local_computed),
            hits.last(),
        ) {
            let idx = num_local_computed / self.block_size();
            rb.partial_hit = Some((idx, tail));
            rb.num_cached = Some(idx);
        }
    }

    /// vLLM's `_apply_cow`: table entry `idx` (the shared `source`) becomes `cow`, whose
    /// copy from `source` is queued; `cow` takes a reference for the copy, `source`
    /// keeps the request's.
    pub(super) fn apply_cow(
        &mut self,
        rb: &mut RequestBlocks,
        idx: usize,
        source: BlockId,
        cow: BlockId,
        pool: &mut BlockPool,
    ) -> Result<()> {
        if rb.table.get(idx) != Some(&source) {
            return Err(KvError::InvalidArgument(format!(
                "partial hit block {source} is not at table entry {idx}"
            )));
        }
        pool.retain(cow)?;
        rb.table[idx] = cow;
        self.pending_copies.push((source, cow));
        Ok(())
    }

    /// The common `allocate_new_blocks`' first step: a pending partial hit takes a new
    /// block (before any other) and is redirected to it. Returns that block. (Inlined:
    /// every allocation of the common types asks, and nearly all have none.)
    #[inline]
    pub(super) fn redirect_partial_hit(
        &mut self,
        rb: &mut RequestBlocks,
        pool: &mut BlockPool,
    ) -> Result<Option<BlockId>> {
        match rb.partial_hit {
            None => Ok(None),
            Some((idx, source)) => self.copy_partial_hit(rb, idx, source, pool).map(Some),
        }
    }

    /// [`Self::redirect_partial_hit`] for a request whose table entry `idx` is the
    /// pending partial hit `source`.
    #[cold]
    fn copy_partial_hit(
        &mut self,
        rb: &mut RequestBlocks,
        idx: usize,
        source: BlockId,
        pool: &mut BlockPool,
    ) -> Result<BlockId> {
        rb.partial_hit = None;
        let cow = pool.get_new_blocks(1)?[0];
        self.apply_cow(rb, idx, source, cow, pool)?;
        Ok(cow)
    }

    /// Hands over the copies queued since the last call as `(source, destination)`
    /// pairs, appending them to `out` (vLLM's `take_pending_cow_copies`).
    pub fn take_block_copies(&mut self, out: &mut Vec<(BlockId, BlockId)>) {
        out.append(&mut self.pending_copies);
    }
}
