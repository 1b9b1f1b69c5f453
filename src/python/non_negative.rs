//! [`NonNegativeInt`]: an integer argument that must be `>= 0`.

use pyo3::prelude::*;

use crate::python::errors::invalid_argument;

/// An integer argument that must be `>= 0`, as a `usize`: a negative one raises
/// `InvalidArgumentError` (a `ValueError`) rather than PyO3's `OverflowError`.
pub(crate) struct NonNegativeInt(pub(crate) usize);

impl<'py> FromPyObject<'py> for NonNegativeInt {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        match ob.extract::<usize>() {
            Ok(v) => Ok(NonNegativeInt(v)),
            Err(e) => match ob.extract::<i64>() {
                Ok(v) if v < 0 => Err(invalid_argument(format!(
                    "expected a non-negative integer, got {v}"
                ))),
                _ => Err(e),
            },
        }
    }
}
