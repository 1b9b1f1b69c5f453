//! vLLM's `KVCacheBlocks.get_unhashed_block_ids` and `get_unhashed_block_ids_all_groups`:
//! the blocks of a lookup or allocation result that are not cached. Both releases keep
//! null blocks in the one-group form and drop them in the all-groups form.

use super::BlockPool;
use crate::error::Result;
use crate::types::{BlockId, NULL_BLOCK_ID};

impl BlockPool {
    /// The ids of one group's blocks that carry no hash, null blocks included.
    ///
    /// # Errors
    ///
    /// [`KvError::BlockOutOfRange`](crate::KvError::BlockOutOfRange) for an id outside the pool.
    pub fn unhashed_block_ids(&self, ids: &[BlockId]) -> Result<Vec<BlockId>> {
        self.unhashed_of(ids, true)
    }

    /// Per group, the ids of the blocks that carry no hash, null blocks dropped.
    ///
    /// # Errors
    ///
    /// [`KvError::BlockOutOfRange`](crate::KvError::BlockOutOfRange) for an id outside the pool.
    pub fn unhashed_block_ids_all_groups(
        &self,
        groups: &[Vec<BlockId>],
    ) -> Result<Vec<Vec<BlockId>>> {
        groups.iter().map(|g| self.unhashed_of(g, false)).collect()
    }

    fn unhashed_of(&self, ids: &[BlockId], keep_null: bool) -> Result<Vec<BlockId>> {
        let mut out = Vec::new();
        for &b in ids.iter().filter(|&&b| keep_null || b != NULL_BLOCK_ID) {
            if self.block_hash(b)?.is_none() {
                out.push(b);
            }
        }
        Ok(out)
    }
}
