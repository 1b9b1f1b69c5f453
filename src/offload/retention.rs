//! kvblocks' retention over the host tier: the chunks keep vLLM's LRU ranks, and the
//! eviction order refines them (docs/offload.md, "Retention on the host tier"):
//!
//! 1. Pinned keys are never evicted (a pin registered before the chunk is stored holds
//!    from its store on).
//! 2. A tenant over its quota of evictable chunks loses its own least recent ones first.
//! 3. Then the lowest priority class goes first, least recent first within a class.
//!
//! TTLs and session windows need a clock the host tier does not have: a policy with
//! `ttl_s` or `session_s` is refused.

use std::collections::BTreeSet;

use rustc_hash::{FxHashMap, FxHashSet};

use super::ranks::Ranks;
use super::{Chunk, Key, Policy, Rank, ReqState};
use crate::error::{KvError, Result};
use crate::pool::RetentionPolicy;

const NO_TENANT: u32 = u32::MAX;

/// The retention order of the host tier.
#[derive(Debug, Clone)]
pub struct RetentionOrder {
    policy: RetentionPolicy,
    ranks: Ranks,
    /// (class, tenant) of each held key.
    tags: FxHashMap<Key, (u8, u32)>,
    /// Evictable, unpinned chunks in eviction order.
    order: BTreeSet<(u8, Rank, Key)>,
    /// The same chunks of each tenant with a quota, least recent first.
    by_tenant: Vec<BTreeSet<(Rank, Key)>>,
    quotas: Vec<usize>,
    tenant_index: FxHashMap<String, u32>,
    pins: FxHashMap<Key, u32>,
}

impl RetentionOrder {
    /// The order of a validated `policy`; TTLs and session windows are refused.
    pub fn new(policy: RetentionPolicy) -> Result<Self> {
        policy.validate()?;
        if !policy.ttl_s.is_empty() || policy.session_s.is_some() {
            return Err(KvError::InvalidArgument(
                "the host tier has no clock: ttl_s and session_s are not supported there".into(),
            ));
        }
        Ok(Self {
            policy,
            ranks: Ranks::default(),
            tags: FxHashMap::default(),
            order: BTreeSet::new(),
            by_tenant: Vec::new(),
            quotas: Vec::new(),
            tenant_index: FxHashMap::default(),
            pins: FxHashMap::default(),
        })
    }

    /// The (class, tenant index) a request's chunks are stored under.
    fn tag(&mut self, req: &ReqState) -> (u8, u32) {
        let p = &self.policy;
        let class = p
            .priority_classes
            .iter()
            .find(|&&(prio, _)| prio == req.priority)
            .map_or(p.default_class, |&(_, c)| c) as u8;
        let Some(name) = req.tenant.as_deref() else {
            return (class, NO_TENANT);
        };
        if let Some(&t) = self.tenant_index.get(name) {
            return (class, t);
        }
        let quota = p
            .tenant_quotas
            .iter()
            .find(|(t, _)| t == name)
            .map(|&(_, q)| q)
            .or(p.default_tenant_quota);
        let Some(quota) = quota else {
            return (class, NO_TENANT);
        };
        let t = self.quotas.len() as u32;
        self.quotas.push(quota);
        self.by_tenant.push(BTreeSet::new());
        self.tenant_index.insert(name.to_owned(), t);
        (class, t)
    }

    fn in_order(&self, key: &[u8]) -> bool {
        !self.pins.contains_key(key) && self.ranks.entries.get(key).is_some_and(|e| e.evictable)
    }

    fn enter(&mut self, key: &Key, rank: Rank) {
        let (class, tenant) = self.tags[key];
        self.order.insert((class, rank, key.clone()));
        if tenant != NO_TENANT {
            self.by_tenant[tenant as usize].insert((rank, key.clone()));
        }
    }

    fn leave(&mut self, key: &Key, rank: Rank) {
        let (class, tenant) = self.tags[key];
        self.order.remove(&(class, rank, key.clone()));
        if tenant != NO_TENANT {
            self.by_tenant[tenant as usize].remove(&(rank, key.clone()));
        }
    }

    fn reorder(&mut self, updated: Vec<(Key, Rank)>) {
        for (key, old) in updated {
            if self.pins.contains_key(&key) {
                continue;
            }
            self.leave(&key, old);
            let rank = self.ranks.entries[&key].rank;
            self.enter(&key, rank);
        }
    }

    /// Evictable chunks of tenant `t` (its quota counts these).
    pub fn tenant_chunks(&self, tenant: &str) -> usize {
        self.tenant_index
            .get(tenant)
            .map_or(0, |&t| self.by_tenant[t as usize].len())
    }
}

impl Policy for RetentionOrder {
    fn get(&self, key: &[u8]) -> Option<&Chunk> {
        self.ranks.entries.get(key).map(|e| &e.chunk)
    }

    fn get_mut(&mut self, key: &[u8]) -> Option<&mut Chunk> {
        self.ranks.entries.get_mut(key).map(|e| &mut e.chunk)
    }

    fn insert(&mut self, key: Key, chunk: Chunk, position: Option<i64>, req: &mut ReqState) {
        let tag = self.tag(req);
        self.remove(&key);
        self.tags.insert(key.clone(), tag);
        self.ranks.insert(key.clone(), chunk, position, req);
        if self.in_order(&key) {
            let rank = self.ranks.entries[&key].rank;
            self.enter(&key, rank);
        }
    }

    fn remove(&mut self, key: &[u8]) {
        let Some((k, e)) = self.ranks.entries.get_key_value(key) else {
            return;
        };
        let (k, rank) = (k.clone(), e.rank);
        if self.in_order(key) {
            self.leave(&k, rank);
        }
        self.ranks.remove(key);
        self.tags.remove(key);
    }

    fn touch(&mut self, keys: &[Key]) {
        let updated = self.ranks.renew(keys.iter().rev());
        self.reorder(updated);
    }

    fn on_request_access(&mut self, keys: &[Key], positions: &[Option<i64>], req: &mut ReqState) {
        let updated = self.ranks.request_access(keys, positions, req);
        self.reorder(updated);
    }

    fn evict(&mut self, n: usize, protected: &FxHashSet<Key>) -> Option<Vec<(Key, Chunk)>> {
        // No reservation from `n`: it comes from the caller and may exceed the chunks held.
        let mut chosen: Vec<Key> = Vec::new();
        let mut taken: FxHashSet<Key> = FxHashSet::default();
        for (t, chunks) in self.by_tenant.iter().enumerate() {
            let over = chunks.len().saturating_sub(self.quotas[t]);
            let own = chunks
                .iter()
                .filter(|(_, k)| !protected.contains(k))
                .take(over.min(n - chosen.len()));
            for (_, k) in own {
                taken.insert(k.clone());
                chosen.push(k.clone());
            }
        }
        let rest = self
            .order
            .iter()
            .filter(|(_, _, k)| !protected.contains(k) && !taken.contains(k))
            .take(n - chosen.len());
        chosen.extend(rest.map(|(_, _, k)| k.clone()).collect::<Vec<_>>());
        if chosen.len() < n {
            return None;
        }
        let evicted = chosen
            .into_iter()
            .map(|key| {
                let chunk = self.ranks.entries[&key].chunk;
                self.remove(&key);
                (key, chunk)
            })
            .collect();
        Some(evicted)
    }

    fn clear(&mut self) {
        self.ranks.clear();
        self.tags.clear();
        self.order.clear();
        self.by_tenant.iter_mut().for_each(BTreeSet::clear);
    }

    fn mark_evictable(&mut self, key: &[u8]) {
        if self.ranks.set_evictable(key, true) == Some(false) && !self.pins.contains_key(key) {
            let (k, e) = self.ranks.entries.get_key_value(key).expect("held key");
            let (k, rank) = (k.clone(), e.rank);
            self.enter(&k, rank);
        }
    }

    fn mark_non_evictable(&mut self, key: &[u8]) {
        let was_in = self.in_order(key);
        if self.ranks.set_evictable(key, false).is_some() && was_in {
            let (k, e) = self.ranks.entries.get_key_value(key).expect("held key");
            let (k, rank) = (k.clone(), e.rank);
            self.leave(&k, rank);
        }
    }

    fn pin(&mut self, key: Key) -> Result<()> {
        let was_in = self.in_order(&key);
        *self.pins.entry(key.clone()).or_insert(0) += 1;
        if was_in {
            let rank = self.ranks.entries[&key].rank;
            self.leave(&key, rank);
        }
        Ok(())
    }

    fn unpin(&mut self, key: &[u8]) -> Result<()> {
        let Some((k, count)) = self.pins.get_key_value(key) else {
            return Err(KvError::NotPinned(format!(
                "offload key {key:02x?} is not pinned"
            )));
        };
        let (k, count) = (k.clone(), *count);
        if count > 1 {
            self.pins.insert(k, count - 1);
            return Ok(());
        }
        self.pins.remove(key);
        if self.in_order(key) {
            let rank = self.ranks.entries[key].rank;
            self.enter(&k, rank);
        }
        Ok(())
    }

    fn generation(&self) -> u64 {
        self.ranks.generation
    }
}
