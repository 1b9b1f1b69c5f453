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
//!
//! One file per job: [`AttentionParams`] and the attention specs (`attention_specs.rs`),
//! Mamba (`mamba_spec.rs`), HiSparse's hot and resident pages (`hisparse_specs.rs`), uniform groups (`uniform.rs`), the [`KvCacheSpec`] enum and
//! its validation (`kv_cache_spec.rs`), memory and admission (`memory.rs`), event
//! annotations (`event_annotations.rs`), merge rules (`merge.rs`), vLLM-style `repr`s
//! (`display.rs`) and dtypes (`dtype.rs`).

mod attention_specs;
mod display;
mod dtype;
mod event_annotations;
mod hisparse_specs;
mod kv_cache_spec;
mod mamba_spec;
mod memory;
mod merge;
mod tokens_per_state;
mod uniform;

pub use attention_specs::{
    AttentionParams, ChunkedLocalAttentionSpec, CircularBufferSpec, CrossAttentionSpec,
    FullAttentionSpec, MlaAttentionSpec, RswaSpec, SinkFullAttentionSpec, SlidingWindowMlaSpec,
    SlidingWindowSpec,
};
pub use dtype::Dtype;
pub use hisparse_specs::{HiSparseHotSpec, HiSparseResidentSpec};
pub use kv_cache_spec::{KvCacheSpec, SpecClass};
pub use mamba_spec::{MambaCacheMode, MambaSpec};
pub use memory::MemoryParams;
pub use tokens_per_state::TokensPerState;
pub use uniform::{is_uniform_type, LayerSpecs, UniformTypeSpecs};

use crate::error::{KvError, Result};

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

#[cfg(test)]
mod tests;
