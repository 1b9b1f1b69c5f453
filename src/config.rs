//! The KV cache configuration of a model: the block pool size, the backing tensors and
//! the ordered KV cache groups (vLLM's `KVCacheConfig`, `KVCacheGroupSpec`,
//! `KVCacheTensor`).
//!
//! Groups are ordered: a group's index is the `group_id` baked into block hashes. All
//! groups draw block ids from one pool of `num_blocks` blocks, the null block included.

use crate::arith::{gcd, lcm};
use crate::attention::context_parallel;
use crate::error::{KvError, Result};
use crate::spec::{KvCacheSpec, MambaCacheMode};

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
    /// Whether the group's blocks live in the host pool (`hisparse_host_num_blocks`)
    /// rather than the device pool (vLLM 0.33's `host_resident`).
    pub host_resident: bool,
    /// The group's role (vLLM 0.33's `KVCacheGroupRole`).
    pub role: GroupRole,
}

impl KvCacheGroupSpec {
    /// A device group with the default role.
    pub fn new(layer_names: Vec<String>, kv_cache_spec: KvCacheSpec, is_eagle_group: bool) -> Self {
        KvCacheGroupSpec {
            layer_names,
            kv_cache_spec,
            is_eagle_group,
            host_resident: false,
            role: GroupRole::Default,
        }
    }
}

/// What a group is for beyond its spec (vLLM 0.33's `KVCacheGroupRole`): HiSparse's
/// source group (the host-resident KV its resident and hot groups are copies of) and its
/// indexer group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GroupRole {
    /// `"default"`.
    #[default]
    Default,
    /// `"hisparse_source"`.
    HisparseSource,
    /// `"hisparse_indexer"`.
    HisparseIndexer,
}

impl GroupRole {
    /// Every role, in vLLM's order.
    pub const ALL: [GroupRole; 3] = [
        GroupRole::Default,
        GroupRole::HisparseSource,
        GroupRole::HisparseIndexer,
    ];

    /// vLLM's value of the role.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupRole::Default => "default",
            GroupRole::HisparseSource => "hisparse_source",
            GroupRole::HisparseIndexer => "hisparse_indexer",
        }
    }

    /// The role named `value` (vLLM's `KVCacheGroupRole(value)`).
    pub fn parse(value: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|r| r.as_str() == value)
            .ok_or_else(|| {
                KvError::InvalidSpec(format!(
                    "unknown KV cache group role {value:?}; expected one of {:?}",
                    Self::ALL.map(GroupRole::as_str)
                ))
            })
    }
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
    /// Blocks of the HiSparse host pool that host-resident groups draw from (vLLM
    /// 0.33's `hisparse_host_num_blocks`; `None` without HiSparse).
    pub hisparse_host_num_blocks: Option<usize>,
}

/// The engine settings that decide a config's block sizes (vLLM reads them from its
/// `VllmConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizeParams {
    /// `cache_config.enable_prefix_caching`.
    pub enable_prefix_caching: bool,
    /// Whether a KV connector is configured (`kv_transfer_config is not None`).
    pub connector_enabled: bool,
    /// `parallel_config.decode_context_parallel_size`.
    pub dcp_world_size: usize,
    /// `cache_config.prefix_match_unit`: the requested hash block size, if any.
    pub prefix_match_unit: Option<usize>,
}

impl Default for BlockSizeParams {
    /// Prefix caching on, no connector, no DCP, no requested match unit.
    fn default() -> Self {
        BlockSizeParams {
            enable_prefix_caching: true,
            connector_enabled: false,
            dcp_world_size: 1,
            prefix_match_unit: None,
        }
    }
}

/// The token span of one block of `spec` under DCP (`resolve_dcp_kv_block_size`).
fn dcp_block_size(spec: &KvCacheSpec, dcp_world_size: usize) -> Result<usize> {
    context_parallel::dcp_block_size(spec.block_size(), spec.dcp_sharded(), dcp_world_size)
}

/// The scheduler block size of groups with block sizes `sizes`: their lcm (vLLM's
/// `resolve_kv_cache_block_sizes`; 1 for none). `InvalidSpec` on overflow.
pub fn scheduler_block_size(sizes: &[usize]) -> Result<usize> {
    sizes.iter().try_fold(1usize, |acc, &bs| {
        lcm(acc, bs).ok_or_else(|| KvError::InvalidSpec("scheduler block size overflows".into()))
    })
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
            hisparse_host_num_blocks: None,
        })
    }

    /// The config with a HiSparse host pool of `num_blocks` blocks.
    pub fn with_hisparse_host_num_blocks(self, num_blocks: Option<usize>) -> Self {
        KvCacheConfig {
            hisparse_host_num_blocks: num_blocks,
            ..self
        }
    }
}

impl KvCacheConfig {
    /// `(scheduler_block_size, hash_block_size)`, as vLLM 0.33's
    /// `resolve_kv_cache_block_sizes` resolves them (the single group's block size
    /// stands for `cache_config.block_size`):
    /// * no group: an error (vLLM would fall back to `cache_config.block_size`);
    /// * one group: both are its block size, times DCP if the spec is DCP sharded; a
    ///   different `prefix_match_unit` is rejected while hashing is on;
    /// * several groups: the scheduler block size is the lcm of the (DCP scaled) group
    ///   block sizes; the hash block size equals it when neither prefix caching nor a
    ///   connector is on or when a Mamba layer is not in "align" mode, and is otherwise
    ///   `prefix_match_unit` or the gcd of the prefix-cacheable group block sizes (all
    ///   groups' when none is), which it must divide.
    pub fn resolve_block_sizes(&self, p: &BlockSizeParams) -> Result<(usize, usize)> {
        let hashing = p.enable_prefix_caching || p.connector_enabled;
        if p.dcp_world_size == 0 {
            return invalid("dcp_world_size must be at least 1".into());
        }
        let sizes = self
            .kv_cache_groups
            .iter()
            .map(|g| dcp_block_size(&g.kv_cache_spec, p.dcp_world_size))
            .collect::<Result<Vec<usize>>>()?;
        if sizes.is_empty() {
            return invalid("a KV cache config without groups has no block size".into());
        }
        if let [bs] = sizes[..] {
            return match p.prefix_match_unit {
                Some(unit) if unit != bs && hashing => invalid(format!(
                    "Invalid prefix_match_unit={unit}; with a single KV cache group, \
                     prefix-cache hits land on the block size ({bs}). Unset it or set it to {bs}."
                )),
                _ => Ok((bs, bs)),
            };
        }
        let scheduler = scheduler_block_size(&sizes)?;
        let mamba_not_aligned = self.kv_cache_groups.iter().any(|g| {
            layer_specs(&g.kv_cache_spec).any(|s| {
                matches!(s, KvCacheSpec::Mamba(m) if m.mamba_cache_mode != MambaCacheMode::Align)
            })
        });
        if !hashing || mamba_not_aligned {
            return Ok((scheduler, scheduler));
        }
        // Groups that are not prefix cached (circular buffers) do not constrain hashing,
        // unless no group is cached at all.
        let mut hashing_sizes: Vec<usize> = sizes
            .iter()
            .zip(&self.kv_cache_groups)
            .filter(|(_, g)| g.kv_cache_spec.prefix_cacheable())
            .map(|(&bs, _)| bs)
            .collect();
        if hashing_sizes.is_empty() {
            hashing_sizes.clone_from(&sizes);
        }
        let hash = p
            .prefix_match_unit
            .unwrap_or_else(|| hashing_sizes.iter().fold(0, |acc, &bs| gcd(acc, bs)));
        if hash == 0 || hashing_sizes.iter().any(|bs| bs % hash != 0) {
            return invalid(format!(
                "Invalid prefix_match_unit={hash}; prefix-cacheable KV cache group block \
                 sizes must be divisible by prefix_match_unit. Got group block sizes={sizes:?}, \
                 prefix-cacheable={hashing_sizes:?}."
            ));
        }
        Ok((scheduler, hash))
    }
}

/// The per-layer specs of a group spec: a uniform group's members, or the spec itself.
fn layer_specs(spec: &KvCacheSpec) -> Box<dyn Iterator<Item = &KvCacheSpec> + '_> {
    match spec {
        KvCacheSpec::UniformType(u) => Box::new(u.kv_cache_specs.specs()),
        other => Box::new(std::iter::once(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{AttentionParams, Dtype, FullAttentionSpec, MambaSpec, SlidingWindowSpec};

    fn group(names: &[&str]) -> KvCacheGroupSpec {
        let attn = AttentionParams::new(16, 8, 128, Dtype::Float16);
        KvCacheGroupSpec::new(
            names.iter().map(|s| s.to_string()).collect(),
            KvCacheSpec::from(FullAttentionSpec::new(attn))
                .build()
                .unwrap(),
            false,
        )
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
    fn group_roles_round_trip() {
        for role in GroupRole::ALL {
            assert_eq!(GroupRole::parse(role.as_str()).unwrap(), role);
        }
        assert!(matches!(
            GroupRole::parse("hisparse"),
            Err(KvError::InvalidSpec(_))
        ));
        assert_eq!(group(&["a"]).role, GroupRole::Default);
    }

    #[test]
    fn rejects_bad_configs() {
        assert!(KvCacheConfig::new(0, vec![], vec![group(&["a"])], None).is_err());
        assert!(KvCacheConfig::new(4, vec![], vec![group(&[])], None).is_err());
        assert!(KvCacheConfig::new(4, vec![], vec![group(&["a"]), group(&[])], None).is_err());
    }

    fn spec_group(names: &[&str], spec: KvCacheSpec) -> KvCacheGroupSpec {
        KvCacheGroupSpec::new(names.iter().map(|s| s.to_string()).collect(), spec, false)
    }

    fn attn(bs: usize, dtype: Dtype) -> AttentionParams {
        AttentionParams::new(bs, 8, 128, dtype)
    }

    fn config(groups: Vec<KvCacheGroupSpec>) -> KvCacheConfig {
        KvCacheConfig::new(100, vec![], groups, None).unwrap()
    }

    #[test]
    fn block_sizes_single_group() {
        let c = config(vec![group(&["a"])]);
        let p = BlockSizeParams::default();
        assert_eq!(c.resolve_block_sizes(&p).unwrap(), (16, 16));
        let dcp = BlockSizeParams {
            dcp_world_size: 2,
            ..p
        };
        assert_eq!(c.resolve_block_sizes(&dcp).unwrap(), (32, 32));
        let unit = BlockSizeParams {
            prefix_match_unit: Some(8),
            ..p
        };
        assert!(c.resolve_block_sizes(&unit).is_err());
        let off = BlockSizeParams {
            enable_prefix_caching: false,
            ..unit
        };
        assert_eq!(c.resolve_block_sizes(&off).unwrap(), (16, 16));
        assert!(config(vec![]).resolve_block_sizes(&p).is_err());
    }

    #[test]
    fn block_sizes_hybrid() {
        // FA bs 32 (fp16) + SWA bs 16 (fp32): scheduler 32 (lcm), hash 16 (gcd).
        let fa = KvCacheSpec::from(FullAttentionSpec::new(attn(32, Dtype::Float16)));
        let swa = KvCacheSpec::from(SlidingWindowSpec {
            attn: attn(16, Dtype::Float32),
            sliding_window: 64,
            extra_retained_tokens: 0,
        });
        let c = config(vec![
            spec_group(&["fa"], fa.build().unwrap()),
            spec_group(&["swa"], swa.build().unwrap()),
        ]);
        let p = BlockSizeParams::default();
        assert_eq!(c.resolve_block_sizes(&p).unwrap(), (32, 16));
        let off = BlockSizeParams {
            enable_prefix_caching: false,
            ..p
        };
        assert_eq!(c.resolve_block_sizes(&off).unwrap(), (32, 32));
        let unit = BlockSizeParams {
            prefix_match_unit: Some(8),
            ..p
        };
        assert_eq!(c.resolve_block_sizes(&unit).unwrap(), (32, 8));
        let bad = BlockSizeParams {
            prefix_match_unit: Some(12),
            ..p
        };
        assert!(c.resolve_block_sizes(&bad).is_err());

        // lcm(16, 24) = 48; a Mamba group outside "align" mode disables finer hashing.
        let mut m = MambaSpec::new(24, vec![vec![4]], vec![Dtype::Float32]);
        let none = KvCacheSpec::from(m.clone()).build().unwrap();
        let c = config(vec![group(&["a"]), spec_group(&["m"], none)]);
        assert_eq!(c.resolve_block_sizes(&p).unwrap(), (48, 48));
        m.mamba_cache_mode = MambaCacheMode::Align;
        let align = KvCacheSpec::from(m).build().unwrap();
        let c = config(vec![group(&["a"]), spec_group(&["m"], align)]);
        assert_eq!(c.resolve_block_sizes(&p).unwrap(), (48, 8));
        // DCP scales attention groups only.
        let dcp = BlockSizeParams {
            dcp_world_size: 2,
            ..p
        };
        assert_eq!(c.resolve_block_sizes(&dcp).unwrap(), (96, 8));
    }

    /// Regression (found by tests/core/test_no_panic.py): a DCP world size of 0 divided by
    /// zero in the lcm; a huge one overflowed the block size.
    #[test]
    fn bad_dcp_world_size_is_an_error() {
        let c = config(vec![group(&["a"]), group(&["b"])]);
        for dcp_world_size in [0, usize::MAX] {
            let p = BlockSizeParams {
                dcp_world_size,
                ..BlockSizeParams::default()
            };
            assert!(matches!(
                c.resolve_block_sizes(&p),
                Err(KvError::InvalidSpec(_))
            ));
        }
    }
}
