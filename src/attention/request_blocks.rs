//! [`RequestBlocks`]: one request's block table in one group.

use super::{hisparse::HiSparseRow, mamba};
use crate::types::BlockId;

/// One request's table in one group (vLLM's `req_to_blocks[rid]` and
/// `num_cached_block[rid]`).
///
/// NOTE 1: `table` is position-indexed: entry `i` holds tokens `[i*bs, (i+1)*bs)`, and
/// skipped positions hold the null block.
/// NOTE 2: `num_cached` is `Some` once the request is "known" to the group (a prefix hit
/// was added, or `cache_blocks` cached something); it counts leading table entries that
/// are cached, nulls included.
#[derive(Debug, Clone, Default)]
pub struct RequestBlocks {
    /// The block table.
    pub table: Vec<BlockId>,
    /// Leading cached entries, if the request is known.
    pub num_cached: Option<usize>,
    /// A partial prefix hit still to be copied on write: the table index of the shared
    /// tail block and that block (vLLM's `_partial_hit_reqs`).
    pub partial_hit: Option<(usize, BlockId)>,
    /// Align-mode Mamba bookkeeping (unused by other types).
    pub mamba: mamba::MambaState,
    /// HiSparse resident and hot groups' state (unused by other types).
    pub hisparse: HiSparseRow,
}

impl RequestBlocks {
    /// Forgets the request, keeping the table's capacity.
    pub fn clear(&mut self) {
        self.table.clear();
        self.num_cached = None;
        self.partial_hit = None;
        self.mamba = mamba::MambaState::default();
        self.hisparse = HiSparseRow::default();
    }
}
