//! Python bindings for the `hashing` module: `hash_block_tokens`, `none_hash`,
//! `external_block_hashes`, `BlockHasher`.

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyTuple};

use super::events::key_value_from_py;
use super::ids::extract_u32s;
use super::non_negative::NonNegativeInt;
use crate::hashing::{self, BlockHasher, HashAlgo};
use crate::types::BlockHash;

/// Extracts token ids (a sequence of ints in u32 range) with a clear overflow message.
pub(crate) fn extract_token_ids(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    extract_u32s(obj, "token ids")
}

/// Parses a vLLM hash algorithm name.
pub(crate) fn parse_algo(algo: &str) -> PyResult<HashAlgo> {
    Ok(algo.parse::<HashAlgo>()?)
}

/// Hashes one full block chained to its parent, as vLLM's `hash_block_tokens`.
#[pyfunction]
#[pyo3(signature = (algo, parent_block_hash, token_ids, extra_keys=None))]
fn hash_block_tokens<'py>(
    py: Python<'py>,
    algo: &str,
    parent_block_hash: Option<&[u8]>,
    token_ids: &Bound<'py, PyAny>,
    extra_keys: Option<&Bound<'py, PyTuple>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let algo = parse_algo(algo)?;
    let token_ids = extract_token_ids(token_ids)?;
    let parent = parent_block_hash.map(BlockHash::from_slice).transpose()?;
    let keys = extra_keys
        .map(|t| {
            t.iter()
                .map(|x| key_value_from_py(&x))
                .collect::<PyResult<Vec<_>>>()
        })
        .transpose()?;
    let h = hashing::hash_block_tokens(algo, parent.as_ref(), &token_ids, keys.as_deref());
    Ok(PyBytes::new(py, h.as_bytes()))
}

/// vLLM's NONE_HASH for `algo` in this process (honours PYTHONHASHSEED).
#[pyfunction]
fn none_hash<'py>(py: Python<'py>, algo: &str) -> PyResult<Bound<'py, PyBytes>> {
    let h = hashing::none_hash(parse_algo(algo)?);
    Ok(PyBytes::new(py, h.as_bytes()))
}

/// Block hashes as KV cache events publish them (`BlockHash::external`): what a router
/// that indexes the events looks a request's `block_hashes` up by.
#[pyfunction]
fn external_block_hashes(block_hashes: Vec<PyBackedBytes>) -> PyResult<Vec<u64>> {
    block_hashes
        .iter()
        .map(|h| Ok(BlockHash::from_slice(h)?.external()))
        .collect()
}

/// The block size and algorithm a `Request` hashes its full blocks with.
#[pyclass(name = "BlockHasher", module = "kvblocks._core", frozen)]
pub(crate) struct PyBlockHasher {
    pub(crate) inner: BlockHasher,
}

#[pymethods]
impl PyBlockHasher {
    #[new]
    #[pyo3(signature = (hash_block_size, algo="sha256_cbor",
                        num_hash_lookahead_tokens=NonNegativeInt(0)),
                  text_signature = "(hash_block_size, algo='sha256_cbor', \
                        num_hash_lookahead_tokens=0)")]
    fn new(
        hash_block_size: i64,
        algo: &str,
        num_hash_lookahead_tokens: NonNegativeInt,
    ) -> PyResult<Self> {
        let algo = parse_algo(algo)?;
        let size = usize::try_from(hash_block_size).unwrap_or(0);
        Ok(Self {
            inner: BlockHasher::new(size, algo)?.with_lookahead(num_hash_lookahead_tokens.0),
        })
    }

    /// Tokens per hashed block.
    #[getter]
    fn hash_block_size(&self) -> usize {
        self.inner.hash_block_size()
    }

    /// vLLM's algorithm name.
    #[getter]
    fn algo(&self) -> &'static str {
        self.inner.algo().name()
    }

    /// Tokens after each block that its hash also covers (vLLM 0.33's
    /// `num_hash_lookahead_tokens`; 0: none).
    #[getter]
    fn num_hash_lookahead_tokens(&self) -> usize {
        self.inner.num_hash_lookahead_tokens()
    }

    fn __repr__(&self) -> String {
        format!(
            "BlockHasher(hash_block_size={}, algo={:?}, num_hash_lookahead_tokens={})",
            self.inner.hash_block_size(),
            self.inner.algo().name(),
            self.inner.num_hash_lookahead_tokens()
        )
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(hash_block_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(none_hash, m)?)?;
    m.add_function(wrap_pyfunction!(external_block_hashes, m)?)?;
    m.add_class::<PyBlockHasher>()?;
    let names = HashAlgo::ALL.map(HashAlgo::name);
    m.add("HASH_ALGORITHMS", PyTuple::new(m.py(), names)?)?;
    Ok(())
}
