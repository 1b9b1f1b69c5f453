//! KV cache coordinators (docs/ARCHITECTURE.md, "Prefix hits" and "Allocation"): one shared
//! [`BlockPool`], one [`SingleTypeManager`] per group, and the cross-group rules: which
//! coordinator runs (no prefix cache, unitary, hybrid), the hybrid fixed-point cache-hit
//! search, and the group-ordered fan-out of every other operation.
//!
//! The coordinator keeps no request map: callers pass the request's per-group
//! [`RequestBlocks`] (one per group, in group order).

use crate::arith::cdiv;
use crate::attention::{
    mamba, BoundaryOffload, CachedBlocks, HitQuery, ManagerParams, RequestBlocks, RequestView,
    SingleTypeManager, SparseCaching,
};
use crate::error::{KvError, Result};
use crate::host_tier::{self, HostTier};
use crate::partial_hits;
use crate::pool::BlockPool;
use crate::types::{BlockHash, BlockId, GroupId};
use crate::zeroing::ZeroingLog;

/// Which coordinator vLLM would pick (`get_kv_cache_coordinator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoordinatorKind {
    /// Prefix caching off (any number of groups).
    NoPrefixCache,
    /// One group.
    Unitary,
    /// Several groups.
    Hybrid,
}

/// Groups with equal specs, looked up together (vLLM's `SpecGroup`).
#[derive(Debug, Clone)]
struct SpecGroup {
    group_ids: Vec<GroupId>,
    is_full: bool,
    /// Whether an EAGLE lookup searches one block past the limit.
    extends_eagle_lookup: bool,
    /// Whether the type's lookup probes hash boundaries inside its blocks.
    fine_grained_lookup: bool,
    use_eagle: bool,
    /// Whether the groups are host resident: looked up in the host pool, their hit kept
    /// longer than the reconciled one (vLLM's `retains_longer_hit`).
    host_resident: bool,
}

/// A prefix-cache lookup's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheHit {
    /// The hit blocks, one list per group.
    pub blocks: Vec<Vec<BlockId>>,
    /// The hit length in tokens, the same for every group.
    pub hit_length: usize,
    /// Tokens a single spec group hit past `hit_length` (hybrid; 0 otherwise).
    pub num_uncached: usize,
}

/// How a coordinator is built (besides the groups).
#[derive(Debug, Clone, Copy)]
pub struct CoordinatorOptions {
    /// Pool size, null block included.
    pub num_blocks: usize,
    /// The model's context length.
    pub max_model_len: usize,
    /// Tokens scheduled but not yet settled (sizes the SWA / chunked admission caps).
    pub max_in_flight_tokens: usize,
    /// EAGLE / MTP speculative decoding.
    pub use_eagle: bool,
    /// Prefix caching.
    pub enable_caching: bool,
    /// Record KV cache events.
    pub enable_kv_cache_events: bool,
    /// Hit alignment of hybrid models (lcm of the group block sizes by default).
    pub scheduler_block_size: usize,
    /// Tokens per request hash.
    pub hash_block_size: usize,
    /// `prefix_cache_retention_interval` (`None` = dense).
    pub retention_interval: Option<usize>,
    /// Record new blocks for zeroing (vLLM's `needs_kv_cache_zeroing`).
    pub record_new_block_ids: bool,
    /// Count references to the null block as vLLM 0.32 does (`pool/null_block.rs`).
    pub count_null_block_refs: bool,
    /// Prefix cache Mamba groups in mode `"none"` as vLLM 0.32 does (every full state
    /// block, found by the align-mode search); refused otherwise (vLLM 0.33).
    pub mamba_none_prefix_caching: bool,
    /// Multi-module MTP's prefill lookahead (vLLM's `num_prefill_lookahead`): the last
    /// `num_prefill_lookahead - 1` computed tokens may be re-prefilled, so are not cached.
    pub num_prefill_lookahead: usize,
    /// Tokens after each block that its hash also covers (vLLM's
    /// `num_hash_lookahead_tokens`): the pool publishes them in `BlockStored`.
    pub num_hash_lookahead_tokens: usize,
    /// Record the pool's calls for a KV cache metrics collector (`pool/metrics.rs`).
    pub record_block_metrics: bool,
    /// Blocks of HiSparse's host pool, which a host-resident group draws from
    /// (`hisparse_host_num_blocks`, `host_tier.rs`).
    pub host_num_blocks: Option<usize>,
}

/// vLLM 0.33's `KVCacheCoordinator` family.
#[derive(Debug, Clone)]
pub struct Coordinator {
    kind: CoordinatorKind,
    pool: BlockPool,
    managers: Vec<SingleTypeManager>,
    scheduler_block_size: usize,
    hash_block_size: usize,
    /// Computed tokens that multi-module MTP may re-prefill, kept out of the cache
    /// (vLLM's `num_reprefillable_tokens`).
    num_reprefillable_tokens: usize,
    /// Whether any group drops the EAGLE block (vLLM's `drop_eagle_group_ids` non-empty).
    any_drop_eagle: bool,
    /// Per group: whether its hits drop the EAGLE block.
    drop_eagle: Vec<bool>,
    /// Hybrid only: spec groups, full attention first.
    spec_groups: Vec<SpecGroup>,
    sparse_caching: SparseCaching,
    zeroing: ZeroingLog,
    /// Hybrid: whether hits may end on a hash boundary inside a block (vLLM's
    /// `enable_partial_hash_hits`, `partial_hits.rs`).
    partial_hits: bool,
    /// Whether the Mamba shared-prefix checkpoint is armed.
    shared_prefix_checkpoint: bool,
    /// Whether any group's `remove_skipped_blocks` can free a block
    /// (`AttentionKind::frees_skipped_blocks`); the call is a no-op otherwise.
    frees_skipped_blocks: bool,
    /// Whether a group's `remove_skipped_blocks` reads the prompt's length
    /// (`AttentionKind::skips_by_prompt_length`).
    skips_by_prompt_length: bool,
    /// Whether every group counts and allocates by the common rules
    /// (`AttentionKind::allocates_by_common_rules`) in the device pool: the per-type
    /// dispatch and the pool selection are skipped.
    common_allocation: bool,
    /// HiSparse's host pool and its group, if a group is host resident. Only the calls
    /// that can reach that group's pool look at it: the common allocation path, caching
    /// and skipped blocks never do (`host_tier.rs`).
    host: Option<Box<HostTier>>,
}

impl Coordinator {
    /// Builds the pool and the managers (in group order) after checking the groups
    /// against the options (`validate`).
    pub fn new(groups: Vec<ManagerParams>, opts: CoordinatorOptions) -> Result<Self> {
        let (kind, sparse_caching) = validate(&groups, &opts)?;
        let (sbs, hbs) = (opts.scheduler_block_size, opts.hash_block_size);
        let mut pool = BlockPool::new(
            opts.num_blocks,
            opts.enable_caching,
            hbs,
            opts.enable_kv_cache_events,
        )?;
        pool.set_count_null_block_refs(opts.count_null_block_refs);
        pool.set_num_hash_lookahead_tokens(opts.num_hash_lookahead_tokens);
        if opts.record_block_metrics {
            pool.record_block_metrics();
        }
        let mut host = HostTier::new(
            &groups,
            opts.host_num_blocks,
            opts.enable_caching,
            hbs,
            opts.enable_kv_cache_events,
        )?;
        let drop_eagle = drop_eagle_groups(&groups, opts.use_eagle);
        let mut managers = Vec::with_capacity(groups.len());
        for (i, params) in groups.into_iter().enumerate() {
            let mut m = SingleTypeManager::new(
                params,
                i as GroupId,
                opts.enable_caching,
                sbs,
                opts.max_in_flight_tokens,
                opts.max_model_len,
                host_tier::pool_for(&mut pool, &mut host, i),
            )?;
            m.use_eagle_checkpoint = opts.use_eagle;
            managers.push(m);
        }
        let zeroing = ZeroingLog::new(managers.iter().map(|m| {
            opts.record_new_block_ids
                && m.params().kind.zeroes_new_blocks()
                && !m.params().host_resident
        }));
        let frees_skipped_blocks = managers
            .iter()
            .any(|m| m.params().kind.frees_skipped_blocks());
        let common_allocation = host.is_none()
            && managers
                .iter()
                .all(|m| m.params().kind.allocates_by_common_rules());
        let skips_by_prompt_length = managers
            .iter()
            .any(|m| m.params().kind.skips_by_prompt_length());
        let mut me = Self {
            frees_skipped_blocks,
            skips_by_prompt_length,
            common_allocation,
            zeroing,
            kind,
            pool,
            managers,
            scheduler_block_size: sbs,
            hash_block_size: hbs,
            num_reprefillable_tokens: opts.num_prefill_lookahead.saturating_sub(1),
            any_drop_eagle: drop_eagle.iter().any(|&d| d),
            drop_eagle,
            spec_groups: Vec::new(),
            sparse_caching,
            partial_hits: false,
            shared_prefix_checkpoint: false,
            host,
        };
        match kind {
            CoordinatorKind::Unitary => me.managers[0].use_eagle = me.drop_eagle[0],
            CoordinatorKind::Hybrid => {
                let params: Vec<ManagerParams> =
                    me.managers.iter().map(|m| m.params().clone()).collect();
                me.partial_hits = partial_hits::enabled(&params, hbs);
                let alignment = me.hit_alignment();
                for m in &mut me.managers {
                    m.alignment_tokens = alignment;
                }
                me.split_spec_groups();
            }
            CoordinatorKind::NoPrefixCache => {}
        }
        Ok(me)
    }

    /// vLLM's `verify_and_split_kv_cache_groups`: equal specs share a lookup, full
    /// attention first (stable), and the EAGLE bit of a spec group goes to its managers;
    /// groups that are not prefix cached are left out.
    fn split_spec_groups(&mut self) {
        let mut groups: Vec<((usize, bool), SpecGroup)> = Vec::new();
        for (i, m) in self.managers.iter().enumerate() {
            let p = m.params();
            if !p.caches_prefix() {
                // Scratch groups (circular buffers) take no part in the hit search.
                continue;
            }
            let use_eagle = self.drop_eagle[i];
            // Groups in different pools never share a lookup (vLLM compares the pools).
            let key = (p.spec_class, p.host_resident);
            if let Some((_, g)) = groups.iter_mut().find(|(c, _)| *c == key) {
                g.group_ids.push(i as GroupId);
                g.use_eagle |= use_eagle;
            } else {
                groups.push((
                    key,
                    SpecGroup {
                        group_ids: vec![i as GroupId],
                        is_full: p.kind.is_full_attention(),
                        extends_eagle_lookup: p.kind.extends_eagle_lookup(),
                        fine_grained_lookup: partial_hits::supports_fine_grained_lookup(&p.kind),
                        use_eagle,
                        host_resident: p.host_resident,
                    },
                ));
            }
        }
        let mut groups: Vec<SpecGroup> = groups.into_iter().map(|(_, g)| g).collect();
        groups.sort_by_key(|g| !g.is_full);
        for g in &groups {
            if g.use_eagle {
                for &gid in &g.group_ids {
                    self.managers[gid as usize].use_eagle = true;
                }
            }
        }
        self.spec_groups = groups;
    }

    /// Which coordinator this is.
    #[inline]
    pub fn kind(&self) -> CoordinatorKind {
        self.kind
    }

    /// The shared block pool.
    #[inline]
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// HiSparse's host pool, if a group is host resident (`host_tier.rs`).
    #[inline]
    pub fn host_pool(&self) -> Option<&BlockPool> {
        self.host.as_deref().map(HostTier::pool)
    }

    /// The host-resident group, if any.
    #[inline]
    pub fn host_group(&self) -> Option<usize> {
        self.host.as_deref().map(HostTier::group)
    }

    /// The pool group `g` draws from.
    #[inline]
    pub fn pool_of_group(&self, g: usize) -> &BlockPool {
        match &self.host {
            Some(h) if h.group() == g => h.pool(),
            _ => &self.pool,
        }
    }

    /// Drops the host pool's cache entries of `blocks` (vLLM's `evict_blocks` on the
    /// source manager's pool); the events join the device pool's queue. `Unsupported`
    /// without a host pool.
    pub fn evict_host_blocks(&mut self, blocks: &[BlockId]) -> Result<()> {
        let Some(host) = self.host.as_deref_mut() else {
            return Err(KvError::Unsupported(
                "no HiSparse host pool: no group is host resident".into(),
            ));
        };
        let done = host.pool_mut().evict_blocks(blocks);
        host.forward_events(&mut self.pool);
        done
    }

    /// Clears the prefix cache of every pool if no request holds a block of it (vLLM
    /// resets each group's pool once, in group order, all of them even if one refuses);
    /// returns whether all did.
    pub fn reset_prefix_cache(&mut self) -> bool {
        let Some(host) = self.host.as_deref_mut() else {
            return self.pool.reset_prefix_cache();
        };
        let reset_host = |host: &mut HostTier, device: &mut BlockPool| {
            let done = host.pool_mut().reset_prefix_cache();
            host.forward_events(device);
            done
        };
        match (host.group(), self.managers.len()) {
            // Only the host group: the device pool is no group's pool.
            (_, 1) => reset_host(host, &mut self.pool),
            (0, _) => reset_host(host, &mut self.pool) & self.pool.reset_prefix_cache(),
            _ => self.pool.reset_prefix_cache() & reset_host(host, &mut self.pool),
        }
    }

    /// The shared block pool, mutably (evictions, reset, events).
    #[inline]
    pub fn pool_mut(&mut self) -> &mut BlockPool {
        &mut self.pool
    }

    /// The managers, in group order.
    #[inline]
    pub fn managers(&self) -> &[SingleTypeManager] {
        &self.managers
    }

    /// Whether sparse prefix caching is on (`prefix_cache_retention_interval` set).
    pub fn sparse_caching(&self) -> bool {
        self.sparse_caching != SparseCaching::Dense
    }

    /// The `prefix_cache_retention_interval` in force (`None`: dense caching).
    pub fn retention_interval(&self) -> Option<usize> {
        match self.sparse_caching {
            SparseCaching::Dense => None,
            SparseCaching::Interval(n) => Some(n),
        }
    }

    /// Sets the retention interval after construction (vLLM's tests assign
    /// `coordinator.retention_interval`; every later step reads the new one). It is
    /// checked as at construction (`validate_sparse_caching`); a bad one is refused
    /// and changes nothing.
    pub fn set_retention_interval(&mut self, interval: Option<usize>) -> Result<()> {
        let sparse_groups = self
            .managers
            .iter()
            .any(|m| m.params().kind.allows_sparse_caching());
        self.sparse_caching =
            validate_sparse_caching(interval, self.scheduler_block_size, sparse_groups)?;
        Ok(())
    }

    /// The `prefill_end` vLLM's coordinator hands its managers: the prefill's end under
    /// retention 0, where align-mode Mamba reserves a prefill checkpoint only on the
    /// chunk reaching it; 0 otherwise (every chunk publishes a state).
    #[inline]
    fn prefill_end(&self, prefill_end: usize) -> usize {
        if self.reads_prefill_end() {
            prefill_end
        } else {
            0
        }
    }

    /// Whether the allocation calls read a prefill's end (retention 0).
    #[inline]
    fn reads_prefill_end(&self) -> bool {
        self.sparse_caching == SparseCaching::Interval(0)
    }

    /// `Self::prefill_end` of `request`: where its prefill ends, as vLLM's
    /// `allocate_slots` computes it (the prompt, or all but the last token of a resumed
    /// request replaying its output). The request is read only where the end is used.
    #[inline]
    pub fn prefill_end_of<R: RequestView>(&self, request: &R) -> usize {
        if !self.reads_prefill_end() {
            return 0;
        }
        request
            .num_prompt_tokens()
            .max(request.num_tokens().saturating_sub(1))
    }

    /// Whether caching reads a request's shared-prefix junction: under sparse prefix
    /// caching, or with the Mamba shared-prefix checkpoint armed.
    pub fn reads_junction(&self) -> bool {
        self.sparse_caching() || self.shared_prefix_checkpoint
    }

    /// The scheduler block size.
    #[inline]
    pub fn scheduler_block_size(&self) -> usize {
        self.scheduler_block_size
    }

    /// Whether hybrid hits may end on a hash boundary inside a block (vLLM's
    /// `enable_partial_hash_hits`).
    #[inline]
    pub fn partial_hits_enabled(&self) -> bool {
        self.partial_hits
    }

    /// vLLM's `enable_mamba_shared_prefix_checkpoint`: align-mode Mamba groups also key
    /// the state at a request's shared-prefix junction, where an EAGLE sibling resumes.
    /// Armed only with an EAGLE group, partial hits and no multi-module MTP re-prefill
    /// (`cache_blocks` then sees the chunk end); returns whether it is.
    pub fn arm_mamba_shared_prefix_checkpoint(&mut self) -> bool {
        let armed = self.any_drop_eagle && self.partial_hits && self.num_reprefillable_tokens == 0;
        if armed {
            for m in &mut self.managers {
                m.shared_prefix_checkpoint = m.params().kind.keeps_recurrent_state();
            }
        }
        self.shared_prefix_checkpoint |= armed;
        armed
    }

    /// The granularity of hybrid hits (vLLM's `_cache_hit_alignment_tokens`): the hash
    /// block size with partial hits, the scheduler block size otherwise.
    #[inline]
    pub fn hit_alignment(&self) -> usize {
        if self.partial_hits {
            self.hash_block_size
        } else {
            self.scheduler_block_size
        }
    }

    /// The longest an EAGLE lookup of spec group `sg` reads, `limit` tokens being the
    /// candidate hit: one drop unit more ([`partial_hits::eagle_proof_margin`]) for a
    /// type that drops what it reads past the limit.
    fn eagle_lookup_limit(&self, sg: &SpecGroup, limit: usize, num_hashes: usize) -> usize {
        if !sg.extends_eagle_lookup {
            return limit;
        }
        let bs = self.managers[sg.group_ids[0] as usize].block_size();
        let fine = self.partial_hits && sg.fine_grained_lookup;
        let margin = partial_hits::eagle_proof_margin(bs, self.hash_block_size, fine);
        (limit + margin).min(num_hashes * self.hash_block_size)
    }

    /// The pool a spec group's lookup reads.
    #[inline]
    fn lookup_pool(&self, sg: &SpecGroup) -> &BlockPool {
        lookup_source(sg, &self.pool, self.host_pool())
    }

    /// The longest prefix hit of `hashes` no longer than `max_length` tokens: one block
    /// list per group and the hit length. Reads only; no ref count changes.
    pub fn find_longest_cache_hit(
        &self,
        hashes: &[BlockHash],
        max_length: usize,
    ) -> Result<(Vec<Vec<BlockId>>, usize)> {
        self.find_cache_hit(hashes, max_length)
            .map(|hit| (hit.blocks, hit.hit_length))
    }

    /// [`find_longest_cache_hit`](Self::find_longest_cache_hit), with the uncached
    /// common prefix: how far the longest single spec group's hit reached past the
    /// reconciled one (hybrid only; vLLM's `num_uncached_common_prefix_tokens`).
    pub fn find_cache_hit(&self, hashes: &[BlockHash], max_length: usize) -> Result<CacheHit> {
        self.find_cache_hit_in(&self.pool, self.host_pool(), hashes, max_length)
    }

    /// [`find_cache_hit`](Self::find_cache_hit) with the cached blocks read from `gpu`
    /// (and `host` for a host-resident group) instead of this coordinator's pools: the
    /// same rules over another view of what is cached (the router's engines).
    pub fn find_cache_hit_in<P: CachedBlocks + ?Sized>(
        &self,
        gpu: &P,
        host: Option<&P>,
        hashes: &[BlockHash],
        max_length: usize,
    ) -> Result<CacheHit> {
        let n = self.managers.len();
        let (blocks, hit_length) = match self.kind {
            CoordinatorKind::NoPrefixCache => (vec![Vec::new(); n], 0),
            CoordinatorKind::Unitary => {
                let m = &self.managers[0];
                let query = HitQuery {
                    hashes,
                    hash_block_size: self.hash_block_size,
                    max_length,
                    groups: &[0],
                    drop_eagle: self.drop_eagle[0],
                    alignment: m.block_size(),
                };
                let mut out = vec![Vec::new()];
                let hit = m.find_longest_cache_hit(&query, gpu, &mut out)?;
                (out, hit)
            }
            CoordinatorKind::Hybrid => return self.find_hybrid(gpu, host, hashes, max_length),
        };
        Ok(CacheHit {
            blocks,
            hit_length,
            num_uncached: 0,
        })
    }

    /// Each spec group's own longest hit, none reconciled with the others (vLLM's
    /// `find_longest_cache_hit_per_group`): blocks and hit length per group.
    pub fn find_cache_hit_per_group(
        &self,
        hashes: &[BlockHash],
        max_length: usize,
    ) -> Result<(Vec<Vec<BlockId>>, Vec<usize>)> {
        if self.kind != CoordinatorKind::Hybrid {
            let hit = self.find_cache_hit(hashes, max_length)?;
            let lengths = vec![hit.hit_length; self.managers.len()];
            return Ok((hit.blocks, lengths));
        }
        let n = self.managers.len();
        let mut blocks = vec![Vec::new(); n];
        let mut lengths = vec![0usize; n];
        for sg in &self.spec_groups {
            let m = &self.managers[sg.group_ids[0] as usize];
            let limit = if sg.use_eagle {
                self.eagle_lookup_limit(sg, max_length, hashes.len())
            } else {
                max_length
            };
            let query = HitQuery {
                hashes,
                hash_block_size: self.hash_block_size,
                max_length: limit,
                groups: &sg.group_ids,
                drop_eagle: sg.use_eagle,
                alignment: self.hit_alignment(),
            };
            let mut out = vec![Vec::new(); sg.group_ids.len()];
            let found = m.find_longest_cache_hit(&query, self.lookup_pool(sg), &mut out)?;
            for (&gid, list) in sg.group_ids.iter().zip(out) {
                blocks[gid as usize] = list;
                lengths[gid as usize] = found;
            }
        }
        Ok((blocks, lengths))
    }

    /// The group whose hit is the local prefix for a KV connector: the first spec
    /// group's first group, if that spec group is full attention (hybrid only).
    pub fn full_attention_group_id(&self) -> Option<usize> {
        match self.kind {
            CoordinatorKind::Hybrid => self
                .spec_groups
                .first()
                .filter(|sg| sg.is_full)
                .map(|sg| sg.group_ids[0] as usize),
            _ => None,
        }
    }

    /// The hybrid coordinator's spec groups in lookup order (full attention first):
    /// each one's group ids and whether its hits drop the EAGLE block (vLLM's
    /// `attention_groups`). `None` for the other coordinators, which have none.
    pub fn spec_groups(&self) -> Option<Vec<(Vec<GroupId>, bool)>> {
        (self.kind == CoordinatorKind::Hybrid).then(|| {
            self.spec_groups
                .iter()
                .map(|sg| (sg.group_ids.clone(), sg.use_eagle))
                .collect()
        })
    }

    /// Whether this is the hybrid coordinator (several groups, prefix caching on).
    pub fn is_hybrid(&self) -> bool {
        self.kind == CoordinatorKind::Hybrid
    }

    /// The hybrid fixed point: every spec group either accepts the candidate length or
    /// lowers it; repeat until nothing lowers it (one pass for full + one other).
    fn find_hybrid<P: CachedBlocks + ?Sized>(
        &self,
        gpu: &P,
        host: Option<&P>,
        hashes: &[BlockHash],
        max_length: usize,
    ) -> Result<CacheHit> {
        let n = self.managers.len();
        let mut blocks: Vec<Option<Vec<BlockId>>> = vec![None; n];
        let mut lengths = vec![0usize; n];
        let simple = self.spec_groups.len() == 2 && self.spec_groups[0].is_full;
        let mut verified = vec![false; self.spec_groups.len()];
        let mut hit_length = max_length;
        let mut longest = 0usize;
        loop {
            let mut curr = hit_length;
            for (idx, sg) in self.spec_groups.iter().enumerate() {
                let first = sg.group_ids[0] as usize;
                if sg.is_full && blocks[first].is_some() {
                    curr = curr.min(lengths[first]);
                    continue;
                }
                let m = &self.managers[first];
                let drop = sg.use_eagle && !verified[idx];
                let limit = if drop {
                    self.eagle_lookup_limit(sg, curr, hashes.len())
                } else {
                    curr
                };
                let query = HitQuery {
                    hashes,
                    hash_block_size: self.hash_block_size,
                    max_length: limit,
                    groups: &sg.group_ids,
                    drop_eagle: drop,
                    alignment: self.hit_alignment(),
                };
                let mut out = vec![Vec::new(); sg.group_ids.len()];
                let found =
                    m.find_longest_cache_hit(&query, lookup_source(sg, gpu, host), &mut out)?;
                if drop {
                    verified[idx] = true;
                } else if found < curr {
                    verified.iter_mut().for_each(|v| *v = false);
                }
                curr = found;
                for (&gid, list) in sg.group_ids.iter().zip(out) {
                    blocks[gid as usize] = Some(list);
                    lengths[gid as usize] = found;
                }
                longest = longest.max(curr);
            }
            if curr >= hit_length {
                break;
            }
            hit_length = curr;
            if simple {
                break;
            }
        }
        for sg in self
            .spec_groups
            .iter()
            .filter(|g| g.is_full && !g.host_resident)
        {
            for &gid in &sg.group_ids {
                let keep = cdiv(hit_length, self.managers[gid as usize].block_size());
                if let Some(list) = &mut blocks[gid as usize] {
                    list.truncate(keep);
                }
            }
        }
        Ok(CacheHit {
            blocks: blocks.into_iter().map(Option::unwrap_or_default).collect(),
            hit_length,
            num_uncached: longest.saturating_sub(hit_length),
        })
    }

    /// Blocks an allocation would take off the free queue, summed over groups (signed:
    /// align-mode Mamba can count negatively). `hits` is `None` for no prefix hit (vLLM's
    /// empty sentinel); of the `total_computed_tokens`, `num_local_computed_tokens` are
    /// the prefix hit's; `prefill_end` is where the request's prefill ends (0 if not
    /// known; read under retention 0 only, `Self::prefill_end`). The host-resident
    /// group counts its hit up to the `hit_tokens` reused (`host_tier::retained`).
    #[allow(clippy::too_many_arguments)]
    pub fn get_num_blocks_to_allocate(
        &self,
        rbs: &[RequestBlocks],
        num_tokens: usize,
        num_tokens_main_model: usize,
        hits: Option<&[Vec<BlockId>]>,
        hit_tokens: usize,
        num_encoder_tokens: usize,
        total_computed_tokens: usize,
        num_local_computed_tokens: usize,
        apply_admission_cap: bool,
        prefill_end: usize,
    ) -> isize {
        if self.common_allocation {
            return self
                .managers
                .iter()
                .zip(rbs)
                .enumerate()
                .map(|(i, (m, rb))| {
                    m.num_blocks_by_common_rules(
                        rb,
                        num_tokens,
                        hits.map_or(&[][..], |h| &h[i][..]),
                        total_computed_tokens,
                        num_local_computed_tokens,
                        apply_admission_cap,
                        &self.pool,
                    )
                })
                .sum();
        }
        let prefill_end = self.prefill_end(prefill_end);
        (0..self.managers.len())
            .zip(rbs)
            .map(|(i, rb)| {
                let hit = hits.map_or(&[][..], |h| &h[i][..]);
                self.group_blocks_to_allocate(
                    i,
                    rb,
                    num_tokens,
                    num_tokens_main_model,
                    hit,
                    hit_tokens,
                    num_encoder_tokens,
                    total_computed_tokens,
                    num_local_computed_tokens,
                    apply_admission_cap,
                    prefill_end,
                )
            })
            .sum()
    }

    /// Group `i`'s share of [`get_num_blocks_to_allocate`](Self::get_num_blocks_to_allocate)
    /// off the common path (vLLM's manager's own `get_num_blocks_to_allocate`);
    /// `prefill_end` as [`prefill_end`](Self::prefill_end) returns it.
    #[allow(clippy::too_many_arguments)]
    fn group_blocks_to_allocate(
        &self,
        i: usize,
        rb: &RequestBlocks,
        num_tokens: usize,
        num_tokens_main_model: usize,
        hit: &[BlockId],
        hit_tokens: usize,
        num_encoder_tokens: usize,
        total_computed_tokens: usize,
        num_local_computed_tokens: usize,
        apply_admission_cap: bool,
        prefill_end: usize,
    ) -> isize {
        let m = &self.managers[i];
        // A table of encoder tokens counts only those: no hit, nothing computed.
        let (n, main, end, h, total, local) = if m.params().kind.counts_encoder_tokens() {
            (num_encoder_tokens, num_encoder_tokens, 0, &[][..], 0, 0)
        } else {
            (
                num_tokens,
                num_tokens_main_model,
                prefill_end,
                hit,
                total_computed_tokens,
                num_local_computed_tokens,
            )
        };
        let on_host = self.host.as_deref().filter(|host| host.group() == i);
        let h = match on_host {
            Some(_) => host_tier::retained(h, m.block_size(), hit_tokens),
            None => h,
        };
        let count = m.get_num_blocks_to_allocate(
            rb,
            n,
            main,
            end,
            h,
            total,
            local,
            apply_admission_cap,
            on_host.map_or(&self.pool, HostTier::pool),
        );
        on_host.map_or(count, |host| host.admission(count, &self.pool))
    }

    /// One group's dry-run count, as vLLM's manager of the group answers it (its
    /// coordinator's share of the request's allocation).
    #[allow(clippy::too_many_arguments)]
    pub fn get_group_num_blocks_to_allocate(
        &self,
        group: usize,
        rb: &RequestBlocks,
        num_tokens: usize,
        num_tokens_main_model: usize,
        hit: &[BlockId],
        total_computed_tokens: usize,
        num_local_computed_tokens: usize,
        apply_admission_cap: bool,
        prefill_end: usize,
    ) -> isize {
        self.group_blocks_to_allocate(
            group,
            rb,
            num_tokens,
            num_tokens_main_model,
            hit,
            usize::MAX,
            num_tokens,
            total_computed_tokens,
            num_local_computed_tokens,
            apply_admission_cap,
            self.prefill_end(prefill_end),
        )
    }

    /// Adds a new request's hits to its tables (all groups touch first), then allocates
    /// blocks for external tokens. A no-op for a request some group already knows. The
    /// host-resident group adopts its hit up to the `hit_tokens` reused.
    pub fn allocate_new_computed_blocks(
        &mut self,
        rbs: &mut [RequestBlocks],
        hits: Option<&[Vec<BlockId>]>,
        hit_tokens: usize,
        num_local_computed: usize,
        num_external_computed: usize,
        skip_zeroing_groups: &[usize],
    ) -> Result<()> {
        if rbs.iter().any(|rb| rb.num_cached.is_some()) {
            return Ok(());
        }
        for (i, (m, rb)) in self.managers.iter().zip(rbs.iter_mut()).enumerate() {
            let mut h = hits.map_or(&[][..], |h| &h[i][..]);
            if self.host_group() == Some(i) {
                h = host_tier::retained(h, m.block_size(), hit_tokens);
            }
            let pool = host_tier::pool_for(&mut self.pool, &mut self.host, i);
            let done =
                m.add_local_computed_blocks(rb, h, num_local_computed, num_external_computed, pool);
            host_tier::after_call(&mut self.pool, &mut self.host, i);
            done?;
        }
        if num_external_computed > 0 {
            for (g, (m, rb)) in self.managers.iter().zip(rbs.iter_mut()).enumerate() {
                let start = rb.table.len();
                let pool = host_tier::pool_for(&mut self.pool, &mut self.host, g);
                let done = m.allocate_external_computed_blocks(
                    rb,
                    num_local_computed,
                    num_external_computed,
                    pool,
                );
                host_tier::after_call(&mut self.pool, &mut self.host, g);
                done?;
                if !skip_zeroing_groups.contains(&g) {
                    self.zeroing.record(g, &rb.table[start..]);
                }
            }
        }
        Ok(())
    }

    /// The blocks allocated since the last call that the worker must zero, group after
    /// group (empty unless zeroing was asked for).
    pub fn take_new_block_ids(&mut self) -> Vec<BlockId> {
        self.zeroing.take()
    }

    /// Records the request's blocks from `start_token` on for zeroing again (blocks a
    /// failed async load left unwritten); `start_token` must be block aligned in every
    /// recording group.
    pub fn record_blocks_for_zeroing(
        &mut self,
        rbs: &[RequestBlocks],
        start_token: usize,
    ) -> Result<()> {
        for (g, (m, rb)) in self.managers.iter().zip(rbs).enumerate() {
            if !self.zeroing.records(g) {
                continue;
            }
            if !start_token.is_multiple_of(m.block_size()) {
                return Err(KvError::InvalidArgument(format!(
                    "start_token {start_token} is not aligned to group {g}'s block size {}",
                    m.block_size()
                )));
            }
            let start = (start_token / m.block_size()).min(rb.table.len());
            self.zeroing.record(g, &rb.table[start..]);
        }
        Ok(())
    }

    /// Extends every group's table of `request` to `num_tokens` slots (a
    /// group that counts encoder tokens: `num_encoder_tokens`; align-mode Mamba: the
    /// step computing `[total_computed_tokens, num_tokens_main_model)` of a prefill
    /// ending at `prefill_end`), group by group. A partial hit's copy that replaced a
    /// table entry in place is pushed to `copies` as `(g, block)` (it comes first among
    /// the group's new blocks).
    #[allow(clippy::too_many_arguments)]
    pub fn allocate_new_blocks<R: RequestView>(
        &mut self,
        rbs: &mut [RequestBlocks],
        request: &R,
        num_tokens: usize,
        total_computed_tokens: usize,
        num_tokens_main_model: usize,
        num_encoder_tokens: usize,
        prefill_end: usize,
        copies: &mut Vec<(usize, BlockId)>,
    ) -> Result<()> {
        let common = self.common_allocation;
        let prefill_end = self.prefill_end(prefill_end);
        for (g, (m, rb)) in self.managers.iter_mut().zip(rbs.iter_mut()).enumerate() {
            let start = rb.table.len();
            let copy = if common {
                m.allocate_by_common_rules(rb, num_tokens, &mut self.pool)?
            } else {
                let n = if m.params().kind.counts_encoder_tokens() {
                    num_encoder_tokens
                } else {
                    num_tokens
                };
                let pool = host_tier::pool_for(&mut self.pool, &mut self.host, g);
                let done = m.allocate_new_blocks(
                    rb,
                    request.request_id(),
                    n,
                    total_computed_tokens,
                    num_tokens_main_model,
                    prefill_end,
                    pool,
                );
                host_tier::after_call(&mut self.pool, &mut self.host, g);
                done?
            };
            if let Some(c) = copy {
                self.zeroing.record(g, &[c]);
                copies.push((g, c));
            }
            self.zeroing
                .record(g, &rb.table[start.min(rb.table.len())..]);
        }
        Ok(())
    }

    /// The partial-hit copies queued since the last call, `(source, destination)`,
    /// group after group (vLLM's `take_pending_cow_copies` of every manager).
    /// The host-resident group's copies are not among them: they are host blocks
    /// ([`take_host_block_copies`](Self::take_host_block_copies)).
    pub fn take_block_copies(&mut self) -> Vec<(BlockId, BlockId)> {
        let host = self.host_group();
        let mut out = Vec::new();
        for (g, m) in self.managers.iter_mut().enumerate() {
            if host != Some(g) {
                m.take_block_copies(&mut out);
            }
        }
        out
    }

    /// The host-resident group's partial-hit copies queued since the last call, `(source,
    /// destination)` host blocks (vLLM's `HiSparseSourceManager.take_host_cow_copies`).
    pub fn take_host_block_copies(&mut self) -> Vec<(BlockId, BlockId)> {
        let mut out = Vec::new();
        if let Some(g) = self.host_group() {
            self.managers[g].take_block_copies(&mut out);
        }
        out
    }

    /// vLLM's `finalize_partial_tail_offloads` for a request finishing after
    /// `num_computed` tokens with `num_in_flight` in flight: per align-mode Mamba group,
    /// the partial tail it cached itself if no later token overwrote it, as
    /// `(group, block, boundary)`.
    pub fn finalize_partial_tail_offloads(
        &self,
        rbs: &mut [RequestBlocks],
        num_computed: usize,
        num_in_flight: usize,
    ) -> Vec<(GroupId, BlockId, usize)> {
        rbs.iter_mut()
            .enumerate()
            .filter_map(|(g, rb)| {
                mamba::finalize_partial_tail(rb, num_computed, num_in_flight)
                    .map(|(block, boundary)| (g as GroupId, block, boundary))
            })
            .collect()
    }

    /// Tokens group `group` may cache out of `num_tokens` computed ones: all but the
    /// last `num_reprefillable_tokens` (multi-module MTP re-prefills them); hybrid:
    /// aligned down to the scheduler block size (not at all with partial hits, vLLM's
    /// `_align_cacheable`), and an EAGLE group one block further, within the tokens no
    /// MTP module re-prefills.
    #[inline]
    pub fn num_cacheable_tokens(&self, num_tokens: usize, group: usize) -> usize {
        let finalized = num_tokens.saturating_sub(self.num_reprefillable_tokens);
        if self.kind != CoordinatorKind::Hybrid {
            return finalized;
        }
        let align = |n: usize| {
            if self.partial_hits {
                n
            } else {
                n / self.scheduler_block_size * self.scheduler_block_size
            }
        };
        let aligned = align(num_tokens);
        let m = &self.managers[group];
        if m.use_eagle && aligned > 0 {
            finalized.min(align(finalized) + m.block_size())
        } else {
            aligned
        }
    }

    /// Computed tokens that multi-module MTP may re-prefill, never cached (vLLM's
    /// `num_reprefillable_tokens`: `num_prefill_lookahead - 1`).
    #[inline]
    pub fn num_reprefillable_tokens(&self) -> usize {
        self.num_reprefillable_tokens
    }

    /// Caches the request's newly full blocks in every caching group.
    // Inlined into `allocate_slots` as well as the explicit `cache_blocks`: a call costs the
    // decode path about 16 instructions per step (tools/decode_driver/count.sh).
    #[inline(always)]
    pub fn cache_blocks<R: RequestView>(
        &mut self,
        rbs: &mut [RequestBlocks],
        request: &R,
        num_tokens: usize,
    ) -> Result<()> {
        self.cache_blocks_from(0, rbs, request, num_tokens)
    }

    /// [`cache_blocks`](Self::cache_blocks) for the groups from `first` on whose
    /// tables `rbs` holds, in order.
    #[inline(always)]
    pub fn cache_blocks_from<R: RequestView>(
        &mut self,
        first: usize,
        rbs: &mut [RequestBlocks],
        request: &R,
        num_tokens: usize,
    ) -> Result<()> {
        let mut boundaries = [0usize; 2];
        let nb = self.replay_boundaries(request.num_prompt_tokens(), &mut boundaries);
        for (i, rb) in (first..).zip(rbs.iter_mut()) {
            let n = self.num_cacheable_tokens(num_tokens, i);
            let m = &mut self.managers[i];
            if m.caches_when_computed() {
                m.cache_blocks(
                    rb,
                    request,
                    n,
                    self.sparse_caching,
                    &boundaries[..nb],
                    &mut self.pool,
                )?;
            }
        }
        Ok(())
    }

    /// Caches the host-resident group's blocks of `request` up to `num_tokens` in the host
    /// pool (vLLM's `HiSparseSourceManager.publish_blocks`: HiSparse publishes them once the
    /// host holds them; `num_tokens` is already what the group may cache,
    /// [`num_cacheable_tokens`](Self::num_cacheable_tokens)). A no-op without a
    /// host-resident group or with caching off.
    pub fn publish_host_blocks<R: RequestView>(
        &mut self,
        rbs: &mut [RequestBlocks],
        request: &R,
        num_tokens: usize,
    ) -> Result<()> {
        let Some(g) = self.host_group() else {
            return Ok(());
        };
        if !self.managers[g].enable_caching() {
            return Ok(());
        }
        let mut boundaries = [0usize; 2];
        let nb = self.replay_boundaries(request.num_prompt_tokens(), &mut boundaries);
        let pool = host_tier::pool_for(&mut self.pool, &mut self.host, g);
        let done = self.managers[g].cache_blocks(
            &mut rbs[g],
            request,
            num_tokens,
            self.sparse_caching,
            &boundaries[..nb],
            pool,
        );
        host_tier::after_call(&mut self.pool, &mut self.host, g);
        done
    }

    /// Caches `blocks[num_cached..num_full]` of a freed request in the host pool (vLLM's
    /// `_publish_detached_blocks`: the request's blocks, held for its publication).
    pub(crate) fn publish_detached_host_blocks<R: RequestView>(
        &mut self,
        request: &R,
        blocks: &[BlockId],
        num_cached: usize,
        num_full: usize,
        block_size: usize,
        group: usize,
    ) -> Result<()> {
        let Some(host) = self.host.as_deref_mut() else {
            return Ok(());
        };
        let done = host.pool_mut().cache_full_blocks(
            request.block_hashes(),
            blocks,
            num_cached,
            num_full,
            block_size,
            group as GroupId,
            None,
            request,
        );
        host.forward_events(&mut self.pool);
        done
    }

    /// HiSparse's host pool, to change. Calls that record events must be followed by
    /// [`forward_host_events`](Self::forward_host_events) before any other pool call, so
    /// the events keep their order.
    pub fn host_pool_mut(&mut self) -> Option<&mut BlockPool> {
        self.host.as_deref_mut().map(HostTier::pool_mut)
    }

    /// Moves the host pool's events to the device pool's queue (vLLM's host pool records
    /// into the device pool's queue directly).
    pub fn forward_host_events(&mut self) {
        if let Some(host) = self.host.as_deref_mut() {
            host.forward_events(&mut self.pool);
        }
    }

    /// vLLM's `replay_boundaries`: where a later request replaying this prompt can
    /// resume. Writes them sorted into `out` and returns how many.
    fn replay_boundaries(&self, num_prompt_tokens: usize, out: &mut [usize; 2]) -> usize {
        if !self.any_drop_eagle {
            out[0] = num_prompt_tokens.saturating_sub(1);
            return 1;
        }
        let b = self.scheduler_block_size;
        let resend = num_prompt_tokens.saturating_sub(1) / b * b;
        let extension = num_prompt_tokens / b * b;
        let (x, y) = (resend.saturating_sub(b), extension.saturating_sub(b));
        out[0] = x.min(y);
        out[1] = x.max(y);
        if x == y {
            1
        } else {
            2
        }
    }

    /// Per-step hook of every manager.
    pub fn new_step_starts(&mut self) {
        self.managers
            .iter_mut()
            .for_each(SingleTypeManager::new_step_starts);
    }

    /// The cached states not yet offered to a KV connector, group after group (align-mode
    /// Mamba), handed over.
    pub fn take_boundary_offloads(&mut self) -> Vec<BoundaryOffload> {
        let mut out = Vec::new();
        for m in &mut self.managers {
            m.take_boundary_offloads(&mut out);
        }
        out
    }

    /// Drops a freed request's states not yet offered to a KV connector.
    pub fn forget_boundary_offloads(&mut self, request_id: &str) {
        for m in &mut self.managers {
            m.forget_boundary_offloads(request_id);
        }
    }

    /// Frees the request in every group (each table tail first), in group order.
    pub fn free(&mut self, rbs: &mut [RequestBlocks]) -> Result<()> {
        self.free_from(0, rbs)
    }

    /// [`free`](Self::free) for the groups from `first` on whose tables `rbs` holds,
    /// in order.
    pub fn free_from(&mut self, first: usize, rbs: &mut [RequestBlocks]) -> Result<()> {
        for (g, rb) in (first..).zip(rbs.iter_mut()) {
            let m = &self.managers[g];
            let pool = host_tier::pool_for(&mut self.pool, &mut self.host, g);
            let done = m.free(rb, pool);
            host_tier::after_call(&mut self.pool, &mut self.host, g);
            done?;
        }
        Ok(())
    }

    /// Forgets the request in every group and returns its blocks (group after group,
    /// each in allocation order) without freeing them.
    pub fn pop_blocks_for_free(&mut self, rbs: &mut [RequestBlocks]) -> Vec<BlockId> {
        let mut out = Vec::new();
        for (g, (m, rb)) in self.managers.iter().zip(rbs.iter_mut()).enumerate() {
            m.pop_blocks_for_free(rb, self.pool_of_group(g), &mut out);
        }
        out
    }

    /// [`pop_blocks_for_free`](Self::pop_blocks_for_free) with each group's blocks apart
    /// (the host-resident group's come from the host pool).
    pub fn pop_blocks_for_free_by_group(&mut self, rbs: &mut [RequestBlocks]) -> Vec<Vec<BlockId>> {
        (0..self.managers.len())
            .zip(rbs.iter_mut())
            .map(|(g, rb)| {
                let mut out = Vec::new();
                self.managers[g].pop_blocks_for_free(rb, self.pool_of_group(g), &mut out);
                out
            })
            .collect()
    }

    /// Frees the blocks outside the attention window of `request`'s next token in every
    /// group, after `total_computed_tokens` of which the request's in-flight tokens are
    /// not yet processed (R-SWA groups: the gap after its prompt); the request is read
    /// only where a group needs it.
    pub fn remove_skipped_blocks_of<R: RequestView>(
        &mut self,
        rbs: &mut [RequestBlocks],
        request: &R,
        total_computed_tokens: usize,
    ) -> Result<()> {
        if !self.frees_skipped_blocks {
            return Ok(());
        }
        let processed = total_computed_tokens.saturating_sub(request.num_in_flight_tokens());
        let prompt = self
            .skips_by_prompt_length
            .then(|| request.num_prompt_tokens());
        self.remove_skipped_blocks(rbs, processed, prompt)
    }

    /// Frees the blocks outside every group's attention window (R-SWA groups: the gap
    /// after a prompt of `num_prompt_tokens`, when given).
    pub fn remove_skipped_blocks(
        &mut self,
        rbs: &mut [RequestBlocks],
        num_computed_tokens: usize,
        num_prompt_tokens: Option<usize>,
    ) -> Result<()> {
        if !self.frees_skipped_blocks {
            return Ok(());
        }
        for (m, rb) in self.managers.iter().zip(rbs.iter_mut()) {
            m.remove_skipped_blocks(rb, num_computed_tokens, num_prompt_tokens, &mut self.pool)?;
        }
        Ok(())
    }
}

/// Checks the groups against the options as vLLM does and picks the coordinator:
/// block sizes that divide the scheduler block size, the prefix-caching rules of each
/// type (configurations vLLM 0.33 cannot run with prefix caching on, Mamba without
/// "align" and cross-attention, are rejected), and the sparse-caching interval.
fn validate(
    groups: &[ManagerParams],
    opts: &CoordinatorOptions,
) -> Result<(CoordinatorKind, SparseCaching)> {
    let sbs = opts.scheduler_block_size;
    let hbs = opts.hash_block_size;
    if sbs == 0 || hbs == 0 || !sbs.is_multiple_of(hbs) {
        return Err(KvError::InvalidArgument(format!(
            "scheduler_block_size {sbs} must be a positive multiple of hash_block_size {hbs}"
        )));
    }
    if let Some(g) = groups
        .iter()
        .find(|g| g.block_size == 0 || !sbs.is_multiple_of(g.block_size))
    {
        return Err(KvError::InvalidArgument(format!(
            "every group's block_size must divide scheduler_block_size {sbs}, got {}",
            g.block_size
        )));
    }
    let kind = if !opts.enable_caching {
        CoordinatorKind::NoPrefixCache
    } else if groups.len() == 1 {
        CoordinatorKind::Unitary
    } else {
        CoordinatorKind::Hybrid
    };
    if kind == CoordinatorKind::Hybrid && groups.is_empty() {
        return Err(KvError::InvalidSpec(
            "prefix caching needs at least one KV cache group".into(),
        ));
    }
    if opts.enable_caching {
        validate_prefix_caching(groups, hbs, opts.mamba_none_prefix_caching)?;
        validate_prefill_lookahead(groups, opts)?;
    }
    let sparse_groups = groups.iter().any(|g| g.kind.allows_sparse_caching());
    let sparse_caching = validate_sparse_caching(opts.retention_interval, sbs, sparse_groups)?;
    Ok((kind, sparse_caching))
}

/// With prefix caching on: each type supports it for its group (Mamba mode `"none"`
/// only with `mamba_none`), every prefix-cached group's block size is a multiple of the
/// hash block size, and a single group's equals it.
fn validate_prefix_caching(groups: &[ManagerParams], hbs: usize, mamba_none: bool) -> Result<()> {
    for g in groups {
        g.kind.check_prefix_caching(mamba_none)?;
        if g.caches_prefix() && g.block_size % hbs != 0 {
            return Err(KvError::InvalidArgument(format!(
                "block_size {} is not divisible by hash_block_size {hbs}",
                g.block_size
            )));
        }
    }
    if let [g] = groups {
        if g.block_size != hbs {
            return Err(KvError::InvalidArgument(format!(
                "a single-group model needs hash_block_size == block_size ({} != {hbs})",
                g.block_size
            )));
        }
    }
    Ok(())
}

/// vLLM 0.33's multi-module MTP check: with prefix caching and an EAGLE group (a
/// flagged group, or any group under `use_eagle`), the EAGLE drop of one scheduler block
/// must cover the `num_prefill_lookahead` tokens written past a chunk's end.
fn validate_prefill_lookahead(groups: &[ManagerParams], opts: &CoordinatorOptions) -> Result<()> {
    let eagle_groups = groups.iter().any(|g| g.is_eagle_group) || opts.use_eagle;
    let (sbs, lookahead) = (opts.scheduler_block_size, opts.num_prefill_lookahead);
    if eagle_groups && !groups.is_empty() && sbs < lookahead {
        return Err(KvError::InvalidArgument(format!(
            "Multi-module MTP with prefix caching requires scheduler_block_size (={sbs}) >= \
             num_speculative_tokens (={lookahead})."
        )));
    }
    Ok(())
}

/// Per group, whether its hits drop the EAGLE block: the flagged groups with EAGLE on,
/// or every group when none is flagged.
fn drop_eagle_groups(groups: &[ManagerParams], use_eagle: bool) -> Vec<bool> {
    let any_flagged = groups.iter().any(|g| g.is_eagle_group);
    groups
        .iter()
        .map(|g| use_eagle && (g.is_eagle_group || !any_flagged))
        .collect()
}

/// vLLM's `_validate_prefix_cache_retention_interval`; `sparse` says whether a group
/// has a type sparse caching applies to (sliding window, Mamba).
fn validate_sparse_caching(
    interval: Option<usize>,
    scheduler_block_size: usize,
    sparse: bool,
) -> Result<SparseCaching> {
    let Some(n) = interval else {
        return Ok(SparseCaching::Dense);
    };
    if !sparse && n != 0 {
        return Err(KvError::InvalidArgument(
            "prefix_cache_retention_interval is set but this model has no sliding-window or \
             Mamba KV cache group, so retention has no effect. Set it to 0"
                .into(),
        ));
    }
    if sparse && n % scheduler_block_size != 0 {
        return Err(KvError::InvalidArgument(format!(
            "prefix_cache_retention_interval ({n}) must be non-negative and a multiple of \
             scheduler_block_size ({scheduler_block_size})"
        )));
    }
    Ok(SparseCaching::Interval(n))
}

/// The cached blocks a spec group's lookup reads: the host's for a host-resident group
/// (HiSparse's source), the GPU's otherwise.
#[inline]
fn lookup_source<'a, P: CachedBlocks + ?Sized>(
    sg: &SpecGroup,
    gpu: &'a P,
    host: Option<&'a P>,
) -> &'a P {
    match host {
        Some(h) if sg.host_resident => h,
        _ => gpu,
    }
}
