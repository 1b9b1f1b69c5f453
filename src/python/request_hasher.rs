//! `RequestBlockHasher`: vLLM's `request_block_hasher` closure on the core's hash chain.
//!
//! vLLM's `Request` calls its hasher with itself from `__init__` and from every
//! `append_output_token_ids`, and extends `request.block_hashes` with what it returns.
//! This class reads that request in place (duck-typed: `_all_token_ids`, `block_hashes`,
//! `lora_request`, `cache_salt`, `mm_features`, `prompt_embeds`), converts only the tokens
//! of the new blocks, hashes them with the core ([`BlockHasher::hash_new_blocks`]) and
//! returns the new hashes as `bytes`. Which blocks are due and what keys each gets are the
//! core's rules; this file only reads and converts.

use std::ops::Range;

use pyo3::exceptions::{PyOverflowError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PySlice, PyString};
use pyo3::{ffi, intern};

use super::hashing::parse_algo;
use super::ids::extract_u32s;
use crate::hashing::{
    none_hash, BlockHasher, KeySources, LoraRequest, MmFeature, PromptEmbedsView, StrObjects,
};
use crate::python::errors::{int_overflow, invalid_argument, invalid_type};
use crate::python::vllm_reads::{lora_request, mm_feature, placeholder_range, request as attr};
use crate::request::RequestOptions;
use crate::types::BlockHash;

/// Spans at least this many tokens are hashed with the GIL released.
const RELEASE_GIL_TOKENS: usize = 512;

/// vLLM's `get_request_block_hasher(hash_block_size, caching_hash_fn,
/// num_hash_lookahead_tokens)` result: call it with a vLLM `Request` to get the hashes of
/// the full blocks the request completed since its last call.
#[pyclass(name = "RequestBlockHasher", module = "kvblocks._core", frozen)]
pub(crate) struct PyRequestBlockHasher {
    hasher: BlockHasher,
    /// An object whose `NONE_HASH` attribute is the parent of a first block (vLLM's
    /// `kv_cache_utils` module, read per call: `init_none_hash` may change it).
    none_hash_from: Option<Py<PyAny>>,
    /// vLLM's `tensor_data`: a tensor to a buffer of its raw bytes.
    tensor_data: Option<Py<PyAny>>,
}

/// A span of a request's tokens: `u32` (every real token id), or any ints within `i64`
/// (vLLM's own tests put `-1` placeholders in prompts, and its hasher hashes them).
enum Tokens {
    U32(Vec<u32>),
    I64(Vec<i64>),
}

impl Tokens {
    fn len(&self) -> usize {
        match self {
            Tokens::U32(t) => t.len(),
            Tokens::I64(t) => t.len(),
        }
    }

    /// Any Python ints (PyO3's conversion, which raises `TypeError` for non-ints and
    /// `OverflowError` past `i64`).
    fn from_any(seq: &Bound<'_, PyAny>) -> PyResult<Self> {
        if let Ok(t) = extract_u32s(seq, "token ids") {
            return Ok(Tokens::U32(t));
        }
        let wide = seq.extract::<Vec<i64>>().map_err(|e| {
            if e.is_instance_of::<PyOverflowError>(seq.py()) {
                int_overflow("token ids must be ints within 64 bits")
            } else {
                e
            }
        })?;
        Ok(Tokens::I64(wide))
    }

    /// `list[span]`: exact ints in `u32` range are read with no new reference per item;
    /// anything else converts the slice with [`Tokens::from_any`].
    fn from_list(list: &Bound<'_, PyList>, span: Range<usize>) -> PyResult<Self> {
        let mut out = Vec::with_capacity(span.len());
        for i in span.clone() {
            // SAFETY: `list` is a live list and `i < len(list)` (the span was computed from
            // its length just before, with no Python code run since); nothing in this loop
            // runs Python code (exact ints convert without `__index__`), and the module is
            // built for the limited API, which has a GIL, so the list cannot change while it
            // is read.
            let v = unsafe {
                let item = ffi::PyList_GetItem(list.as_ptr(), i as ffi::Py_ssize_t);
                if item.is_null() || ffi::PyLong_CheckExact(item) == 0 {
                    -1
                } else {
                    ffi::PyLong_AsSsize_t(item)
                }
            };
            if !(0..=u32::MAX as ffi::Py_ssize_t).contains(&v) {
                let _ = PyErr::take(list.py());
                return Self::from_any(&list.get_slice(span.start, span.end));
            }
            out.push(v as u32);
        }
        Ok(Tokens::U32(out))
    }
}

/// The key strings of a request as Python objects, in [`StrObjects`] order (LoRA name,
/// LoRA path, cache salt, then each multimodal identifier), kept alive while their
/// identities are compared.
#[derive(Default)]
struct KeyStrs<'py> {
    objects: Vec<Option<Bound<'py, PyAny>>>,
}

impl<'py> KeyStrs<'py> {
    /// Which of the strings are one object; None when none repeats (the common case).
    fn numbers(&self) -> Option<StrObjects> {
        let first = |i: usize| -> u32 {
            let Some(obj) = &self.objects[i] else {
                return i as u32;
            };
            let same = self.objects[..i]
                .iter()
                .position(|o| o.as_ref().is_some_and(|o| o.is(obj)));
            same.unwrap_or(i) as u32
        };
        let numbers: Vec<u32> = (0..self.objects.len()).map(first).collect();
        if numbers.iter().enumerate().all(|(i, &n)| n as usize == i) {
            return None;
        }
        Some(StrObjects {
            lora_name: numbers[0],
            lora_path: numbers[1],
            cache_salt: numbers[2],
            mm: numbers[3..].to_vec(),
        })
    }
}

fn str_of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    let s = obj
        .downcast::<PyString>()
        .map_err(|_| invalid_type(format!("{what} must be a str")))?;
    Ok(s.to_str()?.to_owned())
}

/// `request.lora_request` as the core's adapter (None when falsy, as vLLM's `if not`).
fn lora_of<'py>(
    request: &Bound<'py, PyAny>,
    strs: &mut KeyStrs<'py>,
) -> PyResult<Option<LoraRequest>> {
    let py = request.py();
    let lora = request.getattr(intern!(py, attr::LORA_REQUEST))?;
    if !lora.is_truthy()? {
        strs.objects.extend([None, None]);
        return Ok(None);
    }
    let name = lora.getattr(intern!(py, lora_request::LORA_NAME))?;
    let path = lora.getattr(intern!(py, lora_request::LORA_PATH))?;
    let adapter = LoraRequest {
        name: str_of(&name, "lora_request.lora_name")?,
        path: str_of(&path, "lora_request.lora_path")?,
        // The id is not hashed; vLLM's own LoRARequest has validated it.
        id: None,
    };
    strs.objects.extend([Some(name), Some(path)]);
    Ok(Some(adapter))
}

/// The extra-key sources of a vLLM `request` that its `BlockStored` events publish: its
/// LoRA adapter, cache salt and multimodal items; None when it has none. (Not its prompt
/// embeddings: their digests would need vLLM's `tensor_data`, which only the hasher holds.)
pub(crate) fn event_key_options(request: &Bound<'_, PyAny>) -> PyResult<Option<RequestOptions>> {
    let mut strs = KeyStrs::default();
    let options = RequestOptions {
        lora: lora_of(request, &mut strs)?,
        cache_salt: salt_of(request, &mut strs)?,
        mm_features: mm_features_of(request, 0, &mut strs)?,
        prompt_embeds: None,
    };
    let none = options.lora.is_none() && options.cache_salt.is_none();
    Ok((!none || !options.mm_features.is_empty()).then_some(options))
}

/// `request.cache_salt`.
fn salt_of<'py>(request: &Bound<'py, PyAny>, strs: &mut KeyStrs<'py>) -> PyResult<Option<String>> {
    let salt = request.getattr(intern!(request.py(), attr::CACHE_SALT))?;
    if salt.is_none() {
        strs.objects.push(None);
        return Ok(None);
    }
    let text = str_of(&salt, "request.cache_salt")?;
    strs.objects.push(Some(salt));
    Ok(Some(text))
}

/// `request.mm_features` as `(identifier, offset, length)` items; empty when no feature
/// ends after `start` (then none can overlap a block from `start` on).
fn mm_features_of<'py>(
    request: &Bound<'py, PyAny>,
    start: usize,
    strs: &mut KeyStrs<'py>,
) -> PyResult<Vec<MmFeature>> {
    let py = request.py();
    let features = request.getattr(intern!(py, attr::MM_FEATURES))?;
    if !features.is_truthy()? {
        return Ok(Vec::new());
    }
    let position = |f: &Bound<'_, PyAny>, i: usize| -> PyResult<(usize, usize)> {
        let pos = f.getattr(intern!(py, mm_feature::MM_POSITION))?;
        let offset = pos
            .getattr(intern!(py, placeholder_range::OFFSET))?
            .extract::<usize>();
        let length = pos
            .getattr(intern!(py, placeholder_range::LENGTH))?
            .extract::<usize>();
        match (offset, length) {
            (Ok(o), Ok(l)) => Ok((o, l)),
            _ => Err(invalid_argument(format!(
                "request.mm_features[{i}].mm_position: offset and length must be ints >= 0"
            ))),
        }
    };
    let n = features.len()?;
    let (o, l) = position(&features.get_item(n - 1)?, n - 1)?;
    if o.saturating_add(l) <= start {
        return Ok(Vec::new());
    }
    let mut out = Vec::with_capacity(n);
    for (i, f) in features.try_iter()?.enumerate() {
        let f = f?;
        let (offset, length) = position(&f, i)?;
        let identifier = f.getattr(intern!(py, mm_feature::IDENTIFIER))?;
        out.push(MmFeature {
            identifier: str_of(&identifier, &format!("request.mm_features[{i}].identifier"))?,
            offset,
            length,
        });
        strs.objects.push(Some(identifier));
    }
    Ok(out)
}

/// The rows of `request.prompt_embeds` that the new blocks hash, as vLLM's `tensor_data`
/// gives their bytes (the limited API has no buffer protocol before 3.11: the rows are
/// copied, and only those).
struct Embeds {
    rows: Option<Py<PyBytes>>,
    bytes_per_token: usize,
    first_row: usize,
}

impl Embeds {
    fn view<'a>(&'a self, py: Python<'a>) -> PromptEmbedsView<'a> {
        PromptEmbedsView {
            data: self.rows.as_ref().map_or(&[], |b| b.as_bytes(py)),
            bytes_per_token: self.bytes_per_token,
            first_row: self.first_row,
        }
    }
}

impl PyRequestBlockHasher {
    /// vLLM's NONE_HASH: `none_hash_from.NONE_HASH` read now, or kvblocks' own.
    fn none_hash(&self, py: Python<'_>) -> PyResult<BlockHash> {
        let Some(src) = &self.none_hash_from else {
            return Ok(none_hash(self.hasher.algo()));
        };
        let value = src
            .bind(py)
            .getattr(intern!(py, "NONE_HASH"))
            .map_err(|_| {
                PyRuntimeError::new_err(
                    "vLLM's NONE_HASH is not set: call vllm.v1.core.kv_cache_utils.init_none_hash \
                 (vLLM's engine core does) before hashing requests",
                )
            })?;
        let bytes = value
            .downcast::<PyBytes>()
            .map_err(|_| invalid_type("NONE_HASH must be bytes"))?;
        Ok(BlockHash::from_slice(bytes.as_bytes())?)
    }

    /// The parent of the first new block: the request's last hash, or NONE_HASH when it has
    /// none (or it is empty, which vLLM treats alike).
    fn parent(&self, hashes: &Bound<'_, PyAny>, num_hashes: usize) -> PyResult<BlockHash> {
        let py = hashes.py();
        if num_hashes > 0 {
            let last = hashes.get_item(num_hashes - 1)?;
            let last = last
                .downcast::<PyBytes>()
                .map_err(|_| invalid_type("request.block_hashes must hold bytes"))?;
            if !last.as_bytes().is_empty() {
                return Ok(BlockHash::from_slice(last.as_bytes())?);
            }
        }
        self.none_hash(py)
    }

    /// `request.prompt_embeds`: the rows of `span` (clipped to the prompt); none are read
    /// when the span lies past the prompt.
    fn embeds_of(
        &self,
        request: &Bound<'_, PyAny>,
        span: &Range<usize>,
    ) -> PyResult<Option<Embeds>> {
        let py = request.py();
        let pe = request.getattr(intern!(py, attr::PROMPT_EMBEDS))?;
        if pe.is_none() {
            return Ok(None);
        }
        let rows = pe.len()?;
        if span.start >= rows {
            // Every new block's slice of the embeddings is empty.
            return Ok(Some(Embeds {
                rows: None,
                bytes_per_token: 0,
                first_row: span.start,
            }));
        }
        let Some(tensor_data) = &self.tensor_data else {
            return Err(invalid_argument(
                "this hasher was made without tensor_data and cannot hash prompt_embeds",
            ));
        };
        let data = tensor_data.bind(py).call1((pe,))?;
        let nbytes = data.len()?;
        if nbytes % rows != 0 {
            return Err(invalid_argument(format!(
                "tensor_data(prompt_embeds) gave {nbytes} bytes, not {rows} rows"
            )));
        }
        let bytes_per_token = nbytes / rows;
        let (lo, hi) = (span.start, span.end.min(rows));
        let slice = PySlice::new(
            py,
            (lo * bytes_per_token) as isize,
            (hi * bytes_per_token) as isize,
            1,
        );
        let rows = data
            .get_item(slice)?
            .call_method0(intern!(py, "tobytes"))?
            .downcast_into::<PyBytes>()
            .map_err(|_| invalid_type("tensor_data(...)[a:b].tobytes() must be bytes"))?;
        Ok(Some(Embeds {
            rows: Some(rows.unbind()),
            bytes_per_token,
            first_row: lo,
        }))
    }
}

#[pymethods]
impl PyRequestBlockHasher {
    #[new]
    #[pyo3(signature = (hash_block_size, algo, num_hash_lookahead_tokens=0, *,
                        none_hash_from=None, tensor_data=None))]
    fn new(
        hash_block_size: i64,
        algo: &str,
        num_hash_lookahead_tokens: i64,
        none_hash_from: Option<Py<PyAny>>,
        tensor_data: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let algo = parse_algo(algo)?;
        let lookahead = usize::try_from(num_hash_lookahead_tokens).map_err(|_| {
            invalid_argument(format!(
                "num_hash_lookahead_tokens must be >= 0, got {num_hash_lookahead_tokens}"
            ))
        })?;
        let size = usize::try_from(hash_block_size).unwrap_or(0);
        Ok(Self {
            hasher: BlockHasher::new(size, algo)?.with_lookahead(lookahead),
            none_hash_from,
            tensor_data,
        })
    }

    /// Tokens per hashed block.
    #[getter]
    fn hash_block_size(&self) -> usize {
        self.hasher.hash_block_size()
    }

    /// vLLM's algorithm name.
    #[getter]
    fn algo(&self) -> &'static str {
        self.hasher.algo().name()
    }

    /// Tokens after a block that its hash covers (0: none).
    #[getter]
    fn num_hash_lookahead_tokens(&self) -> usize {
        self.hasher.num_hash_lookahead_tokens()
    }

    /// The hashes of the full blocks `request` completed since its last call, as `bytes`.
    fn __call__<'py>(&self, request: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        let py = request.py();
        let tokens = match request.getattr(intern!(py, attr::ALL_TOKEN_IDS)) {
            Ok(t) => t,
            // kvblocks' own `Request` (and a look-alike) names it without the underscore.
            Err(_) => request.getattr(intern!(py, "all_token_ids"))?,
        };
        let hashes = request.getattr(intern!(py, attr::BLOCK_HASHES))?;
        let num_hashes = hashes.len()?;
        let Some(span) = self.hasher.pending_tokens(num_hashes, tokens.len()?) else {
            return Ok(PyList::empty(py));
        };
        let parent = self.parent(&hashes, num_hashes)?;
        let mut strs = KeyStrs::default();
        let lora = lora_of(request, &mut strs)?;
        let salt = salt_of(request, &mut strs)?;
        let mm = mm_features_of(request, span.start, &mut strs)?;
        let objs = strs.numbers();
        let embeds = self.embeds_of(request, &span)?;
        let tokens = match tokens.downcast::<PyList>() {
            Ok(list) => Tokens::from_list(list, span.clone())?,
            Err(_) => {
                let slice = PySlice::new(py, span.start as isize, span.end as isize, 1);
                Tokens::from_any(&tokens.get_item(slice)?)?
            }
        };
        let src = KeySources {
            lora: lora.as_ref(),
            mm_features: &mm,
            cache_salt: salt.as_deref(),
            prompt_embeds: embeds.as_ref().map(|e| e.view(py)),
            objs: objs.as_ref(),
        };
        let hasher = self.hasher;
        let mut out = Vec::new();
        let run = |out: &mut Vec<BlockHash>| match &tokens {
            Tokens::U32(t) => hasher.hash_new_blocks(parent, span.start, t, &src, out),
            Tokens::I64(t) => hasher.hash_new_blocks(parent, span.start, t, &src, out),
        };
        if tokens.len() >= RELEASE_GIL_TOKENS {
            py.allow_threads(|| run(&mut out));
        } else {
            run(&mut out);
        }
        PyList::new(py, out.iter().map(|h| PyBytes::new(py, h.as_bytes())))
    }

    fn __repr__(&self) -> String {
        format!(
            "RequestBlockHasher(hash_block_size={}, algo={:?}, num_hash_lookahead_tokens={})",
            self.hasher.hash_block_size(),
            self.hasher.algo().name(),
            self.hasher.num_hash_lookahead_tokens()
        )
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRequestBlockHasher>()?;
    Ok(())
}
