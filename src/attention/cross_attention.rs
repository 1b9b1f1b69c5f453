//! Cross-attention: blocks for the encoder tokens, allocated once; never
//! cached (encoder-decoder models run with prefix caching off). The coordinator passes
//! `num_encoder_tokens` as this group's token count.

use crate::error::KvError;

/// Cross-attention has no prefix cache (vLLM raises `NotImplementedError`).
#[cold]
pub(crate) fn unsupported_lookup() -> KvError {
    KvError::Unsupported("prefix caching for cross-attention groups".into())
}
