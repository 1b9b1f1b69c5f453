//! The manager's side of retention (docs/retention.md): a policy on its pool, each
//! request's free tag, pins by request, and the clock. The rules themselves are the
//! pool's (`pool/retention.rs`, `pool/pins.rs`).

use super::KvCacheManager;
use crate::attention::RequestView;
use crate::error::Result;
use crate::hashing::BlockHashView;
use crate::pool::{HashKey, RetentionPolicy};
use crate::types::BlockHash;

impl KvCacheManager {
    /// Sets a retention policy on a manager that has not allocated yet. Every group's
    /// blocks then follow it, under the tag of the request that frees them.
    pub fn set_retention(&mut self, policy: RetentionPolicy) -> Result<()> {
        self.coord.pool_mut().set_retention(policy)?;
        self.retention_on = true;
        Ok(())
    }

    /// The policy, if one is set.
    pub fn retention_policy(&self) -> Option<&RetentionPolicy> {
        self.coord.pool().retention_policy()
    }

    /// The request's tag, read from it when it first gets a slot.
    pub(super) fn assign_free_tag<R: RequestView>(&mut self, request: &R, slot: usize) {
        if !self.retention_on {
            return;
        }
        let hints = request.retention_hints();
        let tag = self.coord.pool_mut().free_tag_for(&hints);
        if let Some(tag) = tag {
            if self.slot_tag.len() <= slot {
                self.slot_tag.resize(slot + 1, tag);
            }
            self.slot_tag[slot] = tag;
            self.coord.pool_mut().set_free_tag(tag);
        }
    }

    /// Makes the pool's next frees carry the tag of the request in `slot`.
    #[inline]
    pub(super) fn set_free_tag_of_slot(&mut self, slot: usize) {
        if self.retention_on {
            let tag = self.slot_tag[slot];
            self.coord.pool_mut().set_free_tag(tag);
        }
    }

    /// The prefix keys of the first `num_tokens` tokens' full blocks, in every
    /// prefix-cached group, from hashes at the manager's hash block size.
    fn prefix_keys(&self, hashes: &[BlockHash], num_tokens: usize) -> Vec<HashKey> {
        let hash_block_size = self.coord.pool().hash_block_size();
        let mut keys = Vec::new();
        for m in self.coord.managers() {
            if !m.params().caches_prefix() {
                continue;
            }
            let view = BlockHashView::scaled(hashes, m.block_size() / hash_block_size);
            let full = (num_tokens / m.block_size()).min(view.len());
            keys.extend(view.iter().take(full).map(|&hash| HashKey {
                hash,
                group: m.group(),
            }));
        }
        keys
    }

    /// Pins the cached blocks of the request's full prompt blocks, in every group, for
    /// as long as the pin holds (blocks cached later under those keys included).
    pub fn pin<R: RequestView>(&mut self, request: &R) {
        let keys = self.prefix_keys(request.block_hashes(), request.num_prompt_tokens());
        self.coord.pool_mut().pin(&keys);
    }

    /// Drops the pin [`pin`](Self::pin) took for the request; a `NotPinned` error (and
    /// no change) if it holds none.
    pub fn unpin<R: RequestView>(&mut self, request: &R) -> Result<()> {
        let keys = self.prefix_keys(request.block_hashes(), request.num_prompt_tokens());
        self.coord.pool_mut().unpin(&keys)
    }

    /// [`pin`](Self::pin) for the prefix the hashes name (at the hash block size).
    pub fn pin_hashes(&mut self, hashes: &[BlockHash]) {
        let tokens = hashes.len() * self.coord.pool().hash_block_size();
        let keys = self.prefix_keys(hashes, tokens);
        self.coord.pool_mut().pin(&keys);
    }

    /// [`unpin`](Self::unpin) for the prefix the hashes name.
    pub fn unpin_hashes(&mut self, hashes: &[BlockHash]) -> Result<()> {
        let tokens = hashes.len() * self.coord.pool().hash_block_size();
        let keys = self.prefix_keys(hashes, tokens);
        self.coord.pool_mut().unpin(&keys)
    }

    /// Advances the clock (seconds, or a step counter); see the pool's `advance_time`.
    pub fn advance_time(&mut self, now: f64) -> Result<()> {
        self.coord.pool_mut().advance_time(now)
    }

    /// The clock.
    pub fn now(&self) -> f64 {
        self.coord.pool().now()
    }
}
