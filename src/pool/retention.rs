//! Retention policies: which free cached block is evicted first, and per-tenant quotas
//! (docs/retention.md). With no policy the pool keeps vLLM's single free queue and none
//! of this runs.
//!
//! With a policy the free queue has `classes + 2` lists, popped in order: the front
//! (uncached blocks, then expired cached ones), one list per priority class, and the
//! session list. Each list is appended in clock order, so expiries are found at list
//! heads: no list is ever scanned. Quotas keep a second set of intrusive lists, one per
//! tenant, in the order the tenant's blocks were freed.

use rustc_hash::FxHashMap;

use super::free_queue::FreeQueue;
use crate::error::{KvError, Result};
use crate::types::BlockId;

/// The tenant index of a block that counts against no quota.
pub const NO_TENANT: u32 = u32::MAX;

/// The most priority classes a policy may have.
pub const MAX_CLASSES: usize = 64;

/// The free list of uncached and expired blocks, popped first.
pub const FRONT: usize = 0;

/// A retention policy, as given: validated by [`RetentionPolicy::validate`]. The default
/// has one class and nothing else (vLLM's order).
#[derive(Debug, Clone, PartialEq)]
pub struct RetentionPolicy {
    /// Number of priority classes (class 0 is evicted first), 1 to [`MAX_CLASSES`].
    pub classes: usize,
    /// The class of a request whose priority `priority_classes` does not map.
    pub default_class: usize,
    /// Request priority (vLLM's `Request.priority`) to class.
    pub priority_classes: Vec<(i64, usize)>,
    /// Idle time after which a cached block is evicted first: empty (none), one value
    /// for every class, or one per class (`None`: no TTL for that class).
    pub ttl_s: Vec<Option<f64>>,
    /// How long the cached blocks of a request with a session are kept after it ends.
    pub session_s: Option<f64>,
    /// Tenant (cache salt, else LoRA name) to the most unheld cached blocks it keeps.
    pub tenant_quotas: Vec<(String, usize)>,
    /// The quota of a named tenant not in `tenant_quotas` (`None`: unlimited).
    pub default_tenant_quota: Option<usize>,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        Self {
            classes: 1,
            default_class: 0,
            priority_classes: Vec::new(),
            ttl_s: Vec::new(),
            session_s: None,
            tenant_quotas: Vec::new(),
            default_tenant_quota: None,
        }
    }
}

impl RetentionPolicy {
    /// The fields' names, in declaration order: the one list the Python class's repr,
    /// `kvblocks.retention_spec` and the docs are derived from or checked against.
    pub const FIELDS: [&'static str; 7] = [
        "classes",
        "default_class",
        "priority_classes",
        "ttl_s",
        "session_s",
        "tenant_quotas",
        "default_tenant_quota",
    ];

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(KvError::InvalidArgument(msg));
        let k = self.classes;
        if !(1..=MAX_CLASSES).contains(&k) {
            return bad(format!(
                "classes must be between 1 and {MAX_CLASSES}, got {k}"
            ));
        }
        if self.default_class >= k {
            return bad(format!(
                "default_class {} is not a class (0 to {})",
                self.default_class,
                k - 1
            ));
        }
        if let Some(&(p, c)) = self.priority_classes.iter().find(|&&(_, c)| c >= k) {
            return bad(format!(
                "priority_classes maps priority {p} to {c}, not a class (0 to {})",
                k - 1
            ));
        }
        if self.ttl_s.len() > 1 && self.ttl_s.len() != k {
            return bad(format!(
                "ttl_s has {} values for {k} classes (give one, or one per class)",
                self.ttl_s.len()
            ));
        }
        let seconds = self.ttl_s.iter().flatten().chain(&self.session_s);
        if let Some(s) = seconds.into_iter().find(|s| !(s.is_finite() && **s >= 0.0)) {
            return bad(format!(
                "ttl_s and session_s must be finite and >= 0, got {s}"
            ));
        }
        if u32::try_from(self.tenant_quotas.iter().map(|q| q.1).max().unwrap_or(0)).is_err() {
            return bad("a tenant quota must fit in 32 bits".into());
        }
        Ok(())
    }

    /// The TTL of class `c` (`ttl_s` holds none, one for every class, or one per class).
    pub fn ttl(&self, c: usize) -> Option<f64> {
        match self.ttl_s.len() {
            0 => None,
            1 => self.ttl_s[0],
            _ => self.ttl_s[c],
        }
    }

    /// The quota of tenant `name`, if it has one.
    fn quota(&self, name: &str) -> Option<usize> {
        self.tenant_quotas
            .iter()
            .find(|(t, _)| t == name)
            .map(|&(_, q)| q)
            .or(self.default_tenant_quota)
    }
}

/// What a request tells the policy about itself (read once, when the manager first
/// allocates for it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionHints {
    /// vLLM's request priority (lower is more urgent); 0 by default.
    pub priority: i64,
    /// Whether the request belongs to a session.
    pub session: bool,
    /// The request's tenant: its cache salt, else its LoRA name.
    pub tenant: Option<String>,
}

impl RetentionHints {
    /// The hints of a request with this priority, session (or none), cache salt and
    /// LoRA adapter name: the tenant is the cache salt, else the LoRA name.
    pub fn new(
        priority: i64,
        session: bool,
        cache_salt: Option<&str>,
        lora_name: Option<&str>,
    ) -> Self {
        Self {
            priority,
            session,
            tenant: cache_salt.or(lora_name).map(str::to_owned),
        }
    }
}

/// How a free treats the blocks it frees: their class, whether they are a session's,
/// and the tenant whose quota they count against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeTag {
    /// Priority class.
    pub class: u8,
    /// Kept for the session window.
    pub session: bool,
    /// Tenant index, or [`NO_TENANT`].
    pub tenant: u32,
}

/// The default class, no session, no tenant.
fn default_tag(policy: &RetentionPolicy) -> FreeTag {
    FreeTag {
        class: policy.default_class as u8,
        session: false,
        tenant: NO_TENANT,
    }
}

/// The policy's state beside the pool's free lists.
///
/// NOTE 1: `class_of[b]` and `idle_since[b]` describe a cached block in a class or the
/// session list; they are stale for any other block.
/// NOTE 2: `tenant_of[b] != NO_TENANT` iff `b` is linked in that tenant's list, which
/// holds exactly the tenant's free cached blocks that were freed under its tag.
#[derive(Debug, Clone)]
pub struct PolicyState {
    policy: RetentionPolicy,
    class_of: Vec<u8>,
    idle_since: Vec<f64>,
    tenant_of: Vec<u32>,
    tenants: FreeQueue,
    tenant_index: FxHashMap<String, u32>,
    quota: Vec<u32>,
    count: Vec<u32>,
    /// The tag the next free carries.
    tag: FreeTag,
}

impl PolicyState {
    /// The state for a pool of `num_blocks` blocks under a validated `policy`.
    pub fn new(policy: RetentionPolicy, num_blocks: usize) -> Self {
        let tag = default_tag(&policy);
        Self {
            policy,
            class_of: vec![0; num_blocks],
            idle_since: vec![0.0; num_blocks],
            tenant_of: vec![NO_TENANT; num_blocks],
            tenants: FreeQueue::empty(num_blocks, 0),
            tenant_index: FxHashMap::default(),
            quota: Vec::new(),
            count: Vec::new(),
            tag,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &RetentionPolicy {
        &self.policy
    }

    /// Number of free lists: the front, one per class, the session list.
    pub fn num_lists(&self) -> usize {
        self.policy.classes + 2
    }

    fn class_list(c: u8) -> usize {
        1 + c as usize
    }

    fn session_list(&self) -> usize {
        self.policy.classes + 1
    }

    /// The tag of a free with no request behind it: the default class.
    pub fn default_tag(&self) -> FreeTag {
        default_tag(&self.policy)
    }

    /// The tag of a request's frees.
    pub fn tag_for(&mut self, hints: &RetentionHints) -> FreeTag {
        let class = self
            .policy
            .priority_classes
            .iter()
            .find(|&&(p, _)| p == hints.priority)
            .map_or(self.policy.default_class, |&(_, c)| c);
        self.make_tag(class, hints.session, hints.tenant.as_deref())
    }

    /// The tag of a free that names its class, session and tenant directly
    /// (`BlockPool.free_blocks`); `None` takes the default class.
    pub fn tag_with(
        &mut self,
        class: Option<usize>,
        session: bool,
        tenant: Option<&str>,
    ) -> Result<FreeTag> {
        let class = class.unwrap_or(self.policy.default_class);
        if class >= self.policy.classes {
            return Err(KvError::InvalidArgument(format!(
                "priority_class {class} is not a class (0 to {})",
                self.policy.classes - 1
            )));
        }
        Ok(self.make_tag(class, session, tenant))
    }

    /// The tag of a valid class: a session counts only with a session window, a tenant
    /// only with a quota.
    fn make_tag(&mut self, class: usize, session: bool, tenant: Option<&str>) -> FreeTag {
        FreeTag {
            class: class as u8,
            session: session && self.policy.session_s.is_some(),
            tenant: tenant.map_or(NO_TENANT, |t| self.tenant(t)),
        }
    }

    /// The index of tenant `name` if it has a quota (registered on first sight), else
    /// [`NO_TENANT`].
    fn tenant(&mut self, name: &str) -> u32 {
        if let Some(&t) = self.tenant_index.get(name) {
            return t;
        }
        let Some(q) = self.policy.quota(name) else {
            return NO_TENANT;
        };
        let t = self.tenants.add_list() as u32;
        self.tenant_index.insert(name.to_owned(), t);
        self.quota.push(q as u32);
        self.count.push(0);
        t
    }

    /// Sets the tag the next frees carry.
    pub fn set_tag(&mut self, tag: FreeTag) {
        self.tag = tag;
    }

    /// The tag the next frees carry.
    pub fn tag(&self) -> FreeTag {
        self.tag
    }

    /// Links freed cached blocks, in order, under `tag` at clock `now`: to the tail of
    /// the session list or of their class list, and of their tenant's list.
    pub fn link_freed(
        &mut self,
        queue: &mut FreeQueue,
        blocks: &[BlockId],
        tag: FreeTag,
        now: f64,
    ) {
        for &b in blocks {
            self.class_of[b as usize] = tag.class;
            self.idle_since[b as usize] = now;
        }
        let list = if tag.session {
            self.session_list()
        } else {
            Self::class_list(tag.class)
        };
        queue.append_to(list, blocks);
        if tag.tenant != NO_TENANT {
            let t = tag.tenant as usize;
            for &b in blocks {
                self.tenant_of[b as usize] = tag.tenant;
            }
            self.tenants.append_to(t, blocks);
            self.count[t] += blocks.len() as u32;
        }
    }

    /// Notes that free cached block `b` leaves the free lists or loses its hash.
    #[inline]
    pub fn forget(&mut self, b: BlockId) {
        let t = self.tenant_of[b as usize];
        if t != NO_TENANT {
            self.tenants.remove(b);
            self.count[t as usize] -= 1;
            self.tenant_of[b as usize] = NO_TENANT;
        }
    }

    /// Takes the blocks tenant `tag.tenant` keeps over its quota, least recently freed
    /// first, into `out` (forgetting them); the caller evicts them.
    pub fn take_over_quota(&mut self, tag: FreeTag, out: &mut Vec<BlockId>) {
        if tag.tenant == NO_TENANT {
            return;
        }
        let t = tag.tenant as usize;
        while self.count[t] > self.quota[t] {
            let b = self
                .tenants
                .first(t)
                .expect("a tenant's count matches its list");
            self.forget(b);
            out.push(b);
        }
    }

    /// Moves what the clock reaching `now` expires (docs/retention.md,
    /// `advance_time`): ended session windows to their class lists, then each class's
    /// blocks past its TTL to the tail of the front.
    pub fn advance(&mut self, queue: &mut FreeQueue, now: f64) {
        if let Some(w) = self.policy.session_s {
            let list = self.session_list();
            while let Some(b) = queue.first(list) {
                let end = self.idle_since[b as usize] + w;
                if end > now {
                    break;
                }
                queue.remove(b);
                self.idle_since[b as usize] = end;
                queue.append_to(Self::class_list(self.class_of[b as usize]), &[b]);
            }
        }
        for c in 0..self.policy.classes as u8 {
            let Some(ttl) = self.policy.ttl(c as usize) else {
                continue;
            };
            let list = Self::class_list(c);
            while let Some(b) = queue.first(list) {
                if self.idle_since[b as usize] + ttl > now {
                    break;
                }
                queue.remove(b);
                queue.append_to(FRONT, &[b]);
            }
        }
    }

    /// Forgets every tenant link (the prefix cache was cleared).
    pub fn clear_tenants(&mut self) {
        let lists = self.tenants.num_lists();
        self.tenants = FreeQueue::empty(self.tenant_of.len(), lists);
        self.tenant_of.iter_mut().for_each(|t| *t = NO_TENANT);
        self.count.iter_mut().for_each(|c| *c = 0);
    }

    /// Checks NOTE 2 and the quotas, given which blocks are free and cached.
    pub fn check(
        &self,
        free_and_cached: impl Fn(BlockId) -> bool,
    ) -> std::result::Result<(), String> {
        for t in 0..self.count.len() {
            let mut n = 0u32;
            for b in self.tenants.iter_list(t) {
                if self.tenant_of[b as usize] != t as u32 || !free_and_cached(b) {
                    return Err(format!(
                        "tenant {t} lists block {b}, not its free cached block"
                    ));
                }
                n += 1;
            }
            if n != self.count[t] || n > self.quota[t] {
                return Err(format!(
                    "tenant {t}: {n} listed, count {}, quota {}",
                    self.count[t], self.quota[t]
                ));
            }
        }
        Ok(())
    }

    /// Tenants with a quota and their unheld cached blocks, by name.
    pub fn tenant_counts(&self) -> Vec<(String, usize)> {
        let mut out: Vec<_> = self
            .tenant_index
            .iter()
            .map(|(name, &t)| (name.clone(), self.count[t as usize] as usize))
            .collect();
        out.sort();
        out
    }
}

impl super::BlockPool {
    /// Sets a retention policy on a fresh pool (no block handed out or cached yet).
    /// Without one the pool keeps vLLM's order.
    pub fn set_retention(&mut self, policy: RetentionPolicy) -> Result<()> {
        policy.validate()?;
        if self.num_free_blocks() + 1 != self.num_blocks() || !self.map.is_empty() {
            return Err(KvError::InvalidArgument(
                "a retention policy is set on a fresh pool only".into(),
            ));
        }
        let r = PolicyState::new(policy, self.num_blocks());
        let order: Vec<BlockId> = self.queue.iter().collect();
        self.queue = FreeQueue::empty(self.num_blocks(), r.num_lists());
        self.queue.append_to(FRONT, &order);
        self.retention = Some(Box::new(r));
        Ok(())
    }

    /// The policy, if one is set.
    pub fn retention_policy(&self) -> Option<&RetentionPolicy> {
        self.retention.as_deref().map(PolicyState::policy)
    }

    /// The pool's clock.
    pub fn now(&self) -> f64 {
        self.now
    }

    /// Advances the clock to `now` (seconds, or a step counter) and moves what that
    /// expires. `now` going back is an error and changes nothing.
    pub fn advance_time(&mut self, now: f64) -> Result<()> {
        if !now.is_finite() || now < self.now {
            return Err(KvError::InvalidArgument(format!(
                "time must be finite and not go back: {now} after {}",
                self.now
            )));
        }
        self.now = now;
        if let Some(r) = self.retention.as_deref_mut() {
            r.advance(&mut self.queue, now);
        }
        Ok(())
    }

    /// The tag of a request's frees (the default tag without a policy).
    pub fn free_tag_for(&mut self, hints: &RetentionHints) -> Option<FreeTag> {
        self.retention.as_deref_mut().map(|r| r.tag_for(hints))
    }

    /// The tag of a free that names its class, session and tenant (`None` without a
    /// policy, where they mean nothing).
    pub fn free_tag_with(
        &mut self,
        class: Option<usize>,
        session: bool,
        tenant: Option<&str>,
    ) -> Result<Option<FreeTag>> {
        match self.retention.as_deref_mut() {
            Some(r) => r.tag_with(class, session, tenant).map(Some),
            None => Ok(None),
        }
    }

    /// Sets the tag the next frees carry (no-op without a policy).
    #[inline]
    pub fn set_free_tag(&mut self, tag: FreeTag) {
        if let Some(r) = self.retention.as_deref_mut() {
            r.set_tag(tag);
        }
    }

    /// Unlinks free block `b` from the free lists (a hit or a pin takes it).
    #[inline]
    pub(super) fn unlink_free(&mut self, b: BlockId) {
        self.queue.remove(b);
        if let Some(r) = self.retention.as_deref_mut() {
            r.forget(b);
        }
    }

    /// Links freed cached blocks as the current tag says (vLLM's LRU tail without a
    /// policy), then evicts what takes their tenant over its quota.
    pub(super) fn link_cached(&mut self, blocks: &[BlockId]) {
        let tag = self.retention.as_deref().map(PolicyState::tag);
        self.link_cached_as(blocks, tag);
    }

    /// Links freed cached block `b` with the default tag (a pin let go of it).
    pub(super) fn link_cached_default(&mut self, b: BlockId) {
        let tag = self.retention.as_deref().map(PolicyState::default_tag);
        self.link_cached_as(&[b], tag);
    }

    /// [`link_cached`](Self::link_cached) under `tag` (`None`: no policy).
    fn link_cached_as(&mut self, blocks: &[BlockId], tag: Option<FreeTag>) {
        let (Some(r), Some(tag)) = (self.retention.as_deref_mut(), tag) else {
            self.queue.append_n(blocks);
            return;
        };
        r.link_freed(&mut self.queue, blocks, tag, self.now);
        let mut over = std::mem::take(&mut self.over_quota);
        over.clear();
        r.take_over_quota(tag, &mut over);
        for &b in &over {
            self.queue.remove(b);
            self.evict_hash(b);
            self.queue.prepend_n(&[b]);
        }
        self.over_quota = over;
    }

    /// A free block that lost its cache entry moves to the head of the front under a
    /// policy (it is free space now); without one it stays where it is, as in vLLM.
    pub(super) fn uncached_while_free(&mut self, b: BlockId) {
        if let Some(r) = self.retention.as_deref_mut() {
            r.forget(b);
            self.queue.remove(b);
            self.queue.prepend_n(&[b]);
        }
    }

    /// Tenants with a quota and their unheld cached blocks (empty without a policy).
    pub fn tenant_cached_blocks(&self) -> Vec<(String, usize)> {
        self.retention
            .as_deref()
            .map(PolicyState::tenant_counts)
            .unwrap_or_default()
    }

    /// Checks the policy's lists: class and session lists hold cached blocks only, and
    /// the tenant lists their free cached blocks within quota.
    pub(super) fn check_retention(&self) -> std::result::Result<(), String> {
        let Some(r) = self.retention.as_deref() else {
            return Ok(());
        };
        for list in 1..r.num_lists() {
            if let Some(b) = self
                .queue
                .iter_list(list)
                .find(|&b| self.hash_of[b as usize].is_none())
            {
                return Err(format!("free list {list} holds uncached block {b}"));
            }
        }
        r.check(|b| self.ref_cnt[b as usize] == 0 && self.hash_of[b as usize].is_some())
    }
}
