//! KV cache specs: what one layer (or one group of layers) stores per block, how big a
//! page is, and how much memory a request can need at most (the attention type's rule,
//! from `src/attention/`, applied to the spec). Mirrors vLLM 0.33.0's `vllm/v1/kv_cache_interface.py`.
//!
//! Specs are plain values: equality is by value (what groups layers in vLLM), and they
//! are hashable. Build one through [`KvCacheSpec::build`], which validates it and applies
//! MLA alignment padding; every method below assumes a built spec.
//!
//! ```
//! use kvblocks::spec::{AttentionParams, Dtype, FullAttentionSpec, KvCacheSpec};
//! let attn = AttentionParams::new(16, 8, 128, Dtype::Bfloat16);
//! let spec = KvCacheSpec::from(FullAttentionSpec::new(attn)).build().unwrap();
//! assert_eq!(spec.page_size_bytes(), 16 * 8 * (128 + 128) * 2);
//! ```

mod dtype;

use std::fmt;
use std::hash::{Hash, Hasher};

pub use dtype::Dtype;

use crate::attention::{
    self, chunked_local, cross_attention, full, mamba, sliding_window, AttentionKind,
};
use crate::error::{KvError, Result};

/// Ceiling division.
fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

fn invalid<T>(msg: impl Into<String>) -> Result<T> {
    Err(KvError::InvalidSpec(msg.into()))
}

fn overflow() -> KvError {
    KvError::InvalidArgument("KV cache size overflows 64 bits".into())
}

fn checked_product(factors: &[usize]) -> Result<usize> {
    factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        .ok_or_else(overflow)
}

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
            dcp_sharded: true,
        }
    }

    /// `num_kv_heads * block_size * (head_size + head_size_v) * dtype_size`.
    fn unpadded_page_size(&self) -> Result<usize> {
        let content = self
            .head_size
            .checked_add(self.head_size_v)
            .ok_or_else(overflow)?;
        checked_product(&[
            self.num_kv_heads,
            self.block_size,
            content,
            self.dtype.size(),
        ])
    }

    fn page_size_bytes(&self) -> usize {
        // NOTE: validated by `check`, so the product cannot overflow here.
        self.page_size_padded
            .unwrap_or_else(|| self.unpadded_page_size().unwrap_or(usize::MAX))
    }

    fn check(&self) -> Result<()> {
        if self.block_size == 0 {
            return invalid("block_size must be positive");
        }
        if self.num_kv_heads == 0 {
            return invalid("num_kv_heads must be positive");
        }
        if self.head_size == 0 {
            return invalid("head_size must be positive");
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

/// How a Mamba layer caches states (`CacheConfig.mamba_cache_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MambaCacheMode {
    /// One running state per request, no prefix caching.
    None,
    /// States checkpointed at block boundaries, prefix cacheable.
    Align,
}

impl MambaCacheMode {
    /// Parses `"none"` or `"align"`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(MambaCacheMode::None),
            "align" => Ok(MambaCacheMode::Align),
            _ => invalid(format!(
                "mamba_cache_mode must be 'none' or 'align', got {s:?}"
            )),
        }
    }

    /// vLLM's string for the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            MambaCacheMode::None => "none",
            MambaCacheMode::Align => "align",
        }
    }
}

/// A Mamba (state space) layer (vLLM's `MambaSpec`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MambaSpec {
    /// Tokens per block.
    pub block_size: usize,
    /// Shape of each state tensor.
    pub shapes: Vec<Vec<usize>>,
    /// Element type of each state tensor (same length as `shapes`).
    pub dtypes: Vec<Dtype>,
    /// A page size that replaces the computed one (must not be smaller).
    pub page_size_padded: Option<usize>,
    /// The Mamba backend name (vLLM's `MambaAttentionBackendEnum`, lower case).
    pub mamba_type: String,
    /// State caching mode.
    pub mamba_cache_mode: MambaCacheMode,
    /// Extra blocks kept for speculative decoding.
    pub num_speculative_blocks: usize,
    /// Extra blocks kept for prefill checkpoints ("align" mode).
    pub num_prefill_checkpoint_blocks: usize,
    /// Token alignment of prefill checkpoints, if the backend can export them.
    pub prefill_checkpoint_alignment: Option<usize>,
}

impl MambaSpec {
    /// A Mamba spec with vLLM's defaults (`mamba2`, mode "none", no extra blocks).
    pub fn new(block_size: usize, shapes: Vec<Vec<usize>>, dtypes: Vec<Dtype>) -> Self {
        MambaSpec {
            block_size,
            shapes,
            dtypes,
            page_size_padded: None,
            mamba_type: "mamba2".into(),
            mamba_cache_mode: MambaCacheMode::None,
            num_speculative_blocks: 0,
            num_prefill_checkpoint_blocks: 0,
            prefill_checkpoint_alignment: None,
        }
    }

    /// `Σ prod(shape_i) * dtype_size_i`.
    fn unpadded_page_size(&self) -> Result<usize> {
        self.shapes
            .iter()
            .zip(&self.dtypes)
            .try_fold(0usize, |acc, (shape, dtype)| {
                let mut factors = shape.clone();
                factors.push(dtype.size());
                acc.checked_add(checked_product(&factors)?)
                    .ok_or_else(overflow)
            })
    }
}

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

/// The explicit numbers vLLM's `max_memory_usage_bytes` reads from its `VllmConfig`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryParams {
    /// `model_config.max_model_len`.
    pub max_model_len: usize,
    /// `scheduler_config.max_num_batched_tokens`.
    pub max_num_batched_tokens: usize,
    /// `scheduler_config.max_num_encoder_input_tokens`.
    pub max_num_encoder_input_tokens: usize,
    /// `VllmConfig.max_concurrent_batches` (pipeline stages, or 2 with async scheduling).
    pub max_concurrent_batches: usize,
    /// `parallel_config.decode_context_parallel_size`.
    pub dcp_world_size: usize,
}

impl MemoryParams {
    /// Parameters for a model length, with vLLM's `SchedulerConfig` defaults elsewhere
    /// (`max_num_batched_tokens = max_num_encoder_input_tokens = 2048`, one batch in
    /// flight, no DCP).
    pub fn new(max_model_len: usize) -> Self {
        MemoryParams {
            max_model_len,
            max_num_batched_tokens: 2048,
            max_num_encoder_input_tokens: 2048,
            max_concurrent_batches: 1,
            dcp_world_size: 1,
        }
    }

    /// `max_concurrent_batches * max_num_batched_tokens` (vLLM's `max_in_flight_tokens`).
    pub fn max_in_flight_tokens(&self) -> Result<usize> {
        self.max_concurrent_batches
            .checked_mul(self.max_num_batched_tokens)
            .ok_or_else(overflow)
    }
}

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
    /// `SlidingWindowSpec`.
    SlidingWindow,
    /// `ChunkedLocalAttentionSpec`.
    ChunkedLocalAttention,
    /// `MambaSpec`.
    Mamba,
    /// `CrossAttentionSpec`.
    CrossAttention,
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
    /// Sliding window attention.
    SlidingWindow(SlidingWindowSpec),
    /// Chunked local attention.
    ChunkedLocalAttention(ChunkedLocalAttentionSpec),
    /// Mamba state.
    Mamba(MambaSpec),
    /// Encoder-decoder cross attention.
    CrossAttention(CrossAttentionSpec),
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
    SlidingWindowSpec => SlidingWindow,
    ChunkedLocalAttentionSpec => ChunkedLocalAttention,
    MambaSpec => Mamba,
    CrossAttentionSpec => CrossAttention,
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

impl KvCacheSpec {
    /// Validates the spec and normalises it as vLLM's `__post_init__` does (MLA pages
    /// are padded up to `alignment`). Every other method assumes a built spec.
    pub fn build(mut self) -> Result<KvCacheSpec> {
        match &mut self {
            KvCacheSpec::FullAttention(f) => check_full(f)?,
            KvCacheSpec::MlaAttention(m) => {
                if m.full.attn.head_size_v != 0 {
                    return invalid("MLAAttentionSpec stores one latent: head_size_v must be 0");
                }
                check_full(&m.full)?;
                check_optional_positive("alignment", m.alignment)?;
                if let Some(align) = m.alignment {
                    let page = m.full.attn.unpadded_page_size()?;
                    let padded = page.checked_next_multiple_of(align).ok_or_else(overflow)?;
                    if padded != page {
                        m.full.attn.page_size_padded = Some(padded);
                    }
                }
            }
            KvCacheSpec::SinkFullAttention(s) => {
                check_full(&s.full)?;
                if s.sink_len == 0 || s.sink_len % s.full.attn.block_size != 0 {
                    return invalid(format!(
                        "sink_len ({}) must be a positive multiple of block_size ({})",
                        s.sink_len, s.full.attn.block_size
                    ));
                }
            }
            KvCacheSpec::SlidingWindow(s) => {
                s.attn.check()?;
                check_positive("sliding_window", s.sliding_window)?;
            }
            KvCacheSpec::ChunkedLocalAttention(c) => {
                c.attn.check()?;
                check_positive("attention_chunk_size", c.attention_chunk_size)?;
            }
            KvCacheSpec::CrossAttention(c) => c.attn.check()?,
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
            KvCacheSpec::SlidingWindow(_) => SpecClass::SlidingWindow,
            KvCacheSpec::ChunkedLocalAttention(_) => SpecClass::ChunkedLocalAttention,
            KvCacheSpec::Mamba(_) => SpecClass::Mamba,
            KvCacheSpec::CrossAttention(_) => SpecClass::CrossAttention,
            KvCacheSpec::UniformType(_) => SpecClass::UniformType,
        }
    }

    /// The attention fields, for every attention spec.
    pub fn attention(&self) -> Option<&AttentionParams> {
        match self {
            KvCacheSpec::SlidingWindow(s) => Some(&s.attn),
            KvCacheSpec::ChunkedLocalAttention(c) => Some(&c.attn),
            KvCacheSpec::CrossAttention(c) => Some(&c.attn),
            _ => self.full_attention().map(|f| &f.attn),
        }
    }

    /// The full attention fields, for full attention and its subclasses (MLA, sink).
    pub fn full_attention(&self) -> Option<&FullAttentionSpec> {
        match self {
            KvCacheSpec::FullAttention(f) => Some(f),
            KvCacheSpec::MlaAttention(m) => Some(&m.full),
            KvCacheSpec::SinkFullAttention(s) => Some(&s.full),
            _ => None,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        match self {
            KvCacheSpec::Mamba(m) => m.block_size,
            KvCacheSpec::UniformType(u) => u.block_size,
            _ => self.attention().map_or(0, |a| a.block_size),
        }
    }

    /// Whether DCP shards this cache's tokens (attention default true; Mamba false;
    /// a uniform group takes its first member's).
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
            KvCacheSpec::UniformType(u) => {
                u.kv_cache_specs.specs().map(|s| s.page_size_bytes()).sum()
            }
            _ => self.attention().map_or(0, AttentionParams::page_size_bytes),
        }
    }

    /// The per-request admission cap in blocks for specs that recycle blocks
    /// (sliding window, chunked local); `None` for the others. The rules are the
    /// attention types' ([`attention::sliding_window`], [`attention::chunked_local`]).
    pub fn max_admission_blocks_per_request(
        &self,
        max_in_flight_tokens: usize,
        max_model_len: usize,
    ) -> Option<usize> {
        match self {
            KvCacheSpec::SlidingWindow(_) | KvCacheSpec::ChunkedLocalAttention(_) => {
                AttentionKind::from_spec(self).ok()?.max_admission_blocks(
                    self.block_size(),
                    max_in_flight_tokens,
                    max_model_len,
                )
            }
            _ => None,
        }
    }

    /// The most bytes one request can hold in this cache (vLLM's
    /// `max_memory_usage_bytes(vllm_config)`).
    pub fn max_memory_usage_bytes(&self, p: &MemoryParams) -> Result<usize> {
        let page = self.page_size_bytes();
        let blocks = match self {
            KvCacheSpec::FullAttention(_)
            | KvCacheSpec::MlaAttention(_)
            | KvCacheSpec::SinkFullAttention(_) => full::max_blocks_per_request(
                p.max_model_len,
                self.dcp_sharded(),
                p.dcp_world_size,
                self.block_size(),
            ),
            KvCacheSpec::SlidingWindow(s) => {
                if s.attn.dcp_sharded && p.dcp_world_size != 1 {
                    return Err(KvError::Unsupported(
                        "decode context parallelism with sliding window attention".into(),
                    ));
                }
                self.max_admission_blocks_per_request(p.max_in_flight_tokens()?, p.max_model_len)
                    .unwrap_or(0)
            }
            KvCacheSpec::ChunkedLocalAttention(_) => self
                .max_admission_blocks_per_request(p.max_in_flight_tokens()?, p.max_model_len)
                .unwrap_or(0),
            KvCacheSpec::Mamba(m) => mamba::max_blocks_per_request(m).ok_or_else(overflow)?,
            KvCacheSpec::CrossAttention(_) => cross_attention::max_blocks_per_request(
                p.max_num_encoder_input_tokens,
                self.block_size(),
            ),
            KvCacheSpec::UniformType(u) => {
                let mut most = 0;
                for s in u.kv_cache_specs.specs() {
                    most = most.max(cdiv(s.max_memory_usage_bytes(p)?, s.page_size_bytes()));
                }
                most
            }
        };
        blocks.checked_mul(page).ok_or_else(overflow)
    }

    /// The spec kind string vLLM attaches to KV cache events
    /// (`get_kv_cache_spec_kind`), written in each attention type's file: MLA reports
    /// its own kind. A uniform group reports its members' kind, or full attention's when
    /// it mixes full attention subclasses.
    pub fn kind(&self) -> &'static str {
        match self {
            KvCacheSpec::FullAttention(_) => full::SPEC_KIND,
            KvCacheSpec::MlaAttention(_) => full::MLA_SPEC_KIND,
            KvCacheSpec::SinkFullAttention(_) => full::SINK_SPEC_KIND,
            KvCacheSpec::SlidingWindow(_) => sliding_window::SPEC_KIND,
            KvCacheSpec::ChunkedLocalAttention(_) => chunked_local::SPEC_KIND,
            KvCacheSpec::Mamba(_) => mamba::SPEC_KIND,
            KvCacheSpec::CrossAttention(_) => cross_attention::SPEC_KIND,
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
    /// (`get_kv_cache_spec_sliding_window`): set only for sliding window specs, and for
    /// uniform groups whose members agree on it.
    pub fn sliding_window(&self) -> Option<usize> {
        match self {
            KvCacheSpec::SlidingWindow(s) => Some(s.sliding_window),
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

    /// Whether this spec is of `class` (or a subclass of it), as `isinstance` in vLLM.
    pub fn is_instance(&self, class: SpecClass) -> bool {
        match class {
            SpecClass::Base => true,
            SpecClass::FullAttention => self.full_attention().is_some(),
            _ => self.class() == class,
        }
    }

    /// Merges the specs of a group's layers into one spec, with the rules of
    /// `type(specs[0]).merge(specs)` in vLLM.
    pub fn merge(specs: &[KvCacheSpec]) -> Result<KvCacheSpec> {
        let first = specs
            .first()
            .ok_or_else(|| KvError::InvalidSpec("cannot merge an empty list of specs".into()))?;
        Self::merge_as(first.class(), specs)
    }

    /// Merges with the rules of `class.merge(specs)` in vLLM:
    /// * full attention (and sink): every spec is full attention but not MLA; the
    ///   attention fields agree; the recorded sliding windows (and chunk sizes) that
    ///   are set agree; not both a window and a chunk. The result is of `class`
    ///   (a sink result takes the first spec's `sink_len`).
    /// * MLA: every spec is MLA with the same `cache_dtype_str` and attention fields;
    ///   the result keeps the first page size and drops alignment and recorded windows.
    /// * every other class: all specs must be equal.
    pub fn merge_as(class: SpecClass, specs: &[KvCacheSpec]) -> Result<KvCacheSpec> {
        let first = specs
            .first()
            .ok_or_else(|| KvError::InvalidSpec("cannot merge an empty list of specs".into()))?;
        match class {
            SpecClass::FullAttention | SpecClass::SinkFullAttention => {
                let full = merge_full(specs)?;
                if class == SpecClass::FullAttention {
                    return Ok(KvCacheSpec::FullAttention(full));
                }
                let KvCacheSpec::SinkFullAttention(s) = first else {
                    return invalid("SinkFullAttentionSpec.merge needs a sink spec first");
                };
                Ok(KvCacheSpec::SinkFullAttention(SinkFullAttentionSpec {
                    full,
                    sink_len: s.sink_len,
                }))
            }
            SpecClass::MlaAttention => merge_mla(specs),
            _ => {
                if specs[1..].iter().any(|s| s != first) {
                    return invalid("All layers in the same KV cache group must be the same.");
                }
                Ok(first.clone())
            }
        }
    }
}

/// Formats an optional value as Python prints it (`None` when absent).
struct Opt<T>(Option<T>);

impl<T: fmt::Display> fmt::Display for Opt<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(v) => v.fmt(f),
            None => f.write_str("None"),
        }
    }
}

/// Formats a string as Python's `repr` does for plain text: `'text'`.
fn py_str(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Formats a Python bool.
fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

impl fmt::Display for AttentionParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "block_size={}, num_kv_heads={}, head_size={}, dtype={}, head_size_v={}, \
             page_size_padded={}, dcp_sharded={}",
            self.block_size,
            self.num_kv_heads,
            self.head_size,
            self.dtype,
            self.head_size_v,
            Opt(self.page_size_padded),
            py_bool(self.dcp_sharded)
        )
    }
}

impl fmt::Display for FullAttentionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, sliding_window={}, attention_chunk_size={}",
            self.attn,
            Opt(self.sliding_window),
            Opt(self.attention_chunk_size)
        )
    }
}

impl fmt::Display for KvCacheSpec {
    /// A dataclass-style repr with vLLM's class and field names, e.g.
    /// `FullAttentionSpec(block_size=16, num_kv_heads=8, ...)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvCacheSpec::FullAttention(s) => write!(f, "FullAttentionSpec({s})"),
            KvCacheSpec::MlaAttention(m) => write!(
                f,
                "MLAAttentionSpec({}, cache_dtype_str={}, alignment={})",
                m.full,
                Opt(m.cache_dtype_str.as_deref().map(py_str)),
                Opt(m.alignment)
            ),
            KvCacheSpec::SinkFullAttention(s) => {
                write!(
                    f,
                    "SinkFullAttentionSpec({}, sink_len={})",
                    s.full, s.sink_len
                )
            }
            KvCacheSpec::SlidingWindow(s) => write!(
                f,
                "SlidingWindowSpec({}, sliding_window={}, extra_retained_tokens={})",
                s.attn, s.sliding_window, s.extra_retained_tokens
            ),
            KvCacheSpec::ChunkedLocalAttention(c) => write!(
                f,
                "ChunkedLocalAttentionSpec({}, attention_chunk_size={})",
                c.attn, c.attention_chunk_size
            ),
            KvCacheSpec::CrossAttention(c) => write!(f, "CrossAttentionSpec({})", c.attn),
            KvCacheSpec::Mamba(m) => {
                let shapes: Vec<String> = m
                    .shapes
                    .iter()
                    .map(|s| match s.as_slice() {
                        [one] => format!("({one},)"),
                        _ => format!(
                            "({})",
                            s.iter()
                                .map(usize::to_string)
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    })
                    .collect();
                let dtypes: Vec<String> = m.dtypes.iter().map(Dtype::to_string).collect();
                let tuple = |items: &[String]| match items {
                    [one] => format!("({one},)"),
                    _ => format!("({})", items.join(", ")),
                };
                write!(
                    f,
                    "MambaSpec(block_size={}, shapes={}, dtypes={}, page_size_padded={}, \
                     mamba_type={}, mamba_cache_mode={}, num_speculative_blocks={}, \
                     num_prefill_checkpoint_blocks={}, prefill_checkpoint_alignment={})",
                    m.block_size,
                    tuple(&shapes),
                    tuple(&dtypes),
                    Opt(m.page_size_padded),
                    py_str(&m.mamba_type),
                    py_str(m.mamba_cache_mode.as_str()),
                    m.num_speculative_blocks,
                    m.num_prefill_checkpoint_blocks,
                    Opt(m.prefill_checkpoint_alignment)
                )
            }
            KvCacheSpec::UniformType(u) => {
                let layers: Vec<String> = u
                    .kv_cache_specs
                    .0
                    .iter()
                    .map(|(name, spec)| format!("{}: {spec}", py_str(name)))
                    .collect();
                write!(
                    f,
                    "UniformTypeKVCacheSpecs(block_size={}, kv_cache_specs={{{}}})",
                    u.block_size,
                    layers.join(", ")
                )
            }
        }
    }
}

fn check_full(f: &FullAttentionSpec) -> Result<()> {
    f.attn.check()?;
    check_optional_positive("sliding_window", f.sliding_window)?;
    check_optional_positive("attention_chunk_size", f.attention_chunk_size)
}

/// The one value of a set of recorded window sizes, if any (`merge_window_sizes`).
fn merge_window_sizes(sizes: impl Iterator<Item = Option<usize>>) -> Result<Option<usize>> {
    let mut merged = None;
    for size in sizes.flatten() {
        match merged {
            Some(m) if m != size => return invalid(
                "All attention layers in the same KV cache group must have the same window size.",
            ),
            _ => merged = Some(size),
        }
    }
    Ok(merged)
}

fn same_attention(specs: &[KvCacheSpec], merged: &AttentionParams) -> Result<()> {
    if specs.iter().any(|s| s.attention() != Some(merged)) {
        return invalid(
            "All attention layers in the same KV cache group must have the same attention spec.",
        );
    }
    Ok(())
}

fn merge_full(specs: &[KvCacheSpec]) -> Result<FullAttentionSpec> {
    let mut fulls = Vec::with_capacity(specs.len());
    for s in specs {
        match s {
            KvCacheSpec::MlaAttention(_) => {
                return invalid("MLAAttentionSpec should be merged in MLAAttentionSpec.merge")
            }
            _ => match s.full_attention() {
                Some(f) => fulls.push(f),
                None => return invalid(
                    "All attention layers in the same KV cache group must be FullAttentionSpec.",
                ),
            },
        }
    }
    let merged = FullAttentionSpec {
        attn: fulls[0].attn.clone(),
        sliding_window: merge_window_sizes(fulls.iter().map(|f| f.sliding_window))?,
        attention_chunk_size: merge_window_sizes(fulls.iter().map(|f| f.attention_chunk_size))?,
    };
    same_attention(specs, &merged.attn)?;
    if merged.sliding_window.is_some() && merged.attention_chunk_size.is_some() {
        return invalid(
            "Model with both sliding window layers and chunked local attention layers is not supported.",
        );
    }
    Ok(merged)
}

fn merge_mla(specs: &[KvCacheSpec]) -> Result<KvCacheSpec> {
    let mut mlas = Vec::with_capacity(specs.len());
    for s in specs {
        let KvCacheSpec::MlaAttention(m) = s else {
            return invalid(
                "All attention layers in the same KV cache group must be MLAAttentionSpec.",
            );
        };
        mlas.push(m);
    }
    if mlas
        .iter()
        .any(|m| m.cache_dtype_str != mlas[0].cache_dtype_str)
    {
        return invalid(
            "All attention layers in the same KV cache group must use the same quantization method.",
        );
    }
    let merged = MlaAttentionSpec {
        full: FullAttentionSpec::new(mlas[0].full.attn.clone()),
        cache_dtype_str: mlas[0].cache_dtype_str.clone(),
        alignment: None,
    };
    same_attention(specs, &merged.full.attn)?;
    Ok(KvCacheSpec::MlaAttention(merged))
}

/// Whether the specs can share one [`UniformTypeSpecs`] group (vLLM's
/// `UniformTypeKVCacheSpecs.is_uniform_type`): one block size, one DCP sharding, and
/// one type family: all full attention (MLA and sink included), all sliding window with
/// one window, all chunked local with one chunk size, all Mamba with the same page size
/// and extra block counts, or all cross attention. An empty list is not uniform.
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
        | KvCacheSpec::SinkFullAttention(_) => same(&|s| s.full_attention().is_some()),
        KvCacheSpec::SlidingWindow(w) => same(
            &|s| matches!(s, KvCacheSpec::SlidingWindow(o) if o.sliding_window == w.sliding_window),
        ),
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
        KvCacheSpec::UniformType(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attn(bs: usize, heads: usize, head: usize, dtype: Dtype) -> AttentionParams {
        AttentionParams::new(bs, heads, head, dtype)
    }

    fn full(bs: usize) -> KvCacheSpec {
        KvCacheSpec::from(FullAttentionSpec::new(attn(bs, 8, 128, Dtype::Bfloat16)))
            .build()
            .unwrap()
    }

    fn swa(bs: usize, sw: usize) -> KvCacheSpec {
        KvCacheSpec::from(SlidingWindowSpec {
            attn: attn(bs, 8, 128, Dtype::Bfloat16),
            sliding_window: sw,
            extra_retained_tokens: 0,
        })
        .build()
        .unwrap()
    }

    fn mla(align: Option<usize>) -> KvCacheSpec {
        let mut a = attn(16, 1, 576, Dtype::Bfloat16);
        a.head_size_v = 0;
        KvCacheSpec::from(MlaAttentionSpec {
            full: FullAttentionSpec::new(a),
            cache_dtype_str: None,
            alignment: align,
        })
        .build()
        .unwrap()
    }

    #[test]
    fn attention_page_size() {
        // 8 heads * 16 tokens * (128 + 128) * 2 bytes.
        assert_eq!(full(16).page_size_bytes(), 65_536);
        let mut a = attn(16, 8, 128, Dtype::Float32);
        a.head_size_v = 64;
        let s = KvCacheSpec::from(FullAttentionSpec::new(a))
            .build()
            .unwrap();
        assert_eq!(s.page_size_bytes(), 8 * 16 * 192 * 4);
    }

    #[test]
    fn mla_page_is_single_latent_padded_to_alignment() {
        assert_eq!(mla(None).page_size_bytes(), 16 * 576 * 2);
        // 18432 rounded up to a multiple of 1000.
        assert_eq!(mla(Some(1000)).page_size_bytes(), 19_000);
        assert_eq!(mla(Some(512)).page_size_bytes(), 18_432);
    }

    #[test]
    fn mamba_page_sums_states() {
        let mut m = MambaSpec::new(
            16,
            vec![vec![3, 4], vec![2, 5, 7]],
            vec![Dtype::Float32, Dtype::Bfloat16],
        );
        let s = KvCacheSpec::from(m.clone()).build().unwrap();
        assert_eq!(s.page_size_bytes(), 12 * 4 + 70 * 2);
        m.page_size_padded = Some(1024);
        assert_eq!(
            KvCacheSpec::from(m.clone())
                .build()
                .unwrap()
                .page_size_bytes(),
            1024
        );
        m.page_size_padded = Some(100);
        assert!(KvCacheSpec::from(m).build().is_err());
    }

    #[test]
    fn full_memory_with_and_without_dcp() {
        let p = MemoryParams::new(1000);
        assert_eq!(full(16).max_memory_usage_bytes(&p).unwrap(), 63 * 65_536);
        let p = MemoryParams {
            dcp_world_size: 4,
            ..p
        };
        // cdiv(1000, 4) = 250 tokens -> 16 blocks.
        assert_eq!(full(16).max_memory_usage_bytes(&p).unwrap(), 16 * 65_536);
    }

    #[test]
    fn swa_and_chunked_admission() {
        let s = swa(16, 4096);
        assert_eq!(s.max_admission_blocks_per_request(8192, 32_768), Some(769));
        let p = MemoryParams {
            max_num_batched_tokens: 8192,
            ..MemoryParams::new(32_768)
        };
        assert_eq!(s.max_memory_usage_bytes(&p).unwrap(), 769 * 65_536);
        // Capped by max_model_len: cdiv(1000, 16) + 1.
        assert_eq!(s.max_admission_blocks_per_request(8192, 1000), Some(64));
        let c = KvCacheSpec::from(ChunkedLocalAttentionSpec {
            attn: attn(16, 8, 128, Dtype::Bfloat16),
            attention_chunk_size: 8192,
        })
        .build()
        .unwrap();
        assert_eq!(c.max_admission_blocks_per_request(8192, 32_768), Some(1024));
        let two = MemoryParams {
            max_concurrent_batches: 2,
            ..p
        };
        // min(8192 + 16384, 32768) / 16.
        assert_eq!(c.max_memory_usage_bytes(&two).unwrap(), 1536 * 65_536);
        let dcp = MemoryParams {
            dcp_world_size: 2,
            ..p
        };
        assert!(s.max_memory_usage_bytes(&dcp).is_err());
        assert_eq!(full(16).max_admission_blocks_per_request(1, 1), None);
    }

    #[test]
    fn mamba_cross_and_uniform_memory() {
        let mut m = MambaSpec::new(16, vec![vec![10]], vec![Dtype::Float32]);
        m.num_speculative_blocks = 2;
        let p = MemoryParams::new(4096);
        let none = KvCacheSpec::from(m.clone()).build().unwrap();
        assert_eq!(none.max_memory_usage_bytes(&p).unwrap(), 40 * 3);
        m.mamba_cache_mode = MambaCacheMode::Align;
        m.num_prefill_checkpoint_blocks = 1;
        let align = KvCacheSpec::from(m).build().unwrap();
        assert_eq!(align.max_memory_usage_bytes(&p).unwrap(), 40 * 5);

        let cross = KvCacheSpec::from(CrossAttentionSpec {
            attn: attn(16, 8, 128, Dtype::Bfloat16),
        })
        .build()
        .unwrap();
        let p = MemoryParams {
            max_num_encoder_input_tokens: 1500,
            ..p
        };
        assert_eq!(cross.max_memory_usage_bytes(&p).unwrap(), 94 * 65_536);

        let half = KvCacheSpec::from(FullAttentionSpec::new(attn(16, 4, 128, Dtype::Bfloat16)))
            .build()
            .unwrap();
        let u = KvCacheSpec::from(UniformTypeSpecs {
            block_size: 16,
            kv_cache_specs: LayerSpecs(vec![("a".into(), full(16)), ("b".into(), half)]),
        })
        .build()
        .unwrap();
        assert_eq!(u.page_size_bytes(), 65_536 + 32_768);
        // Both need cdiv(4096, 16) = 256 pages.
        assert_eq!(u.max_memory_usage_bytes(&p).unwrap(), 256 * 98_304);
        assert_eq!(u.kind(), "full_attention");
        assert_eq!(
            AttentionKind::from_spec(&u).unwrap(),
            AttentionKind::FullAttention
        );
    }

    #[test]
    fn merge_full_windows() {
        let mut a = FullAttentionSpec::new(attn(16, 8, 128, Dtype::Bfloat16));
        let plain = KvCacheSpec::from(a.clone()).build().unwrap();
        a.sliding_window = Some(128);
        let windowed = KvCacheSpec::from(a.clone()).build().unwrap();
        let merged = KvCacheSpec::merge(&[plain.clone(), windowed.clone()]).unwrap();
        assert_eq!(merged, windowed);
        a.sliding_window = Some(256);
        let other = KvCacheSpec::from(a.clone()).build().unwrap();
        assert!(KvCacheSpec::merge(&[windowed.clone(), other]).is_err());
        a.sliding_window = None;
        a.attention_chunk_size = Some(64);
        let chunked = KvCacheSpec::from(a).build().unwrap();
        assert!(KvCacheSpec::merge(&[windowed, chunked]).is_err());
        assert!(KvCacheSpec::merge(&[plain.clone(), full(32)]).is_err());
        assert!(KvCacheSpec::merge(&[plain.clone(), mla(None)]).is_err());
        assert!(KvCacheSpec::merge(&[plain.clone(), swa(16, 8)]).is_err());
        assert!(KvCacheSpec::merge(&[]).is_err());
    }

    #[test]
    fn merge_sink_mla_and_base() {
        let sink = |n| {
            KvCacheSpec::from(SinkFullAttentionSpec {
                full: FullAttentionSpec::new(attn(16, 8, 128, Dtype::Bfloat16)),
                sink_len: n,
            })
            .build()
            .unwrap()
        };
        // Sink merge keeps the first sink_len; full merge drops it.
        let m = KvCacheSpec::merge(&[sink(32), sink(16)]).unwrap();
        assert_eq!(m, sink(32));
        let m = KvCacheSpec::merge_as(SpecClass::FullAttention, &[sink(32), full(16)]).unwrap();
        assert_eq!(m, full(16));
        assert!(KvCacheSpec::merge_as(SpecClass::SinkFullAttention, &[full(16)]).is_err());
        // MLA merge drops alignment but keeps the padded page.
        let m = KvCacheSpec::merge(&[mla(Some(1000)), mla(Some(1000))]).unwrap();
        assert_eq!(m.page_size_bytes(), 19_000);
        assert_ne!(m, mla(Some(1000)));
        assert!(KvCacheSpec::merge(&[mla(None), mla(Some(1000))]).is_err());
        assert_eq!(
            KvCacheSpec::merge(&[swa(16, 8), swa(16, 8)]).unwrap(),
            swa(16, 8)
        );
        assert!(KvCacheSpec::merge(&[swa(16, 8), swa(16, 4)]).is_err());
    }

    #[test]
    fn kinds_windows_and_managers() {
        assert_eq!(full(16).kind(), "full_attention");
        assert_eq!(mla(None).kind(), "mla_attention");
        assert_eq!(
            AttentionKind::from_spec(&mla(None)).unwrap(),
            AttentionKind::FullAttention
        );
        assert_eq!(swa(16, 8).kind(), "sliding_window");
        assert_eq!(swa(16, 8).sliding_window(), Some(8));
        assert_eq!(
            AttentionKind::from_spec(&swa(16, 8)).unwrap(),
            AttentionKind::SlidingWindow {
                sliding_window: 8,
                extra_retained_tokens: 0
            }
        );
        let u = KvCacheSpec::from(UniformTypeSpecs {
            block_size: 16,
            kv_cache_specs: LayerSpecs(vec![("a".into(), full(16)), ("b".into(), mla(None))]),
        })
        .build()
        .unwrap();
        assert_eq!(u.kind(), "full_attention");
        assert_eq!(u.sliding_window(), None);
        let w = KvCacheSpec::from(UniformTypeSpecs {
            block_size: 16,
            kv_cache_specs: LayerSpecs(vec![("a".into(), swa(16, 8)), ("b".into(), swa(16, 8))]),
        })
        .build()
        .unwrap();
        assert_eq!((w.kind(), w.sliding_window()), ("sliding_window", Some(8)));
        assert_eq!(
            AttentionKind::from_spec(&w).unwrap(),
            AttentionKind::SlidingWindow {
                sliding_window: 8,
                extra_retained_tokens: 0
            }
        );
        assert!(mla(None).is_instance(SpecClass::FullAttention));
        assert!(mla(None).is_instance(SpecClass::Base));
        assert!(!swa(16, 8).is_instance(SpecClass::FullAttention));
        assert!(!full(16).is_instance(SpecClass::MlaAttention));
    }

    #[test]
    fn uniform_type_rules_and_order_free_equality() {
        assert!(is_uniform_type([&full(16), &mla(None)]));
        assert!(!is_uniform_type([&full(16), &full(32)]));
        assert!(!is_uniform_type([&swa(16, 8), &swa(16, 4)]));
        assert!(!is_uniform_type([&full(16), &swa(16, 8)]));
        assert!(!is_uniform_type(std::iter::empty()));
        let ab = LayerSpecs(vec![("a".into(), full(16)), ("b".into(), mla(None))]);
        let ba = LayerSpecs(vec![("b".into(), mla(None)), ("a".into(), full(16))]);
        assert_eq!(ab, ba);
        let bad = UniformTypeSpecs {
            block_size: 16,
            kv_cache_specs: LayerSpecs(vec![("a".into(), full(16)), ("b".into(), swa(16, 8))]),
        };
        assert!(KvCacheSpec::from(bad).build().is_err());
    }

    #[test]
    fn display_reads_like_vllm_repr() {
        assert_eq!(
            swa(16, 8).to_string(),
            "SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=128, \
             dtype=torch.bfloat16, head_size_v=128, page_size_padded=None, dcp_sharded=True, \
             sliding_window=8, extra_retained_tokens=0)"
        );
        let mut m = MambaSpec::new(16, vec![vec![4]], vec![Dtype::Int8]);
        m.mamba_type = "it's".into();
        let text = KvCacheSpec::from(m).build().unwrap().to_string();
        assert!(
            text.contains("shapes=((4,),), dtypes=(torch.int8,)"),
            "{text}"
        );
        assert!(text.contains(r"mamba_type='it\'s'"), "{text}");
    }

    #[test]
    fn construction_validates() {
        assert!(
            KvCacheSpec::from(FullAttentionSpec::new(attn(0, 8, 128, Dtype::Int8)))
                .build()
                .is_err()
        );
        assert!(
            KvCacheSpec::from(FullAttentionSpec::new(attn(16, 0, 128, Dtype::Int8)))
                .build()
                .is_err()
        );
        let sink = |n| {
            KvCacheSpec::from(SinkFullAttentionSpec {
                full: FullAttentionSpec::new(attn(16, 8, 128, Dtype::Int8)),
                sink_len: n,
            })
            .build()
        };
        assert!(sink(0).is_err());
        assert!(sink(24).is_err());
        assert!(sink(48).is_ok());
        let huge = attn(usize::MAX / 2, 8, 128, Dtype::Float64);
        assert!(KvCacheSpec::from(FullAttentionSpec::new(huge))
            .build()
            .is_err());
        let m = MambaSpec::new(16, vec![vec![1]], vec![]);
        assert!(KvCacheSpec::from(m).build().is_err());
    }
}
