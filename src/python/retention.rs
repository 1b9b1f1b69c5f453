//! `kvblocks.RetentionPolicy`: the Python form of the core's policy (conversion only;
//! the rules are in `pool/retention.rs`, documented in docs/retention.md).

use std::collections::BTreeMap;

use pyo3::prelude::*;
use pyo3::types::{PyFloat, PySequence};

use super::errors::invalid_argument;
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

/// A count or class given as a Python int: a negative one is bad input, not an overflow.
pub(crate) fn non_negative(name: &str, value: i64) -> PyResult<usize> {
    usize::try_from(value)
        .map_err(|_| invalid_argument(format!("{name} must be >= 0, got {value}")))
}

#[pymethods]
impl PyRetentionPolicy {
    #[new]
    #[pyo3(signature = (*, classes=1, default_class=0, priority_classes=None, ttl_s=None,
                        session_s=None, tenant_quotas=None, default_tenant_quota=None))]
    fn new(
        classes: i64,
        default_class: i64,
        priority_classes: Option<BTreeMap<i64, i64>>,
        ttl_s: Option<&Bound<'_, PyAny>>,
        session_s: Option<f64>,
        tenant_quotas: Option<BTreeMap<String, i64>>,
        default_tenant_quota: Option<i64>,
    ) -> PyResult<Self> {
        if classes < 1 {
            return Err(invalid_argument(format!(
                "classes must be at least 1, got {classes}"
            )));
        }
        let priority_classes = priority_classes
            .unwrap_or_default()
            .into_iter()
            .map(|(p, c)| Ok((p, non_negative("a class in priority_classes", c)?)))
            .collect::<PyResult<Vec<_>>>()?;
        let tenant_quotas = tenant_quotas
            .unwrap_or_default()
            .into_iter()
            .map(|(t, q)| Ok((t, non_negative("a tenant quota", q)?)))
            .collect::<PyResult<Vec<_>>>()?;
        let inner = RetentionPolicy {
            classes: non_negative("classes", classes)?,
            default_class: non_negative("default_class", default_class)?,
            priority_classes,
            ttl_s: ttl_of(ttl_s)?,
            session_s,
            tenant_quotas,
            default_tenant_quota: default_tenant_quota
                .map(|q| non_negative("default_tenant_quota", q))
                .transpose()?,
        };
        inner.validate()?;
        Ok(Self { inner })
    }

    #[getter]
    fn classes(&self) -> usize {
        self.inner.num_classes()
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
        let k = self.inner.num_classes();
        match self.inner.ttl_s.len() {
            0 => vec![None; k],
            1 => vec![self.inner.ttl_s[0]; k],
            _ => self.inner.ttl_s.clone(),
        }
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

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let fields = [
            "classes",
            "default_class",
            "priority_classes",
            "ttl_s",
            "session_s",
            "tenant_quotas",
            "default_tenant_quota",
        ];
        let parts = fields
            .iter()
            .map(|f| Ok(format!("{f}={}", slf.getattr(*f)?.repr()?)))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(format!("RetentionPolicy({})", parts.join(", ")))
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRetentionPolicy>()
}
