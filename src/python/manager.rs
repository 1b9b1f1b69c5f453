//! Python bindings for `manager`: `KVCacheManager`, `KVCacheBlocks`, `PrefixCacheStats`
//! and the read-only `block_pool` view. Conversion only.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::manager::{AllocateArgs, KvCacheManager, ManagerOptions, PrefixCacheStats};
use crate::managers::ManagerParams;
use crate::python::config::PyKVCacheConfig;
use crate::python::events::events_to_py;
use crate::python::ids::{extract_u32s, IdObjects};
use crate::python::request::{request_list, PyRequest};
use crate::types::BlockId;

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

/// vLLM's `KVCacheBlocks`, holding block ids per group.
#[pyclass(name = "KVCacheBlocks", module = "kvblocks._core", frozen, eq)]
#[derive(PartialEq)]
pub(crate) struct PyKVCacheBlocks {
    blocks: Vec<Vec<BlockId>>,
}

#[pymethods]
impl PyKVCacheBlocks {
    #[new]
    fn new(blocks: Vec<Vec<BlockId>>) -> Self {
        Self { blocks }
    }

    /// Block ids per group; with `allow_none`, `None` when every group is empty.
    #[pyo3(signature = (allow_none=false))]
    fn get_block_ids<'py>(
        &self,
        py: Python<'py>,
        allow_none: bool,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        if allow_none && self.blocks.iter().all(Vec::is_empty) {
            return Ok(None);
        }
        ids_tuple(py, &self.blocks).map(Some)
    }

    fn __add__(&self, other: &Self) -> PyResult<Self> {
        if self.blocks.len() != other.blocks.len() {
            return Err(PyValueError::new_err(
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
        })
    }

    fn __repr__(&self) -> String {
        format!("KVCacheBlocks({:?})", self.blocks)
    }
}

/// The Python face of `PrefixCacheStats` (the class itself is the core struct).
#[pymethods]
impl PrefixCacheStats {
    #[new]
    fn py_new() -> Self {
        Self::default()
    }

    /// Adds one request's lookup (preempted requests count apart).
    #[pyo3(name = "record")]
    fn py_record(&mut self, num_tokens: usize, num_hits: usize, preempted: bool) {
        self.record(num_tokens, num_hits, preempted);
    }

    fn __repr__(&self) -> String {
        format!(
            "PrefixCacheStats(reset={}, requests={}, queries={}, hits={}, preempted_requests={}, \
             preempted_queries={}, preempted_hits={})",
            if self.reset { "True" } else { "False" },
            self.requests,
            self.queries,
            self.hits,
            self.preempted_requests,
            self.preempted_queries,
            self.preempted_hits
        )
    }
}

/// vLLM 0.33's `KVCacheManager`.
#[pyclass(name = "KVCacheManager", module = "kvblocks._core")]
pub(crate) struct PyKVCacheManager {
    inner: KvCacheManager,
    id_objects: IdObjects,
    /// The blocks one allocation added (reused by every call).
    added: AddedBlocks,
    /// The `KVCacheBlocks` with every group empty, shared as vLLM's
    /// `empty_kv_cache_blocks` (the class is frozen).
    empty_blocks: Py<PyKVCacheBlocks>,
    /// `allocate_slots_batch`'s entry for a request that got no new block: one empty
    /// tuple per group.
    no_new_blocks: Py<PyTuple>,
}

/// The blocks one `allocate_slots_with` call added: every group's ids back to back.
#[derive(Default)]
struct AddedBlocks {
    ids: Vec<BlockId>,
    ends: Vec<usize>,
}

impl AddedBlocks {
    fn clear(&mut self) {
        self.ids.clear();
        self.ends.clear();
    }

    /// Records the next group's ids.
    fn push(&mut self, ids: &[BlockId]) {
        self.ids.extend_from_slice(ids);
        self.ends.push(self.ids.len());
    }

    /// Whether no group got a block.
    fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Each group's ids, in group order.
    fn groups(&self) -> impl Iterator<Item = &[BlockId]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(s, &e)| &self.ids[s..e])
    }
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
        .map_err(|_| PyTypeError::new_err("new_computed_blocks must be a KVCacheBlocks or None"))?;
    Ok(Some(b.clone()))
}

#[pymethods]
impl PyKVCacheManager {
    #[new]
    #[pyo3(signature = (kv_cache_config, max_model_len, hash_block_size, *,
                        scheduler_block_size=None, max_in_flight_tokens=None,
                        enable_caching=true, use_eagle=false, log_stats=false,
                        enable_kv_cache_events=false))]
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
    ) -> PyResult<Self> {
        let cfg = &kv_cache_config.inner;
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
        };
        let retention = cfg.prefix_cache_retention_interval.map(|n| n as usize);
        let inner = KvCacheManager::new(groups, cfg.num_blocks, retention, opts)?;
        let g = inner.num_groups();
        let empty_blocks = Py::new(
            py,
            PyKVCacheBlocks {
                blocks: vec![Vec::new(); g],
            },
        )?;
        let empty = PyTuple::empty(py);
        let no_new_blocks = PyTuple::new(py, (0..g).map(|_| empty.clone()))?.unbind();
        Ok(Self {
            inner,
            id_objects: IdObjects::default(),
            added: AddedBlocks::default(),
            empty_blocks,
            no_new_blocks,
        })
    }

    /// `(KVCacheBlocks, num_hit_tokens)`: the request's prefix-cache hit.
    fn get_computed_blocks(
        &self,
        py: Python<'_>,
        request: PyRef<'_, PyRequest>,
    ) -> PyResult<(Py<PyKVCacheBlocks>, usize)> {
        let req = &request.inner;
        let (blocks, hit) = if req.block_hashes().len() >= RELEASE_GIL_HASHES {
            py.allow_threads(|| self.inner.get_computed_blocks(req))?
        } else {
            self.inner.get_computed_blocks(req)?
        };
        if blocks.iter().all(Vec::is_empty) {
            return Ok((self.empty_blocks.clone_ref(py), hit));
        }
        Ok((Py::new(py, PyKVCacheBlocks { blocks })?, hit))
    }

    /// Slots for new tokens; `None` when they do not fit.
    #[pyo3(signature = (request, num_new_tokens, num_new_computed_tokens=0,
                        new_computed_blocks=None, num_lookahead_tokens=0,
                        num_external_computed_tokens=0, delay_cache_blocks=false,
                        num_encoder_tokens=0, full_sequence_must_fit=false))]
    #[allow(clippy::too_many_arguments)]
    fn allocate_slots(
        &mut self,
        py: Python<'_>,
        request: PyRef<'_, PyRequest>,
        num_new_tokens: usize,
        num_new_computed_tokens: usize,
        new_computed_blocks: Option<&Bound<'_, PyAny>>,
        num_lookahead_tokens: usize,
        num_external_computed_tokens: usize,
        delay_cache_blocks: bool,
        num_encoder_tokens: usize,
        full_sequence_must_fit: bool,
    ) -> PyResult<Option<Py<PyKVCacheBlocks>>> {
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
        };
        self.added.clear();
        let added = &mut self.added;
        if !self
            .inner
            .allocate_slots_with(&request.inner, &args, |_, ids| added.push(ids))?
        {
            return Ok(None);
        }
        if self.added.is_empty() {
            return Ok(Some(self.empty_blocks.clone_ref(py)));
        }
        let blocks = self.added.groups().map(<[BlockId]>::to_vec).collect();
        Py::new(py, PyKVCacheBlocks { blocks }).map(Some)
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
        let counts = extract_u32s(num_new_tokens, "num_new_tokens")?;
        if requests.len() != counts.len() {
            return Err(PyValueError::new_err(format!(
                "{} requests but {} token counts",
                requests.len(),
                counts.len()
            )));
        }
        if counts.contains(&0) {
            return Err(PyValueError::new_err(
                "num_new_tokens must be greater than 0 for every request",
            ));
        }
        let no_new_blocks = self.no_new_blocks.bind(py);
        let mut out = Vec::with_capacity(requests.len());
        for (req, &n) in requests.iter().zip(&counts) {
            self.added.clear();
            let added = &mut self.added;
            let fitted = self.inner.allocate_slots_with(
                &req.borrow().inner,
                &AllocateArgs::new(n as usize),
                |_, ids| added.push(ids),
            )?;
            if !fitted {
                out.push(py.None().into_bound(py));
                break;
            }
            if self.added.is_empty() {
                out.push(no_new_blocks.clone().into_any());
                continue;
            }
            let groups = self
                .added
                .groups()
                .map(|ids| self.id_objects.tuple(py, ids))
                .collect::<PyResult<Vec<_>>>()?;
            out.push(PyTuple::new(py, groups)?.into_any());
        }
        PyList::new(py, out)
    }

    /// Frees the request's blocks (no-op for unknown or already freed requests).
    fn free(&mut self, request: PyRef<'_, PyRequest>) -> PyResult<()> {
        Ok(self.inner.free(request.inner.request_id())?)
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

    /// Caches the request's full blocks up to `num_computed_tokens`.
    fn cache_blocks(
        &mut self,
        request: PyRef<'_, PyRequest>,
        num_computed_tokens: usize,
    ) -> PyResult<()> {
        Ok(self
            .inner
            .cache_blocks(&request.inner, num_computed_tokens)?)
    }

    /// Per-step hook.
    fn new_step_starts(&mut self) {
        self.inner.new_step_starts();
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
    fn reset_prefix_cache(&mut self) -> bool {
        self.inner.reset_prefix_cache()
    }

    /// Zeros per group (vLLM 0.33).
    fn get_num_common_prefix_blocks(&self, request_id: &str) -> Vec<usize> {
        self.inner.get_num_common_prefix_blocks(request_id)
    }

    /// The recorded KV cache events, annotated per group.
    fn take_events(&mut self, py: Python<'_>) -> PyResult<Vec<PyObject>> {
        events_to_py(py, &self.inner.take_events())
    }

    /// Records a prefix-cache lookup in the stats.
    fn record_prefix_cache_stats(&mut self, request: PyRef<'_, PyRequest>, num_hits: usize) {
        self.inner
            .record_prefix_cache_stats(&request.inner, num_hits);
    }

    /// The stats since the last call (`None` without `log_stats`).
    fn make_prefix_cache_stats(&mut self) -> Option<PrefixCacheStats> {
        self.inner.make_prefix_cache_stats()
    }

    /// KV cache usage in [0, 1].
    #[getter]
    fn usage(&self) -> f64 {
        self.inner.usage()
    }

    /// Number of KV cache groups.
    #[getter]
    fn num_kv_cache_groups(&self) -> usize {
        self.inner.num_groups()
    }

    /// A read-only view of the shared block pool.
    #[getter]
    fn block_pool(slf: Py<Self>) -> PyBlockPoolView {
        PyBlockPoolView { mgr: slf }
    }
}

/// A read-only view of a `KVCacheManager`'s block pool.
#[pyclass(name = "BlockPoolView", module = "kvblocks._core", frozen)]
pub(crate) struct PyBlockPoolView {
    mgr: Py<PyKVCacheManager>,
}

#[pymethods]
impl PyBlockPoolView {
    /// Free blocks.
    fn get_num_free_blocks(&self, py: Python<'_>) -> usize {
        self.mgr.borrow(py).inner.pool().num_free_blocks()
    }

    /// `1 - free / (N - 1)`.
    fn get_usage(&self, py: Python<'_>) -> f64 {
        self.mgr.borrow(py).inner.pool().usage()
    }

    /// The free queue from head (next allocated) to tail.
    fn get_free_block_ids(&self, py: Python<'_>) -> Vec<BlockId> {
        self.mgr.borrow(py).inner.pool().free_block_ids().collect()
    }

    /// The ref count of a block.
    fn get_ref_cnt(&self, py: Python<'_>, block_id: BlockId) -> PyResult<u32> {
        Ok(self.mgr.borrow(py).inner.pool().ref_cnt(block_id)?)
    }

    /// The raw hash bytes of a cached block, or `None`.
    fn get_block_hash<'py>(
        &self,
        py: Python<'py>,
        block_id: BlockId,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let key = self.mgr.borrow(py).inner.pool().block_hash(block_id)?;
        Ok(key.map(|k| PyBytes::new(py, k.hash.as_bytes())))
    }

    /// Pool size, null block included.
    #[getter]
    fn num_gpu_blocks(&self, py: Python<'_>) -> usize {
        self.mgr.borrow(py).inner.pool().num_blocks()
    }
}

impl PyKVCacheManager {
    /// The pending (annotated) events as core values, for the event publisher.
    pub(crate) fn take_core_events(&mut self) -> Vec<crate::pool::events::KvCacheEvent> {
        self.inner.take_events()
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyKVCacheManager>()?;
    m.add_class::<PyKVCacheBlocks>()?;
    m.add_class::<PrefixCacheStats>()?;
    m.add_class::<PyBlockPoolView>()?;
    Ok(())
}
