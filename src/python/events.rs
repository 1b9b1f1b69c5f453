//! Python classes for KV cache events (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`)
//! with vLLM 0.33.0's field names and order, and the one Rust -> Python event conversion
//! ([`event_to_py`]) shared by every binding that returns events.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyInt, PyString, PyTuple};

use crate::events::event::{EventExtraKeys, KvCacheEvent};
use crate::python::errors::{int_overflow, invalid_type};
use crate::types::KeyValue;

/// A `KeyValue` as the Python object it stands for.
pub(crate) fn key_value_to_py<'py>(py: Python<'py>, v: &KeyValue) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        KeyValue::None => py.None().into_bound(py),
        KeyValue::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        KeyValue::Int(i) => i.into_pyobject(py)?.into_any(),
        KeyValue::Str(s) => PyString::new(py, s).into_any(),
        KeyValue::Bytes(b) => PyBytes::new(py, b).into_any(),
        KeyValue::Tuple(items) => tuple_to_py(py, items)?.into_any(),
    })
}

fn tuple_to_py<'py>(py: Python<'py>, items: &[KeyValue]) -> PyResult<Bound<'py, PyTuple>> {
    let objs = items
        .iter()
        .map(|v| key_value_to_py(py, v))
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, objs)
}

/// A Python value (`None`, `bool`, `int` within i64, `str`, `bytes` or a `tuple` of those)
/// as a `KeyValue`; anything else is a `TypeError`.
pub(crate) fn key_value_from_py(obj: &Bound<'_, PyAny>) -> PyResult<KeyValue> {
    if obj.is_none() {
        Ok(KeyValue::None)
    } else if let Ok(b) = obj.downcast::<PyBool>() {
        Ok(KeyValue::Bool(b.is_true()))
    } else if obj.is_instance_of::<PyInt>() {
        obj.extract::<i64>()
            .map(KeyValue::Int)
            .map_err(|_| int_overflow(format!("extra key int {obj} does not fit in 64 bits")))
    } else if let Ok(s) = obj.downcast::<PyString>() {
        Ok(KeyValue::Str(s.to_str()?.to_owned()))
    } else if let Ok(b) = obj.downcast::<PyBytes>() {
        Ok(KeyValue::Bytes(b.as_bytes().to_vec()))
    } else if let Ok(t) = obj.downcast::<PyTuple>() {
        t.iter()
            .map(|item| key_value_from_py(&item))
            .collect::<PyResult<_>>()
            .map(KeyValue::Tuple)
    } else {
        Err(invalid_type(format!(
            "an extra key must be None, bool, int, str, bytes or tuple, not {}",
            obj.get_type().name()?
        )))
    }
}

/// `repr` of a frozen record: `Name(field=repr(value), ...)`.
fn fields_repr(name: &str, fields: &[(&str, Bound<'_, PyAny>)]) -> PyResult<String> {
    let mut out = format!("{name}(");
    for (i, (field, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(field);
        out.push('=');
        out.push_str(value.repr()?.to_str()?);
    }
    out.push(')');
    Ok(out)
}

/// vLLM's `BlockStored` event (`vllm.distributed.kv_events.BlockStored`).
#[pyclass(name = "BlockStored", module = "kvblocks._core", frozen, eq, hash)]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PyBlockStored {
    #[pyo3(get)]
    block_hashes: Vec<u64>,
    #[pyo3(get)]
    parent_block_hash: Option<u64>,
    #[pyo3(get)]
    token_ids: Vec<u32>,
    #[pyo3(get)]
    block_size: u32,
    #[pyo3(get)]
    lora_id: Option<i64>,
    #[pyo3(get)]
    medium: Option<String>,
    #[pyo3(get)]
    lora_name: Option<String>,
    extra_keys: Option<Vec<EventExtraKeys>>,
    #[pyo3(get)]
    group_idx: Option<u32>,
    #[pyo3(get)]
    kv_cache_spec_kind: Option<String>,
    #[pyo3(get)]
    kv_cache_spec_sliding_window: Option<u32>,
    #[pyo3(get)]
    locality: Option<String>,
    #[pyo3(get)]
    ownership: Option<String>,
    #[pyo3(get)]
    session_id: Option<String>,
    #[pyo3(get)]
    lookahead_token_ids: Option<Vec<Vec<u32>>>,
}

#[pymethods]
impl PyBlockStored {
    #[new]
    #[pyo3(signature = (
        block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
        extra_keys=None, group_idx=None, kv_cache_spec_kind=None,
        kv_cache_spec_sliding_window=None, locality=None, ownership=None, session_id=None,
        lookahead_token_ids=None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
        block_size: u32,
        lora_id: Option<i64>,
        medium: Option<String>,
        lora_name: Option<String>,
        extra_keys: Option<Vec<Option<Bound<'_, PyTuple>>>>,
        group_idx: Option<u32>,
        kv_cache_spec_kind: Option<String>,
        kv_cache_spec_sliding_window: Option<u32>,
        locality: Option<String>,
        ownership: Option<String>,
        session_id: Option<String>,
        lookahead_token_ids: Option<Vec<Vec<u32>>>,
    ) -> PyResult<Self> {
        let extra_keys = extra_keys
            .map(|blocks| {
                blocks
                    .iter()
                    .map(|keys| {
                        keys.as_ref()
                            .map(|t| t.iter().map(|k| key_value_from_py(&k)).collect())
                            .transpose()
                    })
                    .collect::<PyResult<Vec<_>>>()
            })
            .transpose()?;
        Ok(Self {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_id,
            medium,
            lora_name,
            extra_keys,
            group_idx,
            kv_cache_spec_kind,
            kv_cache_spec_sliding_window,
            locality,
            ownership,
            session_id,
            lookahead_token_ids,
        })
    }

    /// One entry per stored block: a tuple of untagged extra keys, or `None`.
    #[getter]
    fn extra_keys<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<Vec<Option<Bound<'py, PyTuple>>>>> {
        self.extra_keys
            .as_ref()
            .map(|blocks| {
                blocks
                    .iter()
                    .map(|keys| keys.as_deref().map(|k| tuple_to_py(py, k)).transpose())
                    .collect()
            })
            .transpose()
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let fields = Self::FIELDS
            .iter()
            .map(|&f| Ok((f, slf.getattr(f)?)))
            .collect::<PyResult<Vec<_>>>()?;
        fields_repr("BlockStored", &fields)
    }

    /// Field names in vLLM's order (msgspec's `__struct_fields__`).
    #[classattr]
    fn __struct_fields__() -> Vec<&'static str> {
        Self::FIELDS.to_vec()
    }
}

impl PyBlockStored {
    const FIELDS: [&'static str; 15] = [
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
        "kv_cache_spec_sliding_window",
        "locality",
        "ownership",
        "session_id",
        "lookahead_token_ids",
    ];
}

/// vLLM's `BlockRemoved` event.
#[pyclass(name = "BlockRemoved", module = "kvblocks._core", frozen, eq, hash)]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PyBlockRemoved {
    #[pyo3(get)]
    block_hashes: Vec<u64>,
    #[pyo3(get)]
    medium: Option<String>,
    #[pyo3(get)]
    group_idx: Option<u32>,
    #[pyo3(get)]
    locality: Option<String>,
    #[pyo3(get)]
    ownership: Option<String>,
}

#[pymethods]
impl PyBlockRemoved {
    #[new]
    #[pyo3(signature = (block_hashes, medium, group_idx=None, locality=None, ownership=None))]
    fn new(
        block_hashes: Vec<u64>,
        medium: Option<String>,
        group_idx: Option<u32>,
        locality: Option<String>,
        ownership: Option<String>,
    ) -> Self {
        Self {
            block_hashes,
            medium,
            group_idx,
            locality,
            ownership,
        }
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let fields = Self::FIELDS
            .iter()
            .map(|&f| Ok((f, slf.getattr(f)?)))
            .collect::<PyResult<Vec<_>>>()?;
        fields_repr("BlockRemoved", &fields)
    }

    /// Field names in vLLM's order.
    #[classattr]
    fn __struct_fields__() -> Vec<&'static str> {
        Self::FIELDS.to_vec()
    }
}

impl PyBlockRemoved {
    const FIELDS: [&'static str; 5] = [
        "block_hashes",
        "medium",
        "group_idx",
        "locality",
        "ownership",
    ];
}

/// vLLM's `AllBlocksCleared` event (no fields).
#[pyclass(name = "AllBlocksCleared", module = "kvblocks._core", frozen, eq, hash)]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PyAllBlocksCleared {}

#[pymethods]
impl PyAllBlocksCleared {
    #[new]
    fn new() -> Self {
        Self {}
    }

    fn __repr__(&self) -> &'static str {
        "AllBlocksCleared()"
    }

    /// No fields.
    #[classattr]
    fn __struct_fields__() -> Vec<&'static str> {
        Vec::new()
    }
}

/// The Python event object for a core event. The one place events cross to Python.
pub(crate) fn event_to_py(py: Python<'_>, event: &KvCacheEvent) -> PyResult<PyObject> {
    Ok(match event {
        KvCacheEvent::BlockStored(e) => Bound::new(
            py,
            PyBlockStored {
                block_hashes: e.block_hashes.clone(),
                parent_block_hash: e.parent_block_hash,
                token_ids: e.token_ids.clone(),
                block_size: e.block_size,
                lora_id: e.lora_id,
                medium: Some(e.medium.to_owned()),
                lora_name: e.lora_name.clone(),
                extra_keys: e.extra_keys.clone(),
                group_idx: Some(e.group_idx),
                kv_cache_spec_kind: e.kv_cache_spec_kind.map(str::to_owned),
                kv_cache_spec_sliding_window: e.kv_cache_spec_sliding_window,
                locality: e.locality.clone(),
                ownership: e.ownership.clone(),
                session_id: e.session_id.clone(),
                lookahead_token_ids: e.lookahead_token_ids.clone(),
            },
        )?
        .into_any()
        .unbind(),
        KvCacheEvent::BlockRemoved(e) => Bound::new(
            py,
            PyBlockRemoved {
                block_hashes: e.block_hashes.clone(),
                medium: Some(e.medium.to_owned()),
                group_idx: Some(e.group_idx),
                locality: None,
                ownership: None,
            },
        )?
        .into_any()
        .unbind(),
        KvCacheEvent::AllBlocksCleared => {
            Bound::new(py, PyAllBlocksCleared {})?.into_any().unbind()
        }
    })
}

/// Core events as a Python list, in order.
pub(crate) fn events_to_py(py: Python<'_>, events: &[KvCacheEvent]) -> PyResult<Vec<PyObject>> {
    events.iter().map(|e| event_to_py(py, e)).collect()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBlockStored>()?;
    m.add_class::<PyBlockRemoved>()?;
    m.add_class::<PyAllBlocksCleared>()?;
    Ok(())
}
