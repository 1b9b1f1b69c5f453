//! Python bindings for `request::Request`.

use crate::python::errors::invalid_argument;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyList};
use pyo3::PyTypeInfo;

use super::hashing::{extract_token_ids, PyBlockHasher};
use super::ids::extract_u32;
use crate::hashing::{LoraRequest, MmFeature};
use crate::request::{Request, RequestOptions};

/// Prompts at least this long are hashed with the GIL released.
const RELEASE_GIL_TOKENS: usize = 512;

/// A request's tokens and block hashes (vLLM's `Request`, the KV-cache-relevant parts).
#[pyclass(name = "Request", module = "kvblocks._core")]
pub(crate) struct PyRequest {
    pub(crate) inner: Request,
}

/// The items of `requests` as `Request` objects, for the batch calls. A list takes a fast
/// path (one type comparison per item); anything else goes through PyO3's extraction,
/// which raises `TypeError` for items that are not requests.
pub(crate) fn request_list<'py>(
    requests: &Bound<'py, PyAny>,
) -> PyResult<Vec<Bound<'py, PyRequest>>> {
    if let Ok(list) = requests.downcast_exact::<PyList>() {
        let ty = PyRequest::type_object(list.py());
        let mut out = Vec::with_capacity(list.len());
        for item in list.iter() {
            if !item.get_type().is(&ty) {
                return requests.extract();
            }
            // SAFETY: the item's type is exactly `Request`'s.
            out.push(unsafe { item.downcast_into_unchecked() });
        }
        return Ok(out);
    }
    requests.extract()
}

/// Converts `(identifier, offset, length)` tuples, rejecting negative numbers.
pub(crate) fn mm_features(items: Vec<(String, i64, i64)>) -> PyResult<Vec<MmFeature>> {
    items
        .into_iter()
        .enumerate()
        .map(|(i, (identifier, offset, length))| {
            match (usize::try_from(offset), usize::try_from(length)) {
                (Ok(offset), Ok(length)) => Ok(MmFeature {
                    identifier,
                    offset,
                    length,
                }),
                _ => Err(invalid_argument(format!(
                    "mm_features[{i}]: offset and length must be >= 0, got ({offset}, {length})"
                ))),
            }
        })
        .collect()
}

#[pymethods]
impl PyRequest {
    #[new]
    #[pyo3(signature = (request_id, prompt_token_ids, hasher=None, *, lora_name=None,
                        lora_path=None, lora_id=None, cache_salt=None, mm_features=None,
                        priority=0, session_id=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        request_id: String,
        prompt_token_ids: &Bound<'_, PyAny>,
        hasher: Option<PyRef<'_, PyBlockHasher>>,
        lora_name: Option<String>,
        lora_path: Option<String>,
        lora_id: Option<i64>,
        cache_salt: Option<String>,
        mm_features: Option<Vec<(String, i64, i64)>>,
        priority: i64,
        session_id: Option<String>,
    ) -> PyResult<Self> {
        let options = RequestOptions {
            lora: LoraRequest::from_parts(lora_name, lora_path, lora_id)?,
            cache_salt,
            mm_features: self::mm_features(mm_features.unwrap_or_default())?,
            prompt_embeds: None,
        };
        let prompt_token_ids = extract_token_ids(prompt_token_ids)?;
        let hasher = hasher.map(|h| h.inner);
        let long = hasher.is_some() && prompt_token_ids.len() >= RELEASE_GIL_TOKENS;
        let build = move || Request::new(request_id, prompt_token_ids, hasher, options);
        let mut inner = if long {
            py.allow_threads(build)?
        } else {
            build()?
        };
        inner.priority = priority;
        inner.session_id = session_id;
        Ok(Self { inner })
    }

    /// The request id.
    #[getter]
    fn request_id(&self) -> &str {
        self.inner.request_id()
    }

    /// `len(all_token_ids)`.
    #[getter]
    fn num_tokens(&self) -> usize {
        self.inner.num_tokens()
    }

    /// Prompt length.
    #[getter]
    fn num_prompt_tokens(&self) -> usize {
        self.inner.num_prompt_tokens()
    }

    /// Output tokens appended so far.
    #[getter]
    fn num_output_tokens(&self) -> usize {
        self.inner.num_output_tokens()
    }

    /// Tokens whose KV is computed.
    #[getter]
    fn num_computed_tokens(&self) -> usize {
        self.inner.num_computed_tokens
    }

    #[setter]
    fn set_num_computed_tokens(&mut self, value: usize) {
        self.inner.num_computed_tokens = value;
    }

    /// Tokens of unprocessed steps (async scheduling); 0 under a synchronous scheduler.
    #[getter]
    fn num_in_flight_tokens(&self) -> usize {
        self.inner.num_in_flight_tokens
    }

    #[setter]
    fn set_num_in_flight_tokens(&mut self, value: usize) {
        self.inner.num_in_flight_tokens = value;
    }

    /// Times the request was preempted.
    #[getter]
    fn num_preemptions(&self) -> u32 {
        self.inner.num_preemptions
    }

    #[setter]
    fn set_num_preemptions(&mut self, value: u32) {
        self.inner.num_preemptions = value;
    }

    /// Whether prefix-cache hits are ignored for this request.
    #[getter]
    fn skip_reading_prefix_cache(&self) -> bool {
        self.inner.skip_reading_prefix_cache
    }

    #[setter]
    fn set_skip_reading_prefix_cache(&mut self, value: bool) {
        self.inner.skip_reading_prefix_cache = value;
    }

    /// The LoRA adapter's name.
    #[getter]
    fn lora_name(&self) -> Option<&str> {
        self.inner.lora().map(|l| l.name.as_str())
    }

    /// The LoRA adapter's id.
    #[getter]
    fn lora_id(&self) -> Option<u32> {
        self.inner.lora().and_then(|l| l.id)
    }

    /// The cache salt.
    #[getter]
    fn cache_salt(&self) -> Option<&str> {
        self.inner.cache_salt()
    }

    /// vLLM's scheduling priority (lower is more urgent); a retention policy maps it to
    /// a class.
    #[getter]
    fn priority(&self) -> i64 {
        self.inner.priority
    }

    /// The session the request belongs to, if any.
    #[getter]
    fn session_id(&self) -> Option<&str> {
        self.inner.session_id.as_deref()
    }

    /// Prompt tokens followed by output tokens.
    #[getter]
    fn all_token_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.inner.all_token_ids())
    }

    /// Hashes of the full blocks (empty without a hasher).
    #[getter]
    fn block_hashes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(
            py,
            self.inner
                .block_hashes()
                .iter()
                .map(|h| PyBytes::new(py, h.as_bytes())),
        )
    }

    /// Appends one token or a sequence of tokens and hashes the blocks they complete.
    fn append_output_token_ids(
        &mut self,
        py: Python<'_>,
        token_ids: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        if token_ids.is_instance_of::<PyInt>() {
            let token = extract_u32(token_ids, "token ids")?;
            self.inner.append_output_token_ids(&[token]);
            return Ok(());
        }
        let tokens = extract_token_ids(token_ids)?;
        if tokens.len() >= RELEASE_GIL_TOKENS {
            let inner = &mut self.inner;
            py.allow_threads(|| inner.append_output_token_ids(&tokens));
        } else {
            self.inner.append_output_token_ids(&tokens);
        }
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "Request(request_id={:?}, num_tokens={}, num_computed_tokens={}, num_block_hashes={})",
            self.inner.request_id(),
            self.inner.num_tokens(),
            self.inner.num_computed_tokens,
            self.inner.block_hashes().len()
        )
    }
}

/// Appends one output token to each request (`requests[i]` gets `token_ids[i]`), hashing
/// the blocks they complete: one call per scheduler step instead of one per request. A
/// request listed twice raises before anything changes.
#[pyfunction]
fn append_token_ids_batch(
    requests: &Bound<'_, PyAny>,
    token_ids: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let requests = request_list(requests)?;
    let tokens = extract_token_ids(token_ids)?;
    if tokens.len() != requests.len() {
        return Err(invalid_argument(format!(
            "{} requests but {} token ids",
            requests.len(),
            tokens.len()
        )));
    }
    let mut borrowed = requests
        .iter()
        .map(|r| r.try_borrow_mut())
        .collect::<Result<Vec<_>, _>>()?;
    for (req, &token) in borrowed.iter_mut().zip(&tokens) {
        req.inner.append_output_token_ids(&[token]);
    }
    Ok(())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRequest>()?;
    m.add_function(wrap_pyfunction!(append_token_ids_batch, m)?)?;
    Ok(())
}
