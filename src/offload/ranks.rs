//! Recency ranks, as vLLM 0.33's LRU policy assigns them: a store or a touch takes the
//! next global rank; a request shares one rank across its batches and orders its keys by
//! position (tails before heads). Shared by [`super::Lru`] and [`super::RetentionOrder`],
//! which differ only in how they order the evictable chunks by rank.

use rustc_hash::FxHashMap;

use super::{Chunk, Key, Rank, ReqState};

/// A chunk with its rank and whether it may be evicted (reference count 0).
#[derive(Debug, Clone)]
pub(crate) struct Ranked {
    pub(crate) chunk: Chunk,
    pub(crate) rank: Rank,
    pub(crate) evictable: bool,
}

/// The chunks a rank-ordered policy holds.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ranks {
    pub(crate) entries: FxHashMap<Key, Ranked>,
    next_rank: i64,
    pub(crate) generation: u64,
    pub(crate) num_evictable: usize,
}

impl Ranks {
    /// The request's shared rank, assigned on its first use in this generation.
    fn request_rank(&mut self, req: &mut ReqState) -> i64 {
        match req.rank {
            Some((g, r)) if g == self.generation => r,
            _ => {
                self.next_rank += 1;
                req.rank = Some((self.generation, self.next_rank));
                self.next_rank
            }
        }
    }

    fn fresh_rank(&mut self) -> Rank {
        self.next_rank += 1;
        (self.next_rank, 0)
    }

    /// Adds a chunk; true when it is evictable.
    pub(crate) fn insert(
        &mut self,
        key: Key,
        chunk: Chunk,
        position: Option<i64>,
        req: &mut ReqState,
    ) -> bool {
        let rank = match position {
            None => self.fresh_rank(),
            Some(p) => (self.request_rank(req), -p),
        };
        let was = self.entries.get(&key).is_some_and(|e| e.evictable);
        let evictable = was || chunk.ref_cnt == 0;
        self.num_evictable += usize::from(evictable && !was);
        self.entries.insert(
            key,
            Ranked {
                chunk,
                rank,
                evictable,
            },
        );
        chunk.ref_cnt == 0
    }

    /// Drops a chunk.
    pub(crate) fn remove(&mut self, key: &[u8]) -> Option<Ranked> {
        let e = self.entries.remove(key)?;
        self.num_evictable -= usize::from(e.evictable);
        Some(e)
    }

    /// Gives each held key of `keys`, in turn, the next global rank; returns the evictable
    /// ones (a key once per occurrence) with their rank before.
    pub(crate) fn renew<'a>(&mut self, keys: impl Iterator<Item = &'a Key>) -> Vec<(Key, Rank)> {
        let mut updated = Vec::new();
        for key in keys {
            if !self.entries.contains_key(key) {
                continue;
            }
            let rank = self.fresh_rank();
            let e = self.entries.get_mut(key).expect("held key");
            let old = std::mem::replace(&mut e.rank, rank);
            if e.evictable {
                updated.push((key.clone(), old));
            }
        }
        updated
    }

    /// Raises held keys to the request's rank at their position (never lowers one);
    /// returns the evictable ones changed, with their rank before.
    pub(crate) fn request_access(
        &mut self,
        keys: &[Key],
        positions: &[Option<i64>],
        req: &mut ReqState,
    ) -> Vec<(Key, Rank)> {
        let request_rank = self.request_rank(req);
        let mut updated = Vec::new();
        for (key, position) in keys.iter().zip(positions) {
            let (Some(p), Some(e)) = (position, self.entries.get_mut(key)) else {
                continue;
            };
            let rank = (request_rank, -p);
            if e.rank >= rank {
                continue;
            }
            let old = std::mem::replace(&mut e.rank, rank);
            if e.evictable {
                updated.push((key.clone(), old));
            }
        }
        updated
    }

    /// Sets whether a held chunk is evictable; returns whether it was, or `None` when the
    /// key is not held.
    pub(crate) fn set_evictable(&mut self, key: &[u8], evictable: bool) -> Option<bool> {
        let e = self.entries.get_mut(key)?;
        let was = std::mem::replace(&mut e.evictable, evictable);
        self.num_evictable = self.num_evictable + usize::from(evictable) - usize::from(was);
        Some(was)
    }

    /// Drops every chunk and starts a new generation of ranks.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.next_rank = 0;
        self.generation += 1;
        self.num_evictable = 0;
    }
}
