//! Python bindings for the `pool` module: `kvblocks.BlockPool`, vLLM's `BlockPool` with
//! blocks addressed by id.

use std::ops::{Deref, DerefMut};

use pyo3::prelude::*;

use super::ids::{extract_u32s, IdObjects};
use pyo3::types::{PyBytes, PyList};

use super::events::events_to_py;
use super::manager::PyKVCacheManager;
use super::non_negative::NonNegativeInt;
use super::retention::PyRetentionPolicy;
use rustc_hash::FxHashMap;

use crate::error::KvError;
use crate::events::event::TokensOnly;
use crate::pool::{BlockPool, HashKey};
use crate::types::{BlockHash, BlockId, GroupId};

/// Who owns a `BlockPool` object's pool: the object itself, or a manager (the
/// manager's `block_pool`).
enum PoolOwner {
    Own(Box<BlockPool>),
    Manager(Py<PyKVCacheManager>),
    /// A manager's HiSparse host pool.
    ManagerHost(Py<PyKVCacheManager>),
}

/// The pool, borrowed from its owner for one call.
enum BorrowedPool<'a, 'py> {
    Own(&'a mut BlockPool),
    Manager(PyRefMut<'py, PyKVCacheManager>),
    /// A manager's host pool: its events join the manager's queue when the call ends.
    ManagerHost(PyRefMut<'py, PyKVCacheManager>),
}

impl Drop for BorrowedPool<'_, '_> {
    fn drop(&mut self) {
        match self {
            Self::ManagerHost(m) => m.forward_host_events(),
            // HiSparse loses the pages of unpinned blocks the call handed out.
            Self::Manager(m) => m.drain_reused(),
            Self::Own(_) => {}
        }
    }
}

impl Deref for BorrowedPool<'_, '_> {
    type Target = BlockPool;
    fn deref(&self) -> &BlockPool {
        match self {
            Self::Own(p) => p,
            Self::Manager(m) => m.core_pool(),
            Self::ManagerHost(m) => m.core_host_pool(),
        }
    }
}

impl DerefMut for BorrowedPool<'_, '_> {
    fn deref_mut(&mut self) -> &mut BlockPool {
        match self {
            Self::Own(p) => p,
            Self::Manager(m) => m.core_pool_mut(),
            Self::ManagerHost(m) => m.core_host_pool_mut(),
        }
    }
}

impl PoolOwner {
    fn borrow<'a, 'py>(&'a mut self, py: Python<'py>) -> PyResult<BorrowedPool<'a, 'py>> {
        Ok(match self {
            Self::Own(p) => BorrowedPool::Own(p),
            Self::Manager(m) => BorrowedPool::Manager(m.bind(py).try_borrow_mut()?),
            Self::ManagerHost(m) => BorrowedPool::ManagerHost(m.bind(py).try_borrow_mut()?),
        })
    }
}

/// vLLM's `BlockPool` over block ids (block 0 is the null block). A manager's
/// `block_pool` is one too, over the manager's own pool.
#[pyclass(name = "BlockPool", module = "kvblocks._core")]
pub(crate) struct PyBlockPool {
    owner: PoolOwner,
    /// Reused output buffer of `get_new_blocks` (no allocation per call).
    scratch: Vec<BlockId>,
    /// Shared int objects for the ids handed out.
    id_objects: IdObjects,
    /// The `on_reuse` callback of each block the core watches (`unpin_blocks`).
    on_reuse: FxHashMap<BlockId, Py<PyAny>>,
}

/// The keys of each hash in each group (group 0 by default).
fn keys_of(
    block_hashes: &[Bound<'_, PyAny>],
    group_ids: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<HashKey>> {
    let groups: Vec<GroupId> = match group_ids {
        Some(g) => extract_u32s(g, "group ids")?,
        None => vec![0],
    };
    let hashes = block_hashes
        .iter()
        .map(extract_hash)
        .collect::<PyResult<Vec<_>>>()?;
    Ok(groups
        .iter()
        .flat_map(|&group| hashes.iter().map(move |&hash| HashKey { hash, group }))
        .collect())
}

/// Extracts `bytes` as a block hash (at most 32 bytes).
fn extract_hash(obj: &Bound<'_, PyAny>) -> PyResult<BlockHash> {
    let bytes = obj.downcast::<PyBytes>()?;
    Ok(BlockHash::from_slice(bytes.as_bytes())?)
}

#[pymethods]
impl PyBlockPool {
    #[new]
    #[pyo3(signature = (num_gpu_blocks, enable_caching=true, hash_block_size=16,
                        enable_kv_cache_events=false, *, count_null_block_refs=false,
                        retention=None, medium="GPU"))]
    fn new(
        num_gpu_blocks: usize,
        enable_caching: bool,
        hash_block_size: usize,
        enable_kv_cache_events: bool,
        count_null_block_refs: bool,
        retention: Option<PyRef<'_, PyRetentionPolicy>>,
        medium: &str,
    ) -> PyResult<Self> {
        let mut pool = BlockPool::new(
            num_gpu_blocks,
            enable_caching,
            hash_block_size,
            enable_kv_cache_events,
        )?;
        pool.set_count_null_block_refs(count_null_block_refs);
        pool.set_medium(medium)?;
        if let Some(policy) = retention {
            pool.set_retention(policy.inner.clone())?;
        }
        Ok(Self {
            owner: PoolOwner::Own(Box::new(pool)),
            scratch: Vec::new(),
            id_objects: IdObjects::default(),
            on_reuse: FxHashMap::default(),
        })
    }

    /// The retention policy, if one is set.
    #[getter]
    fn retention(&mut self, py: Python<'_>) -> PyResult<Option<PyRetentionPolicy>> {
        let pool = self.owner.borrow(py)?;
        Ok(pool
            .retention_policy()
            .map(|p| PyRetentionPolicy { inner: p.clone() }))
    }

    /// The pool's clock (`advance_time`).
    #[getter]
    fn now(&mut self, py: Python<'_>) -> PyResult<f64> {
        Ok(self.owner.borrow(py)?.now())
    }

    fn advance_time(&mut self, py: Python<'_>, now: f64) -> PyResult<()> {
        Ok(self.owner.borrow(py)?.advance_time(now)?)
    }

    #[pyo3(signature = (block_hashes, group_ids=None))]
    fn pin(
        &mut self,
        py: Python<'_>,
        block_hashes: Vec<Bound<'_, PyAny>>,
        group_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let keys = keys_of(&block_hashes, group_ids)?;
        self.owner.borrow(py)?.pin(&keys);
        Ok(())
    }

    #[pyo3(signature = (block_hashes, group_ids=None))]
    fn unpin(
        &mut self,
        py: Python<'_>,
        block_hashes: Vec<Bound<'_, PyAny>>,
        group_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let keys = keys_of(&block_hashes, group_ids)?;
        Ok(self.owner.borrow(py)?.unpin(&keys)?)
    }

    #[getter]
    fn num_pinned_blocks(&mut self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.owner.borrow(py)?.num_pinned_blocks())
    }

    /// Tenants with a quota and how many unheld cached blocks each keeps.
    fn get_tenant_cached_blocks(
        &mut self,
        py: Python<'_>,
    ) -> PyResult<std::collections::BTreeMap<String, usize>> {
        Ok(self
            .owner
            .borrow(py)?
            .tenant_cached_blocks()
            .into_iter()
            .collect())
    }

    /// Total blocks, null block included.
    #[getter]
    fn num_gpu_blocks(&mut self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.owner.borrow(py)?.num_blocks())
    }

    /// Whether prefix caching is on.
    #[getter]
    fn enable_caching(&mut self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.owner.borrow(py)?.enable_caching())
    }

    /// Tokens per hash block.
    #[getter]
    fn hash_block_size(&mut self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.owner.borrow(py)?.hash_block_size())
    }

    /// The medium the pool's events name.
    #[getter]
    fn medium(&mut self, py: Python<'_>) -> PyResult<&'static str> {
        Ok(self.owner.borrow(py)?.medium())
    }

    /// Whether events are recorded.
    #[getter]
    fn enable_kv_cache_events(&mut self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.owner.borrow(py)?.events_enabled())
    }

    fn get_new_blocks<'py>(slf: &Bound<'py, Self>, n: usize) -> PyResult<Bound<'py, PyList>> {
        let py = slf.py();
        let (blocks, watching) = {
            let mut this = slf.borrow_mut();
            let this = &mut *this;
            this.scratch.clear();
            this.owner
                .borrow(py)?
                .get_new_blocks_into(n, &mut this.scratch)?;
            (
                this.id_objects.list(py, &this.scratch)?,
                !this.on_reuse.is_empty(),
            )
        };
        if watching {
            Self::notify_reuse(slf)?;
        }
        Ok(blocks)
    }

    /// vLLM 0.33's `unpin_blocks`: drops one reference per block for a caller that goes
    /// on reading the blocks until the pool reuses them. Those reaching 0 join the tail
    /// of the free queue (cached or not) and count as free; `on_reuse(block_id)` is
    /// called when `get_new_blocks` hands the block out or `reset_prefix_cache` clears
    /// the cache (a block unpinned again keeps its first place in a reset's order, and
    /// takes the newer callback).
    ///
    /// Raises, changing nothing, for the null block, an unknown id, a block without a
    /// reference, a pool with a retention policy, and a manager's pool (whose own
    /// allocations do not call back).
    fn unpin_blocks(
        &mut self,
        block_ids: &Bound<'_, PyAny>,
        on_reuse: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        if !on_reuse.is_callable() {
            return Err(super::errors::invalid_type("on_reuse must be callable"));
        }
        let ids = extract_u32s(block_ids, "block ids")?;
        let PoolOwner::Own(pool) = &mut self.owner else {
            return Err(
                KvError::Unsupported("unpin_blocks on a manager's block_pool".into()).into(),
            );
        };
        pool.release_watched(&ids)?;
        for b in ids {
            self.on_reuse.insert(b, on_reuse.clone().unbind());
        }
        Ok(())
    }

    #[pyo3(signature = (block_ids, *, priority_class=None, session=false, tenant=None))]
    fn free_blocks(
        &mut self,
        py: Python<'_>,
        block_ids: &Bound<'_, PyAny>,
        priority_class: Option<NonNegativeInt>,
        session: bool,
        tenant: Option<&str>,
    ) -> PyResult<()> {
        let ids = extract_u32s(block_ids, "block ids")?;
        let mut pool = self.owner.borrow(py)?;
        let class = priority_class.map(|c| c.0);
        if let Some(tag) = pool.free_tag_with(class, session, tenant)? {
            pool.set_free_tag(tag);
        }
        Ok(pool.free_blocks(ids.iter().copied())?)
    }

    fn touch(&mut self, py: Python<'_>, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        Ok(self
            .owner
            .borrow(py)?
            .touch(&extract_u32s(block_ids, "block ids")?)?)
    }

    #[pyo3(signature = (request_block_hashes, block_ids, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id, token_ids=None))]
    #[allow(clippy::too_many_arguments)]
    fn cache_full_blocks(
        &mut self,
        py: Python<'_>,
        request_block_hashes: Vec<Bound<'_, PyAny>>,
        block_ids: &Bound<'_, PyAny>,
        num_cached_blocks: usize,
        num_full_blocks: usize,
        block_size: usize,
        kv_cache_group_id: GroupId,
        token_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let hashes = request_block_hashes
            .iter()
            .map(extract_hash)
            .collect::<PyResult<Vec<_>>>()?;
        let block_ids = extract_u32s(block_ids, "block ids")?;
        // Tokens feed only `BlockStored` events: not read when events are off.
        let tokens = match token_ids {
            Some(t) if self.owner.borrow(py)?.events_enabled() => extract_u32s(t, "token ids")?,
            _ => Vec::new(),
        };
        Ok(self.owner.borrow(py)?.cache_full_blocks(
            &hashes,
            &block_ids,
            num_cached_blocks,
            num_full_blocks,
            block_size,
            kv_cache_group_id,
            None,
            &TokensOnly(&tokens),
        )?)
    }

    /// Registers the prefix of `num_tokens` tokens (a multiple of the hash block size)
    /// as a partial cache entry of `block_id` (vLLM 0.33's `cache_partial_block`);
    /// `replace_existing_hashes` first drops every key the block has. `token_ids` are
    /// used only for `BlockStored` events.
    #[pyo3(signature = (request_block_hashes, block_id, num_tokens, kv_cache_group_id, token_ids=None, replace_existing_hashes=false))]
    #[allow(clippy::too_many_arguments)]
    fn cache_partial_block(
        &mut self,
        py: Python<'_>,
        request_block_hashes: Vec<Bound<'_, PyAny>>,
        block_id: BlockId,
        num_tokens: usize,
        kv_cache_group_id: GroupId,
        token_ids: Option<&Bound<'_, PyAny>>,
        replace_existing_hashes: bool,
    ) -> PyResult<()> {
        let hashes = request_block_hashes
            .iter()
            .map(extract_hash)
            .collect::<PyResult<Vec<_>>>()?;
        let tokens = match token_ids {
            Some(t) if self.owner.borrow(py)?.events_enabled() => extract_u32s(t, "token ids")?,
            _ => Vec::new(),
        };
        let mut pool = self.owner.borrow(py)?;
        if replace_existing_hashes {
            pool.evict_blocks(&[block_id])?;
        }
        Ok(pool.cache_partial_block(
            &hashes,
            block_id,
            num_tokens,
            kv_cache_group_id,
            &TokensOnly(&tokens),
        )?)
    }

    fn get_cached_block(
        &mut self,
        py: Python<'_>,
        block_hash: &Bound<'_, PyAny>,
        kv_cache_group_ids: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Vec<BlockId>>> {
        let hash = extract_hash(block_hash)?;
        let groups: Vec<GroupId> = extract_u32s(kv_cache_group_ids, "group ids")?;
        Ok(self.owner.borrow(py)?.get_cached_block(&hash, &groups))
    }

    fn evict_blocks(&mut self, py: Python<'_>, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = block_ids
            .try_iter()?
            .map(|b| b?.extract::<BlockId>())
            .collect::<PyResult<Vec<_>>>()?;
        Ok(self.owner.borrow(py)?.evict_blocks(&ids)?)
    }

    fn reset_prefix_cache(slf: &Bound<'_, Self>) -> PyResult<bool> {
        let (reset, watching) = {
            let mut this = slf.borrow_mut();
            let reset = this.owner.borrow(slf.py())?.reset_prefix_cache();
            (reset, !this.on_reuse.is_empty())
        };
        if reset && watching {
            Self::notify_reuse(slf)?;
        }
        Ok(reset)
    }

    fn get_num_free_blocks(&mut self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.owner.borrow(py)?.num_free_blocks())
    }

    fn get_usage(&mut self, py: Python<'_>) -> PyResult<f64> {
        Ok(self.owner.borrow(py)?.usage())
    }

    fn get_free_block_ids(&mut self, py: Python<'_>) -> PyResult<Vec<BlockId>> {
        Ok(self.owner.borrow(py)?.free_block_ids().collect())
    }

    fn get_ref_cnt(&mut self, py: Python<'_>, block_id: BlockId) -> PyResult<i64> {
        Ok(self.owner.borrow(py)?.ref_cnt(block_id)?)
    }

    fn get_block_hash<'py>(
        &mut self,
        py: Python<'py>,
        block_id: BlockId,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        Ok(self
            .owner
            .borrow(py)?
            .block_hash(block_id)?
            .map(|key| PyBytes::new(py, key.hash.as_bytes())))
    }

    /// Checks the core's structural invariants; `RuntimeError` names the first violation.
    fn check_invariants(&mut self, py: Python<'_>) -> PyResult<()> {
        self.owner
            .borrow(py)?
            .check_invariants()
            .map_err(pyo3::exceptions::PyRuntimeError::new_err)
    }

    fn take_events(&mut self, py: Python<'_>) -> PyResult<Vec<PyObject>> {
        events_to_py(py, &self.owner.borrow(py)?.take_events())
    }

    fn __repr__(&mut self, py: Python<'_>) -> PyResult<String> {
        let p = self.owner.borrow(py)?;
        Ok(format!(
            "BlockPool(num_gpu_blocks={}, enable_caching={}, hash_block_size={}, \
             enable_kv_cache_events={}, num_free_blocks={})",
            p.num_blocks(),
            if p.enable_caching() { "True" } else { "False" },
            p.hash_block_size(),
            if p.events_enabled() { "True" } else { "False" },
            p.num_free_blocks(),
        ))
    }
}

impl PyBlockPool {
    /// The pending events as core values, for the event publisher (no Python objects).
    pub(crate) fn take_core_events(
        &mut self,
        py: Python<'_>,
    ) -> PyResult<Vec<crate::events::event::KvCacheEvent>> {
        Ok(self.owner.borrow(py)?.take_events())
    }

    /// The pool of `manager`, as a `BlockPool` object.
    pub(crate) fn of_manager(manager: Py<PyKVCacheManager>) -> Self {
        Self::owned_by(PoolOwner::Manager(manager))
    }

    /// The HiSparse host pool of `manager` (which has one), as a `BlockPool` object.
    pub(crate) fn of_manager_host(manager: Py<PyKVCacheManager>) -> Self {
        Self::owned_by(PoolOwner::ManagerHost(manager))
    }

    fn owned_by(owner: PoolOwner) -> Self {
        Self {
            owner,
            scratch: Vec::new(),
            id_objects: IdObjects::default(),
            on_reuse: FxHashMap::default(),
        }
    }

    /// Calls the `on_reuse` callback of each watched block the pool let go, in the
    /// core's order, once the pool is no longer borrowed (a callback may read it). Every
    /// callback runs; the first exception one raises is raised after the last.
    fn notify_reuse(slf: &Bound<'_, Self>) -> PyResult<()> {
        let calls: Vec<(BlockId, Py<PyAny>)> = {
            let mut this = slf.borrow_mut();
            let PoolOwner::Own(pool) = &mut this.owner else {
                return Ok(());
            };
            let reused = pool.take_reused_watched();
            reused
                .into_iter()
                .filter_map(|b| this.on_reuse.remove(&b).map(|f| (b, f)))
                .collect()
        };
        let mut first_error = None;
        for (block, callback) in calls {
            if let Err(e) = callback.call1(slf.py(), (block,)) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBlockPool>()?;
    Ok(())
}
