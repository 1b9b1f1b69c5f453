//! The pool's part in vLLM 0.33's copy-on-write of a partial prefix-cache hit: a
//! reference held for a pending copy, and cache entries that move to the copy.

use super::BlockPool;
use crate::error::{KvError, Result};
use crate::types::{BlockId, NULL_BLOCK_ID};

impl BlockPool {
    /// Takes one more reference on `block`, which a request already holds (vLLM's
    /// `ref_cnt += 1` on a copy endpoint: it stays out of the free queue until the
    /// scheduler frees it once the copy has run).
    pub fn retain(&mut self, block: BlockId) -> Result<()> {
        self.check_id(block)?;
        if block == NULL_BLOCK_ID || self.ref_cnt[block as usize] == 0 {
            return Err(KvError::InvalidArgument(format!(
                "block {block} must be held by a request to be retained for a copy"
            )));
        }
        self.ref_cnt[block as usize] += 1;
        Ok(())
    }

    /// vLLM's `move_block_hashes`: every cache entry of `src` now points to `dst` (an
    /// uncached block), primary key first, with `src`'s token count; no events.
    pub fn move_block_hashes(&mut self, src: BlockId, dst: BlockId) -> Result<()> {
        self.check_id(src)?;
        self.check_id(dst)?;
        if self.hash_of[dst as usize].is_some() {
            return Err(KvError::InvalidArgument(format!(
                "block {dst} is cached: cache entries cannot move onto it"
            )));
        }
        let Some(primary) = self.hash_of[src as usize].take() else {
            return Ok(());
        };
        let extra = self.secondary.remove(&src).unwrap_or_default();
        self.map.pop(&primary, src);
        self.map.insert(primary, dst);
        self.hash_of[dst as usize] = Some(primary);
        self.hash_tokens[dst as usize] = self.hash_tokens[src as usize];
        for &key in &extra {
            self.map.pop(&key, src);
            self.map.insert(key, dst);
        }
        if !extra.is_empty() {
            self.secondary.insert(dst, extra);
        }
        if self.pins.holds(src) {
            self.release_pin(src);
            self.hold_for_pin(dst);
        }
        Ok(())
    }
}
