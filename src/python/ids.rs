//! Block ids out to Python as `list[int]` without creating an int object per id per call.
//!
//! Ids above 256 are not in CPython's small-int cache, so building a list of fresh ints
//! costs an allocation and a free per id, which is half the cost of a pool round trip.
//! Each id's int object is made once, on first use, and shared by every later list: a
//! list then costs one reference-count increment per id.

use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList};

/// Lazily filled table of the int object of each block id.
#[derive(Default)]
pub(crate) struct IdObjects {
    objects: Vec<Option<Py<PyInt>>>,
}

impl IdObjects {
    /// The Python list `[int(id) for id in ids]`, sharing cached int objects.
    pub(crate) fn list<'py>(
        &mut self,
        py: Python<'py>,
        ids: &[u32],
    ) -> PyResult<Bound<'py, PyList>> {
        if let Some(&max) = ids.iter().max() {
            if self.objects.len() <= max as usize {
                self.objects.resize_with(max as usize + 1, || None);
            }
        }
        let objects = &mut self.objects;
        PyList::new(
            py,
            ids.iter().map(|&id| {
                objects[id as usize]
                    .get_or_insert_with(|| PyInt::new(py, id).unbind())
                    .bind(py)
                    .clone()
            }),
        )
    }
}
