//! `kvblocks.RetentionPolicy`: the Python form of the core's policy (conversion only;
//! the rules are in `pool/retention.rs`, documented in docs/retention.md).

use std::collections::BTreeMap;

use pyo3::prelude::*;
use pyo3::types::{PyFloat, PySequence, PyTuple};

use super::errors::invalid_argument;
use super::non_negative::NonNegativeInt;
use crate::pool::RetentionPolicy;

/// A retention policy for the prefix cache (docs/retention.md); frozen.
#[pyclass(name = "RetentionPolicy", module = "kvblocks._core", frozen, eq)]
#[derive(Clone, PartialEq)]
pub(crate) struct PyRetentionPolicy {
    pub(crate) inner: RetentionPolicy,
}

/// `ttl_s` as given: `None`, one number, or a sequence of numbers or `None`.
fn ttl_of(ttl_s: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<Option<f64>>> {
    let Some(t) = ttl_s.filter(|t| !t.is_none()) else {
        return Ok(Vec::new());
    };
    if t.is_instance_of::<PyFloat>() || t.extract::<i64>().is_ok() {
        return Ok(vec![Some(t.extract::<f64>()?)]);
    }
    let seq = t.downcast::<PySequence>().map_err(|_| {
        invalid_argument("ttl_s must be a number, a sequence of numbers or None, or None")
    })?;
    let ttl: Vec<Option<f64>> = seq.extract()?;
    if ttl.is_empty() {
        return Err(invalid_argument("ttl_s must not be an empty sequence"));
    }
    Ok(ttl)
}

#[pymethods]
impl PyRetentionPolicy {
    #[new]
    #[pyo3(signature = (*, classes=NonNegativeInt(1), default_class=NonNegativeInt(0),
                        priority_classes=None, ttl_s=None, session_s=None, tenant_quotas=None,
                        default_tenant_quota=None))]
    #[pyo3(
        text_signature = "(*, classes=1, default_class=0, priority_classes=None, \
                             ttl_s=None, session_s=None, tenant_quotas=None, \
                             default_tenant_quota=None)"
    )]
    fn new(
        classes: NonNegativeInt,
        default_class: NonNegativeInt,
        priority_classes: Option<BTreeMap<i64, NonNegativeInt>>,
        ttl_s: Option<&Bound<'_, PyAny>>,
        session_s: Option<f64>,
        tenant_quotas: Option<BTreeMap<String, NonNegativeInt>>,
        default_tenant_quota: Option<NonNegativeInt>,
    ) -> PyResult<Self> {
        let inner = RetentionPolicy {
            classes: classes.0,
            default_class: default_class.0,
            priority_classes: priority_classes
                .unwrap_or_default()
                .into_iter()
                .map(|(p, c)| (p, c.0))
                .collect(),
            ttl_s: ttl_of(ttl_s)?,
            session_s,
            tenant_quotas: tenant_quotas
                .unwrap_or_default()
                .into_iter()
                .map(|(t, q)| (t, q.0))
                .collect(),
            default_tenant_quota: default_tenant_quota.map(|q| q.0),
        };
        inner.validate()?;
        Ok(Self { inner })
    }

    #[getter]
    fn classes(&self) -> usize {
        self.inner.classes
    }

    #[getter]
    fn default_class(&self) -> usize {
        self.inner.default_class
    }

    #[getter]
    fn priority_classes(&self) -> BTreeMap<i64, usize> {
        self.inner.priority_classes.iter().copied().collect()
    }

    /// One TTL per class (`None`: none).
    #[getter]
    fn ttl_s(&self) -> Vec<Option<f64>> {
        (0..self.inner.classes).map(|c| self.inner.ttl(c)).collect()
    }

    #[getter]
    fn session_s(&self) -> Option<f64> {
        self.inner.session_s
    }

    #[getter]
    fn tenant_quotas(&self) -> BTreeMap<String, usize> {
        self.inner.tenant_quotas.iter().cloned().collect()
    }

    #[getter]
    fn default_tenant_quota(&self) -> Option<usize> {
        self.inner.default_tenant_quota
    }

    /// The fields' names, in order (the core's `RetentionPolicy::FIELDS`): the
    /// constructor's keywords and the attributes.
    #[classattr]
    #[pyo3(name = "FIELDS")]
    fn fields(py: Python<'_>) -> PyResult<Py<PyTuple>> {
        PyTuple::new(py, RetentionPolicy::FIELDS).map(Bound::unbind)
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let parts = RetentionPolicy::FIELDS
            .iter()
            .map(|f| Ok(format!("{f}={}", slf.getattr(*f)?.repr()?)))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(format!("RetentionPolicy({})", parts.join(", ")))
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRetentionPolicy>()
}
