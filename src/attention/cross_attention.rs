//! Cross-attention: blocks for the encoder tokens, allocated once; never
//! cached (encoder-decoder models run with prefix caching off). The coordinator passes
//! `num_encoder_tokens` as this group's token count.

use crate::arith::cdiv;
use crate::error::KvError;

/// The `kv_cache_spec_kind` of this type's events.
pub(crate) const SPEC_KIND: &str = "cross_attention";

/// The most blocks one request holds: its encoder tokens at most
/// (`max_num_encoder_input_tokens`).
pub(crate) fn max_blocks_per_request(max_num_encoder_input_tokens: usize, bs: usize) -> usize {
    cdiv(max_num_encoder_input_tokens, bs)
}

/// A cross-attention group cannot be built with prefix caching on.
#[cold]
pub(crate) fn no_prefix_caching() -> KvError {
    KvError::InvalidSpec(
        "cross-attention groups have no prefix cache; use enable_caching=False".into(),
    )
}

/// Cross-attention has no prefix cache (vLLM raises `NotImplementedError`).
#[cold]
pub(crate) fn unsupported_lookup() -> KvError {
    KvError::Unsupported("prefix caching for cross-attention groups".into())
}
