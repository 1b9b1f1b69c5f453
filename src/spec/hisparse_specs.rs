//! HiSparse's two device-side spec classes (vLLM 0.33's `HiSparseHotSpec` and
//! `HiSparseResidentSpec`): opaque pages of `page_size` bytes, never prefix cached. Their
//! per-request block counts are the HiSparse rules of `src/attention/hisparse.rs`.

/// A request's ephemeral hot-cache region: `blocks_per_request` blocks, allocated once the
/// request reads host-backed history (vLLM's `HiSparseHotSpec`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HiSparseHotSpec {
    /// Tokens per block.
    pub block_size: usize,
    /// Bytes of one page.
    pub page_size: usize,
    /// Blocks of a request's hot region.
    pub blocks_per_request: usize,
}

/// Reclaimable GPU-resident pages of host-backed KV (vLLM's `HiSparseResidentSpec`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HiSparseResidentSpec {
    /// Tokens per block.
    pub block_size: usize,
    /// Bytes of one page.
    pub page_size: usize,
}
