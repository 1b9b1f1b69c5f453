//! The publisher's mirror of the prefix cache, rebuilt from the event stream it publishes,
//! so a snapshot is consistent with the sequence numbers already sent: a subscriber that
//! applies every batch it receives, snapshot included, ends with the publisher's state.
//!
//! A snapshot starts with `AllBlocksCleared`, then re-announces every entry: applying it
//! sets any subscriber (a set, or one counting blocks per hash) to the exact state, and
//! applying it twice changes nothing.
//!
//! Entries are keyed by (external hash, group) and counted: vLLM may cache the same hash
//! in two blocks (one `BlockStored` each) and drops it with one `BlockRemoved` per block.
//!
//! Per-block tokens: `BlockStored.token_ids` spans the whole cached range, skipped (null or
//! masked) blocks included. When it holds more tokens than `block_size` per stored block,
//! the stored blocks are taken to be the last ones of the range (sliding-window and Mamba
//! skip leading blocks).

use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::events::event::{BlockStored, EventExtraKeys, KvCacheEvent};

/// What a snapshot re-emits for one cached (hash, group) entry.
#[derive(Debug, Clone)]
struct Entry {
    /// How many stored blocks currently hold the key.
    count: u32,
    /// First time the key was stored (snapshot order among siblings).
    order: u64,
    parent: Option<u64>,
    tokens: Arc<[u32]>,
    token_start: u32,
    block_size: u32,
    lora_id: Option<i64>,
    lora_name: Option<Arc<str>>,
    medium: &'static str,
    extra_keys: EventExtraKeys,
    /// `None` when the source event had no `extra_keys` list.
    has_extra_keys: bool,
    kind: Option<&'static str>,
    sliding_window: Option<u32>,
    locality: Option<Arc<str>>,
    ownership: Option<Arc<str>>,
    session_id: Option<Arc<str>>,
    /// The block's `lookahead_token_ids` entry; `None` when the source event had none.
    lookahead: Option<Vec<u32>>,
}

/// The cached (external hash, group) set, with what it takes to re-announce each entry.
#[derive(Debug, Default)]
pub struct CacheIndex {
    entries: FxHashMap<(u64, u32), Entry>,
    next_order: u64,
}

impl CacheIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of distinct cached (hash, group) keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether (hash, group) is cached.
    pub fn contains(&self, hash: u64, group: u32) -> bool {
        self.entries.contains_key(&(hash, group))
    }

    /// The cached (hash, group) keys, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.entries.keys().copied()
    }

    /// Applies events in order.
    pub fn apply(&mut self, events: &[KvCacheEvent]) {
        for event in events {
            match event {
                KvCacheEvent::BlockStored(e) => self.store(e),
                KvCacheEvent::BlockRemoved(e) => {
                    for &h in &e.block_hashes {
                        let key = (h, e.group_idx);
                        if let Some(entry) = self.entries.get_mut(&key) {
                            entry.count -= 1;
                            if entry.count == 0 {
                                self.entries.remove(&key);
                            }
                        }
                    }
                }
                KvCacheEvent::AllBlocksCleared => self.entries.clear(),
            }
        }
    }

    fn store(&mut self, e: &BlockStored) {
        let n = e.block_hashes.len();
        if n == 0 {
            return;
        }
        let tokens: Arc<[u32]> = e.token_ids.as_slice().into();
        let shared = |v: &Option<String>| v.as_deref().map(Arc::<str>::from);
        let lora_name = shared(&e.lora_name);
        let (locality, ownership, session_id) = (
            shared(&e.locality),
            shared(&e.ownership),
            shared(&e.session_id),
        );
        let bs = e.block_size as usize;
        // Leading tokens belong to skipped blocks; clamp for malformed (short) events.
        let skip = tokens.len().saturating_sub(n * bs);
        let mut parent = e.parent_block_hash;
        for (i, &h) in e.block_hashes.iter().enumerate() {
            let start = (skip + i * bs).min(tokens.len());
            let extra = e
                .extra_keys
                .as_ref()
                .and_then(|per_block| per_block.get(i).cloned().flatten());
            let order = self.next_order;
            let entry = self
                .entries
                .entry((h, e.group_idx))
                .or_insert_with(|| Entry {
                    count: 0,
                    order,
                    parent,
                    tokens: Arc::clone(&tokens),
                    token_start: start as u32,
                    block_size: e.block_size,
                    lora_id: e.lora_id,
                    lora_name: lora_name.clone(),
                    medium: e.medium,
                    extra_keys: extra,
                    has_extra_keys: e.extra_keys.is_some(),
                    kind: e.kv_cache_spec_kind,
                    sliding_window: e.kv_cache_spec_sliding_window,
                    locality: locality.clone(),
                    ownership: ownership.clone(),
                    session_id: session_id.clone(),
                    lookahead: e
                        .lookahead_token_ids
                        .as_ref()
                        .map(|per_block| per_block.get(i).cloned().unwrap_or_default()),
                });
            if entry.count == 0 {
                self.next_order += 1;
            }
            entry.count += 1;
            parent = Some(h);
        }
    }

    /// `AllBlocksCleared`, then every cached entry as a one-block `BlockStored` event
    /// (repeated once per block that holds it), parents before children, otherwise in
    /// first-stored order.
    pub fn snapshot(&self) -> Vec<KvCacheEvent> {
        let mut keys: Vec<(u64, u32)> = self.entries.keys().copied().collect();
        keys.sort_unstable_by_key(|k| self.entries[k].order);
        let mut done: FxHashSet<(u64, u32)> = FxHashSet::default();
        let mut out = Vec::with_capacity(keys.len() + 1);
        out.push(KvCacheEvent::AllBlocksCleared);
        let mut chain = Vec::new();
        for key in keys {
            // Walk up to the first ancestor already emitted (or absent), then emit downwards.
            let mut cur = key;
            while !done.contains(&cur) && self.entries.contains_key(&cur) {
                done.insert(cur);
                chain.push(cur);
                match self.entries[&cur].parent {
                    Some(p) => cur = (p, cur.1),
                    None => break,
                }
            }
            for k in chain.drain(..).rev() {
                let entry = &self.entries[&k];
                for _ in 0..entry.count {
                    out.push(KvCacheEvent::BlockStored(Box::new(
                        self.entry_event(k, entry),
                    )));
                }
            }
        }
        out
    }

    fn entry_event(&self, (hash, group): (u64, u32), e: &Entry) -> BlockStored {
        let start = e.token_start as usize;
        let end = (start + e.block_size as usize).min(e.tokens.len());
        BlockStored {
            block_hashes: vec![hash],
            parent_block_hash: e.parent,
            token_ids: e.tokens[start..end].to_vec(),
            block_size: e.block_size,
            lora_id: e.lora_id,
            medium: e.medium,
            lora_name: e.lora_name.as_deref().map(str::to_owned),
            extra_keys: e.has_extra_keys.then(|| vec![e.extra_keys.clone()]),
            group_idx: group,
            kv_cache_spec_kind: e.kind,
            kv_cache_spec_sliding_window: e.sliding_window,
            locality: e.locality.as_deref().map(str::to_owned),
            ownership: e.ownership.as_deref().map(str::to_owned),
            session_id: e.session_id.as_deref().map(str::to_owned),
            lookahead_token_ids: e.lookahead.clone().map(|tokens| vec![tokens]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::event::{BlockRemoved, MEDIUM_GPU};

    fn stored(hashes: &[u64], parent: Option<u64>, tokens: Vec<u32>, group: u32) -> KvCacheEvent {
        KvCacheEvent::BlockStored(Box::new(BlockStored {
            block_hashes: hashes.to_vec(),
            parent_block_hash: parent,
            token_ids: tokens,
            block_size: 2,
            lora_id: None,
            medium: MEDIUM_GPU,
            lora_name: None,
            extra_keys: Some(vec![None; hashes.len()]),
            group_idx: group,
            kv_cache_spec_kind: Some("full_attention"),
            kv_cache_spec_sliding_window: None,
            locality: None,
            ownership: None,
            session_id: None,
            lookahead_token_ids: None,
        }))
    }

    fn removed(h: u64, group: u32) -> KvCacheEvent {
        KvCacheEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![h],
            medium: MEDIUM_GPU,
            group_idx: group,
        })
    }

    fn replayed(events: &[KvCacheEvent]) -> CacheIndex {
        let mut idx = CacheIndex::new();
        idx.apply(events);
        idx
    }

    #[test]
    fn counts_duplicates_and_clears() {
        let mut idx = replayed(&[
            stored(&[1, 2], None, vec![1, 2, 3, 4], 0),
            stored(&[1], None, vec![1, 2], 0),
            stored(&[1], None, vec![1, 2], 1),
            removed(1, 0),
        ]);
        assert!(idx.contains(1, 0) && idx.contains(2, 0) && idx.contains(1, 1));
        idx.apply(&[removed(1, 0), removed(9, 0)]);
        assert!(!idx.contains(1, 0));
        assert_eq!(idx.len(), 2);
        idx.apply(&[KvCacheEvent::AllBlocksCleared]);
        assert!(idx.is_empty());
    }

    #[test]
    fn snapshot_rebuilds_the_index_parents_first() {
        // 3 <- 4 stored first; then 1 <- 2 <- 3 is re-stored after 3's parent was evicted.
        let events = [
            stored(&[1, 2, 3], None, vec![0, 1, 2, 3, 4, 5], 0),
            stored(&[4], Some(3), vec![6, 7], 0),
            removed(1, 0),
            removed(2, 0),
            stored(&[1, 2], None, vec![0, 1, 2, 3], 0),
            stored(&[2], None, vec![0, 1], 0),
        ];
        let idx = replayed(&events);
        let snap = idx.snapshot();
        assert_eq!(snap[0], KvCacheEvent::AllBlocksCleared);
        // applied over any prior state, once or twice, the snapshot gives the same counts
        let mut rebuilt = replayed(&events[..2]);
        rebuilt.apply(&snap);
        rebuilt.apply(&snap);
        let counts =
            |i: &CacheIndex| -> Vec<_> { i.entries.iter().map(|(k, e)| (*k, e.count)).collect() };
        let mut want = counts(&idx);
        let mut got = counts(&rebuilt);
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want);
        let order: Vec<u64> = snap[1..]
            .iter()
            .map(|e| match e {
                KvCacheEvent::BlockStored(s) => s.block_hashes[0],
                _ => unreachable!(),
            })
            .collect();
        // 3 was stored first but its parent 2 (and 2's parent 1) come before it;
        // hash 2 is held by two blocks, so it is announced twice.
        assert_eq!(order, vec![1, 2, 2, 3, 4]);
        match &snap[5] {
            KvCacheEvent::BlockStored(s) => {
                assert_eq!(s.parent_block_hash, Some(3));
                assert_eq!(s.token_ids, vec![6, 7]);
                assert_eq!(s.extra_keys, Some(vec![None]));
            }
            _ => unreachable!(),
        }
    }

    #[test]
    fn skipped_blocks_take_the_leading_tokens() {
        // Two stored blocks over a three-block range: tokens 2..6 belong to them.
        let idx = replayed(&[stored(&[7, 8], Some(6), vec![0, 1, 2, 3, 4, 5], 0)]);
        let snap = idx.snapshot();
        let tokens: Vec<Vec<u32>> = snap[1..]
            .iter()
            .map(|e| match e {
                KvCacheEvent::BlockStored(s) => s.token_ids.clone(),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(tokens, vec![vec![2, 3], vec![4, 5]]);
    }

    /// Random pool traffic (shared prefixes, so duplicate hashes; evictions; resets): the
    /// index built from the pool's events holds exactly the pool's cached keys, each counted
    /// once per block, and its snapshot rebuilds the same keys from nothing.
    mod against_the_pool {
        use proptest::prelude::*;

        use super::super::CacheIndex;
        use crate::events::event::TokensOnly;
        use crate::pool::BlockPool;
        use crate::types::BlockHash;

        const BS: usize = 2;

        #[derive(Debug, Clone)]
        enum Op {
            Alloc {
                prefix: u32,
                blocks: usize,
                group: u32,
            },
            Free(usize),
            Reset,
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                4 => (0u32..3, 1usize..6, 0u32..2)
                    .prop_map(|(prefix, blocks, group)| Op::Alloc { prefix, blocks, group }),
                3 => (0usize..8).prop_map(Op::Free),
                1 => Just(Op::Reset),
            ]
        }

        fn chain(tokens: &[u32]) -> Vec<BlockHash> {
            let mut h = 0xcbf2_9ce4_8422_2325u64;
            tokens
                .chunks(BS)
                .map(|c| {
                    for &t in c {
                        h = (h ^ u64::from(t)).wrapping_mul(0x100_0000_01b3);
                    }
                    BlockHash::from_slice(&h.to_be_bytes()).unwrap()
                })
                .collect()
        }

        fn pool_keys(pool: &BlockPool) -> Vec<((u64, u32), u32)> {
            let mut counts = std::collections::BTreeMap::new();
            for b in 0..pool.num_blocks() as u32 {
                if let Some(k) = pool.block_hash(b).unwrap() {
                    *counts.entry((k.hash.external(), k.group)).or_insert(0u32) += 1;
                }
            }
            counts.into_iter().collect()
        }

        fn index_keys(idx: &CacheIndex) -> Vec<((u64, u32), u32)> {
            let mut v: Vec<_> = idx.entries.iter().map(|(k, e)| (*k, e.count)).collect();
            v.sort_unstable();
            v
        }

        proptest! {
            #[test]
            fn index_and_snapshot_match_the_pool(ops in proptest::collection::vec(op(), 1..60)) {
                let mut pool = BlockPool::new(16, true, BS, true).unwrap();
                let mut idx = CacheIndex::new();
                let mut live: Vec<Vec<u32>> = Vec::new();
                for op in ops {
                    match op {
                        Op::Alloc { prefix, blocks, group } => {
                            if blocks > pool.num_free_blocks() {
                                continue;
                            }
                            let tokens: Vec<u32> =
                                (0..(blocks * BS) as u32).map(|t| prefix * 100 + t).collect();
                            let ids = pool.get_new_blocks(blocks).unwrap();
                            pool.cache_full_blocks(
                                &chain(&tokens), &ids, 0, blocks, BS, group, None,
                                &TokensOnly(&tokens),
                            ).unwrap();
                            live.push(ids);
                        }
                        Op::Free(i) => {
                            if !live.is_empty() {
                                let ids = live.remove(i % live.len());
                                pool.free_blocks(ids.iter().rev().copied()).unwrap();
                            }
                        }
                        Op::Reset => {
                            pool.reset_prefix_cache();
                        }
                    }
                    idx.apply(&pool.take_events());
                    prop_assert_eq!(index_keys(&idx), pool_keys(&pool));
                }
                let mut rebuilt = CacheIndex::new();
                rebuilt.apply(&idx.snapshot());
                prop_assert_eq!(index_keys(&rebuilt), pool_keys(&pool));
            }
        }
    }
}
