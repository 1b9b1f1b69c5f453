//! The hybrid coordinator's rule for vLLM 0.33's fine-grained ("partial") prefix-cache
//! hits (`partial_hash_hits_enabled`, `eagle_proof_margin`): hits that end on a hash
//! block boundary inside a group's block. The hit's shared tail block is then copied
//! on write (`attention/copy_on_write.rs`).

use crate::attention::{AttentionKind, ManagerParams};

/// Whether a type's hit lookup can probe hash boundaries inside its blocks (vLLM's
/// `supports_fine_grained_hash_lookup`): full attention (sink, R-SWA) and Mamba.
#[inline]
pub(crate) fn supports_fine_grained_lookup(kind: &AttentionKind) -> bool {
    kind.is_full_attention() || matches!(kind, AttentionKind::Mamba { .. })
}

/// vLLM's `partial_hash_hits_enabled` for the hybrid coordinator: some "align" Mamba
/// group's block is coarser than a hash block (with decode context parallelism over
/// `dcp_world_size > 1` ranks, at least as coarse), and every other prefix-cached group
/// can look hash boundaries up inside its blocks or has hash-sized blocks.
pub(crate) fn enabled(groups: &[ManagerParams], hash_block_size: usize) -> bool {
    let dcp = groups
        .iter()
        .map(|g| g.context_parallel.dcp_world_size)
        .max()
        .unwrap_or(1);
    let coarse_mamba = groups.iter().any(|g| {
        matches!(g.kind, AttentionKind::Mamba { align: true, .. })
            && if dcp == 1 {
                g.block_size > hash_block_size
            } else {
                g.block_size >= hash_block_size
            }
    });
    coarse_mamba
        && groups.iter().all(|g| {
            !g.caches_prefix()
                || supports_fine_grained_lookup(&g.kind)
                || g.block_size == hash_block_size
        })
}

/// vLLM's `eagle_proof_margin`: the tokens an EAGLE lookup reads past its limit before
/// dropping them: one hash block where a fine-grained lookup probes inside a coarser
/// block, one group block otherwise.
#[inline]
pub(crate) fn eagle_proof_margin(
    block_size: usize,
    hash_block_size: usize,
    fine_grained_lookup: bool,
) -> usize {
    if fine_grained_lookup && block_size > hash_block_size {
        hash_block_size
    } else {
        block_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mamba(bs: usize) -> ManagerParams {
        let kind = AttentionKind::Mamba {
            num_speculative_blocks: 0,
            align: true,
            checkpoint_alignment: None,
        };
        ManagerParams::new(kind, bs, 1)
    }

    fn swa(bs: usize) -> ManagerParams {
        let kind = AttentionKind::SlidingWindow {
            sliding_window: 64,
            extra_retained_tokens: 0,
        };
        ManagerParams::new(kind, bs, 2)
    }

    #[test]
    fn enabled_by_a_coarse_align_mamba_block() {
        let full = ManagerParams::new(AttentionKind::FullAttention, 16, 0);
        assert!(enabled(&[full.clone(), mamba(32)], 16));
        assert!(!enabled(&[full.clone(), mamba(16)], 16));
        // A sliding window cannot look inside its blocks: only hash-sized ones allow it.
        assert!(enabled(&[full.clone(), mamba(32), swa(16)], 16));
        assert!(!enabled(&[full, mamba(32), swa(32)], 16));
    }

    #[test]
    fn eagle_margin_is_one_hash_block_when_fine_grained() {
        assert_eq!(eagle_proof_margin(32, 16, true), 16);
        assert_eq!(eagle_proof_margin(32, 16, false), 32);
        assert_eq!(eagle_proof_margin(16, 16, true), 16);
    }
}
