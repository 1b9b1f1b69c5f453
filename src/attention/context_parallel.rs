//! Decode and prefill context parallelism (vLLM's `dcp_world_size` and
//! `pcp_world_size`): which groups they shard, the block size a sharded group's manager
//! works at, and the configurations vLLM 0.33 refuses.
//!
//! Under DCP each rank keeps every `dcp`-th token of a sharded cache, so one block id
//! stands for `block_size × dcp` tokens of the sequence: the manager of a DCP-sharded
//! group allocates, caches, hashes and hits at that size (vLLM's
//! `SingleTypeKVCacheManager.block_size`). A replicated group (`dcp_sharded = False`:
//! Mamba, replicated draft layers) keeps its own block size and world sizes of 1. PCP
//! changes no block geometry in vLLM 0.33; it is recorded per group and checked.
//!
//! NOTE 1: this runs once, at construction; the managers only ever read the scaled
//! `block_size`, so configurations without context parallelism pay nothing.

use super::ManagerParams;
use crate::error::{KvError, Result};

/// The tokens one block of a group holds under DCP (vLLM's `resolve_dcp_kv_block_size`):
/// `block_size × dcp_world_size` if DCP shards the group, else `block_size`.
pub fn dcp_block_size(
    block_size: usize,
    dcp_sharded: bool,
    dcp_world_size: usize,
) -> Result<usize> {
    if !dcp_sharded {
        return Ok(block_size);
    }
    block_size
        .checked_mul(dcp_world_size)
        .ok_or_else(|| KvError::InvalidSpec("block_size * dcp_world_size overflows".into()))
}

/// The context-parallel world sizes of a manager, or (in [`ManagerParams`]) of one
/// group: `1` for a replicated group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextParallel {
    /// Decode context parallel ranks.
    pub dcp_world_size: usize,
    /// Prefill context parallel ranks.
    pub pcp_world_size: usize,
}

impl Default for ContextParallel {
    fn default() -> Self {
        Self::NONE
    }
}

impl ContextParallel {
    /// No context parallelism (vLLM's defaults).
    pub const NONE: Self = Self {
        dcp_world_size: 1,
        pcp_world_size: 1,
    };

    /// The given world sizes; each must be positive.
    pub fn new(dcp_world_size: usize, pcp_world_size: usize) -> Result<Self> {
        if dcp_world_size == 0 || pcp_world_size == 0 {
            return Err(KvError::InvalidArgument(format!(
                "dcp_world_size ({dcp_world_size}) and pcp_world_size ({pcp_world_size}) \
                 must be positive"
            )));
        }
        Ok(Self {
            dcp_world_size,
            pcp_world_size,
        })
    }

    /// Whether any of the two runs on more than one rank.
    #[inline]
    pub fn is_parallel(&self) -> bool {
        self.dcp_world_size > 1 || self.pcp_world_size > 1
    }

    /// The world sizes a group sees: these if DCP shards it, none otherwise (vLLM's
    /// `dcp_world_size if kv_cache_spec.dcp_sharded else 1`, the same for PCP).
    #[inline]
    pub fn for_group(self, dcp_sharded: bool) -> Self {
        if dcp_sharded {
            self
        } else {
            Self::NONE
        }
    }

    /// Applies these world sizes to `groups` (in group order, as the manager is built
    /// with `enable_caching`): each group records the sizes it sees and a DCP-sharded
    /// group's `block_size` is multiplied by `dcp_world_size`. Refuses what vLLM 0.33
    /// refuses:
    /// * with prefix caching and several groups (the hybrid coordinator), DCP needs
    ///   every group to be full attention or replicated, and PCP every group to be full
    ///   attention or a replicated attention group;
    /// * with prefix caching, a sharded group whose type cannot look hits up across
    ///   ranks (sliding window, chunked local: vLLM asserts in their lookups).
    pub fn apply(self, groups: &mut [ManagerParams], enable_caching: bool) -> Result<()> {
        if !self.is_parallel() {
            return Ok(());
        }
        let hybrid = enable_caching && groups.len() > 1;
        for (i, g) in groups.iter_mut().enumerate() {
            let own = self.for_group(g.dcp_sharded);
            if hybrid {
                self.check_hybrid_group(g, i)?;
            }
            if enable_caching && own.is_parallel() && !g.kind.supports_context_parallel_hits() {
                return Err(KvError::Unsupported(format!(
                    "group {i} ({}): prefix caching with decode or prefill context \
                     parallelism is supported for full attention only (vLLM 0.33)",
                    g.spec_kind
                )));
            }
            g.block_size = dcp_block_size(g.block_size, g.dcp_sharded, self.dcp_world_size)?;
            g.context_parallel = own;
        }
        Ok(())
    }

    /// The hybrid coordinator's check of group `i` (vLLM's `HybridKVCacheCoordinator`).
    fn check_hybrid_group(self, g: &ManagerParams, i: usize) -> Result<()> {
        let (full, replicated) = (g.kind.is_full_attention(), !g.dcp_sharded);
        if self.pcp_world_size > 1 && !(full || replicated && g.kind.is_attention()) {
            return Err(KvError::InvalidArgument(format!(
                "group {i} ({}): PCP only supports full attention and replicated draft groups",
                g.spec_kind
            )));
        }
        if self.dcp_world_size > 1 && !(full || replicated) {
            return Err(KvError::InvalidArgument(format!(
                "group {i} ({}): DCP with hybrid KV cache layouts only supports \
                 full-attention, Mamba, and replicated draft groups",
                g.spec_kind
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::AttentionKind as K;

    fn swa() -> K {
        K::SlidingWindow {
            sliding_window: 64,
            extra_retained_tokens: 0,
        }
    }

    fn mamba() -> K {
        K::Mamba {
            num_speculative_blocks: 0,
            align: true,
            checkpoint_alignment: None,
        }
    }

    fn cp(dcp: usize, pcp: usize) -> ContextParallel {
        ContextParallel::new(dcp, pcp).unwrap()
    }

    #[test]
    fn zero_world_size_is_an_argument_error() {
        assert!(matches!(
            ContextParallel::new(0, 1),
            Err(KvError::InvalidArgument(_))
        ));
        assert!(matches!(
            ContextParallel::new(2, 0),
            Err(KvError::InvalidArgument(_))
        ));
    }

    #[test]
    fn dcp_scales_sharded_groups_only() {
        let mut draft = ManagerParams::new(K::FullAttention, 16, 1);
        draft.dcp_sharded = false;
        let mut groups = vec![
            ManagerParams::new(K::FullAttention, 16, 0),
            draft,
            ManagerParams::new(mamba(), 16, 2),
        ];
        cp(8, 1).apply(&mut groups, true).unwrap();
        let sizes: Vec<usize> = groups.iter().map(|g| g.block_size).collect();
        assert_eq!(sizes, [128, 16, 16]);
        assert_eq!(groups[0].context_parallel, cp(8, 1));
        assert_eq!(groups[1].context_parallel, ContextParallel::NONE);
        assert_eq!(groups[2].context_parallel, ContextParallel::NONE);
    }

    #[test]
    fn pcp_keeps_block_sizes() {
        let mut groups = vec![ManagerParams::new(K::FullAttention, 16, 0)];
        cp(1, 4).apply(&mut groups, true).unwrap();
        assert_eq!(groups[0].block_size, 16);
        assert_eq!(groups[0].context_parallel, cp(1, 4));
    }

    #[test]
    fn sharded_sliding_window_is_refused_with_caching_only() {
        let mut groups = vec![ManagerParams::new(swa(), 16, 0)];
        assert!(matches!(
            cp(2, 1).apply(&mut groups.clone(), true),
            Err(KvError::Unsupported(_))
        ));
        cp(2, 1).apply(&mut groups, false).unwrap();
        assert_eq!(groups[0].block_size, 32);
    }

    #[test]
    fn hybrid_accepts_replicated_sliding_window_and_mamba_under_dcp() {
        let mut draft = ManagerParams::new(swa(), 16, 1);
        draft.dcp_sharded = false;
        let mut groups = vec![ManagerParams::new(K::FullAttention, 16, 0), draft];
        cp(4, 4).apply(&mut groups, true).unwrap();
        assert_eq!(groups[1].block_size, 16);
        let mut with_mamba = vec![
            ManagerParams::new(K::FullAttention, 16, 0),
            ManagerParams::new(mamba(), 16, 1),
        ];
        cp(2, 1).apply(&mut with_mamba.clone(), true).unwrap();
        // PCP takes attention groups only.
        assert!(matches!(
            cp(1, 2).apply(&mut with_mamba, true),
            Err(KvError::InvalidArgument(_))
        ));
    }

    #[test]
    fn hybrid_refuses_a_sharded_sliding_window_under_dcp() {
        let mut groups = vec![
            ManagerParams::new(K::FullAttention, 16, 0),
            ManagerParams::new(swa(), 16, 1),
        ];
        assert!(matches!(
            cp(2, 1).apply(&mut groups, true),
            Err(KvError::InvalidArgument(_))
        ));
    }
}
