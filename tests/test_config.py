"""KVCacheTensor, KVCacheGroupSpec and KVCacheConfig: fields, equality, validation."""

from __future__ import annotations

import kvblocks as kb
import pytest


def full(block_size: int = 16) -> kb.FullAttentionSpec:
    return kb.FullAttentionSpec(
        block_size=block_size, num_kv_heads=8, head_size=128, dtype="bfloat16"
    )


def swa() -> kb.SlidingWindowSpec:
    return kb.SlidingWindowSpec(
        block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", sliding_window=128
    )


def test_tensor_fields_and_keyword_aliases() -> None:
    t = kb.KVCacheTensor(4096, ["l0", "l1"])
    assert (t.size, t.shared_by, t.layers) == (4096, ["l0", "l1"], ["l0", "l1"])
    assert t == kb.KVCacheTensor(size=4096, shared_by=["l0", "l1"])
    assert t == kb.KVCacheTensor(4096, layers=["l0", "l1"])
    assert t != kb.KVCacheTensor(4096, ["l0"])
    assert repr(t) == "KVCacheTensor(size=4096, shared_by=['l0', 'l1'])"
    with pytest.raises(TypeError):
        kb.KVCacheTensor(4096)
    with pytest.raises(TypeError):
        kb.KVCacheTensor(4096, ["a"], layers=["a"])
    with pytest.raises(TypeError):
        kb.KVCacheTensor(4096, "l0")
    with pytest.raises(ValueError):
        kb.KVCacheTensor(-1, ["l0"])


def test_group_fields() -> None:
    g = kb.KVCacheGroupSpec(["l0", "l1"], swa())
    assert g.layer_names == ["l0", "l1"]
    assert g.kv_cache_spec == swa()
    assert isinstance(g.kv_cache_spec, kb.SlidingWindowSpec)
    assert g.is_eagle_group is False
    assert kb.KVCacheGroupSpec(["d"], full(), is_eagle_group=True).is_eagle_group is True
    assert g == kb.KVCacheGroupSpec(["l0", "l1"], swa())
    assert g != kb.KVCacheGroupSpec(["l0", "l1"], full())
    with pytest.raises(TypeError):
        kb.KVCacheGroupSpec(["l0"], "full")  # type: ignore[arg-type]


def test_config_fields() -> None:
    tensors = [kb.KVCacheTensor(100 * 65536, ["a"]), kb.KVCacheTensor(100 * 65536, ["b"])]
    groups = [kb.KVCacheGroupSpec(["a"], full()), kb.KVCacheGroupSpec(["b"], swa())]
    c = kb.KVCacheConfig(100, tensors, groups)
    assert c.num_blocks == 100
    assert c.kv_cache_tensors == tensors
    assert c.kv_cache_groups == groups
    assert [g.kv_cache_spec for g in c.kv_cache_groups] == [full(), swa()]
    assert c.prefix_cache_retention_interval is None
    c2 = kb.KVCacheConfig(
        num_blocks=100,
        kv_cache_tensors=tensors,
        kv_cache_groups=groups,
        prefix_cache_retention_interval=0,
    )
    assert c2.prefix_cache_retention_interval == 0
    assert c != c2
    assert c == kb.KVCacheConfig(100, tensors, groups)
    with pytest.raises(TypeError):
        hash(c)


def test_config_validation() -> None:
    groups = [kb.KVCacheGroupSpec(["a"], full())]
    with pytest.raises(ValueError, match="num_blocks"):
        kb.KVCacheConfig(0, [], groups)
    with pytest.raises(ValueError):
        kb.KVCacheConfig(-5, [], groups)
    with pytest.raises(ValueError, match="no layers"):
        kb.KVCacheConfig(10, [], [kb.KVCacheGroupSpec([], full())])
    with pytest.raises(ValueError):
        kb.KVCacheConfig(10, [], groups, prefix_cache_retention_interval=-1)
    with pytest.raises(OverflowError):
        kb.KVCacheConfig(10, [], groups, prefix_cache_retention_interval=2**40)
    with pytest.raises(TypeError):
        kb.KVCacheConfig(10, [], [full()])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        kb.KVCacheConfig(10, ["t"], groups)  # type: ignore[list-item]
