//! [`ManagerParams`]: what a group's manager needs to know about its group, and the
//! mapping from a config's groups to it.

use super::{AttentionKind, ContextParallel};
use crate::config::{GroupRole, KvCacheConfig};
use crate::error::Result;
use crate::spec::KvCacheSpec;

/// What a manager needs to know about its group, independent of how specs are modelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagerParams {
    /// The attention type.
    pub kind: AttentionKind,
    /// Tokens per block of this group.
    pub block_size: usize,
    /// `kv_cache_spec_kind` annotation of this group's `BlockStored` events.
    pub spec_kind: &'static str,
    /// `kv_cache_spec_sliding_window` annotation of this group's `BlockStored` events.
    pub event_sliding_window: Option<u32>,
    /// `KVCacheGroupSpec.is_eagle_group`.
    pub is_eagle_group: bool,
    /// Groups with equal `spec_class` have equal specs: the hybrid coordinator looks
    /// them up together (vLLM compares specs with `==`).
    pub spec_class: usize,
    /// Whether decode context parallelism shards this group's tokens (vLLM's
    /// `dcp_sharded`: attention by default, never Mamba).
    pub dcp_sharded: bool,
    /// The context-parallel world sizes this group sees (set by
    /// [`ContextParallel::apply`], which also scales `block_size`).
    pub context_parallel: ContextParallel,
    /// Whether the spec takes part in prefix caching (vLLM's `prefix_cacheable`: false
    /// for a sliding-window MLA with bounded replay; see also [`Self::caches_prefix`]).
    pub prefix_cacheable: bool,
    /// Whether the group draws from HiSparse's host pool rather than the device pool
    /// (vLLM's `hisparse_source` role, whose manager binds the host pool:
    /// `host_tier.rs`).
    pub host_resident: bool,
}

impl ManagerParams {
    /// Parameters of a group with default annotations and its own spec class.
    pub fn new(kind: AttentionKind, block_size: usize, spec_class: usize) -> Self {
        let window = kind.sliding_window().and_then(|w| u32::try_from(w).ok());
        let kind_is_attention = kind.is_attention();
        Self {
            spec_kind: kind.spec_kind(),
            kind,
            block_size,
            event_sliding_window: window,
            is_eagle_group: false,
            spec_class,
            dcp_sharded: kind_is_attention,
            context_parallel: ContextParallel::NONE,
            prefix_cacheable: true,
            host_resident: false,
        }
    }

    /// Whether the group's blocks are prefix cached at all: its type caches them
    /// ([`AttentionKind::caches_prefix`]) and its spec takes part in prefix caching.
    #[inline]
    pub fn caches_prefix(&self) -> bool {
        self.prefix_cacheable && self.kind.caches_prefix()
    }
}

impl ManagerParams {
    /// One parameter set per group of `config`, in group order: vLLM's spec-to-manager
    /// mapping (MLA is full attention; a uniform group uses its first layer's spec).
    /// Groups with equal specs share a `spec_class`. The `hisparse_source` group draws from
    /// the host pool (vLLM binds its manager's pool to the host; a group merely flagged
    /// `host_resident` stays on the device, as in vLLM), and a model without HiSparse
    /// resident groups needs every hot region.
    pub fn from_config(config: &KvCacheConfig) -> Result<Vec<Self>> {
        let groups = &config.kv_cache_groups;
        let has_resident = groups
            .iter()
            .any(|g| matches!(g.kv_cache_spec, KvCacheSpec::HiSparseResident(_)));
        groups
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let spec = &g.kv_cache_spec;
                let class = groups
                    .iter()
                    .position(|o| o.kv_cache_spec == *spec)
                    .unwrap_or(i);
                let mut kind = AttentionKind::from_spec(spec)?;
                if let AttentionKind::HiSparseHot { always_hot, .. } = &mut kind {
                    *always_hot = !has_resident;
                }
                Ok(Self {
                    kind,
                    block_size: spec.block_size(),
                    spec_kind: spec.kind(),
                    event_sliding_window: spec.sliding_window().map(|w| w as u32),
                    is_eagle_group: g.is_eagle_group,
                    spec_class: class,
                    dcp_sharded: spec.dcp_sharded(),
                    context_parallel: ContextParallel::NONE,
                    prefix_cacheable: spec.prefix_cacheable(),
                    host_resident: g.role == GroupRole::HisparseSource,
                })
            })
            .collect()
    }
}
