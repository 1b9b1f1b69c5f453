//! Lists of `u32` across the boundary: block, token and group ids in (one pass over a
//! list, no Python object per item), block ids out as `list[int]` (shared int objects).
//!
//! Ids above 256 are not in CPython's small-int cache, so building a list of fresh ints
//! costs an allocation and a free per id, which is half the cost of a pool round trip.
//! Each id's int object is made once, on first use, and shared by every later list: a
//! list then costs one reference-count increment per id.

use crate::python::errors::int_overflow;
use pyo3::exceptions::PyOverflowError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList, PyTuple};

/// Extracts a sequence of ints in `u32` range; `what` names them in the overflow error
/// ("token ids"). A `list` of exact ints takes the fast path; anything else goes through
/// PyO3's conversion, which raises `TypeError` for non-ints.
pub(crate) fn extract_u32s(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u32>> {
    if let Ok(list) = obj.downcast_exact::<PyList>() {
        if let Some(values) = exact_int_list(list) {
            return Ok(values);
        }
    }
    obj.extract::<Vec<u32>>()
        .map_err(|e| u32_error(obj.py(), e, what))
}

/// Extracts one int in `u32` range.
pub(crate) fn extract_u32(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u32> {
    obj.extract::<u32>()
        .map_err(|e| u32_error(obj.py(), e, what))
}

fn u32_error(py: Python<'_>, e: PyErr, what: &str) -> PyErr {
    if e.is_instance_of::<PyOverflowError>(py) {
        int_overflow(format!("{what} must be ints in 0..=4294967295 (u32)"))
    } else {
        e
    }
}

/// The values of a list of exact `int`s within `u32`, read with no new reference per item;
/// `None` as soon as an item is anything else (the caller then takes the generic path,
/// which raises the right error).
pub(crate) fn exact_int_list(list: &Bound<'_, PyList>) -> Option<Vec<u32>> {
    let n = list.len();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: `list` is a live list object and `i < n`, its length; nothing in this
        // loop runs Python code (exact ints convert without `__index__`) and the module is
        // built for the limited API, which has a GIL, so no other thread runs either: the
        // list cannot change and the borrowed item stays alive while it is read. (A
        // free-threaded build would need `PyList_GetItemRef` here.)
        let v = unsafe {
            let item = ffi::PyList_GetItem(list.as_ptr(), i as ffi::Py_ssize_t);
            if item.is_null() || ffi::PyLong_CheckExact(item) == 0 {
                None
            } else {
                Some(ffi::PyLong_AsSsize_t(item))
            }
        };
        match v {
            Some(v) if (0..=u32::MAX as ffi::Py_ssize_t).contains(&v) => out.push(v as u32),
            _ => {
                // A failed read or conversion may have set an exception: drop it, the
                // generic path raises its own.
                let _ = PyErr::take(list.py());
                return None;
            }
        }
    }
    Some(out)
}

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
        PyList::new(py, self.objects(py, ids))
    }

    /// The Python tuple `tuple(int(id) for id in ids)`, sharing cached int objects.
    pub(crate) fn tuple<'py>(
        &mut self,
        py: Python<'py>,
        ids: &[u32],
    ) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.objects(py, ids))
    }

    /// The int object of each id, made on first use.
    fn objects<'a, 'py>(
        &'a mut self,
        py: Python<'py>,
        ids: &'a [u32],
    ) -> impl ExactSizeIterator<Item = Bound<'py, PyInt>> + 'a
    where
        'py: 'a,
    {
        if let Some(&max) = ids.iter().max() {
            if self.objects.len() <= max as usize {
                self.objects.resize_with(max as usize + 1, || None);
            }
        }
        let objects = &mut self.objects;
        ids.iter().map(move |&id| {
            objects[id as usize]
                .get_or_insert_with(|| PyInt::new(py, id).unbind())
                .bind(py)
                .clone()
        })
    }
}
