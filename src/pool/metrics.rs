//! The pool's record of what vLLM 0.33's `BlockPool` reports to a KV cache metrics
//! collector (`KVCacheMetricsCollector`): each block handed out (after its eviction when
//! caching is on), each block touched by a hit (the null block excepted) and each block
//! named to `evict_blocks`, in the order vLLM makes the calls. Kept only while a
//! collector is attached (`BlockPool::record_block_metrics`); a pool without one does no
//! work for it.

use crate::types::{BlockId, NULL_BLOCK_ID};

/// One collector call of vLLM's `BlockPool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum BlockMetricsOp {
    /// `on_block_allocated`: `get_new_blocks` handed the block out.
    Allocated = 0,
    /// `on_block_accessed`: `touch` took a reference on the block.
    Accessed = 1,
    /// `on_block_evicted`: the block's cache entry (if any) was dropped.
    Evicted = 2,
}

/// The recorded calls, oldest first.
#[derive(Debug, Clone, Default)]
pub struct BlockMetricsLog {
    ops: Vec<(BlockMetricsOp, BlockId)>,
}

impl BlockMetricsLog {
    /// Blocks handed out by `get_new_blocks`, in queue order: with caching on, vLLM
    /// evicts each (reporting it) before counting its allocation.
    #[cold]
    #[inline(never)]
    pub(super) fn allocated(&mut self, blocks: &[BlockId], enable_caching: bool) {
        for &b in blocks {
            if enable_caching {
                self.ops.push((BlockMetricsOp::Evicted, b));
            }
            self.ops.push((BlockMetricsOp::Allocated, b));
        }
    }

    /// Blocks touched by a hit; vLLM skips the null block.
    #[cold]
    #[inline(never)]
    pub(super) fn accessed(&mut self, blocks: &[BlockId]) {
        let real = blocks.iter().filter(|&&b| b != NULL_BLOCK_ID);
        self.ops
            .extend(real.map(|&b| (BlockMetricsOp::Accessed, b)));
    }

    /// Blocks named to `evict_blocks`, cached or not.
    #[cold]
    #[inline(never)]
    pub(super) fn evicted(&mut self, blocks: &[BlockId]) {
        self.ops
            .extend(blocks.iter().map(|&b| (BlockMetricsOp::Evicted, b)));
    }

    /// Returns and clears the recorded calls.
    pub fn take(&mut self) -> Vec<(BlockMetricsOp, BlockId)> {
        std::mem::take(&mut self.ops)
    }
}
