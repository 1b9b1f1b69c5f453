//! Block ids for `kvblocks.device`, read where they lie: in the `i64` staging buffer the
//! Python module keeps per `KVPages` (a CPU tensor, pinned on CUDA), addressed by its data
//! pointer. The rules are `crate::device_ids`; this file converts.
//!
//! The limited API has no buffer protocol before 3.11, so the staging tensor is named by
//! address and length. These functions are private (`_core._...`) and only
//! `kvblocks/device/_staging.py` calls them, always with a live tensor's pointer.

use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::device_ids::{check, disjoint, runs, IdError, IdRules};
use crate::python::errors::{block_index, invalid_argument, invalid_type};
use crate::python::ids::exact_int_list;

/// A read-only view of `count` `i64` at `address`.
///
/// # Safety
/// `address` must be the 8-byte aligned address of `count` initialized `i64` that stay
/// alive and unwritten while the slice is used (the caller's staging tensor).
unsafe fn ids_at<'a>(address: usize, count: usize) -> &'a [i64] {
    if count == 0 {
        return &[];
    }
    // SAFETY: guaranteed by this function's contract.
    unsafe { std::slice::from_raw_parts(address as *const i64, count) }
}

fn aligned(address: usize, what: &str) -> PyResult<()> {
    if address == 0 || !address.is_multiple_of(std::mem::align_of::<i64>()) {
        return Err(invalid_argument(format!(
            "{what}: staging address {address:#x} is not an aligned int64 buffer"
        )));
    }
    Ok(())
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

/// Writes the ints of `ids` (any iterable; a list or tuple is read in place) as `i64` to
/// `out` (room for `capacity`), checks them against the rules, and returns their count.
/// Nothing is kept when a check fails; the caller's pages are untouched either way.
#[pyfunction]
#[pyo3(name = "_stage_block_ids")]
#[allow(clippy::too_many_arguments)]
fn stage_block_ids(
    ids: &Bound<'_, PyAny>,
    out: usize,
    capacity: usize,
    limit: u64,
    unique: bool,
    forbid_null: bool,
    what: &str,
) -> PyResult<usize> {
    aligned(out, what)?;
    let mut values = Vec::with_capacity(ids.len().unwrap_or(0).min(capacity));
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
    if values.len() > capacity {
        return Err(invalid_argument(format!(
            "{what}: {} block ids do not fit the staging buffer of {capacity}",
            values.len()
        )));
    }
    check(
        &values,
        IdRules {
            limit,
            unique,
            forbid_null,
        },
    )
    .map_err(|e| id_error(what, e))?;
    if !values.is_empty() {
        // SAFETY: `out` is aligned (checked) and, by the caller's contract, the address of
        // a live int64 tensor with room for `capacity >= values.len()` values that nothing
        // else reads or writes during this call (the GIL is held throughout).
        unsafe {
            std::ptr::copy_nonoverlapping(values.as_ptr(), out as *mut i64, values.len());
        }
    }
    Ok(values.len())
}

/// Reads `count` ids of `itemsize` bytes (4: int32, 8: int64) at `source` (a live CPU
/// tensor's data), checks them against the rules, and writes them as `i64` to `out`.
#[pyfunction]
#[pyo3(name = "_stage_block_ids_from")]
#[allow(clippy::too_many_arguments)]
fn stage_block_ids_from(
    source: usize,
    count: usize,
    itemsize: usize,
    out: usize,
    limit: u64,
    unique: bool,
    forbid_null: bool,
    what: &str,
) -> PyResult<()> {
    aligned(out, what)?;
    if count == 0 {
        return Ok(());
    }
    if source == 0 || !source.is_multiple_of(itemsize.max(1)) {
        return Err(invalid_argument(format!(
            "{what}: ids at {source:#x} are not aligned int{}",
            itemsize * 8
        )));
    }
    let values: Vec<i64> = match itemsize {
        // SAFETY: aligned (checked); the caller passes a live int32 tensor of `count` values.
        4 => unsafe { std::slice::from_raw_parts(source as *const i32, count) }
            .iter()
            .map(|&v| i64::from(v))
            .collect(),
        // SAFETY: as above, an int64 tensor.
        8 => unsafe { ids_at(source, count) }.to_vec(),
        _ => {
            return Err(invalid_argument(format!(
                "{what}: ids of {itemsize} bytes: expected int32 or int64"
            )))
        }
    };
    check(
        &values,
        IdRules {
            limit,
            unique,
            forbid_null,
        },
    )
    .map_err(|e| id_error(what, e))?;
    // SAFETY: `out` is aligned (checked) and, by the caller's contract, a live int64 tensor
    // with room for `count` values; `values` is our own copy, so the two cannot overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(values.as_ptr(), out as *mut i64, count);
    }
    Ok(())
}

/// A run as Python sees it: position, length, first id, first id of the second column.
type RunRow = (usize, usize, i64, i64);

/// Runs of consecutive ids in the staged column at `first` (and at `second`, which must
/// advance with it) as `(position, length, first id, first id of second)` (the second
/// column's is the first's when there is none), `None` when there are more than `most`.
#[pyfunction]
#[pyo3(name = "_block_id_runs", signature = (first, second, count, most))]
fn block_id_runs(
    first: usize,
    second: Option<usize>,
    count: usize,
    most: usize,
) -> PyResult<Option<Vec<RunRow>>> {
    aligned(first, "runs")?;
    // SAFETY: aligned (checked); the caller passes a live int64 tensor of `count` values.
    let a = unsafe { ids_at(first, count) };
    let b = match second {
        Some(second) => {
            aligned(second, "runs")?;
            // SAFETY: as for `a`.
            unsafe { ids_at(second, count) }
        }
        None => a,
    };
    let found = if second.is_some() {
        runs(&[a, b], most)
    } else {
        runs(&[a], most)
    };
    Ok(run_rows(a, b, found))
}

/// For a copy of the `count` staged ids at `first` to those at `second`: whether the two
/// lists share no id and, if so, their runs as `_block_id_runs` gives them (else `None`).
#[pyfunction]
#[pyo3(name = "_block_id_pairs")]
fn block_id_pairs(
    first: usize,
    second: usize,
    count: usize,
    most: usize,
) -> PyResult<(bool, Option<Vec<RunRow>>)> {
    aligned(first, "pairs")?;
    aligned(second, "pairs")?;
    // SAFETY: aligned (checked); the caller passes live int64 tensors of `count` values.
    let (a, b) = unsafe { (ids_at(first, count), ids_at(second, count)) };
    if !disjoint(a, b) {
        return Ok((false, None));
    }
    Ok((true, run_rows(a, b, runs(&[a, b], most))))
}

fn run_rows(a: &[i64], b: &[i64], found: Option<Vec<(usize, usize)>>) -> Option<Vec<RunRow>> {
    found.map(|runs| {
        runs.into_iter()
            .map(|(pos, len)| (pos, len, a[pos], b[pos]))
            .collect()
    })
}

/// Adds the functions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(stage_block_ids, m)?)?;
    m.add_function(wrap_pyfunction!(stage_block_ids_from, m)?)?;
    m.add_function(wrap_pyfunction!(block_id_runs, m)?)?;
    m.add_function(wrap_pyfunction!(block_id_pairs, m)?)?;
    Ok(())
}
