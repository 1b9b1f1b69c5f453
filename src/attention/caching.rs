//! Caching in one group: which full blocks a request caches
//! ([`SingleTypeManager::cache_blocks`]) and vLLM's sparse prefix caching
//! ([`SparseCaching`]).

use super::{full, RequestBlocks, RequestView, SingleTypeManager};
use crate::error::Result;
use crate::pool::BlockPool;

impl SingleTypeManager {
    /// The number of full blocks `cache_blocks(request, num_tokens)` would reach.
    #[inline]
    pub fn num_full_blocks(&self, num_tokens: usize, num_hashes: usize, hash_bs: usize) -> usize {
        num_tokens.min(num_hashes * hash_bs) / self.block_size()
    }

    /// Caches the request's newly full blocks (vLLM's `cache_blocks`).
    // Always inlined. With `Coordinator::cache_blocks` inlined into its callers, the
    // extension kept this one out of line: a call per group per `allocate_slots`
    // (callgrind, replay.py shared-prefix / hybrid: 743.8M -> 737.9M instructions in the
    // extension; the Rust decode driver, which inlined it already, 2,086.8 -> 2,093.5 per
    // call with SWA; docs/speed.md).
    #[inline(always)]
    pub fn cache_blocks<R: RequestView>(
        &mut self,
        rb: &mut RequestBlocks,
        request: &R,
        num_tokens: usize,
        sparse_caching: SparseCaching,
        replay_boundaries: &[usize],
        pool: &mut BlockPool,
    ) -> Result<()> {
        let bs = self.block_size();
        let hash_bs = pool.hash_block_size();
        let hashes = request.block_hashes();
        let num_cached = rb.num_cached.unwrap_or(0);
        let num_full = self.num_full_blocks(num_tokens, hashes.len(), hash_bs);
        let mut cached = 0..0;
        if num_cached < num_full {
            // vLLM slices the table: blocks past its end (a request longer than the
            // context) are silently not cached, yet counted as cached.
            let end = num_full.min(rb.table.len());
            let start = num_cached.min(end);
            if start < end {
                let kind = &self.params.kind;
                let mask =
                    kind.cache_mask(self, request, start, end, sparse_caching, replay_boundaries);
                pool.cache_full_blocks(
                    hashes,
                    &rb.table,
                    start,
                    end,
                    bs,
                    self.group,
                    mask.as_deref(),
                    request,
                )?;
                cached = start..end;
            }
            rb.num_cached = Some(num_full);
        }
        let kind = self.params.kind;
        kind.after_cache_blocks(self, rb, request, num_tokens, cached, sparse_caching, pool)?;
        if self.params.kind.is_full_attention() && bs != hash_bs {
            full::cache_partial_tail_block(self, rb, request, num_tokens, pool)?;
        }
        Ok(())
    }
}

/// vLLM's `reachable_boundaries` in `cache_blocks`, for the sparse caching of sliding
/// windows and Mamba states: the replay boundaries (at most 2), then the request's
/// shared-prefix junction, if any, and with EAGLE the block before it (a sibling
/// diverging right after the junction cannot use the block past it as the EAGLE peek,
/// so its hit lands one block lower; vLLM 0.33). Written into `out`; returns how many.
pub(super) fn reachable_boundaries<R: RequestView>(
    mgr: &SingleTypeManager,
    request: &R,
    replay: &[usize],
    out: &mut [usize; 4],
) -> usize {
    let mut n = replay.len();
    out[..n].copy_from_slice(replay);
    let junction = request.shared_prefix_boundary();
    if junction > 0 {
        out[n] = junction;
        n += 1;
        if mgr.use_eagle {
            out[n] = junction.saturating_sub(mgr.block_size());
            n += 1;
        }
    }
    n
}

/// vLLM's sparse prefix caching of sliding-window and Mamba groups, set by
/// `KVCacheConfig.prefix_cache_retention_interval` (vLLM calls it "retention"; it has
/// nothing to do with kvblocks' eviction policies of `pool/retention.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SparseCaching {
    /// `None`: dense, every reachable full block is cached.
    #[default]
    Dense,
    /// `Some(0)` (0 = only the replay boundaries) or `Some(interval)`.
    Interval(usize),
}
