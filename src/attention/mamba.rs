//! Mamba state. Mode `"none"`: one live state block per request plus the speculative
//! blocks, through the common code (prefix caching off, or, under vLLM 0.32's rule, on:
//! every full block cached, hits by the align-mode search). Mode `"align"`
//! (prefix caching on): the table is position-indexed, entry `i` is the
//! state after token `(i + 1) * bs`; only the live state, the previous step's (which the
//! kernel copies from), the speculative blocks after it and a prefill checkpoint are
//! real, the rest are nulls. Each step takes at most one new state block (plus the
//! checkpoint block, and the speculative blocks on the first allocation); speculative
//! blocks the step leaves behind move to the table's end. Every state cached in align
//! mode is offered to a KV connector (`take_boundary_state_offloads`). Under sparse
//! retention (`prefix_cache_retention_interval`) only the states a later request can
//! resume at are cached (`cache_mask`), and with retention 0 a prefill checkpoint is
//! reserved only on the chunk reaching the prefill's end.

use std::ops::Range;

use super::caching::reachable_boundaries;
use super::{
    AttentionKind, CachedBlocks, HitQuery, RequestBlocks, RequestView, SingleTypeManager,
    SparseCaching,
};
use crate::arith::cdiv;
use crate::error::{KvError, Result};
use crate::pool::{BlockPool, HashKey};
use crate::spec::{MambaCacheMode, MambaSpec};
use crate::types::{BlockId, GroupId, NULL_BLOCK_ID};

/// The `kv_cache_spec_kind` of this type's events.
pub(crate) const SPEC_KIND: &str = "mamba";

/// The manager parameters of a Mamba spec. Prefill checkpoints need "align" mode and a
/// `prefill_checkpoint_alignment` (vLLM never exports one without it).
pub(crate) fn kind(m: &MambaSpec) -> Result<AttentionKind> {
    let align = m.mamba_cache_mode == MambaCacheMode::Align;
    let checkpoints = align && m.num_prefill_checkpoint_blocks > 0;
    let checkpoint_alignment = m.prefill_checkpoint_alignment.filter(|_| checkpoints);
    if checkpoint_alignment == Some(0) {
        return Err(KvError::InvalidSpec(
            "prefill_checkpoint_alignment must be positive".into(),
        ));
    }
    Ok(AttentionKind::Mamba {
        num_speculative_blocks: m.num_speculative_blocks,
        align,
        checkpoint_alignment,
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

/// Prefix caching needs "align" mode, or mode "none" under vLLM 0.32's rule
/// (`allowed`); a block coarser than a hash block allows partial hits (`partial_hits.rs`).
pub(crate) fn check_prefix_caching(allowed: bool) -> Result<()> {
    if !allowed {
        // vLLM 0.33 asserts this away; 0.32 builds a manager for it, which kvblocks
        // follows only under 0.32's rule (`mamba_none_prefix_caching`).
        return Err(unsupported(
            "prefix caching requires mamba_cache_mode='align'; use enable_caching=False",
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
    /// This step's prefill checkpoint: its token position and table index
    /// (`_checkpoints`).
    checkpoint: Option<(usize, usize)>,
    /// The partial tail this request cached at its prompt's last hash boundary inside
    /// a block: the block and the boundary (`_producer_partial_tail_reqs`).
    producer_tail: Option<(BlockId, usize)>,
}

impl MambaState {
    /// This step's prefill checkpoint, `(position, table index)`.
    #[inline]
    pub fn checkpoint(&self) -> Option<(usize, usize)> {
        self.checkpoint
    }
}

/// vLLM's `get_mamba_prefill_checkpoint_position`: the reusable state boundary of a
/// prefill of `num_tokens` tokens, a multiple of `alignment` that leaves a token to
/// recompute the logits from, and the `hash_lookahead` tokens the boundary's hash
/// covers (EAGLE: one `alignment` less, the dropped block).
pub(crate) fn checkpoint_position(
    num_tokens: usize,
    alignment: usize,
    drop_eagle: bool,
    hash_lookahead: usize,
) -> usize {
    let limit = if drop_eagle {
        num_tokens
    } else {
        num_tokens.saturating_sub(hash_lookahead.max(1))
    };
    let position = limit / alignment * alignment;
    if drop_eagle {
        position.saturating_sub(alignment)
    } else {
        position
    }
}

/// vLLM's `is_mamba_prefill_checkpoint_valid`: whether the kernel can export the state
/// at `position` from a query `[start, end)`, into the table column before the last.
pub(crate) fn checkpoint_exportable(
    start: usize,
    end: usize,
    position: usize,
    hash_bs: usize,
    bs: usize,
    alignment: usize,
) -> bool {
    // A query from token 0 starts from no state column.
    let initial_col = if start == 0 {
        -1
    } else {
        ((start - 1) / bs) as isize
    };
    let checkpoint_col = cdiv(end, bs) as isize - 2;
    start.is_multiple_of(hash_bs)
        && checkpoint_col > initial_col
        && start + hash_bs <= position
        && start < position
        && position < end
        && (position - start).is_multiple_of(alignment)
}

/// vLLM's `_needs_internal_checkpoint` for a step computing tokens `[start, end)`:
/// `(position, table index)` of the prefill checkpoint the step reserves a block for,
/// if any. The index must not hold a state already (unless it is a speculative block).
fn internal_checkpoint(
    mgr: &SingleTypeManager,
    rb: &RequestBlocks,
    alignment: usize,
    start: usize,
    end: usize,
    pool: &BlockPool,
) -> Option<(usize, usize)> {
    let bs = mgr.block_size();
    let lookahead = pool.num_hash_lookahead_tokens();
    let position = checkpoint_position(
        end,
        mgr.alignment_tokens,
        mgr.use_eagle_checkpoint,
        lookahead,
    );
    let idx = cdiv(end, bs).checked_sub(2)?;
    if !checkpoint_exportable(start, end, position, pool.hash_block_size(), bs, alignment) {
        return None;
    }
    let num_spec = mgr.params().kind.num_speculative_blocks();
    let free_slot = idx >= rb.table.len()
        || rb.table[idx] == NULL_BLOCK_ID
        || (rb.mamba.allocated && idx + num_spec >= rb.table.len());
    free_slot.then_some((position, idx))
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
/// boundary; with fine-grained hits, at any hash boundary) is the hit; positions
/// before it are nulls.
pub(crate) fn find_longest_cache_hit<P: CachedBlocks + ?Sized>(
    q: &HitQuery<'_>,
    bs: usize,
    pool: &P,
    out: &mut [Vec<BlockId>],
) -> usize {
    if q.fine_grained(bs) {
        return q.last_cached_unit(pool, bs, out);
    }
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
/// count below for a step computing tokens `[start, num_tokens_main_model)` (a prefill
/// checkpoint only if it reaches `prefill_end`); `None` (the common count) otherwise.
#[allow(clippy::too_many_arguments)]
pub(crate) fn own_num_blocks_to_allocate(
    mgr: &SingleTypeManager,
    rb: &RequestBlocks,
    align: bool,
    start: usize,
    num_tokens_main_model: usize,
    prefill_end: usize,
    hits: &[BlockId],
    partial_hit: bool,
    pool: &BlockPool,
) -> Option<isize> {
    if let Some(&last) = hits.last() {
        let key = pool.block_hash(last).ok().flatten();
        if key.is_some_and(|k| mgr.cached_this_step.contains(&k)) {
            return Some(pool.num_blocks() as isize + 1);
        }
    }
    let partial_hit = partial_hit || rb.partial_hit.is_some();
    align.then(|| {
        num_blocks_to_allocate(
            mgr,
            rb,
            start,
            num_tokens_main_model,
            prefill_end,
            hits,
            partial_hit,
            pool,
        )
    })
}

/// The blocks an align-mode step may take at most: one state block, a partial hit's
/// copy, the checkpoint block, and the speculative blocks on the request's first
/// allocation.
fn max_new_blocks(
    rb: &RequestBlocks,
    num_spec: usize,
    partial_hit: bool,
    checkpoint: bool,
) -> usize {
    1 + usize::from(partial_hit)
        + usize::from(checkpoint)
        + if rb.mamba.allocated { 0 } else { num_spec }
}

/// The prefill checkpoint of a step computing `[start, end)`, for a kind that has
/// checkpoint blocks and a step reaching `prefill_end` (vLLM's coordinator passes the
/// prefill's end under retention 0 only, else 0: every chunk publishes a state).
fn step_checkpoint(
    mgr: &SingleTypeManager,
    rb: &RequestBlocks,
    start: usize,
    end: usize,
    prefill_end: usize,
    pool: &BlockPool,
) -> Option<(usize, usize)> {
    if end < prefill_end {
        return None;
    }
    let alignment = mgr.params().kind.checkpoint_alignment()?;
    internal_checkpoint(mgr, rb, alignment, start, end, pool)
}

/// Align mode `get_num_blocks_to_allocate`: the state positions up to the last token
/// plus the speculative blocks (a partial hit's copy on top), capped at
/// [`max_new_blocks`], plus the hits still in the free queue. May be negative
/// (over-allocated drafts), as vLLM.
#[allow(clippy::too_many_arguments)]
fn num_blocks_to_allocate(
    mgr: &SingleTypeManager,
    rb: &RequestBlocks,
    start: usize,
    num_tokens_main_model: usize,
    prefill_end: usize,
    hits: &[BlockId],
    partial_hit: bool,
    pool: &BlockPool,
) -> isize {
    let num_spec = mgr.params().kind.num_speculative_blocks();
    let required = (cdiv(num_tokens_main_model, mgr.block_size()) + num_spec) as isize;
    let mut new = required - hits.len() as isize - rb.table.len() as isize;
    if partial_hit {
        new = new.max(0) + 1;
    }
    if new > 0 {
        let checkpoint = step_checkpoint(mgr, rb, start, num_tokens_main_model, prefill_end, pool);
        let cap = max_new_blocks(rb, num_spec, partial_hit, checkpoint.is_some());
        new = new.min(cap as isize);
    }
    let evictable = hits
        .iter()
        .filter(|&&b| b != NULL_BLOCK_ID && pool.ref_cnt(b).unwrap_or(1) == 0)
        .count();
    new + evictable as isize
}

/// Align mode `allocate_new_blocks` for a step of request `request_id` computing
/// `[start, num_tokens_main_model)` (a prefill checkpoint only if it reaches
/// `prefill_end`): records the previous state block, pads with nulls
/// up to the state position of the last token (short of this step's checkpoint block),
/// moves the speculative blocks the step leaves behind to the end, then takes the new
/// blocks, the first one for a partial hit's copy ([`copy_partial_tail`]). Returns
/// the copy where it replaced a table entry in place.
pub(crate) fn allocate_new_blocks(
    mgr: &mut SingleTypeManager,
    rb: &mut RequestBlocks,
    request_id: &str,
    start: usize,
    num_tokens_main_model: usize,
    prefill_end: usize,
    pool: &mut BlockPool,
) -> Result<Option<BlockId>> {
    let num_spec = mgr.params().kind.num_speculative_blocks();
    let checkpoint = step_checkpoint(mgr, rb, start, num_tokens_main_model, prefill_end, pool);
    rb.mamba.checkpoint = checkpoint;
    let required = cdiv(num_tokens_main_model, mgr.block_size()) + num_spec;
    let prev = rb.table.len();
    let partial_hit = rb.partial_hit.take();
    if required <= prev && partial_hit.is_none() && checkpoint.is_none() {
        rb.mamba.allocated = true;
        return Ok(None);
    }
    let allocated = rb.mamba.allocated;
    if allocated {
        // The running state sits before the speculative blocks.
        rb.mamba.last_state_idx = prev.checked_sub(1 + num_spec);
    } else if prev > 0 {
        // A prefix hit's last block holds the hit state.
        rb.mamba.last_state_idx = Some(prev - 1);
    }
    let skipped = required - num_spec - 1;
    let null_end = skipped - usize::from(checkpoint.is_some());
    if prev < null_end {
        rb.table.resize(null_end, NULL_BLOCK_ID);
    }
    if allocated {
        for idx in prev.saturating_sub(num_spec)..prev.min(null_end) {
            relocate_speculative_block(rb, idx, pool)?;
        }
    }
    let new = required.saturating_sub(rb.table.len()) + usize::from(partial_hit.is_some());
    debug_assert!(new <= max_new_blocks(rb, num_spec, partial_hit.is_some(), checkpoint.is_some()));
    let first_new = rb.table.len();
    pool.get_new_blocks_into(new, &mut rb.table)?;
    let mut replaced = None;
    if let Some((idx, source)) = partial_hit {
        let cow = rb.table.remove(first_new);
        replaced = copy_partial_tail(mgr, rb, request_id, idx, source, cow, pool)?;
    }
    rb.mamba.allocated = true;
    Ok(replaced)
}

/// A partial hit's copy-on-write in align mode. A new request's table takes the copy
/// (`copy_on_write.rs`). A running request (the producer of a partial tail it cached
/// itself) stays on `source`, which it keeps writing: the cache entries move to the
/// copy instead, both blocks keep a reference for the copy, the copy's key is not hit
/// during this step, and the copy of the producer's own boundary state is offered to
/// a KV connector. Returns the copy where it replaced the table entry.
fn copy_partial_tail(
    mgr: &mut SingleTypeManager,
    rb: &mut RequestBlocks,
    request_id: &str,
    idx: usize,
    source: BlockId,
    cow: BlockId,
    pool: &mut BlockPool,
) -> Result<Option<BlockId>> {
    if !rb.mamba.allocated {
        mgr.apply_cow(rb, idx, source, cow, pool)?;
        return Ok(Some(cow));
    }
    if rb.table.get(idx) != Some(&source) {
        return Err(KvError::InvalidArgument(format!(
            "partial tail block {source} is not at table entry {idx}"
        )));
    }
    pool.move_block_hashes(source, cow)?;
    pool.retain(source)?;
    mgr.pending_copies.push((source, cow));
    if let Some((_, num_tokens)) = rb.mamba.producer_tail.take() {
        mgr.boundary_offloads.push(BoundaryOffload {
            request_id: request_id.to_owned(),
            group: mgr.group(),
            block: cow,
            num_tokens,
        });
    }
    if let Some(key) = pool.block_hash(cow)? {
        mgr.cached_this_step.insert(key);
    }
    Ok(None)
}

/// vLLM's `finalize_partial_tail_offload` when a request finishes after `num_computed`
/// tokens with `num_in_flight` still in flight: the partial tail it cached itself, if
/// no later token was computed into its block, as `(block, boundary)`.
pub(crate) fn finalize_partial_tail(
    rb: &mut RequestBlocks,
    num_computed: usize,
    num_in_flight: usize,
) -> Option<(BlockId, usize)> {
    let (block, boundary) = rb.mamba.producer_tail.take()?;
    (num_in_flight == 0 && num_computed == boundary).then_some((block, boundary))
}

/// vLLM's `_relocate_speculative_block`: a speculative block the step leaves behind
/// moves to the table's end; it must be the request's own, uncached block.
fn relocate_speculative_block(rb: &mut RequestBlocks, idx: usize, pool: &BlockPool) -> Result<()> {
    let block = rb.table[idx];
    let writable =
        block != NULL_BLOCK_ID && pool.ref_cnt(block)? == 1 && pool.block_hash(block)?.is_none();
    if !writable {
        return Err(KvError::InvalidArgument(format!(
            "speculative Mamba block {block} must be exclusively owned and unhashed to move"
        )));
    }
    rb.table.push(block);
    rb.table[idx] = NULL_BLOCK_ID;
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

/// Whether the retention keeps the state of table entry `idx` (after token
/// `(idx + 1) * bs`) as a segment boundary: dense caching keeps every state, retention 0
/// none, an interval `n` the last state of every `n`-token segment (every state when
/// `n` spans at most one block).
fn keeps_segment_state(idx: usize, bs: usize, sparse_caching: SparseCaching) -> bool {
    match sparse_caching {
        SparseCaching::Dense => true,
        SparseCaching::Interval(0) => false,
        SparseCaching::Interval(n) => {
            let per_segment = n / bs;
            per_segment <= 1 || (idx + 1).is_multiple_of(per_segment)
        }
    }
}

/// Which of the table entries `start..end` get cached under sparse retention (vLLM's
/// `MambaManager.reachable_block_mask`; `None`, all of them, for dense caching or an
/// interval of at most one block): the segment-boundary states
/// ([`keeps_segment_state`]) and the state ending on each replay boundary and on the
/// request's shared-prefix junction (each floored to the hit alignment), where a later
/// request resumes.
pub(crate) fn cache_mask<R: RequestView>(
    mgr: &SingleTypeManager,
    request: &R,
    start: usize,
    end: usize,
    sparse_caching: SparseCaching,
    replay_boundaries: &[usize],
) -> Option<Vec<bool>> {
    let bs = mgr.block_size();
    match sparse_caching {
        SparseCaching::Dense => return None,
        SparseCaching::Interval(n) if n > 0 && n / bs <= 1 => return None,
        SparseCaching::Interval(_) => {}
    }
    let mut mask: Vec<bool> = (start..end)
        .map(|i| keeps_segment_state(i, bs, sparse_caching))
        .collect();
    let mut boundaries = [0usize; 4];
    let nb = reachable_boundaries(mgr, request, replay_boundaries, &mut boundaries);
    let alignment = mgr.alignment_tokens;
    for &b in &boundaries[..nb] {
        let Some(idx) = (b / alignment * alignment / bs).checked_sub(1) else {
            continue;
        };
        if (start..end).contains(&idx) {
            mask[idx - start] = true;
        }
    }
    Some(mask)
}

/// A cached align-mode state offered to a KV connector (vLLM's
/// `take_pending_boundary_state_offloads` entry): the state after `num_tokens` tokens
/// of request `request_id`, in `block` of group `group`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundaryOffload {
    /// The request that computed the state.
    pub request_id: String,
    /// The group.
    pub group: GroupId,
    /// The block holding the state.
    pub block: BlockId,
    /// The tokens the state follows (the block's cache key covers them).
    pub num_tokens: usize,
}

/// After `cache_blocks` cached the table entries `cached` of `request` (up to
/// `num_tokens`): in align mode, keys the step's prefill checkpoint or the prompt's last
/// hash boundary ([`cache_partial_tail_block`]); in both modes remembers the keys of the
/// newly cached states, which other requests may not hit until the next step; in align
/// mode offers each state to a KV connector (sparse caching leaves the masked states
/// unkeyed: skipped). Mode "none" is cached only under vLLM 0.32's rule.
#[allow(clippy::too_many_arguments)]
pub(crate) fn after_cache_blocks<R: RequestView>(
    mgr: &mut SingleTypeManager,
    align: bool,
    rb: &mut RequestBlocks,
    request: &R,
    num_tokens: usize,
    cached: Range<usize>,
    sparse_caching: SparseCaching,
    pool: &mut BlockPool,
) -> Result<()> {
    if align {
        let tail = cache_partial_tail_block(mgr, rb, request, num_tokens, sparse_caching, pool)?;
        if let Some(key) = tail {
            mgr.cached_this_step.insert(key);
        }
    }
    for &block in &rb.table[cached] {
        if block == NULL_BLOCK_ID {
            continue;
        }
        let Some(key) = pool.block_hash(block)? else {
            continue;
        };
        mgr.cached_this_step.insert(key);
        if !align {
            continue;
        }
        mgr.boundary_offloads.push(BoundaryOffload {
            request_id: request.request_id().to_owned(),
            group: mgr.group(),
            block,
            num_tokens: pool.block_hash_num_tokens(block)?.unwrap_or(0),
        });
    }
    Ok(())
}

/// vLLM's `_cache_partial_tail_block`: the step's prefill checkpoint block is re-keyed
/// at its checkpoint position, or dropped from the cache when that position is neither
/// the prompt's checkpoint, a block boundary the retention keeps
/// ([`keeps_segment_state`]) nor the request's shared-prefix junction; without a
/// checkpoint, the state at the prompt's last hash boundary (or, armed, at the request's
/// shared-prefix junction) is keyed there, and when that boundary is inside a block, the
/// request itself copies the block before it writes past the boundary (its partial hit,
/// with the block's earlier whole blocks cached). Returns the key it registered.
fn cache_partial_tail_block<R: RequestView>(
    mgr: &SingleTypeManager,
    rb: &mut RequestBlocks,
    request: &R,
    num_tokens: usize,
    sparse_caching: SparseCaching,
    pool: &mut BlockPool,
) -> Result<Option<HashKey>> {
    let (bs, hash_bs) = (mgr.block_size(), pool.hash_block_size());
    let drop_eagle = mgr.use_eagle_checkpoint;
    let lookahead = pool.num_hash_lookahead_tokens();
    let (position, block) = if let Some((position, idx)) = rb.mamba.checkpoint {
        let block = rb.table[idx];
        if block == NULL_BLOCK_ID {
            return Ok(None);
        }
        let prompt_checkpoint = position
            == checkpoint_position(
                request.num_prompt_tokens(),
                mgr.alignment_tokens,
                drop_eagle,
                lookahead,
            );
        let retained = position.is_multiple_of(bs)
            && keeps_segment_state(position / bs - 1, bs, sparse_caching);
        if !prompt_checkpoint && !retained && position != request.shared_prefix_boundary() {
            // The transient state overwrites the block: no key of it holds.
            pool.evict_blocks(&[block])?;
            return Ok(None);
        }
        if pool.block_hash_num_tokens(block)? == Some(position) {
            return Ok(None);
        }
        // The block's content is replaced: every key it had goes.
        pool.evict_blocks(&[block])?;
        (position, block)
    } else {
        let prompt = request.num_prompt_tokens();
        // The junction where a sibling resumes, within the prompt chunk being computed.
        let junction = mgr.shared_prefix_checkpoint
            && num_tokens == request.shared_prefix_boundary()
            && request.num_computed_tokens() < num_tokens
            && num_tokens <= prompt;
        if num_tokens == 0
            || !num_tokens.is_multiple_of(hash_bs)
            || (num_tokens != checkpoint_position(prompt, hash_bs, drop_eagle, lookahead)
                && !junction)
        {
            return Ok(None);
        }
        let block = match rb.table.get(cdiv(num_tokens, bs) - 1) {
            Some(&b) if b != NULL_BLOCK_ID => b,
            _ => return Ok(None),
        };
        // Already keyed here (a hit or an earlier step): re-keying would defer siblings.
        if pool.block_hash_num_tokens(block)? == Some(num_tokens) {
            return Ok(None);
        }
        (num_tokens, block)
    };
    let hashes = request.block_hashes();
    pool.cache_partial_block(hashes, block, position, mgr.group(), request)?;
    if rb.mamba.checkpoint.is_none() && !position.is_multiple_of(bs) {
        let idx = cdiv(position, bs) - 1;
        rb.partial_hit = Some((idx, block));
        rb.num_cached = Some(idx);
        rb.mamba.producer_tail = Some((block, position));
    }
    Ok(Some(HashKey {
        hash: hashes[position / hash_bs - 1],
        group: mgr.group(),
    }))
}
