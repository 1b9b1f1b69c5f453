//! Full attention (also MLA and sink): every block stays until the request ends, hits
//! are the longest run of cached blocks from the start.

use super::{cdiv, HitQuery, RequestBlocks, RequestView, SingleTypeManager};
use crate::error::Result;
use crate::pool::BlockPool;
use crate::types::BlockId;

/// Scans left to right and stops at the first miss: chained hashes make the set of
/// cached prefixes downward-closed. EAGLE drops one block; the result is aligned down.
pub(crate) fn find_longest_cache_hit(
    q: &HitQuery<'_>,
    bs: usize,
    pool: &BlockPool,
    out: &mut [Vec<BlockId>],
) -> usize {
    let max_blocks = (q.max_length / bs).min(q.num_hashed_blocks(bs));
    let mut n = 0;
    if let [single] = out {
        // One group (the common case): no all-groups bookkeeping per block.
        let (k, g) = (bs / q.hash_block_size, q.groups[0]);
        single.reserve(max_blocks);
        while n < max_blocks {
            match pool.cached_block(&q.hashes[(n + 1) * k - 1], g) {
                Some(b) => single.push(b),
                None => break,
            }
            n += 1;
        }
    } else {
        while n < max_blocks && q.push_hit(pool, bs, n, out) {
            n += 1;
        }
    }
    let mut hit = n * bs;
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
