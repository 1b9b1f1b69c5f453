//! [`KvCacheSpec`], the one type for every spec class ([`SpecClass`]): construction and
//! validation ([`KvCacheSpec::build`]), the fields every spec answers (block size, DCP
//! sharding, page size) and `isinstance`.

use super::{
    invalid, is_uniform_type, overflow, AttentionParams, ChunkedLocalAttentionSpec,
    CircularBufferSpec, CrossAttentionSpec, FullAttentionSpec, HiSparseHotSpec,
    HiSparseResidentSpec, MambaSpec, MlaAttentionSpec, RswaSpec, SinkFullAttentionSpec,
    SlidingWindowMlaSpec, SlidingWindowSpec, UniformTypeSpecs,
};
use crate::attention::full;
use crate::error::Result;

/// The Python class a spec is an instance of; used to pick merge rules (vLLM calls
/// `type(specs[0]).merge(specs)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpecClass {
    /// `KVCacheSpec`: the base rule (all specs equal).
    Base,
    /// `FullAttentionSpec`.
    FullAttention,
    /// `MLAAttentionSpec`.
    MlaAttention,
    /// `SinkFullAttentionSpec`.
    SinkFullAttention,
    /// `RSWASpec`.
    Rswa,
    /// `SlidingWindowSpec`.
    SlidingWindow,
    /// `SlidingWindowMLASpec`.
    SlidingWindowMla,
    /// `ChunkedLocalAttentionSpec`.
    ChunkedLocalAttention,
    /// `MambaSpec`.
    Mamba,
    /// `CrossAttentionSpec`.
    CrossAttention,
    /// `CircularBufferSpec`.
    CircularBuffer,
    /// `HiSparseHotSpec`.
    HiSparseHot,
    /// `HiSparseResidentSpec`.
    HiSparseResident,
    /// `UniformTypeKVCacheSpecs`.
    UniformType,
}

/// One layer's (or one group's) KV cache format.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KvCacheSpec {
    /// Full attention.
    FullAttention(FullAttentionSpec),
    /// Multi-head latent attention.
    MlaAttention(MlaAttentionSpec),
    /// Full attention with attention sinks.
    SinkFullAttention(SinkFullAttentionSpec),
    /// Reference sliding window attention.
    Rswa(RswaSpec),
    /// Sliding window attention.
    SlidingWindow(SlidingWindowSpec),
    /// Sliding window attention with an MLA page.
    SlidingWindowMla(SlidingWindowMlaSpec),
    /// Chunked local attention.
    ChunkedLocalAttention(ChunkedLocalAttentionSpec),
    /// Mamba state.
    Mamba(MambaSpec),
    /// Encoder-decoder cross attention.
    CrossAttention(CrossAttentionSpec),
    /// One ring block per request, never cached.
    CircularBuffer(CircularBufferSpec),
    /// HiSparse's per-request hot region.
    HiSparseHot(HiSparseHotSpec),
    /// HiSparse's GPU-resident pages of host-backed KV.
    HiSparseResident(HiSparseResidentSpec),
    /// Same-type layers sharing one block table.
    UniformType(UniformTypeSpecs),
}

macro_rules! impl_from {
    ($($ty:ident => $variant:ident),* $(,)?) => {$(
        impl From<$ty> for KvCacheSpec {
            fn from(s: $ty) -> Self {
                KvCacheSpec::$variant(s)
            }
        }
    )*};
}

impl_from!(
    FullAttentionSpec => FullAttention,
    MlaAttentionSpec => MlaAttention,
    SinkFullAttentionSpec => SinkFullAttention,
    RswaSpec => Rswa,
    SlidingWindowSpec => SlidingWindow,
    SlidingWindowMlaSpec => SlidingWindowMla,
    ChunkedLocalAttentionSpec => ChunkedLocalAttention,
    MambaSpec => Mamba,
    CrossAttentionSpec => CrossAttention,
    CircularBufferSpec => CircularBuffer,
    HiSparseHotSpec => HiSparseHot,
    HiSparseResidentSpec => HiSparseResident,
    UniformTypeSpecs => UniformType,
);

fn check_positive(name: &str, v: usize) -> Result<()> {
    if v == 0 {
        return invalid(format!("{name} must be positive"));
    }
    Ok(())
}

fn check_optional_positive(name: &str, v: Option<usize>) -> Result<()> {
    v.map_or(Ok(()), |v| check_positive(name, v))
}

/// vLLM's MLA pages (`MLAAttentionSpec`, `SlidingWindowMLASpec`): one latent, so
/// `head_size_v` must be 0, and the page is padded up to a multiple of `alignment`.
fn build_mla_page(attn: &mut AttentionParams, alignment: Option<usize>, class: &str) -> Result<()> {
    if attn.head_size_v != 0 {
        return invalid(format!("{class} stores one latent: head_size_v must be 0"));
    }
    check_optional_positive("alignment", alignment)?;
    if let Some(align) = alignment {
        let page = attn.unpadded_page_size()?;
        let padded = page.checked_next_multiple_of(align).ok_or_else(overflow)?;
        if padded != page {
            attn.page_size_padded = Some(padded);
        }
    }
    Ok(())
}

fn check_full(f: &FullAttentionSpec) -> Result<()> {
    f.attn.check()?;
    check_optional_positive("sliding_window", f.sliding_window)?;
    check_optional_positive("attention_chunk_size", f.attention_chunk_size)
}

fn check_window(s: &SlidingWindowSpec) -> Result<()> {
    s.attn.check()?;
    check_positive("sliding_window", s.sliding_window)
}

impl KvCacheSpec {
    /// Validates the spec and normalises it as vLLM's `__post_init__` does (MLA pages
    /// are padded up to `alignment`). Every other method assumes a built spec.
    pub fn build(mut self) -> Result<KvCacheSpec> {
        match &mut self {
            KvCacheSpec::FullAttention(f) => check_full(f)?,
            KvCacheSpec::MlaAttention(m) => {
                check_full(&m.full)?;
                build_mla_page(&mut m.full.attn, m.alignment, "MLAAttentionSpec")?;
            }
            KvCacheSpec::SinkFullAttention(s) => {
                check_full(&s.full)?;
                full::num_sink_blocks(s.sink_len, s.full.attn.block_size)?;
            }
            KvCacheSpec::Rswa(r) => {
                check_full(&r.full)?;
                check_positive("rswa_window", r.rswa_window)?;
            }
            KvCacheSpec::SlidingWindow(s) => check_window(s)?,
            KvCacheSpec::SlidingWindowMla(s) => {
                check_window(&s.window)?;
                build_mla_page(&mut s.window.attn, s.alignment, "SlidingWindowMLASpec")?;
            }
            KvCacheSpec::ChunkedLocalAttention(c) => {
                c.attn.check()?;
                check_positive("attention_chunk_size", c.attention_chunk_size)?;
            }
            KvCacheSpec::CrossAttention(c) => c.attn.check()?,
            KvCacheSpec::CircularBuffer(c) => c.attn.check()?,
            KvCacheSpec::HiSparseHot(h) => check_positive("block_size", h.block_size)?,
            KvCacheSpec::HiSparseResident(r) => check_positive("block_size", r.block_size)?,
            KvCacheSpec::Mamba(m) => {
                check_positive("block_size", m.block_size)?;
                if m.shapes.len() != m.dtypes.len() {
                    return invalid(format!(
                        "MambaSpec needs one dtype per shape ({} shapes, {} dtypes)",
                        m.shapes.len(),
                        m.dtypes.len()
                    ));
                }
                check_optional_positive(
                    "prefill_checkpoint_alignment",
                    m.prefill_checkpoint_alignment,
                )?;
                let page = m.unpadded_page_size()?;
                if let Some(padded) = m.page_size_padded.filter(|&p| p < page) {
                    return invalid(format!(
                        "page_size_padded ({padded}) is smaller than the page size ({page})"
                    ));
                }
            }
            KvCacheSpec::UniformType(u) => {
                check_positive("block_size", u.block_size)?;
                let specs: Vec<&KvCacheSpec> = u.kv_cache_specs.specs().collect();
                if specs.is_empty() {
                    return invalid("UniformTypeKVCacheSpecs needs at least one layer");
                }
                if !is_uniform_type(specs.iter().copied()) {
                    return invalid(
                        "UniformTypeKVCacheSpecs layers must all be of one type \
                         (same class family, block size and type parameters)",
                    );
                }
                if specs[0].block_size() != u.block_size {
                    return invalid(format!(
                        "block_size ({}) differs from the layers' block size ({})",
                        u.block_size,
                        specs[0].block_size()
                    ));
                }
                // Page sizes of members are summed: check that cannot overflow.
                specs.iter().try_fold(0usize, |acc, s| {
                    acc.checked_add(s.page_size_bytes()).ok_or_else(overflow)
                })?;
            }
        }
        Ok(self)
    }

    /// The class this spec is an instance of (most derived).
    pub fn class(&self) -> SpecClass {
        match self {
            KvCacheSpec::FullAttention(_) => SpecClass::FullAttention,
            KvCacheSpec::MlaAttention(_) => SpecClass::MlaAttention,
            KvCacheSpec::SinkFullAttention(_) => SpecClass::SinkFullAttention,
            KvCacheSpec::Rswa(_) => SpecClass::Rswa,
            KvCacheSpec::SlidingWindow(_) => SpecClass::SlidingWindow,
            KvCacheSpec::SlidingWindowMla(_) => SpecClass::SlidingWindowMla,
            KvCacheSpec::ChunkedLocalAttention(_) => SpecClass::ChunkedLocalAttention,
            KvCacheSpec::Mamba(_) => SpecClass::Mamba,
            KvCacheSpec::CrossAttention(_) => SpecClass::CrossAttention,
            KvCacheSpec::CircularBuffer(_) => SpecClass::CircularBuffer,
            KvCacheSpec::HiSparseHot(_) => SpecClass::HiSparseHot,
            KvCacheSpec::HiSparseResident(_) => SpecClass::HiSparseResident,
            KvCacheSpec::UniformType(_) => SpecClass::UniformType,
        }
    }

    /// The attention fields, for every attention spec.
    pub fn attention(&self) -> Option<&AttentionParams> {
        match self {
            KvCacheSpec::ChunkedLocalAttention(c) => Some(&c.attn),
            KvCacheSpec::CrossAttention(c) => Some(&c.attn),
            KvCacheSpec::CircularBuffer(c) => Some(&c.attn),
            _ => self
                .full_attention()
                .map(|f| &f.attn)
                .or_else(|| self.sliding_window_spec().map(|s| &s.attn)),
        }
    }

    /// The sliding window fields, for sliding window attention and its MLA subclass.
    pub fn sliding_window_spec(&self) -> Option<&SlidingWindowSpec> {
        match self {
            KvCacheSpec::SlidingWindow(s) => Some(s),
            KvCacheSpec::SlidingWindowMla(s) => Some(&s.window),
            _ => None,
        }
    }

    /// The full attention fields, for full attention and its subclasses (MLA, sink,
    /// R-SWA).
    pub fn full_attention(&self) -> Option<&FullAttentionSpec> {
        match self {
            KvCacheSpec::FullAttention(f) => Some(f),
            KvCacheSpec::MlaAttention(m) => Some(&m.full),
            KvCacheSpec::SinkFullAttention(s) => Some(&s.full),
            KvCacheSpec::Rswa(r) => Some(&r.full),
            _ => None,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        match self {
            KvCacheSpec::Mamba(m) => m.block_size,
            KvCacheSpec::HiSparseHot(h) => h.block_size,
            KvCacheSpec::HiSparseResident(r) => r.block_size,
            KvCacheSpec::UniformType(u) => u.block_size,
            _ => self.attention().map_or(0, |a| a.block_size),
        }
    }

    /// Whether DCP shards this cache's tokens (attention default true; Mamba and
    /// HiSparse false; a uniform group takes its first member's).
    pub fn dcp_sharded(&self) -> bool {
        match self {
            KvCacheSpec::Mamba(_) => false,
            KvCacheSpec::UniformType(u) => u
                .kv_cache_specs
                .specs()
                .next()
                .is_some_and(|s| s.dcp_sharded()),
            _ => self.attention().is_some_and(|a| a.dcp_sharded),
        }
    }

    /// Bytes of one page (one block of this layer or group).
    pub fn page_size_bytes(&self) -> usize {
        match self {
            KvCacheSpec::Mamba(m) => m
                .page_size_padded
                .unwrap_or_else(|| m.unpadded_page_size().unwrap_or(usize::MAX)),
            KvCacheSpec::HiSparseHot(h) => h.page_size,
            KvCacheSpec::HiSparseResident(r) => r.page_size,
            KvCacheSpec::UniformType(u) => {
                u.kv_cache_specs.specs().map(|s| s.page_size_bytes()).sum()
            }
            _ => self.attention().map_or(0, AttentionParams::page_size_bytes),
        }
    }

    /// Whether the group takes part in prefix caching (vLLM's `prefix_cacheable`): every
    /// spec but a circular buffer and a sliding-window MLA with bounded replay, and a
    /// uniform group whose members all do.
    pub fn prefix_cacheable(&self) -> bool {
        match self {
            KvCacheSpec::CircularBuffer(_) => false,
            KvCacheSpec::SlidingWindowMla(s) => !s.bounded_replay,
            KvCacheSpec::UniformType(u) => u.kv_cache_specs.specs().all(Self::prefix_cacheable),
            _ => true,
        }
    }

    /// Whether this spec is of `class` (or a subclass of it), as `isinstance` in vLLM.
    pub fn is_instance(&self, class: SpecClass) -> bool {
        match class {
            SpecClass::Base => true,
            SpecClass::FullAttention => self.full_attention().is_some(),
            SpecClass::SlidingWindow => self.sliding_window_spec().is_some(),
            _ => self.class() == class,
        }
    }
}
