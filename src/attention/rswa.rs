//! Reference sliding window attention (vLLM 0.33's `RSWAManager`, a full attention
//! manager): the prompt stays cached and visible; of the generated tokens only the last
//! `rswa_window` are kept, and the blocks wholly in the gap between the prompt and that
//! window are freed and nulled as decoding advances.

use super::{AttentionKind, RequestBlocks};
use crate::arith::cdiv;
use crate::error::Result;
use crate::pool::BlockPool;
use crate::spec::RswaSpec;
use crate::types::NULL_BLOCK_ID;

/// The manager parameters of an R-SWA spec.
pub(crate) fn kind(s: &RswaSpec) -> AttentionKind {
    AttentionKind::Rswa {
        rswa_window: s.rswa_window,
    }
}

/// Frees the gap blocks `[cdiv(P, bs), max(P, n - rswa_window) / bs)` for a prompt of `P`
/// tokens and `n` processed tokens, highest first, stopping at the first block already
/// nulled (vLLM's `_remove_blocks_in_range`), and nulls them in the table.
pub(crate) fn remove_gap_blocks(
    rb: &mut RequestBlocks,
    rswa_window: usize,
    bs: usize,
    num_computed_tokens: usize,
    num_prompt_tokens: usize,
    pool: &mut BlockPool,
) -> Result<()> {
    let first = cdiv(num_prompt_tokens, bs);
    let window_start = num_prompt_tokens.max(num_computed_tokens.saturating_sub(rswa_window));
    let last = (window_start / bs).min(rb.table.len());
    if first >= last {
        return Ok(());
    }
    let start = rb.table[first..last]
        .iter()
        .rposition(|&b| b == NULL_BLOCK_ID)
        .map_or(first, |i| first + i + 1);
    if start < last {
        pool.free_blocks(rb.table[start..last].iter().rev().copied())?;
        rb.table[start..last].fill(NULL_BLOCK_ID);
    }
    Ok(())
}
