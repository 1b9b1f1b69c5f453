//! The attention-type axis: [`AttentionKind`] and the dispatch from a kind to its
//! type's file. Every rule that differs by attention type is asked of the kind here
//! (spec to kind, event spec-kind string, admission cap, skipped tokens, prefix caching,
//! token counting, zeroing, hits, allocation and freeing overrides); the code outside
//! `src/attention/<type>.rs` and this file never matches on a kind.

use std::ops::Range;

use super::{
    chunked_local, circular_buffer, cross_attention, full, hisparse_hot, hisparse_resident, mamba,
    rswa, sliding_window,
};
use super::{CachedBlocks, HitQuery, RequestBlocks, RequestView, SingleTypeManager, SparseCaching};
use crate::arith::cdiv;
use crate::error::{KvError, Result};
use crate::pool::BlockPool;
use crate::spec::KvCacheSpec;
use crate::types::BlockId;

/// The attention type of a KV cache group, with the fields its manager needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKind {
    /// Full attention (also MLA): every token's KV is kept until the request ends.
    FullAttention,
    /// Full attention with `sink_len` sink tokens (seed-era behaviour, see
    /// [`SingleTypeManager::sink_blocks`]).
    SinkFullAttention {
        /// Sink tokens; a positive multiple of the block size.
        sink_len: usize,
    },
    /// Reference sliding window attention: full attention whose gap between the prompt
    /// and the last `rswa_window` generated tokens is freed (see [`rswa`]).
    Rswa {
        /// Generated tokens kept.
        rswa_window: usize,
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
        /// "align" mode with prefill-checkpoint blocks: `prefill_checkpoint_alignment`.
        checkpoint_alignment: Option<usize>,
    },
    /// Cross-attention over encoder tokens (encoder-decoder models).
    CrossAttention,
    /// A ring buffer: one block per request, never cached (see [`circular_buffer`]).
    CircularBuffer,
    /// HiSparse's GPU copies of host pages (see [`hisparse_resident`]).
    HiSparseResident,
    /// HiSparse's per-request hot region (see [`hisparse_hot`]).
    HiSparseHot {
        /// Blocks of the region.
        blocks_per_request: usize,
        /// Every request needs its region: the model has no resident groups.
        always_hot: bool,
    },
}

/// The `kv_cache_spec_kind` of an empty uniform group (vLLM's `"unknown"`).
pub(crate) const UNKNOWN_SPEC_KIND: &str = "unknown";

/// Every `KVCacheSpecKind` value of vLLM 0.33.0: the kinds of kvblocks' attention types,
/// and those its specs never produce (an event from vLLM may still carry them).
pub const SPEC_KINDS: [&str; 10] = [
    full::SPEC_KIND,
    full::MLA_SPEC_KIND,
    sliding_window::SPEC_KIND,
    sliding_window::MLA_SPEC_KIND,
    mamba::SPEC_KIND,
    chunked_local::SPEC_KIND,
    full::SINK_SPEC_KIND,
    "encoder_only_attention",
    cross_attention::SPEC_KIND,
    UNKNOWN_SPEC_KIND,
];

impl AttentionKind {
    /// Whether vLLM counts the spec as a `FullAttentionSpec` (full, MLA, sink, R-SWA).
    #[inline]
    pub fn is_full_attention(&self) -> bool {
        matches!(
            self,
            Self::FullAttention | Self::SinkFullAttention { .. } | Self::Rswa { .. }
        )
    }

    /// The attention type that serves `spec` (vLLM's spec-to-manager mapping): MLA is
    /// full attention, sliding-window MLA is sliding window, and a uniform group is
    /// served as its first layer's spec.
    pub fn from_spec(spec: &KvCacheSpec) -> Result<Self> {
        Ok(match spec {
            KvCacheSpec::FullAttention(_) | KvCacheSpec::MlaAttention(_) => Self::FullAttention,
            KvCacheSpec::SinkFullAttention(s) => full::sink_kind(s),
            KvCacheSpec::Rswa(s) => rswa::kind(s),
            KvCacheSpec::SlidingWindow(s) => sliding_window::kind(s),
            KvCacheSpec::SlidingWindowMla(s) => sliding_window::kind(&s.window),
            KvCacheSpec::ChunkedLocalAttention(s) => chunked_local::kind(s),
            KvCacheSpec::Mamba(m) => mamba::kind(m)?,
            KvCacheSpec::CrossAttention(_) => Self::CrossAttention,
            KvCacheSpec::CircularBuffer(_) => Self::CircularBuffer,
            // `always_hot` is a fact of the whole config (`ManagerParams::from_config`).
            KvCacheSpec::HiSparseHot(h) => Self::HiSparseHot {
                blocks_per_request: h.blocks_per_request,
                always_hot: false,
            },
            KvCacheSpec::HiSparseResident(_) => Self::HiSparseResident,
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
            Self::FullAttention | Self::Rswa { .. } => full::SPEC_KIND,
            Self::SinkFullAttention { .. } => full::SINK_SPEC_KIND,
            Self::SlidingWindow { .. } => sliding_window::SPEC_KIND,
            Self::ChunkedLocal { .. } => chunked_local::SPEC_KIND,
            Self::Mamba { .. } => mamba::SPEC_KIND,
            Self::CrossAttention => cross_attention::SPEC_KIND,
            Self::CircularBuffer | Self::HiSparseResident | Self::HiSparseHot { .. } => {
                UNKNOWN_SPEC_KIND
            }
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
            Self::HiSparseResident => Some(hisparse_resident::max_admission_blocks(
                bs,
                max_in_flight_tokens,
                max_model_len,
            )),
            _ => None,
        }
    }

    /// Whether the type counts and allocates by the common rules alone: slots for the
    /// request's own tokens (no encoder tokens, no speculative state blocks), no count or
    /// allocation of its own (`own_num_blocks_to_allocate`, `allocate_new_blocks`), so a
    /// coordinator of only those skips the per-type dispatch on every allocation.
    pub fn allocates_by_common_rules(&self) -> bool {
        match self {
            Self::FullAttention
            | Self::SinkFullAttention { .. }
            | Self::Rswa { .. }
            | Self::SlidingWindow { .. }
            | Self::ChunkedLocal { .. } => true,
            Self::Mamba { .. }
            | Self::CrossAttention
            | Self::CircularBuffer
            | Self::HiSparseResident
            | Self::HiSparseHot { .. } => false,
        }
    }

    /// Whether `remove_skipped_blocks` reads the prompt's length (R-SWA's gap starts
    /// after the prompt), so a caller without such a group need not look it up.
    pub fn skips_by_prompt_length(&self) -> bool {
        match self {
            Self::Rswa { .. } => true,
            Self::FullAttention
            | Self::SinkFullAttention { .. }
            | Self::SlidingWindow { .. }
            | Self::ChunkedLocal { .. }
            | Self::Mamba { .. }
            | Self::CrossAttention
            | Self::CircularBuffer
            | Self::HiSparseResident
            | Self::HiSparseHot { .. } => false,
        }
    }

    /// Whether `remove_skipped_blocks` can ever free a block of this type: not for the
    /// types that attend to the whole sequence (no tokens are ever skipped and they have
    /// no rule of their own), so a coordinator of only those skips the call.
    pub fn frees_skipped_blocks(&self) -> bool {
        match self {
            Self::FullAttention
            | Self::SinkFullAttention { .. }
            | Self::CrossAttention
            | Self::CircularBuffer
            | Self::HiSparseResident
            | Self::HiSparseHot { .. } => false,
            Self::Rswa { .. }
            | Self::SlidingWindow { .. }
            | Self::ChunkedLocal { .. }
            | Self::Mamba { .. } => true,
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

/// What each type decides for the code shared by all types: asked by the coordinator,
/// the manager facade and the generic files of `src/attention/`.
impl AttentionKind {
    /// Whether the group's blocks are prefix cached at all (vLLM's `prefix_cacheable`):
    /// every type but cross-attention, whose blocks hold encoder tokens, and circular
    /// buffers, whose ring is per-request scratch (Mamba without "align" is refused with
    /// caching on unless vLLM 0.32's rule allows it, see
    /// [`check_prefix_caching`](Self::check_prefix_caching)).
    #[inline]
    pub fn caches_prefix(&self) -> bool {
        !matches!(
            self,
            Self::CrossAttention
                | Self::CircularBuffer
                | Self::HiSparseResident
                | Self::HiSparseHot { .. }
        )
    }

    /// Whether the group's table follows the request's encoder tokens instead of its
    /// decoder tokens (cross-attention): its slots are counted from
    /// `num_encoder_tokens`, and decoder hits and connector tokens never touch it.
    #[inline]
    pub fn counts_encoder_tokens(&self) -> bool {
        matches!(self, Self::CrossAttention)
    }

    /// Whether the group's new blocks are recorded for worker-side zeroing (vLLM's
    /// `needs_kv_cache_zeroing`): every type but Mamba, whose state is overwritten whole,
    /// and HiSparse's resident and hot pages (not attention specs in vLLM).
    #[inline]
    pub fn zeroes_new_blocks(&self) -> bool {
        !matches!(
            self,
            Self::Mamba { .. } | Self::HiSparseResident | Self::HiSparseHot { .. }
        )
    }

    /// Whether the group keeps a recurrent state rather than per-token KV (Mamba): a KV
    /// connector then supplies the state past a full-attention group's local hit.
    #[inline]
    pub fn keeps_recurrent_state(&self) -> bool {
        matches!(self, Self::Mamba { .. })
    }

    /// Whether an EAGLE lookup of this type searches one block past the limit (the block
    /// it then drops); a Mamba hit is one state position, so it does not.
    #[inline]
    pub fn extends_eagle_lookup(&self) -> bool {
        !matches!(self, Self::Mamba { .. })
    }

    /// Whether the type is one of HiSparse's device-side groups (resident or hot), which
    /// HiSparse's host tier drives.
    #[inline]
    pub fn is_hisparse_device_kind(&self) -> bool {
        matches!(self, Self::HiSparseResident | Self::HiSparseHot { .. })
    }

    /// Whether the group holds attention KV (every type but Mamba, vLLM's
    /// `AttentionSpec`).
    #[inline]
    pub fn is_attention(&self) -> bool {
        !matches!(
            self,
            Self::Mamba { .. } | Self::HiSparseResident | Self::HiSparseHot { .. }
        )
    }

    /// Whether the type's prefix-cache hits work on a group sharded over context-parallel
    /// ranks: full attention only (vLLM 0.33's sliding-window, chunked-local and Mamba
    /// lookups assert `dcp_world_size == pcp_world_size == 1`).
    #[inline]
    pub fn supports_context_parallel_hits(&self) -> bool {
        self.is_full_attention()
    }

    /// Whether sparse prefix caching (`prefix_cache_retention_interval`) applies to the
    /// type: sliding window and Mamba, whose hits need only the blocks near a boundary.
    #[inline]
    pub fn allows_sparse_caching(&self) -> bool {
        matches!(self, Self::SlidingWindow { .. } | Self::Mamba { .. })
    }

    /// Whether the type's prefix caching is supported (Mamba mode `"none"` only with
    /// `mamba_none`, vLLM 0.32's rule).
    pub fn check_prefix_caching(&self, mamba_none: bool) -> Result<()> {
        match *self {
            Self::Mamba { align, .. } => mamba::check_prefix_caching(align || mamba_none),
            Self::CrossAttention => Err(cross_attention::no_prefix_caching()),
            _ => Ok(()),
        }
    }

    /// The blocks of `table` that cover `num_computed_tokens` (vLLM's
    /// `get_block_ids_for_computed_tokens`): the first `cdiv(n, bs)`, or the whole table
    /// for the types whose table does not follow computed tokens (cross-attention:
    /// encoder tokens; Mamba: state positions).
    pub fn computed_token_blocks<'a>(
        &self,
        table: &'a [BlockId],
        num_computed_tokens: usize,
        bs: usize,
    ) -> &'a [BlockId] {
        match self {
            Self::CrossAttention | Self::Mamba { .. } => table,
            _ => &table[..cdiv(num_computed_tokens, bs).min(table.len())],
        }
    }

    /// Slots a table needs for `num_tokens` tokens in blocks of `bs` (Mamba adds its
    /// speculative state blocks).
    #[inline]
    pub(super) fn slot_tokens(&self, num_tokens: usize, bs: usize) -> usize {
        match *self {
            Self::Mamba {
                num_speculative_blocks,
                ..
            } => mamba::slot_tokens(num_tokens, bs, num_speculative_blocks),
            _ => num_tokens,
        }
    }

    /// Blocks the group takes at construction, for blocks of `bs` tokens (sink groups:
    /// their sink blocks).
    pub(super) fn num_construction_blocks(&self, bs: usize) -> Result<usize> {
        match *self {
            Self::SinkFullAttention { sink_len } => full::num_sink_blocks(sink_len, bs),
            _ => Ok(0),
        }
    }

    /// The sliding window, in tokens, of a sliding-window type (its events carry it).
    #[inline]
    pub fn sliding_window(&self) -> Option<usize> {
        match *self {
            Self::SlidingWindow { sliding_window, .. } => Some(sliding_window),
            _ => None,
        }
    }

    /// Mamba's speculative state blocks (0 for the other types).
    #[inline]
    pub(super) fn num_speculative_blocks(&self) -> usize {
        match *self {
            Self::Mamba {
                num_speculative_blocks,
                ..
            } => num_speculative_blocks,
            _ => 0,
        }
    }

    /// Whether allocation pads out-of-window blocks with nulls itself (align-mode
    /// Mamba), where the other types take them from a hit's adoption.
    pub(super) fn places_own_nulls(&self) -> bool {
        matches!(self, Self::Mamba { align: true, .. })
    }

    /// Align-mode Mamba with prefill-checkpoint blocks: the checkpoint alignment.
    #[inline]
    pub(super) fn checkpoint_alignment(&self) -> Option<usize> {
        match *self {
            Self::Mamba {
                checkpoint_alignment,
                ..
            } => checkpoint_alignment,
            _ => None,
        }
    }

    /// The longest prefix hit of `query` by the type's own search, for blocks of `bs`.
    pub(super) fn find_longest_cache_hit<P: CachedBlocks + ?Sized>(
        &self,
        query: &HitQuery<'_>,
        bs: usize,
        pool: &P,
        out: &mut [Vec<BlockId>],
    ) -> Result<usize> {
        match *self {
            Self::FullAttention | Self::SinkFullAttention { .. } | Self::Rswa { .. } => {
                Ok(full::find_longest_cache_hit(query, bs, pool, out))
            }
            Self::SlidingWindow { sliding_window, .. } => Ok(
                sliding_window::find_longest_cache_hit(query, bs, sliding_window, pool, out),
            ),
            Self::ChunkedLocal {
                attention_chunk_size,
            } => chunked_local::find_longest_cache_hit(query, bs, attention_chunk_size, pool, out),
            Self::Mamba { .. } => Ok(mamba::find_longest_cache_hit(query, bs, pool, out)),
            Self::CrossAttention => Err(cross_attention::unsupported_lookup()),
            Self::CircularBuffer | Self::HiSparseResident | Self::HiSparseHot { .. } => Ok(0),
        }
    }

    /// The type's own `get_num_blocks_to_allocate`, where the common count does not
    /// apply (Mamba: a hit cached during this step defers the request; "align" mode
    /// counts state blocks, from `total_computed_tokens`, with a prefill checkpoint only
    /// on a step reaching `prefill_end`; HiSparse: host pages and hot regions take no
    /// blocks); `None` for the common count.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn own_num_blocks_to_allocate(
        &self,
        mgr: &SingleTypeManager,
        rb: &RequestBlocks,
        num_tokens: usize,
        num_local_computed: usize,
        apply_admission_cap: bool,
        total_computed_tokens: usize,
        num_tokens_main_model: usize,
        prefill_end: usize,
        new_computed: &[BlockId],
        partial_hit: bool,
        pool: &BlockPool,
    ) -> Option<isize> {
        match *self {
            Self::Mamba { align, .. } => mamba::own_num_blocks_to_allocate(
                mgr,
                rb,
                align,
                total_computed_tokens,
                num_tokens_main_model,
                prefill_end,
                new_computed,
                partial_hit,
                pool,
            ),
            Self::CircularBuffer => Some(circular_buffer::num_blocks_to_allocate(rb)),
            Self::HiSparseResident => Some(hisparse_resident::num_blocks_to_allocate(
                rb,
                mgr.block_size(),
                num_tokens,
                total_computed_tokens,
                num_local_computed,
                mgr.max_admission_blocks().filter(|_| apply_admission_cap),
            )),
            Self::HiSparseHot {
                blocks_per_request, ..
            } => Some(hisparse_hot::num_blocks_to_allocate(
                rb,
                blocks_per_request,
                total_computed_tokens,
                num_local_computed,
            )),
            _ => None,
        }
    }

    /// Extends the table with new blocks: to `num_tokens` slots, or by the type's own
    /// rule (align-mode Mamba: the state blocks of a step computing
    /// `[total_computed_tokens, num_tokens_main_model)`, with a prefill checkpoint only
    /// on a step reaching `prefill_end`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn allocate_new_blocks(
        &self,
        mgr: &mut SingleTypeManager,
        rb: &mut RequestBlocks,
        request_id: &str,
        num_tokens: usize,
        total_computed_tokens: usize,
        num_tokens_main_model: usize,
        prefill_end: usize,
        pool: &mut BlockPool,
    ) -> Result<Option<BlockId>> {
        match *self {
            Self::Mamba { align: true, .. } => mamba::allocate_new_blocks(
                mgr,
                rb,
                request_id,
                total_computed_tokens,
                num_tokens_main_model,
                prefill_end,
                pool,
            ),
            Self::CircularBuffer => circular_buffer::claim_ring_block(rb, pool).map(|()| None),
            Self::HiSparseHot {
                blocks_per_request, ..
            } => hisparse_hot::allocate(rb, blocks_per_request, pool).map(|()| None),
            // The table extends to `num_tokens` (its host pages are nulls already).
            _ => mgr.allocate_by_common_rules(rb, num_tokens, pool),
        }
    }

    /// Allocates for KV-connector tokens by the type's own rule (a circular buffer claims
    /// its ring; a HiSparse resident group a writable last page, a hot group asks for its
    /// region); `None` for the common rule (blocks for the external tokens in the window).
    pub(super) fn own_external_blocks(
        &self,
        rb: &mut RequestBlocks,
        bs: usize,
        num_tokens: usize,
        pool: &mut BlockPool,
    ) -> Option<Result<()>> {
        match self {
            Self::CircularBuffer => Some(circular_buffer::claim_ring_block(rb, pool)),
            Self::HiSparseResident => Some(hisparse_resident::reserve_import_tail(
                rb, bs, num_tokens, pool,
            )),
            Self::HiSparseHot { .. } => {
                rb.hisparse.hot_required = true;
                Some(Ok(()))
            }
            _ => None,
        }
    }

    /// Adds a new request's local prefix of `num_local_computed` tokens by the type's own
    /// rule (HiSparse: the prefix is on the host; resident groups hold null pages for it,
    /// hot groups may need their region); `false` for the common rule (the hit blocks).
    pub(super) fn own_local_computed(
        &self,
        rb: &mut RequestBlocks,
        bs: usize,
        num_local_computed: usize,
    ) -> bool {
        match *self {
            Self::HiSparseResident => {
                hisparse_resident::add_host_prefix(rb, bs, num_local_computed);
                true
            }
            Self::HiSparseHot { always_hot, .. } => {
                hisparse_hot::add_local_computed(rb, num_local_computed, always_hot);
                true
            }
            _ => false,
        }
    }

    /// Frees the blocks outside the attention window of the next token: the window's
    /// common rule, or the type's own (align-mode Mamba retires old states; R-SWA,
    /// given the prompt length, frees the gap after the prompt).
    pub(super) fn remove_skipped_blocks(
        &self,
        mgr: &SingleTypeManager,
        rb: &mut RequestBlocks,
        num_computed_tokens: usize,
        num_prompt_tokens: Option<usize>,
        pool: &mut BlockPool,
    ) -> Result<()> {
        match (self, num_prompt_tokens) {
            (Self::Mamba { align: true, .. }, _) => {
                mamba::remove_skipped_blocks(mgr, rb, num_computed_tokens, pool)
            }
            (Self::Rswa { rswa_window }, Some(prompt)) => rswa::remove_gap_blocks(
                rb,
                *rswa_window,
                mgr.block_size(),
                num_computed_tokens,
                prompt,
                pool,
            ),
            _ => mgr.free_out_of_window(rb, num_computed_tokens, pool),
        }
    }

    /// Which of the table's blocks `start..end` get cached (`None`: all of them); only
    /// sliding windows and, under sparse caching, Mamba cache some (vLLM's
    /// `reachable_block_mask`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn cache_mask<R: RequestView>(
        &self,
        mgr: &SingleTypeManager,
        request: &R,
        start: usize,
        end: usize,
        sparse_caching: SparseCaching,
        replay_boundaries: &[usize],
    ) -> Option<Vec<bool>> {
        match *self {
            Self::SlidingWindow { sliding_window, .. } => sliding_window::cache_mask(
                mgr,
                request,
                start,
                end,
                sliding_window,
                sparse_caching,
                replay_boundaries,
            ),
            Self::Mamba { .. } => {
                mamba::cache_mask(mgr, request, start, end, sparse_caching, replay_boundaries)
            }
            _ => None,
        }
    }

    /// After `cache_blocks` cached the table entries `cached` of `request` (up to
    /// `num_tokens`): Mamba remembers the newly cached keys; align mode also keys its
    /// checkpoint and offers the states to a KV connector (`mamba::after_cache_blocks`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn after_cache_blocks<R: RequestView>(
        &self,
        mgr: &mut SingleTypeManager,
        rb: &mut RequestBlocks,
        request: &R,
        num_tokens: usize,
        cached: Range<usize>,
        sparse_caching: SparseCaching,
        pool: &mut BlockPool,
    ) -> Result<()> {
        match *self {
            Self::Mamba { align, .. } => mamba::after_cache_blocks(
                mgr,
                align,
                rb,
                request,
                num_tokens,
                cached,
                sparse_caching,
                pool,
            ),
            _ => Ok(()),
        }
    }
}
