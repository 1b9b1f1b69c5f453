//! An engine as the index knows it: what its events do not carry (its KV cache layout,
//! hash algorithm and block size, NONE_HASH seed, data-parallel rank), and its hit for a
//! request, answered by the manager's own rules over what its events say it holds.
//!
//! The rules are a [`KvCacheManager`] built from the engine's layout with a token pool:
//! its coordinator runs the same per-attention-type searches (full, sliding window,
//! chunked local, Mamba, hybrid coordination, EAGLE, the `max_length` cap) as the
//! engine's, reading `TierView` instead of a block pool. No rule is written twice.

use std::sync::Arc;

use crate::attention::{AttentionKind, CachedBlocks, ManagerParams};
use crate::error::{KvError, Result};
use crate::hashing::{none_hash_for_seed, BlockHashView, BlockHasher, HashAlgo};
use crate::kv_cache_manager::{KvCacheManager, ManagerOptions};
use crate::types::{BlockHash, BlockId, GroupId};

use super::freshness::StatusCell;
use super::residency::{table_of, Probe};
use super::wire::Medium;

/// Blocks of the rules manager's pool: lookups never allocate, but a sink group takes
/// its sink blocks at construction.
const RULES_POOL_BLOCKS: usize = 1024;

/// What the index needs to know of an engine that its events do not say.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Its KV cache groups, in group order (as its `KVCacheConfig` gives them).
    pub groups: Vec<ManagerParams>,
    /// Its manager's options: `max_model_len`, `hash_block_size`, `use_eagle`,
    /// `enable_caching`, context parallelism, ...
    pub options: ManagerOptions,
    /// Its hash algorithm (`--prefix-caching-hash-algo`).
    pub hash_algo: HashAlgo,
    /// Its `PYTHONHASHSEED`, if set (needed for the xxhash kinds).
    pub python_hash_seed: Option<String>,
    /// Its data-parallel rank, if any.
    pub data_parallel_rank: Option<i64>,
    /// Whether it has a host-memory tier (vLLM's CPU `OffloadingConnector`) whose events
    /// it publishes. The host lookup is that connector's (vLLM 0.33): full-attention
    /// groups of one block size only.
    pub host_tier: bool,
    /// Tokens per offloaded chunk (the connector's `block_size`); `None`: the groups'
    /// block size (one block a chunk, the connector's default).
    pub host_block_size: Option<usize>,
    /// Whether it is registered before it starts (its cache empty, its stream from batch
    /// 0): then it is exact from the start, not `catching_up` until its first batch.
    pub started_empty: bool,
}

impl EngineConfig {
    /// An engine of one group of `params`, with vLLM's defaults: `sha256_cbor`, no seed.
    pub fn new(groups: Vec<ManagerParams>, max_model_len: usize, hash_block_size: usize) -> Self {
        Self {
            groups,
            options: ManagerOptions::new(max_model_len, hash_block_size),
            hash_algo: HashAlgo::Sha256Cbor,
            python_hash_seed: None,
            data_parallel_rank: None,
            host_tier: false,
            host_block_size: None,
            started_empty: false,
        }
    }
}

/// Engines that hash a request the same way share one hashing of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashDomain {
    pub(crate) hasher: BlockHasher,
    pub(crate) root: BlockHash,
}

/// A registered engine (immutable; its counters are atomics).
#[derive(Debug)]
pub struct EngineInfo {
    /// Its id.
    pub id: Arc<str>,
    rules: KvCacheManager,
    domain: HashDomain,
    /// Data-parallel rank.
    pub data_parallel_rank: Option<i64>,
    /// Tokens per chunk of its host tier, if it has one.
    host_chunk: Option<usize>,
    /// Freshness and counters, shared with the writer.
    pub status: StatusCell,
    /// See [`EngineConfig::started_empty`].
    pub started_empty: bool,
}

impl EngineInfo {
    /// Builds the engine's rules; fails as its manager's construction would.
    pub fn new(id: &str, config: EngineConfig) -> Result<Self> {
        if config.groups.iter().any(|g| g.host_resident) {
            return Err(KvError::Unsupported(
                "router index: HiSparse layouts (a host-resident group) are not indexed".into(),
            ));
        }
        let host_chunk = host_chunk(&config)?;
        let opts = ManagerOptions {
            enable_kv_cache_events: false,
            log_stats: false,
            ..config.options
        };
        let rules = KvCacheManager::new(config.groups, RULES_POOL_BLOCKS, None, opts)?;
        let hasher = BlockHasher::new(opts.hash_block_size, config.hash_algo)?
            .with_lookahead(opts.num_hash_lookahead_tokens);
        let root = none_hash_for_seed(config.hash_algo, config.python_hash_seed.as_deref())
            .ok_or_else(|| {
                KvError::InvalidArgument(format!(
                    "{} hashes from a random NONE_HASH unless PYTHONHASHSEED is set: give the \
                     engine's python_hash_seed",
                    config.hash_algo
                ))
            })?;
        Ok(Self {
            id: id.into(),
            rules,
            domain: HashDomain { hasher, root },
            data_parallel_rank: config.data_parallel_rank,
            host_chunk,
            status: StatusCell::default(),
            started_empty: config.started_empty,
        })
    }

    /// Number of KV cache groups.
    pub fn num_groups(&self) -> usize {
        self.rules.num_groups()
    }

    /// Tokens per block of each group (what its `BlockStored.block_size` says).
    pub fn group_block_sizes(&self) -> Vec<usize> {
        let managers = self.rules.coordinator().managers();
        managers.iter().map(|m| m.block_size()).collect()
    }

    /// How this engine hashes requests.
    pub fn domain(&self) -> HashDomain {
        self.domain
    }

    /// Tokens per hit unit (the scheduler block size; vLLM's offloading chunk).
    pub fn hit_block_size(&self) -> usize {
        self.rules.coordinator().hit_alignment()
    }

    /// The engine's hit for a request of `num_tokens` tokens hashed as `hashes` (in this
    /// engine's domain), given what its shard holds (`probe`, of the same hashes) and its
    /// bit there.
    pub fn hit(
        &self,
        probe: &Probe<'_>,
        bit: u8,
        hashes: &[BlockHash],
        num_tokens: usize,
    ) -> Result<Hit> {
        let gpu = TierView {
            probe,
            bit,
            medium: Medium::Gpu,
        };
        let gpu_tokens = self
            .rules
            .lookup_in(&gpu, None, hashes, num_tokens, None)?
            .num_hit_tokens;
        let host_tokens = match self.host_chunk {
            Some(chunk) => self.host_load(probe, bit, hashes, num_tokens, gpu_tokens, chunk),
            None => 0,
        };
        Ok(Hit {
            gpu_tokens,
            host_tokens,
        })
    }

    /// vLLM 0.33's CPU offloading lookup (`OffloadingConnector`'s
    /// `get_num_new_matched_tokens`) after a GPU hit of `gpu_tokens`, as its scheduler
    /// asks it: from the GPU hit rounded down to a hit unit, the run of chunks (keyed per
    /// group by the hash at the chunk's end) that every group's host tier holds, up to the
    /// request's last whole chunk; nothing unless that run adds a whole chunk. Where the
    /// GPU hit ends inside a hit unit, the load replaces that tail only if it reaches
    /// past it. Returns the tokens the host tier adds past `gpu_tokens`. (A load of the
    /// whole prompt is taken as is: the engine recomputes its last token afterwards.)
    fn host_load(
        &self,
        probe: &Probe<'_>,
        bit: u8,
        hashes: &[BlockHash],
        num_tokens: usize,
        gpu_tokens: usize,
        chunk: usize,
    ) -> usize {
        let unit = self.hit_block_size().max(1);
        let aligned = gpu_tokens - gpu_tokens % unit;
        let scale = chunk / self.domain.hasher.hash_block_size();
        let num_keys = hashes.len() / scale;
        let mut max_hit = num_tokens.min(num_keys * chunk);
        let start = aligned / chunk;
        for group in 0..self.num_groups() {
            if max_hit < aligned + chunk {
                return 0;
            }
            let table = table_of(group as u32, Medium::Cpu);
            let end = max_hit.div_ceil(chunk).min(num_keys);
            let run = (start..end)
                .take_while(|&i| {
                    probe.holders(table, &hashes[(i + 1) * scale - 1]) & (1 << bit) != 0
                })
                .count();
            max_hit = max_hit.min(chunk * (start + run));
        }
        if max_hit < aligned + chunk {
            return 0;
        }
        max_hit.saturating_sub(gpu_tokens)
    }
}

/// The host tier's tokens per chunk, if `config` has one: vLLM's connector offloads
/// full-attention groups of one block size, in chunks of whole blocks and whole hash
/// blocks.
fn host_chunk(config: &EngineConfig) -> Result<Option<usize>> {
    if !config.host_tier {
        return Ok(None);
    }
    let unsupported = |why: &str| {
        Err(KvError::Unsupported(format!(
            "router index: host tier {why}"
        )))
    };
    if config
        .groups
        .iter()
        .any(|g| g.kind != AttentionKind::FullAttention)
    {
        return unsupported("lookups are indexed for full-attention layouts only");
    }
    let bs = config.groups.first().map_or(0, |g| g.block_size);
    if config.groups.iter().any(|g| g.block_size != bs) {
        return unsupported("lookups are indexed for groups of one block size only");
    }
    let chunk = config.host_block_size.unwrap_or(bs);
    let hbs = config.options.hash_block_size;
    if bs == 0 || chunk == 0 || !chunk.is_multiple_of(bs) || !chunk.is_multiple_of(hbs) {
        return Err(KvError::InvalidArgument(format!(
            "host_block_size {chunk} must be a positive multiple of the block size {bs} and \
             of the hash block size {hbs}"
        )));
    }
    Ok(Some(chunk))
}

/// An engine's hit for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Hit {
    /// Tokens its `get_computed_blocks` would return now.
    pub gpu_tokens: usize,
    /// Tokens past those that its host tier would load.
    pub host_tokens: usize,
}

/// What one medium of an engine holds, as the hit rules read a block pool.
struct TierView<'a> {
    probe: &'a Probe<'a>,
    bit: u8,
    medium: Medium,
}

/// Stands for "some block holds it": the rules only tell null from not.
const HELD: BlockId = 1;

impl CachedBlocks for TierView<'_> {
    #[inline]
    fn extend_leading_run(
        &self,
        view: BlockHashView<'_>,
        limit: usize,
        group: GroupId,
        out: &mut Vec<BlockId>,
    ) {
        let table = table_of(group, self.medium);
        let run = self.probe.leading_run(table, view, self.bit);
        out.resize(out.len() + run.min(limit), HELD);
    }

    #[inline]
    fn cached_block(&self, hash: &BlockHash, group: GroupId) -> Option<BlockId> {
        let holders = self.probe.holders(table_of(group, self.medium), hash);
        (holders & (1 << self.bit) != 0).then_some(HELD)
    }
}
