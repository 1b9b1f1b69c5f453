//! Python bindings for the prefix-cache stats: `PrefixCacheStats`, a Python copy of the
//! core's [`PrefixCacheStats`] (conversion only; `record` is the core's).

use pyo3::prelude::*;

use crate::kv_cache_manager::PrefixCacheStats;

/// Declares the Python class with the core struct's fields, listed once here: the two
/// conversions name every field, so a field added to the core fails to compile until it
/// is added here too.
macro_rules! stats_class {
    ($($field:ident: $ty:ty),* $(,)?) => {
        /// vLLM 0.33's `PrefixCacheStats`: the core's stats as a mutable Python object
        /// (fields as attributes).
        #[pyclass(name = "PrefixCacheStats", module = "kvblocks._core", get_all, set_all)]
        #[derive(Debug, Clone, Copy, Default)]
        pub(crate) struct PyPrefixCacheStats {
            $($field: $ty),*
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

stats_class!(
    reset: bool,
    requests: u64,
    queries: u64,
    hits: u64,
    preempted_requests: u64,
    preempted_queries: u64,
    preempted_hits: u64,
);

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

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPrefixCacheStats>()?;
    Ok(())
}
