//! Maps `KvError` to Python exceptions. The match is exhaustive so that a new variant does
//! not compile until it is mapped.

use pyo3::exceptions::{PyKeyError, PyNotImplementedError, PyValueError};
use pyo3::PyErr;

use crate::error::KvError;

impl From<KvError> for PyErr {
    fn from(e: KvError) -> Self {
        let msg = e.to_string();
        match e {
            KvError::InvalidArgument(_)
            | KvError::OutOfBlocks { .. }
            | KvError::BlockOutOfRange { .. }
            | KvError::DoubleFree(_)
            | KvError::UnknownAlgorithm(_)
            | KvError::InvalidSpec(_) => PyValueError::new_err(msg),
            KvError::UnknownRequest(_) => PyKeyError::new_err(msg),
            KvError::Unsupported(_) => PyNotImplementedError::new_err(msg),
        }
    }
}
