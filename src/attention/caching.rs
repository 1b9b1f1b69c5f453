//! Caching in one group: which full blocks a request caches
//! ([`SingleTypeManager::cache_blocks`]) and the prefix-cache retention policy
//! ([`Retention`]).

use super::{full, sliding_window, AttentionKind, RequestBlocks, RequestView, SingleTypeManager};
use crate::error::Result;
use crate::pool::BlockPool;
use crate::types::NULL_BLOCK_ID;

impl SingleTypeManager {
    /// The number of full blocks `cache_blocks(request, num_tokens)` would reach.
    #[inline]
    pub fn num_full_blocks(&self, num_tokens: usize, num_hashes: usize, hash_bs: usize) -> usize {
        num_tokens.min(num_hashes * hash_bs) / self.block_size()
    }

    /// Caches the request's newly full blocks (vLLM's `cache_blocks`).
    pub fn cache_blocks<R: RequestView>(
        &mut self,
        rb: &mut RequestBlocks,
        request: &R,
        num_tokens: usize,
        retention: Retention,
        replay_boundaries: &[usize],
        pool: &mut BlockPool,
    ) -> Result<()> {
        let bs = self.block_size();
        let hash_bs = pool.hash_block_size();
        let hashes = request.block_hashes();
        let num_cached = rb.num_cached.unwrap_or(0);
        let num_full = self.num_full_blocks(num_tokens, hashes.len(), hash_bs);
        if num_cached < num_full {
            // vLLM slices the table: blocks past its end (a request longer than the
            // context) are silently not cached, yet counted as cached.
            let end = num_full.min(rb.table.len());
            let start = num_cached.min(end);
            if start < end {
                let mask = match self.params.kind {
                    AttentionKind::SlidingWindow { sliding_window, .. } => {
                        let mut boundaries = [0usize; 4];
                        let n = reachable_boundaries(
                            replay_boundaries,
                            request.shared_prefix_boundary(),
                            bs,
                            self.use_eagle,
                            &mut boundaries,
                        );
                        sliding_window::reachable_block_mask(
                            start,
                            end,
                            self.alignment_tokens,
                            sliding_window,
                            bs,
                            self.use_eagle,
                            retention,
                            &boundaries[..n],
                        )
                    }
                    _ => None,
                };
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
                if let AttentionKind::Mamba { align: true, .. } = self.params.kind {
                    for &b in &rb.table[start..end] {
                        if let Some(key) = pool.block_hash(b)?.filter(|_| b != NULL_BLOCK_ID) {
                            self.cached_this_step.insert(key);
                        }
                    }
                }
            }
            rb.num_cached = Some(num_full);
        }
        if self.params.kind.is_full_attention() && bs != hash_bs {
            full::cache_partial_tail_block(self, rb, request, num_tokens, pool)?;
        }
        Ok(())
    }
}

/// vLLM's `reachable_boundaries` in `cache_blocks`: the replay boundaries (at most 2),
/// then the request's shared-prefix junction, if any, and with EAGLE the block before it
/// (a sibling diverging right after the junction cannot use the block past it as the
/// EAGLE peek, so its hit lands one block lower; vLLM 0.33). Written into `out`; returns
/// how many.
fn reachable_boundaries(
    replay: &[usize],
    junction: usize,
    bs: usize,
    use_eagle: bool,
    out: &mut [usize; 4],
) -> usize {
    let mut n = replay.len();
    out[..n].copy_from_slice(replay);
    if junction > 0 {
        out[n] = junction;
        n += 1;
        if use_eagle {
            out[n] = junction.saturating_sub(bs);
            n += 1;
        }
    }
    n
}

/// The prefix-cache retention policy (`KVCacheConfig.prefix_cache_retention_interval`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Retention {
    /// `None`: dense, every reachable full block is cached.
    #[default]
    Dense,
    /// `Some(0)` (0 = only the replay boundaries) or `Some(interval)`.
    Interval(usize),
}
