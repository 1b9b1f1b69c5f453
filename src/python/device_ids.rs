//! Block ids for `kvblocks.device`, read where they lie: in the `i64` staging ring the
//! Python module keeps per `KVPages` (a CPU tensor, pinned on CUDA), or in a caller's
//! int32/int64 CPU tensor. The rules are `crate::device_ids`; this file converts.
//!
//! The limited API has no buffer protocol before 3.11, so memory is found through the
//! tensor's own `data_ptr()`, `numel()`, `element_size()`, `is_cpu` and `is_contiguous()`,
//! and every access is checked against them: a wrong argument raises, it never reads or
//! writes outside the tensor. The ring (`_core._IdRing`, private) checks its tensor once
//! and, on each call, that its memory has not moved; only `kvblocks/device/_staging.py`
//! uses it.

use pyo3::exceptions::PyOverflowError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::device_ids::{check, disjoint, runs, IdError, IdRules};
use crate::python::errors::{block_index, invalid_argument, invalid_type};
use crate::python::ids::exact_int_list;

/// Items `start..start + count` of a contiguous CPU tensor: their address and item size.
struct Items {
    address: usize,
    itemsize: usize,
    count: usize,
}

impl Items {
    /// The items of `tensor` (a torch tensor) from `start`, checked: on the CPU,
    /// contiguous, items of 4 or 8 bytes, and `start + count` within it.
    fn of(tensor: &Bound<'_, PyAny>, start: usize, count: usize, what: &str) -> PyResult<Self> {
        let py = tensor.py();
        let bad = |why: &str| invalid_argument(format!("{what}: {why}"));
        let is_cpu: bool = tensor.getattr(intern!(py, "is_cpu"))?.extract()?;
        let contiguous: bool = tensor
            .call_method0(intern!(py, "is_contiguous"))?
            .extract()?;
        if !is_cpu || !contiguous {
            return Err(bad("ids must be in a contiguous CPU tensor"));
        }
        let itemsize: usize = tensor
            .call_method0(intern!(py, "element_size"))?
            .extract()?;
        let len: usize = tensor.call_method0(intern!(py, "numel"))?.extract()?;
        let address: usize = tensor.call_method0(intern!(py, "data_ptr"))?.extract()?;
        if !matches!(itemsize, 4 | 8) || start.checked_add(count).is_none_or(|end| end > len) {
            return Err(bad(
                "ids outside their tensor, or not 4- or 8-byte integers",
            ));
        }
        if count > 0 && (address == 0 || !address.is_multiple_of(itemsize)) {
            return Err(bad("ids not aligned in their tensor"));
        }
        Ok(Items {
            address: address + start * itemsize,
            itemsize,
            count,
        })
    }

    /// The items as `i64` (8-byte items only).
    fn as_i64(&self, what: &str) -> PyResult<&[i64]> {
        if self.itemsize != 8 {
            return Err(invalid_argument(format!("{what}: expected int64 ids")));
        }
        if self.count == 0 {
            return Ok(&[]);
        }
        // SAFETY: `of` checked that the tensor is a contiguous CPU tensor whose items
        // `start..start + count` exist, are 8 bytes and aligned; the caller holds the tensor
        // (and the GIL) for this call, and nothing writes it meanwhile.
        Ok(unsafe { std::slice::from_raw_parts(self.address as *const i64, self.count) })
    }

    /// The items as `i64` values, widened from int32 where they are 4 bytes.
    fn to_i64(&self, what: &str) -> PyResult<Vec<i64>> {
        if self.itemsize == 8 {
            return Ok(self.as_i64(what)?.to_vec());
        }
        if self.count == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: as in `as_i64`, for 4-byte items.
        let items = unsafe { std::slice::from_raw_parts(self.address as *const i32, self.count) };
        Ok(items.iter().map(|&v| i64::from(v)).collect())
    }

    /// Writes `values` over the items (8-byte items, exactly `values.len()` of them).
    fn write(&self, values: &[i64], what: &str) -> PyResult<()> {
        if self.itemsize != 8 || values.len() != self.count {
            return Err(invalid_argument(format!(
                "{what}: staging slots do not fit the ids"
            )));
        }
        if !values.is_empty() {
            // SAFETY: `of` checked the slots (contiguous CPU memory, in bounds, aligned
            // 8-byte items, `count == values.len()` of them); `values` is our own vector,
            // so the two do not overlap; the GIL is held throughout.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    values.as_ptr(),
                    self.address as *mut i64,
                    values.len(),
                );
            }
        }
        Ok(())
    }
}

fn id_error(what: &str, e: IdError) -> PyErr {
    match e {
        IdError::OutOfRange { .. } => block_index(format!("{what}: {e}")),
        IdError::Duplicate(_) | IdError::NullBlock => invalid_argument(format!("{what}: {e}")),
    }
}

/// One id of a list, as `i64`.
fn id_of(item: &Bound<'_, PyAny>, what: &str) -> PyResult<i64> {
    match item.extract::<i64>() {
        Ok(v) => Ok(v),
        Err(e) if e.is_instance_of::<PyOverflowError>(item.py()) => Err(block_index(format!(
            "{what}: block id out of the int64 range"
        ))),
        Err(_) if item.is_instance_of::<PyList>() || item.is_instance_of::<PyTuple>() => {
            Err(invalid_argument(format!(
                "{what}: block ids must be 1-D, got a nested sequence"
            )))
        }
        Err(_) => Err(invalid_type(format!(
            "{what}: block ids must be integers, got {}",
            item.get_type().name()?
        ))),
    }
}

/// The ints of `ids` (any iterable; a list or tuple is read in place) as `i64`.
fn ids_of(ids: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<i64>> {
    let mut values = Vec::with_capacity(ids.len().unwrap_or(0));
    let exact = ids.downcast_exact::<PyList>().ok().and_then(exact_int_list);
    if let Some(exact) = exact {
        values.extend(exact.into_iter().map(i64::from));
    } else if let Ok(list) = ids.downcast::<PyList>() {
        for item in list.iter() {
            values.push(id_of(&item, what)?);
        }
    } else if let Ok(tuple) = ids.downcast::<PyTuple>() {
        for item in tuple.iter() {
            values.push(id_of(&item, what)?);
        }
    } else {
        for item in ids.try_iter()? {
            values.push(id_of(&item?, what)?);
        }
    }
    Ok(values)
}

fn rules(limit: u64, unique: bool, forbid_null: bool) -> IdRules {
    IdRules {
        limit,
        unique,
        forbid_null,
    }
}

/// A staging ring: an int64 CPU tensor, checked once when wrapped (contiguous, on the
/// CPU, 8-byte items) and held, whose slots the methods read and write within its length.
/// Each call checks that the tensor still has the memory it had (its `data_ptr()`).
#[pyclass(name = "_IdRing", module = "kvblocks._core", frozen)]
pub(crate) struct IdRing {
    tensor: Py<PyAny>,
    address: usize,
    len: usize,
}

impl IdRing {
    /// Slots `start..start + count`, checked against the ring's length and memory.
    fn slots(&self, py: Python<'_>, start: usize, count: usize, what: &str) -> PyResult<Items> {
        let address: usize = self
            .tensor
            .bind(py)
            .call_method0(intern!(py, "data_ptr"))?
            .extract()?;
        if address != self.address || start.checked_add(count).is_none_or(|end| end > self.len) {
            return Err(invalid_argument(format!(
                "{what}: slots {start}..{start}+{count} outside the staging ring"
            )));
        }
        Ok(Items {
            address: address + start * 8,
            itemsize: 8,
            count,
        })
    }

    /// Checks `values` and writes them to slots `start..`.
    fn write_checked(
        &self,
        py: Python<'_>,
        values: &[i64],
        start: usize,
        rules: IdRules,
        what: &str,
    ) -> PyResult<()> {
        let slots = self.slots(py, start, values.len(), what)?;
        check(values, rules).map_err(|e| id_error(what, e))?;
        slots.write(values, what)
    }
}

#[pymethods]
impl IdRing {
    /// Wraps `tensor` (a contiguous int64 CPU tensor, kept alive by the ring).
    #[new]
    fn new(tensor: &Bound<'_, PyAny>) -> PyResult<Self> {
        let len: usize = tensor
            .call_method0(intern!(tensor.py(), "numel"))?
            .extract()?;
        let items = Items::of(tensor, 0, len, "staging ring")?;
        if items.itemsize != 8 {
            return Err(invalid_argument("staging ring: expected an int64 tensor"));
        }
        Ok(IdRing {
            tensor: tensor.clone().unbind(),
            address: items.address,
            len,
        })
    }

    /// Writes the ids to slots `start..` after checking them against the rules, and
    /// returns their count; nothing is written when a check fails. `ids` is a list, tuple
    /// or other iterable of ints, or a contiguous int32/int64 CPU tensor (read in place).
    #[allow(clippy::too_many_arguments)]
    fn stage(
        &self,
        py: Python<'_>,
        ids: &Bound<'_, PyAny>,
        start: usize,
        limit: u64,
        unique: bool,
        forbid_null: bool,
        what: &str,
    ) -> PyResult<usize> {
        let values = if ids.is_instance_of::<PyList>() || !ids.hasattr(intern!(py, "data_ptr"))? {
            ids_of(ids, what)?
        } else {
            let count: usize = ids.call_method0(intern!(py, "numel"))?.extract()?;
            Items::of(ids, 0, count, what)?.to_i64(what)?
        };
        self.write_checked(py, &values, start, rules(limit, unique, forbid_null), what)?;
        Ok(values.len())
    }

    /// Runs of consecutive ids in the `count` slots from `first` (and from `second`, which
    /// must advance with them) as `(position, length, first id, first id of second)` (the
    /// second column's is the first's when there is none), `None` when more than `most`.
    #[pyo3(signature = (first, second, count, most))]
    fn runs(
        &self,
        py: Python<'_>,
        first: usize,
        second: Option<usize>,
        count: usize,
        most: usize,
    ) -> PyResult<Option<Vec<RunRow>>> {
        let a_slots = self.slots(py, first, count, "runs")?;
        let a = a_slots.as_i64("runs")?;
        let Some(second) = second else {
            return Ok(run_rows(a, a, runs(&[a], most)));
        };
        let b_slots = self.slots(py, second, count, "runs")?;
        let b = b_slots.as_i64("runs")?;
        Ok(run_rows(a, b, runs(&[a, b], most)))
    }

    /// For a copy from the `count` slots at `first` to those at `second`: whether the two
    /// lists share no id and, if so, their runs as `runs` gives them.
    fn pairs(
        &self,
        py: Python<'_>,
        first: usize,
        second: usize,
        count: usize,
        most: usize,
    ) -> PyResult<(bool, Option<Vec<RunRow>>)> {
        let (a_slots, b_slots) = (
            self.slots(py, first, count, "pairs")?,
            self.slots(py, second, count, "pairs")?,
        );
        let (a, b) = (a_slots.as_i64("pairs")?, b_slots.as_i64("pairs")?);
        if !disjoint(a, b) {
            return Ok((false, None));
        }
        Ok((true, run_rows(a, b, runs(&[a, b], most))))
    }
}

/// A run as Python sees it: position, length, first id, first id of the second column.
type RunRow = (usize, usize, i64, i64);

fn run_rows(a: &[i64], b: &[i64], found: Option<Vec<(usize, usize)>>) -> Option<Vec<RunRow>> {
    found.map(|runs| {
        runs.into_iter()
            .map(|(pos, len)| (pos, len, a[pos], b[pos]))
            .collect()
    })
}

/// Adds the class to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<IdRing>()
}
