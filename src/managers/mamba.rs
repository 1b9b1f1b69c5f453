//! Mamba state in mode `"none"` (section 4.11): one live state block per request, plus
//! the speculative blocks; prefix caching is off. Mode `"align"` is not implemented.

use crate::error::KvError;

/// `n - 1`: only the last token's state is needed.
#[inline]
pub(crate) fn num_skipped_tokens(n: usize) -> usize {
    n.saturating_sub(1)
}

/// Mamba prefix caching needs mode "align", which kvblocks does not implement.
#[cold]
pub(crate) fn unsupported_lookup() -> KvError {
    KvError::Unsupported("Mamba prefix caching (mamba_cache_mode=\"align\")".into())
}
