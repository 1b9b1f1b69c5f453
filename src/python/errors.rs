//! Maps `KvError` to Python exceptions: one tree under `kvblocks.KVBlocksError`, one class
//! per variant. Each class also derives from the builtin type kvblocks raised before the
//! tree existed (and vLLM raises in the same case), so `except ValueError` keeps working.
//! The match in [`class_of`] is exhaustive so that a new variant does not compile until it
//! is mapped.
//!
//! Four more classes have no `KvError` variant: the binding layer (and `kvblocks.device`)
//! raises them for input it checks itself before the core sees it: a wrong type
//! (`InvalidTypeError`, a `TypeError`), an int too large for its type
//! (`IntOverflowError`, an `OverflowError`), a block id outside the device pages
//! (`BlockIndexError`, an `IndexError`) and an unknown layer name (`UnknownLayerError`,
//! a `KeyError`). PyO3's own argument conversion still raises the plain builtins.
//!
//! PyO3's `create_exception!` takes one base, so the subclasses are made with Python's
//! `type(name, (KVBlocksError, builtin), namespace)` on first use and kept for the
//! process.

use pyo3::exceptions::{
    PyException, PyIndexError, PyKeyError, PyNotImplementedError, PyOverflowError, PyTypeError,
    PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyDict, PyTuple, PyType};
use pyo3::PyErr;

use crate::error::KvError;

pyo3::create_exception!(
    kvblocks._core,
    KVBlocksError,
    PyException,
    "The base class of every error kvblocks raises for bad input or a broken invariant. \
     Each subclass also derives from the builtin exception raised in that case before \
     (ValueError, KeyError, NotImplementedError, TypeError, OverflowError or IndexError), \
     as vLLM does."
);

/// The builtin base of a subclass.
#[derive(Clone, Copy)]
enum Builtin {
    Value,
    Key,
    NotImplemented,
    Type,
    Overflow,
    Index,
}

/// One subclass of `KVBlocksError`: its name, builtin base and docstring.
struct Class {
    name: &'static str,
    builtin: Builtin,
    doc: &'static str,
}

/// The subclasses: one per `KvError` variant, indexed by [`class_of`], then the binding
/// layer's own ([`INVALID_TYPE`], [`INT_OVERFLOW`], [`BLOCK_INDEX`], and one that only Python
/// raises), then the router's variants (appended, so the indices above stay).
const CLASSES: [Class; 16] = [
    Class {
        name: "InvalidArgumentError",
        builtin: Builtin::Value,
        doc: "An argument is out of its domain (negative count, zero tokens, bad size, ...).",
    },
    Class {
        name: "OutOfBlocksError",
        builtin: Builtin::Value,
        doc: "A block pool was asked for more blocks than are free.",
    },
    Class {
        name: "BlockOutOfRangeError",
        builtin: Builtin::Value,
        doc: "A block id outside 0..num_blocks.",
    },
    Class {
        name: "DoubleFreeError",
        builtin: Builtin::Value,
        doc: "Freeing a block whose ref count is already 0.",
    },
    Class {
        name: "UnknownAlgorithmError",
        builtin: Builtin::Value,
        doc: "A hash algorithm name kvblocks does not know.",
    },
    Class {
        name: "UnknownRequestError",
        builtin: Builtin::Key,
        doc: "A request id the manager does not know, where the call needs one.",
    },
    Class {
        name: "InvalidSpecError",
        builtin: Builtin::Value,
        doc: "A KV cache spec or config that cannot be built or merged.",
    },
    Class {
        name: "UnsupportedError",
        builtin: Builtin::NotImplemented,
        doc: "A feature of vLLM 0.33 that kvblocks does not implement.",
    },
    Class {
        name: "NotPinnedError",
        builtin: Builtin::Key,
        doc: "Unpinning a prefix that is not pinned.",
    },
    Class {
        name: "InvalidTypeError",
        builtin: Builtin::Type,
        doc: "An argument of the wrong type, found by kvblocks' own checks.",
    },
    Class {
        name: "IntOverflowError",
        builtin: Builtin::Overflow,
        doc: "An int too large for the type kvblocks keeps it in (u32 block ids, 64-bit \
              token ids and extra keys, int32 block tables).",
    },
    Class {
        name: "BlockIndexError",
        builtin: Builtin::Index,
        doc: "A block id outside the pages of kvblocks.device.",
    },
    Class {
        name: "UnknownLayerError",
        builtin: Builtin::Key,
        doc: "A layer name the KV cache pages do not hold (kvblocks.device).",
    },
    Class {
        name: "InvalidEventError",
        builtin: Builtin::Value,
        doc: "A KV event payload that cannot be decoded or applied (truncated, garbled, \
              oversized, or naming a group or block size the engine was not registered \
              with); the router index is unchanged.",
    },
    Class {
        name: "UnknownEngineError",
        builtin: Builtin::Key,
        doc: "An engine id the router index does not know.",
    },
    Class {
        name: "HashMismatchError",
        builtin: Builtin::Value,
        doc: "An engine's events hash blocks otherwise than its registration says (another \
              PYTHONHASHSEED, hash algorithm or block size); the engine is marked \
              mismatched.",
    },
];

/// The index in [`CLASSES`] of `InvalidTypeError`.
const INVALID_TYPE: usize = 9;
/// The index in [`CLASSES`] of `IntOverflowError`.
const INT_OVERFLOW: usize = 10;
/// The index in [`CLASSES`] of `BlockIndexError`.
const BLOCK_INDEX: usize = 11;

/// The index in [`CLASSES`] of the error's class.
fn class_of(e: &KvError) -> usize {
    match e {
        KvError::InvalidArgument(_) => 0,
        KvError::OutOfBlocks { .. } => 1,
        KvError::BlockOutOfRange { .. } => 2,
        KvError::DoubleFree(_) => 3,
        KvError::UnknownAlgorithm(_) => 4,
        KvError::UnknownRequest(_) => 5,
        KvError::InvalidSpec(_) => 6,
        KvError::Unsupported(_) => 7,
        KvError::NotPinned(_) => 8,
        KvError::InvalidEvent(_) => 13,
        KvError::UnknownEngine(_) => 14,
        KvError::HashMismatch(_) => 15,
    }
}

static TYPES: GILOnceCell<Vec<Py<PyType>>> = GILOnceCell::new();

/// The subclasses, made on first use.
fn types(py: Python<'_>) -> PyResult<&[Py<PyType>]> {
    TYPES
        .get_or_try_init(py, || {
            let base = py.get_type::<KVBlocksError>();
            let make_type = py.get_type::<PyType>();
            CLASSES
                .iter()
                .map(|c| {
                    let builtin = match c.builtin {
                        Builtin::Value => py.get_type::<PyValueError>(),
                        Builtin::Key => py.get_type::<PyKeyError>(),
                        Builtin::NotImplemented => py.get_type::<PyNotImplementedError>(),
                        Builtin::Type => py.get_type::<PyTypeError>(),
                        Builtin::Overflow => py.get_type::<PyOverflowError>(),
                        Builtin::Index => py.get_type::<PyIndexError>(),
                    };
                    let bases = PyTuple::new(py, [&base, &builtin])?;
                    let namespace = PyDict::new(py);
                    namespace.set_item("__module__", "kvblocks._core")?;
                    namespace.set_item("__doc__", c.doc)?;
                    let class = make_type.call1((c.name, bases, namespace))?;
                    Ok(class.downcast_into::<PyType>()?.unbind())
                })
                .collect()
        })
        .map(Vec::as_slice)
}

/// An exception of the class at `index` in [`CLASSES`].
fn error_of_class(index: usize, msg: String) -> PyErr {
    Python::with_gil(|py| match types(py) {
        Ok(types) => PyErr::from_type(types[index].bind(py).clone(), msg),
        Err(err) => err,
    })
}

impl From<KvError> for PyErr {
    fn from(e: KvError) -> Self {
        error_of_class(class_of(&e), e.to_string())
    }
}

/// Adds `KVBlocksError` and its subclasses to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("KVBlocksError", py.get_type::<KVBlocksError>())?;
    for (class, ty) in CLASSES.iter().zip(types(py)?) {
        m.add(class.name, ty.bind(py))?;
    }
    Ok(())
}

/// `KvError::InvalidArgument(msg)` as a Python exception, for the bad input the binding
/// layer itself finds (lengths that differ, a negative count, an unknown format name).
pub(crate) fn invalid_argument(msg: impl Into<String>) -> PyErr {
    KvError::InvalidArgument(msg.into()).into()
}

/// `InvalidTypeError(msg)`: an argument of the wrong type that the binding layer found.
pub(crate) fn invalid_type(msg: impl Into<String>) -> PyErr {
    error_of_class(INVALID_TYPE, msg.into())
}

/// `IntOverflowError(msg)`: an int too large for the type the binding layer converts to.
pub(crate) fn int_overflow(msg: impl Into<String>) -> PyErr {
    error_of_class(INT_OVERFLOW, msg.into())
}

/// `BlockIndexError(msg)`: a block id outside the device pages (`kvblocks.device`'s ids).
pub(crate) fn block_index(msg: impl Into<String>) -> PyErr {
    error_of_class(BLOCK_INDEX, msg.into())
}
