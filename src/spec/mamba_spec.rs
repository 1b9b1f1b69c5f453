//! The Mamba spec ([`MambaSpec`]) and its cache mode ([`MambaCacheMode`]).

use super::{checked_product, invalid, overflow, Dtype};
use crate::error::Result;

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
    pub(super) fn unpadded_page_size(&self) -> Result<usize> {
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
