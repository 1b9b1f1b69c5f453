//! Python bindings for `crate::ceilings`: `ceiling_block_keys` and `CeilingLog`, the
//! simulator's hit-rate ceilings (`kvblocks.sim.ceilings` wraps them).

use pyo3::prelude::*;

use super::hashing::extract_token_ids;
use crate::ceilings::{self, CeilingLog};

/// Keys cross as `i64` (Python ints of either sign); inside they are `u64` bit patterns.
fn to_u64(keys: Vec<i64>) -> Vec<u64> {
    keys.into_iter().map(|k| k as u64).collect()
}

/// One key per full block of `token_ids`; equal keys mean equal prefixes (and salts).
#[pyfunction]
#[pyo3(signature = (token_ids, block_size, salt=None))]
fn ceiling_block_keys(
    token_ids: &Bound<'_, PyAny>,
    block_size: usize,
    salt: Option<&str>,
) -> PyResult<Vec<i64>> {
    let tokens = extract_token_ids(token_ids)?;
    Ok(ceilings::block_keys(&tokens, block_size, salt)
        .into_iter()
        .map(|k| k as i64)
        .collect())
}

/// A run's stores and lookups, in order; the infinite cache's hits as it goes and
/// Belady's at the end.
#[pyclass(name = "CeilingLog", module = "kvblocks._core")]
struct PyCeilingLog {
    inner: CeilingLog,
}

#[pymethods]
impl PyCeilingLog {
    #[new]
    fn new() -> Self {
        Self {
            inner: CeilingLog::new(),
        }
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// Blocks that entered the cache, in block order (an empty store is not recorded).
    fn store(&mut self, keys: Vec<i64>) {
        self.inner.store(&to_u64(keys));
    }

    /// A lookup of `keys` (distinct, in block order); returns how many leading keys the
    /// infinite cache holds.
    fn lookup(&mut self, keys: Vec<i64>) -> usize {
        self.inner.lookup(&to_u64(keys))
    }

    /// Hit blocks of every lookup so far under Belady's rule with `capacity` blocks.
    fn belady(&self, py: Python<'_>, capacity: usize) -> Vec<u32> {
        py.allow_threads(|| self.inner.belady(capacity))
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(ceiling_block_keys, m)?)?;
    m.add_class::<PyCeilingLog>()?;
    Ok(())
}
