//! vLLM 0.33's `CPUOffloadingManager` over a [`Policy`]: the chunk pool, reference
//! counts, the store threshold's offer tracker, each request's access record, and events.

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};

use super::linked::LinkedMap;
use super::{group_of, order_by_position, Chunk, Key, Policy, PolicyKind, ReqState};
use crate::error::{KvError, Result};

/// What `lookup` finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupResult {
    /// Not in the tier.
    Miss,
    /// In the tier and readable.
    Hit,
    /// In the tier, its store still in flight.
    HitPending,
}

/// Keys stored in or removed from the tier (vLLM's `OffloadingEvent`, medium CPU).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffloadEvent {
    /// The keys, in the order decided.
    pub keys: Vec<Key>,
    /// Removed (true) or stored (false).
    pub removed: bool,
    /// A failed store released these keys; no eviction is announced.
    pub metadata_only: bool,
}

/// What `prepare_store` decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreOutput {
    /// The keys to write, in the order offered.
    pub keys_to_store: Vec<Key>,
    /// Their chunk slots.
    pub chunk_ids: Vec<u32>,
    /// Keys evicted to make room.
    pub evicted: Vec<Key>,
}

/// A request's accesses in the current cache generation (vLLM's `_RequestCacheAccess`).
#[derive(Debug, Default)]
struct Access {
    generation: u64,
    key_groups: BTreeMap<u32, Vec<Key>>,
    seen: FxHashSet<Key>,
    inserted: FxHashSet<Key>,
    reused: FxHashSet<Key>,
    store_misses: FxHashSet<Key>,
}

/// What the manager knows of one request.
#[derive(Debug, Default)]
struct Request {
    positions: FxHashMap<Key, i64>,
    policy: ReqState,
    access: Access,
}

/// The host tier's manager.
pub struct OffloadManager {
    num_chunks: usize,
    num_allocated: usize,
    free_list: Vec<u32>,
    events: Option<Vec<OffloadEvent>>,
    policy: Box<dyn Policy>,
    num_evictable: usize,
    num_write_pending: usize,
    store_threshold: usize,
    max_tracker_size: usize,
    counts: Option<LinkedMap<u64>>,
    stores_skipped: u64,
    generation: u64,
    requests: FxHashMap<String, Request>,
}

impl OffloadManager {
    /// A tier of `num_chunks` chunks under `policy`. With `store_threshold >= 2` a key is
    /// stored only once it was offered that many times (among the `max_tracker_size`
    /// most recently offered keys).
    pub fn new(
        num_chunks: usize,
        policy: &PolicyKind,
        enable_events: bool,
        store_threshold: usize,
        max_tracker_size: usize,
    ) -> Result<Self> {
        if u32::try_from(num_chunks).is_err() {
            return Err(KvError::InvalidArgument(format!(
                "num_chunks must fit in 32 bits, got {num_chunks}"
            )));
        }
        Ok(Self {
            num_chunks,
            num_allocated: 0,
            free_list: Vec::new(),
            events: enable_events.then(Vec::new),
            policy: policy.build(num_chunks)?,
            num_evictable: 0,
            num_write_pending: 0,
            store_threshold,
            max_tracker_size,
            counts: (store_threshold >= 2).then(LinkedMap::default),
            stores_skipped: 0,
            generation: 0,
            requests: FxHashMap::default(),
        })
    }

    /// Chunks neither held nor allocated.
    pub fn num_free(&self) -> usize {
        self.free_list.len() + self.num_chunks - self.num_allocated
    }

    /// Chunks in the tier's pool.
    pub fn num_chunks(&self) -> usize {
        self.num_chunks
    }

    /// Chunks held with reference count 0.
    pub fn num_evictable(&self) -> usize {
        self.num_evictable
    }

    /// Chunks whose store is in flight.
    pub fn num_write_pending(&self) -> usize {
        self.num_write_pending
    }

    /// Store candidates the threshold skipped so far.
    pub fn stores_skipped(&self) -> u64 {
        self.stores_skipped
    }

    /// The policy.
    pub fn policy(&self) -> &dyn Policy {
        self.policy.as_ref()
    }

    fn request(&mut self, req: &str) -> &mut Request {
        let generation = self.generation;
        let r = self.requests.entry(req.to_owned()).or_default();
        if r.access.generation != generation {
            r.access = Access {
                generation,
                ..Access::default()
            };
        }
        r
    }

    /// Records the end-token position of each key in request `req`.
    pub fn set_positions(&mut self, req: &str, keys: &[Key], positions: &[i64]) -> Result<()> {
        if keys.len() != positions.len() {
            return Err(KvError::InvalidArgument(format!(
                "{} keys but {} positions",
                keys.len(),
                positions.len()
            )));
        }
        let r = self.request(req);
        r.positions
            .extend(keys.iter().cloned().zip(positions.iter().copied()));
        Ok(())
    }

    /// Sets the priority and tenant the request's chunks are stored under.
    pub fn set_hints(&mut self, req: &str, priority: i64, tenant: Option<String>) {
        let r = self.request(req);
        r.policy.priority = priority;
        r.policy.tenant = tenant;
    }

    /// A request is first seen.
    pub fn on_new_request(&mut self, req: &str) {
        self.request(req);
    }

    /// Whether `key` is in the tier, and ready.
    pub fn lookup(&self, key: &[u8]) -> LookupResult {
        match self.policy.get(key) {
            None => LookupResult::Miss,
            Some(c) if c.is_ready() => LookupResult::Hit,
            Some(_) => LookupResult::HitPending,
        }
    }

    fn record_offers(&mut self, keys: &[Key]) {
        let Some(counts) = self.counts.as_mut() else {
            return;
        };
        let mut protected = 0usize;
        let mut seen: FxHashSet<&Key> = FxHashSet::default();
        for key in keys {
            if let Some(c) = counts.get_mut(key) {
                *c += 1;
                counts.move_to_end(key);
                protected += usize::from(seen.insert(key));
            }
        }
        let mut unprotected = counts.len() - protected;
        for key in keys {
            if counts.contains(key) {
                continue;
            }
            if counts.len() >= self.max_tracker_size {
                if unprotected == 0 {
                    continue;
                }
                counts.pop_front();
                unprotected -= 1;
            }
            counts.insert(key.clone(), 1);
        }
    }

    /// Records first accesses of `keys` by `req` and tells the policy.
    fn record_access(&mut self, req: &str, keys: &[Key], reused: &[Key]) -> Result<()> {
        let generation = self.generation;
        let r = self.requests.get_mut(req).expect("request recorded");
        let mut new_keys = Vec::new();
        for key in keys {
            if r.access.seen.contains(key) {
                continue;
            }
            let group = group_of(key)?;
            r.access
                .key_groups
                .entry(group)
                .or_default()
                .push(key.clone());
            r.access.seen.insert(key.clone());
            new_keys.push(key.clone());
        }
        debug_assert_eq!(r.access.generation, generation);
        if !new_keys.is_empty() {
            let positions: Vec<Option<i64>> = new_keys
                .iter()
                .map(|k| r.positions.get(k).copied())
                .collect();
            self.policy
                .on_request_access(&new_keys, &positions, &mut r.policy);
        }
        for key in reused {
            if !r.access.inserted.contains(key) {
                r.access.reused.insert(key.clone());
            }
        }
        Ok(())
    }

    /// Pins the chunks of `keys` for reading; returns their slots.
    pub fn prepare_load(&mut self, keys: &[Key], req: &str) -> Result<Vec<u32>> {
        for key in keys {
            match self.policy.get(key) {
                None => return Err(not_found(key, "is not in the host tier")),
                Some(c) if !c.is_ready() => return Err(not_found(key, "is not ready for reading")),
                Some(_) => {}
            }
        }
        let mut ids = Vec::with_capacity(keys.len());
        for key in keys {
            let chunk = self.policy.get_mut(key).expect("checked");
            chunk.ref_cnt += 1;
            ids.push(chunk.id);
            if chunk.ref_cnt == 1 {
                self.policy.mark_non_evictable(key);
                self.num_evictable -= 1;
            }
        }
        self.request(req);
        self.record_access(req, keys, keys)?;
        Ok(ids)
    }

    /// Marks `keys` recently used.
    pub fn touch(&mut self, keys: &[Key]) {
        self.policy.touch(keys);
    }

    /// Ends reads of `keys` prepared by `prepare_load`.
    pub fn complete_load(&mut self, keys: &[Key]) -> Result<()> {
        let mut reads: FxHashMap<&Key, i32> = FxHashMap::default();
        for key in keys {
            let n = reads.entry(key).or_insert(0);
            *n += 1;
            let held = self.policy.get(key).map_or(0, |c| c.ref_cnt);
            if held < *n {
                return Err(not_found(key, "has no load in flight"));
            }
        }
        for key in keys {
            let chunk = self.policy.get_mut(key).expect("checked");
            chunk.ref_cnt -= 1;
            if chunk.ref_cnt == 0 {
                self.num_evictable += 1;
                self.policy.mark_evictable(key);
            }
        }
        Ok(())
    }

    fn allocate(&mut self, n: usize) -> Vec<u32> {
        let fresh = n.min(self.num_chunks - self.num_allocated);
        let mut ids: Vec<u32> = (self.num_allocated..self.num_allocated + fresh)
            .map(|i| i as u32)
            .collect();
        self.num_allocated += fresh;
        for _ in fresh..n {
            ids.push(self.free_list.pop().expect("enough free chunks"));
        }
        ids
    }

    /// Decides which of `keys` to store, evicting to make room; `None` when the tier
    /// cannot make room (nothing is stored then, but the offer is recorded).
    pub fn prepare_store(&mut self, keys: &[Key], req: &str) -> Result<Option<StoreOutput>> {
        let offered: FxHashSet<Key> = keys.iter().cloned().collect();
        if offered.len() != keys.len() {
            return Err(KvError::InvalidArgument(
                "prepare_store was given a key twice".into(),
            ));
        }
        for key in keys {
            group_of(key)?;
        }
        self.record_offers(keys);
        let mut to_store: Vec<Key> = Vec::new();
        let mut ready_existing: Vec<Key> = Vec::new();
        for key in keys {
            match self.policy.get(key) {
                None => to_store.push(key.clone()),
                Some(c) if c.is_ready() => ready_existing.push(key.clone()),
                Some(_) => {}
            }
        }
        if let Some(counts) = &self.counts {
            let before = to_store.len();
            to_store.retain(|k| counts.get(k).copied().unwrap_or(0) >= self.store_threshold as u64);
            self.stores_skipped += (before - to_store.len()) as u64;
        }
        let r = self.request(req);
        let misses: Vec<Key> = to_store
            .iter()
            .filter(|k| !r.access.store_misses.contains(*k))
            .cloned()
            .collect();
        if !misses.is_empty() {
            r.access.store_misses.extend(misses.iter().cloned());
            self.policy.on_store_miss(&misses);
        }
        let recorded: FxHashSet<&Key> = to_store.iter().chain(&ready_existing).collect();
        let accessed: Vec<Key> = keys
            .iter()
            .filter(|k| recorded.contains(k))
            .cloned()
            .collect();
        self.record_access(req, &accessed, &ready_existing)?;
        if to_store.is_empty() {
            return Ok(Some(StoreOutput::default()));
        }
        let mut evicted_keys = Vec::new();
        let shortfall = to_store.len().saturating_sub(self.num_free());
        if shortfall > 0 {
            if shortfall > self.num_evictable {
                return Ok(None);
            }
            let Some(evicted) = self.policy.evict(shortfall, &offered) else {
                return Ok(None);
            };
            self.num_evictable -= evicted.len();
            for (key, chunk) in evicted {
                self.free_list.push(chunk.id);
                evicted_keys.push(key);
            }
        }
        if let (false, Some(events)) = (evicted_keys.is_empty(), self.events.as_mut()) {
            events.push(OffloadEvent {
                keys: evicted_keys.clone(),
                removed: true,
                metadata_only: false,
            });
        }
        let ids = self.allocate(to_store.len());
        let r = self.requests.get_mut(req).expect("request recorded");
        for (key, &id) in to_store.iter().zip(&ids) {
            let position = r.positions.get(key).copied();
            self.policy
                .insert(key.clone(), Chunk::pending(id), position, &mut r.policy);
        }
        self.num_write_pending += to_store.len();
        r.access.inserted.extend(to_store.iter().cloned());
        Ok(Some(StoreOutput {
            keys_to_store: to_store,
            chunk_ids: ids,
            evicted: evicted_keys,
        }))
    }

    /// Ends stores of `keys`: they become readable, or, when `success` is false, those
    /// not yet stored are dropped and their chunks freed.
    pub fn complete_store(&mut self, keys: &[Key], success: bool) {
        let mut done = Vec::new();
        for key in keys {
            let Some(chunk) = self.policy.get_mut(key) else {
                continue;
            };
            if chunk.is_ready() {
                continue;
            }
            self.num_write_pending -= 1;
            if success {
                chunk.ref_cnt = 0;
                self.num_evictable += 1;
                self.policy.mark_evictable(key);
            } else {
                self.free_list.push(chunk.id);
                self.policy.remove(key);
            }
            done.push(key.clone());
        }
        if let (false, Some(events)) = (done.is_empty(), self.events.as_mut()) {
            events.push(OffloadEvent {
                keys: done,
                removed: !success,
                metadata_only: !success,
            });
        }
    }

    /// Applies a finished request's accesses to the policy, once, and forgets the
    /// request (its id may not be used again).
    pub fn on_request_finished(&mut self, req: &str) {
        let Some(r) = self.requests.remove(req) else {
            return;
        };
        if r.access.generation != self.generation {
            return;
        }
        let mut ordered: Vec<Key> = Vec::with_capacity(r.access.seen.len());
        let position = |k: &Key| r.positions.get(k).copied();
        for group in r.access.key_groups.into_values() {
            let mut group = group;
            let positions: Vec<Option<i64>> = group.iter().map(position).collect();
            order_by_position(&mut group, &positions);
            ordered.extend(group);
        }
        let positions: Vec<Option<i64>> = ordered.iter().map(position).collect();
        order_by_position(&mut ordered, &positions);
        let insertion_only: FxHashSet<Key> = r
            .access
            .inserted
            .difference(&r.access.reused)
            .cloned()
            .collect();
        self.policy
            .on_request_finished(&ordered, &insertion_only, &r.access.reused);
    }

    /// Drops every chunk (vLLM's `reset_cache`); the offer tracker is kept.
    pub fn reset_cache(&mut self) {
        self.policy.clear();
        self.generation += 1;
        self.num_evictable = 0;
        self.num_write_pending = 0;
        self.free_list.clear();
        self.num_allocated = 0;
    }

    /// The events since the last call; a failed store's release lists only the keys
    /// still absent.
    pub fn take_events(&mut self) -> Vec<OffloadEvent> {
        let Some(events) = self.events.as_mut() else {
            return Vec::new();
        };
        let events = std::mem::take(events);
        let mut out = Vec::with_capacity(events.len());
        for mut event in events {
            if event.metadata_only {
                event.keys.retain(|k| self.policy.get(k).is_none());
                if event.keys.is_empty() {
                    continue;
                }
            }
            out.push(event);
        }
        out
    }

    /// Pins `key` (retention orders only).
    pub fn pin(&mut self, key: Key) -> Result<()> {
        self.policy.pin(key)
    }

    /// Drops one pin of `key`.
    pub fn unpin(&mut self, key: &[u8]) -> Result<()> {
        self.policy.unpin(key)
    }
}

fn not_found(key: &[u8], what: &str) -> KvError {
    KvError::InvalidArgument(format!("offload key {key:02x?} {what}"))
}
