//! `kvblocks.OffloadManager` (vLLM 0.33's `CPUOffloadingManager` decisions),
//! `kvblocks.OffloadPolicy` (a `CachePolicy` core for `kvblocks.vllm`'s offload policies)
//! and `kvblocks.OffloadRequest`. Conversion only; the rules are in `src/offload/`.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use rustc_hash::FxHashSet;

use super::errors::invalid_argument;
use super::retention::PyRetentionPolicy;
use crate::offload::{
    follow_ref_cnt, order_by_position, Chunk, Key, LookupResult, OffloadManager, Policy,
    PolicyKind, ReqState,
};

/// `"lru"`, `"arc"` or a `RetentionPolicy`.
fn kind_of(policy: &Bound<'_, PyAny>) -> PyResult<PolicyKind> {
    if let Ok(r) = policy.downcast::<PyRetentionPolicy>() {
        return Ok(PolicyKind::Retention(r.get().inner.clone()));
    }
    match policy.extract::<String>()?.as_str() {
        "lru" => Ok(PolicyKind::Lru),
        "arc" => Ok(PolicyKind::Arc),
        other => Err(invalid_argument(format!(
            "policy must be \"lru\", \"arc\" or a RetentionPolicy, got {other:?}"
        ))),
    }
}

fn key_of(key: &Bound<'_, PyAny>) -> PyResult<Key> {
    let b = key
        .downcast::<PyBytes>()
        .map_err(|_| invalid_argument("an offload key must be bytes"))?;
    Ok(Key::from(b.as_bytes()))
}

fn keys_of(keys: &Bound<'_, PyAny>) -> PyResult<Vec<Key>> {
    keys.try_iter()?.map(|k| key_of(&k?)).collect()
}

fn keys_py<'py>(py: Python<'py>, keys: &[Key]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, keys.iter().map(|k| PyBytes::new(py, k)))
}

/// The host-memory tier with vLLM 0.33's `CPUOffloadingManager` decisions (docs/offload.md).
#[pyclass(name = "OffloadManager", module = "kvblocks._core")]
pub(crate) struct PyOffloadManager {
    inner: OffloadManager,
}

#[pymethods]
impl PyOffloadManager {
    #[new]
    #[pyo3(signature = (num_chunks, policy, *, enable_events=false, store_threshold=0, max_tracker_size=64_000))]
    fn new(
        num_chunks: usize,
        policy: &Bound<'_, PyAny>,
        enable_events: bool,
        store_threshold: usize,
        max_tracker_size: usize,
    ) -> PyResult<Self> {
        let kind = kind_of(policy)?;
        let inner = OffloadManager::new(
            num_chunks,
            &kind,
            enable_events,
            store_threshold,
            max_tracker_size,
        )?;
        Ok(Self { inner })
    }

    #[getter]
    fn num_chunks(&self) -> usize {
        self.inner.num_chunks()
    }

    #[getter]
    fn num_free(&self) -> usize {
        self.inner.num_free()
    }

    #[getter]
    fn num_evictable(&self) -> usize {
        self.inner.num_evictable()
    }

    #[getter]
    fn num_write_pending(&self) -> usize {
        self.inner.num_write_pending()
    }

    #[getter]
    fn stores_skipped(&self) -> u64 {
        self.inner.stores_skipped()
    }

    fn set_positions(
        &mut self,
        req_id: &str,
        keys: &Bound<'_, PyAny>,
        positions: Vec<i64>,
    ) -> PyResult<()> {
        Ok(self
            .inner
            .set_positions(req_id, &keys_of(keys)?, &positions)?)
    }

    #[pyo3(signature = (req_id, *, priority=0, tenant=None))]
    fn set_hints(&mut self, req_id: &str, priority: i64, tenant: Option<String>) {
        self.inner.set_hints(req_id, priority, tenant);
    }

    fn on_new_request(&mut self, req_id: &str) {
        self.inner.on_new_request(req_id);
    }

    fn lookup(&self, key: &Bound<'_, PyAny>) -> PyResult<&'static str> {
        Ok(match self.inner.lookup(&key_of(key)?) {
            LookupResult::Miss => "miss",
            LookupResult::Hit => "hit",
            LookupResult::HitPending => "hit_pending",
        })
    }

    fn prepare_load(&mut self, keys: &Bound<'_, PyAny>, req_id: &str) -> PyResult<Vec<u32>> {
        Ok(self.inner.prepare_load(&keys_of(keys)?, req_id)?)
    }

    fn touch(&mut self, keys: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner.touch(&keys_of(keys)?);
        Ok(())
    }

    fn complete_load(&mut self, keys: &Bound<'_, PyAny>) -> PyResult<()> {
        Ok(self.inner.complete_load(&keys_of(keys)?)?)
    }

    fn prepare_store<'py>(
        &mut self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        req_id: &str,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(out) = self.inner.prepare_store(&keys_of(keys)?, req_id)? else {
            return Ok(None);
        };
        let items = [
            keys_py(py, &out.keys_to_store)?.into_any(),
            PyList::new(py, out.chunk_ids)?.into_any(),
            keys_py(py, &out.evicted)?.into_any(),
        ];
        Ok(Some(PyTuple::new(py, items)?))
    }

    #[pyo3(signature = (keys, success=true))]
    fn complete_store(&mut self, keys: &Bound<'_, PyAny>, success: bool) -> PyResult<()> {
        self.inner.complete_store(&keys_of(keys)?, success);
        Ok(())
    }

    fn on_request_finished(&mut self, req_id: &str) {
        self.inner.on_request_finished(req_id);
    }

    fn reset_cache(&mut self) {
        self.inner.reset_cache();
    }

    fn take_events<'py>(&mut self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.inner
            .take_events()
            .into_iter()
            .map(|e| {
                let items = [
                    keys_py(py, &e.keys)?.into_any(),
                    e.removed.into_pyobject(py)?.to_owned().into_any(),
                    e.metadata_only.into_pyobject(py)?.to_owned().into_any(),
                ];
                PyTuple::new(py, items)
            })
            .collect()
    }

    fn pin(&mut self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        Ok(self.inner.pin(key_of(key)?)?)
    }

    fn unpin(&mut self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        Ok(self.inner.unpin(&key_of(key)?)?)
    }
}

/// One request's state in an `OffloadPolicy`: its shared rank and retention hints.
#[pyclass(name = "OffloadRequest", module = "kvblocks._core")]
pub(crate) struct PyOffloadRequest {
    inner: ReqState,
}

#[pymethods]
impl PyOffloadRequest {
    #[new]
    #[pyo3(signature = (*, priority=0, tenant=None))]
    fn new(priority: i64, tenant: Option<String>) -> Self {
        Self {
            inner: ReqState {
                rank: None,
                priority,
                tenant,
            },
        }
    }
}

/// A cache policy of the host tier behind vLLM's `CachePolicy` interface: it holds the
/// caller's chunk objects by their `chunk_id` and follows their reference counts through
/// `mark_evictable` / `mark_non_evictable`.
#[pyclass(name = "OffloadPolicy", module = "kvblocks._core")]
pub(crate) struct PyOffloadPolicy {
    inner: Box<dyn Policy>,
    chunks: Vec<Option<Py<PyAny>>>,
}

impl PyOffloadPolicy {
    fn chunk_obj(&self, chunk: &Chunk) -> Option<&Py<PyAny>> {
        self.chunks.get(chunk.id as usize).and_then(Option::as_ref)
    }
}

#[pymethods]
impl PyOffloadPolicy {
    #[new]
    fn new(policy: &Bound<'_, PyAny>, capacity: usize) -> PyResult<Self> {
        Ok(Self {
            inner: kind_of(policy)?.build(capacity)?,
            chunks: Vec::new(),
        })
    }

    fn get(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
        let key = key_of(key)?;
        Ok(self
            .inner
            .get(&key)
            .and_then(|c| self.chunk_obj(c))
            .map(|o| o.clone_ref(py)))
    }

    fn insert(
        &mut self,
        key: &Bound<'_, PyAny>,
        chunk: &Bound<'_, PyAny>,
        position: Option<i64>,
        req: &Bound<'_, PyOffloadRequest>,
    ) -> PyResult<()> {
        let id: u32 = chunk.getattr("chunk_id")?.extract()?;
        let ref_cnt: i32 = chunk.getattr("ref_cnt")?.extract()?;
        let slot = id as usize;
        if self.chunks.len() <= slot {
            self.chunks.resize_with(slot + 1, || None);
        }
        self.chunks[slot] = Some(chunk.clone().unbind());
        let mut req = req.borrow_mut();
        self.inner.insert(
            key_of(key)?,
            Chunk { id, ref_cnt },
            position,
            &mut req.inner,
        );
        Ok(())
    }

    fn remove(&mut self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        let key = key_of(key)?;
        if let Some(c) = self.inner.get(&key) {
            let slot = c.id as usize;
            self.chunks[slot] = None;
        }
        self.inner.remove(&key);
        Ok(())
    }

    fn touch(&mut self, keys: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner.touch(&keys_of(keys)?);
        Ok(())
    }

    fn on_store_miss(&mut self, keys: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner.on_store_miss(&keys_of(keys)?);
        Ok(())
    }

    fn on_request_access(
        &mut self,
        keys: &Bound<'_, PyAny>,
        positions: Vec<Option<i64>>,
        req: &Bound<'_, PyOffloadRequest>,
    ) -> PyResult<()> {
        let keys = keys_of(keys)?;
        if keys.len() != positions.len() {
            return Err(invalid_argument("one position per key"));
        }
        self.inner
            .on_request_access(&keys, &positions, &mut req.borrow_mut().inner);
        Ok(())
    }

    fn on_request_finished(
        &mut self,
        keys: &Bound<'_, PyAny>,
        positions: Vec<Option<i64>>,
        insertion_only: &Bound<'_, PyAny>,
        reused: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let mut keys = keys_of(keys)?;
        if keys.len() != positions.len() {
            return Err(invalid_argument("one position per key"));
        }
        order_by_position(&mut keys, &positions);
        let insertion_only: FxHashSet<Key> = keys_of(insertion_only)?.into_iter().collect();
        let reused: FxHashSet<Key> = keys_of(reused)?.into_iter().collect();
        self.inner
            .on_request_finished(&keys, &insertion_only, &reused);
        Ok(())
    }

    fn evict<'py>(
        &mut self,
        py: Python<'py>,
        n: usize,
        protected: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Vec<(Bound<'py, PyBytes>, Py<PyAny>)>>> {
        let protected: FxHashSet<Key> = keys_of(protected)?.into_iter().collect();
        let Some(evicted) = self.inner.evict(n, &protected) else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(evicted.len());
        for (key, chunk) in evicted {
            let obj = self.chunks[chunk.id as usize]
                .take()
                .ok_or_else(|| invalid_argument("an evicted chunk has no object"))?;
            out.push((PyBytes::new(py, &key), obj));
        }
        Ok(Some(out))
    }

    fn clear(&mut self) {
        self.inner.clear();
        self.chunks.clear();
    }

    fn mark_evictable(&mut self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        follow_ref_cnt(self.inner.as_mut(), &key_of(key)?, true);
        Ok(())
    }

    fn mark_non_evictable(&mut self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        follow_ref_cnt(self.inner.as_mut(), &key_of(key)?, false);
        Ok(())
    }

    fn pin(&mut self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        Ok(self.inner.pin(key_of(key)?)?)
    }

    fn unpin(&mut self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        Ok(self.inner.unpin(&key_of(key)?)?)
    }

    #[getter]
    fn generation(&self) -> u64 {
        self.inner.generation()
    }

    fn lists<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, keys) in self.inner.lists() {
            d.set_item(name, keys_py(py, &keys)?)?;
        }
        Ok(d)
    }

    fn heap<'py>(&self, py: Python<'py>) -> Vec<((i64, i64), Bound<'py, PyBytes>)> {
        let entries = self.inner.heap();
        entries
            .into_iter()
            .map(|(rank, key)| (rank, PyBytes::new(py, &key)))
            .collect()
    }

    #[getter]
    fn target_t1_size(&self) -> Option<f64> {
        self.inner.target_t1()
    }

    #[setter]
    fn set_target_t1_size(&mut self, target: f64) -> PyResult<()> {
        Ok(self.inner.set_target_t1(target)?)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyOffloadManager>()?;
    m.add_class::<PyOffloadRequest>()?;
    m.add_class::<PyOffloadPolicy>()
}
