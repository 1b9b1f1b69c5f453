//! vLLM 0.33's reuse watchers (`BlockPool.unpin_blocks`): blocks whose reference was
//! dropped while their owner still reads them. They count as free, and the owner learns
//! when the pool lets them go: `get_new_blocks` handing one out, or `reset_prefix_cache`
//! clearing the cache (every watched block then). vLLM calls a callback there and then;
//! kvblocks reports the block ids in the same order, for the caller to drain
//! ([`BlockPool::take_reused_watched`](super::BlockPool::take_reused_watched)).

use rustc_hash::FxHashMap;

use crate::types::BlockId;

/// The watched blocks and the reports not yet taken.
#[derive(Debug, Clone, Default)]
pub(super) struct ReuseWatch {
    /// Watched block -> when it was first watched. vLLM keeps its watchers in a dict:
    /// watching a block again keeps its place, and a reset reports in that order.
    watched: FxHashMap<BlockId, u64>,
    next: u64,
    /// Watched blocks the pool let go, in report order.
    reused: Vec<BlockId>,
}

impl ReuseWatch {
    /// Watches `block` (a block already watched keeps its place).
    pub(super) fn watch(&mut self, block: BlockId) {
        let next = &mut self.next;
        self.watched.entry(block).or_insert_with(|| {
            *next += 1;
            *next
        });
    }

    /// Whether no block is watched (the pool's allocation then skips the report).
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.watched.is_empty()
    }

    /// Reports the watched blocks among `handed_out`, in its order, and stops watching
    /// them.
    pub(super) fn report_handed_out(&mut self, handed_out: &[BlockId]) {
        for &b in handed_out {
            if self.watched.remove(&b).is_some() {
                self.reused.push(b);
            }
        }
    }

    /// Reports every watched block, in the order each was first watched, and stops
    /// watching them (a prefix-cache reset).
    pub(super) fn report_all(&mut self) {
        let mut all: Vec<(BlockId, u64)> = self.watched.drain().collect();
        all.sort_unstable_by_key(|&(_, since)| since);
        self.reused.extend(all.into_iter().map(|(b, _)| b));
    }

    /// Returns and clears the reports.
    pub(super) fn take_reused(&mut self) -> Vec<BlockId> {
        std::mem::take(&mut self.reused)
    }
}

#[cfg(test)]
mod tests {
    use crate::error::KvError;
    use crate::pool::{BlockPool, RetentionPolicy};
    use crate::types::BlockId;

    fn queue(p: &BlockPool) -> Vec<BlockId> {
        p.free_block_ids().collect()
    }

    // The expected orders below are vLLM 0.33.0's `BlockPool` on the same calls
    // (`unpin_blocks` with a callback recording the block ids); tests/vllm/
    // test_vllm_block_pool.py compares both pools' `unpin_blocks` on random call
    // sequences.

    #[test]
    fn released_blocks_join_the_tail_and_report_when_handed_out() {
        let mut p = BlockPool::new(6, true, 16, false).unwrap();
        let b = p.get_new_blocks(5).unwrap();
        assert_eq!(b, vec![1, 2, 3, 4, 5]);
        p.touch(&[2]).unwrap();
        p.release_watched(&[4, 2, 1]).unwrap();
        assert_eq!(queue(&p), vec![4, 1]);
        assert_eq!(p.ref_cnt(2).unwrap(), 1);
        assert_eq!(p.num_free_blocks(), 2);
        p.free_blocks([5, 3]).unwrap();
        assert_eq!(queue(&p), vec![5, 3, 4, 1]);
        let got = p.get_new_blocks(2).unwrap();
        assert_eq!(got, vec![5, 3]);
        assert!(p.take_reused_watched().is_empty());
        p.free_blocks(got.iter().copied()).unwrap();
        p.release_watched(&[2]).unwrap();
        assert_eq!(queue(&p), vec![5, 3, 4, 1, 2]);
        assert_eq!(p.get_new_blocks(4).unwrap(), vec![5, 3, 4, 1]);
        assert_eq!(p.take_reused_watched(), vec![4, 1]);
        assert!(p.take_reused_watched().is_empty());
        // Block 2 is still watched; handed out, it reports once.
        p.free_blocks([1]).unwrap();
        assert_eq!(p.get_new_blocks(2).unwrap(), vec![1, 2]);
        assert_eq!(p.take_reused_watched(), vec![2]);
        p.check_invariants().unwrap();
    }

    #[test]
    fn a_reset_reports_every_watched_block_in_first_watched_order() {
        let mut p = BlockPool::new(6, true, 16, true).unwrap();
        p.get_new_blocks(5).unwrap();
        p.release_watched(&[3]).unwrap();
        p.release_watched(&[1, 4]).unwrap();
        // Held again and released again: block 3 keeps its place among the watched
        // (first, though its id is neither the lowest nor the highest).
        p.touch(&[3]).unwrap();
        p.release_watched(&[3]).unwrap();
        assert_eq!(queue(&p), vec![1, 4, 3]);
        p.free_blocks([2, 5]).unwrap();
        assert!(p.reset_prefix_cache());
        assert_eq!(p.take_reused_watched(), vec![3, 1, 4]);
        assert_eq!(queue(&p), vec![2, 5, 1, 4, 3]);
        // Nothing is watched after the reset.
        p.get_new_blocks(5).unwrap();
        assert!(p.take_reused_watched().is_empty());
    }

    #[test]
    fn a_failed_reset_reports_nothing() {
        let mut p = BlockPool::new(4, true, 16, false).unwrap();
        p.get_new_blocks(2).unwrap();
        p.release_watched(&[1]).unwrap();
        assert!(!p.reset_prefix_cache());
        assert!(p.take_reused_watched().is_empty());
    }

    #[test]
    fn a_released_cached_block_stays_cached_until_handed_out() {
        let mut p = BlockPool::new(4, true, 16, false).unwrap();
        let b = p.get_new_blocks(3).unwrap();
        let h = crate::types::BlockHash::from_slice(&[7; 32]).unwrap();
        let tokens = crate::events::event::TokensOnly(&[]);
        p.cache_full_blocks(&[h], &b, 0, 1, 16, 0, None, &tokens)
            .unwrap();
        p.release_watched(&[1]).unwrap();
        assert_eq!(p.cached_block(&h, 0), Some(1));
        p.touch(&[1]).unwrap();
        assert!(p.take_reused_watched().is_empty());
        p.free_blocks([1]).unwrap();
        assert_eq!(p.get_new_blocks(1).unwrap(), vec![1]);
        assert_eq!(p.cached_block(&h, 0), None);
        assert_eq!(p.take_reused_watched(), vec![1]);
    }

    #[test]
    fn bad_input_changes_nothing() {
        let mut p = BlockPool::new(5, true, 16, false).unwrap();
        p.get_new_blocks(2).unwrap();
        let before = (queue(&p), p.ref_cnt(1).unwrap(), p.ref_cnt(2).unwrap());
        assert!(matches!(
            p.release_watched(&[1, 0]),
            Err(KvError::InvalidArgument(_))
        ));
        assert!(matches!(
            p.release_watched(&[2, 9]),
            Err(KvError::BlockOutOfRange { .. })
        ));
        assert_eq!(p.release_watched(&[1, 2, 1]), Err(KvError::DoubleFree(1)));
        assert_eq!(p.release_watched(&[3]), Err(KvError::DoubleFree(3)));
        let after = (queue(&p), p.ref_cnt(1).unwrap(), p.ref_cnt(2).unwrap());
        assert_eq!(before, after);
        // Nothing was watched by the failed calls.
        p.free_blocks([1, 2]).unwrap();
        p.get_new_blocks(4).unwrap();
        assert!(p.take_reused_watched().is_empty());
        p.check_invariants().unwrap();

        let mut kept = BlockPool::new(5, true, 16, false).unwrap();
        kept.set_retention(RetentionPolicy::default()).unwrap();
        kept.get_new_blocks(1).unwrap();
        assert!(matches!(
            kept.release_watched(&[1]),
            Err(KvError::Unsupported(_))
        ));
        assert_eq!(kept.ref_cnt(1).unwrap(), 1);
    }
}
