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

#[cfg(test)]
mod tests {
    use crate::events::event::TokensOnly;
    use crate::pool::BlockPool;
    use crate::types::{BlockHash, NULL_BLOCK_ID};

    fn hash(n: u8) -> BlockHash {
        BlockHash::from_slice(&[n; 32]).unwrap()
    }

    #[test]
    fn move_block_hashes_moves_every_key_and_retain_counts() {
        let mut pool = BlockPool::new(6, true, 16, false).unwrap();
        let blocks = pool.get_new_blocks(2).unwrap();
        let (src, dst) = (blocks[0], blocks[1]);
        let hashes = [hash(1), hash(2)];
        pool.cache_partial_block(&hashes, src, 32, 0, &TokensOnly(&[]))
            .unwrap();
        pool.cache_partial_block(&hashes, src, 16, 0, &TokensOnly(&[]))
            .unwrap();
        pool.move_block_hashes(src, dst).unwrap();
        assert_eq!(pool.cached_block(&hash(2), 0), Some(dst));
        assert_eq!(pool.cached_block(&hash(1), 0), Some(dst));
        assert_eq!(pool.block_hash(src).unwrap(), None);
        assert_eq!(pool.block_hash_num_tokens(dst).unwrap(), Some(32));
        assert!(
            pool.move_block_hashes(src, dst).is_err(),
            "dst is cached now"
        );
        pool.retain(dst).unwrap();
        assert_eq!(pool.ref_cnt(dst).unwrap(), 2);
        assert!(pool.retain(NULL_BLOCK_ID).is_err());
    }
}
