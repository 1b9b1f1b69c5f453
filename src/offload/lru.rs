//! vLLM 0.33's `lru` cache policy: evictable chunks in a lazily invalidated min-heap of
//! (rank, key), rebuilt or compacted at vLLM's thresholds so that every eviction picks
//! the chunk vLLM picks.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashSet;

use super::ranks::Ranks;
use super::{Chunk, Key, Policy, Rank, ReqState};

type Entry = Reverse<(Rank, Key)>;

/// vLLM's LRU policy.
#[derive(Debug, Clone, Default)]
pub struct Lru {
    ranks: Ranks,
    heap: BinaryHeap<Entry>,
}

impl Lru {
    fn entry(&self, key: &Key) -> Entry {
        Reverse((self.ranks.entries[key].rank, key.clone()))
    }

    fn is_current(&self, (rank, key): &(Rank, Key)) -> bool {
        self.ranks
            .entries
            .get(key)
            .is_some_and(|e| e.evictable && e.rank == *rank)
    }

    fn rebuild(&mut self) {
        self.heap = self
            .ranks
            .entries
            .iter()
            .filter(|(_, e)| e.evictable)
            .map(|(k, e)| Reverse((e.rank, k.clone())))
            .collect();
    }

    fn maybe_compact(&mut self) {
        if self.heap.len() >= 64.max(2 * self.ranks.num_evictable) {
            self.rebuild();
        }
    }

    fn update_heap(&mut self, updated: Vec<(Key, Rank)>) {
        if updated.is_empty() {
            return;
        }
        if updated.len() >= 64.max(self.ranks.num_evictable / 4) {
            self.rebuild();
        } else {
            for (key, _) in &updated {
                let e = self.entry(key);
                self.heap.push(e);
            }
            self.maybe_compact();
        }
    }
}

impl Policy for Lru {
    fn get(&self, key: &[u8]) -> Option<&Chunk> {
        self.ranks.entries.get(key).map(|e| &e.chunk)
    }

    fn get_mut(&mut self, key: &[u8]) -> Option<&mut Chunk> {
        self.ranks.entries.get_mut(key).map(|e| &mut e.chunk)
    }

    fn insert(&mut self, key: Key, chunk: Chunk, position: Option<i64>, req: &mut ReqState) {
        if self.ranks.insert(key.clone(), chunk, position, req) {
            let e = self.entry(&key);
            self.heap.push(e);
        }
    }

    fn remove(&mut self, key: &[u8]) {
        self.ranks.remove(key);
    }

    fn touch(&mut self, keys: &[Key]) {
        let updated = self.ranks.renew(keys.iter().rev());
        self.update_heap(updated);
    }

    fn on_request_access(&mut self, keys: &[Key], positions: &[Option<i64>], req: &mut ReqState) {
        let updated = self.ranks.request_access(keys, positions, req);
        self.update_heap(updated);
    }

    fn evict(&mut self, n: usize, protected: &FxHashSet<Key>) -> Option<Vec<(Key, Chunk)>> {
        if n == 0 {
            return Some(Vec::new());
        }
        let mut selected: Vec<(Rank, Key)> = Vec::new();
        let mut selected_keys: FxHashSet<Key> = FxHashSet::default();
        let mut deferred: Vec<(Rank, Key)> = Vec::new();
        while selected.len() < n {
            let Some(Reverse(entry)) = self.heap.pop() else {
                break;
            };
            if !self.is_current(&entry) || selected_keys.contains(&entry.1) {
                continue;
            }
            if protected.contains(&entry.1) {
                deferred.push(entry);
                continue;
            }
            selected_keys.insert(entry.1.clone());
            selected.push(entry);
        }
        let failed = selected.len() < n;
        if failed {
            self.heap.extend(selected.drain(..).map(Reverse));
        }
        self.heap.extend(deferred.into_iter().map(Reverse));
        if failed {
            return None;
        }
        let evicted = selected
            .into_iter()
            .map(|(_, key)| {
                let e = self.ranks.remove(&key).expect("selected key is held");
                (key, e.chunk)
            })
            .collect();
        self.maybe_compact();
        Some(evicted)
    }

    fn clear(&mut self) {
        self.ranks.clear();
        self.heap.clear();
    }

    fn mark_evictable(&mut self, key: &[u8]) {
        if self.ranks.set_evictable(key, true).is_none() {
            return;
        }
        let (k, e) = self.ranks.entries.get_key_value(key).expect("held key");
        self.heap.push(Reverse((e.rank, k.clone())));
        self.maybe_compact();
    }

    fn mark_non_evictable(&mut self, key: &[u8]) {
        self.ranks.set_evictable(key, false);
    }

    fn heap(&self) -> Vec<(Rank, Key)> {
        self.heap.iter().map(|Reverse(e)| e.clone()).collect()
    }

    fn generation(&self) -> u64 {
        self.ranks.generation
    }
}
