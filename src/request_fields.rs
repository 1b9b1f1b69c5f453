//! Which of a request's optional fields a manager call reads, given the manager's state.
//! A request view that reads its fields on demand (vLLM's `Request`, read in place by
//! `src/python/vllm_request.rs`) reads only these, besides its counts and block hashes.

use crate::admission;
use crate::kv_cache_manager::KvCacheManager;

/// The optional fields of a request that one manager call reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestFields {
    /// Its tokens, LoRA and session (for `BlockStored` events).
    pub event_tokens: bool,
    /// Its status (for the admission watermark).
    pub status: bool,
    /// Whether it skips the prefix cache, and its preemption count (lookups, stats).
    pub lookup: bool,
    /// Its priority, session and tenant (a retention policy is set).
    pub retention: bool,
    /// Its shared-prefix junction (sparse prefix-cache retention or the Mamba
    /// shared-prefix checkpoint is on).
    pub junction: bool,
}

impl RequestFields {
    /// Counts and block hashes only (`pin`, `unpin`).
    pub const NONE: Self = Self {
        event_tokens: false,
        status: false,
        lookup: false,
        retention: false,
        junction: false,
    };

    /// A prefix-cache lookup (`get_computed_blocks` and its variants) and
    /// `record_prefix_cache_stats`.
    pub const LOOKUP: Self = Self {
        lookup: true,
        ..Self::NONE
    };
}

impl KvCacheManager {
    /// What `allocate_slots` reads: tokens with events on, the status when the watermark
    /// applies, the retention hints with a policy, the junction under sparse retention or
    /// with the Mamba shared-prefix checkpoint.
    pub fn fields_for_allocate(&self, has_scheduled_reqs: bool) -> RequestFields {
        RequestFields {
            event_tokens: self.pool().events_enabled(),
            status: admission::status_matters(self.watermark_blocks(), has_scheduled_reqs),
            lookup: false,
            retention: self.retention_policy().is_some(),
            junction: self.coordinator().reads_junction(),
        }
    }

    /// What `cache_blocks` reads: tokens with events on, the junction under sparse
    /// retention or with the Mamba shared-prefix checkpoint.
    pub fn fields_for_caching(&self) -> RequestFields {
        RequestFields {
            event_tokens: self.pool().events_enabled(),
            junction: self.coordinator().reads_junction(),
            ..RequestFields::NONE
        }
    }
}
