//! Memory: the most blocks and bytes one request can hold in a cache
//! ([`KvCacheSpec::max_memory_usage_bytes`]) and the admission cap of the attention types
//! that recycle blocks. The rules are the attention types' (`src/attention/`); this file
//! applies them to a spec.

use super::{overflow, KvCacheSpec};
use crate::arith::cdiv;
use crate::attention::{
    circular_buffer, cross_attention, full, hisparse_hot, mamba, AttentionKind,
};
use crate::error::{KvError, Result};

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

impl KvCacheSpec {
    /// The per-request admission cap in blocks for specs that recycle blocks
    /// (sliding window, chunked local) and for HiSparse resident pages; `None` for the
    /// others. The rules are the attention types' (`attention::sliding_window`,
    /// `attention::chunked_local`, `attention::hisparse`).
    pub fn max_admission_blocks_per_request(
        &self,
        max_in_flight_tokens: usize,
        max_model_len: usize,
    ) -> Option<usize> {
        match self {
            KvCacheSpec::SlidingWindow(_)
            | KvCacheSpec::SlidingWindowMla(_)
            | KvCacheSpec::ChunkedLocalAttention(_)
            | KvCacheSpec::HiSparseResident(_) => AttentionKind::from_spec(self)
                .ok()?
                .max_admission_blocks(self.block_size(), max_in_flight_tokens, max_model_len),
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
            | KvCacheSpec::SinkFullAttention(_)
            | KvCacheSpec::Rswa(_) => full::max_blocks_per_request(
                p.max_model_len,
                self.dcp_sharded(),
                p.dcp_world_size,
                self.block_size(),
            ),
            KvCacheSpec::SlidingWindow(_) | KvCacheSpec::SlidingWindowMla(_) => {
                if self.dcp_sharded() && p.dcp_world_size != 1 {
                    return Err(KvError::Unsupported(
                        "decode context parallelism with sliding window attention".into(),
                    ));
                }
                self.max_admission_blocks_per_request(p.max_in_flight_tokens()?, p.max_model_len)
                    .unwrap_or(0)
            }
            KvCacheSpec::ChunkedLocalAttention(_) | KvCacheSpec::HiSparseResident(_) => self
                .max_admission_blocks_per_request(p.max_in_flight_tokens()?, p.max_model_len)
                .unwrap_or(0),
            KvCacheSpec::HiSparseHot(h) => {
                hisparse_hot::max_blocks_per_request(h.blocks_per_request)
            }
            KvCacheSpec::Mamba(m) => mamba::max_blocks_per_request(m).ok_or_else(overflow)?,
            KvCacheSpec::CrossAttention(_) => cross_attention::max_blocks_per_request(
                p.max_num_encoder_input_tokens,
                self.block_size(),
            ),
            KvCacheSpec::CircularBuffer(_) => circular_buffer::MAX_BLOCKS_PER_REQUEST,
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
}
