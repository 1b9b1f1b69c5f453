//! HiSparse's host tier (vLLM 0.33's `HiSparseSourceManager.bind_host_pool` and
//! `SharedEventQueueBlockPool`): the second block pool that a host-resident group draws
//! from, and the rules that differ for that group.
//!
//! - The pool has `hisparse_host_num_blocks` blocks, caches only if the group does, names
//!   `"CPU"` in its events and hashes no lookahead tokens.
//! - Its events join the device pool's queue in call order: the coordinator forwards them
//!   after every call that reached the host pool ([`HostTier::forward_events`]).
//! - Its blocks never count against the device pool: an allocation the host pool cannot
//!   back answers with the device pool's size plus one, so admission fails (vLLM's
//!   sentinel, [`HostTier::admission`]).
//! - Its prefix hit is kept longer than the reconciled one ([`HostTier::group`]; the
//!   manager trims it to the local and external tokens when it adopts the hit).
//!
//! Only a coordinator with a host-resident group has a host tier; every other
//! coordinator's calls never reach this file.

use crate::attention::{AttentionKind, ManagerParams};
use crate::error::{KvError, Result};
use crate::events::event::MEDIUM_CPU;
use crate::pool::BlockPool;
use crate::types::BlockId;

/// The host pool and the group that draws from it.
#[derive(Debug, Clone)]
pub(crate) struct HostTier {
    pool: BlockPool,
    group: usize,
}

impl HostTier {
    /// The host tier of `groups`, if one of them is host resident: its pool has
    /// `num_blocks` blocks (`hisparse_host_num_blocks`). Refused with `InvalidArgument`
    /// (vLLM's `HiSparseCoordinator` raises or asserts): more than one host-resident
    /// group, one without a host capacity, HiSparse resident or hot groups without one,
    /// resident groups before it, and resident block sizes other than its own.
    pub(crate) fn new(
        groups: &[ManagerParams],
        num_blocks: Option<usize>,
        enable_caching: bool,
        hash_block_size: usize,
        enable_kv_cache_events: bool,
    ) -> Result<Option<Box<Self>>> {
        let mut host = groups.iter().enumerate().filter(|(_, p)| p.host_resident);
        let resident = || {
            groups
                .iter()
                .enumerate()
                .filter(|(_, p)| p.kind == AttentionKind::HiSparseResident)
        };
        let Some((group, params)) = host.next() else {
            if groups.iter().any(|p| p.kind.is_hisparse_device_kind()) {
                return Err(KvError::InvalidArgument(
                    "HiSparse resident and hot groups need a hisparse_source group".into(),
                ));
            }
            return Ok(None);
        };
        if resident().any(|(g, _)| g < group) {
            return Err(KvError::InvalidArgument(
                "the HiSparse host group must precede the resident groups".into(),
            ));
        }
        if resident().any(|(_, p)| p.block_size != params.block_size) {
            return Err(KvError::InvalidArgument(
                "the HiSparse host and resident groups must use one block size".into(),
            ));
        }
        if host.next().is_some() {
            return Err(KvError::InvalidArgument(
                "only one HiSparse host-resident group is supported".into(),
            ));
        }
        // vLLM's source manager is a full-attention manager: it never frees skipped
        // blocks, which lets the coordinator leave that call on the device pool.
        if params.kind.frees_skipped_blocks() {
            return Err(KvError::InvalidArgument(format!(
                "host-resident group {group} must be full attention (HiSparse's source \
                 manager), not {:?}",
                params.kind
            )));
        }
        let num_blocks = num_blocks.ok_or_else(|| {
            KvError::InvalidArgument(format!(
                "group {group} is host resident but the config has no \
                 hisparse_host_num_blocks"
            ))
        })?;
        let mut pool = BlockPool::new(
            num_blocks,
            enable_caching && params.caches_prefix(),
            hash_block_size,
            enable_kv_cache_events,
        )?;
        pool.set_medium(MEDIUM_CPU)?;
        Ok(Some(Box::new(Self { pool, group })))
    }

    /// The host-resident group.
    #[inline]
    pub(crate) fn group(&self) -> usize {
        self.group
    }

    /// The host pool.
    #[inline]
    pub(crate) fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The host pool, mutably.
    #[inline]
    pub(crate) fn pool_mut(&mut self) -> &mut BlockPool {
        &mut self.pool
    }

    /// Moves the host pool's events to the end of the device pool's queue.
    #[inline]
    pub(crate) fn forward_events(&mut self, device: &mut BlockPool) {
        let events = self.pool.take_events();
        device.events_mut().extend(events);
    }

    /// What the host-resident group adds to an admission's block count, given the
    /// `required` host blocks: nothing if the host pool has them free, else one more
    /// than the device pool holds, so the admission fails.
    #[inline]
    pub(crate) fn admission(&self, required: isize, device: &BlockPool) -> isize {
        if required > self.pool.num_free_blocks() as isize {
            device.num_blocks() as isize + 1
        } else {
            0
        }
    }
}

/// The pool group `g` draws from: the host pool for the host-resident group, the device
/// pool otherwise.
#[inline]
pub(crate) fn pool_for<'a>(
    device: &'a mut BlockPool,
    host: &'a mut Option<Box<HostTier>>,
    g: usize,
) -> &'a mut BlockPool {
    match host {
        Some(h) if h.group == g => &mut h.pool,
        _ => device,
    }
}

/// After a call on group `g`'s pool: the host pool's events join the device pool's queue
/// if `g` is the host-resident group.
#[inline]
pub(crate) fn after_call(device: &mut BlockPool, host: &mut Option<Box<HostTier>>, g: usize) {
    if let Some(h) = host.as_deref_mut().filter(|h| h.group == g) {
        h.forward_events(device);
    }
}

/// The part of the host-resident group's prefix hit `hits` that a request adopts: it
/// keeps a longer hit than the reconciled one (vLLM's `retains_longer_hit`), cut to the
/// `hit_tokens` the request reuses (the local and external hits; vLLM's
/// `retained_hit_group_ids`), in blocks of `block_size` tokens.
#[inline]
pub(crate) fn retained(hits: &[BlockId], block_size: usize, hit_tokens: usize) -> &[BlockId] {
    &hits[..hits.len().min(hit_tokens.div_ceil(block_size))]
}
