//! HiSparse (vLLM 0.33's host-resident sparse-MLA KV): what its two device-side kinds
//! share, a request's per-group HiSparse state ([`HiSparseRow`]).
//!
//! vLLM 0.33 runs a HiSparse model on three groups beside its device groups: a
//! host-resident source group (role `hisparse_source`: full attention in a second, host
//! block pool, `crate::host_tier`), resident groups (GPU copies of the source's pages,
//! `hisparse_resident.rs`) and hot groups (a fixed per-request region,
//! `hisparse_hot.rs`). Their managers are driven by vLLM's `HiSparseCoordinator`, which
//! publishes source hashes once the host holds a page, pins and unpins resident pages and
//! plans spills.

use rustc_hash::FxHashMap;

use crate::types::BlockId;

/// One request's HiSparse state in one group (default: none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HiSparseRow {
    /// Hot groups: the request needs its hot region (vLLM's `hot_required`).
    pub hot_required: bool,
    /// Resident groups: pages read from another block than the table's, or from none
    /// (the null block) (vLLM's `residency_changes[request_id]`); the table stays
    /// append-only.
    pub residency: FxHashMap<usize, BlockId>,
}
