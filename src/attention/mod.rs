//! Single-type managers: the per-group rules of vLLM 0.33.0's
//! `SingleTypeKVCacheManager` family (docs/ARCHITECTURE.md, "Attention types").
//!
//! One [`SingleTypeManager`] per KV cache group. It holds no per-request state itself:
//! each request's table for the group is a [`RequestBlocks`] owned by the coordinator, so
//! a request id is resolved once per call, not once per group. Behaviour that differs by
//! attention type lives in one file per type; the shared code asks the kind
//! ([`AttentionKind`]'s methods, each a `match` in `kind.rs` that hands over to the type's
//! file: no dynamic dispatch on the hot path).
//!
//! The shared code is split by job: the kind and its dispatch (`kind.rs`), the group
//! parameters (`params.rs`) and their context-parallel sharding (`context_parallel.rs`), the request interface (`request_view.rs`), a request's
//! table (`request_blocks.rs`), hit lookups (`hit_query.rs`), allocation
//! (`allocate.rs`), caching and sparse caching (`caching.rs`) and freeing (`free.rs`). This
//! file holds [`SingleTypeManager`] itself: its fields, construction and accessors.

pub mod chunked_local;
pub mod circular_buffer;
pub mod context_parallel;
pub mod cross_attention;
pub mod full;
pub mod hisparse;
pub mod hisparse_hot;
pub mod hisparse_resident;
pub mod mamba;
pub mod rswa;
pub mod sliding_window;

mod allocate;
mod caching;
mod copy_on_write;
mod free;
mod hit_query;
mod kind;
mod params;
mod request_blocks;
mod request_view;

pub use caching::SparseCaching;
pub use context_parallel::ContextParallel;
pub use hit_query::{CachedBlocks, HitQuery};
pub(crate) use kind::UNKNOWN_SPEC_KIND;
pub use kind::{AttentionKind, SPEC_KINDS};
pub use mamba::BoundaryOffload;
pub use params::ManagerParams;
pub use request_blocks::RequestBlocks;
pub use request_view::RequestView;

use rustc_hash::FxHashSet;

use crate::error::{KvError, Result};
use crate::pool::{BlockPool, HashKey};
use crate::types::{BlockId, GroupId};

/// The manager of one KV cache group.
#[derive(Debug, Clone)]
pub struct SingleTypeManager {
    params: ManagerParams,
    group: GroupId,
    enable_caching: bool,
    /// Whether `cache_blocks` caches the blocks as they are computed: a caching group
    /// that is not host resident (HiSparse publishes the host-resident group's blocks
    /// only once the host holds them, `host_tier.rs`).
    caches_when_computed: bool,
    /// `max_admission_blocks_per_request` (SWA, chunked local and HiSparse resident only).
    max_admission_blocks: Option<usize>,
    /// Whether hits of this group drop the EAGLE block (set by the coordinator).
    pub(crate) use_eagle: bool,
    /// Align-mode Mamba: whether prefill checkpoints follow EAGLE's replay boundary
    /// (vLLM's `drop_eagle_checkpoint_block`, set by the coordinator under EAGLE).
    pub(crate) use_eagle_checkpoint: bool,
    /// `cache_hit_alignment_tokens` (the scheduler block size; the hash block size with
    /// partial hits).
    pub(crate) alignment_tokens: usize,
    /// Align-mode Mamba: also key the state at a request's shared-prefix junction
    /// (vLLM's `shared_prefix_checkpoint`, armed by the coordinator).
    pub(crate) shared_prefix_checkpoint: bool,
    sink_blocks: Vec<BlockId>,
    /// Align-mode Mamba: keys cached during this step, which other requests may not hit
    /// until the next step (vLLM's `cached_blocks_this_step`).
    cached_this_step: FxHashSet<HashKey>,
    /// Align-mode Mamba: cached states not yet handed to a KV connector.
    boundary_offloads: Vec<BoundaryOffload>,
    /// Copy-on-write copies of partial hits not yet handed over, `(source, destination)`
    /// (vLLM's `_pending_cow_copies`).
    pending_copies: Vec<(BlockId, BlockId)>,
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
        let sink_blocks = match params.kind.num_construction_blocks(bs)? {
            0 => Vec::new(),
            n => pool.get_new_blocks(n)?,
        };
        let enable_caching = enable_caching && params.caches_prefix();
        Ok(Self {
            enable_caching,
            caches_when_computed: enable_caching && !params.host_resident,
            params,
            group,
            max_admission_blocks,
            use_eagle: false,
            use_eagle_checkpoint: false,
            alignment_tokens: scheduler_block_size,
            shared_prefix_checkpoint: false,
            sink_blocks,
            cached_this_step: FxHashSet::default(),
            boundary_offloads: Vec::new(),
            pending_copies: Vec::new(),
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

    /// Whether this manager caches blocks (never for a type that is not prefix cached).
    #[inline]
    pub fn enable_caching(&self) -> bool {
        self.enable_caching
    }

    /// Whether the coordinator's `cache_blocks` caches this group's computed blocks (not
    /// the host-resident group's: they are published once the host holds them).
    #[inline]
    pub fn caches_when_computed(&self) -> bool {
        self.caches_when_computed
    }

    /// `max_admission_blocks_per_request`, for the types that have one.
    #[inline]
    pub fn max_admission_blocks(&self) -> Option<usize> {
        self.max_admission_blocks
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
}

impl SingleTypeManager {
    /// Per-step hook: align-mode Mamba forgets which keys were cached this step.
    pub fn new_step_starts(&mut self) {
        self.cached_this_step.clear();
    }

    /// Hands over the cached states not yet offered to a KV connector (align-mode
    /// Mamba; vLLM's `take_pending_boundary_state_offloads`), appending them to `out`.
    pub fn take_boundary_offloads(&mut self, out: &mut Vec<BoundaryOffload>) {
        out.append(&mut self.boundary_offloads);
    }

    /// Drops a freed request's states not yet offered: its blocks go back to the pool.
    pub fn forget_boundary_offloads(&mut self, request_id: &str) {
        if !self.boundary_offloads.is_empty() {
            self.boundary_offloads
                .retain(|o| o.request_id != request_id);
        }
    }
}

#[cfg(test)]
mod tests;
