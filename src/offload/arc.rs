//! vLLM 0.33's `arc` cache policy: T1 (seen once) and T2 (reused) in LRU order, the ghost
//! lists B1 and B2 of keys evicted from them, and the adaptive target size of T1.

use rustc_hash::FxHashSet;

use super::linked::LinkedMap;
use super::{Chunk, Key, Policy, ReqState};
use crate::error::{KvError, Result};

/// vLLM's ARC policy.
#[derive(Debug, Clone)]
pub struct Arc {
    capacity: usize,
    target_t1: f64,
    t1: LinkedMap<Chunk>,
    t2: LinkedMap<Chunk>,
    b1: LinkedMap<()>,
    b2: LinkedMap<()>,
}

/// The next evictable chunk of a list after `cursor` (a forward-only scan).
fn next_candidate<'a>(
    cursor: &mut impl Iterator<Item = (&'a Key, &'a Chunk)>,
    protected: &FxHashSet<Key>,
) -> Option<Key> {
    cursor
        .find(|(k, c)| c.ref_cnt == 0 && !protected.contains(*k))
        .map(|(k, _)| k.clone())
}

impl Arc {
    /// An empty ARC over `capacity` chunks.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            target_t1: 0.0,
            t1: LinkedMap::default(),
            t2: LinkedMap::default(),
            b1: LinkedMap::default(),
            b2: LinkedMap::default(),
        }
    }

    fn adapt_to_ghost_hit(&mut self, key: &[u8]) {
        if self.b1.contains(key) {
            let delta = (self.b2.len() as f64 / self.b1.len() as f64).max(1.0);
            self.target_t1 = (self.target_t1 + delta).min(self.capacity as f64);
            self.b1.move_to_end(key);
        } else if self.b2.contains(key) {
            let delta = (self.b1.len() as f64 / self.b2.len() as f64).max(1.0);
            self.target_t1 = (self.target_t1 - delta).max(0.0);
            self.b2.move_to_end(key);
        }
    }
}

impl Policy for Arc {
    fn get(&self, key: &[u8]) -> Option<&Chunk> {
        self.t1.get(key).or_else(|| self.t2.get(key))
    }

    fn get_mut(&mut self, key: &[u8]) -> Option<&mut Chunk> {
        if self.t1.contains(key) {
            self.t1.get_mut(key)
        } else {
            self.t2.get_mut(key)
        }
    }

    fn insert(&mut self, key: Key, chunk: Chunk, _position: Option<i64>, _req: &mut ReqState) {
        self.b1.remove(&key);
        self.b2.remove(&key);
        self.t1.insert(key, chunk);
    }

    fn remove(&mut self, key: &[u8]) {
        if self.t1.remove(key).is_none() {
            self.t2.remove(key);
        }
    }

    fn on_store_miss(&mut self, keys: &[Key]) {
        for key in keys.iter().rev() {
            self.adapt_to_ghost_hit(key);
        }
    }

    fn touch(&mut self, keys: &[Key]) {
        for key in keys.iter().rev() {
            if let Some(chunk) = self.t1.remove(key) {
                // A chunk still being stored was not touched twice: it stays in T1.
                if chunk.is_ready() {
                    self.t2.insert(key.clone(), chunk);
                } else {
                    self.t1.insert(key.clone(), chunk);
                }
            } else if !self.t2.move_to_end(key) {
                self.adapt_to_ghost_hit(key);
            }
        }
    }

    fn on_request_finished(
        &mut self,
        ordered: &[Key],
        insertion_only: &FxHashSet<Key>,
        reused: &FxHashSet<Key>,
    ) {
        for key in ordered.iter().rev() {
            if insertion_only.contains(key) {
                // A store is not a frequency hit: recency only.
                if !self.t1.move_to_end(key) {
                    self.t2.move_to_end(key);
                }
            } else if reused.contains(key) {
                if let Some(chunk) = self.t1.remove(key) {
                    self.t2.insert(key.clone(), chunk);
                } else {
                    self.t2.move_to_end(key);
                }
            }
        }
    }

    fn evict(&mut self, n: usize, protected: &FxHashSet<Key>) -> Option<Vec<(Key, Chunk)>> {
        if n == 0 {
            return Some(Vec::new());
        }
        // `n` comes from the caller: never reserve more than the chunks held.
        let mut candidates: Vec<(Key, bool)> =
            Vec::with_capacity(n.min(self.t1.len() + self.t2.len()));
        let mut virtual_t1 = self.t1.len() as i64;
        // Python's int() truncates toward zero; the target is never negative.
        let target = self.target_t1.trunc() as i64;
        let mut t1_iter = self.t1.iter();
        let mut t2_iter = self.t2.iter();
        for _ in 0..n {
            let mut candidate = None;
            if virtual_t1 >= target {
                if let Some(k) = next_candidate(&mut t1_iter, protected) {
                    candidate = Some((k, true));
                    virtual_t1 -= 1;
                }
            }
            if candidate.is_none() {
                candidate = next_candidate(&mut t2_iter, protected).map(|k| (k, false));
            }
            if candidate.is_none() {
                let k = next_candidate(&mut t1_iter, protected)?;
                candidate = Some((k, true));
                virtual_t1 -= 1;
            }
            candidates.extend(candidate);
        }
        let mut evicted = Vec::with_capacity(candidates.len());
        for (key, from_t1) in candidates {
            let chunk = if from_t1 {
                self.b1.insert(key.clone(), ());
                self.t1.remove(&key)
            } else {
                self.b2.insert(key.clone(), ());
                self.t2.remove(&key)
            };
            evicted.push((key, chunk.expect("candidate is held")));
        }
        for ghost in [&mut self.b1, &mut self.b2] {
            while ghost.len() > self.capacity {
                ghost.pop_front();
            }
        }
        Some(evicted)
    }

    fn clear(&mut self) {
        *self = Self::new(self.capacity);
    }

    fn lists(&self) -> Vec<(&'static str, Vec<Key>)> {
        vec![
            ("t1", self.t1.iter().map(|(k, _)| k.clone()).collect()),
            ("t2", self.t2.iter().map(|(k, _)| k.clone()).collect()),
            ("b1", self.b1.iter().map(|(k, _)| k.clone()).collect()),
            ("b2", self.b2.iter().map(|(k, _)| k.clone()).collect()),
        ]
    }

    fn target_t1(&self) -> Option<f64> {
        Some(self.target_t1)
    }

    fn set_target_t1(&mut self, target: f64) -> Result<()> {
        if !(target.is_finite() && target >= 0.0) {
            return Err(KvError::InvalidArgument(format!(
                "target_t1_size must be finite and >= 0, got {target}"
            )));
        }
        self.target_t1 = target;
        Ok(())
    }
}
