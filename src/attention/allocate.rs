//! Allocation in one group: how many blocks a request would take
//! ([`SingleTypeManager::get_num_blocks_to_allocate`], capped by the type's admission
//! cap), adding hit and external blocks, and extending the table with new blocks.

use super::{RequestBlocks, SingleTypeManager};
use crate::arith::cdiv;
use crate::error::Result;
use crate::pool::BlockPool;
use crate::types::{BlockId, NULL_BLOCK_ID};

impl SingleTypeManager {
    /// Blocks that allocating for `num_tokens` (`num_tokens_main_model` without the
    /// lookahead) would take off the free queue (vLLM 0.33's
    /// `get_num_blocks_to_allocate`, hits that are still free included), or the type's
    /// own count (`kind.rs`, `own_num_blocks_to_allocate`: align-mode Mamba may
    /// return a negative count, and `num_blocks + 1` to defer a request whose hit was
    /// cached during this step; under retention 0 it reserves a prefill checkpoint only
    /// on a step reaching `prefill_end`, 0 otherwise). A local hit of
    /// `num_local_computed` tokens ending inside a block takes one block more, its copy
    /// (`copy_on_write.rs`).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn get_num_blocks_to_allocate(
        &self,
        rb: &RequestBlocks,
        num_tokens: usize,
        num_tokens_main_model: usize,
        prefill_end: usize,
        new_computed: &[BlockId],
        total_computed_tokens: usize,
        num_local_computed: usize,
        apply_admission_cap: bool,
        pool: &BlockPool,
    ) -> isize {
        let partial_hit = self.has_partial_local_hit(new_computed, num_local_computed);
        if let Some(n) = self.params.kind.own_num_blocks_to_allocate(
            self,
            rb,
            num_tokens,
            num_local_computed,
            apply_admission_cap,
            total_computed_tokens,
            num_tokens_main_model,
            prefill_end,
            new_computed,
            partial_hit,
            pool,
        ) {
            return n;
        }
        self.num_blocks_by_common_rules(
            rb,
            num_tokens,
            new_computed,
            total_computed_tokens,
            num_local_computed,
            apply_admission_cap,
            pool,
        )
    }

    /// The common `get_num_blocks_to_allocate` (a type that has no count of its own,
    /// `AttentionKind::allocates_by_common_rules`): new blocks, hits that are still free,
    /// and a partial hit's copy.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn num_blocks_by_common_rules(
        &self,
        rb: &RequestBlocks,
        num_tokens: usize,
        new_computed: &[BlockId],
        total_computed_tokens: usize,
        num_local_computed: usize,
        apply_admission_cap: bool,
        pool: &BlockPool,
    ) -> isize {
        let bs = self.params.block_size;
        let mut required = cdiv(self.params.kind.slot_tokens(num_tokens, bs), bs);
        if apply_admission_cap {
            if let Some(cap) = self.max_admission_blocks {
                required = required.min(cap);
            }
        }
        let held = rb.table.len();
        if rb.num_cached.is_some() {
            return required.saturating_sub(held) as isize;
        }
        let skipped_blocks = self.num_skipped_tokens(total_computed_tokens) / bs;
        let new_blocks = required.saturating_sub(skipped_blocks.max(new_computed.len() + held));
        let skip_hits = skipped_blocks.saturating_sub(held).min(new_computed.len());
        let evictable = new_computed[skip_hits..]
            .iter()
            .filter(|&&b| b != NULL_BLOCK_ID && pool.ref_cnt(b).unwrap_or(1) == 0)
            .count();
        let partial_hit = self.has_partial_local_hit(new_computed, num_local_computed);
        (new_blocks + evictable + usize::from(partial_hit)) as isize
    }

    /// Whether the common count, for a request no group knows yet taking hit tokens
    /// without hit blocks, counts fewer blocks than the allocation takes: it assumes
    /// nulls for the tokens out of the window at `total_computed_tokens`, which only the
    /// adoption of a hit places (align-mode Mamba places its own).
    pub fn miscounts_blockless_hit(
        &self,
        rb: &RequestBlocks,
        total_computed_tokens: usize,
    ) -> bool {
        rb.num_cached.is_none()
            && !self.params.kind.places_own_nulls()
            && self.num_skipped_tokens(total_computed_tokens) / self.block_size() > rb.table.len()
    }

    /// Adds a new request's prefix-cache hit blocks to its (empty) table: out-of-window
    /// hits become nulls, the rest are touched (vLLM 0.33's `add_local_computed_blocks`).
    /// A table that counts encoder tokens takes none.
    pub fn add_local_computed_blocks(
        &self,
        rb: &mut RequestBlocks,
        hits: &[BlockId],
        num_local_computed: usize,
        num_external_computed: usize,
        pool: &mut BlockPool,
    ) -> Result<()> {
        if self.params.kind.counts_encoder_tokens() {
            return Ok(());
        }
        debug_assert!(rb.table.is_empty());
        let bs = self.block_size();
        if self
            .params
            .kind
            .own_local_computed(rb, bs, num_local_computed)
        {
            return Ok(());
        }
        let skipped =
            self.num_skipped_tokens(num_local_computed + num_external_computed) / self.block_size();
        let kept = &hits[skipped.min(hits.len())..];
        if self.enable_caching {
            pool.touch(kept)?;
        }
        rb.table.extend(std::iter::repeat_n(NULL_BLOCK_ID, skipped));
        rb.table.extend_from_slice(kept);
        rb.num_cached = Some(rb.table.len());
        self.record_partial_hit(rb, kept, num_local_computed);
        Ok(())
    }

    /// Allocates blocks for KV-connector tokens inside the window (after every group's
    /// hits were touched), or by the type's own rule (a circular buffer's ring); none for
    /// a table that counts encoder tokens.
    pub fn allocate_external_computed_blocks(
        &self,
        rb: &mut RequestBlocks,
        num_local_computed: usize,
        num_external_computed: usize,
        pool: &mut BlockPool,
    ) -> Result<()> {
        if self.params.kind.counts_encoder_tokens() {
            return Ok(());
        }
        let total = num_local_computed + num_external_computed;
        if let Some(done) = self
            .params
            .kind
            .own_external_blocks(rb, self.block_size(), total, pool)
        {
            return done;
        }
        let skipped = self.num_skipped_tokens(total);
        let external = if skipped > 0 {
            num_external_computed.min(total - skipped)
        } else {
            num_external_computed
        };
        if external == 0 {
            return Ok(());
        }
        let n = cdiv(total, self.block_size()).saturating_sub(rb.table.len());
        pool.get_new_blocks_into(n, &mut rb.table)
    }

    /// Extends the table of request `request_id` to cover `num_tokens` tokens with
    /// blocks from the queue head (align-mode Mamba: the state blocks of a step
    /// computing `[total_computed_tokens, num_tokens_main_model)`, its prefill
    /// checkpoint only on a step reaching `prefill_end`), after redirecting a partial
    /// hit to its copy. Returns the copy's block where it replaced a table entry in
    /// place (for zeroing).
    #[allow(clippy::too_many_arguments)]
    pub fn allocate_new_blocks(
        &mut self,
        rb: &mut RequestBlocks,
        request_id: &str,
        num_tokens: usize,
        total_computed_tokens: usize,
        num_tokens_main_model: usize,
        prefill_end: usize,
        pool: &mut BlockPool,
    ) -> Result<Option<BlockId>> {
        let kind = self.params.kind;
        kind.allocate_new_blocks(
            self,
            rb,
            request_id,
            num_tokens,
            total_computed_tokens,
            num_tokens_main_model,
            prefill_end,
            pool,
        )
    }

    /// The common `allocate_new_blocks` (`AttentionKind::allocates_by_common_rules`): a
    /// pending partial hit is redirected to its copy, whose block is returned, then the
    /// table is extended to the slots of `num_tokens`.
    #[inline]
    pub fn allocate_by_common_rules(
        &mut self,
        rb: &mut RequestBlocks,
        num_tokens: usize,
        pool: &mut BlockPool,
    ) -> Result<Option<BlockId>> {
        let cow = self.redirect_partial_hit(rb, pool)?;
        self.extend_table(rb, num_tokens, pool)?;
        Ok(cow)
    }

    /// The common `allocate_new_blocks`' extension: new blocks up to the slots of
    /// `num_tokens`.
    pub(super) fn extend_table(
        &self,
        rb: &mut RequestBlocks,
        num_tokens: usize,
        pool: &mut BlockPool,
    ) -> Result<()> {
        let bs = self.block_size();
        let required = cdiv(self.params.kind.slot_tokens(num_tokens, bs), bs);
        if required > rb.table.len() {
            pool.get_new_blocks_into(required - rb.table.len(), &mut rb.table)?;
        }
        Ok(())
    }
}
