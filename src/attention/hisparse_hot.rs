//! HiSparse hot groups (vLLM 0.33's `HiSparseHotManager`): a fixed region of
//! `blocks_per_request` blocks, allocated only for a request that reads host-backed
//! history (it imports, resumes a host prefix, or was asked to: `hot_required`). Never
//! prefix cached.

use super::RequestBlocks;
use crate::error::Result;
use crate::pool::BlockPool;

/// The most blocks one request holds: its region.
#[inline]
pub(crate) fn max_blocks_per_request(blocks_per_request: usize) -> usize {
    blocks_per_request
}

/// Blocks an allocation takes (vLLM's `HiSparseHotManager.get_num_blocks_to_allocate`):
/// the rest of the region for a request that imports (`total_computed` past
/// `local_computed`), resumes a host prefix as a new request, or needs its region; none
/// otherwise.
pub(crate) fn num_blocks_to_allocate(
    rb: &RequestBlocks,
    blocks_per_request: usize,
    total_computed: usize,
    local_computed: usize,
) -> isize {
    let imports = total_computed > local_computed;
    let resumes_host_prefix = local_computed > 0 && rb.num_cached.is_none();
    if imports || resumes_host_prefix || rb.hisparse.hot_required {
        blocks_per_request.saturating_sub(rb.table.len()) as isize
    } else {
        0
    }
}

/// A new request's prefix hit: it needs its region if the hit is on the host, or if the
/// model keeps every page on the host (`always_hot`: no resident groups) (vLLM's
/// `add_local_computed_blocks`).
pub(crate) fn add_local_computed(rb: &mut RequestBlocks, local_computed: usize, always_hot: bool) {
    rb.num_cached = Some(0);
    if local_computed > 0 || always_hot {
        rb.hisparse.hot_required = true;
    }
}

/// Whether the request holds its whole region (vLLM's `has_hot`).
pub fn has_hot(rb: &RequestBlocks, blocks_per_request: usize) -> bool {
    rb.table.len() == blocks_per_request
}

/// Fills the request's region if it needs one (vLLM's `allocate_new_blocks`).
pub(crate) fn allocate(
    rb: &mut RequestBlocks,
    blocks_per_request: usize,
    pool: &mut BlockPool,
) -> Result<()> {
    // A cold admission can skip `add_local_computed`.
    rb.num_cached = Some(0);
    if !rb.hisparse.hot_required || rb.table.len() >= blocks_per_request {
        return Ok(());
    }
    pool.get_new_blocks_into(blocks_per_request - rb.table.len(), &mut rb.table)
}
