//! Python bindings for the `pool` module: `kvblocks.BlockPool`, vLLM's `BlockPool` with
//! blocks addressed by id.

use pyo3::prelude::*;

use super::ids::{extract_u32s, IdObjects};
use pyo3::types::{PyBytes, PyList};

use super::events::events_to_py;
use crate::pool::events::TokensOnly;
use crate::pool::BlockPool;
use crate::types::{BlockHash, BlockId, GroupId};

/// vLLM's `BlockPool` over block ids (block 0 is the null block).
#[pyclass(name = "BlockPool", module = "kvblocks._core")]
pub(crate) struct PyBlockPool {
    inner: BlockPool,
    /// Reused output buffer of `get_new_blocks` (no allocation per call).
    scratch: Vec<BlockId>,
    /// Shared int objects for the ids handed out.
    id_objects: IdObjects,
}

/// Extracts `bytes` as a block hash (at most 32 bytes).
fn extract_hash(obj: &Bound<'_, PyAny>) -> PyResult<BlockHash> {
    let bytes = obj.downcast::<PyBytes>()?;
    Ok(BlockHash::from_slice(bytes.as_bytes())?)
}

#[pymethods]
impl PyBlockPool {
    #[new]
    #[pyo3(signature = (num_gpu_blocks, enable_caching=true, hash_block_size=16, enable_kv_cache_events=false))]
    fn new(
        num_gpu_blocks: usize,
        enable_caching: bool,
        hash_block_size: usize,
        enable_kv_cache_events: bool,
    ) -> PyResult<Self> {
        Ok(Self {
            inner: BlockPool::new(
                num_gpu_blocks,
                enable_caching,
                hash_block_size,
                enable_kv_cache_events,
            )?,
            scratch: Vec::new(),
            id_objects: IdObjects::default(),
        })
    }

    /// Total blocks, null block included.
    #[getter]
    fn num_gpu_blocks(&self) -> usize {
        self.inner.num_blocks()
    }

    /// Whether prefix caching is on.
    #[getter]
    fn enable_caching(&self) -> bool {
        self.inner.enable_caching()
    }

    /// Tokens per hash block.
    #[getter]
    fn hash_block_size(&self) -> usize {
        self.inner.hash_block_size()
    }

    /// Whether events are recorded.
    #[getter]
    fn enable_kv_cache_events(&self) -> bool {
        self.inner.events_enabled()
    }

    fn get_new_blocks<'py>(&mut self, py: Python<'py>, n: usize) -> PyResult<Bound<'py, PyList>> {
        self.scratch.clear();
        self.inner.get_new_blocks_into(n, &mut self.scratch)?;
        self.id_objects.list(py, &self.scratch)
    }

    fn free_blocks(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = extract_u32s(block_ids, "block ids")?;
        Ok(self.inner.free_blocks(ids.iter().copied())?)
    }

    fn touch(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        Ok(self.inner.touch(&extract_u32s(block_ids, "block ids")?)?)
    }

    #[pyo3(signature = (request_block_hashes, block_ids, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id, token_ids=None))]
    #[allow(clippy::too_many_arguments)]
    fn cache_full_blocks(
        &mut self,
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
            Some(t) if self.inner.events_enabled() => extract_u32s(t, "token ids")?,
            _ => Vec::new(),
        };
        Ok(self.inner.cache_full_blocks(
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

    fn get_cached_block(
        &self,
        block_hash: &Bound<'_, PyAny>,
        kv_cache_group_ids: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Vec<BlockId>>> {
        let hash = extract_hash(block_hash)?;
        let groups: Vec<GroupId> = extract_u32s(kv_cache_group_ids, "group ids")?;
        Ok(self.inner.get_cached_block(&hash, &groups))
    }

    fn evict_blocks(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = block_ids
            .try_iter()?
            .map(|b| b?.extract::<BlockId>())
            .collect::<PyResult<Vec<_>>>()?;
        Ok(self.inner.evict_blocks(&ids)?)
    }

    fn reset_prefix_cache(&mut self) -> bool {
        self.inner.reset_prefix_cache()
    }

    fn get_num_free_blocks(&self) -> usize {
        self.inner.num_free_blocks()
    }

    fn get_usage(&self) -> f64 {
        self.inner.usage()
    }

    fn get_free_block_ids(&self) -> Vec<BlockId> {
        self.inner.free_block_ids().collect()
    }

    fn get_ref_cnt(&self, block_id: BlockId) -> PyResult<u32> {
        Ok(self.inner.ref_cnt(block_id)?)
    }

    fn get_block_hash<'py>(
        &self,
        py: Python<'py>,
        block_id: BlockId,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        Ok(self
            .inner
            .block_hash(block_id)?
            .map(|key| PyBytes::new(py, key.hash.as_bytes())))
    }

    /// Checks the core's structural invariants; `RuntimeError` names the first violation.
    fn check_invariants(&self) -> PyResult<()> {
        self.inner
            .check_invariants()
            .map_err(pyo3::exceptions::PyRuntimeError::new_err)
    }

    fn take_events(&mut self, py: Python<'_>) -> PyResult<Vec<PyObject>> {
        events_to_py(py, &self.inner.take_events())
    }

    fn __repr__(&self) -> String {
        format!(
            "BlockPool(num_gpu_blocks={}, enable_caching={}, hash_block_size={}, \
             enable_kv_cache_events={}, num_free_blocks={})",
            self.inner.num_blocks(),
            if self.inner.enable_caching() {
                "True"
            } else {
                "False"
            },
            self.inner.hash_block_size(),
            if self.inner.events_enabled() {
                "True"
            } else {
                "False"
            },
            self.inner.num_free_blocks(),
        )
    }
}

impl PyBlockPool {
    /// The pending events as core values, for the event publisher (no Python objects).
    pub(crate) fn take_core_events(&mut self) -> Vec<crate::pool::events::KvCacheEvent> {
        self.inner.take_events()
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBlockPool>()?;
    Ok(())
}
