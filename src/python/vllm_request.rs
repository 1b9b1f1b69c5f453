//! vLLM's own `Request` objects as the manager's [`RequestView`], read in place: the
//! manager never asks for a mirror object. Per call the view reads a handful of int
//! attributes; the request's block hashes (and, with events on, its tokens) are kept in a
//! per-request memo that only ever converts the entries appended since the last call.

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};
use pyo3::{ffi, intern};
use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap;

use crate::attention::RequestView;
use crate::events::event::{EventExtraKeys, StoredBlockSource};
use crate::pool::RetentionHints;
use crate::python::errors::invalid_type;
use crate::python::request_hasher::event_key_options;
use crate::python::vllm_reads::{lora_request, request as attr, request_status};
use crate::request::SlotHint;
use crate::request::{Request, RequestOptions};
use crate::request_fields::RequestFields;
use crate::types::BlockHash;

/// What the manager keeps of one vLLM request object between calls: the object itself
/// (so its address names it while the memo lives), its instance dict, its id, the slot
/// hint the core trusts, and its block hashes (and, with events on, its tokens) as
/// converted so far.
#[derive(Debug)]
pub(crate) struct RequestMemo {
    /// Held only to keep the object, and so its address, alive.
    _request: Py<PyAny>,
    dict: Option<Py<PyDict>>,
    id: String,
    hint: SlotHint,
    hashes: Vec<BlockHash>,
    tokens: Vec<u32>,
    /// The extra-key sources its `BlockStored` events publish (`Some(None)`: it has none),
    /// read on the first call that may publish: vLLM fixes a request's LoRA adapter, salt
    /// and multimodal items when it makes it.
    event_keys: Option<Option<Box<RequestOptions>>>,
}

/// The memos of the vLLM request objects a manager has seen, by object identity.
///
/// NOTE 1: a memo holds its request object, so the address it is keyed by cannot be
/// reused while the memo lives; `forget` (at `free`) drops both.
/// NOTE 2: at most one memo per request id: a new object under a known id replaces the
/// old object's memo.
#[derive(Debug, Default)]
pub(crate) struct RequestMemos {
    by_object: FxHashMap<usize, RequestMemo>,
    by_id: FxHashMap<String, usize>,
    /// Objects whose id a newer object took, dropped on the next lookup.
    stale: Vec<usize>,
}

impl RequestMemos {
    /// Forgets the request with this id (it was freed).
    pub(crate) fn forget(&mut self, request_id: &str) {
        if let Some(addr) = self.by_id.remove(request_id) {
            self.by_object.remove(&addr);
        }
    }

    /// The memo of `request`, made on first sight.
    fn get_or_insert(&mut self, request: &Bound<'_, PyAny>) -> PyResult<&mut RequestMemo> {
        for old in self.stale.drain(..) {
            self.by_object.remove(&old);
        }
        let addr = request.as_ptr() as usize;
        let vacant = match self.by_object.entry(addr) {
            Entry::Occupied(o) => return Ok(o.into_mut()),
            Entry::Vacant(v) => v,
        };
        let id = request_id(request)?.to_str()?.to_owned();
        let dict = request
            .getattr(intern!(request.py(), "__dict__"))
            .ok()
            .and_then(|d| d.downcast_into::<PyDict>().ok())
            .map(Bound::unbind);
        let memo = vacant.insert(RequestMemo {
            _request: request.clone().unbind(),
            dict,
            id: id.clone(),
            hint: SlotHint::new(),
            hashes: Vec::new(),
            tokens: Vec::new(),
            event_keys: None,
        });
        if let Some(old) = self.by_id.insert(id, addr) {
            // Another object under this id: its memo goes (NOTE 2). `old != addr`, as
            // this object had no memo.
            self.stale.push(old);
        }
        Ok(memo)
    }
}

/// Reads list item `i` without a new reference.
///
/// SAFETY (of the caller): `i < len(list)`, and no Python code runs while the borrowed
/// item is in use (the module is built for the limited API, which has a GIL).
unsafe fn list_item<'a, 'py>(list: &'a Bound<'py, PyList>, i: usize) -> Borrowed<'a, 'py, PyAny> {
    // SAFETY: see the function's contract; PyList_GetItem returns a borrowed reference.
    unsafe {
        let item = ffi::PyList_GetItem(list.as_ptr(), i as ffi::Py_ssize_t);
        Borrowed::from_ptr(list.py(), item)
    }
}

fn hash_of(item: Borrowed<'_, '_, PyAny>, i: usize) -> PyResult<BlockHash> {
    let bytes = item
        .downcast::<PyBytes>()
        .map_err(|_| invalid_type(format!("request.block_hashes[{i}] must be bytes")))?;
    Ok(BlockHash::from_slice(bytes.as_bytes())?)
}

fn token_of(item: Borrowed<'_, '_, PyAny>, i: usize) -> PyResult<u32> {
    item.extract::<u32>().map_err(|_| {
        invalid_type(format!(
            "request token {i} must be an int in 0..=4294967295"
        ))
    })
}

/// Brings `memo` up to date with `list`: appends what was added since, or converts the
/// whole list again if it no longer extends what the memo holds.
fn sync<T: PartialEq + Copy>(
    memo: &mut Vec<T>,
    list: &Bound<'_, PyList>,
    convert: impl Fn(Borrowed<'_, '_, PyAny>, usize) -> PyResult<T>,
) -> PyResult<()> {
    let n = list.len();
    let kept = memo.len();
    let extends = kept <= n
        && (kept == 0 || {
            // SAFETY: kept - 1 < n; nothing runs Python code while the item is read.
            let last = unsafe { list_item(list, kept - 1) };
            convert(last, kept - 1)? == memo[kept - 1]
        });
    if !extends {
        memo.clear();
    }
    memo.reserve(n - memo.len());
    for i in memo.len()..n {
        // SAFETY: i < n, the list's length; conversion runs no Python code.
        let item = unsafe { list_item(list, i) };
        memo.push(convert(item, i)?);
    }
    Ok(())
}

/// The request's attributes: its instance dict first (one probe per name), then
/// ordinary attribute lookup (properties, slots).
struct Attrs<'a, 'py> {
    obj: &'a Bound<'py, PyAny>,
    dict: Option<&'a Bound<'py, PyDict>>,
}

impl<'py> Attrs<'_, 'py> {
    fn get(&self, name: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(d) = self.dict {
            if let Some(v) = d.get_item(name)? {
                return Ok(v);
            }
        }
        self.obj.getattr(name)
    }

    fn usize(&self, name: &Bound<'py, PyString>) -> PyResult<usize> {
        self.get(name)?.extract::<usize>().map_err(|_| {
            invalid_type(format!(
                "request.{} must be an int >= 0",
                name.to_string_lossy()
            ))
        })
    }

    fn list(&self, name: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyList>> {
        self.get(name)?
            .downcast_into::<PyList>()
            .map_err(|_| invalid_type(format!("request.{} must be a list", name.to_string_lossy())))
    }
}

/// A vLLM `Request`, read for one manager call.
pub(crate) struct VllmRequest<'a> {
    num_tokens: usize,
    num_prompt_tokens: usize,
    num_computed_tokens: usize,
    num_in_flight_tokens: usize,
    shared_prefix_boundary: usize,
    num_preemptions: usize,
    skip_reading_prefix_cache: bool,
    awaiting_admission: bool,
    memo: &'a RequestMemo,
    lora: Option<(i64, String)>,
    session_id: Option<String>,
    hints: RetentionHints,
}

/// The request's id object.
pub(crate) fn request_id<'py>(request: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyString>> {
    let not_a_request = || {
        invalid_type(format!(
            "expected a kvblocks.Request or a vLLM Request, got {}",
            request
                .get_type()
                .name()
                .map_or_else(|_| "?".to_owned(), |n| n.to_string())
        ))
    };
    request
        .getattr(intern!(request.py(), attr::REQUEST_ID))
        .map_err(|_| not_a_request())?
        .downcast_into::<PyString>()
        .map_err(|_| invalid_type("request.request_id must be a str"))
}

impl<'a> VllmRequest<'a> {
    /// Reads `request` (vLLM's `Request`, or anything with its attributes); `fields` says
    /// what the call needs beyond the counts and hashes.
    pub(crate) fn read(
        request: &Bound<'_, PyAny>,
        memos: &'a mut RequestMemos,
        fields: RequestFields,
    ) -> PyResult<Self> {
        let py = request.py();
        let memo = memos.get_or_insert(request)?;
        let dict = memo.dict.as_ref().map(|d| d.bind(py));
        let a = Attrs { obj: request, dict };
        let tokens = a.list(intern!(py, attr::ALL_TOKEN_IDS))?;
        let hashes = a.list(intern!(py, attr::BLOCK_HASHES))?;
        let awaiting_admission = fields.status
            && request_status(a.get(intern!(py, attr::STATUS))?.extract::<i64>()?)
                .awaiting_admission();
        let (skip_reading_prefix_cache, num_preemptions) = if fields.lookup {
            (
                a.get(intern!(py, attr::SKIP_READING_PREFIX_CACHE))?
                    .is_truthy()?,
                a.usize(intern!(py, attr::NUM_PREEMPTIONS))?,
            )
        } else {
            (false, 0)
        };
        let lora = if fields.event_tokens || fields.retention {
            lora_of(&a)?
        } else {
            None
        };
        let session_id = if fields.event_tokens {
            session_of(&a)?
        } else {
            None
        };
        let hints = if fields.retention {
            retention_hints_of(&a, lora.as_ref())?
        } else {
            RetentionHints::default()
        };
        let num_prompt_tokens = a.usize(intern!(py, attr::NUM_PROMPT_TOKENS))?;
        let num_computed_tokens = a.usize(intern!(py, attr::NUM_COMPUTED_TOKENS))?;
        // vLLM keeps this count signed; a negative one settles nothing more.
        let num_in_flight_tokens = a
            .get(intern!(py, attr::NUM_IN_FLIGHT_TOKENS))?
            .extract::<i64>()
            .map_err(|_| invalid_type("request.num_in_flight_tokens must be an int"))?
            .max(0) as usize;
        // Set by vLLM's scheduler after `get_computed_blocks`; read only where caching uses
        // it (sparse retention, the Mamba shared-prefix checkpoint). A look-alike without it
        // has no junction.
        let shared_prefix_boundary = match fields
            .junction
            .then(|| a.get(intern!(py, attr::SHARED_PREFIX_BOUNDARY)))
        {
            Some(Ok(v)) => v
                .extract::<usize>()
                .map_err(|_| invalid_type("request.shared_prefix_boundary must be an int >= 0"))?,
            _ => 0,
        };
        sync(&mut memo.hashes, &hashes, hash_of)?;
        if fields.event_tokens {
            sync(&mut memo.tokens, &tokens, token_of)?;
            if memo.event_keys.is_none() {
                memo.event_keys = Some(event_key_options(request)?.map(Box::new));
            }
        }
        Ok(Self {
            num_tokens: tokens.len(),
            num_prompt_tokens,
            num_computed_tokens,
            num_in_flight_tokens,
            shared_prefix_boundary,
            num_preemptions,
            skip_reading_prefix_cache,
            awaiting_admission,
            memo,
            lora,
            session_id,
            hints,
        })
    }
}

/// vLLM's `priority`, `session_id` and `cache_salt` with the LoRA name, as the core's
/// hints. A look-alike without these attributes has the defaults.
fn retention_hints_of(a: &Attrs<'_, '_>, lora: Option<&(i64, String)>) -> PyResult<RetentionHints> {
    let py = a.obj.py();
    let optional = |name| a.get(name).ok().filter(|v| !v.is_none());
    let priority = match optional(intern!(py, attr::PRIORITY)) {
        Some(p) => p
            .extract::<i64>()
            .map_err(|_| invalid_type("request.priority must be an int"))?,
        None => 0,
    };
    let session = optional(intern!(py, attr::SESSION_ID)).is_some();
    let cache_salt = optional(intern!(py, attr::CACHE_SALT))
        .map(|salt| {
            salt.extract::<PyBackedStr>()
                .map_err(|_| invalid_type("request.cache_salt must be a str"))
        })
        .transpose()?;
    Ok(RetentionHints::new(
        priority,
        session,
        cache_salt.as_deref(),
        lora.map(|l| l.1.as_str()),
    ))
}

/// The request's `session_id` (for `BlockStored` events). A look-alike without it has none.
fn session_of(a: &Attrs<'_, '_>) -> PyResult<Option<String>> {
    match a.get(intern!(a.obj.py(), attr::SESSION_ID)) {
        Ok(v) if !v.is_none() => v
            .extract::<String>()
            .map(Some)
            .map_err(|_| invalid_type("request.session_id must be a str or None")),
        _ => Ok(None),
    }
}

/// `(lora_int_id, lora_name)` of the request's LoRA adapter, if any.
fn lora_of(a: &Attrs<'_, '_>) -> PyResult<Option<(i64, String)>> {
    let py = a.obj.py();
    let lora = a.get(intern!(py, attr::LORA_REQUEST))?;
    if lora.is_none() {
        return Ok(None);
    }
    let id = lora
        .getattr(intern!(py, lora_request::LORA_INT_ID))?
        .extract::<i64>()?;
    let name = lora
        .getattr(intern!(py, lora_request::LORA_NAME))?
        .extract::<String>()?;
    Ok(Some((id, name)))
}

impl StoredBlockSource for VllmRequest<'_> {
    fn token_ids(&self) -> &[u32] {
        &self.memo.tokens
    }
    fn event_extra_keys(&self, start: usize, end: usize) -> EventExtraKeys {
        self.memo
            .event_keys
            .as_ref()?
            .as_ref()?
            .event_extra_keys(start, end)
    }
    fn lora_id(&self) -> Option<i64> {
        self.lora.as_ref().map(|l| l.0)
    }
    fn lora_name(&self) -> Option<&str> {
        self.lora.as_ref().map(|l| l.1.as_str())
    }
    fn session_id(&self) -> Option<&str> {
        self.session_id.as_deref()
    }
}

impl RequestView for VllmRequest<'_> {
    fn request_id(&self) -> &str {
        &self.memo.id
    }
    fn num_tokens(&self) -> usize {
        self.num_tokens
    }
    fn num_prompt_tokens(&self) -> usize {
        self.num_prompt_tokens
    }
    fn num_computed_tokens(&self) -> usize {
        self.num_computed_tokens
    }
    fn block_hashes(&self) -> &[BlockHash] {
        &self.memo.hashes
    }
    fn skip_reading_prefix_cache(&self) -> bool {
        self.skip_reading_prefix_cache
    }
    fn num_preemptions(&self) -> usize {
        self.num_preemptions
    }
    fn num_in_flight_tokens(&self) -> usize {
        self.num_in_flight_tokens
    }
    fn shared_prefix_boundary(&self) -> usize {
        self.shared_prefix_boundary
    }
    fn awaiting_admission(&self) -> bool {
        self.awaiting_admission
    }
    fn clamps_to_max_model_len(&self) -> bool {
        true
    }
    fn slot_hint(&self) -> Option<&SlotHint> {
        Some(&self.memo.hint)
    }
    fn retention_hints(&self) -> RetentionHints {
        self.hints.clone()
    }
}

/// A manager call's request: kvblocks' own `Request`, or vLLM's read in place.
pub(crate) enum AnyRequest<'a> {
    /// `kvblocks.Request`.
    Own(&'a Request),
    /// vLLM's `Request` (or a look-alike).
    Vllm(VllmRequest<'a>),
}

impl AnyRequest<'_> {
    fn view(&self) -> &dyn RequestView {
        match self {
            Self::Own(r) => *r,
            Self::Vllm(r) => r,
        }
    }
}

impl StoredBlockSource for AnyRequest<'_> {
    fn token_ids(&self) -> &[u32] {
        self.view().token_ids()
    }
    fn event_extra_keys(&self, start: usize, end: usize) -> EventExtraKeys {
        self.view().event_extra_keys(start, end)
    }
    fn lora_id(&self) -> Option<i64> {
        self.view().lora_id()
    }
    fn lora_name(&self) -> Option<&str> {
        self.view().lora_name()
    }
    fn session_id(&self) -> Option<&str> {
        self.view().session_id()
    }
}

impl RequestView for AnyRequest<'_> {
    fn request_id(&self) -> &str {
        self.view().request_id()
    }
    fn num_tokens(&self) -> usize {
        self.view().num_tokens()
    }
    fn num_prompt_tokens(&self) -> usize {
        self.view().num_prompt_tokens()
    }
    fn num_computed_tokens(&self) -> usize {
        self.view().num_computed_tokens()
    }
    fn block_hashes(&self) -> &[BlockHash] {
        self.view().block_hashes()
    }
    fn skip_reading_prefix_cache(&self) -> bool {
        self.view().skip_reading_prefix_cache()
    }
    fn num_preemptions(&self) -> usize {
        self.view().num_preemptions()
    }
    fn num_in_flight_tokens(&self) -> usize {
        self.view().num_in_flight_tokens()
    }
    fn shared_prefix_boundary(&self) -> usize {
        self.view().shared_prefix_boundary()
    }
    fn hash_block_size(&self) -> Option<usize> {
        self.view().hash_block_size()
    }
    fn awaiting_admission(&self) -> bool {
        self.view().awaiting_admission()
    }
    fn clamps_to_max_model_len(&self) -> bool {
        self.view().clamps_to_max_model_len()
    }
    fn slot_hint(&self) -> Option<&SlotHint> {
        self.view().slot_hint()
    }
    fn retention_hints(&self) -> RetentionHints {
        self.view().retention_hints()
    }
}
