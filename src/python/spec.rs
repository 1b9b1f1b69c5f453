//! Python bindings for the `spec` module: the `KVCacheSpec` class tree with vLLM's
//! names, keywords and `isinstance` relations. Each object holds one core
//! [`KvCacheSpec`]; other bindings read it through `PyRef<PyKVCacheSpec>::inner`.

use crate::python::errors::invalid_type;
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::types::{PyDict, PyInt, PyString, PyTuple, PyType};
use pyo3::IntoPyObjectExt;

use super::non_negative::NonNegativeInt;

use crate::spec::{
    is_uniform_type, AttentionParams, ChunkedLocalAttentionSpec, CircularBufferSpec,
    CrossAttentionSpec, Dtype, FullAttentionSpec, HiSparseHotSpec, HiSparseResidentSpec,
    KvCacheSpec, LayerSpecs, MambaCacheMode, MambaSpec, MemoryParams, MlaAttentionSpec, RswaSpec,
    SinkFullAttentionSpec, SlidingWindowMlaSpec, SlidingWindowSpec, SpecClass, TokensPerState,
    UniformTypeSpecs,
};

fn opt(v: Option<NonNegativeInt>) -> Option<usize> {
    v.map(|c| c.0)
}

/// A dtype given as a name (`"bfloat16"`, `"half"`) or as a torch dtype, recognised by
/// `str(obj)` (`"torch.bfloat16"`) so that torch is never imported.
struct PyDtype(Dtype);

impl<'py> FromPyObject<'py> for PyDtype {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(name) = ob.downcast::<PyString>() {
            return Ok(PyDtype(Dtype::parse(name.to_str()?)?));
        }
        let text = ob.str()?.to_string();
        if text.starts_with("torch.") {
            return Ok(PyDtype(Dtype::parse(&text)?));
        }
        Err(invalid_type(format!(
            "dtype must be a dtype name or a torch.dtype, got {}",
            ob.get_type().name()?
        )))
    }
}

/// vLLM's `tokens_per_state`: an int, or a `fractions.Fraction` (anything with int
/// `numerator` and `denominator`; Whisper's block pooling passes `Fraction(1, k)`).
struct PyTokensPerState(TokensPerState);

impl<'py> FromPyObject<'py> for PyTokensPerState {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        if ob.is_instance_of::<PyInt>() {
            let NonNegativeInt(n) = ob.extract()?;
            return Ok(Self(n.into()));
        }
        let term = |name: &str| -> PyResult<usize> {
            let Ok(value) = ob.getattr(name) else {
                return Err(invalid_type(format!(
                    "tokens_per_state must be an int or a fractions.Fraction, got {}",
                    ob.get_type().name()?
                )));
            };
            Ok(value.extract::<NonNegativeInt>()?.0)
        };
        Ok(Self(TokensPerState::new(
            term("numerator")?,
            term("denominator")?,
        )))
    }
}

/// `tokens_per_state` as vLLM spells it: an int, or a `fractions.Fraction`.
fn tokens_per_state_object(py: Python<'_>, value: TokensPerState) -> PyResult<PyObject> {
    if value.denominator() == 1 {
        return value.numerator().into_py_any(py);
    }
    let fraction = py.import("fractions")?.getattr("Fraction")?;
    Ok(fraction
        .call1((value.numerator(), value.denominator()))?
        .unbind())
}

/// How a backend packs an attention page (vLLM's `num_head_slots`, `state_content_bytes`
/// and `tokens_per_state`), as every attention constructor takes it.
struct PagePacking {
    num_head_slots: Option<NonNegativeInt>,
    state_content_bytes: Option<NonNegativeInt>,
    tokens_per_state: PyTokensPerState,
}

#[allow(clippy::too_many_arguments)]
fn attention_params(
    block_size: NonNegativeInt,
    num_kv_heads: NonNegativeInt,
    head_size: NonNegativeInt,
    dtype: PyDtype,
    head_size_v: Option<NonNegativeInt>,
    page_size_padded: Option<NonNegativeInt>,
    packing: PagePacking,
    dcp_sharded: bool,
) -> AttentionParams {
    let mut attn = AttentionParams::new(block_size.0, num_kv_heads.0, head_size.0, dtype.0);
    attn.head_size_v = head_size_v.map_or(head_size.0, |c| c.0);
    attn.page_size_padded = opt(page_size_padded);
    attn.num_head_slots = opt(packing.num_head_slots);
    attn.state_content_bytes = opt(packing.state_content_bytes);
    attn.tokens_per_state = packing.tokens_per_state.0;
    attn.dcp_sharded = dcp_sharded;
    attn
}

fn base_init(inner: KvCacheSpec) -> PyClassInitializer<PyKVCacheSpec> {
    PyClassInitializer::from(PyKVCacheSpec { inner })
}

fn attention_init(inner: KvCacheSpec) -> PyClassInitializer<PyAttentionSpec> {
    base_init(inner).add_subclass(PyAttentionSpec)
}

fn full_init(inner: KvCacheSpec) -> PyClassInitializer<PyFullAttentionSpec> {
    attention_init(inner).add_subclass(PyFullAttentionSpec)
}

/// Wraps a core spec in the Python class that matches it.
pub(crate) fn spec_to_py(py: Python<'_>, inner: KvCacheSpec) -> PyResult<Bound<'_, PyAny>> {
    Ok(match inner.class() {
        SpecClass::Base => Bound::new(py, base_init(inner))?.into_any(),
        SpecClass::FullAttention => Bound::new(py, full_init(inner))?.into_any(),
        SpecClass::MlaAttention => {
            Bound::new(py, full_init(inner).add_subclass(PyMLAAttentionSpec))?.into_any()
        }
        SpecClass::SinkFullAttention => {
            Bound::new(py, full_init(inner).add_subclass(PySinkFullAttentionSpec))?.into_any()
        }
        SpecClass::Rswa => Bound::new(py, full_init(inner).add_subclass(PyRSWASpec))?.into_any(),
        SpecClass::SlidingWindow => {
            Bound::new(py, attention_init(inner).add_subclass(PySlidingWindowSpec))?.into_any()
        }
        SpecClass::SlidingWindowMla => Bound::new(
            py,
            attention_init(inner)
                .add_subclass(PySlidingWindowSpec)
                .add_subclass(PySlidingWindowMLASpec),
        )?
        .into_any(),
        SpecClass::ChunkedLocalAttention => Bound::new(
            py,
            attention_init(inner).add_subclass(PyChunkedLocalAttentionSpec),
        )?
        .into_any(),
        SpecClass::CrossAttention => {
            Bound::new(py, attention_init(inner).add_subclass(PyCrossAttentionSpec))?.into_any()
        }
        SpecClass::CircularBuffer => {
            Bound::new(py, attention_init(inner).add_subclass(PyCircularBufferSpec))?.into_any()
        }
        SpecClass::Mamba => Bound::new(py, base_init(inner).add_subclass(PyMambaSpec))?.into_any(),
        SpecClass::HiSparseHot => {
            Bound::new(py, base_init(inner).add_subclass(PyHiSparseHotSpec))?.into_any()
        }
        SpecClass::HiSparseResident => {
            Bound::new(py, base_init(inner).add_subclass(PyHiSparseResidentSpec))?.into_any()
        }
        SpecClass::UniformType => {
            Bound::new(py, base_init(inner).add_subclass(PyUniformTypeKVCacheSpecs))?.into_any()
        }
    })
}

/// The spec class a Python class object stands for (most derived first).
fn class_of(cls: &Bound<'_, PyType>) -> PyResult<SpecClass> {
    Ok(if cls.is_subclass_of::<PyMLAAttentionSpec>()? {
        SpecClass::MlaAttention
    } else if cls.is_subclass_of::<PySinkFullAttentionSpec>()? {
        SpecClass::SinkFullAttention
    } else if cls.is_subclass_of::<PyRSWASpec>()? {
        SpecClass::Rswa
    } else if cls.is_subclass_of::<PyFullAttentionSpec>()? {
        SpecClass::FullAttention
    } else if cls.is_subclass_of::<PySlidingWindowMLASpec>()? {
        SpecClass::SlidingWindowMla
    } else if cls.is_subclass_of::<PySlidingWindowSpec>()? {
        SpecClass::SlidingWindow
    } else if cls.is_subclass_of::<PyChunkedLocalAttentionSpec>()? {
        SpecClass::ChunkedLocalAttention
    } else if cls.is_subclass_of::<PyCrossAttentionSpec>()? {
        SpecClass::CrossAttention
    } else if cls.is_subclass_of::<PyCircularBufferSpec>()? {
        SpecClass::CircularBuffer
    } else if cls.is_subclass_of::<PyMambaSpec>()? {
        SpecClass::Mamba
    } else if cls.is_subclass_of::<PyHiSparseHotSpec>()? {
        SpecClass::HiSparseHot
    } else if cls.is_subclass_of::<PyHiSparseResidentSpec>()? {
        SpecClass::HiSparseResident
    } else if cls.is_subclass_of::<PyUniformTypeKVCacheSpecs>()? {
        SpecClass::UniformType
    } else {
        SpecClass::Base
    })
}

/// Ordered `(layer name, spec)` pairs from a `dict[str, KVCacheSpec]`.
fn layer_specs(specs: &Bound<'_, PyDict>) -> PyResult<Vec<(String, KvCacheSpec)>> {
    specs
        .iter()
        .map(|(k, v)| {
            let name: String = k.extract()?;
            let spec: PyRef<'_, PyKVCacheSpec> = v.extract()?;
            Ok((name, spec.inner.clone()))
        })
        .collect()
}

fn attn_of(spec: &KvCacheSpec) -> PyResult<&AttentionParams> {
    spec.attention()
        .ok_or_else(|| invalid_type("not an attention spec"))
}

fn full_of(spec: &KvCacheSpec) -> PyResult<&FullAttentionSpec> {
    spec.full_attention()
        .ok_or_else(|| invalid_type("not a full attention spec"))
}

/// Base class of every KV cache spec (vLLM's `KVCacheSpec`).
#[pyclass(name = "KVCacheSpec", module = "kvblocks._core", subclass)]
pub(crate) struct PyKVCacheSpec {
    pub(crate) inner: KvCacheSpec,
}

#[pymethods]
impl PyKVCacheSpec {
    #[getter]
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    #[getter]
    fn page_size_bytes(&self) -> usize {
        self.inner.page_size_bytes()
    }

    #[pyo3(signature = (
        *,
        max_model_len,
        max_num_batched_tokens = NonNegativeInt(2048),
        max_num_encoder_input_tokens = None,
        max_concurrent_batches = NonNegativeInt(1),
        dcp_world_size = NonNegativeInt(1),
    ), text_signature = "(self, *, max_model_len, max_num_batched_tokens=2048, \
        max_num_encoder_input_tokens=None, max_concurrent_batches=1, dcp_world_size=1)")]
    fn max_memory_usage_bytes(
        &self,
        max_model_len: NonNegativeInt,
        max_num_batched_tokens: NonNegativeInt,
        max_num_encoder_input_tokens: Option<NonNegativeInt>,
        max_concurrent_batches: NonNegativeInt,
        dcp_world_size: NonNegativeInt,
    ) -> PyResult<usize> {
        let params = MemoryParams {
            max_model_len: max_model_len.0,
            max_num_batched_tokens: max_num_batched_tokens.0,
            max_num_encoder_input_tokens: opt(max_num_encoder_input_tokens)
                .unwrap_or(max_num_batched_tokens.0),
            max_concurrent_batches: max_concurrent_batches.0,
            dcp_world_size: dcp_world_size.0,
        };
        Ok(self.inner.max_memory_usage_bytes(&params)?)
    }

    #[classmethod]
    fn merge<'py>(
        cls: &Bound<'py, PyType>,
        specs: Vec<PyRef<'py, PyKVCacheSpec>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let specs: Vec<KvCacheSpec> = specs.iter().map(|s| s.inner.clone()).collect();
        let merged = KvCacheSpec::merge_as(class_of(cls)?, &specs)?;
        spec_to_py(cls.py(), merged)
    }

    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<PyObject> {
        let py = other.py();
        let Ok(other) = other.downcast::<PyKVCacheSpec>() else {
            return Ok(py.NotImplemented());
        };
        let eq = self.inner == other.borrow().inner;
        match op {
            CompareOp::Eq => eq.into_py_any(py),
            CompareOp::Ne => (!eq).into_py_any(py),
            _ => Ok(py.NotImplemented()),
        }
    }

    fn __hash__(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.inner.hash(&mut h);
        h.finish()
    }

    fn __repr__(&self) -> String {
        self.inner.to_string()
    }
}

/// Base class of the attention specs (vLLM's `AttentionSpec`).
#[pyclass(name = "AttentionSpec", module = "kvblocks._core", extends = PyKVCacheSpec, subclass)]
pub(crate) struct PyAttentionSpec;

#[pymethods]
impl PyAttentionSpec {
    #[getter]
    fn num_kv_heads(slf: PyRef<'_, Self>) -> PyResult<usize> {
        Ok(attn_of(&slf.as_super().inner)?.num_kv_heads)
    }

    #[getter]
    fn head_size(slf: PyRef<'_, Self>) -> PyResult<usize> {
        Ok(attn_of(&slf.as_super().inner)?.head_size)
    }

    #[getter]
    fn head_size_v(slf: PyRef<'_, Self>) -> PyResult<usize> {
        Ok(attn_of(&slf.as_super().inner)?.head_size_v)
    }

    #[getter]
    fn dtype(slf: PyRef<'_, Self>) -> PyResult<&'static str> {
        Ok(attn_of(&slf.as_super().inner)?.dtype.name())
    }

    #[getter]
    fn page_size_padded(slf: PyRef<'_, Self>) -> PyResult<Option<usize>> {
        Ok(attn_of(&slf.as_super().inner)?.page_size_padded)
    }

    #[getter]
    fn num_head_slots(slf: PyRef<'_, Self>) -> PyResult<Option<usize>> {
        Ok(attn_of(&slf.as_super().inner)?.num_head_slots)
    }

    #[getter]
    fn state_content_bytes(slf: PyRef<'_, Self>) -> PyResult<Option<usize>> {
        Ok(attn_of(&slf.as_super().inner)?.state_content_bytes)
    }

    #[getter]
    fn tokens_per_state(slf: PyRef<'_, Self>) -> PyResult<PyObject> {
        let value = attn_of(&slf.as_super().inner)?.tokens_per_state;
        tokens_per_state_object(slf.py(), value)
    }

    #[getter]
    fn dcp_sharded(slf: PyRef<'_, Self>) -> PyResult<bool> {
        Ok(attn_of(&slf.as_super().inner)?.dcp_sharded)
    }
}

/// Full attention (vLLM's `FullAttentionSpec`).
#[pyclass(name = "FullAttentionSpec", module = "kvblocks._core", extends = PyAttentionSpec, subclass)]
pub(crate) struct PyFullAttentionSpec;

#[pymethods]
impl PyFullAttentionSpec {
    #[new]
    #[pyo3(signature = (
        *, block_size, num_kv_heads, head_size, dtype, head_size_v = None,
        sliding_window = None, attention_chunk_size = None, page_size_padded = None,
        num_head_slots = None, state_content_bytes = None, tokens_per_state = PyTokensPerState(TokensPerState::ONE),
        dcp_sharded = true,
    ), text_signature = "(*, block_size, num_kv_heads, head_size, dtype, head_size_v=None, \
        sliding_window=None, attention_chunk_size=None, page_size_padded=None, \
        num_head_slots=None, state_content_bytes=None, tokens_per_state=1, dcp_sharded=True)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        block_size: NonNegativeInt,
        num_kv_heads: NonNegativeInt,
        head_size: NonNegativeInt,
        dtype: PyDtype,
        head_size_v: Option<NonNegativeInt>,
        sliding_window: Option<NonNegativeInt>,
        attention_chunk_size: Option<NonNegativeInt>,
        page_size_padded: Option<NonNegativeInt>,
        num_head_slots: Option<NonNegativeInt>,
        state_content_bytes: Option<NonNegativeInt>,
        tokens_per_state: PyTokensPerState,
        dcp_sharded: bool,
    ) -> PyResult<PyClassInitializer<Self>> {
        let attn = attention_params(
            block_size,
            num_kv_heads,
            head_size,
            dtype,
            head_size_v,
            page_size_padded,
            PagePacking {
                num_head_slots,
                state_content_bytes,
                tokens_per_state,
            },
            dcp_sharded,
        );
        let spec = KvCacheSpec::from(FullAttentionSpec {
            attn,
            sliding_window: opt(sliding_window),
            attention_chunk_size: opt(attention_chunk_size),
        })
        .build()?;
        Ok(full_init(spec))
    }

    #[getter]
    fn sliding_window(slf: PyRef<'_, Self>) -> PyResult<Option<usize>> {
        Ok(full_of(&slf.as_super().as_super().inner)?.sliding_window)
    }

    #[getter]
    fn attention_chunk_size(slf: PyRef<'_, Self>) -> PyResult<Option<usize>> {
        Ok(full_of(&slf.as_super().as_super().inner)?.attention_chunk_size)
    }
}

/// Multi-head latent attention (vLLM's `MLAAttentionSpec`): `head_size_v` is 0.
#[pyclass(name = "MLAAttentionSpec", module = "kvblocks._core", extends = PyFullAttentionSpec)]
pub(crate) struct PyMLAAttentionSpec;

#[pymethods]
impl PyMLAAttentionSpec {
    #[new]
    #[pyo3(signature = (
        *, block_size, num_kv_heads, head_size, dtype, cache_dtype_str = None,
        alignment = None, page_size_padded = None,
        num_head_slots = None, state_content_bytes = None, tokens_per_state = PyTokensPerState(TokensPerState::ONE),
        dcp_sharded = true,
    ), text_signature = "(*, block_size, num_kv_heads, head_size, dtype, cache_dtype_str=None, \
        alignment=None, page_size_padded=None, num_head_slots=None, state_content_bytes=None, \
        tokens_per_state=1, dcp_sharded=True)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        block_size: NonNegativeInt,
        num_kv_heads: NonNegativeInt,
        head_size: NonNegativeInt,
        dtype: PyDtype,
        cache_dtype_str: Option<String>,
        alignment: Option<NonNegativeInt>,
        page_size_padded: Option<NonNegativeInt>,
        num_head_slots: Option<NonNegativeInt>,
        state_content_bytes: Option<NonNegativeInt>,
        tokens_per_state: PyTokensPerState,
        dcp_sharded: bool,
    ) -> PyResult<PyClassInitializer<Self>> {
        let attn = attention_params(
            block_size,
            num_kv_heads,
            head_size,
            dtype,
            Some(NonNegativeInt(0)),
            page_size_padded,
            PagePacking {
                num_head_slots,
                state_content_bytes,
                tokens_per_state,
            },
            dcp_sharded,
        );
        let spec = KvCacheSpec::from(MlaAttentionSpec {
            full: FullAttentionSpec::new(attn),
            cache_dtype_str,
            alignment: opt(alignment),
        })
        .build()?;
        Ok(full_init(spec).add_subclass(PyMLAAttentionSpec))
    }

    #[getter]
    fn cache_dtype_str(slf: PyRef<'_, Self>) -> Option<String> {
        match &slf.as_super().as_super().as_super().inner {
            KvCacheSpec::MlaAttention(m) => m.cache_dtype_str.clone(),
            _ => None,
        }
    }

    #[getter]
    fn alignment(slf: PyRef<'_, Self>) -> Option<usize> {
        match &slf.as_super().as_super().as_super().inner {
            KvCacheSpec::MlaAttention(m) => m.alignment,
            _ => None,
        }
    }
}

/// Full attention with attention sinks (vLLM's `SinkFullAttentionSpec`).
#[pyclass(name = "SinkFullAttentionSpec", module = "kvblocks._core", extends = PyFullAttentionSpec)]
pub(crate) struct PySinkFullAttentionSpec;

#[pymethods]
impl PySinkFullAttentionSpec {
    #[new]
    #[pyo3(signature = (
        *, block_size, num_kv_heads, head_size, dtype, sink_len, head_size_v = None,
        sliding_window = None, attention_chunk_size = None, page_size_padded = None,
        num_head_slots = None, state_content_bytes = None, tokens_per_state = PyTokensPerState(TokensPerState::ONE),
        dcp_sharded = true,
    ), text_signature = "(*, block_size, num_kv_heads, head_size, dtype, sink_len, \
        head_size_v=None, sliding_window=None, attention_chunk_size=None, page_size_padded=None, \
        num_head_slots=None, state_content_bytes=None, tokens_per_state=1, dcp_sharded=True)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        block_size: NonNegativeInt,
        num_kv_heads: NonNegativeInt,
        head_size: NonNegativeInt,
        dtype: PyDtype,
        sink_len: NonNegativeInt,
        head_size_v: Option<NonNegativeInt>,
        sliding_window: Option<NonNegativeInt>,
        attention_chunk_size: Option<NonNegativeInt>,
        page_size_padded: Option<NonNegativeInt>,
        num_head_slots: Option<NonNegativeInt>,
        state_content_bytes: Option<NonNegativeInt>,
        tokens_per_state: PyTokensPerState,
        dcp_sharded: bool,
    ) -> PyResult<PyClassInitializer<Self>> {
        let attn = attention_params(
            block_size,
            num_kv_heads,
            head_size,
            dtype,
            head_size_v,
            page_size_padded,
            PagePacking {
                num_head_slots,
                state_content_bytes,
                tokens_per_state,
            },
            dcp_sharded,
        );
        let spec = KvCacheSpec::from(SinkFullAttentionSpec {
            full: FullAttentionSpec {
                attn,
                sliding_window: opt(sliding_window),
                attention_chunk_size: opt(attention_chunk_size),
            },
            sink_len: sink_len.0,
        })
        .build()?;
        Ok(full_init(spec).add_subclass(PySinkFullAttentionSpec))
    }

    #[getter]
    fn sink_len(slf: PyRef<'_, Self>) -> Option<usize> {
        match &slf.as_super().as_super().as_super().inner {
            KvCacheSpec::SinkFullAttention(s) => Some(s.sink_len),
            _ => None,
        }
    }
}

/// Reference sliding window attention (vLLM's `RSWASpec`): the prompt stays, and of
/// the generated tokens only the last `rswa_window`.
#[pyclass(name = "RSWASpec", module = "kvblocks._core", extends = PyFullAttentionSpec)]
pub(crate) struct PyRSWASpec;

#[pymethods]
impl PyRSWASpec {
    #[new]
    #[pyo3(signature = (
        *, block_size, num_kv_heads, head_size, dtype, rswa_window, head_size_v = None,
        page_size_padded = None, num_head_slots = None, state_content_bytes = None,
        tokens_per_state = PyTokensPerState(TokensPerState::ONE), dcp_sharded = true,
    ), text_signature = "(*, block_size, num_kv_heads, head_size, dtype, rswa_window, \
        head_size_v=None, page_size_padded=None, num_head_slots=None, \
        state_content_bytes=None, tokens_per_state=1, dcp_sharded=True)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        block_size: NonNegativeInt,
        num_kv_heads: NonNegativeInt,
        head_size: NonNegativeInt,
        dtype: PyDtype,
        rswa_window: NonNegativeInt,
        head_size_v: Option<NonNegativeInt>,
        page_size_padded: Option<NonNegativeInt>,
        num_head_slots: Option<NonNegativeInt>,
        state_content_bytes: Option<NonNegativeInt>,
        tokens_per_state: PyTokensPerState,
        dcp_sharded: bool,
    ) -> PyResult<PyClassInitializer<Self>> {
        let packing = PagePacking {
            num_head_slots,
            state_content_bytes,
            tokens_per_state,
        };
        let attn = attention_params(
            block_size,
            num_kv_heads,
            head_size,
            dtype,
            head_size_v,
            page_size_padded,
            packing,
            dcp_sharded,
        );
        let spec = KvCacheSpec::from(RswaSpec {
            full: FullAttentionSpec::new(attn),
            rswa_window: rswa_window.0,
        })
        .build()?;
        Ok(full_init(spec).add_subclass(PyRSWASpec))
    }

    #[getter]
    fn rswa_window(slf: PyRef<'_, Self>) -> Option<usize> {
        match &slf.as_super().as_super().as_super().inner {
            KvCacheSpec::Rswa(r) => Some(r.rswa_window),
            _ => None,
        }
    }
}

/// Sliding window attention (vLLM's `SlidingWindowSpec`).
#[pyclass(name = "SlidingWindowSpec", module = "kvblocks._core", extends = PyAttentionSpec, subclass)]
pub(crate) struct PySlidingWindowSpec;

#[pymethods]
impl PySlidingWindowSpec {
    #[new]
    #[pyo3(signature = (
        *, block_size, num_kv_heads, head_size, dtype, sliding_window, head_size_v = None,
        extra_retained_tokens = NonNegativeInt(0), page_size_padded = None,
        num_head_slots = None, state_content_bytes = None, tokens_per_state = PyTokensPerState(TokensPerState::ONE),
        dcp_sharded = true,
    ), text_signature = "(*, block_size, num_kv_heads, head_size, dtype, sliding_window, \
        head_size_v=None, extra_retained_tokens=0, page_size_padded=None, num_head_slots=None, \
        state_content_bytes=None, tokens_per_state=1, dcp_sharded=True)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        block_size: NonNegativeInt,
        num_kv_heads: NonNegativeInt,
        head_size: NonNegativeInt,
        dtype: PyDtype,
        sliding_window: NonNegativeInt,
        head_size_v: Option<NonNegativeInt>,
        extra_retained_tokens: NonNegativeInt,
        page_size_padded: Option<NonNegativeInt>,
        num_head_slots: Option<NonNegativeInt>,
        state_content_bytes: Option<NonNegativeInt>,
        tokens_per_state: PyTokensPerState,
        dcp_sharded: bool,
    ) -> PyResult<PyClassInitializer<Self>> {
        let attn = attention_params(
            block_size,
            num_kv_heads,
            head_size,
            dtype,
            head_size_v,
            page_size_padded,
            PagePacking {
                num_head_slots,
                state_content_bytes,
                tokens_per_state,
            },
            dcp_sharded,
        );
        let spec = KvCacheSpec::from(SlidingWindowSpec {
            attn,
            sliding_window: sliding_window.0,
            extra_retained_tokens: extra_retained_tokens.0,
        })
        .build()?;
        Ok(attention_init(spec).add_subclass(PySlidingWindowSpec))
    }

    #[getter]
    fn sliding_window(slf: PyRef<'_, Self>) -> Option<usize> {
        slf.as_super().as_super().inner.sliding_window()
    }

    #[getter]
    fn extra_retained_tokens(slf: PyRef<'_, Self>) -> Option<usize> {
        let spec = &slf.as_super().as_super().inner;
        spec.sliding_window_spec().map(|s| s.extra_retained_tokens)
    }

    fn max_admission_blocks_per_request(
        slf: PyRef<'_, Self>,
        max_in_flight_tokens: NonNegativeInt,
        max_model_len: NonNegativeInt,
    ) -> Option<usize> {
        slf.as_super()
            .as_super()
            .inner
            .max_admission_blocks_per_request(max_in_flight_tokens.0, max_model_len.0)
    }
}

fn sliding_window_mla_of(spec: &KvCacheSpec) -> Option<&SlidingWindowMlaSpec> {
    match spec {
        KvCacheSpec::SlidingWindowMla(s) => Some(s),
        _ => None,
    }
}

/// Sliding window attention with MLA's page (vLLM's `SlidingWindowMLASpec`, DeepSeek-V4):
/// `head_size_v` is 0 and pages are padded to `alignment`.
#[pyclass(name = "SlidingWindowMLASpec", module = "kvblocks._core", extends = PySlidingWindowSpec)]
pub(crate) struct PySlidingWindowMLASpec;

#[pymethods]
impl PySlidingWindowMLASpec {
    #[new]
    #[pyo3(signature = (
        *, block_size, num_kv_heads, head_size, dtype, sliding_window,
        extra_retained_tokens = NonNegativeInt(0), cache_dtype_str = None, alignment = None,
        bounded_replay = false, page_size_padded = None, num_head_slots = None,
        state_content_bytes = None, tokens_per_state = PyTokensPerState(TokensPerState::ONE), dcp_sharded = true,
    ), text_signature = "(*, block_size, num_kv_heads, head_size, dtype, sliding_window, \
        extra_retained_tokens=0, cache_dtype_str=None, alignment=None, bounded_replay=False, \
        page_size_padded=None, num_head_slots=None, state_content_bytes=None, \
        tokens_per_state=1, dcp_sharded=True)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        block_size: NonNegativeInt,
        num_kv_heads: NonNegativeInt,
        head_size: NonNegativeInt,
        dtype: PyDtype,
        sliding_window: NonNegativeInt,
        extra_retained_tokens: NonNegativeInt,
        cache_dtype_str: Option<String>,
        alignment: Option<NonNegativeInt>,
        bounded_replay: bool,
        page_size_padded: Option<NonNegativeInt>,
        num_head_slots: Option<NonNegativeInt>,
        state_content_bytes: Option<NonNegativeInt>,
        tokens_per_state: PyTokensPerState,
        dcp_sharded: bool,
    ) -> PyResult<PyClassInitializer<Self>> {
        let attn = attention_params(
            block_size,
            num_kv_heads,
            head_size,
            dtype,
            Some(NonNegativeInt(0)),
            page_size_padded,
            PagePacking {
                num_head_slots,
                state_content_bytes,
                tokens_per_state,
            },
            dcp_sharded,
        );
        let spec = KvCacheSpec::from(SlidingWindowMlaSpec {
            window: SlidingWindowSpec {
                attn,
                sliding_window: sliding_window.0,
                extra_retained_tokens: extra_retained_tokens.0,
            },
            cache_dtype_str,
            alignment: opt(alignment),
            bounded_replay,
        })
        .build()?;
        Ok(attention_init(spec)
            .add_subclass(PySlidingWindowSpec)
            .add_subclass(PySlidingWindowMLASpec))
    }

    #[getter]
    fn cache_dtype_str(slf: PyRef<'_, Self>) -> Option<String> {
        let spec = &slf.as_super().as_super().as_super().inner;
        sliding_window_mla_of(spec).and_then(|s| s.cache_dtype_str.clone())
    }

    #[getter]
    fn alignment(slf: PyRef<'_, Self>) -> Option<usize> {
        let spec = &slf.as_super().as_super().as_super().inner;
        sliding_window_mla_of(spec).and_then(|s| s.alignment)
    }

    #[getter]
    fn bounded_replay(slf: PyRef<'_, Self>) -> bool {
        let spec = &slf.as_super().as_super().as_super().inner;
        sliding_window_mla_of(spec).is_some_and(|s| s.bounded_replay)
    }
}

/// Chunked local attention (vLLM's `ChunkedLocalAttentionSpec`).
#[pyclass(name = "ChunkedLocalAttentionSpec", module = "kvblocks._core", extends = PyAttentionSpec)]
pub(crate) struct PyChunkedLocalAttentionSpec;

#[pymethods]
impl PyChunkedLocalAttentionSpec {
    #[new]
    #[pyo3(signature = (
        *, block_size, num_kv_heads, head_size, dtype, attention_chunk_size,
        head_size_v = None, page_size_padded = None,
        num_head_slots = None, state_content_bytes = None, tokens_per_state = PyTokensPerState(TokensPerState::ONE),
        dcp_sharded = true,
    ), text_signature = "(*, block_size, num_kv_heads, head_size, dtype, attention_chunk_size, \
        head_size_v=None, page_size_padded=None, num_head_slots=None, state_content_bytes=None, \
        tokens_per_state=1, dcp_sharded=True)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        block_size: NonNegativeInt,
        num_kv_heads: NonNegativeInt,
        head_size: NonNegativeInt,
        dtype: PyDtype,
        attention_chunk_size: NonNegativeInt,
        head_size_v: Option<NonNegativeInt>,
        page_size_padded: Option<NonNegativeInt>,
        num_head_slots: Option<NonNegativeInt>,
        state_content_bytes: Option<NonNegativeInt>,
        tokens_per_state: PyTokensPerState,
        dcp_sharded: bool,
    ) -> PyResult<PyClassInitializer<Self>> {
        let attn = attention_params(
            block_size,
            num_kv_heads,
            head_size,
            dtype,
            head_size_v,
            page_size_padded,
            PagePacking {
                num_head_slots,
                state_content_bytes,
                tokens_per_state,
            },
            dcp_sharded,
        );
        let spec = KvCacheSpec::from(ChunkedLocalAttentionSpec {
            attn,
            attention_chunk_size: attention_chunk_size.0,
        })
        .build()?;
        Ok(attention_init(spec).add_subclass(PyChunkedLocalAttentionSpec))
    }

    #[getter]
    fn attention_chunk_size(slf: PyRef<'_, Self>) -> Option<usize> {
        match &slf.as_super().as_super().inner {
            KvCacheSpec::ChunkedLocalAttention(c) => Some(c.attention_chunk_size),
            _ => None,
        }
    }

    fn max_admission_blocks_per_request(
        slf: PyRef<'_, Self>,
        max_in_flight_tokens: NonNegativeInt,
        max_model_len: NonNegativeInt,
    ) -> Option<usize> {
        slf.as_super()
            .as_super()
            .inner
            .max_admission_blocks_per_request(max_in_flight_tokens.0, max_model_len.0)
    }
}

/// A Python class for an attention spec with only the shared attention fields: its
/// class name, its pyclass, and the core struct it builds.
macro_rules! plain_attention_class {
    ($(#[$doc:meta])* $name:literal, $py:ident, $core:ident) => {
        $(#[$doc])*
        #[pyclass(name = $name, module = "kvblocks._core", extends = PyAttentionSpec)]
        pub(crate) struct $py;

        #[pymethods]
        impl $py {
            #[new]
            #[pyo3(signature = (
                *, block_size, num_kv_heads, head_size, dtype, head_size_v = None,
                page_size_padded = None, num_head_slots = None, state_content_bytes = None,
                tokens_per_state = PyTokensPerState(TokensPerState::ONE), dcp_sharded = true,
            ), text_signature = "(*, block_size, num_kv_heads, head_size, dtype, \
                head_size_v=None, page_size_padded=None, num_head_slots=None, \
                state_content_bytes=None, tokens_per_state=1, dcp_sharded=True)")]
            #[allow(clippy::too_many_arguments)]
            fn new(
                block_size: NonNegativeInt,
                num_kv_heads: NonNegativeInt,
                head_size: NonNegativeInt,
                dtype: PyDtype,
                head_size_v: Option<NonNegativeInt>,
                page_size_padded: Option<NonNegativeInt>,
                num_head_slots: Option<NonNegativeInt>,
                state_content_bytes: Option<NonNegativeInt>,
                tokens_per_state: PyTokensPerState,
                dcp_sharded: bool,
            ) -> PyResult<PyClassInitializer<Self>> {
                let attn = attention_params(
                    block_size,
                    num_kv_heads,
                    head_size,
                    dtype,
                    head_size_v,
                    page_size_padded,
                    PagePacking {
                        num_head_slots,
                        state_content_bytes,
                        tokens_per_state,
                    },
                    dcp_sharded,
                );
                let spec = KvCacheSpec::from($core { attn }).build()?;
                Ok(attention_init(spec).add_subclass($py))
            }
        }
    };
}

plain_attention_class!(
    /// Cross attention of encoder-decoder models (vLLM's `CrossAttentionSpec`).
    "CrossAttentionSpec",
    PyCrossAttentionSpec,
    CrossAttentionSpec
);

plain_attention_class!(
    /// A ring buffer of one block per request, never prefix cached (vLLM's
    /// `CircularBufferSpec`; `block_size` is the ring's capacity).
    "CircularBufferSpec",
    PyCircularBufferSpec,
    CircularBufferSpec
);

fn mamba_of(spec: &KvCacheSpec) -> PyResult<&MambaSpec> {
    match spec {
        KvCacheSpec::Mamba(m) => Ok(m),
        _ => Err(invalid_type("not a Mamba spec")),
    }
}

/// A Mamba layer's state (vLLM's `MambaSpec`).
#[pyclass(name = "MambaSpec", module = "kvblocks._core", extends = PyKVCacheSpec)]
pub(crate) struct PyMambaSpec;

#[pymethods]
impl PyMambaSpec {
    #[new]
    #[pyo3(signature = (
        *, block_size, shapes, dtypes, page_size_padded = None, mamba_type = "mamba2",
        mamba_cache_mode = "none", num_speculative_blocks = NonNegativeInt(0),
        num_prefill_checkpoint_blocks = NonNegativeInt(0), prefill_checkpoint_alignment = None,
    ), text_signature = "(*, block_size, shapes, dtypes, page_size_padded=None, \
        mamba_type='mamba2', mamba_cache_mode='none', num_speculative_blocks=0, \
        num_prefill_checkpoint_blocks=0, prefill_checkpoint_alignment=None)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        block_size: NonNegativeInt,
        shapes: Vec<Vec<NonNegativeInt>>,
        dtypes: Vec<PyDtype>,
        page_size_padded: Option<NonNegativeInt>,
        mamba_type: &str,
        mamba_cache_mode: &str,
        num_speculative_blocks: NonNegativeInt,
        num_prefill_checkpoint_blocks: NonNegativeInt,
        prefill_checkpoint_alignment: Option<NonNegativeInt>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let spec = KvCacheSpec::from(MambaSpec {
            block_size: block_size.0,
            shapes: shapes
                .into_iter()
                .map(|s| s.into_iter().map(|c| c.0).collect())
                .collect(),
            dtypes: dtypes.into_iter().map(|d| d.0).collect(),
            page_size_padded: opt(page_size_padded),
            mamba_type: mamba_type.to_owned(),
            mamba_cache_mode: MambaCacheMode::parse(mamba_cache_mode)?,
            num_speculative_blocks: num_speculative_blocks.0,
            num_prefill_checkpoint_blocks: num_prefill_checkpoint_blocks.0,
            prefill_checkpoint_alignment: opt(prefill_checkpoint_alignment),
        })
        .build()?;
        Ok(base_init(spec).add_subclass(PyMambaSpec))
    }

    #[getter]
    fn shapes<'py>(slf: PyRef<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let m = mamba_of(&slf.as_super().inner)?;
        let shapes = m
            .shapes
            .iter()
            .map(|s| PyTuple::new(py, s))
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, shapes)
    }

    #[getter]
    fn dtypes<'py>(slf: PyRef<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let m = mamba_of(&slf.as_super().inner)?;
        PyTuple::new(py, m.dtypes.iter().map(|d| d.name()))
    }

    #[getter]
    fn page_size_padded(slf: PyRef<'_, Self>) -> PyResult<Option<usize>> {
        Ok(mamba_of(&slf.as_super().inner)?.page_size_padded)
    }

    #[getter]
    fn mamba_type(slf: PyRef<'_, Self>) -> PyResult<String> {
        Ok(mamba_of(&slf.as_super().inner)?.mamba_type.clone())
    }

    #[getter]
    fn mamba_cache_mode(slf: PyRef<'_, Self>) -> PyResult<&'static str> {
        Ok(mamba_of(&slf.as_super().inner)?.mamba_cache_mode.as_str())
    }

    #[getter]
    fn num_speculative_blocks(slf: PyRef<'_, Self>) -> PyResult<usize> {
        Ok(mamba_of(&slf.as_super().inner)?.num_speculative_blocks)
    }

    #[getter]
    fn num_prefill_checkpoint_blocks(slf: PyRef<'_, Self>) -> PyResult<usize> {
        Ok(mamba_of(&slf.as_super().inner)?.num_prefill_checkpoint_blocks)
    }

    #[getter]
    fn prefill_checkpoint_alignment(slf: PyRef<'_, Self>) -> PyResult<Option<usize>> {
        Ok(mamba_of(&slf.as_super().inner)?.prefill_checkpoint_alignment)
    }
}

/// A request's HiSparse hot-cache region (vLLM's `HiSparseHotSpec`).
#[pyclass(name = "HiSparseHotSpec", module = "kvblocks._core", extends = PyKVCacheSpec)]
pub(crate) struct PyHiSparseHotSpec;

#[pymethods]
impl PyHiSparseHotSpec {
    #[new]
    #[pyo3(signature = (*, block_size, page_size, blocks_per_request))]
    fn new(
        block_size: NonNegativeInt,
        page_size: NonNegativeInt,
        blocks_per_request: NonNegativeInt,
    ) -> PyResult<PyClassInitializer<Self>> {
        let spec = KvCacheSpec::from(HiSparseHotSpec {
            block_size: block_size.0,
            page_size: page_size.0,
            blocks_per_request: blocks_per_request.0,
        })
        .build()?;
        Ok(base_init(spec).add_subclass(PyHiSparseHotSpec))
    }

    #[getter]
    fn page_size(slf: PyRef<'_, Self>) -> usize {
        slf.as_super().inner.page_size_bytes()
    }

    #[getter]
    fn blocks_per_request(slf: PyRef<'_, Self>) -> PyResult<usize> {
        match &slf.as_super().inner {
            KvCacheSpec::HiSparseHot(h) => Ok(h.blocks_per_request),
            _ => Err(invalid_type("not a HiSparseHotSpec")),
        }
    }
}

/// GPU-resident pages of host-backed HiSparse KV (vLLM's `HiSparseResidentSpec`).
#[pyclass(name = "HiSparseResidentSpec", module = "kvblocks._core", extends = PyKVCacheSpec)]
pub(crate) struct PyHiSparseResidentSpec;

#[pymethods]
impl PyHiSparseResidentSpec {
    #[new]
    #[pyo3(signature = (*, block_size, page_size))]
    fn new(
        block_size: NonNegativeInt,
        page_size: NonNegativeInt,
    ) -> PyResult<PyClassInitializer<Self>> {
        let spec = KvCacheSpec::from(HiSparseResidentSpec {
            block_size: block_size.0,
            page_size: page_size.0,
        })
        .build()?;
        Ok(base_init(spec).add_subclass(PyHiSparseResidentSpec))
    }

    #[getter]
    fn page_size(slf: PyRef<'_, Self>) -> usize {
        slf.as_super().inner.page_size_bytes()
    }

    fn max_admission_blocks_per_request(
        slf: PyRef<'_, Self>,
        max_in_flight_tokens: NonNegativeInt,
        max_model_len: NonNegativeInt,
    ) -> Option<usize> {
        slf.as_super()
            .inner
            .max_admission_blocks_per_request(max_in_flight_tokens.0, max_model_len.0)
    }
}

/// Same-type layers sharing one block table (vLLM's `UniformTypeKVCacheSpecs`).
#[pyclass(name = "UniformTypeKVCacheSpecs", module = "kvblocks._core", extends = PyKVCacheSpec)]
pub(crate) struct PyUniformTypeKVCacheSpecs;

#[pymethods]
impl PyUniformTypeKVCacheSpecs {
    #[new]
    #[pyo3(signature = (*, block_size, kv_cache_specs))]
    fn new(
        block_size: NonNegativeInt,
        kv_cache_specs: &Bound<'_, PyDict>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let spec = KvCacheSpec::from(UniformTypeSpecs {
            block_size: block_size.0,
            kv_cache_specs: LayerSpecs(layer_specs(kv_cache_specs)?),
        })
        .build()?;
        Ok(base_init(spec).add_subclass(PyUniformTypeKVCacheSpecs))
    }

    #[getter]
    fn kv_cache_specs<'py>(slf: PyRef<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let py = slf.py();
        let dict = PyDict::new(py);
        if let KvCacheSpec::UniformType(u) = &slf.as_super().inner {
            for (name, spec) in &u.kv_cache_specs.0 {
                dict.set_item(name, spec_to_py(py, spec.clone())?)?;
            }
        }
        Ok(dict)
    }

    #[classmethod]
    fn is_uniform_type(
        _cls: &Bound<'_, PyType>,
        kv_cache_specs: &Bound<'_, PyDict>,
    ) -> PyResult<bool> {
        let specs = layer_specs(kv_cache_specs)?;
        Ok(is_uniform_type(specs.iter().map(|(_, s)| s)))
    }

    #[classmethod]
    fn from_specs<'py>(
        cls: &Bound<'py, PyType>,
        kv_cache_specs: &Bound<'py, PyDict>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        UniformTypeSpecs::from_specs(layer_specs(kv_cache_specs)?)
            .map(|spec| spec_to_py(cls.py(), spec))
            .transpose()
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyKVCacheSpec>()?;
    m.add_class::<PyAttentionSpec>()?;
    m.add_class::<PyFullAttentionSpec>()?;
    m.add_class::<PyMLAAttentionSpec>()?;
    m.add_class::<PySinkFullAttentionSpec>()?;
    m.add_class::<PyRSWASpec>()?;
    m.add_class::<PySlidingWindowSpec>()?;
    m.add_class::<PySlidingWindowMLASpec>()?;
    m.add_class::<PyChunkedLocalAttentionSpec>()?;
    m.add_class::<PyCrossAttentionSpec>()?;
    m.add_class::<PyCircularBufferSpec>()?;
    m.add_class::<PyMambaSpec>()?;
    m.add_class::<PyHiSparseHotSpec>()?;
    m.add_class::<PyHiSparseResidentSpec>()?;
    m.add_class::<PyUniformTypeKVCacheSpecs>()?;
    Ok(())
}
