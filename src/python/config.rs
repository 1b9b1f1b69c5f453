//! Python bindings for the `config` module: `KVCacheTensor`, `KVCacheGroupSpec` and
//! `KVCacheConfig` with vLLM's names. Other bindings read the core config through
//! `PyRef<PyKVCacheConfig>::inner`.

use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::types::PyList;
use pyo3::IntoPyObjectExt;

use super::non_negative::NonNegativeInt;
use super::spec::{spec_to_py, PyKVCacheSpec};
use crate::config::{BlockSizeParams, GroupRole, KvCacheConfig, KvCacheGroupSpec, KvCacheTensor};
use crate::python::errors::{int_overflow, invalid_type};

/// `==`/`!=` by value; other comparisons are not supported.
fn compare<T: PartialEq>(a: &T, b: &T, op: CompareOp, py: Python<'_>) -> PyResult<PyObject> {
    match op {
        CompareOp::Eq => (a == b).into_py_any(py),
        CompareOp::Ne => (a != b).into_py_any(py),
        _ => Ok(py.NotImplemented()),
    }
}

/// A list of strings, refusing a bare `str` (which would split into characters).
fn names(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<String>> {
    obj.extract()
        .map_err(|_| invalid_type(format!("{what} must be a list of layer names")))
}

/// Formats layer names as a Python list literal.
fn py_names(names: &[String]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
    format!("[{}]", quoted.join(", "))
}

/// One backing allocation shared by some layers (vLLM's `KVCacheTensor`).
#[pyclass(name = "KVCacheTensor", module = "kvblocks._core")]
pub(crate) struct PyKVCacheTensor {
    pub(crate) inner: KvCacheTensor,
}

#[pymethods]
impl PyKVCacheTensor {
    /// `shared_by` is the seed-era name; vLLM 0.33 calls the same list `layers`.
    #[new]
    #[pyo3(signature = (size, shared_by = None, *, layers = None))]
    fn new(
        size: NonNegativeInt,
        shared_by: Option<&Bound<'_, PyAny>>,
        layers: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let shared_by = match (shared_by, layers) {
            (Some(s), None) => names(s, "shared_by")?,
            (None, Some(l)) => names(l, "layers")?,
            _ => {
                return Err(invalid_type(
                    "KVCacheTensor needs exactly one of shared_by or layers",
                ))
            }
        };
        Ok(PyKVCacheTensor {
            inner: KvCacheTensor {
                size: size.0,
                shared_by,
            },
        })
    }

    #[getter]
    fn size(&self) -> usize {
        self.inner.size
    }

    #[getter]
    fn shared_by(&self) -> Vec<String> {
        self.inner.shared_by.clone()
    }

    #[getter]
    fn layers(&self) -> Vec<String> {
        self.inner.shared_by.clone()
    }

    fn __richcmp__(&self, other: PyRef<'_, Self>, op: CompareOp) -> PyResult<PyObject> {
        compare(&self.inner, &other.inner, op, other.py())
    }

    fn __repr__(&self) -> String {
        format!(
            "KVCacheTensor(size={}, shared_by={})",
            self.inner.size,
            py_names(&self.inner.shared_by)
        )
    }
}

/// Layers sharing one block table (vLLM's `KVCacheGroupSpec`).
#[pyclass(name = "KVCacheGroupSpec", module = "kvblocks._core")]
pub(crate) struct PyKVCacheGroupSpec {
    pub(crate) inner: KvCacheGroupSpec,
}

#[pymethods]
impl PyKVCacheGroupSpec {
    /// `role` is a `KVCacheGroupRole` value (`"default"`, `"hisparse_source"`,
    /// `"hisparse_indexer"`); vLLM's enum members are strings too.
    #[new]
    #[pyo3(signature = (
        layer_names, kv_cache_spec, is_eagle_group = false, *, host_resident = false,
        role = "default",
    ))]
    fn new(
        layer_names: &Bound<'_, PyAny>,
        kv_cache_spec: PyRef<'_, PyKVCacheSpec>,
        is_eagle_group: bool,
        host_resident: bool,
        role: &str,
    ) -> PyResult<Self> {
        Ok(PyKVCacheGroupSpec {
            inner: KvCacheGroupSpec {
                host_resident,
                role: GroupRole::parse(role)?,
                ..KvCacheGroupSpec::new(
                    names(layer_names, "layer_names")?,
                    kv_cache_spec.inner.clone(),
                    is_eagle_group,
                )
            },
        })
    }

    #[getter]
    fn layer_names(&self) -> Vec<String> {
        self.inner.layer_names.clone()
    }

    #[getter]
    fn kv_cache_spec<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spec_to_py(py, self.inner.kv_cache_spec.clone())
    }

    #[getter]
    fn is_eagle_group(&self) -> bool {
        self.inner.is_eagle_group
    }

    #[getter]
    fn host_resident(&self) -> bool {
        self.inner.host_resident
    }

    #[getter]
    fn role(&self) -> &'static str {
        self.inner.role.as_str()
    }

    fn __richcmp__(&self, other: PyRef<'_, Self>, op: CompareOp) -> PyResult<PyObject> {
        compare(&self.inner, &other.inner, op, other.py())
    }

    fn __repr__(&self) -> String {
        let py_bool = |b: bool| if b { "True" } else { "False" };
        format!(
            "KVCacheGroupSpec(layer_names={}, kv_cache_spec={}, is_eagle_group={}, \
             host_resident={}, role='{}')",
            py_names(&self.inner.layer_names),
            self.inner.kv_cache_spec,
            py_bool(self.inner.is_eagle_group),
            py_bool(self.inner.host_resident),
            self.inner.role.as_str()
        )
    }
}

/// The KV cache configuration of a model (vLLM's `KVCacheConfig`).
#[pyclass(name = "KVCacheConfig", module = "kvblocks._core")]
pub(crate) struct PyKVCacheConfig {
    pub(crate) inner: KvCacheConfig,
}

#[pymethods]
impl PyKVCacheConfig {
    #[new]
    #[pyo3(signature = (
        num_blocks, kv_cache_tensors, kv_cache_groups, prefix_cache_retention_interval = None,
        *, hisparse_host_num_blocks = None,
    ))]
    fn new(
        num_blocks: NonNegativeInt,
        kv_cache_tensors: Vec<PyRef<'_, PyKVCacheTensor>>,
        kv_cache_groups: Vec<PyRef<'_, PyKVCacheGroupSpec>>,
        prefix_cache_retention_interval: Option<NonNegativeInt>,
        hisparse_host_num_blocks: Option<NonNegativeInt>,
    ) -> PyResult<Self> {
        let interval = prefix_cache_retention_interval
            .map(|c| u32::try_from(c.0))
            .transpose()
            .map_err(|_| int_overflow("prefix_cache_retention_interval does not fit in 32 bits"))?;
        let inner = KvCacheConfig::new(
            num_blocks.0,
            kv_cache_tensors.iter().map(|t| t.inner.clone()).collect(),
            kv_cache_groups.iter().map(|g| g.inner.clone()).collect(),
            interval,
        )?
        .with_hisparse_host_num_blocks(hisparse_host_num_blocks.map(|n| n.0));
        Ok(PyKVCacheConfig { inner })
    }

    #[getter]
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks
    }

    #[getter]
    fn kv_cache_tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self
            .inner
            .kv_cache_tensors
            .iter()
            .map(|t| Py::new(py, PyKVCacheTensor { inner: t.clone() }))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    #[getter]
    fn kv_cache_groups<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self
            .inner
            .kv_cache_groups
            .iter()
            .map(|g| Py::new(py, PyKVCacheGroupSpec { inner: g.clone() }))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    #[getter]
    fn prefix_cache_retention_interval(&self) -> Option<u32> {
        self.inner.prefix_cache_retention_interval
    }

    #[getter]
    fn hisparse_host_num_blocks(&self) -> Option<usize> {
        self.inner.hisparse_host_num_blocks
    }

    /// `(scheduler_block_size, hash_block_size)` as vLLM's `resolve_kv_cache_block_sizes`.
    #[pyo3(signature = (
        *, enable_prefix_caching = true, connector_enabled = false,
        dcp_world_size = NonNegativeInt(1), prefix_match_unit = None,
    ), text_signature = "(self, *, enable_prefix_caching=True, connector_enabled=False, \
        dcp_world_size=1, prefix_match_unit=None)")]
    fn resolve_block_sizes(
        &self,
        enable_prefix_caching: bool,
        connector_enabled: bool,
        dcp_world_size: NonNegativeInt,
        prefix_match_unit: Option<NonNegativeInt>,
    ) -> PyResult<(usize, usize)> {
        let params = BlockSizeParams {
            enable_prefix_caching,
            connector_enabled,
            dcp_world_size: dcp_world_size.0,
            prefix_match_unit: prefix_match_unit.map(|c| c.0),
        };
        Ok(self.inner.resolve_block_sizes(&params)?)
    }

    fn __richcmp__(&self, other: PyRef<'_, Self>, op: CompareOp) -> PyResult<PyObject> {
        compare(&self.inner, &other.inner, op, other.py())
    }

    fn __repr__(&self) -> String {
        format!(
            "KVCacheConfig(num_blocks={}, num_tensors={}, num_groups={}, \
             prefix_cache_retention_interval={})",
            self.inner.num_blocks,
            self.inner.kv_cache_tensors.len(),
            self.inner.kv_cache_groups.len(),
            self.inner
                .prefix_cache_retention_interval
                .map_or("None".to_string(), |v| v.to_string())
        )
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyKVCacheTensor>()?;
    m.add_class::<PyKVCacheGroupSpec>()?;
    m.add_class::<PyKVCacheConfig>()?;
    Ok(())
}
