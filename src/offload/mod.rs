//! The host-memory (CPU offload) tier: vLLM 0.33's `CPUOffloadingManager` and its cache
//! policies `lru` and `arc`, with vLLM's decisions exactly, and kvblocks' retention as a
//! further order over the same chunks (docs/offload.md).
//!
//! A key is vLLM's `OffloadKey`: a block hash followed by its KV cache group index as 4
//! big-endian bytes. A [`Policy`] owns the chunks of the keys it holds (vLLM's
//! `CachePolicy`); the [`OffloadManager`] owns the chunk pool, reference counts, request
//! access records and events (vLLM's `CPUOffloadingManager`).

use std::sync::Arc;

use rustc_hash::FxHashSet;

use crate::error::{KvError, Result};

mod arc;
mod linked;
mod lru;
mod manager;
mod ranks;
mod retention;

pub use arc::Arc as ArcPolicy;
pub use linked::LinkedMap;
pub use lru::Lru;
pub use manager::{LookupResult, OffloadEvent, OffloadManager, StoreOutput};
pub use retention::RetentionOrder;

/// An offload key (vLLM's `OffloadKey` bytes), shared between the structures that hold it.
pub type Key = Arc<[u8]>;

/// A recency rank: (request or global rank, minus the key's end-token position).
pub type Rank = (i64, i64);

/// One chunk slot of the host tier (vLLM's `ChunkStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Index of the host buffer slot.
    pub id: u32,
    /// Transfers reading the chunk; -1 while its store is in flight (not ready).
    pub ref_cnt: i32,
}

impl Chunk {
    /// A chunk whose store has just been prepared (not ready).
    pub fn pending(id: u32) -> Self {
        Self { id, ref_cnt: -1 }
    }

    /// Whether the chunk can be read.
    pub fn is_ready(&self) -> bool {
        self.ref_cnt >= 0
    }
}

/// What a request carries into a policy: its rank for the current cache generation, and
/// the retention hints its chunks are stored under.
#[derive(Debug, Clone, Default)]
pub struct ReqState {
    /// (policy generation, rank) of the request's shared recency rank, once assigned.
    pub rank: Option<(u64, i64)>,
    /// vLLM request priority (mapped to a class by a retention order).
    pub priority: i64,
    /// The request's tenant (counted against a retention quota).
    pub tenant: Option<String>,
}

/// A cache policy over the host tier's chunks: vLLM's `CachePolicy` interface.
///
/// `positions` are the end-token positions of `keys` in the request (vLLM's
/// `ReqContext.get_offload_key_position`), one per key.
pub trait Policy: Send + Sync {
    /// The chunk of `key`, if the policy holds it.
    fn get(&self, key: &[u8]) -> Option<&Chunk>;
    /// The chunk of `key`, to change its reference count.
    fn get_mut(&mut self, key: &[u8]) -> Option<&mut Chunk>;
    /// Adds a newly allocated chunk stored by `req`.
    fn insert(&mut self, key: Key, chunk: Chunk, position: Option<i64>, req: &mut ReqState);
    /// Drops a chunk whose store failed.
    fn remove(&mut self, key: &[u8]);
    /// Marks `keys` recently used.
    fn touch(&mut self, keys: &[Key]);
    /// Observes store misses before their chunks are inserted (default: a touch).
    fn on_store_miss(&mut self, keys: &[Key]) {
        self.touch(keys);
    }
    /// Observes a request's first accesses to `keys`.
    fn on_request_access(
        &mut self,
        _keys: &[Key],
        _positions: &[Option<i64>],
        _req: &mut ReqState,
    ) {
    }
    /// Applies a finished request's accesses, `ordered` head to tail (default: a touch of
    /// them all, tail first, for policies that do not tell insertion from reuse).
    fn on_request_finished(
        &mut self,
        ordered: &[Key],
        _insertion_only: &FxHashSet<Key>,
        _reused: &FxHashSet<Key>,
    ) {
        self.touch(ordered);
    }
    /// Evicts exactly `n` idle chunks not in `protected`, or nothing (`None`).
    fn evict(&mut self, n: usize, protected: &FxHashSet<Key>) -> Option<Vec<(Key, Chunk)>>;
    /// Drops every chunk and all adaptive state.
    fn clear(&mut self);
    /// The chunk's reference count went to 0.
    fn mark_evictable(&mut self, _key: &[u8]) {}
    /// The chunk's reference count left 0.
    fn mark_non_evictable(&mut self, _key: &[u8]) {}
    /// Keeps `key` from eviction until as many `unpin`s (retention orders only).
    fn pin(&mut self, _key: Key) -> Result<()> {
        Err(KvError::Unsupported(
            "pins need the kvblocks retention order".into(),
        ))
    }
    /// Drops one pin of `key`.
    fn unpin(&mut self, _key: &[u8]) -> Result<()> {
        Err(KvError::Unsupported(
            "pins need the kvblocks retention order".into(),
        ))
    }
    /// The policy's ordered lists by name, oldest first (ARC: `t1`, `t2`, `b1`, `b2`).
    fn lists(&self) -> Vec<(&'static str, Vec<Key>)> {
        Vec::new()
    }
    /// The entries of a lazy eviction heap, stale ones included (LRU).
    fn heap(&self) -> Vec<(Rank, Key)> {
        Vec::new()
    }
    /// ARC's adaptive target size of T1.
    fn target_t1(&self) -> Option<f64> {
        None
    }
    /// Sets ARC's target size of T1.
    fn set_target_t1(&mut self, _target: f64) -> Result<()> {
        Err(KvError::Unsupported(
            "only ARC has a target size of T1".into(),
        ))
    }
    /// The generation of request ranks (it changes on `clear`).
    fn generation(&self) -> u64 {
        0
    }
}

/// The policies by name.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyKind {
    /// vLLM's `lru`.
    Lru,
    /// vLLM's `arc`.
    Arc,
    /// kvblocks' retention order (priority classes, tenant quotas, pins) over LRU ranks.
    Retention(crate::pool::RetentionPolicy),
}

impl PolicyKind {
    /// A new policy of this kind over `capacity` chunks.
    pub fn build(&self, capacity: usize) -> Result<Box<dyn Policy>> {
        Ok(match self {
            Self::Lru => Box::new(Lru::default()),
            Self::Arc => Box::new(ArcPolicy::new(capacity)),
            Self::Retention(p) => Box::new(RetentionOrder::new(p.clone())?),
        })
    }
}

/// Follows a reference-count transition that an outside manager made (vLLM's manager
/// changes `ChunkStatus.ref_cnt` itself and calls `mark_evictable` when it reaches 0 and
/// `mark_non_evictable` when it leaves 0): the policy's chunk takes 0, or 1 for "read in
/// flight", and the policy hears of it. A key the policy does not hold is ignored.
pub fn follow_ref_cnt(policy: &mut dyn Policy, key: &[u8], evictable: bool) {
    let Some(chunk) = policy.get_mut(key) else {
        return;
    };
    chunk.ref_cnt = i32::from(!evictable);
    if evictable {
        policy.mark_evictable(key);
    } else {
        policy.mark_non_evictable(key);
    }
}

/// The KV cache group of a key (its last 4 bytes, big-endian).
pub fn group_of(key: &[u8]) -> Result<u32> {
    let n = key.len();
    if n < 4 {
        return Err(KvError::InvalidArgument(format!(
            "an offload key ends with a 4-byte group index; got {n} bytes"
        )));
    }
    Ok(u32::from_be_bytes([
        key[n - 4],
        key[n - 3],
        key[n - 2],
        key[n - 1],
    ]))
}

/// One head-to-tail order: `keys` sorted by position (stably) when every key has one,
/// else as given (vLLM's `order_request_keys`).
pub fn order_by_position(keys: &mut [Key], positions: &[Option<i64>]) {
    if positions.iter().all(Option::is_some) {
        let mut idx: Vec<usize> = (0..keys.len()).collect();
        idx.sort_by_key(|&i| positions[i]);
        let sorted: Vec<Key> = idx.iter().map(|&i| keys[i].clone()).collect();
        keys.clone_from_slice(&sorted);
    }
}

#[cfg(test)]
mod tests;
