//! The attention specs: the fields every attention layer shares ([`AttentionParams`],
//! its page size and checks) and one struct per attention spec class of vLLM
//! (full, MLA, sink, R-SWA, sliding window, sliding-window MLA, chunked local, cross attention,
//! circular buffer).

use super::{checked_product, invalid, overflow, Dtype, TokensPerState};
use crate::error::Result;

/// The fields every attention spec shares (vLLM's `AttentionSpec`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AttentionParams {
    /// Tokens per block.
    pub block_size: usize,
    /// KV heads of the layer (on this rank).
    pub num_kv_heads: usize,
    /// Key head size.
    pub head_size: usize,
    /// Value head size (vLLM defaults it to `head_size`; 0 for MLA's single latent).
    pub head_size_v: usize,
    /// Element type.
    pub dtype: Dtype,
    /// A page size that replaces the computed one (must not be smaller).
    pub page_size_padded: Option<usize>,
    /// Head slots of the page when the backend packs them differently from one per KV
    /// head (vLLM's `num_head_slots`; `None`: `num_kv_heads`).
    pub num_head_slots: Option<usize>,
    /// Bytes of one (head slot, state) cell when packed (vLLM's `state_content_bytes`;
    /// `None`: `(head_size + head_size_v) * dtype_size`).
    pub state_content_bytes: Option<usize>,
    /// Tokens one stored state covers (vLLM's `tokens_per_state`, default 1; a fraction
    /// stores several states per token).
    pub tokens_per_state: TokensPerState,
    /// Whether decode context parallelism shards this cache's token positions
    /// (vLLM's default for attention: true).
    pub dcp_sharded: bool,
}

impl AttentionParams {
    /// Attention fields with vLLM's defaults: `head_size_v = head_size`, no padding,
    /// `dcp_sharded = true`.
    pub fn new(block_size: usize, num_kv_heads: usize, head_size: usize, dtype: Dtype) -> Self {
        AttentionParams {
            block_size,
            num_kv_heads,
            head_size,
            head_size_v: head_size,
            dtype,
            page_size_padded: None,
            num_head_slots: None,
            state_content_bytes: None,
            tokens_per_state: TokensPerState::ONE,
            dcp_sharded: true,
        }
    }

    /// `num_heads * num_states * state_content` (vLLM's `unpadded_page_size_bytes`), where
    /// `num_heads` is `num_head_slots` or `num_kv_heads`, `num_states` is
    /// `floor(block_size / tokens_per_state)` and `state_content` is
    /// `state_content_bytes` or `(head_size + head_size_v) * dtype_size`.
    pub(super) fn unpadded_page_size(&self) -> Result<usize> {
        let content = match self.state_content_bytes {
            Some(bytes) => bytes,
            None => self
                .head_size
                .checked_add(self.head_size_v)
                .ok_or_else(overflow)?
                .checked_mul(self.dtype.size())
                .ok_or_else(overflow)?,
        };
        checked_product(&[
            self.num_head_slots.unwrap_or(self.num_kv_heads),
            self.tokens_per_state
                .states_in(self.block_size)
                .ok_or_else(overflow)?,
            content,
        ])
    }

    pub(super) fn page_size_bytes(&self) -> usize {
        // NOTE: validated by `check`, so the product cannot overflow here.
        self.page_size_padded
            .unwrap_or_else(|| self.unpadded_page_size().unwrap_or(usize::MAX))
    }

    pub(super) fn check(&self) -> Result<()> {
        if self.block_size == 0 {
            return invalid("block_size must be positive");
        }
        if self.num_kv_heads == 0 {
            return invalid("num_kv_heads must be positive");
        }
        if self.head_size == 0 {
            return invalid("head_size must be positive");
        }
        if !self.tokens_per_state.is_positive() {
            return invalid("tokens_per_state must be positive");
        }
        let page = self.unpadded_page_size()?;
        match self.page_size_padded {
            Some(padded) if padded < page => invalid(format!(
                "page_size_padded ({padded}) is smaller than the page size ({page})"
            )),
            _ => Ok(()),
        }
    }
}

/// Full attention (vLLM's `FullAttentionSpec`): a block for every token.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FullAttentionSpec {
    /// Shared attention fields.
    pub attn: AttentionParams,
    /// Recorded window of a sliding-window layer served as full attention.
    pub sliding_window: Option<usize>,
    /// Recorded chunk of a chunked-local layer served as full attention.
    pub attention_chunk_size: Option<usize>,
}

impl FullAttentionSpec {
    /// A full attention spec with no recorded window or chunk.
    pub fn new(attn: AttentionParams) -> Self {
        FullAttentionSpec {
            attn,
            sliding_window: None,
            attention_chunk_size: None,
        }
    }
}

/// Multi-head latent attention (vLLM's `MLAAttentionSpec`, a full attention subclass):
/// one latent vector per token, so `head_size_v` is 0.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MlaAttentionSpec {
    /// The full attention fields (with `attn.head_size_v == 0`).
    pub full: FullAttentionSpec,
    /// The KV cache dtype string of the quantization method (e.g. `"fp8_ds_mla"`).
    pub cache_dtype_str: Option<String>,
    /// Pages are padded up to a multiple of this many bytes.
    pub alignment: Option<usize>,
}

/// Full attention whose first `sink_len` tokens are attention sinks (vLLM's
/// `SinkFullAttentionSpec`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SinkFullAttentionSpec {
    /// The full attention fields.
    pub full: FullAttentionSpec,
    /// Sink tokens: a positive multiple of the block size.
    pub sink_len: usize,
}

/// Reference sliding window attention (vLLM's `RSWASpec`, a full attention subclass):
/// the prompt stays visible, and of the generated tokens only the last `rswa_window`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RswaSpec {
    /// The full attention fields.
    pub full: FullAttentionSpec,
    /// Generated tokens kept in the cache.
    pub rswa_window: usize,
}

/// Sliding window attention (vLLM's `SlidingWindowSpec`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SlidingWindowSpec {
    /// Shared attention fields.
    pub attn: AttentionParams,
    /// Tokens a query attends to, itself included.
    pub sliding_window: usize,
    /// Extra trailing tokens retained below the window (multi-module spec decoding).
    pub extra_retained_tokens: usize,
}

/// Sliding window attention with MLA's page (vLLM's `SlidingWindowMLASpec`, a
/// `SlidingWindowSpec` subclass; DeepSeek-V4): one latent per token, so `head_size_v` is 0.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SlidingWindowMlaSpec {
    /// The sliding window fields (with `attn.head_size_v == 0`).
    pub window: SlidingWindowSpec,
    /// The KV cache dtype string of the quantization method (e.g. `"fp8_ds_mla"`).
    pub cache_dtype_str: Option<String>,
    /// Pages are padded up to a multiple of this many bytes.
    pub alignment: Option<usize>,
    /// DeepSeek-V4.1's bounded replay: the window is recomputed after a prefix hit (by
    /// the scheduler), so the group is not prefix cached.
    pub bounded_replay: bool,
}

/// Chunked local attention (vLLM's `ChunkedLocalAttentionSpec`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChunkedLocalAttentionSpec {
    /// Shared attention fields.
    pub attn: AttentionParams,
    /// Tokens per attention chunk.
    pub attention_chunk_size: usize,
}

/// Cross attention of an encoder-decoder model (vLLM's `CrossAttentionSpec`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CrossAttentionSpec {
    /// Shared attention fields.
    pub attn: AttentionParams,
}

/// A ring buffer of one block per request (vLLM's `CircularBufferSpec`: the compressor
/// rings of DeepSeek-V4 and GLM-5-next); `block_size` is the ring's capacity in tokens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CircularBufferSpec {
    /// Shared attention fields.
    pub attn: AttentionParams,
}
