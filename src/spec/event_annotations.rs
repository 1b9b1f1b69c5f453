//! What a spec adds to its group's KV cache events: the spec kind string
//! ([`KvCacheSpec::kind`], each attention type's own constant) and the sliding window.

use super::KvCacheSpec;
use crate::attention::{self, chunked_local, cross_attention, full, mamba, sliding_window};

impl KvCacheSpec {
    /// The spec kind string vLLM attaches to KV cache events
    /// (`get_kv_cache_spec_kind`), written in each attention type's file: MLA reports
    /// its own kind. A uniform group reports its members' kind, or full attention's when
    /// it mixes full attention subclasses.
    pub fn kind(&self) -> &'static str {
        match self {
            // R-SWA is a `FullAttentionSpec` to vLLM's `get_kv_cache_spec_kind`.
            KvCacheSpec::FullAttention(_) | KvCacheSpec::Rswa(_) => full::SPEC_KIND,
            KvCacheSpec::MlaAttention(_) => full::MLA_SPEC_KIND,
            KvCacheSpec::SinkFullAttention(_) => full::SINK_SPEC_KIND,
            KvCacheSpec::SlidingWindow(_) => sliding_window::SPEC_KIND,
            KvCacheSpec::SlidingWindowMla(_) => sliding_window::MLA_SPEC_KIND,
            KvCacheSpec::ChunkedLocalAttention(_) => chunked_local::SPEC_KIND,
            KvCacheSpec::Mamba(_) => mamba::SPEC_KIND,
            KvCacheSpec::CrossAttention(_) => cross_attention::SPEC_KIND,
            // vLLM's `get_kv_cache_spec_kind` has no kind for a circular buffer (never
            // cached, so it never reaches an event).
            KvCacheSpec::CircularBuffer(_) => attention::UNKNOWN_SPEC_KIND,
            // vLLM's `get_kv_cache_spec_kind` has no kind for HiSparse's pages.
            KvCacheSpec::HiSparseHot(_) | KvCacheSpec::HiSparseResident(_) => {
                attention::UNKNOWN_SPEC_KIND
            }
            KvCacheSpec::UniformType(u) => {
                let mut kinds = u.kv_cache_specs.specs().map(KvCacheSpec::kind);
                let first = kinds.next().unwrap_or(attention::UNKNOWN_SPEC_KIND);
                if kinds.all(|k| k == first) {
                    first
                } else {
                    // Built uniform groups only mix kinds within the full attention family.
                    full::SPEC_KIND
                }
            }
        }
    }

    /// The sliding window vLLM attaches to KV cache events
    /// (`get_kv_cache_spec_sliding_window`): set only for sliding window specs (MLA too), and for
    /// uniform groups whose members agree on it.
    pub fn sliding_window(&self) -> Option<usize> {
        if let Some(s) = self.sliding_window_spec() {
            return Some(s.sliding_window);
        }
        match self {
            KvCacheSpec::UniformType(u) => {
                let mut windows = u.kv_cache_specs.specs().map(KvCacheSpec::sliding_window);
                let first = windows.next().flatten();
                if windows.all(|w| w == first) {
                    first
                } else {
                    None
                }
            }
            _ => None,
        }
    }
}
