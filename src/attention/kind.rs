//! The attention-type axis: [`AttentionKind`] and the dispatch from a kind to its
//! type's file (spec to kind, event spec-kind string, admission cap, skipped tokens).

use super::{chunked_local, cross_attention, full, mamba, sliding_window};
use crate::error::{KvError, Result};
use crate::spec::KvCacheSpec;

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
