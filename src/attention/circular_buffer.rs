//! Circular buffers (vLLM 0.33's `CircularBufferManager`): one ring block per request,
//! claimed on its first allocation and held until it ends; never prefix cached, so the
//! group takes no part in hits, caching or the hash block size.

use super::RequestBlocks;
use crate::error::Result;
use crate::pool::BlockPool;

/// The most blocks one request holds: its ring.
pub(crate) const MAX_BLOCKS_PER_REQUEST: usize = 1;

/// Blocks an allocation takes: the ring, if the request has none yet.
#[inline]
pub(crate) fn num_blocks_to_allocate(rb: &RequestBlocks) -> isize {
    isize::from(rb.table.is_empty())
}

/// Claims the request's ring block, if it has none yet (for new and for KV-connector
/// tokens alike).
pub(crate) fn claim_ring_block(rb: &mut RequestBlocks, pool: &mut BlockPool) -> Result<()> {
    if rb.table.is_empty() {
        pool.get_new_blocks_into(MAX_BLOCKS_PER_REQUEST, &mut rb.table)?;
    }
    Ok(())
}
