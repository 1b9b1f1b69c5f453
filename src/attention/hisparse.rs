//! HiSparse (vLLM 0.33's host-resident sparse-MLA KV): the per-request block counts of
//! its device-side specs, and the refusal of its groups by the managers.
//!
//! vLLM 0.33 runs a HiSparse model on three groups beside its device groups: a
//! host-resident source group (role `hisparse_source`, a full-attention table in a second,
//! host block pool of `hisparse_host_num_blocks`), resident groups (GPU copies of the
//! source's pages) and hot groups (a fixed per-request region). Their managers are driven
//! by `vllm.v1.hisparse.coordinator.HiSparseCoordinator`, which publishes source hashes
//! only once the worker reports a page durable on the host, pins and unpins resident
//! pages (`BlockPool.unpin_blocks`: a block counted free but read until reused) and plans
//! spills. kvblocks has no such coordinator, so it converts the specs and the group
//! fields but refuses to build managers for them ([`unsupported`]).

use crate::arith::cdiv;
use crate::error::KvError;

/// The most blocks one request holds in a hot group: its hot region.
#[inline]
pub(crate) fn hot_max_blocks_per_request(blocks_per_request: usize) -> usize {
    blocks_per_request
}

/// The per-request admission cap of a resident group (vLLM's
/// `HiSparseResidentSpec.max_admission_blocks_per_request`): the blocks of the tokens in
/// flight, at most the model length; older pages live on the host.
#[inline]
pub(crate) fn resident_max_admission_blocks(
    bs: usize,
    max_in_flight_tokens: usize,
    max_model_len: usize,
) -> usize {
    cdiv(max_in_flight_tokens.min(max_model_len), bs)
}

/// A HiSparse group (hot, resident, or the host-resident source) cannot be managed.
#[cold]
pub(crate) fn unsupported(what: &str) -> KvError {
    KvError::Unsupported(format!(
        "HiSparse {what}: its groups are driven by vLLM's HiSparseCoordinator (host \
         publication after durable write-back, resident page unpinning, spills), which \
         kvblocks does not implement"
    ))
}
