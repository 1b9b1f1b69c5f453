//! Python bindings for `manager`: `KVCacheManager`, `KVCacheBlocks` and the read-only
//! `block_pool` view (`PrefixCacheStats` is in `stats.rs`). Conversion only.

use crate::python::errors::{invalid_argument, invalid_type};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyMemoryView, PySlice, PyTuple};
use pyo3::{intern, PyTraverseError, PyVisit};

use crate::admission;
use crate::attention::{ContextParallel, ManagerParams, RequestView};
use crate::coordinator::CoordinatorKind;
use crate::kv_cache_manager::{AllocateArgs, KvCacheManager, ManagerOptions, NewBlocks};
use crate::python::config::PyKVCacheConfig;
use crate::python::events::events_to_py;
use crate::python::ids::{extract_u32s, IdObjects};
use crate::python::non_negative::NonNegativeInt;
use crate::python::pool::PyBlockPool;
use crate::python::request::{request_list, PyRequest};
use crate::python::retention::PyRetentionPolicy;
use crate::python::stats::{set_stats_attributes, PyPrefixCacheStats};
use crate::python::vllm_reads::request as attr;
use crate::python::vllm_request::{request_id, AnyRequest, RequestMemos, VllmRequest};
use crate::request::Request;
use crate::request_fields::RequestFields;
use crate::types::{BlockHash, BlockId, GroupId};

/// Prompts at least this long are looked up with the GIL released.
const RELEASE_GIL_HASHES: usize = 1024;

fn ids_tuple<'py, I, S>(py: Python<'py>, groups: I) -> PyResult<Bound<'py, PyTuple>>
where
    I: IntoIterator<Item = S>,
    S: AsRef<[BlockId]>,
{
    let lists = groups
        .into_iter()
        .map(|g| PyList::new(py, g.as_ref()))
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, lists)
}

/// `values` (`rows * width` of them, row-major) as a 2-D memoryview of format `i` over a
/// new `bytearray`. The buffer protocol proper (`__getbuffer__`) is not in the limited API
/// before 3.11 and the extension is abi3 for 3.10; memoryview's `cast` cannot make a zero
/// dimension, so a table without rows is a slice of a one-row view.
fn int32_matrix<'py>(
    py: Python<'py>,
    values: &[i32],
    rows: usize,
    width: usize,
) -> PyResult<Bound<'py, PyMemoryView>> {
    const SIZE: usize = std::mem::size_of::<i32>();
    let bytes = PyByteArray::new_with(py, rows.max(1) * width * SIZE, |buf| {
        for (chunk, v) in buf.chunks_exact_mut(SIZE).zip(values) {
            chunk.copy_from_slice(&v.to_ne_bytes());
        }
        Ok(())
    })?;
    let view = PyMemoryView::from(&bytes)?.call_method1("cast", ("i", (rows.max(1), width)))?;
    let view = if rows == 0 {
        view.get_item(PySlice::new(py, 0, 0, 1))?
    } else {
        view
    };
    Ok(view.downcast_into::<PyMemoryView>()?)
}

/// vLLM's `KVCacheBlocks`, holding block ids per group. Block objects (`.blocks`) are
/// made only when asked for, by the manager that returned the ids.
#[pyclass(name = "KVCacheBlocks", module = "kvblocks._core", frozen)]
pub(crate) struct PyKVCacheBlocks {
    blocks: Vec<Vec<BlockId>>,
    owner: Option<Py<PyKVCacheManager>>,
}

impl PyKVCacheBlocks {
    fn selected(&self, group_ids: Option<Vec<usize>>) -> PyResult<Vec<&[BlockId]>> {
        match group_ids {
            None => Ok(self.blocks.iter().map(Vec::as_slice).collect()),
            Some(ids) => ids
                .into_iter()
                .map(|g| {
                    self.blocks.get(g).map(Vec::as_slice).ok_or_else(|| {
                        invalid_argument(format!(
                            "group id {g} out of range for {} groups",
                            self.blocks.len()
                        ))
                    })
                })
                .collect(),
        }
    }

    fn owner<'py>(&self, py: Python<'py>) -> PyResult<&Bound<'py, PyKVCacheManager>> {
        match &self.owner {
            Some(o) => Ok(o.bind(py)),
            None => Err(invalid_argument(
                "these KVCacheBlocks were built from ids, not returned by a manager: they \
                 have no block objects",
            )),
        }
    }

    /// `f` of the owning manager's pool; with every group empty, `empty`, without
    /// asking for an owner.
    fn with_owner_pool<T>(
        &self,
        py: Python<'_>,
        empty: T,
        f: impl FnOnce(&crate::pool::BlockPool) -> crate::error::Result<T>,
    ) -> PyResult<T> {
        if self.blocks.iter().all(Vec::is_empty) {
            return Ok(empty);
        }
        let owner = self.owner(py)?.borrow();
        Ok(f(owner.inner.pool())?)
    }
}

#[pymethods]
impl PyKVCacheBlocks {
    #[new]
    fn new(blocks: Vec<Vec<BlockId>>) -> Self {
        Self {
            blocks,
            owner: None,
        }
    }

    /// Block ids per group (of `group_ids` only, if given); with `allow_none`, `None`
    /// when every selected group is empty.
    #[pyo3(signature = (allow_none=false, *, group_ids=None))]
    fn get_block_ids<'py>(
        &self,
        py: Python<'py>,
        allow_none: bool,
        group_ids: Option<Vec<usize>>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let groups = self.selected(group_ids)?;
        if allow_none && groups.iter().all(|g| g.is_empty()) {
            return Ok(None);
        }
        ids_tuple(py, groups).map(Some)
    }

    /// The block objects per group (vLLM's `KVCacheBlock`s: one object per block for
    /// the manager's lifetime).
    #[getter]
    fn blocks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        if self.blocks.iter().all(Vec::is_empty) {
            return PyTuple::new(py, self.blocks.iter().map(|_| PyTuple::empty(py)));
        }
        let owner = self.owner(py)?;
        let lists = self
            .blocks
            .iter()
            .enumerate()
            .map(|(group, g)| {
                let on_host = owner.borrow().inner.host_group() == Some(group);
                PyKVCacheManager::block_objects(owner, g, on_host)
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, lists)
    }

    /// Ids of the blocks that are not cached, null blocks included (one group only).
    fn get_unhashed_block_ids(&self, py: Python<'_>) -> PyResult<Vec<BlockId>> {
        let [ids] = self.blocks.as_slice() else {
            return Err(invalid_argument("Only one group is supported"));
        };
        self.with_owner_pool(py, Vec::new(), |pool| pool.unhashed_block_ids(ids))
    }

    /// Per group, the ids of blocks that are not cached, without nulls.
    fn get_unhashed_block_ids_all_groups(&self, py: Python<'_>) -> PyResult<Vec<Vec<BlockId>>> {
        let empty = vec![Vec::new(); self.blocks.len()];
        self.with_owner_pool(py, empty, |pool| {
            pool.unhashed_block_ids_all_groups(&self.blocks)
        })
    }

    /// A `KVCacheBlocks` with as many groups and no blocks.
    fn new_empty(&self) -> Self {
        Self {
            blocks: vec![Vec::new(); self.blocks.len()],
            owner: None,
        }
    }

    fn __add__(&self, py: Python<'_>, other: &Self) -> PyResult<Self> {
        if self.blocks.len() != other.blocks.len() {
            return Err(invalid_argument(
                "cannot add KVCacheBlocks with different numbers of groups",
            ));
        }
        Ok(Self {
            blocks: self
                .blocks
                .iter()
                .zip(&other.blocks)
                .map(|(a, b)| [a.as_slice(), b.as_slice()].concat())
                .collect(),
            owner: self
                .owner
                .as_ref()
                .or(other.owner.as_ref())
                .map(|o| o.clone_ref(py)),
        })
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .downcast::<Self>()
            .is_ok_and(|o| o.get().blocks == self.blocks)
    }

    fn __len__(&self) -> usize {
        self.blocks.len()
    }

    fn __repr__(&self) -> String {
        format!("KVCacheBlocks({:?})", self.blocks)
    }
}

/// vLLM's `KVCacheBlock`: one block of the manager's pool, read live (its ref count and
/// hash change as the pool does). One object per block id for the manager's lifetime.
#[pyclass(name = "KVCacheBlock", module = "kvblocks._core", frozen)]
pub(crate) struct PyKVCacheBlock {
    #[pyo3(get)]
    block_id: BlockId,
    /// A block of HiSparse's host pool (host and device ids overlap).
    on_host: bool,
    owner: Py<PyKVCacheManager>,
}

impl PyKVCacheBlock {
    /// `f` of the pool the block belongs to.
    fn with_pool<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&crate::pool::BlockPool) -> crate::error::Result<T>,
    ) -> PyResult<T> {
        let owner = self.owner.borrow(py);
        let pool = if self.on_host {
            owner.core_host_pool()
        } else {
            owner.inner.pool()
        };
        Ok(f(pool)?)
    }
}

#[pymethods]
impl PyKVCacheBlock {
    /// Requests holding the block (the null block: see `BlockPool::ref_cnt`).
    #[getter]
    fn ref_cnt(&self, py: Python<'_>) -> PyResult<i64> {
        self.with_pool(py, |p| p.ref_cnt(self.block_id))
    }

    /// vLLM's `BlockHashWithGroupId` (the hash, then the group id as 4 big-endian bytes),
    /// or `None` if the block is not cached.
    #[getter]
    fn block_hash<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let key = self.with_pool(py, |p| p.block_hash(self.block_id))?;
        Ok(key.map(|k| {
            let mut bytes = k.hash.as_bytes().to_vec();
            bytes.extend_from_slice(&k.group.to_be_bytes());
            PyBytes::new(py, &bytes)
        }))
    }

    /// The tokens the block's cache key covers, or `None` if it is not cached.
    #[getter]
    fn block_hash_num_tokens(&self, py: Python<'_>) -> PyResult<Option<usize>> {
        self.with_pool(py, |p| p.block_hash_num_tokens(self.block_id))
    }

    /// Whether the block is one of HiSparse's host pool (ids overlap the device pool's).
    #[getter]
    fn on_host(&self) -> bool {
        self.on_host
    }

    /// Whether this is the null block (id 0), which is never pooled.
    #[getter]
    fn is_null(&self) -> bool {
        self.block_id == 0
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.owner)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let rc = self.ref_cnt(py).unwrap_or_default();
        format!("KVCacheBlock(block_id={}, ref_cnt={rc})", self.block_id)
    }
}

/// vLLM 0.33's `KVCacheManager`. Its calls take kvblocks' `Request` or vLLM's own,
/// read in place. `subclass`: `kvblocks.vllm.KVCacheManager` adds vLLM's Python-level
/// attributes on top.
#[pyclass(name = "KVCacheManager", module = "kvblocks._core", subclass)]
pub(crate) struct PyKVCacheManager {
    inner: KvCacheManager,
    id_objects: IdObjects,
    /// What has been converted of each vLLM request.
    memos: RequestMemos,
    /// The blocks one allocation added (reused by every call).
    added: NewBlocks,
    /// The `KVCacheBlocks` with every group empty, shared as vLLM's
    /// `empty_kv_cache_blocks` (the class is frozen).
    empty_blocks: Py<PyKVCacheBlocks>,
    /// `allocate_slots_batch`'s entry for a request that got no new block: one empty
    /// tuple per group.
    no_new_blocks: Py<PyTuple>,
    /// The block objects handed out so far, by block id (made on first request).
    block_objects: Vec<Option<Py<PyKVCacheBlock>>>,
    /// The same for HiSparse's host pool.
    host_block_objects: Vec<Option<Py<PyKVCacheBlock>>>,
    /// See `stats_mirror`.
    stats_mirror: Option<Py<PyAny>>,
}

/// A HiSparse page transfer as `(transfer_id, host_block_id, resident_block_ids,
/// after_forward, restore)`.
fn transfer_tuple(
    t: &crate::hisparse::spills::PageTransfer,
) -> (u64, BlockId, Vec<BlockId>, bool, bool) {
    (
        t.transfer_id,
        t.host_block_id,
        t.resident_block_ids.clone(),
        t.after_forward,
        t.restore,
    )
}

/// Block hashes given as bytes.
fn hashes_of(block_hashes: &[Vec<u8>]) -> crate::error::Result<Vec<BlockHash>> {
    block_hashes
        .iter()
        .map(|h| BlockHash::from_slice(h))
        .collect()
}

fn hits_of<'py>(
    blocks: Option<&Bound<'py, PyAny>>,
) -> PyResult<Option<Bound<'py, PyKVCacheBlocks>>> {
    let Some(b) = blocks else { return Ok(None) };
    if b.is_none() {
        return Ok(None);
    }
    let b = b
        .downcast::<PyKVCacheBlocks>()
        .map_err(|_| invalid_type("new_computed_blocks must be a KVCacheBlocks or None"))?;
    Ok(Some(b.clone()))
}

#[pymethods]
impl PyKVCacheManager {
    #[new]
    #[pyo3(signature = (kv_cache_config, max_model_len, hash_block_size, *,
                        scheduler_block_size=None, max_in_flight_tokens=None,
                        enable_caching=true, use_eagle=false, log_stats=false,
                        enable_kv_cache_events=false, watermark=0.0,
                        record_new_block_ids=false, count_null_block_refs=false,
                        mamba_none_prefix_caching=false,
                        dcp_world_size=NonNegativeInt(1), pcp_world_size=NonNegativeInt(1),
                        retention=None, num_prefill_lookahead=NonNegativeInt(0),
                        num_hash_lookahead_tokens=NonNegativeInt(0), record_block_metrics=false),
                 text_signature = "(kv_cache_config, max_model_len, hash_block_size, *, \
                        scheduler_block_size=None, max_in_flight_tokens=None, \
                        enable_caching=True, use_eagle=False, log_stats=False, \
                        enable_kv_cache_events=False, watermark=0.0, \
                        record_new_block_ids=False, count_null_block_refs=False, \
                        mamba_none_prefix_caching=False, \
                        dcp_world_size=1, pcp_world_size=1, retention=None, \
                        num_prefill_lookahead=0, num_hash_lookahead_tokens=0, \
                        record_block_metrics=False)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        kv_cache_config: PyRef<'_, PyKVCacheConfig>,
        max_model_len: usize,
        hash_block_size: usize,
        scheduler_block_size: Option<usize>,
        max_in_flight_tokens: Option<usize>,
        enable_caching: bool,
        use_eagle: bool,
        log_stats: bool,
        enable_kv_cache_events: bool,
        watermark: f64,
        record_new_block_ids: bool,
        count_null_block_refs: bool,
        mamba_none_prefix_caching: bool,
        dcp_world_size: NonNegativeInt,
        pcp_world_size: NonNegativeInt,
        retention: Option<PyRef<'_, PyRetentionPolicy>>,
        num_prefill_lookahead: NonNegativeInt,
        num_hash_lookahead_tokens: NonNegativeInt,
        record_block_metrics: bool,
    ) -> PyResult<Self> {
        let cfg = &kv_cache_config.inner;
        let watermark_blocks = admission::watermark_blocks(watermark, cfg.num_blocks)?;
        let groups = ManagerParams::from_config(cfg)?;
        let opts = ManagerOptions {
            max_model_len,
            hash_block_size,
            scheduler_block_size,
            max_in_flight_tokens,
            enable_caching,
            use_eagle,
            log_stats,
            enable_kv_cache_events,
            watermark_blocks,
            record_new_block_ids,
            count_null_block_refs,
            mamba_none_prefix_caching,
            num_prefill_lookahead: num_prefill_lookahead.0,
            num_hash_lookahead_tokens: num_hash_lookahead_tokens.0,
            context_parallel: ContextParallel::new(dcp_world_size.0, pcp_world_size.0)?,
            record_block_metrics,
            host_num_blocks: cfg.hisparse_host_num_blocks,
        };
        let retention_interval = cfg.prefix_cache_retention_interval.map(|n| n as usize);
        let mut inner = KvCacheManager::new(groups, cfg.num_blocks, retention_interval, opts)?;
        if let Some(policy) = retention {
            inner.set_retention(policy.inner.clone())?;
        }
        let g = inner.num_groups();
        let empty_blocks = Py::new(
            py,
            PyKVCacheBlocks {
                blocks: vec![Vec::new(); g],
                owner: None,
            },
        )?;
        let empty = PyTuple::empty(py);
        let no_new_blocks = PyTuple::new(py, (0..g).map(|_| empty.clone()))?.unbind();
        Ok(Self {
            inner,
            id_objects: IdObjects::default(),
            added: NewBlocks::default(),
            empty_blocks,
            no_new_blocks,
            memos: RequestMemos::default(),
            block_objects: Vec::new(),
            host_block_objects: Vec::new(),
            stats_mirror: None,
        })
    }

    /// `(KVCacheBlocks, num_hit_tokens)`: the request's prefix-cache hit, at most
    /// `max_cache_hit_length` tokens (default `num_tokens - 1`).
    #[pyo3(signature = (request, max_cache_hit_length=None))]
    fn get_computed_blocks(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        max_cache_hit_length: Option<usize>,
    ) -> PyResult<(Py<PyKVCacheBlocks>, usize)> {
        let py = slf.py();
        let (blocks, hit) =
            slf.borrow_mut()
                .with_request(request, RequestFields::LOOKUP, |mgr, req| {
                    if req.block_hashes().len() >= RELEASE_GIL_HASHES {
                        py.allow_threads(|| {
                            mgr.get_computed_blocks_capped(req, max_cache_hit_length)
                        })
                    } else {
                        mgr.get_computed_blocks_capped(req, max_cache_hit_length)
                    }
                })?;
        Ok((Self::blocks_of(slf, blocks)?, hit))
    }

    /// vLLM 0.33's `get_computed_blocks` triple: `(KVCacheBlocks, num_hit_tokens,
    /// shared_prefix_boundary)`.
    #[pyo3(signature = (request, max_cache_hit_length=None))]
    fn find_cache_hit(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        max_cache_hit_length: Option<usize>,
    ) -> PyResult<(Py<PyKVCacheBlocks>, usize, usize)> {
        let py = slf.py();
        let l = slf
            .borrow_mut()
            .with_request(request, RequestFields::LOOKUP, |mgr, req| {
                if req.block_hashes().len() >= RELEASE_GIL_HASHES {
                    py.allow_threads(|| mgr.lookup(req, max_cache_hit_length))
                } else {
                    mgr.lookup(req, max_cache_hit_length)
                }
            })?;
        Ok((
            Self::blocks_of(slf, l.blocks)?,
            l.num_hit_tokens,
            l.shared_prefix_boundary,
        ))
    }

    /// vLLM 0.33's `get_computed_blocks_for_connector`: the triple and whether a lagging
    /// group stops short of the local (full-attention) prefix.
    #[pyo3(signature = (request, max_cache_hit_length=None))]
    fn get_computed_blocks_for_connector(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        max_cache_hit_length: Option<usize>,
    ) -> PyResult<(Py<PyKVCacheBlocks>, usize, usize, bool)> {
        let (l, diverged) =
            slf.borrow_mut()
                .with_request(request, RequestFields::LOOKUP, |mgr, req| {
                    mgr.lookup_for_connector(req, max_cache_hit_length)
                })?;
        Ok((
            Self::blocks_of(slf, l.blocks)?,
            l.num_hit_tokens,
            l.shared_prefix_boundary,
            diverged,
        ))
    }

    /// Each spec group's own longest hit of `block_hashes` (vLLM's
    /// `find_longest_cache_hit_per_group`): block ids and hit length per group.
    fn find_longest_cache_hit_per_group(
        &self,
        block_hashes: Vec<Vec<u8>>,
        max_cache_hit_length: usize,
    ) -> PyResult<(Vec<Vec<BlockId>>, Vec<usize>)> {
        let hashes = hashes_of(&block_hashes)?;
        Ok(self
            .inner
            .find_cache_hit_per_group(&hashes, max_cache_hit_length)?)
    }

    /// Whether a prefix-cache lookup runs for `request` (vLLM's
    /// `prefix_cache_lookup_enabled`: caching on, and the request does not skip it).
    fn prefix_cache_lookup_enabled(&self, request: &Bound<'_, PyAny>) -> PyResult<bool> {
        let skip = request
            .getattr(intern!(request.py(), attr::SKIP_READING_PREFIX_CACHE))?
            .is_truthy()?;
        Ok(self.inner.lookup_enabled_for(skip))
    }

    /// The name of vLLM's coordinator class that does what this manager's does:
    /// `KVCacheCoordinatorNoPrefixCache`, `UnitaryKVCacheCoordinator` or
    /// `HybridKVCacheCoordinator`.
    #[getter]
    fn coordinator_kind(&self) -> &'static str {
        match self.inner.coordinator().kind() {
            CoordinatorKind::NoPrefixCache => "KVCacheCoordinatorNoPrefixCache",
            CoordinatorKind::Unitary => "UnitaryKVCacheCoordinator",
            CoordinatorKind::Hybrid => "HybridKVCacheCoordinator",
        }
    }

    /// Computed tokens multi-module MTP may re-prefill, never cached
    /// (`num_prefill_lookahead - 1`, at least 0; vLLM's coordinator attribute).
    #[getter]
    fn num_reprefillable_tokens(&self) -> usize {
        self.inner.coordinator().num_reprefillable_tokens()
    }

    /// Whether prefix hits may end on a hash boundary inside a block (vLLM's
    /// `coordinator.enable_partial_hash_hits`).
    #[getter]
    fn enable_partial_hash_hits(&self) -> bool {
        self.inner.partial_hits_enabled()
    }

    /// The granularity of prefix hits, in tokens (every manager's
    /// `cache_hit_alignment_tokens` in vLLM).
    #[getter]
    fn cache_hit_alignment_tokens(&self) -> usize {
        self.inner.coordinator().hit_alignment()
    }

    /// Arms vLLM's Mamba shared-prefix checkpoint (`enable_mamba_shared_prefix_checkpoint`)
    /// where vLLM would: an EAGLE group, partial hits, no multi-module MTP re-prefill.
    /// Returns whether it is armed.
    fn arm_mamba_shared_prefix_checkpoint(&mut self) -> bool {
        self.inner.arm_mamba_shared_prefix_checkpoint()
    }

    /// The `prefix_cache_retention_interval` in force (`None`: dense caching); set it
    /// after construction as vLLM's tests assign `coordinator.retention_interval`: checked
    /// as at construction (`InvalidArgumentError`, nothing changes).
    #[getter]
    fn retention_interval(&self) -> Option<usize> {
        self.inner.coordinator().retention_interval()
    }

    #[setter]
    fn set_retention_interval(&mut self, interval: Option<NonNegativeInt>) -> PyResult<()> {
        Ok(self.inner.set_retention_interval(interval.map(|n| n.0))?)
    }

    /// The scheduler block size (hybrid hits align to it without partial hits).
    #[getter]
    fn scheduler_block_size(&self) -> usize {
        self.inner.coordinator().scheduler_block_size()
    }

    /// Tokens per request hash.
    #[getter]
    fn hash_block_size(&self) -> usize {
        self.inner.pool().hash_block_size()
    }

    /// This step's prefill checkpoint of the request in an align-mode Mamba group,
    /// `(position, table index)` (vLLM's `MambaManager._checkpoints[request_id]`), or
    /// `None`.
    fn mamba_checkpoint(&self, request_id: &str, group_id: usize) -> Option<(usize, usize)> {
        self.inner.mamba_checkpoint(request_id, group_id)
    }

    /// Tokens after each block that its hash covers (`num_hash_lookahead_tokens`).
    #[getter]
    fn num_hash_lookahead_tokens(&self) -> usize {
        self.inner.pool().num_hash_lookahead_tokens()
    }

    /// Each group's block size in tokens, in group order.
    #[getter]
    fn group_block_sizes(&self) -> Vec<usize> {
        self.inner
            .coordinator()
            .managers()
            .iter()
            .map(|m| m.block_size())
            .collect()
    }

    /// Each group's `(dcp_world_size, pcp_world_size)`, in group order: the manager's
    /// world sizes for a DCP-sharded group, `(1, 1)` for a replicated one.
    #[getter]
    fn group_context_parallel_sizes(&self) -> Vec<(usize, usize)> {
        self.inner
            .coordinator()
            .managers()
            .iter()
            .map(|m| {
                let cp = m.params().context_parallel;
                (cp.dcp_world_size, cp.pcp_world_size)
            })
            .collect()
    }

    /// The first group of the first spec group, if that is full attention (hybrid
    /// models; vLLM's `coordinator.full_attention_group_id`).
    #[getter]
    fn full_attention_group_id(&self) -> Option<usize> {
        self.inner.coordinator().full_attention_group_id()
    }

    /// The hybrid coordinator's spec groups in lookup order: `(group_ids, use_eagle)`
    /// each (vLLM's `coordinator.attention_groups`); `None` for the other coordinators.
    #[getter]
    fn spec_groups(&self) -> Option<Vec<(Vec<GroupId>, bool)>> {
        self.inner.coordinator().spec_groups()
    }

    /// Slots for new tokens; `None` when they do not fit. `skip_zeroing_group_ids`: groups
    /// whose KV-connector blocks are not recorded for zeroing.
    #[pyo3(signature = (request, num_new_tokens, num_new_computed_tokens=0,
                        new_computed_blocks=None, num_lookahead_tokens=0,
                        num_external_computed_tokens=0, delay_cache_blocks=false,
                        num_encoder_tokens=0, full_sequence_must_fit=false,
                        reserved_blocks=0, has_scheduled_reqs=true,
                        skip_zeroing_group_ids=None))]
    #[allow(clippy::too_many_arguments)]
    fn allocate_slots(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        num_new_tokens: usize,
        num_new_computed_tokens: usize,
        new_computed_blocks: Option<&Bound<'_, PyAny>>,
        num_lookahead_tokens: usize,
        num_external_computed_tokens: usize,
        delay_cache_blocks: bool,
        num_encoder_tokens: usize,
        full_sequence_must_fit: bool,
        reserved_blocks: usize,
        has_scheduled_reqs: bool,
        skip_zeroing_group_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<PyKVCacheBlocks>>> {
        let skip_zeroing_groups = match skip_zeroing_group_ids {
            Some(ids) => ids
                .try_iter()?
                .map(|g| g?.extract::<usize>())
                .collect::<PyResult<Vec<_>>>()?,
            None => Vec::new(),
        };
        let py = slf.py();
        let hits = hits_of(new_computed_blocks)?;
        let args = AllocateArgs {
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks: hits.as_ref().map(|h| h.get().blocks.as_slice()),
            num_lookahead_tokens,
            num_external_computed_tokens,
            delay_cache_blocks,
            num_encoder_tokens,
            full_sequence_must_fit,
            reserved_blocks,
            has_scheduled_reqs,
            skip_zeroing_groups: &skip_zeroing_groups,
        };
        let mut this = slf.borrow_mut();
        let fields = this.inner.fields_for_allocate(has_scheduled_reqs);
        this.added.clear();
        let this = &mut *this;
        let added = &mut this.added;
        let fitted = Self::with_request_parts(
            &mut this.inner,
            &mut this.memos,
            request,
            fields,
            |mgr, req| {
                mgr.check_length(req)?;
                mgr.allocate_slots_with(req, &args, |_, ids| added.push(ids))
            },
        )?;
        if !fitted {
            return Ok(None);
        }
        if this.added.is_empty() {
            return Ok(Some(this.empty_blocks.clone_ref(py)));
        }
        let blocks = this.added.groups().map(<[BlockId]>::to_vec).collect();
        let owner = slf.clone().unbind();
        Py::new(
            py,
            PyKVCacheBlocks {
                blocks,
                owner: Some(owner),
            },
        )
        .map(Some)
    }

    /// For each pair in order, the blocks `allocate_slots(req, n)` adds, as a tuple of
    /// per-group tuples of block ids; stops after the first pair that does not fit (its
    /// entry is `None`). Requests that get no new block share one `((), ...)` object.
    fn allocate_slots_batch<'py>(
        &mut self,
        py: Python<'py>,
        requests: &Bound<'py, PyAny>,
        num_new_tokens: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let requests = request_list(requests)?;
        let counts: Vec<usize> = extract_u32s(num_new_tokens, "num_new_tokens")?
            .into_iter()
            .map(|n| n as usize)
            .collect();
        let guards: Vec<PyRef<'_, PyRequest>> = requests.iter().map(Bound::borrow).collect();
        let requests: Vec<&Request> = guards.iter().map(|r| &r.inner).collect();
        let no_new_blocks = self.no_new_blocks.bind(py);
        let id_objects = &mut self.id_objects;
        let mut out = Vec::with_capacity(requests.len());
        let fitted =
            self.inner
                .allocate_slots_batch(&requests, &counts, &mut self.added, |blocks| {
                    if blocks.is_empty() {
                        out.push(no_new_blocks.clone().into_any());
                        return Ok(());
                    }
                    let groups = blocks
                        .groups()
                        .map(|ids| id_objects.tuple(py, ids))
                        .collect::<PyResult<Vec<_>>>()?;
                    out.push(PyTuple::new(py, groups)?.into_any());
                    PyResult::Ok(())
                })?;
        if fitted < requests.len() {
            out.push(py.None().into_bound(py));
        }
        PyList::new(py, out)
    }

    /// The retention policy, if one is set (docs/retention.md).
    #[getter]
    fn retention(&self) -> Option<PyRetentionPolicy> {
        self.inner
            .retention_policy()
            .map(|p| PyRetentionPolicy { inner: p.clone() })
    }

    /// The clock retention policies read (`advance_time`).
    #[getter]
    fn now(&self) -> f64 {
        self.inner.now()
    }

    /// Advances the clock to `now` (seconds, or a step counter; it must not go back).
    fn advance_time(&mut self, now: f64) -> PyResult<()> {
        Ok(self.inner.advance_time(now)?)
    }

    /// Pins the cached blocks of the request's full prompt blocks, in every group, for
    /// as long as the pin holds; blocks cached later under them are pinned too.
    fn pin(&mut self, request: &Bound<'_, PyAny>) -> PyResult<()> {
        self.with_request(request, RequestFields::NONE, |mgr, req| {
            mgr.pin(req);
            Ok(())
        })
    }

    /// Drops a pin `pin(request)` took; `KeyError` (and no change) if there is none.
    fn unpin(&mut self, request: &Bound<'_, PyAny>) -> PyResult<()> {
        self.with_request(request, RequestFields::NONE, |mgr, req| mgr.unpin(req))
    }

    /// `pin` for the prefix the hashes (at the hash block size) name.
    fn pin_hashes(&mut self, block_hashes: Vec<Vec<u8>>) -> PyResult<()> {
        let hashes = hashes_of(&block_hashes)?;
        self.inner.pin_hashes(&hashes);
        Ok(())
    }

    /// `unpin` for the prefix the hashes name.
    fn unpin_hashes(&mut self, block_hashes: Vec<Vec<u8>>) -> PyResult<()> {
        let hashes = hashes_of(&block_hashes)?;
        Ok(self.inner.unpin_hashes(&hashes)?)
    }

    /// Frees the request's blocks (no-op for unknown or already freed requests).
    fn free(&mut self, request: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = Self::id_of(request)?;
        self.memos.forget(&id);
        Ok(self.inner.free(&id)?)
    }

    /// Forgets the request and returns its block ids (group after group, each in
    /// allocation order, leading nulls dropped) without freeing them: the caller frees
    /// them later, in reverse (vLLM's deferred frees).
    fn pop_blocks_for_free(&mut self, request: &Bound<'_, PyAny>) -> PyResult<Vec<BlockId>> {
        let id = Self::id_of(request)?;
        self.memos.forget(&id);
        Ok(self.inner.pop_blocks_for_free(&id))
    }

    /// `pop_blocks_for_free` with each group's block ids apart, saying whether the request
    /// finished (HiSparse keeps a finished request's publication).
    fn pop_blocks_for_free_by_group(
        &mut self,
        request_id: &str,
        finished: bool,
    ) -> PyResult<Vec<Vec<BlockId>>> {
        self.memos.forget(request_id);
        Ok(self
            .inner
            .pop_blocks_for_free_by_group(request_id, finished)?)
    }

    /// The prefix tokens the request's cached blocks cover (vLLM's
    /// `estimate_cached_tokens`).
    fn estimate_cached_tokens(&self, request: &Bound<'_, PyAny>) -> PyResult<usize> {
        Ok(self.inner.estimate_cached_tokens(&Self::id_of(request)?))
    }

    /// The request's blocks as a `KVCacheBlocks` (the shared empty one for a request
    /// without blocks).
    fn get_blocks(slf: &Bound<'_, Self>, request_id: &str) -> PyResult<Py<PyKVCacheBlocks>> {
        let blocks = slf.borrow().inner.get_block_ids(request_id);
        Self::blocks_of(slf, blocks)
    }

    /// The request's block ids per group (empty lists for an unknown request).
    fn get_block_ids<'py>(
        &mut self,
        py: Python<'py>,
        request_id: &str,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let lists = (0..self.inner.num_groups())
            .map(|g| {
                self.id_objects
                    .list(py, self.inner.block_table(request_id, g))
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, lists)
    }

    /// The request's block ids covering `num_computed_tokens`, per group (vLLM's
    /// `get_block_ids_for_computed_tokens`; empty lists for an unknown request).
    fn get_block_ids_for_computed_tokens<'py>(
        &self,
        py: Python<'py>,
        request_id: &str,
        num_computed_tokens: usize,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let ids = self
            .inner
            .block_ids_for_computed_tokens(request_id, num_computed_tokens);
        PyTuple::new(py, ids)
    }

    /// A lookup result cut at `num_computed_tokens` (vLLM's `truncate_computed_blocks`;
    /// no ref count changes).
    fn truncate_computed_blocks(
        slf: &Bound<'_, Self>,
        blocks: PyRef<'_, PyKVCacheBlocks>,
        num_computed_tokens: usize,
    ) -> PyResult<Py<PyKVCacheBlocks>> {
        let cut = slf
            .borrow()
            .inner
            .truncate_computed_blocks(&blocks.blocks, num_computed_tokens)?;
        Self::blocks_of(slf, cut)
    }

    /// The block tables of `request_ids` in group `group_id` as one C-contiguous int32
    /// buffer of shape `(len(request_ids), max_blocks)`, rows padded with the null block
    /// 0 (a `memoryview` over a new `bytearray`: numpy and torch view it without a copy).
    /// An unknown request id gives a row of nulls; `max_blocks` is at least 1.
    #[pyo3(signature = (request_ids, group_id=0))]
    fn block_table<'py>(
        &self,
        py: Python<'py>,
        request_ids: Vec<PyBackedStr>,
        group_id: usize,
    ) -> PyResult<Bound<'py, PyMemoryView>> {
        let mut table = Vec::new();
        let width = self
            .inner
            .block_table_into(&request_ids, group_id, &mut table)?;
        int32_matrix(py, &table, request_ids.len(), width)
    }

    /// Caches the request's full blocks up to `num_computed_tokens`.
    fn cache_blocks(
        &mut self,
        request: &Bound<'_, PyAny>,
        num_computed_tokens: usize,
    ) -> PyResult<()> {
        let fields = self.inner.fields_for_caching();
        self.with_request(request, fields, |mgr, req| {
            mgr.cache_blocks(req, num_computed_tokens)
        })
    }

    /// The blocks allocated since the last call that the worker must zero (empty unless
    /// built with `record_new_block_ids`).
    fn take_new_block_ids(&mut self) -> Vec<BlockId> {
        self.inner.take_new_block_ids()
    }

    /// Records the request's blocks from `start_token` on for zeroing again.
    fn record_blocks_for_zeroing(&mut self, request_id: &str, start_token: usize) -> PyResult<()> {
        Ok(self
            .inner
            .record_blocks_for_zeroing(request_id, start_token)?)
    }

    /// Per-step hook.
    fn new_step_starts(&mut self) {
        self.inner.new_step_starts();
    }

    /// The partial-hit copies queued since the last call, `[(src_block_id,
    /// dst_block_id), ...]` (vLLM's `take_kv_cache_block_copies`); each endpoint keeps a
    /// reference until freed with the pool's `free_blocks` after the copy ran.
    fn take_block_copies(&mut self) -> Vec<(BlockId, BlockId)> {
        self.inner.take_block_copies()
    }

    /// The align-mode Mamba partial tails a finishing request cached itself and did not
    /// overwrite: `[(group_id, block_id, boundary_tokens), ...]` (vLLM's
    /// `finalize_partial_tail_offloads`).
    fn finalize_partial_tails(
        &mut self,
        request_id: &str,
        num_computed_tokens: usize,
        num_in_flight_tokens: usize,
    ) -> Vec<(GroupId, BlockId, usize)> {
        self.inner.finalize_partial_tail_offloads(
            request_id,
            num_computed_tokens,
            num_in_flight_tokens,
        )
    }

    /// Align-mode Mamba states cached since the last call, for a KV connector to
    /// offload: `{request_id: [(group_id, block_id, num_tokens), ...]}` (vLLM 0.33's
    /// `take_boundary_state_offloads`).
    fn take_boundary_state_offloads<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for o in self.inner.take_boundary_offloads() {
            let entry = (o.group, o.block, o.num_tokens).into_pyobject(py)?;
            match out.get_item(&o.request_id)? {
                Some(list) => list.downcast::<PyList>()?.append(entry)?,
                None => out.set_item(&o.request_id, PyList::new(py, [entry])?)?,
            }
        }
        Ok(out)
    }

    /// Drops the cache entries of the given block ids (any iterable, e.g. a set; its
    /// iteration order is the event order, as vLLM).
    fn evict_blocks(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = block_ids
            .try_iter()?
            .map(|b| b?.extract::<BlockId>())
            .collect::<PyResult<Vec<_>>>()?;
        Ok(self.inner.evict_blocks(&ids)?)
    }

    /// Clears the prefix cache if no request holds a block.
    fn reset_prefix_cache(&mut self, py: Python<'_>) -> PyResult<bool> {
        let ok = self.inner.reset_prefix_cache();
        self.mirror_stats(py)?;
        Ok(ok)
    }

    /// Zeros per group (vLLM 0.33).
    fn get_num_common_prefix_blocks(&self, running_request_id: &str) -> Vec<usize> {
        self.inner.get_num_common_prefix_blocks(running_request_id)
    }

    /// The calls vLLM's pool would have made on a KV cache metrics collector since the
    /// last call, oldest first, as `(op, block_id)` with op 0 `on_block_allocated`, 1
    /// `on_block_accessed`, 2 `on_block_evicted`; empty unless built with
    /// `record_block_metrics=True`.
    fn take_block_metrics(&mut self) -> Vec<(u8, BlockId)> {
        let ops = self.core_pool_mut().take_block_metrics();
        ops.into_iter().map(|(op, b)| (op as u8, b)).collect()
    }

    /// The recorded KV cache events, annotated per group.
    fn take_events(&mut self, py: Python<'_>) -> PyResult<Vec<PyObject>> {
        events_to_py(py, &self.inner.take_events())
    }

    /// Records a prefix-cache lookup in the stats.
    fn record_prefix_cache_stats(
        &mut self,
        request: &Bound<'_, PyAny>,
        num_hits: usize,
    ) -> PyResult<()> {
        self.with_request(request, RequestFields::LOOKUP, |mgr, req| {
            mgr.record_prefix_cache_stats(req, num_hits);
            Ok(())
        })?;
        self.mirror_stats(request.py())
    }

    /// An object whose attributes named as the stats' fields are kept equal to the stats
    /// being recorded (vLLM's live `PrefixCacheStats`, which its callers hold on to).
    #[getter]
    fn get_stats_mirror(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.stats_mirror.as_ref().map(|m| m.clone_ref(py))
    }

    #[setter]
    fn set_stats_mirror(&mut self, py: Python<'_>, mirror: Option<Py<PyAny>>) -> PyResult<()> {
        self.stats_mirror = mirror;
        self.mirror_stats(py)
    }

    /// The stats since the last call (`None` without `log_stats`).
    fn make_prefix_cache_stats(&mut self) -> Option<PyPrefixCacheStats> {
        self.inner.make_prefix_cache_stats().map(Into::into)
    }

    /// KV cache usage in [0, 1].
    #[getter]
    fn usage(&self) -> f64 {
        self.inner.usage()
    }

    /// Blocks an admission leaves free while others are scheduled (vLLM's
    /// `watermark_blocks`: `int(watermark * num_blocks)`).
    #[getter]
    fn watermark_blocks(&self) -> usize {
        self.inner.watermark_blocks()
    }

    /// Number of KV cache groups.
    #[getter]
    fn num_kv_cache_groups(&self) -> usize {
        self.inner.num_groups()
    }

    /// The block objects (vLLM's `KVCacheBlock`) of the given ids: one object per block
    /// id for the manager's lifetime; with `host`, of HiSparse's host pool.
    #[pyo3(name = "block_objects", signature = (block_ids, host = false))]
    fn py_block_objects<'py>(
        slf: &Bound<'py, Self>,
        block_ids: &Bound<'py, PyAny>,
        host: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        if host && slf.borrow().inner.host_pool().is_none() {
            return Err(invalid_argument("this manager has no HiSparse host pool"));
        }
        Self::block_objects(slf, &extract_u32s(block_ids, "block ids")?, host)
    }

    /// A `KVCacheBlocks` of this manager's blocks (ids per group), whose `.blocks` are
    /// the manager's block objects.
    fn kv_cache_blocks(
        slf: &Bound<'_, Self>,
        blocks: Vec<Vec<BlockId>>,
    ) -> PyResult<Py<PyKVCacheBlocks>> {
        Self::blocks_of(slf, blocks)
    }

    /// The ids of the requests holding blocks.
    fn request_ids(&self) -> Vec<String> {
        self.inner.request_ids().map(str::to_owned).collect()
    }

    /// Leading cached entries of the request's table in `group_id` (vLLM's
    /// `num_cached_block`), `None` if that group does not know the request.
    fn num_cached_blocks(&self, request_id: &str, group_id: usize) -> Option<usize> {
        self.inner.num_cached_blocks(request_id, group_id)
    }

    /// Blocks an allocation would take (a dry run, vLLM's
    /// `coordinator.get_num_blocks_to_allocate`).
    #[pyo3(signature = (request_id, num_tokens, new_computed_blocks, num_encoder_tokens,
                        total_computed_tokens, num_tokens_main_model, apply_admission_cap=false,
                        num_local_computed_tokens=0, prefill_end=0))]
    #[allow(clippy::too_many_arguments)]
    fn get_num_blocks_to_allocate(
        &self,
        request_id: &str,
        num_tokens: usize,
        new_computed_blocks: Vec<Vec<BlockId>>,
        num_encoder_tokens: usize,
        total_computed_tokens: usize,
        num_tokens_main_model: usize,
        apply_admission_cap: bool,
        num_local_computed_tokens: usize,
        prefill_end: usize,
    ) -> PyResult<isize> {
        let hits = (!new_computed_blocks.iter().all(Vec::is_empty))
            .then_some(new_computed_blocks.as_slice());
        Ok(self.inner.get_num_blocks_to_allocate(
            request_id,
            num_tokens,
            num_tokens_main_model,
            hits,
            num_encoder_tokens,
            total_computed_tokens,
            num_local_computed_tokens,
            apply_admission_cap,
            prefill_end,
        )?)
    }

    /// One group's share of `get_num_blocks_to_allocate` (vLLM's manager of the group):
    /// `new_computed_blocks` is that group's hit.
    #[pyo3(signature = (group, request_id, num_tokens, new_computed_blocks,
                        total_computed_tokens, num_local_computed_tokens, num_tokens_main_model,
                        apply_admission_cap=false, prefill_end=0))]
    #[allow(clippy::too_many_arguments)]
    fn get_group_num_blocks_to_allocate(
        &self,
        group: usize,
        request_id: &str,
        num_tokens: usize,
        new_computed_blocks: Vec<BlockId>,
        total_computed_tokens: usize,
        num_local_computed_tokens: usize,
        num_tokens_main_model: usize,
        apply_admission_cap: bool,
        prefill_end: usize,
    ) -> PyResult<isize> {
        Ok(self.inner.get_group_num_blocks_to_allocate(
            group,
            request_id,
            num_tokens,
            num_tokens_main_model,
            &new_computed_blocks,
            total_computed_tokens,
            num_local_computed_tokens,
            apply_admission_cap,
            prefill_end,
        )?)
    }

    /// Frees the request's blocks outside every group's attention window for tokens
    /// from `processed_computed_tokens` on (R-SWA groups, given `num_prompt_tokens`: the
    /// gap after the prompt).
    #[pyo3(signature = (request_id, processed_computed_tokens, num_prompt_tokens = None))]
    fn remove_skipped_blocks(
        &mut self,
        request_id: &str,
        processed_computed_tokens: usize,
        num_prompt_tokens: Option<usize>,
    ) -> PyResult<()> {
        Ok(self.inner.remove_skipped_blocks(
            request_id,
            processed_computed_tokens,
            num_prompt_tokens,
        )?)
    }

    /// The stats recorded since the last `make_prefix_cache_stats`, without resetting
    /// them (`None` without `log_stats`).
    #[getter]
    fn current_prefix_cache_stats(&self) -> Option<PyPrefixCacheStats> {
        self.inner.prefix_cache_stats().map(Into::into)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for o in self
            .block_objects
            .iter()
            .chain(&self.host_block_objects)
            .flatten()
        {
            visit.call(o)?;
        }
        if let Some(m) = &self.stats_mirror {
            visit.call(m)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.block_objects.clear();
        self.host_block_objects.clear();
        self.stats_mirror = None;
    }

    /// The manager's block pool, with the whole `BlockPool` API (changes made through
    /// it are the manager's: vLLM's own callers reach the pool this way).
    #[getter]
    fn block_pool(slf: Py<Self>) -> PyBlockPool {
        PyBlockPool::of_manager(slf)
    }

    /// HiSparse's host pool, with the `BlockPool` API (vLLM's source manager's
    /// `block_pool` once bound); `None` without a host-resident group. Its events join the
    /// manager's queue after each call.
    #[getter]
    fn hisparse_host_pool(slf: Py<Self>, py: Python<'_>) -> Option<PyBlockPool> {
        let has_host = slf.borrow(py).inner.host_pool().is_some();
        has_host.then(|| PyBlockPool::of_manager_host(slf))
    }

    /// Frees the request's blocks, saying whether it finished (vLLM's
    /// `request.is_finished()`; HiSparse keeps a finished request's host blocks for its
    /// publication).
    fn free_request(&mut self, request_id: &str, finished: bool) -> PyResult<()> {
        self.memos.forget(request_id);
        Ok(self.inner.free_request(request_id, finished)?)
    }

    /// HiSparse's per-step work for `(request_id, num_tokens)` pairs (vLLM's
    /// `HiSparseCoordinator.advance_scheduled`).
    fn hisparse_advance_scheduled(&mut self, requests: Vec<(String, usize)>) -> PyResult<()> {
        let requests: Vec<(&str, usize)> = requests.iter().map(|(r, n)| (r.as_str(), *n)).collect();
        Ok(self.inner.hisparse_advance_scheduled(&requests)?)
    }

    /// Plans the write-back of the request's sealed pages (vLLM's
    /// `plan_prefix_materialization`).
    fn hisparse_plan_prefix_materialization(
        &mut self,
        request_id: &str,
        num_computed_tokens: usize,
    ) -> PyResult<()> {
        Ok(self
            .inner
            .hisparse_plan_prefix_materialization(request_id, num_computed_tokens)?)
    }

    /// The request's residency policy for this step (vLLM's `update_residency`).
    fn hisparse_update_residency(&mut self, request_id: &str) -> PyResult<()> {
        Ok(self.inner.hisparse_update_residency(request_id)?)
    }

    /// HiSparse's layout and settings: `host_group`, `resident_groups`, `hot_groups`
    /// (`(group, blocks_per_request)` each), `max_spill_pages`, `transition_watermark`;
    /// `None` without HiSparse groups.
    fn hisparse_layout<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(hs) = self.inner.hisparse() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("host_group", hs.host_group())?;
        d.set_item("resident_groups", hs.resident_groups().to_vec())?;
        d.set_item("hot_groups", hs.hot_groups().to_vec())?;
        d.set_item("max_spill_pages", hs.max_spill_pages())?;
        d.set_item("transition_watermark", hs.transition_watermark())?;
        Ok(Some(d))
    }

    /// Sets the transfers one step may plan (vLLM's `max_spill_pages`).
    fn hisparse_set_max_spill_pages(&mut self, pages: usize) -> PyResult<()> {
        Ok(self.inner.hisparse_set_max_spill_pages(pages)?)
    }

    /// The requests with a residency state (vLLM's `request_states` keys), sorted.
    fn hisparse_state_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .inner
            .hisparse()
            .map_or_else(Vec::new, |hs| hs.state_ids().map(str::to_owned).collect());
        ids.sort_unstable();
        ids
    }

    /// The ids of the transfers in flight, in id order (vLLM's `pending_spills` keys).
    fn hisparse_pending_spill_ids(&self) -> Vec<u64> {
        self.inner
            .hisparse()
            .map_or_else(Vec::new, |hs| hs.ledger().pending_ids().collect())
    }

    /// The transfers planned and not yet handed over, as `build_offload_command` returns
    /// them (vLLM's `spills_to_send`).
    #[allow(clippy::type_complexity)]
    fn hisparse_spills_to_send(&self) -> Vec<(u64, BlockId, Vec<BlockId>, bool, bool)> {
        self.inner.hisparse().map_or_else(Vec::new, |hs| {
            hs.ledger().to_send().iter().map(transfer_tuple).collect()
        })
    }

    /// The transfers planned since the last call, `(transfer_id, host_block_id,
    /// resident_block_ids, after_forward, restore)` each (vLLM's `build_offload_command`);
    /// `None` without resident groups.
    #[allow(clippy::type_complexity)]
    fn hisparse_build_offload_command(
        &mut self,
    ) -> PyResult<Option<Vec<(u64, BlockId, Vec<BlockId>, bool, bool)>>> {
        Ok(self
            .inner
            .hisparse_build_offload_command()?
            .map(|ts| ts.iter().map(transfer_tuple).collect()))
    }

    /// Workers' transfer reports, transfer id -> count (vLLM's `update_spills`).
    fn hisparse_update_spills(
        &mut self,
        enqueued: std::collections::BTreeMap<u64, u64>,
        completed: std::collections::BTreeMap<u64, u64>,
    ) -> PyResult<()> {
        let enqueued: Vec<(u64, u64)> = enqueued.into_iter().collect();
        let completed: Vec<(u64, u64)> = completed.into_iter().collect();
        Ok(self.inner.hisparse_update_spills(&enqueued, &completed)?)
    }

    /// Per scheduled request with something new: `(pages, block ids per resident group)`
    /// (vLLM's `take_residency_updates`).
    #[allow(clippy::type_complexity)]
    fn hisparse_take_residency_updates(
        &mut self,
        request_ids: Vec<String>,
    ) -> PyResult<Vec<(String, Vec<usize>, Vec<Vec<BlockId>>)>> {
        let ids: Vec<&str> = request_ids.iter().map(String::as_str).collect();
        Ok(self
            .inner
            .hisparse_take_residency_updates(&ids)?
            .into_iter()
            .map(|u| (u.request_id, u.pages, u.block_ids))
            .collect())
    }

    /// The spans to mirror for `(request_id, num_computed_tokens, num_scheduled_tokens)`
    /// rows, `(source_starts, destination_start, num_rows)` each (vLLM's
    /// `build_row_mirrors`).
    fn hisparse_build_row_mirrors(
        &self,
        requests: Vec<(String, usize, usize)>,
    ) -> PyResult<Vec<(Vec<usize>, usize, usize)>> {
        let rows: Vec<(&str, usize, usize)> = requests
            .iter()
            .map(|(r, c, n)| (r.as_str(), *c, *n))
            .collect();
        Ok(self
            .inner
            .hisparse_build_row_mirrors(&rows)?
            .into_iter()
            .map(|m| (m.source_starts, m.destination_start, m.num_rows))
            .collect())
    }

    /// Whether every scheduled row reads only resident KV (vLLM's
    /// `all_context_pages_resident`).
    fn hisparse_all_context_pages_resident(
        &mut self,
        requests: Vec<(String, usize, usize)>,
    ) -> PyResult<bool> {
        let rows: Vec<(&str, usize, usize)> = requests
            .iter()
            .map(|(r, c, n)| (r.as_str(), *c, *n))
            .collect();
        Ok(self.inner.hisparse_all_context_pages_resident(&rows)?)
    }

    /// Whether transfers are planned or in flight (vLLM's `has_pending_work`).
    fn hisparse_has_pending_work(&self) -> bool {
        self.inner.hisparse_has_pending_work()
    }

    /// Whether a transfer in flight frees blocks when it completes (vLLM's
    /// `has_pending_reclamation`).
    fn hisparse_has_pending_reclamation(&self) -> bool {
        self.inner.hisparse_has_pending_reclamation()
    }

    /// An external load into the request's host pages finished (vLLM's
    /// `finish_host_import`).
    #[pyo3(signature = (request_id, *, failed))]
    fn hisparse_finish_host_import(&mut self, request_id: &str, failed: bool) -> PyResult<()> {
        Ok(self.inner.hisparse_finish_host_import(request_id, failed)?)
    }

    /// Host pages a connector filled, up to `num_computed_tokens` (vLLM's
    /// `complete_host_import`).
    fn hisparse_complete_host_import(
        &mut self,
        request_id: &str,
        num_computed_tokens: usize,
    ) -> PyResult<()> {
        Ok(self
            .inner
            .hisparse_complete_host_import(request_id, num_computed_tokens)?)
    }

    /// The request's row of resident group `group` from page `start`, host-only pages as
    /// the null block (vLLM's `get_residency_row`).
    #[pyo3(signature = (request_id, group, start = 0))]
    fn hisparse_residency_row(
        &self,
        request_id: &str,
        group: usize,
        start: usize,
    ) -> PyResult<Vec<BlockId>> {
        Ok(self
            .inner
            .hisparse_residency_row(request_id, group, start)?)
    }

    /// Fills the request's region in hot group `group` if it needs one; the new block ids
    /// (vLLM's `HiSparseHotManager.allocate_new_blocks`).
    fn hisparse_allocate_hot(&mut self, request_id: &str, group: usize) -> PyResult<Vec<BlockId>> {
        Ok(self.inner.hisparse_allocate_hot(request_id, group)?)
    }

    /// Host copy-on-write pairs `(source, destination)` since the last call, held until
    /// released (vLLM's `take_host_block_copies`).
    fn hisparse_take_host_block_copies(&mut self) -> PyResult<Vec<(BlockId, BlockId)>> {
        Ok(self.inner.hisparse_take_host_block_copies()?)
    }

    /// Releases the host copies the worker ran, by destination id (vLLM's
    /// `release_completed_host_copies`).
    fn hisparse_release_completed_host_copies(
        &mut self,
        dst_block_ids: Vec<BlockId>,
    ) -> PyResult<()> {
        Ok(self
            .inner
            .hisparse_release_completed_host_copies(&dst_block_ids)?)
    }

    /// Marks the request as needing its hot regions (vLLM's `require_hot`).
    fn hisparse_require_hot(&mut self, request_id: &str) -> PyResult<()> {
        Ok(self.inner.hisparse_require_hot(request_id)?)
    }

    /// `(has_hot, hot_required)` of the request (vLLM's `has_hot` and membership in
    /// `hot_required`).
    fn hisparse_hot(&self, request_id: &str) -> (bool, bool) {
        self.inner.hisparse_hot(request_id)
    }

    /// The GPU copies of published host pages, `(host block hash, group id, resident
    /// block ids)` each, in no particular order (vLLM's `copies`).
    fn hisparse_copies<'py>(
        &self,
        py: Python<'py>,
    ) -> Vec<(Bound<'py, PyBytes>, GroupId, Vec<BlockId>)> {
        self.inner
            .hisparse_copies()
            .into_iter()
            .map(|(k, b)| (PyBytes::new(py, k.hash.as_bytes()), k.group, b))
            .collect()
    }

    /// The request's residency state as a dict of vLLM's `_HiSparseRequestState` fields
    /// (`None` for a request HiSparse has no state for).
    fn hisparse_request_state<'py>(
        &self,
        py: Python<'py>,
        request_id: &str,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(state) = self.inner.hisparse_request_state(request_id) else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item(
            "valid_pages",
            state.valid.iter().copied().collect::<Vec<_>>(),
        )?;
        d.set_item("ready_prefix_pages", state.ready_prefix_pages)?;
        d.set_item("pending_pages", state.pending.clone())?;
        d.set_item(
            "pinned_clean",
            state.pinned_clean.iter().copied().collect::<Vec<_>>(),
        )?;
        d.set_item(
            "unpinned_pages",
            state.unpinned.iter().copied().collect::<Vec<_>>(),
        )?;
        d.set_item("pages_to_adopt", state.pages_to_adopt)?;
        d.set_item("synced_pages", state.synced_pages)?;
        d.set_item(
            "stale_pages",
            state.stale.iter().copied().collect::<Vec<_>>(),
        )?;
        d.set_item("has_publication", state.publication.is_some())?;
        Ok(Some(d))
    }
}

impl PyKVCacheManager {
    /// The request's id, for kvblocks' `Request` or vLLM's.
    fn id_of(request: &Bound<'_, PyAny>) -> PyResult<String> {
        if let Ok(r) = request.downcast::<PyRequest>() {
            return Ok(r.borrow().inner.request_id().to_owned());
        }
        Ok(request_id(request)?.to_str()?.to_owned())
    }

    /// Runs `f` on the core manager with `request` as a request view.
    fn with_request<T>(
        &mut self,
        request: &Bound<'_, PyAny>,
        fields: RequestFields,
        f: impl FnOnce(&mut KvCacheManager, &AnyRequest<'_>) -> crate::error::Result<T>,
    ) -> PyResult<T> {
        Self::with_request_parts(&mut self.inner, &mut self.memos, request, fields, f)
    }

    /// [`with_request`](Self::with_request) on the manager's parts, so a caller can
    /// hold other fields meanwhile.
    fn with_request_parts<T>(
        inner: &mut KvCacheManager,
        memos: &mut RequestMemos,
        request: &Bound<'_, PyAny>,
        fields: RequestFields,
        f: impl FnOnce(&mut KvCacheManager, &AnyRequest<'_>) -> crate::error::Result<T>,
    ) -> PyResult<T> {
        if let Ok(r) = request.downcast::<PyRequest>() {
            let r = r.borrow();
            return Ok(f(inner, &AnyRequest::Own(&r.inner))?);
        }
        let view = VllmRequest::read(request, memos, fields)?;
        Ok(f(inner, &AnyRequest::Vllm(view))?)
    }

    /// `blocks` as a `KVCacheBlocks` owned by this manager (the shared empty one when
    /// every group is empty).
    fn blocks_of(
        slf: &Bound<'_, Self>,
        blocks: Vec<Vec<BlockId>>,
    ) -> PyResult<Py<PyKVCacheBlocks>> {
        let py = slf.py();
        if blocks.iter().all(Vec::is_empty) {
            return Ok(slf.borrow().empty_blocks.clone_ref(py));
        }
        Py::new(
            py,
            PyKVCacheBlocks {
                blocks,
                owner: Some(slf.clone().unbind()),
            },
        )
    }

    /// The block objects of `ids` in the device pool, or with `on_host` in the host pool
    /// (which the caller checked exists), made on first request and kept for the
    /// manager's lifetime.
    pub(crate) fn block_objects<'py>(
        slf: &Bound<'py, Self>,
        ids: &[BlockId],
        on_host: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let py = slf.py();
        let mut this = slf.borrow_mut();
        let n = if on_host {
            this.core_host_pool().num_blocks()
        } else {
            this.inner.pool().num_blocks()
        };
        let objects = if on_host {
            &mut this.host_block_objects
        } else {
            &mut this.block_objects
        };
        if objects.len() < n {
            objects.resize_with(n, || None);
        }
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            let Some(entry) = objects.get_mut(id as usize) else {
                return Err(crate::error::KvError::BlockOutOfRange {
                    block_id: id.into(),
                    num_blocks: n,
                }
                .into());
            };
            let obj = match entry {
                Some(o) => o.clone_ref(py),
                None => {
                    let o = Py::new(
                        py,
                        PyKVCacheBlock {
                            block_id: id,
                            on_host,
                            owner: slf.clone().unbind(),
                        },
                    )?;
                    *entry = Some(o.clone_ref(py));
                    o
                }
            };
            out.push(obj);
        }
        PyList::new(py, out)
    }

    /// Copies the recorded stats into `stats_mirror`, if one is set.
    fn mirror_stats(&self, py: Python<'_>) -> PyResult<()> {
        match (&self.stats_mirror, self.inner.prefix_cache_stats()) {
            (Some(mirror), Some(stats)) => set_stats_attributes(mirror.bind(py), &stats),
            _ => Ok(()),
        }
    }

    /// The manager's pool.
    pub(crate) fn core_pool(&self) -> &crate::pool::BlockPool {
        self.inner.pool()
    }

    /// The manager's pool, to change.
    pub(crate) fn core_pool_mut(&mut self) -> &mut crate::pool::BlockPool {
        self.inner.pool_mut()
    }

    /// HiSparse's host pool (checked to exist when its view was made).
    pub(crate) fn core_host_pool(&self) -> &crate::pool::BlockPool {
        self.inner
            .host_pool()
            .expect("a host pool view is made only with a host pool")
    }

    /// HiSparse's host pool, to change; [`Self::forward_host_events`] after.
    pub(crate) fn core_host_pool_mut(&mut self) -> &mut crate::pool::BlockPool {
        self.inner
            .host_pool_mut()
            .expect("a host pool view is made only with a host pool")
    }

    /// Moves the host pool's pending events to the manager's queue.
    pub(crate) fn forward_host_events(&mut self) {
        self.inner.forward_host_events();
    }

    /// HiSparse's reaction to the pool's reuse of unpinned blocks, after a pool call.
    pub(crate) fn drain_reused(&mut self) {
        self.inner.hisparse_drain_reused();
    }

    /// The pending (annotated) events as core values, for the event publisher.
    pub(crate) fn take_core_events(&mut self) -> Vec<crate::events::event::KvCacheEvent> {
        self.inner.take_events()
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyKVCacheManager>()?;
    m.add_class::<PyKVCacheBlocks>()?;
    m.add_class::<PyKVCacheBlock>()?;
    Ok(())
}
