//! The block pool: blocks as rows addressed by `u32` ids, the LRU free queue and the
//! prefix cache map, with vLLM 0.33.0's exact ordering (docs/ARCHITECTURE.md, "Pool").
//!
//! ```
//! use kvblocks::pool::BlockPool;
//! let mut pool = BlockPool::new(8, true, 16, false).unwrap();
//! let blocks = pool.get_new_blocks(3).unwrap();
//! assert_eq!(blocks, vec![1, 2, 3]); // block 0 is the null block
//! pool.free_blocks(blocks.iter().rev().copied()).unwrap();
//! // unhashed blocks are prepended in the order given: LIFO reuse
//! assert_eq!(pool.free_block_ids().take(4).collect::<Vec<_>>(), vec![3, 2, 1, 4]);
//! ```

mod copy_on_write;
pub mod free_queue;
mod hash_lookahead;
mod id_set;
pub mod metrics;
pub mod null_block;
pub mod pins;
pub mod prefix_map;
pub mod retention;
mod reuse_watch;
mod unhashed;

use rustc_hash::FxHashMap;

use crate::attention::CachedBlocks;
use crate::error::{KvError, Result};
use crate::events::event::{
    BlockRemoved, BlockStored, KvCacheEvent, StoredBlockSource, MEDIA, MEDIUM_GPU,
};
use crate::hashing::BlockHashView;
use crate::types::{BlockHash, BlockId, GroupId, NULL_BLOCK_ID};
use free_queue::FreeQueue;
use hash_lookahead::HashLookahead;
use id_set::IdSet;
use metrics::BlockMetricsLog;
pub use metrics::BlockMetricsOp;
pub use null_block::NullBlockRefs;
use pins::Pins;
pub use prefix_map::HashKey;
use prefix_map::PrefixMap;
use retention::PolicyState;
pub use retention::{FreeTag, RetentionHints, RetentionPolicy};
use reuse_watch::ReuseWatch;

/// vLLM's `BlockPool`.
///
/// NOTE 1: `ref_cnt[b] == 0` iff block `b` is linked in the free queue, for every
/// non-null block. The null block (id 0) is popped at construction, never linked, and
/// `ref_cnt[0]` stays 0; its references are counted, if at all, in `null_refs`
/// (`null_block.rs`). A pin's hold is one reference (`pins.rs`).
/// NOTE 2: `hash_of[b]` is `Some(key)` iff the prefix map holds `b` under `key`; the
/// map holds `b` under other keys only if they are listed in `secondary[b]` (0.33
/// partial entries), and only while `hash_of[b]` is `Some`.
/// NOTE 3: every public mutator validates its whole input before changing anything, so
/// an error leaves the pool exactly as it was.
#[derive(Debug, Clone)]
pub struct BlockPool {
    enable_caching: bool,
    hash_block_size: usize,
    enable_events: bool,
    /// Tokens after each block that its hash covers (events publish them).
    lookahead: HashLookahead,
    ref_cnt: Vec<u32>,
    /// References to the null block, counted as vLLM 0.32 does or not at all (0.33).
    null_refs: NullBlockRefs,
    hash_of: Vec<Option<HashKey>>,
    /// Tokens the primary key of each cached block covers (vLLM's
    /// `block_hash_num_tokens`; less than a block for a partial entry).
    hash_tokens: Vec<u32>,
    /// Extra keys of blocks cached under more than one key (vLLM's
    /// `cached_block_hashes_by_block`): a partial entry added to an already cached block.
    secondary: FxHashMap<BlockId, Vec<HashKey>>,
    queue: FreeQueue,
    map: PrefixMap,
    events: Vec<KvCacheEvent>,
    /// Scratch lists reused by `free_blocks` (no allocation per call).
    to_front: Vec<BlockId>,
    to_back: Vec<BlockId>,
    /// `cache_full_blocks`' duplicate check.
    listed: IdSet,
    /// Pinned keys and the blocks they hold.
    pins: Pins,
    /// The retention policy's state; `None` keeps vLLM's single queue.
    retention: Option<Box<PolicyState>>,
    /// The caller's clock (`advance_time`).
    now: f64,
    /// Scratch list of quota evictions.
    over_quota: Vec<BlockId>,
    /// The calls vLLM's pool makes on a metrics collector, while one is attached.
    metrics: Option<Box<BlockMetricsLog>>,
    /// Blocks released by `release_watched` and still read by their owner.
    watch: ReuseWatch,
    /// The medium the pool's events name (vLLM's `medium`; a host pool's is `"CPU"`).
    medium: &'static str,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks (null block included), all free but the null block.
    pub fn new(
        num_blocks: usize,
        enable_caching: bool,
        hash_block_size: usize,
        enable_kv_cache_events: bool,
    ) -> Result<Self> {
        if num_blocks == 0 || num_blocks > (u32::MAX - 8) as usize {
            return Err(KvError::InvalidArgument(format!(
                "num_gpu_blocks must be in 1..={}, got {num_blocks}",
                u32::MAX - 8
            )));
        }
        if hash_block_size == 0 {
            return Err(KvError::InvalidArgument(
                "hash_block_size must be positive".into(),
            ));
        }
        // The largest arrays first, fallibly: an absurd pool size is an error, not an
        // allocation-failure abort (found by tests/core/test_no_panic.py).
        let hash_of = filled(num_blocks, None)?;
        let ref_cnt = filled(num_blocks, 0)?;
        let hash_tokens = filled(num_blocks, 0)?;
        let mut queue = FreeQueue::new(num_blocks);
        queue.popleft_n(1, |b| debug_assert_eq!(b, NULL_BLOCK_ID));
        Ok(Self {
            enable_caching,
            hash_block_size,
            enable_events: enable_kv_cache_events,
            lookahead: HashLookahead::default(),
            ref_cnt,
            null_refs: NullBlockRefs::default(),
            hash_of,
            hash_tokens,
            secondary: FxHashMap::default(),
            queue,
            map: PrefixMap::default(),
            events: Vec::new(),
            to_front: Vec::new(),
            to_back: Vec::new(),
            listed: IdSet::new(num_blocks),
            pins: Pins::default(),
            retention: None,
            now: 0.0,
            over_quota: Vec::new(),
            metrics: None,
            watch: ReuseWatch::default(),
            medium: MEDIUM_GPU,
        })
    }

    /// Total blocks, null block included.
    #[inline]
    pub fn num_blocks(&self) -> usize {
        self.ref_cnt.len()
    }

    /// Whether prefix caching is on.
    #[inline]
    pub fn enable_caching(&self) -> bool {
        self.enable_caching
    }

    /// Tokens per hash block (`request.block_hashes` granularity).
    #[inline]
    pub fn hash_block_size(&self) -> usize {
        self.hash_block_size
    }

    /// Whether events are recorded.
    #[inline]
    pub fn events_enabled(&self) -> bool {
        self.enable_events
    }

    /// Free blocks (the queue length).
    #[inline]
    pub fn num_free_blocks(&self) -> usize {
        self.queue.len()
    }

    /// `1 - free / (N - 1)`, or 0 for a pool of only the null block.
    pub fn usage(&self) -> f64 {
        let total = self.num_blocks() - 1;
        if total == 0 {
            0.0
        } else {
            1.0 - self.num_free_blocks() as f64 / total as f64
        }
    }

    /// The free queue from head (next to be allocated) to tail.
    pub fn free_block_ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.queue.iter()
    }

    #[inline]
    fn check_id(&self, block: BlockId) -> Result<()> {
        if (block as usize) < self.num_blocks() {
            Ok(())
        } else {
            Err(out_of_range(block.into(), self.num_blocks()))
        }
    }

    /// The ref count of `block`. The null block's is 0, or with
    /// [`set_count_null_block_refs`](Self::set_count_null_block_refs) what vLLM 0.32
    /// counts, which may be negative.
    pub fn ref_cnt(&self, block: BlockId) -> Result<i64> {
        self.check_id(block)?;
        if block == NULL_BLOCK_ID {
            return Ok(self.null_refs.get());
        }
        Ok(self.ref_cnt[block as usize].into())
    }

    /// Count references to the null block as vLLM 0.32 does (`null_block.rs`): `touch`
    /// and `free_blocks` count it up and down, and a request's table holds its null
    /// entries, so `free` and `pop_blocks_for_free` hand them over too. Off by default
    /// (vLLM 0.33). Set on a fresh pool; setting it restarts the count at 0.
    pub fn set_count_null_block_refs(&mut self, on: bool) {
        self.null_refs = NullBlockRefs::new(on);
    }

    /// Sets vLLM 0.33's `num_hash_lookahead_tokens`: each block's `BlockStored` entry
    /// then carries the tokens after it that its hash covers (`lookahead_token_ids`) and
    /// the extra keys of the block with them.
    pub fn set_num_hash_lookahead_tokens(&mut self, n: usize) {
        self.lookahead = HashLookahead(n);
    }

    /// vLLM 0.33's `num_hash_lookahead_tokens` (0 by default).
    #[inline]
    pub fn num_hash_lookahead_tokens(&self) -> usize {
        self.lookahead.0
    }

    /// Sets the medium the pool's `BlockStored` and `BlockRemoved` events name (vLLM's
    /// `BlockPool(medium=...)`): `"GPU"` (the default), `"CPU"` or `"STORAGE"`.
    pub fn set_medium(&mut self, medium: &str) -> Result<()> {
        self.medium = MEDIA.into_iter().find(|m| *m == medium).ok_or_else(|| {
            KvError::InvalidArgument(format!("medium must be one of {MEDIA:?}, got {medium:?}"))
        })?;
        Ok(())
    }

    /// The medium the pool's events name.
    #[inline]
    pub fn medium(&self) -> &'static str {
        self.medium
    }

    /// Whether references to the null block are counted (vLLM 0.32).
    #[inline]
    pub fn counts_null_block_refs(&self) -> bool {
        self.null_refs.counted()
    }

    /// The cache key of `block`, if it is cached.
    pub fn block_hash(&self, block: BlockId) -> Result<Option<HashKey>> {
        self.check_id(block)?;
        Ok(self.hash_of[block as usize])
    }

    /// The tokens the cache key of `block` covers (vLLM's `block_hash_num_tokens`), if
    /// it is cached.
    pub fn block_hash_num_tokens(&self, block: BlockId) -> Result<Option<usize>> {
        self.check_id(block)?;
        let i = block as usize;
        Ok(self.hash_of[i].map(|_| self.hash_tokens[i] as usize))
    }

    /// Number of distinct (hash, group) keys in the prefix cache.
    pub fn num_cached_keys(&self) -> usize {
        self.map.len()
    }

    /// Pops `n` blocks from the head of the free queue, evicting any cached hash they
    /// still carry, and returns them in queue order with ref count 1.
    pub fn get_new_blocks(&mut self, n: usize) -> Result<Vec<BlockId>> {
        let mut out = Vec::with_capacity(n);
        self.get_new_blocks_into(n, &mut out)?;
        Ok(out)
    }

    /// [`get_new_blocks`](Self::get_new_blocks), appending to `out` (no allocation when
    /// `out` has room).
    pub fn get_new_blocks_into(&mut self, n: usize, out: &mut Vec<BlockId>) -> Result<()> {
        if n > self.num_free_blocks() {
            return Err(KvError::OutOfBlocks {
                requested: n,
                available: self.num_free_blocks(),
            });
        }
        let start = out.len();
        out.reserve(n);
        let mut any_cached = false;
        // Slices, not the vectors: `out.push` then cannot alias their lengths and pointers.
        let (ref_cnt, hash_of) = (&mut self.ref_cnt[..], &self.hash_of[..]);
        let take = |b: BlockId| {
            debug_assert_eq!(ref_cnt[b as usize], 0);
            ref_cnt[b as usize] = 1;
            any_cached |= hash_of[b as usize].is_some();
            out.push(b);
        };
        match self.retention.as_deref_mut() {
            None => self.queue.popleft_n(n, take),
            Some(r) => {
                self.queue.popleft_n_lists(n, take);
                for &b in &out[start..] {
                    r.forget(b);
                }
            }
        }
        if !self.watch.is_empty() {
            self.watch.report_handed_out(&out[start..]);
        }
        // Only pools that hand out cached blocks pay for the second pass, which evicts
        // them in queue order (the order of their `BlockRemoved` events).
        if any_cached && self.enable_caching {
            for &b in &out[start..] {
                self.evict_hash(b);
            }
        }
        if let Some(log) = self.metrics.as_deref_mut() {
            log.allocated(&out[start..], self.enable_caching);
        }
        Ok(())
    }

    /// Drops `block`'s cache entry, if any, emitting `BlockRemoved`. The block does not
    /// move in the free queue.
    fn evict_hash(&mut self, block: BlockId) {
        let Some(key) = self.hash_of[block as usize].take() else {
            return;
        };
        self.remove_key(key, block);
        if let Some(extra) = self.secondary.remove(&block) {
            for key in extra {
                self.remove_key(key, block);
            }
        }
    }

    fn remove_key(&mut self, key: HashKey, block: BlockId) {
        let removed = self.map.pop(&key, block);
        debug_assert!(removed);
        if self.enable_events {
            self.events.push(KvCacheEvent::BlockRemoved(BlockRemoved {
                block_hashes: vec![key.hash.external()],
                medium: self.medium,
                group_idx: key.group,
            }));
        }
    }

    /// Takes a reference on each block (a prefix-cache hit), unlinking blocks with ref
    /// count 0 from the free queue. The null block is never linked; its references are
    /// counted only as `set_count_null_block_refs` says.
    pub fn touch(&mut self, blocks: &[BlockId]) -> Result<()> {
        for &b in blocks {
            self.check_id(b)?;
        }
        for &b in blocks {
            if b == NULL_BLOCK_ID {
                self.null_refs.add(1);
                continue;
            }
            if self.ref_cnt[b as usize] == 0 {
                self.unlink_free(b);
            }
            self.ref_cnt[b as usize] += 1;
        }
        if let Some(log) = self.metrics.as_deref_mut() {
            log.accessed(blocks);
        }
        Ok(())
    }

    /// Drops one reference on each block, in the given order (callers pass a request's
    /// table reversed). Blocks reaching 0 without a hash (or with caching off) are
    /// prepended to the queue as a group (LIFO reuse); hashed ones are appended (LRU),
    /// or linked as the free tag says under a retention policy.
    /// The null block is never linked; its references are counted only as
    /// `set_count_null_block_refs` says. Freeing a block whose count is already 0 is an
    /// error and changes nothing.
    pub fn free_blocks<I>(&mut self, blocks: I) -> Result<()>
    where
        I: IntoIterator<Item = BlockId> + Clone,
    {
        let n = self.num_blocks();
        let mut failure = None;
        let mut done = 0usize;
        let mut nulls = 0i64;
        // Fields borrowed apart and flags read once: the loop's stores then cannot alias
        // them, and the two scratch lists stay in place.
        let (ref_cnt, hash_of) = (&mut self.ref_cnt[..], &self.hash_of[..]);
        let (front, back) = (&mut self.to_front, &mut self.to_back);
        front.clear();
        back.clear();
        let caching = self.enable_caching;
        for b in blocks.clone() {
            if b as usize >= n {
                failure = Some(out_of_range(b.into(), n));
                break;
            }
            if b == NULL_BLOCK_ID {
                nulls += 1;
                done += 1;
                continue;
            }
            let rc = &mut ref_cnt[b as usize];
            if *rc == 0 {
                failure = Some(KvError::DoubleFree(b));
                break;
            }
            *rc -= 1;
            done += 1;
            if *rc == 0 {
                if caching && hash_of[b as usize].is_some() {
                    back.push(b);
                } else {
                    front.push(b);
                }
            }
        }
        if let Some(err) = failure {
            // Undo the decrements made before the bad id: nothing was linked yet.
            for b in blocks.into_iter().take(done) {
                if b != NULL_BLOCK_ID {
                    self.ref_cnt[b as usize] += 1;
                }
            }
            return Err(err);
        }
        self.null_refs.add(-nulls);
        self.queue.prepend_n(&self.to_front);
        if self.retention.is_none() {
            self.queue.append_n(&self.to_back);
        } else {
            let back = std::mem::take(&mut self.to_back);
            self.link_cached(&back);
            self.to_back = back;
        }
        Ok(())
    }

    /// Caches the request's newly full blocks `blocks[num_cached..num_full]` under the
    /// request's hashes, as vLLM's `cache_full_blocks`.
    ///
    /// `request_hashes` are all of the request's hashes at `hash_block_size`; a group whose
    /// `block_size` is `k` times larger uses the last hash inside each of its blocks.
    /// Null blocks and blocks whose `mask` entry is false are skipped. With events on,
    /// one `BlockStored` is recorded for the call.
    #[allow(clippy::too_many_arguments)]
    pub fn cache_full_blocks(
        &mut self,
        request_hashes: &[BlockHash],
        blocks: &[BlockId],
        num_cached: usize,
        num_full: usize,
        block_size: usize,
        group: GroupId,
        mask: Option<&[bool]>,
        source: &dyn StoredBlockSource,
    ) -> Result<()> {
        if num_cached >= num_full {
            return Ok(());
        }
        if block_size == 0 || !block_size.is_multiple_of(self.hash_block_size) {
            return Err(KvError::InvalidArgument(format!(
                "block_size {block_size} is not a positive multiple of hash_block_size {}",
                self.hash_block_size
            )));
        }
        let k = block_size / self.hash_block_size;
        if num_full > blocks.len() || num_full > request_hashes.len() / k {
            return Err(KvError::InvalidArgument(format!(
                "num_full_blocks {num_full} exceeds the request's {} blocks / {} full hashes",
                blocks.len(),
                request_hashes.len() / k
            )));
        }
        if let Some(m) = mask {
            if m.len() != num_full - num_cached {
                return Err(KvError::InvalidArgument(format!(
                    "block_mask has {} entries, expected {}",
                    m.len(),
                    num_full - num_cached
                )));
            }
        }
        let keep = |i: usize| mask.is_none_or(|m| m[i - num_cached]);
        for (i, &b) in blocks.iter().enumerate().take(num_full).skip(num_cached) {
            self.check_id(b)?;
            // A block is cached once, except a partial entry (ending inside the block)
            // promoted to a full one.
            let tokens = self.hash_tokens[b as usize] as usize;
            if b != NULL_BLOCK_ID
                && keep(i)
                && self.hash_of[b as usize].is_some()
                && (tokens.is_multiple_of(block_size) || tokens >= (i + 1) * block_size)
            {
                return Err(KvError::InvalidArgument(format!(
                    "block {b} is already cached; a block is cached once"
                )));
            }
        }
        // A block listed twice in the range would be cached under two keys while carrying
        // one, leaving a stale prefix entry (found by fuzzing): reject it.
        let listed = blocks
            .iter()
            .enumerate()
            .take(num_full)
            .skip(num_cached)
            .filter(|&(i, &b)| b != NULL_BLOCK_ID && keep(i))
            .map(|(_, &b)| b);
        if let Some(b) = self.listed.first_repeat(listed) {
            return Err(KvError::InvalidArgument(format!(
                "block {b} is listed twice; a block is cached once"
            )));
        }
        let view = BlockHashView::scaled(request_hashes, k);
        let hash_at = |i: usize| *view.at(i);
        let mut stored = Vec::new();
        for (i, &b) in blocks.iter().enumerate().take(num_full).skip(num_cached) {
            if b == NULL_BLOCK_ID || !keep(i) {
                continue;
            }
            let key = HashKey {
                hash: hash_at(i),
                group,
            };
            self.drop_cache_entry(b);
            self.hash_of[b as usize] = Some(key);
            self.hash_tokens[b as usize] = ((i + 1) * block_size) as u32;
            self.map.insert(key, b);
            if self.pins.is_pinned(&key) {
                self.hold_for_pin(b);
            }
            if self.enable_events {
                stored.push(i);
            }
        }
        if self.enable_events {
            let tokens = source.token_ids();
            let (start, end) = (num_cached * block_size, num_full * block_size);
            let token_ids = tokens[start.min(tokens.len())..end.min(tokens.len())].to_vec();
            let la = self.lookahead;
            let extra_keys: Vec<_> = stored
                .iter()
                .map(|&i| la.extra_keys(source, i * block_size, (i + 1) * block_size))
                .collect();
            self.events
                .push(KvCacheEvent::BlockStored(Box::new(BlockStored {
                    block_hashes: stored.iter().map(|&i| hash_at(i).external()).collect(),
                    parent_block_hash: (num_cached > 0).then(|| hash_at(num_cached - 1).external()),
                    token_ids,
                    block_size: block_size as u32,
                    lora_id: source.lora_id(),
                    medium: self.medium,
                    lora_name: source.lora_name().map(str::to_owned),
                    extra_keys: (!extra_keys.is_empty()).then_some(extra_keys),
                    group_idx: group,
                    kv_cache_spec_kind: None,
                    kv_cache_spec_sliding_window: None,
                    locality: None,
                    ownership: None,
                    session_id: source.session_id().map(str::to_owned),
                    lookahead_token_ids: la
                        .token_ids(source, stored.iter().map(|&i| (i + 1) * block_size)),
                })));
        }
        Ok(())
    }

    /// Registers the prefix of `num_tokens` tokens (a multiple of `hash_block_size`
    /// inside `block`) as a partial prefix-cache entry owned by `block`, as vLLM 0.33's
    /// `cache_partial_block`: the key is the request's hash at that boundary. It becomes
    /// the block's primary key if the block has none (a shorter primary is replaced), or
    /// an extra key otherwise. With events on, a `BlockStored` of one hash-block is
    /// recorded unless the entry already existed.
    pub fn cache_partial_block(
        &mut self,
        request_hashes: &[BlockHash],
        block: BlockId,
        num_tokens: usize,
        group: GroupId,
        source: &dyn StoredBlockSource,
    ) -> Result<()> {
        self.check_id(block)?;
        let h = self.hash_block_size;
        let n = num_tokens / h;
        if !num_tokens.is_multiple_of(h) || n == 0 || n > request_hashes.len() {
            return Err(KvError::InvalidArgument(format!(
                "partial entry of {num_tokens} tokens does not fit {} hashes of {h} tokens",
                request_hashes.len()
            )));
        }
        if block == NULL_BLOCK_ID {
            return Ok(());
        }
        let key = HashKey {
            hash: request_hashes[n - 1],
            group,
        };
        let b = block as usize;
        let already = self.hash_of[b] == Some(key) || self.map.contains(&key, block);
        if !already {
            if self.hash_of[b].is_some() && (self.hash_tokens[b] as usize) < num_tokens {
                self.drop_cache_entry(block);
            }
            if self.hash_of[b].is_none() {
                self.hash_of[b] = Some(key);
                self.hash_tokens[b] = num_tokens as u32;
            } else {
                self.secondary.entry(block).or_default().push(key);
            }
            self.map.insert(key, block);
            if self.pins.is_pinned(&key) {
                self.hold_for_pin(block);
            }
        }
        if self.enable_events && !already {
            let start = (n - 1) * h;
            let tokens = source.token_ids();
            self.events
                .push(KvCacheEvent::BlockStored(Box::new(BlockStored {
                    block_hashes: vec![key.hash.external()],
                    parent_block_hash: (n > 1).then(|| request_hashes[n - 2].external()),
                    token_ids: tokens[start.min(tokens.len())..num_tokens.min(tokens.len())]
                        .to_vec(),
                    block_size: h as u32,
                    lora_id: source.lora_id(),
                    medium: self.medium,
                    lora_name: source.lora_name().map(str::to_owned),
                    extra_keys: Some(vec![self.lookahead.extra_keys(source, start, num_tokens)]),
                    group_idx: group,
                    kv_cache_spec_kind: None,
                    kv_cache_spec_sliding_window: None,
                    locality: None,
                    ownership: None,
                    session_id: source.session_id().map(str::to_owned),
                    lookahead_token_ids: self.lookahead.token_ids(source, [num_tokens]),
                })));
        }
        Ok(())
    }

    /// The cached block for `hash` in `group`, if any (first-inserted wins).
    #[inline]
    pub fn cached_block(&self, hash: &BlockHash, group: GroupId) -> Option<BlockId> {
        self.map.get_one(&HashKey { hash: *hash, group })
    }

    /// vLLM's `get_cached_block`: one block per group id, or `None` if any group misses.
    pub fn get_cached_block(&self, hash: &BlockHash, groups: &[GroupId]) -> Option<Vec<BlockId>> {
        CachedBlocks::get_cached_block(self, hash, groups)
    }

    /// Drops the cache entries of the given blocks (in the given order), emitting
    /// `BlockRemoved` for each. Blocks stay where they are (free or in use), as in
    /// vLLM; under a retention policy a free one moves to the head of the queue. A pin
    /// lets go of a block that lost its pinned key.
    pub fn evict_blocks(&mut self, blocks: &[BlockId]) -> Result<()> {
        for &b in blocks {
            self.check_id(b)?;
        }
        for &b in blocks {
            let free_and_cached =
                self.ref_cnt[b as usize] == 0 && self.hash_of[b as usize].is_some();
            self.drop_cache_entry(b);
            if free_and_cached {
                self.uncached_while_free(b);
            }
        }
        if let Some(log) = self.metrics.as_deref_mut() {
            log.evicted(blocks);
        }
        Ok(())
    }

    /// Drops `block`'s cache entry (with its events) and the pin's hold on it, if any.
    fn drop_cache_entry(&mut self, block: BlockId) {
        self.evict_hash(block);
        if self.pins.holds(block) {
            self.release_pin(block);
        }
    }

    /// Clears the whole prefix cache if no request holds a block (blocks held only by
    /// pins are let go: the pins stay, for blocks cached later); returns whether it
    /// did. The free queue order is unchanged, all of it in one list; the blocks pins
    /// let go follow, in id order.
    pub fn reset_prefix_cache(&mut self) -> bool {
        let Some(pinned) = self.pin_only_blocks() else {
            return false;
        };
        self.drop_pin_holds(&pinned);
        let mut order: Vec<BlockId> = self.queue.iter().collect();
        order.extend(&pinned);
        self.queue = FreeQueue::empty(self.num_blocks(), self.queue.num_lists());
        self.queue.append_n(&order);
        if let Some(r) = self.retention.as_deref_mut() {
            r.clear_tenants();
        }
        self.map.clear();
        self.secondary.clear();
        self.hash_of.iter_mut().for_each(|h| *h = None);
        self.watch.report_all();
        if self.enable_events {
            self.events.push(KvCacheEvent::AllBlocksCleared);
        }
        true
    }

    /// vLLM 0.33's `unpin_blocks`: drops one reference per block, as `free_blocks` does,
    /// for an owner that goes on reading the blocks until the pool reuses them. The
    /// blocks that reach 0 join the tail of the free queue in the given order, cached or
    /// not (the last to be allocated), and count as free. Each block is watched until
    /// `get_new_blocks` hands it out or `reset_prefix_cache` clears the cache, which
    /// report it to [`take_reused_watched`](Self::take_reused_watched).
    ///
    /// Errors, changing nothing: the null block (`InvalidArgument`), an id out of range,
    /// a block with fewer references than the times it is listed (`DoubleFree`), and a
    /// pool with a retention policy (`Unsupported`: its free lists order blocks by class
    /// and session, and vLLM's tail has no place among them).
    pub fn release_watched(&mut self, blocks: &[BlockId]) -> Result<()> {
        if self.retention.is_some() {
            return Err(KvError::Unsupported(
                "unpin_blocks on a pool with a retention policy".into(),
            ));
        }
        let mut listed: FxHashMap<BlockId, u32> = FxHashMap::default();
        for &b in blocks {
            self.check_id(b)?;
            if b == NULL_BLOCK_ID {
                return Err(KvError::InvalidArgument(
                    "the null block holds no reference to release".into(),
                ));
            }
            let times = listed.entry(b).or_default();
            *times += 1;
            if self.ref_cnt[b as usize] < *times {
                return Err(KvError::DoubleFree(b));
            }
        }
        let mut released = Vec::new();
        for &b in blocks {
            let rc = &mut self.ref_cnt[b as usize];
            *rc -= 1;
            if *rc == 0 {
                released.push(b);
            }
            self.watch.watch(b);
        }
        self.queue.append_n(&released);
        Ok(())
    }

    /// Returns and clears the watched blocks the pool let go since the last call, in
    /// vLLM's callback order: each `get_new_blocks` call's in queue order, a reset's in
    /// the order the blocks were first watched.
    pub fn take_reused_watched(&mut self) -> Vec<BlockId> {
        self.watch.take_reused()
    }

    /// Starts recording the calls vLLM's pool makes on a KV cache metrics collector
    /// (`metrics.rs`); a pool records none until this is called.
    pub fn record_block_metrics(&mut self) {
        self.metrics.get_or_insert_with(Box::default);
    }

    /// Returns and clears the recorded collector calls (empty when not recording).
    pub fn take_block_metrics(&mut self) -> Vec<(BlockMetricsOp, BlockId)> {
        self.metrics
            .as_deref_mut()
            .map_or_else(Vec::new, BlockMetricsLog::take)
    }

    /// Returns and clears the recorded events (empty when events are off).
    pub fn take_events(&mut self) -> Vec<KvCacheEvent> {
        std::mem::take(&mut self.events)
    }

    /// Checks the pool's structural invariants (NOTE 1 and NOTE 2 above) in O(N), for
    /// tests, fuzzing and soak runs: the null block is unreferenced, unlinked and
    /// unhashed; a block is in the free queue exactly once iff its ref count is 0; the
    /// queue length matches; the prefix map holds exactly each cached block's primary key
    /// and its extra (partial-entry) keys. Returns a description of the first violation.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let n = self.num_blocks();
        if self.ref_cnt[NULL_BLOCK_ID as usize] != 0 || self.queue.contains(NULL_BLOCK_ID) {
            return Err("null block is referenced or linked".into());
        }
        let mut seen = vec![false; n];
        let mut count = 0usize;
        for b in self.queue.iter() {
            let i = b as usize;
            if i >= n || seen[i] {
                return Err(format!("free queue holds block {b} twice or out of range"));
            }
            seen[i] = true;
            count += 1;
            if count > n {
                return Err("free queue is cyclic".into());
            }
        }
        if count != self.queue.len() {
            return Err(format!("queue len {} but {count} linked", self.queue.len()));
        }
        for (b, (&rc, &linked)) in self.ref_cnt.iter().zip(&seen).enumerate().skip(1) {
            if (rc == 0) != linked || linked != self.queue.contains(b as u32) {
                return Err(format!("block {b}: ref_cnt {rc} but linked = {linked}"));
            }
        }
        let mut entries = 0usize;
        for (key, b) in self.map.entries() {
            entries += 1;
            let i = b as usize;
            let carried = i < n
                && b != NULL_BLOCK_ID
                && (self.hash_of[i] == Some(key)
                    || (self.hash_of[i].is_some()
                        && self.secondary.get(&b).is_some_and(|v| v.contains(&key))));
            if !carried {
                return Err(format!("map holds block {b} under a key it does not carry"));
            }
        }
        let hashed = self.hash_of.iter().filter(|h| h.is_some()).count();
        let extra: usize = self.secondary.values().map(Vec::len).sum();
        if hashed + extra != entries {
            return Err(format!(
                "{hashed} primary and {extra} extra keys but the map has {entries}"
            ));
        }
        self.check_pins()?;
        self.check_retention()
    }

    /// Mutable access to the recorded events, for the manager's annotations.
    pub fn events_mut(&mut self) -> &mut Vec<KvCacheEvent> {
        &mut self.events
    }
}

/// `vec![value; n]`, or an error if the memory cannot be reserved.
fn filled<T: Clone>(n: usize, value: T) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| KvError::InvalidArgument(format!("cannot allocate a pool of {n} blocks")))?;
    v.resize(n, value);
    Ok(v)
}

#[cold]
fn out_of_range(block_id: u64, num_blocks: usize) -> KvError {
    KvError::BlockOutOfRange {
        block_id,
        num_blocks,
    }
}

/// The manager's hit searches read the pool's prefix map.
impl CachedBlocks for BlockPool {
    #[inline]
    fn cached_block(&self, hash: &BlockHash, group: GroupId) -> Option<BlockId> {
        BlockPool::cached_block(self, hash, group)
    }
}

#[cfg(test)]
mod tests;
