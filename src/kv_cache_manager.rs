//! The `KVCacheManager` facade (docs/ARCHITECTURE.md, "Allocation"): what a scheduler
//! calls. It resolves a request id to a slot once per call and hands that request's
//! per-group tables to the [`Coordinator`].
//!
//! ```
//! use kvblocks::attention::{AttentionKind, ManagerParams, RequestView};
//! use kvblocks::kv_cache_manager::{AllocateArgs, KvCacheManager, ManagerOptions};
//! use kvblocks::events::event::{EventExtraKeys, StoredBlockSource};
//! use kvblocks::BlockHash;
//!
//! struct Req { tokens: Vec<u32>, computed: usize }
//! impl StoredBlockSource for Req {
//!     fn token_ids(&self) -> &[u32] { &self.tokens }
//!     fn event_extra_keys(&self, _: usize, _: usize) -> EventExtraKeys { None }
//! }
//! impl RequestView for Req {
//!     fn request_id(&self) -> &str { "r0" }
//!     fn num_tokens(&self) -> usize { self.tokens.len() }
//!     fn num_prompt_tokens(&self) -> usize { self.tokens.len() }
//!     fn num_computed_tokens(&self) -> usize { self.computed }
//!     fn block_hashes(&self) -> &[BlockHash] { &[] }
//! }
//!
//! let groups = vec![ManagerParams::new(AttentionKind::FullAttention, 16, 0)];
//! let mut mgr = KvCacheManager::new(groups, 11, None, ManagerOptions::new(1024, 16)).unwrap();
//! let req = Req { tokens: vec![7; 55], computed: 0 };
//! let new = mgr.allocate_slots(&req, &AllocateArgs::new(55)).unwrap().unwrap();
//! assert_eq!(new, vec![vec![1, 2, 3, 4]]);
//! ```

use crate::admission;
use crate::attention::{BoundaryOffload, ContextParallel, ManagerParams, RequestView};
use crate::config;
use crate::coordinator::{Coordinator, CoordinatorOptions};
use crate::error::{KvError, Result};
use crate::events::event::KvCacheEvent;
use crate::hisparse::HiSparse;
use crate::pool::{BlockPool, FreeTag};
pub use crate::stats::PrefixCacheStats;
use crate::types::{BlockId, GroupId};
pub use lookup::Lookup;
use slots::RequestSlots;

/// Construction options (vLLM's `KVCacheManager.__init__` keywords).
#[derive(Debug, Clone, Copy)]
pub struct ManagerOptions {
    /// The model's context length.
    pub max_model_len: usize,
    /// Tokens per request hash.
    pub hash_block_size: usize,
    /// Hit alignment; `None` = lcm of the group block sizes
    /// ([`config::scheduler_block_size`]).
    pub scheduler_block_size: Option<usize>,
    /// Tokens in flight; `None` = `max_model_len`.
    pub max_in_flight_tokens: Option<usize>,
    /// Prefix caching.
    pub enable_caching: bool,
    /// EAGLE / MTP speculative decoding.
    pub use_eagle: bool,
    /// Keep `PrefixCacheStats`.
    pub log_stats: bool,
    /// Record KV cache events.
    pub enable_kv_cache_events: bool,
    /// Blocks kept free when admitting a waiting or preempted request while others are
    /// scheduled (vLLM's `int(watermark * num_blocks)`).
    pub watermark_blocks: usize,
    /// Record new blocks for worker-side zeroing (vLLM's `needs_kv_cache_zeroing`).
    pub record_new_block_ids: bool,
    /// Count references to the null block as vLLM 0.32 does (`pool/null_block.rs`);
    /// off (vLLM 0.33) by default.
    pub count_null_block_refs: bool,
    /// Prefix cache Mamba groups in mode `"none"` as vLLM 0.32 does; off (vLLM 0.33
    /// refuses them) by default.
    pub mamba_none_prefix_caching: bool,
    /// Multi-module MTP's `num_prefill_lookahead`: the last `num_prefill_lookahead - 1`
    /// computed tokens are not cached (they may be re-prefilled).
    pub num_prefill_lookahead: usize,
    /// `num_hash_lookahead_tokens`: tokens after each block that its hash covers,
    /// published in `BlockStored.lookahead_token_ids`.
    pub num_hash_lookahead_tokens: usize,
    /// Decode / prefill context parallelism (`attention/context_parallel.rs`).
    pub context_parallel: ContextParallel,
    /// Record the pool's calls for a KV cache metrics collector (`pool/metrics.rs`).
    pub record_block_metrics: bool,
    /// Blocks of HiSparse's host pool (`hisparse_host_num_blocks`), which a
    /// host-resident group draws from.
    pub host_num_blocks: Option<usize>,
}

impl ManagerOptions {
    /// vLLM's defaults for the given context length and hash block size.
    pub fn new(max_model_len: usize, hash_block_size: usize) -> Self {
        Self {
            max_model_len,
            hash_block_size,
            scheduler_block_size: None,
            max_in_flight_tokens: None,
            enable_caching: true,
            use_eagle: false,
            log_stats: false,
            enable_kv_cache_events: false,
            watermark_blocks: 0,
            record_new_block_ids: false,
            count_null_block_refs: false,
            mamba_none_prefix_caching: false,
            num_prefill_lookahead: 0,
            num_hash_lookahead_tokens: 0,
            context_parallel: ContextParallel::NONE,
            record_block_metrics: false,
            host_num_blocks: None,
        }
    }
}

/// The arguments of `allocate_slots` beyond the request.
#[derive(Debug, Clone, Copy)]
pub struct AllocateArgs<'a> {
    /// Tokens to compute this step (drafts included).
    pub num_new_tokens: usize,
    /// Tokens of this call's prefix-cache hit.
    pub num_new_computed_tokens: usize,
    /// The hit's blocks per group (`None`, or all groups empty: no hit).
    pub new_computed_blocks: Option<&'a [Vec<BlockId>]>,
    /// Speculative slots.
    pub num_lookahead_tokens: usize,
    /// Tokens a KV connector supplies.
    pub num_external_computed_tokens: usize,
    /// Skip caching (P/D loads cache later).
    pub delay_cache_blocks: bool,
    /// Encoder tokens (cross-attention groups).
    pub num_encoder_tokens: usize,
    /// Admit only if the whole sequence fits (SWA / chunked caps applied).
    pub full_sequence_must_fit: bool,
    /// Free blocks this allocation must leave to other in-flight sequences.
    pub reserved_blocks: usize,
    /// Whether other requests are already scheduled this step (the watermark applies
    /// only then).
    pub has_scheduled_reqs: bool,
    /// Groups whose KV-connector blocks an async load writes: not recorded for zeroing.
    pub skip_zeroing_groups: &'a [usize],
}

impl AllocateArgs<'_> {
    /// `num_new_tokens` with every other argument at vLLM's default.
    pub fn new(num_new_tokens: usize) -> Self {
        Self {
            num_new_tokens,
            num_new_computed_tokens: 0,
            new_computed_blocks: None,
            num_lookahead_tokens: 0,
            num_external_computed_tokens: 0,
            delay_cache_blocks: false,
            num_encoder_tokens: 0,
            full_sequence_must_fit: false,
            reserved_blocks: 0,
            has_scheduled_reqs: true,
            skip_zeroing_groups: &[],
        }
    }
}

/// The blocks one allocation added: every group's ids back to back, in group order
/// (reused from call to call).
#[derive(Debug, Clone, Default)]
pub struct NewBlocks {
    ids: Vec<BlockId>,
    ends: Vec<usize>,
}

impl NewBlocks {
    /// Forgets the blocks, keeping the capacity.
    pub fn clear(&mut self) {
        self.ids.clear();
        self.ends.clear();
    }

    /// Records the next group's ids.
    pub fn push(&mut self, ids: &[BlockId]) {
        self.ids.extend_from_slice(ids);
        self.ends.push(self.ids.len());
    }

    /// Whether no group got a block.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Each group's ids, in group order.
    pub fn groups(&self) -> impl Iterator<Item = &[BlockId]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(s, &e)| &self.ids[s..e])
    }
}

/// vLLM 0.33's `KVCacheManager`.
#[derive(Debug, Clone)]
pub struct KvCacheManager {
    coord: Coordinator,
    max_model_len: usize,
    enable_caching: bool,
    log_stats: bool,
    watermark_blocks: usize,
    stats: PrefixCacheStats,
    /// Each request's slot and its tables.
    slots: RequestSlots,
    /// Whether a retention policy is set (`retention.rs`).
    retention_on: bool,
    /// Per slot, the free tag of its request (used only with a policy).
    slot_tag: Vec<FreeTag>,
    /// HiSparse's coordinator state, with a host-resident group (`hisparse.rs`).
    hisparse: Option<Box<HiSparse>>,
}

impl KvCacheManager {
    /// Builds the manager for the given groups (in group order) and pool size.
    /// `retention_interval` is `KVCacheConfig.prefix_cache_retention_interval`.
    pub fn new(
        mut groups: Vec<ManagerParams>,
        num_blocks: usize,
        retention_interval: Option<usize>,
        opts: ManagerOptions,
    ) -> Result<Self> {
        if opts.max_model_len == 0 {
            return Err(KvError::InvalidArgument(
                "max_model_len must be positive".into(),
            ));
        }
        if groups.iter().any(|g| g.block_size == 0) {
            return Err(KvError::InvalidSpec("block_size must be positive".into()));
        }
        opts.context_parallel
            .apply(&mut groups, opts.enable_caching)?;
        let scheduler_block_size = match opts.scheduler_block_size {
            Some(s) => s,
            None if groups.is_empty() => opts.hash_block_size,
            None => {
                let sizes: Vec<usize> = groups.iter().map(|g| g.block_size).collect();
                config::scheduler_block_size(&sizes)?
            }
        };
        let num_groups = groups.len();
        let coord = Coordinator::new(
            groups,
            CoordinatorOptions {
                num_blocks,
                max_model_len: opts.max_model_len,
                max_in_flight_tokens: opts.max_in_flight_tokens.unwrap_or(opts.max_model_len),
                use_eagle: opts.use_eagle,
                enable_caching: opts.enable_caching,
                enable_kv_cache_events: opts.enable_kv_cache_events,
                scheduler_block_size,
                hash_block_size: opts.hash_block_size,
                retention_interval,
                record_new_block_ids: opts.record_new_block_ids,
                count_null_block_refs: opts.count_null_block_refs,
                mamba_none_prefix_caching: opts.mamba_none_prefix_caching,
                num_prefill_lookahead: opts.num_prefill_lookahead,
                num_hash_lookahead_tokens: opts.num_hash_lookahead_tokens,
                record_block_metrics: opts.record_block_metrics,
                host_num_blocks: opts.host_num_blocks,
            },
        )?;
        let hisparse = HiSparse::new(
            &coord,
            opts.max_model_len,
            num_blocks,
            coord.num_reprefillable_tokens(),
        );
        Ok(Self {
            hisparse,
            coord,
            max_model_len: opts.max_model_len,
            enable_caching: opts.enable_caching,
            log_stats: opts.log_stats,
            watermark_blocks: opts.watermark_blocks,
            stats: PrefixCacheStats::default(),
            slots: RequestSlots::new(num_groups),
            retention_on: false,
            slot_tag: Vec::new(),
        })
    }

    /// Number of KV cache groups.
    #[inline]
    pub fn num_groups(&self) -> usize {
        self.slots.num_groups()
    }

    /// Blocks kept free for admissions while others are scheduled.
    #[inline]
    pub fn watermark_blocks(&self) -> usize {
        self.watermark_blocks
    }

    /// The coordinator.
    #[inline]
    pub fn coordinator(&self) -> &Coordinator {
        &self.coord
    }

    /// The shared block pool.
    #[inline]
    pub fn pool(&self) -> &BlockPool {
        self.coord.pool()
    }

    /// The shared block pool, to change directly (vLLM's callers reach the pool through
    /// the manager).
    #[inline]
    pub fn pool_mut(&mut self) -> &mut BlockPool {
        self.coord.pool_mut()
    }

    /// `pool.get_usage()`.
    pub fn usage(&self) -> f64 {
        self.coord.pool().usage()
    }

    /// With caching on, a request hashed at another block size than the manager's is
    /// an error (found by tests/core/test_bad_input.py: its hashes hit blocks holding other
    /// tokens).
    fn check_hash_block_size<R: RequestView>(&self, request: &R) -> Result<()> {
        let expected = self.coord.pool().hash_block_size();
        match request.hash_block_size() {
            Some(got) if self.enable_caching && got != expected => {
                Err(KvError::InvalidArgument(format!(
                    "request {:?} is hashed at block size {got}, the manager at {expected}",
                    request.request_id()
                )))
            }
            _ => Ok(()),
        }
    }

    /// Rejects a request longer than the model's context (`max_model_len`), unless the
    /// request is one the manager clamps silently (`RequestView::clamps_to_max_model_len`:
    /// vLLM's). kvblocks' own API checks it before `allocate_slots`.
    pub fn check_length<R: RequestView>(&self, request: &R) -> Result<()> {
        if request.num_tokens() > self.max_model_len && !request.clamps_to_max_model_len() {
            return Err(KvError::InvalidArgument(format!(
                "request {:?} has {} tokens, more than max_model_len {}",
                request.request_id(),
                request.num_tokens(),
                self.max_model_len
            )));
        }
        Ok(())
    }

    /// Gives the request slots for `args.num_new_tokens` more tokens (and the lookahead),
    /// adding its prefix hit first. Returns the newly allocated blocks per group, or
    /// `None` when they do not fit (then only out-of-window blocks were freed). Bad
    /// arguments are rejected before anything changes.
    pub fn allocate_slots<R: RequestView>(
        &mut self,
        request: &R,
        args: &AllocateArgs<'_>,
    ) -> Result<Option<Vec<Vec<BlockId>>>> {
        let mut new_blocks = Vec::with_capacity(self.num_groups());
        let fitted = self.allocate_slots_with(request, args, |_, ids| {
            new_blocks.push(ids.to_vec());
        })?;
        Ok(fitted.then_some(new_blocks))
    }

    /// [`allocate_slots`](Self::allocate_slots) with only `num_new_tokens[i]` for each
    /// request of a batch (the decoding requests of a step), in order, stopping at the
    /// first that does not fit: later requests are not tried. The batch is checked before
    /// anything changes: one count per request, every count positive, no request longer
    /// than `max_model_len`. `fitted` sees each fitted request's new blocks in turn, in
    /// `blocks`; the call returns how many requests fitted.
    pub fn allocate_slots_batch<R, E>(
        &mut self,
        requests: &[&R],
        num_new_tokens: &[usize],
        blocks: &mut NewBlocks,
        mut fitted: impl FnMut(&NewBlocks) -> std::result::Result<(), E>,
    ) -> std::result::Result<usize, E>
    where
        R: RequestView,
        E: From<KvError>,
    {
        if requests.len() != num_new_tokens.len() {
            return Err(KvError::InvalidArgument(format!(
                "{} requests but {} token counts",
                requests.len(),
                num_new_tokens.len()
            ))
            .into());
        }
        if num_new_tokens.contains(&0) {
            return Err(KvError::InvalidArgument(
                "num_new_tokens must be greater than 0 for every request".into(),
            )
            .into());
        }
        for request in requests {
            self.check_length(*request)?;
        }
        for (i, (request, &n)) in requests.iter().zip(num_new_tokens).enumerate() {
            blocks.clear();
            let args = AllocateArgs::new(n);
            if !self.allocate_slots_with(*request, &args, |_, ids| blocks.push(ids))? {
                return Ok(i);
            }
            fitted(blocks)?;
        }
        Ok(requests.len())
    }

    /// [`allocate_slots`](Self::allocate_slots) without building the result: on success
    /// `new_blocks(group, ids)` sees each group's newly allocated blocks, in group order,
    /// and the call returns `true`; `false` means they did not fit.
    pub fn allocate_slots_with<R: RequestView>(
        &mut self,
        request: &R,
        args: &AllocateArgs<'_>,
        mut new_blocks: impl FnMut(usize, &[BlockId]),
    ) -> Result<bool> {
        self.check_hash_block_size(request)?;
        let slot = self.slots.find(request);
        let local = request.num_computed_tokens() + args.num_new_computed_tokens;
        let hits = self.validate_allocate(slot, local, args)?;
        // The tokens a hit reuses: the host-resident group adopts its hit up to them.
        let hit_tokens = args.num_new_computed_tokens + args.num_external_computed_tokens;
        let g = self.num_groups();
        let total = (local + args.num_external_computed_tokens).min(self.max_model_len);
        let watermark = admission::blocks_kept_free(
            self.watermark_blocks,
            args.has_scheduled_reqs,
            request.awaiting_admission(),
        ) as isize;
        let free = self.coord.pool().num_free_blocks() as isize;
        let prefill_end = self.coord.prefill_end_of(request);
        if args.full_sequence_must_fit {
            let full = request.num_tokens().min(self.max_model_len);
            let need = self.coord.get_num_blocks_to_allocate(
                self.slots.tables_or_empty(slot),
                full,
                full,
                hits,
                hit_tokens,
                args.num_encoder_tokens,
                total,
                local,
                true,
                prefill_end,
            );
            if need + watermark > free {
                return Ok(false);
            }
        }
        let main = total + args.num_new_tokens;
        let need_slots = (main + args.num_lookahead_tokens).min(self.max_model_len);
        if let Some(s) = slot {
            self.set_free_tag_of_slot(s);
            self.coord
                .remove_skipped_blocks_of(self.slots.tables_mut(s), request, total)?;
        }
        let need = self.coord.get_num_blocks_to_allocate(
            self.slots.tables_or_empty(slot),
            need_slots,
            main,
            hits,
            hit_tokens,
            args.num_encoder_tokens,
            local + args.num_external_computed_tokens,
            local,
            false,
            prefill_end,
        );
        let available =
            self.coord.pool().num_free_blocks() as isize - args.reserved_blocks as isize;
        if need + watermark > available {
            return Ok(false);
        }
        let s = match slot {
            Some(s) => s,
            None => {
                let s = self.slots.insert(request);
                self.assign_free_tag(request, s);
                s
            }
        };
        let rbs = self.slots.tables_mut(s);
        if hits.is_some() || args.num_external_computed_tokens > 0 {
            self.coord.allocate_new_computed_blocks(
                rbs,
                hits,
                hit_tokens,
                local,
                args.num_external_computed_tokens,
                args.skip_zeroing_groups,
            )?;
        }
        let (mut starts, mut starts_vec) = ([0usize; 8], Vec::new());
        let starts = per_group_scratch(&mut starts, &mut starts_vec, g);
        // A partial hit's copy per group that has one, `(group, block)`: empty (and not
        // allocated) unless a partial hit was adopted.
        let mut copies = Vec::new();
        for (st, rb) in starts.iter_mut().zip(rbs.iter()) {
            *st = rb.table.len();
        }
        self.coord.allocate_new_blocks(
            rbs,
            request,
            need_slots,
            local + args.num_external_computed_tokens,
            main,
            args.num_encoder_tokens,
            prefill_end,
            &mut copies,
        )?;
        // HiSparse's hooks run between the allocation and caching, and its publication
        // among the groups' caching; without HiSparse the tables stay borrowed (a second
        // lookup costs the decode path).
        let rbs = if self.hisparse.is_some() {
            self.hisparse_after_allocation(s, request, args, hits.is_some(), local, total)?;
            self.slots.tables_mut(s)
        } else {
            if !args.delay_cache_blocks {
                let n = (total + args.num_new_tokens).min(request.num_tokens());
                self.coord.cache_blocks(rbs, request, n)?;
            }
            rbs
        };
        for (group, (rb, &st)) in rbs.iter().zip(starts.iter()).enumerate() {
            match copies.iter().find(|&&(g, _)| g == group) {
                // A partial hit's copy replaced a table entry: it comes first.
                Some(&(_, c)) => new_blocks(group, &[&[c][..], &rb.table[st..]].concat()),
                None => new_blocks(group, &rb.table[st..]),
            }
        }
        Ok(true)
    }

    /// Checks `allocate_slots` arguments; returns the hit (None for no hit).
    fn validate_allocate<'a>(
        &self,
        slot: Option<usize>,
        local_tokens: usize,
        args: &AllocateArgs<'a>,
    ) -> Result<Option<&'a [Vec<BlockId>]>> {
        if args.num_new_tokens == 0
            && args.num_external_computed_tokens == 0
            && args.num_new_computed_tokens == 0
        {
            return Err(KvError::InvalidArgument(
                "num_new_tokens must be greater than 0 when there are no computed tokens to \
                 adopt"
                    .into(),
            ));
        }
        self.check_hit_groups("new_computed_blocks", args.new_computed_blocks)?;
        let hits = match args.new_computed_blocks {
            Some(h) if h.iter().any(|g| !g.is_empty()) => h,
            // Hit tokens without hit blocks are a hit of no blocks (vLLM 0.33 takes a
            // missing `new_computed_blocks` as empty), unless a group's count would
            // assume out-of-window nulls no call places: the capacity check then
            // disagreed with the allocation, which failed after frees (found by
            // fuzzing; vLLM over-allocates there), so those are refused up front.
            _ if args.num_new_computed_tokens > 0
                && args.num_external_computed_tokens == 0
                && self
                    .coord
                    .managers()
                    .iter()
                    .zip(self.slots.tables_or_empty(slot))
                    .any(|(m, rb)| m.miscounts_blockless_hit(rb, local_tokens)) =>
            {
                return Err(KvError::InvalidArgument(
                    "num_new_computed_tokens > 0 without new_computed_blocks, on a request no \
                     group knows yet, whose tokens fall out of a group's window: pass the \
                     hit's blocks"
                        .into(),
                ))
            }
            _ => return self.check_can_adopt(slot, args, None),
        };
        if !self.enable_caching {
            return Err(KvError::InvalidArgument(
                "computed blocks must be empty when prefix caching is disabled".into(),
            ));
        }
        for (g, h) in hits.iter().enumerate() {
            let n = self.coord.pool_of_group(g).num_blocks();
            if let Some(&b) = h.iter().find(|&&b| b as usize >= n) {
                return Err(KvError::BlockOutOfRange {
                    block_id: b.into(),
                    num_blocks: n,
                });
            }
        }
        let partial_hits = self.coord.partial_hits_enabled();
        for (m, h) in self.coord.managers().iter().zip(hits) {
            if !partial_hits && !h.is_empty() && !local_tokens.is_multiple_of(m.block_size()) {
                return Err(KvError::Unsupported(
                    "prefix hits ending inside a block (0.33 partial-hit copy-on-write)".into(),
                ));
            }
            if !m.params().caches_prefix() && !h.is_empty() {
                return Err(KvError::InvalidArgument(
                    "groups that are not prefix cached (cross-attention, circular buffers) have \
                     no prefix hits"
                        .into(),
                ));
            }
        }
        self.check_can_adopt(slot, args, Some(hits))
    }

    /// A prefix hit (the argument `what`) gives one block list per group.
    fn check_hit_groups(&self, what: &str, hits: Option<&[Vec<BlockId>]>) -> Result<()> {
        match hits {
            Some(h) if h.len() != self.num_groups() => Err(KvError::InvalidArgument(format!(
                "{what} has {} groups, the manager has {}",
                h.len(),
                self.num_groups()
            ))),
            _ => Ok(()),
        }
    }

    /// A hit or external tokens are adopted only by a request no group knows yet, whose
    /// tables are empty.
    fn check_can_adopt<'a>(
        &self,
        slot: Option<usize>,
        args: &AllocateArgs<'_>,
        hits: Option<&'a [Vec<BlockId>]>,
    ) -> Result<Option<&'a [Vec<BlockId>]>> {
        let Some(s) = slot else {
            return Ok(hits);
        };
        let tables = self.slots.tables(s);
        let known = tables.iter().any(|rb| rb.num_cached.is_some());
        if hits.is_some() && known {
            return Err(KvError::InvalidArgument(
                "a running request cannot take new prefix-cache hits".into(),
            ));
        }
        let adopting = hits.is_some() || args.num_external_computed_tokens > 0;
        if adopting && !known && tables.iter().any(|rb| !rb.table.is_empty()) {
            return Err(KvError::InvalidArgument(
                "computed blocks can only be added to a request without blocks".into(),
            ));
        }
        Ok(hits)
    }

    /// Frees the request's blocks in every group (tail first). Unknown requests and
    /// repeated frees are no-ops.
    pub fn free(&mut self, request_id: &str) -> Result<()> {
        self.free_request(request_id, true)
    }

    /// [`free`](Self::free), saying whether the request finished (vLLM's
    /// `request.is_finished()`; a preempted one did not): HiSparse keeps a finished
    /// request's host blocks while transfers of its publication are in flight.
    pub fn free_request(&mut self, request_id: &str, finished: bool) -> Result<()> {
        let first = if self.hisparse.is_some() {
            self.hisparse_free_through_hook(request_id, finished)?
        } else {
            0
        };
        let Some(s) = self.slots.release(request_id) else {
            return Ok(());
        };
        self.set_free_tag_of_slot(s);
        self.coord.forget_boundary_offloads(request_id);
        self.coord
            .free_from(first, &mut self.slots.tables_mut(s)[first..])
    }

    /// Forgets the request and returns its blocks without freeing them: group after
    /// group, each in allocation order without leading nulls (vLLM's
    /// `pop_blocks_for_free`). The caller frees them later, in reverse order. Empty for
    /// an unknown request.
    pub fn pop_blocks_for_free(&mut self, request_id: &str) -> Vec<BlockId> {
        let Some(s) = self.slots.release(request_id) else {
            return Vec::new();
        };
        self.coord.forget_boundary_offloads(request_id);
        self.coord.pop_blocks_for_free(self.slots.tables_mut(s))
    }

    /// [`pop_blocks_for_free`](Self::pop_blocks_for_free) for a request that may hold
    /// host blocks: each group's blocks apart, HiSparse told first whether the request
    /// finished (as [`free_request`](Self::free_request)).
    pub fn pop_blocks_for_free_by_group(
        &mut self,
        request_id: &str,
        finished: bool,
    ) -> Result<Vec<Vec<BlockId>>> {
        if self.hisparse.is_some() {
            self.hisparse_free(request_id, finished)?;
        }
        let Some(s) = self.slots.release(request_id) else {
            return Ok(vec![Vec::new(); self.num_groups()]);
        };
        self.coord.forget_boundary_offloads(request_id);
        Ok(self
            .coord
            .pop_blocks_for_free_by_group(self.slots.tables_mut(s)))
    }

    /// The request's block table per group (empty lists for an unknown request).
    pub fn get_block_ids(&self, request_id: &str) -> Vec<Vec<BlockId>> {
        match self.slots.tables_of(request_id) {
            Some(tables) => tables.iter().map(|rb| rb.table.clone()).collect(),
            None => vec![Vec::new(); self.num_groups()],
        }
    }

    /// The request's block ids covering `num_computed_tokens` per group (vLLM's
    /// `get_block_ids_for_computed_tokens`): each type decides which
    /// (each kind's `computed_token_blocks`); empty lists for an unknown request.
    pub fn block_ids_for_computed_tokens(
        &self,
        request_id: &str,
        num_computed_tokens: usize,
    ) -> Vec<Vec<BlockId>> {
        self.coord
            .managers()
            .iter()
            .enumerate()
            .map(|(g, m)| {
                m.params()
                    .kind
                    .computed_token_blocks(
                        self.block_table(request_id, g),
                        num_computed_tokens,
                        m.block_size(),
                    )
                    .to_vec()
            })
            .collect()
    }

    /// A lookup's hit `blocks` (one list per group) cut at `num_computed_tokens` (vLLM's
    /// `truncate_computed_blocks`): `num_computed_tokens / block_size` blocks per group.
    /// As vLLM asserts, the endpoint must be a multiple of every prefix-cached group's
    /// block size and covered by its list, except a Mamba group's, which may be shorter
    /// (an external hit may supply its last state); a group that is not prefix cached
    /// has no blocks. `InvalidArgument` otherwise. No ref count changes.
    pub fn truncate_computed_blocks(
        &self,
        blocks: &[Vec<BlockId>],
        num_computed_tokens: usize,
    ) -> Result<Vec<Vec<BlockId>>> {
        self.check_hit_groups("blocks", Some(blocks))?;
        let n = num_computed_tokens;
        let bad = |group: usize, why: String| {
            Err(KvError::InvalidArgument(format!(
                "truncate_computed_blocks at {n} tokens: group {group} {why}"
            )))
        };
        let mut cut = Vec::with_capacity(blocks.len());
        for (group, (m, ids)) in self.coord.managers().iter().zip(blocks).enumerate() {
            let bs = m.block_size();
            let kind = m.params().kind;
            if !m.params().caches_prefix() {
                if !ids.is_empty() {
                    return bad(
                        group,
                        "is not prefix cached: a lookup gives it no blocks".into(),
                    );
                }
                cut.push(Vec::new());
                continue;
            }
            if !n.is_multiple_of(bs) {
                return bad(
                    group,
                    format!("has block size {bs}, which does not divide it"),
                );
            }
            // Only a Mamba group (not attention) may end before the endpoint.
            if n / bs > ids.len() && kind.is_attention() {
                return bad(
                    group,
                    format!("has {} hit blocks, it needs {}", ids.len(), n / bs),
                );
            }
            cut.push(ids[..(n / bs).min(ids.len())].to_vec());
        }
        Ok(cut)
    }

    /// The request's table in `group`, borrowed (empty for an unknown request).
    pub fn block_table(&self, request_id: &str, group: usize) -> &[BlockId] {
        match self.slots.tables_of(request_id) {
            Some(tables) if group < tables.len() => &tables[group].table,
            _ => &[],
        }
    }

    /// The tables of `request_ids` in `group` as one row-major `i32` matrix, written to
    /// `out` (cleared first): row `r` is request `r`'s block ids padded with the null
    /// block 0. Returns the width, the longest of those tables but at least 1 (vLLM's
    /// block tables are never zero wide, and Python's memoryview cannot be). An unknown
    /// request id gives a row of nulls, as its table is empty (vLLM's `get_block_ids`).
    /// `InvalidArgument` for a group out of range or a block id beyond `i32::MAX`.
    pub fn block_table_into<S: AsRef<str>>(
        &self,
        request_ids: &[S],
        group: usize,
        out: &mut Vec<i32>,
    ) -> Result<usize> {
        if group >= self.num_groups() {
            return Err(KvError::InvalidArgument(format!(
                "group id {group} out of range for {} groups",
                self.num_groups()
            )));
        }
        let rows = request_ids
            .iter()
            .map(|id| self.block_table(id.as_ref(), group));
        let width = rows.clone().map(<[BlockId]>::len).max().unwrap_or(0).max(1);
        out.clear();
        out.reserve(request_ids.len() * width);
        for table in rows {
            for &b in table {
                out.push(i32::try_from(b).map_err(|_| {
                    KvError::InvalidArgument(format!("block id {b} does not fit int32"))
                })?);
            }
            out.resize(out.len() + width - table.len(), 0);
        }
        Ok(width)
    }

    /// Caches the request's full blocks up to `num_computed_tokens` (after a delayed
    /// P/D load). A no-op with caching off. For a request the manager holds no blocks
    /// for: `UnknownRequest` if it has a full block to cache (vLLM raises `KeyError`
    /// there), else a silent no-op, as vLLM (its scheduler calls it so).
    pub fn cache_blocks<R: RequestView>(
        &mut self,
        request: &R,
        num_computed_tokens: usize,
    ) -> Result<()> {
        if !self.enable_caching {
            return Ok(());
        }
        self.check_hash_block_size(request)?;
        let Some(s) = self.slots.find(request) else {
            let hashes = request.block_hashes().len();
            let hash_bs = self.coord.pool().hash_block_size();
            let would_cache = self.coord.managers().iter().any(|m| {
                m.params().caches_prefix()
                    && m.num_full_blocks(num_computed_tokens, hashes, hash_bs) > 0
            });
            return if would_cache {
                Err(KvError::UnknownRequest(request.request_id().to_owned()))
            } else {
                Ok(())
            };
        };
        self.cache_blocks_with_publication(s, request, num_computed_tokens)
    }

    /// The blocks allocated since the last call that the worker must zero (vLLM's
    /// `take_new_block_ids`; empty unless `record_new_block_ids`).
    pub fn take_new_block_ids(&mut self) -> Vec<BlockId> {
        self.coord.take_new_block_ids()
    }

    /// Records the request's blocks from `start_token` on for zeroing again (vLLM's
    /// `record_blocks_for_zeroing`, after a failed async KV load). A no-op for an
    /// unknown request.
    pub fn record_blocks_for_zeroing(
        &mut self,
        request_id: &str,
        start_token: usize,
    ) -> Result<()> {
        let Some(s) = self.slots.get(request_id) else {
            return Ok(());
        };
        self.coord
            .record_blocks_for_zeroing(self.slots.tables(s), start_token)
    }

    /// Per-step hook (align-mode Mamba defers hits on blocks cached during a step).
    pub fn new_step_starts(&mut self) {
        self.coord.new_step_starts();
    }

    /// Align-mode Mamba states cached since the last call, for a KV connector to
    /// offload (vLLM's `take_boundary_state_offloads`): each newly cached state block
    /// with the tokens it follows, in caching order, group after group. A freed
    /// request's entries are dropped: its blocks went back to the pool.
    pub fn take_boundary_offloads(&mut self) -> Vec<BoundaryOffload> {
        self.coord.take_boundary_offloads()
    }

    /// Drops the cache entries of the given blocks (in the given order).
    pub fn evict_blocks(&mut self, blocks: &[BlockId]) -> Result<()> {
        self.coord.pool_mut().evict_blocks(blocks)
    }

    /// HiSparse's host pool (vLLM's source manager's `block_pool` once bound), if a
    /// group is host resident.
    pub fn host_pool(&self) -> Option<&BlockPool> {
        self.coord.host_pool()
    }

    /// The group whose blocks come from the host pool, if any.
    pub fn host_group(&self) -> Option<usize> {
        self.coord.host_group()
    }

    /// HiSparse's host pool, to change (the binding's view of it). Follow every call
    /// that may record events with [`forward_host_events`](Self::forward_host_events).
    pub fn host_pool_mut(&mut self) -> Option<&mut BlockPool> {
        self.coord.host_pool_mut()
    }

    /// Moves the host pool's pending events to the queue, after the device's so far.
    pub fn forward_host_events(&mut self) {
        self.coord.forward_host_events();
    }

    /// Drops the host pool's cache entries of the given blocks; their events join the
    /// queue now. `Unsupported` without a host pool.
    pub fn evict_host_blocks(&mut self, blocks: &[BlockId]) -> Result<()> {
        self.coord.evict_host_blocks(blocks)
    }

    /// Caches the host-resident group's blocks of `request` up to `num_tokens` in the host
    /// pool (vLLM's `HiSparseSourceManager.publish_blocks`). A no-op without a
    /// host-resident group or with caching off; `UnknownRequest` for a request the manager
    /// holds no blocks for.
    pub fn publish_host_blocks<R: RequestView>(
        &mut self,
        request: &R,
        num_tokens: usize,
    ) -> Result<()> {
        let Some(s) = self.slots.get(request.request_id()) else {
            return Err(KvError::UnknownRequest(request.request_id().to_owned()));
        };
        self.coord
            .publish_host_blocks(self.slots.tables_mut(s), request, num_tokens)
    }

    /// Clears the prefix cache if no request holds a block.
    pub fn reset_prefix_cache(&mut self) -> bool {
        let ok = self.coord.reset_prefix_cache();
        // A reset reports every unpinned block as reused (HiSparse loses those pages).
        self.hisparse_drain_reused();
        if ok && self.log_stats {
            self.stats.reset = true;
        }
        ok
    }

    /// vLLM 0.33: cascade attention is gone; zeros per group.
    pub fn get_num_common_prefix_blocks(&self, _request_id: &str) -> Vec<usize> {
        vec![0; self.num_groups()]
    }

    /// The pool's events, each `BlockStored` annotated with its group's spec kind and
    /// sliding window.
    pub fn take_events(&mut self) -> Vec<KvCacheEvent> {
        let mut events = self.coord.pool_mut().take_events();
        for e in &mut events {
            if let KvCacheEvent::BlockStored(s) = e {
                if let Some(m) = self.coord.managers().get(s.group_idx as usize) {
                    s.kv_cache_spec_kind = Some(m.params().spec_kind);
                    s.kv_cache_spec_sliding_window = m.params().event_sliding_window;
                }
            }
        }
        events
    }

    /// The ids of the requests holding a slot (in no particular order).
    pub fn request_ids(&self) -> impl Iterator<Item = &str> + '_ {
        self.slots.ids()
    }

    /// Leading cached entries of the request's table in `group` (vLLM's
    /// `num_cached_block[request_id]`), or `None` if the group does not know the
    /// request yet.
    pub fn num_cached_blocks(&self, request_id: &str, group: usize) -> Option<usize> {
        let s = self.slots.get(request_id)?;
        self.slots.tables(s).get(group)?.num_cached
    }

    /// The request's prefill checkpoint of this step in align-mode Mamba group `group`,
    /// `(position, table index)` (vLLM's `_checkpoints`), if any.
    pub fn mamba_checkpoint(&self, request_id: &str, group: usize) -> Option<(usize, usize)> {
        let s = self.slots.get(request_id)?;
        self.slots.tables(s).get(group)?.mamba.checkpoint()
    }

    /// The blocks an allocation would take from the pool (vLLM's
    /// `coordinator.get_num_blocks_to_allocate`, a dry run: nothing changes).
    /// `prefill_end` is where the request's prefill ends (0: not given).
    #[allow(clippy::too_many_arguments)]
    pub fn get_num_blocks_to_allocate(
        &self,
        request_id: &str,
        num_tokens: usize,
        num_tokens_main_model: usize,
        hits: Option<&[Vec<BlockId>]>,
        num_encoder_tokens: usize,
        total_computed_tokens: usize,
        num_local_computed_tokens: usize,
        apply_admission_cap: bool,
        prefill_end: usize,
    ) -> Result<isize> {
        self.check_hit_groups("new_computed_blocks", hits)?;
        let slot = self.slots.get(request_id);
        Ok(self.coord.get_num_blocks_to_allocate(
            self.slots.tables_or_empty(slot),
            num_tokens,
            num_tokens_main_model,
            hits,
            // vLLM's coordinator counts the hit as given (its caller already cut it).
            usize::MAX,
            num_encoder_tokens,
            total_computed_tokens,
            num_local_computed_tokens,
            apply_admission_cap,
            prefill_end,
        ))
    }

    /// One group's share of [`get_num_blocks_to_allocate`](Self::get_num_blocks_to_allocate)
    /// (vLLM's `get_num_blocks_to_allocate` of the group's manager): `hit` is the group's
    /// hit, in the pool the group draws from. A dry run: nothing changes.
    #[allow(clippy::too_many_arguments)]
    pub fn get_group_num_blocks_to_allocate(
        &self,
        group: usize,
        request_id: &str,
        num_tokens: usize,
        num_tokens_main_model: usize,
        hit: &[BlockId],
        total_computed_tokens: usize,
        num_local_computed_tokens: usize,
        apply_admission_cap: bool,
        prefill_end: usize,
    ) -> Result<isize> {
        if group >= self.num_groups() {
            return Err(KvError::InvalidArgument(format!(
                "group {group} out of range: the manager has {} groups",
                self.num_groups()
            )));
        }
        let slot = self.slots.get(request_id);
        Ok(self.coord.get_group_num_blocks_to_allocate(
            group,
            &self.slots.tables_or_empty(slot)[group],
            num_tokens,
            num_tokens_main_model,
            hit,
            total_computed_tokens,
            num_local_computed_tokens,
            apply_admission_cap,
            prefill_end,
        ))
    }

    /// The partial-hit copies queued since the last call, `(source, destination)`
    /// (vLLM's `take_kv_cache_block_copies`): the worker copies each block before the
    /// step runs; every endpoint keeps one reference for the copy, which the caller
    /// drops with the pool's `free_blocks` once the copy has run.
    pub fn take_block_copies(&mut self) -> Vec<(BlockId, BlockId)> {
        self.coord.take_block_copies()
    }

    /// Whether prefix hits may end on a hash boundary inside a block (vLLM's
    /// `coordinator.enable_partial_hash_hits`).
    pub fn partial_hits_enabled(&self) -> bool {
        self.coord.partial_hits_enabled()
    }

    /// Arms vLLM's Mamba shared-prefix checkpoint where vLLM would
    /// ([`Coordinator::arm_mamba_shared_prefix_checkpoint`]); returns whether it is armed.
    pub fn arm_mamba_shared_prefix_checkpoint(&mut self) -> bool {
        self.coord.arm_mamba_shared_prefix_checkpoint()
    }

    /// Sets `prefix_cache_retention_interval` after construction
    /// ([`Coordinator::set_retention_interval`]: checked as at construction; a bad one
    /// changes nothing).
    pub fn set_retention_interval(&mut self, interval: Option<usize>) -> Result<()> {
        self.coord.set_retention_interval(interval)
    }

    /// vLLM's `finalize_partial_tail_offloads` for a finishing request that computed
    /// `num_computed` tokens with `num_in_flight` in flight: `(group, block, boundary)`
    /// of each align-mode Mamba partial tail it cached itself and did not overwrite
    /// (empty for an unknown request).
    pub fn finalize_partial_tail_offloads(
        &mut self,
        request_id: &str,
        num_computed: usize,
        num_in_flight: usize,
    ) -> Vec<(GroupId, BlockId, usize)> {
        let Some(s) = self.slots.get(request_id) else {
            return Vec::new();
        };
        self.coord.finalize_partial_tail_offloads(
            self.slots.tables_mut(s),
            num_computed,
            num_in_flight,
        )
    }

    /// Frees the request's blocks that no token from `processed_computed_tokens` on
    /// attends to (outside a sliding window, say), replacing them with nulls; with the
    /// prompt length, R-SWA groups also free the gap after the prompt.
    pub fn remove_skipped_blocks(
        &mut self,
        request_id: &str,
        processed_computed_tokens: usize,
        num_prompt_tokens: Option<usize>,
    ) -> Result<()> {
        let Some(s) = self.slots.get(request_id) else {
            return Ok(());
        };
        self.set_free_tag_of_slot(s);
        self.coord.remove_skipped_blocks(
            self.slots.tables_mut(s),
            processed_computed_tokens,
            num_prompt_tokens,
        )
    }

    /// Number of requests holding a slot.
    pub fn num_requests(&self) -> usize {
        self.slots.len()
    }
}

mod hisparse;
#[cfg(test)]
mod host_tier_tests;
#[cfg(test)]
mod lookahead_tests;
mod lookup;
mod retention;
mod slots;
mod stats;
#[cfg(test)]
pub(crate) mod tests;

/// The first `n` entries of a per-group scratch array, or of `spill` for more groups.
fn per_group_scratch<'a, T: Copy + Default>(
    array: &'a mut [T; 8],
    spill: &'a mut Vec<T>,
    n: usize,
) -> &'a mut [T] {
    if n <= 8 {
        &mut array[..n]
    } else {
        spill.resize(n, T::default());
        spill
    }
}
