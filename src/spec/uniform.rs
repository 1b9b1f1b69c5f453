//! Uniform groups: several layers of one attention type sharing a block table
//! ([`UniformTypeSpecs`], [`LayerSpecs`]) and the rule for which specs may share one
//! ([`is_uniform_type`]).

use std::hash::{Hash, Hasher};

use super::KvCacheSpec;

/// The layers of a [`UniformTypeSpecs`], in order: `(layer name, spec)`.
///
/// Equality and hashing ignore the order, as for the Python dict vLLM keeps.
#[derive(Debug, Clone)]
pub struct LayerSpecs(pub Vec<(String, KvCacheSpec)>);

impl LayerSpecs {
    fn sorted(&self) -> Vec<&(String, KvCacheSpec)> {
        let mut v: Vec<_> = self.0.iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// The member specs, in layer order.
    pub fn specs(&self) -> impl Iterator<Item = &KvCacheSpec> {
        self.0.iter().map(|(_, s)| s)
    }
}

impl PartialEq for LayerSpecs {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len() && self.sorted() == other.sorted()
    }
}

impl Eq for LayerSpecs {}

impl Hash for LayerSpecs {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.sorted().hash(state);
    }
}

/// Several layers of one attention type sharing a block table (vLLM's
/// `UniformTypeKVCacheSpecs`): a page holds one page of every member.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UniformTypeSpecs {
    /// Tokens per block (the members' block size).
    pub block_size: usize,
    /// The member layers and their specs.
    pub kv_cache_specs: LayerSpecs,
}

impl UniformTypeSpecs {
    /// A uniform group of `specs` with their block size, or `None` when they are not
    /// of one type (vLLM's `UniformTypeKVCacheSpecs.from_specs`).
    pub fn from_specs(specs: Vec<(String, KvCacheSpec)>) -> Option<KvCacheSpec> {
        if !is_uniform_type(specs.iter().map(|(_, s)| s)) {
            return None;
        }
        let block_size = specs[0].1.block_size();
        KvCacheSpec::from(UniformTypeSpecs {
            block_size,
            kv_cache_specs: LayerSpecs(specs),
        })
        .build()
        .ok()
    }
}

/// Whether the specs can share one [`UniformTypeSpecs`] group (vLLM's
/// `UniformTypeKVCacheSpecs.is_uniform_type`): one block size, one DCP sharding, and
/// one type family: all full attention (MLA and sink included), all sliding window with
/// one window (a sliding-window MLA first: all sliding-window MLA with one window and
/// one replay policy), all chunked local with one chunk size, all Mamba with the same page
/// size and extra block counts, all cross attention, all circular buffers, or all of one
/// HiSparse class. An empty list is not uniform.
pub fn is_uniform_type<'a>(specs: impl IntoIterator<Item = &'a KvCacheSpec>) -> bool {
    let specs: Vec<&KvCacheSpec> = specs.into_iter().collect();
    let Some(first) = specs.first() else {
        return false;
    };
    let same = |f: &dyn Fn(&KvCacheSpec) -> bool| specs.iter().all(|s| f(s));
    if !same(&|s| s.block_size() == first.block_size() && s.dcp_sharded() == first.dcp_sharded()) {
        return false;
    }
    match first {
        KvCacheSpec::FullAttention(_)
        | KvCacheSpec::MlaAttention(_)
        | KvCacheSpec::SinkFullAttention(_)
        | KvCacheSpec::Rswa(_) => same(&|s| s.full_attention().is_some()),
        KvCacheSpec::SlidingWindow(w) => same(&|s| {
            s.sliding_window_spec()
                .is_some_and(|o| o.sliding_window == w.sliding_window)
        }),
        KvCacheSpec::SlidingWindowMla(w) => same(&|s| {
            matches!(s, KvCacheSpec::SlidingWindowMla(o)
                if o.window.sliding_window == w.window.sliding_window
                    && o.bounded_replay == w.bounded_replay)
        }),
        KvCacheSpec::ChunkedLocalAttention(c) => same(&|s| {
            matches!(s, KvCacheSpec::ChunkedLocalAttention(o)
                if o.attention_chunk_size == c.attention_chunk_size)
        }),
        KvCacheSpec::Mamba(m) => same(&|s| {
            matches!(s, KvCacheSpec::Mamba(o)
                if o.num_speculative_blocks == m.num_speculative_blocks
                    && o.num_prefill_checkpoint_blocks == m.num_prefill_checkpoint_blocks
                    && o.prefill_checkpoint_alignment == m.prefill_checkpoint_alignment
                    && s.page_size_bytes() == first.page_size_bytes())
        }),
        KvCacheSpec::CrossAttention(_) => same(&|s| matches!(s, KvCacheSpec::CrossAttention(_))),
        KvCacheSpec::CircularBuffer(_) => same(&|s| matches!(s, KvCacheSpec::CircularBuffer(_))),
        KvCacheSpec::HiSparseHot(_) => same(&|s| matches!(s, KvCacheSpec::HiSparseHot(_))),
        KvCacheSpec::HiSparseResident(_) => {
            same(&|s| matches!(s, KvCacheSpec::HiSparseResident(_)))
        }
        KvCacheSpec::UniformType(_) => false,
    }
}
