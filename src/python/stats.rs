//! Python bindings for the prefix-cache stats: `PrefixCacheStats`, a Python copy of the
//! core's [`PrefixCacheStats`] (conversion only; `record` is the core's). Its fields come
//! from the core's one list (`with_prefix_cache_stats_fields`).

use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::stats::{with_prefix_cache_stats_fields, PrefixCacheStats, StatValue};

macro_rules! stats_class {
    ($($(#[doc = $doc:literal])* $field:ident: $ty:ty),* $(,)?) => {
        /// vLLM 0.33's `PrefixCacheStats`: the core's stats as a mutable Python object
        /// (fields as attributes).
        #[pyclass(name = "PrefixCacheStats", module = "kvblocks._core", get_all, set_all)]
        #[derive(Debug, Clone, Copy, Default)]
        pub(crate) struct PyPrefixCacheStats {
            $($(#[doc = $doc])* $field: $ty),*
        }

        impl From<PrefixCacheStats> for PyPrefixCacheStats {
            fn from(s: PrefixCacheStats) -> Self {
                Self { $($field: s.$field),* }
            }
        }

        impl From<PyPrefixCacheStats> for PrefixCacheStats {
            fn from(s: PyPrefixCacheStats) -> Self {
                Self { $($field: s.$field),* }
            }
        }
    };
}
with_prefix_cache_stats_fields!(stats_class);

/// A stats value as Python writes it (`True`, `12`).
fn py_literal(value: StatValue) -> String {
    match value {
        StatValue::Flag(true) => "True".into(),
        StatValue::Flag(false) => "False".into(),
        StatValue::Count(n) => n.to_string(),
    }
}

/// Sets each of `stats`' fields as an attribute of `target`.
pub(crate) fn set_stats_attributes(
    target: &Bound<'_, PyAny>,
    stats: &PrefixCacheStats,
) -> PyResult<()> {
    let py = target.py();
    for (name, value) in stats.fields() {
        let name = PyString::intern(py, name);
        match value {
            StatValue::Flag(v) => target.setattr(name, v)?,
            StatValue::Count(n) => target.setattr(name, n)?,
        }
    }
    Ok(())
}

#[pymethods]
impl PyPrefixCacheStats {
    #[new]
    fn py_new() -> Self {
        Self::default()
    }

    /// Adds one request's lookup (preempted requests count apart).
    fn record(&mut self, num_tokens: usize, num_hits: usize, preempted: bool) {
        let mut stats = PrefixCacheStats::from(*self);
        stats.record(num_tokens, num_hits, preempted);
        *self = stats.into();
    }

    fn __repr__(&self) -> String {
        let fields: Vec<String> = PrefixCacheStats::from(*self)
            .fields()
            .map(|(name, value)| format!("{name}={}", py_literal(value)))
            .collect();
        format!("PrefixCacheStats({})", fields.join(", "))
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPrefixCacheStats>()?;
    Ok(())
}
