//! Full attention (also MLA and sink): every block stays until the request ends, hits
//! are the longest run of cached blocks from the start.

use super::{AttentionKind, CachedBlocks, HitQuery, RequestBlocks, RequestView, SingleTypeManager};
use crate::arith::cdiv;
use crate::error::{KvError, Result};
use crate::pool::BlockPool;
use crate::spec::SinkFullAttentionSpec;
use crate::types::BlockId;

/// The `kv_cache_spec_kind` of full attention's events.
pub(crate) const SPEC_KIND: &str = "full_attention";
/// The `kv_cache_spec_kind` of MLA's events (served as full attention).
pub(crate) const MLA_SPEC_KIND: &str = "mla_attention";
/// The `kv_cache_spec_kind` of sink full attention's events.
pub(crate) const SINK_SPEC_KIND: &str = "sink_full_attention";

/// The manager parameters of a sink spec (full and MLA specs are
/// [`AttentionKind::FullAttention`]).
pub(crate) fn sink_kind(s: &SinkFullAttentionSpec) -> AttentionKind {
    AttentionKind::SinkFullAttention {
        sink_len: s.sink_len,
    }
}

/// The sink blocks a sink manager takes at construction: `sink_len / bs`, which must be
/// a positive whole number. The one sink-length check: a sink spec's `build` calls it too.
pub(crate) fn num_sink_blocks(sink_len: usize, bs: usize) -> Result<usize> {
    if sink_len == 0 || !sink_len.is_multiple_of(bs) {
        return Err(KvError::InvalidSpec(format!(
            "sink_len ({sink_len}) must be a positive multiple of block_size ({bs})"
        )));
    }
    Ok(sink_len / bs)
}

/// The most blocks one request holds: the whole context, `cdiv(L, bs)`, where decode
/// context parallelism over `dcp_world_size` ranks shards the tokens of a sharded cache.
pub(crate) fn max_blocks_per_request(
    max_model_len: usize,
    dcp_sharded: bool,
    dcp_world_size: usize,
    bs: usize,
) -> usize {
    let mut len = max_model_len;
    if dcp_sharded && dcp_world_size > 1 {
        len = cdiv(len, dcp_world_size);
    }
    cdiv(len, bs)
}

/// Scans left to right and stops at the first miss: chained hashes make the set of
/// cached prefixes downward-closed; with fine-grained hits, then probes the hash
/// boundaries inside the next block. EAGLE drops one block (fine-grained: one hash
/// block); the result is aligned down.
pub(crate) fn find_longest_cache_hit<P: CachedBlocks + ?Sized>(
    q: &HitQuery<'_>,
    bs: usize,
    pool: &P,
    out: &mut [Vec<BlockId>],
) -> usize {
    let max_blocks = q.max_blocks(bs);
    let mut n = 0;
    if let [single] = out {
        // One group (the common case): no all-groups bookkeeping per block.
        let g = q.groups[0];
        single.reserve(max_blocks);
        pool.extend_leading_run(q.view(bs), max_blocks, g, single);
        n = single.len();
    } else {
        while n < max_blocks && q.push_hit(pool, bs, n, out) {
            n += 1;
        }
    }
    let mut hit = n * bs;
    if q.fine_grained(bs) {
        hit = q.extend_into_partial_block(pool, n, bs, out).unwrap_or(hit);
    }
    if q.drop_eagle && hit > 0 {
        hit -= q.alignment.min(bs);
    }
    hit -= hit % q.alignment;
    let keep = cdiv(hit, bs);
    for o in out.iter_mut() {
        o.truncate(keep);
    }
    hit
}

/// vLLM 0.33 registers the prompt's last hash boundary inside a full-attention block
/// as a partial prefix-cache entry when the group's block size exceeds the hash block
/// size (`_cache_partial_tail_block`). Lookups in kvblocks' configurations never use
/// such entries, but they give the block a hash, which decides where it goes when freed.
pub(crate) fn cache_partial_tail_block<R: RequestView>(
    mgr: &SingleTypeManager,
    rb: &RequestBlocks,
    request: &R,
    num_tokens: usize,
    pool: &mut BlockPool,
) -> Result<()> {
    let hash_bs = pool.hash_block_size();
    let prompt = request.num_prompt_tokens();
    let limit = if mgr.use_eagle {
        prompt
    } else {
        prompt.saturating_sub(1)
    };
    let hashes = request.block_hashes();
    let boundary = (limit / hash_bs).min(hashes.len()) * hash_bs;
    if boundary == 0 || boundary > num_tokens || boundary.is_multiple_of(mgr.block_size()) {
        return Ok(());
    }
    let Some(&block) = rb.table.get(boundary / mgr.block_size()) else {
        return Ok(());
    };
    pool.cache_partial_block(hashes, block, boundary, mgr.group(), request)
}
