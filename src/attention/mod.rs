//! Single-type managers: the per-group rules of vLLM 0.33.0's
//! `SingleTypeKVCacheManager` family (docs/ARCHITECTURE.md, "Attention types").
//!
//! One [`SingleTypeManager`] per KV cache group. It holds no per-request state itself:
//! each request's table for the group is a [`RequestBlocks`] owned by the coordinator, so
//! a request id is resolved once per call, not once per group. Behaviour that differs by
//! attention type lives in one file per type and is selected by a `match` on
//! [`AttentionKind`] (no dynamic dispatch on the hot path).

pub mod chunked_local;
pub mod cross_attention;
pub mod full;
pub mod mamba;
pub mod sliding_window;

use rustc_hash::FxHashSet;

use crate::config::KvCacheConfig;
use crate::error::{KvError, Result};
use crate::events::event::StoredBlockSource;
use crate::pool::{BlockPool, HashKey, RetentionHints};
use crate::request::SlotHint;
use crate::spec::KvCacheSpec;
use crate::types::{BlockHash, BlockId, GroupId, NULL_BLOCK_ID};

/// Ceiling division.
#[inline]
pub(crate) fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// The attention type of a KV cache group, with the fields its manager needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttentionKind {
    /// Full attention (also MLA): every token's KV is kept until the request ends.
    FullAttention,
    /// Full attention with `sink_len` sink tokens (seed-era behaviour, see
    /// [`SingleTypeManager::sink_blocks`]).
    SinkFullAttention {
        /// Sink tokens; a positive multiple of the block size.
        sink_len: usize,
    },
    /// Sliding-window attention.
    SlidingWindow {
        /// The window, in tokens.
        sliding_window: usize,
        /// Extra trailing tokens kept (not attended) below the window.
        extra_retained_tokens: usize,
    },
    /// Chunked local attention.
    ChunkedLocal {
        /// The attention chunk, in tokens.
        attention_chunk_size: usize,
    },
    /// Mamba state: mode `"none"` (prefix caching off) or `"align"` (see [`mamba`]).
    Mamba {
        /// Extra state blocks for speculative decoding.
        num_speculative_blocks: usize,
        /// `mamba_cache_mode == "align"`.
        align: bool,
    },
    /// Cross-attention over encoder tokens (encoder-decoder models).
    CrossAttention,
}

/// The `kv_cache_spec_kind` of an empty uniform group (vLLM's `"unknown"`).
pub(crate) const UNKNOWN_SPEC_KIND: &str = "unknown";

/// Every `KVCacheSpecKind` value of vLLM 0.33.0: the kinds of kvblocks' attention types,
/// and those its specs never produce (an event from vLLM may still carry them).
pub const SPEC_KINDS: [&str; 10] = [
    full::SPEC_KIND,
    full::MLA_SPEC_KIND,
    sliding_window::SPEC_KIND,
    "sliding_window_mla",
    mamba::SPEC_KIND,
    chunked_local::SPEC_KIND,
    full::SINK_SPEC_KIND,
    "encoder_only_attention",
    cross_attention::SPEC_KIND,
    UNKNOWN_SPEC_KIND,
];

impl AttentionKind {
    /// Whether vLLM counts the spec as a `FullAttentionSpec` (full, MLA, sink).
    #[inline]
    pub fn is_full_attention(&self) -> bool {
        matches!(self, Self::FullAttention | Self::SinkFullAttention { .. })
    }

    /// The attention type that serves `spec` (vLLM's spec-to-manager mapping): MLA is
    /// full attention, and a uniform group is served as its first layer's spec.
    pub fn from_spec(spec: &KvCacheSpec) -> Result<Self> {
        Ok(match spec {
            KvCacheSpec::FullAttention(_) | KvCacheSpec::MlaAttention(_) => Self::FullAttention,
            KvCacheSpec::SinkFullAttention(s) => full::sink_kind(s),
            KvCacheSpec::SlidingWindow(s) => sliding_window::kind(s),
            KvCacheSpec::ChunkedLocalAttention(s) => chunked_local::kind(s),
            KvCacheSpec::Mamba(m) => mamba::kind(m)?,
            KvCacheSpec::CrossAttention(_) => Self::CrossAttention,
            KvCacheSpec::UniformType(u) => {
                let layer =
                    u.kv_cache_specs.specs().next().ok_or_else(|| {
                        KvError::InvalidSpec("a uniform group without layers".into())
                    })?;
                if matches!(layer, KvCacheSpec::UniformType(_)) {
                    return Err(KvError::InvalidSpec("nested uniform groups".into()));
                }
                Self::from_spec(layer)?
            }
        })
    }

    /// The `kv_cache_spec_kind` of this type's events (a spec knows more: MLA reports
    /// its own kind, see [`KvCacheSpec::kind`]).
    pub fn spec_kind(&self) -> &'static str {
        match self {
            Self::FullAttention => full::SPEC_KIND,
            Self::SinkFullAttention { .. } => full::SINK_SPEC_KIND,
            Self::SlidingWindow { .. } => sliding_window::SPEC_KIND,
            Self::ChunkedLocal { .. } => chunked_local::SPEC_KIND,
            Self::Mamba { .. } => mamba::SPEC_KIND,
            Self::CrossAttention => cross_attention::SPEC_KIND,
        }
    }

    /// The per-request admission cap in blocks of the types that recycle blocks (sliding
    /// window, chunked local), for blocks of `bs` tokens; `None` for the others.
    pub fn max_admission_blocks(
        &self,
        bs: usize,
        max_in_flight_tokens: usize,
        max_model_len: usize,
    ) -> Option<usize> {
        match *self {
            Self::SlidingWindow {
                sliding_window,
                extra_retained_tokens,
            } => Some(sliding_window::max_admission_blocks(
                sliding_window,
                extra_retained_tokens,
                bs,
                max_in_flight_tokens,
                max_model_len,
            )),
            Self::ChunkedLocal {
                attention_chunk_size,
            } => Some(chunked_local::max_admission_blocks(
                attention_chunk_size,
                bs,
                max_in_flight_tokens,
                max_model_len,
            )),
            _ => None,
        }
    }

    /// Tokens before the attention window of the next token, given `n` computed tokens.
    #[inline]
    pub fn num_skipped_tokens(&self, n: usize) -> usize {
        match *self {
            Self::SlidingWindow {
                sliding_window,
                extra_retained_tokens,
            } => sliding_window::num_skipped_tokens(n, sliding_window, extra_retained_tokens),
            Self::ChunkedLocal {
                attention_chunk_size,
            } => chunked_local::num_skipped_tokens(n, attention_chunk_size),
            Self::Mamba { .. } => mamba::num_skipped_tokens(n),
            _ => 0,
        }
    }
}

/// What a manager needs to know about its group, independent of how specs are modelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagerParams {
    /// The attention type.
    pub kind: AttentionKind,
    /// Tokens per block of this group.
    pub block_size: usize,
    /// `kv_cache_spec_kind` annotation of this group's `BlockStored` events.
    pub spec_kind: &'static str,
    /// `kv_cache_spec_sliding_window` annotation of this group's `BlockStored` events.
    pub event_sliding_window: Option<u32>,
    /// `KVCacheGroupSpec.is_eagle_group`.
    pub is_eagle_group: bool,
    /// Groups with equal `spec_class` have equal specs: the hybrid coordinator looks
    /// them up together (vLLM compares specs with `==`).
    pub spec_class: usize,
}

impl ManagerParams {
    /// Parameters of a group with default annotations and its own spec class.
    pub fn new(kind: AttentionKind, block_size: usize, spec_class: usize) -> Self {
        let window = match kind {
            AttentionKind::SlidingWindow { sliding_window, .. } => {
                u32::try_from(sliding_window).ok()
            }
            _ => None,
        };
        Self {
            spec_kind: kind.spec_kind(),
            kind,
            block_size,
            event_sliding_window: window,
            is_eagle_group: false,
            spec_class,
        }
    }
}

impl ManagerParams {
    /// One parameter set per group of `config`, in group order: vLLM's spec-to-manager
    /// mapping (MLA is full attention; a uniform group uses its first layer's spec).
    /// Groups with equal specs share a `spec_class`. Mamba "align" is not supported.
    pub fn from_config(config: &KvCacheConfig) -> Result<Vec<Self>> {
        let groups = &config.kv_cache_groups;
        groups
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let spec = &g.kv_cache_spec;
                let class = groups
                    .iter()
                    .position(|o| o.kv_cache_spec == *spec)
                    .unwrap_or(i);
                let kind = AttentionKind::from_spec(spec)?;
                Ok(Self {
                    kind,
                    block_size: spec.block_size(),
                    spec_kind: spec.kind(),
                    event_sliding_window: spec.sliding_window().map(|w| w as u32),
                    is_eagle_group: g.is_eagle_group,
                    spec_class: class,
                })
            })
            .collect()
    }
}

/// What the managers read from a request.
pub trait RequestView: StoredBlockSource {
    /// The request id.
    fn request_id(&self) -> &str;
    /// Prompt plus output tokens.
    fn num_tokens(&self) -> usize;
    /// Prompt tokens.
    fn num_prompt_tokens(&self) -> usize;
    /// Tokens whose KV is computed (the scheduler advances it).
    fn num_computed_tokens(&self) -> usize;
    /// The prefix hashes at `hash_block_size` granularity.
    fn block_hashes(&self) -> &[BlockHash];
    /// Whether the request skips the prefix-cache lookup (prompt logprobs, pooling).
    fn skip_reading_prefix_cache(&self) -> bool {
        false
    }
    /// How many times the request was preempted.
    fn num_preemptions(&self) -> usize {
        0
    }
    /// vLLM 0.33's `num_in_flight_tokens`: scheduled but not yet settled (0 under
    /// synchronous scheduling).
    fn num_in_flight_tokens(&self) -> usize {
        0
    }
    /// The block size the request's hashes were computed at, if known. With caching on,
    /// the manager rejects a request hashed at another size: its hashes would name the
    /// wrong token spans and hit blocks holding other content.
    fn hash_block_size(&self) -> Option<usize> {
        None
    }
    /// Whether the request is waiting for admission (vLLM's status `WAITING` or
    /// `PREEMPTED`): only such requests keep the admission watermark free.
    fn awaiting_admission(&self) -> bool {
        false
    }
    /// The request's memo of its manager slot, if it keeps one: saves the manager a
    /// hash of the id and a table probe on every call.
    fn slot_hint(&self) -> Option<&SlotHint> {
        None
    }
    /// What a retention policy reads from the request (its priority, session and
    /// tenant); read once, when the request first gets a slot, and only with a policy.
    fn retention_hints(&self) -> RetentionHints {
        RetentionHints::default()
    }
}

/// The blocks a request's table holds a reference to: all but its leading nulls.
fn held_blocks(rb: &RequestBlocks) -> &[BlockId] {
    let start = rb
        .table
        .iter()
        .position(|&b| b != NULL_BLOCK_ID)
        .unwrap_or(rb.table.len());
    &rb.table[start..]
}

/// One request's table in one group (vLLM's `req_to_blocks[rid]` and
/// `num_cached_block[rid]`).
///
/// NOTE 1: `table` is position-indexed: entry `i` holds tokens `[i*bs, (i+1)*bs)`, and
/// skipped positions hold the null block.
/// NOTE 2: `num_cached` is `Some` once the request is "known" to the group (a prefix hit
/// was added, or `cache_blocks` cached something); it counts leading table entries that
/// are cached, nulls included.
#[derive(Debug, Clone, Default)]
pub struct RequestBlocks {
    /// The block table.
    pub table: Vec<BlockId>,
    /// Leading cached entries, if the request is known.
    pub num_cached: Option<usize>,
    /// Align-mode Mamba bookkeeping (unused by other types).
    pub mamba: mamba::MambaState,
}

impl RequestBlocks {
    /// Forgets the request, keeping the table's capacity.
    pub fn clear(&mut self) {
        self.table.clear();
        self.num_cached = None;
        self.mamba = mamba::MambaState::default();
    }
}

/// A prefix-cache lookup, shared by every attention type's `find_longest_cache_hit`.
#[derive(Debug, Clone, Copy)]
pub struct HitQuery<'a> {
    /// The request's hashes at `hash_block_size`.
    pub hashes: &'a [BlockHash],
    /// Tokens per hash.
    pub hash_block_size: usize,
    /// The longest hit allowed, in tokens.
    pub max_length: usize,
    /// Groups that must all hit (one list per group in the output).
    pub groups: &'a [GroupId],
    /// Whether to drop the last matched block (EAGLE).
    pub drop_eagle: bool,
    /// Hit lengths must be multiples of this.
    pub alignment: usize,
}

impl HitQuery<'_> {
    /// The hash of the group block `i` for block size `bs` (0.33: the last hash inside
    /// the block).
    #[inline]
    pub(crate) fn hash(&self, bs: usize, i: usize) -> &BlockHash {
        let k = bs / self.hash_block_size;
        &self.hashes[(i + 1) * k - 1]
    }

    /// Number of full group blocks the hashes cover.
    #[inline]
    pub(crate) fn num_hashed_blocks(&self, bs: usize) -> usize {
        self.hashes.len() / (bs / self.hash_block_size)
    }

    /// Group blocks a hit may cover: within `max_length` and the hashes.
    #[inline]
    pub(crate) fn max_blocks(&self, bs: usize) -> usize {
        (self.max_length / bs).min(self.num_hashed_blocks(bs))
    }

    /// Looks block `i` up in every group; on a full hit appends one block per group to
    /// `out` and returns true; otherwise leaves `out` as it was.
    #[inline]
    pub(crate) fn push_hit(
        &self,
        pool: &BlockPool,
        bs: usize,
        i: usize,
        out: &mut [Vec<BlockId>],
    ) -> bool {
        let h = self.hash(bs, i);
        for (j, &g) in self.groups.iter().enumerate() {
            match pool.cached_block(h, g) {
                Some(b) => out[j].push(b),
                None => {
                    for o in &mut out[..j] {
                        o.pop();
                    }
                    return false;
                }
            }
        }
        true
    }
}

/// The manager of one KV cache group.
#[derive(Debug, Clone)]
pub struct SingleTypeManager {
    params: ManagerParams,
    group: GroupId,
    enable_caching: bool,
    /// `max_admission_blocks_per_request` (SWA and chunked local only).
    max_admission_blocks: Option<usize>,
    /// Whether hits of this group drop the EAGLE block (set by the coordinator).
    pub(crate) use_eagle: bool,
    /// `cache_hit_alignment_tokens` (the scheduler block size).
    pub(crate) alignment_tokens: usize,
    sink_blocks: Vec<BlockId>,
    /// Align-mode Mamba: keys cached during this step, which other requests may not hit
    /// until the next step (vLLM's `cached_blocks_this_step`).
    cached_this_step: FxHashSet<HashKey>,
}

impl SingleTypeManager {
    /// Builds the manager of group `group`. A sink group pre-allocates its sink blocks
    /// from `pool` here (seed-era behaviour; vLLM 0.33's sink manager cannot be built).
    pub fn new(
        params: ManagerParams,
        group: GroupId,
        enable_caching: bool,
        scheduler_block_size: usize,
        max_in_flight_tokens: usize,
        max_model_len: usize,
        pool: &mut BlockPool,
    ) -> Result<Self> {
        let bs = params.block_size;
        if bs == 0 {
            return Err(KvError::InvalidSpec("block_size must be positive".into()));
        }
        let max_admission_blocks =
            params
                .kind
                .max_admission_blocks(bs, max_in_flight_tokens, max_model_len);
        let sink_blocks = match params.kind {
            AttentionKind::SinkFullAttention { sink_len } => {
                pool.get_new_blocks(full::num_sink_blocks(sink_len, bs)?)?
            }
            _ => Vec::new(),
        };
        Ok(Self {
            params,
            group,
            enable_caching,
            max_admission_blocks,
            use_eagle: false,
            alignment_tokens: scheduler_block_size,
            sink_blocks,
            cached_this_step: FxHashSet::default(),
        })
    }

    /// The group's parameters.
    #[inline]
    pub fn params(&self) -> &ManagerParams {
        &self.params
    }

    /// Tokens per block.
    #[inline]
    pub fn block_size(&self) -> usize {
        self.params.block_size
    }

    /// The group index.
    #[inline]
    pub fn group(&self) -> GroupId {
        self.group
    }

    /// Whether this manager caches blocks.
    #[inline]
    pub fn enable_caching(&self) -> bool {
        self.enable_caching
    }

    /// The sink blocks popped at construction (sink groups only). They are never freed
    /// and keep ref count 1 for the manager's lifetime.
    pub fn sink_blocks(&self) -> &[BlockId] {
        &self.sink_blocks
    }

    /// Tokens before the attention window of the next token, given `n` computed tokens.
    #[inline]
    pub fn num_skipped_tokens(&self, n: usize) -> usize {
        self.params.kind.num_skipped_tokens(n)
    }

    /// Slots the table must cover for `num_tokens` tokens (Mamba adds its speculative
    /// state blocks).
    #[inline]
    fn slot_tokens(&self, num_tokens: usize) -> usize {
        match self.params.kind {
            AttentionKind::Mamba {
                num_speculative_blocks,
                ..
            } => num_tokens + self.params.block_size * num_speculative_blocks,
            _ => num_tokens,
        }
    }

    /// Blocks that allocating for `num_tokens` (`num_tokens_main_model` without the
    /// lookahead) would take off the free queue (vLLM 0.33's
    /// `get_num_blocks_to_allocate`, hits that are still free included). Align-mode
    /// Mamba may return a negative count, and `num_blocks + 1` to defer a request whose
    /// hit was cached during this step.
    #[allow(clippy::too_many_arguments)]
    pub fn get_num_blocks_to_allocate(
        &self,
        rb: &RequestBlocks,
        num_tokens: usize,
        num_tokens_main_model: usize,
        new_computed: &[BlockId],
        total_computed_tokens: usize,
        apply_admission_cap: bool,
        pool: &BlockPool,
    ) -> isize {
        if let AttentionKind::Mamba { align, .. } = self.params.kind {
            if let Some(&last) = new_computed.last() {
                let key = pool.block_hash(last).ok().flatten();
                if key.is_some_and(|k| self.cached_this_step.contains(&k)) {
                    return pool.num_blocks() as isize + 1;
                }
            }
            if align {
                return mamba::num_blocks_to_allocate(
                    self,
                    rb,
                    num_tokens_main_model,
                    new_computed,
                    pool,
                );
            }
        }
        self.blocks_to_allocate(
            rb,
            num_tokens,
            new_computed,
            total_computed_tokens,
            apply_admission_cap,
            pool,
        ) as isize
    }

    /// The common (non align-mode) `get_num_blocks_to_allocate`.
    fn blocks_to_allocate(
        &self,
        rb: &RequestBlocks,
        num_tokens: usize,
        new_computed: &[BlockId],
        total_computed_tokens: usize,
        apply_admission_cap: bool,
        pool: &BlockPool,
    ) -> usize {
        let bs = self.params.block_size;
        let mut required = cdiv(self.slot_tokens(num_tokens), bs);
        if apply_admission_cap {
            if let Some(cap) = self.max_admission_blocks {
                required = required.min(cap);
            }
        }
        let held = rb.table.len();
        if rb.num_cached.is_some() {
            return required.saturating_sub(held);
        }
        let skipped_blocks = self.num_skipped_tokens(total_computed_tokens) / bs;
        let new_blocks = required.saturating_sub(skipped_blocks.max(new_computed.len() + held));
        let skip_hits = skipped_blocks.saturating_sub(held).min(new_computed.len());
        let evictable = new_computed[skip_hits..]
            .iter()
            .filter(|&&b| b != NULL_BLOCK_ID && pool.ref_cnt(b).unwrap_or(1) == 0)
            .count();
        new_blocks + evictable
    }

    /// Adds a new request's prefix-cache hit blocks to its (empty) table: out-of-window
    /// hits become nulls, the rest are touched (vLLM 0.33's `add_local_computed_blocks`).
    pub fn add_local_computed_blocks(
        &self,
        rb: &mut RequestBlocks,
        hits: &[BlockId],
        num_local_computed: usize,
        num_external_computed: usize,
        pool: &mut BlockPool,
    ) -> Result<()> {
        if matches!(self.params.kind, AttentionKind::CrossAttention) {
            return Ok(());
        }
        debug_assert!(rb.table.is_empty());
        let skipped =
            self.num_skipped_tokens(num_local_computed + num_external_computed) / self.block_size();
        let kept = &hits[skipped.min(hits.len())..];
        if self.enable_caching {
            pool.touch(kept)?;
        }
        rb.table.extend(std::iter::repeat_n(NULL_BLOCK_ID, skipped));
        rb.table.extend_from_slice(kept);
        rb.num_cached = Some(rb.table.len());
        Ok(())
    }

    /// Allocates blocks for KV-connector tokens inside the window (after every group's
    /// hits were touched).
    pub fn allocate_external_computed_blocks(
        &self,
        rb: &mut RequestBlocks,
        num_local_computed: usize,
        num_external_computed: usize,
        pool: &mut BlockPool,
    ) -> Result<()> {
        if matches!(self.params.kind, AttentionKind::CrossAttention) {
            return Ok(());
        }
        let total = num_local_computed + num_external_computed;
        let skipped = self.num_skipped_tokens(total);
        let external = if skipped > 0 {
            num_external_computed.min(total - skipped)
        } else {
            num_external_computed
        };
        if external == 0 {
            return Ok(());
        }
        let n = cdiv(total, self.block_size()).saturating_sub(rb.table.len());
        pool.get_new_blocks_into(n, &mut rb.table)
    }

    /// Extends the table to cover `num_tokens` tokens with blocks from the queue head
    /// (align-mode Mamba: `num_tokens_main_model`, one state block at most).
    pub fn allocate_new_blocks(
        &self,
        rb: &mut RequestBlocks,
        num_tokens: usize,
        num_tokens_main_model: usize,
        pool: &mut BlockPool,
    ) -> Result<()> {
        if let AttentionKind::Mamba { align: true, .. } = self.params.kind {
            return mamba::allocate_new_blocks(self, rb, num_tokens_main_model, pool);
        }
        let required = cdiv(self.slot_tokens(num_tokens), self.block_size());
        if required > rb.table.len() {
            pool.get_new_blocks_into(required - rb.table.len(), &mut rb.table)?;
        }
        Ok(())
    }

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
                        sliding_window::reachable_block_mask(
                            start,
                            end,
                            self.alignment_tokens,
                            sliding_window,
                            bs,
                            self.use_eagle,
                            retention,
                            replay_boundaries,
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

    /// Frees the request's table: leading nulls are dropped, the rest is freed tail
    /// first.
    pub fn free(&self, rb: &mut RequestBlocks, pool: &mut BlockPool) -> Result<()> {
        pool.free_blocks(held_blocks(rb).iter().rev().copied())?;
        rb.clear();
        Ok(())
    }

    /// Forgets the request and appends its blocks to `out` in allocation order, leading
    /// nulls dropped, without freeing them (vLLM's `pop_blocks_for_free`: the caller
    /// frees them later, in reverse).
    pub fn pop_blocks_for_free(&self, rb: &mut RequestBlocks, out: &mut Vec<BlockId>) {
        out.extend_from_slice(held_blocks(rb));
        rb.clear();
    }

    /// Frees the blocks whose tokens the next token no longer attends to, replacing them
    /// with nulls; the freed blocks go back to the pool highest position first.
    pub fn remove_skipped_blocks(
        &self,
        rb: &mut RequestBlocks,
        num_computed_tokens: usize,
        pool: &mut BlockPool,
    ) -> Result<()> {
        if let AttentionKind::Mamba { align: true, .. } = self.params.kind {
            return mamba::remove_skipped_blocks(self, rb, num_computed_tokens, pool);
        }
        let skipped = self.num_skipped_tokens(num_computed_tokens);
        if skipped == 0 {
            return Ok(());
        }
        let end = (skipped / self.block_size()).min(rb.table.len());
        let start = rb.table[..end]
            .iter()
            .rposition(|&b| b == NULL_BLOCK_ID)
            .map_or(0, |i| i + 1);
        if start < end {
            pool.free_blocks(rb.table[start..end].iter().rev().copied())?;
            rb.table[start..end].fill(NULL_BLOCK_ID);
        }
        Ok(())
    }

    /// The longest prefix hit of `query` for this manager's attention type; fills one
    /// list per group of `query.groups` into `out` and returns the hit length in tokens.
    pub fn find_longest_cache_hit(
        &self,
        query: &HitQuery<'_>,
        pool: &BlockPool,
        out: &mut [Vec<BlockId>],
    ) -> Result<usize> {
        for o in out.iter_mut() {
            o.clear();
        }
        let bs = self.block_size();
        match self.params.kind {
            AttentionKind::FullAttention | AttentionKind::SinkFullAttention { .. } => {
                Ok(full::find_longest_cache_hit(query, bs, pool, out))
            }
            AttentionKind::SlidingWindow { sliding_window, .. } => Ok(
                sliding_window::find_longest_cache_hit(query, bs, sliding_window, pool, out),
            ),
            AttentionKind::ChunkedLocal {
                attention_chunk_size,
            } => chunked_local::find_longest_cache_hit(query, bs, attention_chunk_size, pool, out),
            AttentionKind::Mamba { align: true, .. } => {
                Ok(mamba::find_longest_cache_hit(query, bs, pool, out))
            }
            AttentionKind::Mamba { .. } => {
                Err(mamba::unsupported("prefix caching in mode \"none\""))
            }
            AttentionKind::CrossAttention => Err(cross_attention::unsupported_lookup()),
        }
    }
}

impl SingleTypeManager {
    /// Per-step hook: align-mode Mamba forgets which keys were cached this step.
    pub fn new_step_starts(&mut self) {
        self.cached_this_step.clear();
    }
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

#[cfg(test)]
mod tests;
