//! Freeing in one group: a finished request's table (tail first), and the blocks that
//! fell out of the attention window (replaced with nulls).

use super::{hisparse_resident, RequestBlocks, SingleTypeManager};
use crate::error::Result;
use crate::pool::BlockPool;
use crate::types::{BlockId, NULL_BLOCK_ID};

/// The blocks a request's table holds a reference to: all but its leading nulls, or the
/// whole table where the pool counts references to the null block (vLLM 0.32,
/// `pool/null_block.rs`).
fn held_blocks<'a>(rb: &'a RequestBlocks, pool: &BlockPool) -> &'a [BlockId] {
    if pool.counts_null_block_refs() {
        return &rb.table;
    }
    let start = rb
        .table
        .iter()
        .position(|&b| b != NULL_BLOCK_ID)
        .unwrap_or(rb.table.len());
    &rb.table[start..]
}

impl SingleTypeManager {
    /// Frees the request's table, tail first: its held blocks (`held_blocks`).
    pub fn free(&self, rb: &mut RequestBlocks, pool: &mut BlockPool) -> Result<()> {
        hisparse_resident::settle(rb);
        pool.free_blocks(held_blocks(rb, pool).iter().rev().copied())?;
        rb.clear();
        Ok(())
    }

    /// Forgets the request and appends its held blocks (`held_blocks`) to `out` in
    /// allocation order, without freeing them (vLLM's `pop_blocks_for_free`: the caller
    /// frees them later, in reverse).
    pub fn pop_blocks_for_free(
        &self,
        rb: &mut RequestBlocks,
        pool: &BlockPool,
        out: &mut Vec<BlockId>,
    ) {
        hisparse_resident::settle(rb);
        out.extend_from_slice(held_blocks(rb, pool));
        rb.clear();
    }

    /// Frees the blocks whose tokens the next token no longer attends to, replacing them
    /// with nulls (by the type's rule: `kind.rs`, `remove_skipped_blocks`); R-SWA frees
    /// its gap only when given the prompt length, as vLLM's.
    pub fn remove_skipped_blocks(
        &self,
        rb: &mut RequestBlocks,
        num_computed_tokens: usize,
        num_prompt_tokens: Option<usize>,
        pool: &mut BlockPool,
    ) -> Result<()> {
        self.params.kind.remove_skipped_blocks(
            self,
            rb,
            num_computed_tokens,
            num_prompt_tokens,
            pool,
        )
    }

    /// The common `remove_skipped_blocks`: the blocks before the window of the next
    /// token become nulls; the freed blocks go back to the pool highest position first.
    pub(super) fn free_out_of_window(
        &self,
        rb: &mut RequestBlocks,
        num_computed_tokens: usize,
        pool: &mut BlockPool,
    ) -> Result<()> {
        let skipped = self.num_skipped_tokens(num_computed_tokens);
        if skipped == 0 {
            return Ok(());
        }
        let end = (skipped / self.block_size()).min(rb.table.len());
        let start = rb.table[..end]
            .iter()
            .rposition(|&b| b == NULL_BLOCK_ID)
            .map_or(0, |i| i + 1);
        if start < end {
            pool.free_blocks(rb.table[start..end].iter().rev().copied())?;
            rb.table[start..end].fill(NULL_BLOCK_ID);
        }
        Ok(())
    }
}
