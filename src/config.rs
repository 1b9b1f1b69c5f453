//! The KV cache configuration of a model: the block pool size, the backing tensors and
//! the ordered KV cache groups (vLLM's `KVCacheConfig`, `KVCacheGroupSpec`,
//! `KVCacheTensor`).
//!
//! Groups are ordered: a group's index is the `group_id` baked into block hashes. All
//! groups draw block ids from one pool of `num_blocks` blocks, the null block included.

use crate::error::{KvError, Result};
use crate::spec::KvCacheSpec;

/// One backing allocation shared by some layers (seed-era `KVCacheTensor`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KvCacheTensor {
    /// Size of the allocation in bytes.
    pub size: usize,
    /// Names of the layers that share this tensor.
    pub shared_by: Vec<String>,
}

/// Layers that share one block table (vLLM's `KVCacheGroupSpec`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KvCacheGroupSpec {
    /// Names of the model layers in the group.
    pub layer_names: Vec<String>,
    /// The group's (merged) spec.
    pub kv_cache_spec: KvCacheSpec,
    /// Whether the group holds EAGLE draft layers (takes the last-block drop on hits).
    pub is_eagle_group: bool,
}

/// The KV cache configuration of a model (vLLM's `KVCacheConfig`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KvCacheConfig {
    /// Blocks in the shared pool, the null block included.
    pub num_blocks: usize,
    /// How the workers allocate the cache tensors.
    pub kv_cache_tensors: Vec<KvCacheTensor>,
    /// The ordered KV cache groups.
    pub kv_cache_groups: Vec<KvCacheGroupSpec>,
    /// Retention policy of sliding-window prefix-cache checkpoints (`None` = dense).
    pub prefix_cache_retention_interval: Option<u32>,
}

fn invalid<T>(msg: String) -> Result<T> {
    Err(KvError::InvalidSpec(msg))
}

impl KvCacheConfig {
    /// Builds a config after checking it: `num_blocks >= 1` and every group has at
    /// least one layer. (vLLM checks neither; layer names may repeat across groups, as
    /// vLLM allows.)
    pub fn new(
        num_blocks: usize,
        kv_cache_tensors: Vec<KvCacheTensor>,
        kv_cache_groups: Vec<KvCacheGroupSpec>,
        prefix_cache_retention_interval: Option<u32>,
    ) -> Result<Self> {
        if num_blocks == 0 {
            return invalid("num_blocks must be at least 1 (the null block)".into());
        }
        if let Some(i) = kv_cache_groups
            .iter()
            .position(|g| g.layer_names.is_empty())
        {
            return invalid(format!("KV cache group {i} has no layers"));
        }
        Ok(KvCacheConfig {
            num_blocks,
            kv_cache_tensors,
            kv_cache_groups,
            prefix_cache_retention_interval,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{AttentionParams, Dtype, FullAttentionSpec};

    fn group(names: &[&str]) -> KvCacheGroupSpec {
        let attn = AttentionParams::new(16, 8, 128, Dtype::Float16);
        KvCacheGroupSpec {
            layer_names: names.iter().map(|s| s.to_string()).collect(),
            kv_cache_spec: KvCacheSpec::from(FullAttentionSpec::new(attn))
                .build()
                .unwrap(),
            is_eagle_group: false,
        }
    }

    fn tensor(names: &[&str]) -> KvCacheTensor {
        KvCacheTensor {
            size: 1 << 20,
            shared_by: names.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn builds_valid_config() {
        let c = KvCacheConfig::new(
            10,
            vec![tensor(&["l0"]), tensor(&["l1"])],
            vec![group(&["l0", "l1"])],
            Some(0),
        )
        .unwrap();
        assert_eq!(c.num_blocks, 10);
        assert_eq!(c.kv_cache_groups[0].layer_names, ["l0", "l1"]);
    }

    #[test]
    fn rejects_bad_configs() {
        assert!(KvCacheConfig::new(0, vec![], vec![group(&["a"])], None).is_err());
        assert!(KvCacheConfig::new(4, vec![], vec![group(&[])], None).is_err());
        assert!(KvCacheConfig::new(4, vec![], vec![group(&["a"]), group(&[])], None).is_err());
    }
}
