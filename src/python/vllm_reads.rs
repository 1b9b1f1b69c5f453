//! The names kvblocks reads on vLLM's objects, in one place: the attributes of vLLM's
//! `Request` (and of the LoRA and multimodal objects it holds) that the request view
//! (`vllm_request.rs`) and the request hasher (`request_hasher.rs`) read, and the
//! `RequestStatus` values the view compares with.
//!
//! The readers use these constants, and the module exports the same lists as
//! `VLLM_ATTRIBUTES_READ` and `VLLM_REQUEST_STATUSES`, which `kvblocks.vllm`'s drift guard
//! checks against the installed vLLM before it installs anything: a vLLM that renames one
//! is refused at `install()` instead of misread at step time.

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::admission::RequestStatus;

/// Attributes of vLLM's `Request`.
pub(crate) mod request {
    pub(crate) const REQUEST_ID: &str = "request_id";
    pub(crate) const ALL_TOKEN_IDS: &str = "_all_token_ids";
    pub(crate) const BLOCK_HASHES: &str = "block_hashes";
    pub(crate) const STATUS: &str = "status";
    pub(crate) const SKIP_READING_PREFIX_CACHE: &str = "skip_reading_prefix_cache";
    pub(crate) const NUM_PREEMPTIONS: &str = "num_preemptions";
    pub(crate) const NUM_PROMPT_TOKENS: &str = "num_prompt_tokens";
    pub(crate) const NUM_COMPUTED_TOKENS: &str = "num_computed_tokens";
    pub(crate) const NUM_IN_FLIGHT_TOKENS: &str = "num_in_flight_tokens";
    pub(crate) const SHARED_PREFIX_BOUNDARY: &str = "shared_prefix_boundary";
    pub(crate) const PRIORITY: &str = "priority";
    pub(crate) const SESSION_ID: &str = "session_id";
    pub(crate) const CACHE_SALT: &str = "cache_salt";
    pub(crate) const LORA_REQUEST: &str = "lora_request";
    pub(crate) const MM_FEATURES: &str = "mm_features";
    pub(crate) const PROMPT_EMBEDS: &str = "prompt_embeds";
}

/// Attributes of vLLM's `LoRARequest` (`request.lora_request`).
pub(crate) mod lora_request {
    pub(crate) const LORA_INT_ID: &str = "lora_int_id";
    pub(crate) const LORA_NAME: &str = "lora_name";
    pub(crate) const LORA_PATH: &str = "lora_path";
}

/// Attributes of vLLM's `MultiModalFeatureSpec` (an item of `request.mm_features`).
pub(crate) mod mm_feature {
    pub(crate) const IDENTIFIER: &str = "identifier";
    pub(crate) const MM_POSITION: &str = "mm_position";
}

/// Attributes of vLLM's `PlaceholderRange` (`feature.mm_position`).
pub(crate) mod placeholder_range {
    pub(crate) const OFFSET: &str = "offset";
    pub(crate) const LENGTH: &str = "length";
}

/// vLLM's `RequestStatus.WAITING` (an `IntEnum`).
const STATUS_WAITING: i64 = 1;
/// vLLM's `RequestStatus.PREEMPTED`.
const STATUS_PREEMPTED: i64 = 6;

/// The core's status for the value of vLLM's `RequestStatus`.
pub(crate) fn request_status(value: i64) -> RequestStatus {
    match value {
        STATUS_WAITING => RequestStatus::Waiting,
        STATUS_PREEMPTED => RequestStatus::Preempted,
        _ => RequestStatus::Other,
    }
}

/// Every attribute read above, by the name of vLLM's class that holds it.
const ATTRIBUTES_READ: [(&str, &[&str]); 4] = [
    (
        "Request",
        &[
            request::REQUEST_ID,
            request::ALL_TOKEN_IDS,
            request::BLOCK_HASHES,
            request::STATUS,
            request::SKIP_READING_PREFIX_CACHE,
            request::NUM_PREEMPTIONS,
            request::NUM_PROMPT_TOKENS,
            request::NUM_COMPUTED_TOKENS,
            request::NUM_IN_FLIGHT_TOKENS,
            request::SHARED_PREFIX_BOUNDARY,
            request::PRIORITY,
            request::SESSION_ID,
            request::CACHE_SALT,
            request::LORA_REQUEST,
            request::MM_FEATURES,
            request::PROMPT_EMBEDS,
        ],
    ),
    (
        "LoRARequest",
        &[
            lora_request::LORA_INT_ID,
            lora_request::LORA_NAME,
            lora_request::LORA_PATH,
        ],
    ),
    (
        "MultiModalFeatureSpec",
        &[mm_feature::IDENTIFIER, mm_feature::MM_POSITION],
    ),
    (
        "PlaceholderRange",
        &[placeholder_range::OFFSET, placeholder_range::LENGTH],
    ),
];

/// Every `RequestStatus` value compared with, by its member name.
const REQUEST_STATUSES: [(&str, i64); 2] =
    [("WAITING", STATUS_WAITING), ("PREEMPTED", STATUS_PREEMPTED)];

/// Adds `VLLM_ATTRIBUTES_READ` (`((class name, (attribute, ...)), ...)`) and
/// `VLLM_REQUEST_STATUSES` (`((member name, value), ...)`) to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let attributes = ATTRIBUTES_READ
        .iter()
        .map(|(class, names)| (*class, PyTuple::new(py, names.iter()).map(Bound::unbind)))
        .map(|(class, names)| names.map(|n| (class, n)))
        .collect::<PyResult<Vec<_>>>()?;
    m.add("VLLM_ATTRIBUTES_READ", PyTuple::new(py, attributes)?)?;
    m.add("VLLM_REQUEST_STATUSES", PyTuple::new(py, REQUEST_STATUSES)?)?;
    Ok(())
}
