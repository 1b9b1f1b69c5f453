//! Mamba state. Mode `"none"` (prefix caching off): one live state block
//! per request plus the speculative blocks, through the common code. Mode `"align"`
//! (prefix caching on), for the subset kvblocks supports: the Mamba block size equals
//! the hash block size (no fine-grained partial hits, no copy-on-write), no speculative
//! or prefill-checkpoint blocks, dense caching. The table is position-indexed: entry `i`
//! is the state after token `(i + 1) * bs`; only the live state (and the previous step's,
//! which the kernel copies from) is real, the rest are nulls.

use rustc_hash::FxHashSet;

use super::{AttentionKind, HitQuery, RequestBlocks, SingleTypeManager};
use crate::arith::cdiv;
use crate::error::{KvError, Result};
use crate::pool::{BlockPool, HashKey};
use crate::spec::{MambaCacheMode, MambaSpec};
use crate::types::{BlockId, NULL_BLOCK_ID};

/// The `kv_cache_spec_kind` of this type's events.
pub(crate) const SPEC_KIND: &str = "mamba";

/// The manager parameters of a Mamba spec; "align" mode with speculative or
/// prefill-checkpoint blocks is not supported.
pub(crate) fn kind(m: &MambaSpec) -> Result<AttentionKind> {
    let align = m.mamba_cache_mode == MambaCacheMode::Align;
    if align && (m.num_speculative_blocks > 0 || m.num_prefill_checkpoint_blocks > 0) {
        return Err(unsupported(
            "\"align\" mode with speculative or prefill-checkpoint blocks",
        ));
    }
    Ok(AttentionKind::Mamba {
        num_speculative_blocks: m.num_speculative_blocks,
        align,
    })
}

/// The most state blocks one request holds: "align" keeps the live state, the previous
/// one and the speculative and prefill-checkpoint blocks; "none" the live state and the
/// speculative blocks. `None` on overflow.
pub(crate) fn max_blocks_per_request(m: &MambaSpec) -> Option<usize> {
    match m.mamba_cache_mode {
        MambaCacheMode::Align => 2usize
            .checked_add(m.num_speculative_blocks)?
            .checked_add(m.num_prefill_checkpoint_blocks),
        MambaCacheMode::None => m.num_speculative_blocks.checked_add(1),
    }
}

/// Prefix caching needs "align" mode, with the hash block size as the block size (no
/// fine-grained hits) and dense caching (`sparse` off).
pub(crate) fn check_prefix_caching(
    align: bool,
    block_size: usize,
    hash_block_size: usize,
    sparse: bool,
) -> Result<()> {
    if !align {
        // vLLM 0.33 asserts this away; 0.32 builds a manager for it, which kvblocks does
        // not have (unsupported, so kvblocks.vllm falls back).
        return Err(unsupported(
            "prefix caching requires mamba_cache_mode='align'; use enable_caching=False",
        ));
    }
    if block_size != hash_block_size || sparse {
        return Err(unsupported(
            "\"align\" mode with a block size other than hash_block_size (fine-grained hits) \
             or with sparse retention",
        ));
    }
    Ok(())
}

/// Slots for `num_tokens` tokens: the speculative state blocks come on top.
#[inline]
pub(crate) fn slot_tokens(num_tokens: usize, bs: usize, num_speculative_blocks: usize) -> usize {
    num_tokens + bs * num_speculative_blocks
}

/// Per-request state of an align-mode Mamba group.
#[derive(Debug, Clone, Copy, Default)]
pub struct MambaState {
    /// Whether blocks were allocated for the request (vLLM's `_allocated_block_reqs`).
    allocated: bool,
    /// The state block of the previous step, freed once the next state is computed.
    last_state_idx: Option<usize>,
    /// Leading table entries already retired (`_num_retired_blocks`).
    retired: usize,
}

/// `n - 1`: only the last token's state is needed.
#[inline]
pub(crate) fn num_skipped_tokens(n: usize) -> usize {
    n.saturating_sub(1)
}

/// Mamba features of vLLM 0.33 that kvblocks does not implement.
#[cold]
pub(crate) fn unsupported(what: &str) -> KvError {
    KvError::Unsupported(format!("Mamba {what}"))
}

/// Align mode: the rightmost cached state at or below `max_length` (on an aligned
/// boundary) is the hit; positions before it are nulls.
pub(crate) fn find_longest_cache_hit(
    q: &HitQuery<'_>,
    bs: usize,
    pool: &BlockPool,
    out: &mut [Vec<BlockId>],
) -> usize {
    let max_blocks = q.max_blocks(bs);
    for i in (0..max_blocks).rev() {
        let h = q.hash(bs, i);
        if q.groups.iter().any(|&g| pool.cached_block(h, g).is_none()) {
            continue;
        }
        if bs != q.alignment && !((i + 1) * bs).is_multiple_of(q.alignment) {
            continue;
        }
        for (o, &g) in out.iter_mut().zip(q.groups) {
            o.resize(i, NULL_BLOCK_ID);
            o.extend(pool.cached_block(h, g));
        }
        return (i + 1) * bs;
    }
    0
}

/// Mamba's `get_num_blocks_to_allocate`: `num_blocks + 1` (never fits) when the hit's
/// last block was cached during this step, so the request waits a step; the "align"
/// count below; `None` (the common count) otherwise.
pub(crate) fn own_num_blocks_to_allocate(
    mgr: &SingleTypeManager,
    rb: &RequestBlocks,
    align: bool,
    num_tokens_main_model: usize,
    hits: &[BlockId],
    pool: &BlockPool,
) -> Option<isize> {
    if let Some(&last) = hits.last() {
        let key = pool.block_hash(last).ok().flatten();
        if key.is_some_and(|k| mgr.cached_this_step.contains(&k)) {
            return Some(pool.num_blocks() as isize + 1);
        }
    }
    align.then(|| num_blocks_to_allocate(mgr, rb, num_tokens_main_model, hits, pool))
}

/// Align mode `get_num_blocks_to_allocate`: at most one new state block per step, plus
/// the hits still in the free queue. May be negative (over-allocated drafts), as vLLM.
fn num_blocks_to_allocate(
    mgr: &SingleTypeManager,
    rb: &RequestBlocks,
    num_tokens_main_model: usize,
    hits: &[BlockId],
    pool: &BlockPool,
) -> isize {
    let required = cdiv(num_tokens_main_model, mgr.block_size()) as isize;
    let mut new = required - hits.len() as isize - rb.table.len() as isize;
    if new > 0 {
        new = new.min(1);
    }
    let evictable = hits
        .iter()
        .filter(|&&b| b != NULL_BLOCK_ID && pool.ref_cnt(b).unwrap_or(1) == 0)
        .count();
    new + evictable as isize
}

/// Align mode `allocate_new_blocks`: pads with nulls up to the state position of the
/// last token, then takes at most one new block; records the previous state block.
pub(crate) fn allocate_new_blocks(
    mgr: &SingleTypeManager,
    rb: &mut RequestBlocks,
    num_tokens_main_model: usize,
    pool: &mut BlockPool,
) -> Result<()> {
    let required = cdiv(num_tokens_main_model, mgr.block_size());
    let prev = rb.table.len();
    if required <= prev {
        rb.mamba.allocated = true;
        return Ok(());
    }
    if rb.mamba.allocated || prev > 0 {
        rb.mamba.last_state_idx = prev.checked_sub(1);
    }
    let skipped = required - 1;
    if prev < skipped {
        rb.table.resize(skipped, NULL_BLOCK_ID);
    }
    let new = required - rb.table.len();
    pool.get_new_blocks_into(new, &mut rb.table)?;
    rb.mamba.allocated = true;
    Ok(())
}

/// Align mode `remove_skipped_blocks`: retires every state before the last token's
/// (skipping nulls, highest first), then frees the previous step's state block once the
/// state after it exists.
pub(crate) fn remove_skipped_blocks(
    mgr: &SingleTypeManager,
    rb: &mut RequestBlocks,
    num_computed_tokens: usize,
    pool: &mut BlockPool,
) -> Result<()> {
    let bs = mgr.block_size();
    let skipped = num_skipped_tokens(num_computed_tokens);
    if skipped > 0 {
        let first = rb.mamba.retired;
        let last = (skipped / bs).min(rb.table.len());
        if first < last {
            let freed = rb.table[first..last]
                .iter()
                .rev()
                .copied()
                .filter(|&b| b != NULL_BLOCK_ID);
            pool.free_blocks(freed)?;
            rb.table[first..last].fill(NULL_BLOCK_ID);
            rb.mamba.retired = last;
        }
    }
    if let Some(idx) = rb.mamba.last_state_idx {
        if idx + 1 < cdiv(num_computed_tokens, bs) && rb.table[idx] != NULL_BLOCK_ID {
            pool.free_blocks([rb.table[idx]])?;
            rb.table[idx] = NULL_BLOCK_ID;
        }
    }
    Ok(())
}

/// Align mode: remembers the keys of the newly cached `blocks` (nulls skipped), which
/// other requests may not hit until the next step.
pub(crate) fn note_cached_blocks(
    blocks: &[BlockId],
    cached_this_step: &mut FxHashSet<HashKey>,
    pool: &BlockPool,
) -> Result<()> {
    for &b in blocks {
        if let Some(key) = pool.block_hash(b)?.filter(|_| b != NULL_BLOCK_ID) {
            cached_this_step.insert(key);
        }
    }
    Ok(())
}
