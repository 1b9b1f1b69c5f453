//! Prefix-cache lookups of the manager: a request's hit (capped at `num_tokens - 1`),
//! the KV-connector lookup, per-group hits and the cached-token estimate.

use super::KvCacheManager;
use crate::attention::{CachedBlocks, RequestView};
use crate::error::Result;
use crate::types::{BlockHash, BlockId};

/// A prefix-cache lookup of a request (vLLM's `get_computed_blocks` triple).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// The hit blocks, one list per group.
    pub blocks: Vec<Vec<BlockId>>,
    /// Tokens hit.
    pub num_hit_tokens: usize,
    /// The end of a shared prefix a sparse-caching group has not cached yet, or 0.
    pub shared_prefix_boundary: usize,
}

impl Lookup {
    fn none(num_groups: usize) -> Self {
        Self {
            blocks: vec![Vec::new(); num_groups],
            num_hit_tokens: 0,
            shared_prefix_boundary: 0,
        }
    }
}

impl KvCacheManager {
    /// Whether a prefix-cache lookup runs for this request.
    pub(super) fn lookup_enabled<R: RequestView>(&self, request: &R) -> bool {
        self.lookup_enabled_for(request.skip_reading_prefix_cache())
    }

    /// Whether a prefix-cache lookup runs for a request that skips reading the prefix
    /// cache or not: only with caching on, for one that does not.
    pub fn lookup_enabled_for(&self, skip_reading_prefix_cache: bool) -> bool {
        self.enable_caching && !skip_reading_prefix_cache
    }

    /// The request's prefix-cache hit: one block list per group (hit blocks, nulls for
    /// skipped positions) and the hit length in tokens, at most `num_tokens - 1`. No
    /// ref count changes.
    pub fn get_computed_blocks<R: RequestView>(
        &self,
        request: &R,
    ) -> Result<(Vec<Vec<BlockId>>, usize)> {
        self.get_computed_blocks_capped(request, None)
    }

    /// [`get_computed_blocks`](Self::get_computed_blocks) with the hit capped at
    /// `max_cache_hit_length` tokens (`None`: `num_tokens - 1`).
    pub fn get_computed_blocks_capped<R: RequestView>(
        &self,
        request: &R,
        max_cache_hit_length: Option<usize>,
    ) -> Result<(Vec<Vec<BlockId>>, usize)> {
        self.lookup(request, max_cache_hit_length)
            .map(|l| (l.blocks, l.num_hit_tokens))
    }

    /// vLLM 0.33's `get_computed_blocks`: the hit, and the block-aligned end of a shared
    /// prefix that a sparse-caching group has not cached yet (0 if none).
    pub fn lookup<R: RequestView>(
        &self,
        request: &R,
        max_cache_hit_length: Option<usize>,
    ) -> Result<Lookup> {
        self.check_hash_block_size(request)?;
        if !self.lookup_enabled(request) {
            return Ok(Lookup::none(self.num_groups()));
        }
        let (gpu, host) = (self.coord.pool(), self.coord.host_pool());
        let (hashes, num_tokens) = (request.block_hashes(), request.num_tokens());
        self.lookup_in(gpu, host, hashes, num_tokens, max_cache_hit_length)
    }

    /// [`lookup`](Self::lookup) of a request of `num_tokens` tokens hashed as `hashes`
    /// (at the hash block size), with the cached blocks read from `gpu` and `host`
    /// instead of this manager's pools: the router asks an engine it knows only through
    /// its events what this manager would answer. The caller checks the hashes' block
    /// size and whether the request reads the prefix cache.
    pub fn lookup_in<P: CachedBlocks + ?Sized>(
        &self,
        gpu: &P,
        host: Option<&P>,
        hashes: &[BlockHash],
        num_tokens: usize,
        max_cache_hit_length: Option<usize>,
    ) -> Result<Lookup> {
        if !self.lookup_enabled_for(false) {
            return Ok(Lookup::none(self.num_groups()));
        }
        let max = max_cache_hit_length.unwrap_or(num_tokens.saturating_sub(1));
        let hit = self.coord.find_cache_hit_in(gpu, host, hashes, max)?;
        let boundary = if hit.num_uncached > 0 {
            hit.hit_length + hit.num_uncached
        } else {
            0
        };
        Ok(Lookup {
            blocks: hit.blocks,
            num_hit_tokens: hit.hit_length,
            shared_prefix_boundary: boundary,
        })
    }

    /// vLLM 0.33's `get_computed_blocks_for_connector`: for a hybrid model with Mamba
    /// layers and a full-attention group, that group's own hit is the local prefix (the
    /// connector supplies the rest), unless another group hit deeper (its full-attention
    /// blocks were evicted: then the reconciled `lookup`). The flag says whether a
    /// lagging group stops short of the local prefix. Other models: `lookup`, `false`.
    pub fn lookup_for_connector<R: RequestView>(
        &self,
        request: &R,
        max_cache_hit_length: Option<usize>,
    ) -> Result<(Lookup, bool)> {
        let has_mamba = self
            .coord
            .managers()
            .iter()
            .any(|m| m.params().kind.keeps_recurrent_state());
        let fa = match self.coord.full_attention_group_id() {
            Some(fa) if has_mamba => fa,
            _ => return Ok((self.lookup(request, max_cache_hit_length)?, false)),
        };
        self.check_hash_block_size(request)?;
        if !self.lookup_enabled(request) {
            return Ok((Lookup::none(self.num_groups()), false));
        }
        let max = max_cache_hit_length.unwrap_or(request.num_tokens().saturating_sub(1));
        let (blocks, hits) = self
            .coord
            .find_cache_hit_per_group(request.block_hashes(), max)?;
        if hits.iter().any(|&h| h > hits[fa]) {
            return Ok((self.lookup(request, max_cache_hit_length)?, false));
        }
        let diverged = hits.iter().any(|&h| h < hits[fa]);
        let lookup = Lookup {
            blocks,
            num_hit_tokens: hits[fa],
            shared_prefix_boundary: 0,
        };
        Ok((lookup, diverged))
    }

    /// Each spec group's own longest hit of `hashes` (vLLM's
    /// `coordinator.find_longest_cache_hit_per_group`).
    pub fn find_cache_hit_per_group(
        &self,
        hashes: &[BlockHash],
        max_cache_hit_length: usize,
    ) -> Result<(Vec<Vec<BlockId>>, Vec<usize>)> {
        self.coord
            .find_cache_hit_per_group(hashes, max_cache_hit_length)
    }

    /// The prefix tokens of the request that its cached blocks cover (vLLM's
    /// `estimate_cached_tokens`): per prefix-cached group the most tokens a block's
    /// cache key covers, the least of those over the groups. Cross-attention groups
    /// are not prefix cached; 0 for an unknown request.
    pub fn estimate_cached_tokens(&self, request_id: &str) -> usize {
        let Some(s) = self.slots.get(request_id) else {
            return 0;
        };
        let pool = self.coord.pool();
        self.coord
            .managers()
            .iter()
            .zip(self.slots.tables(s))
            .filter(|(m, _)| m.params().caches_prefix())
            .map(|(_, rb)| {
                rb.table
                    .iter()
                    .filter_map(|&b| pool.block_hash_num_tokens(b).ok().flatten())
                    .max()
                    .unwrap_or(0)
            })
            .min()
            .unwrap_or(0)
    }
}
