"""KVCacheTensor, KVCacheGroupSpec and KVCacheConfig: fields, equality, validation."""

from __future__ import annotations

import importlib
import itertools
from typing import Any

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


def _config(*specs: kb.KVCacheSpec) -> kb.KVCacheConfig:
    groups = [kb.KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)]
    return kb.KVCacheConfig(100, [], groups)


def test_resolve_block_sizes() -> None:
    assert _config(full()).resolve_block_sizes() == (16, 16)
    assert _config(full()).resolve_block_sizes(dcp_world_size=4) == (64, 64)
    with pytest.raises(ValueError, match="prefix_match_unit"):
        _config(full()).resolve_block_sizes(prefix_match_unit=8)
    # FA bs 32 + SWA bs 16 -> scheduler block size lcm 32, hash block size gcd 16.
    hybrid = _config(full(32), swa())
    assert hybrid.resolve_block_sizes() == (32, 16)
    assert hybrid.resolve_block_sizes(enable_prefix_caching=False) == (32, 32)
    assert hybrid.resolve_block_sizes(enable_prefix_caching=False, connector_enabled=True) == (
        32,
        16,
    )
    assert hybrid.resolve_block_sizes(prefix_match_unit=4) == (32, 4)
    with pytest.raises(ValueError):
        hybrid.resolve_block_sizes(prefix_match_unit=12)
    mamba = kb.MambaSpec(block_size=24, shapes=[(4,)], dtypes=["float32"])
    assert _config(full(), mamba).resolve_block_sizes() == (48, 48)  # lcm(16, 24)
    aligned = kb.MambaSpec(
        block_size=24, shapes=[(4,)], dtypes=["float32"], mamba_cache_mode="align"
    )
    assert _config(full(), aligned).resolve_block_sizes() == (48, 8)  # gcd(16, 24)


@pytest.mark.vllm
def test_resolve_block_sizes_matches_vllm() -> None:
    pytest.importorskip("vllm")
    from types import SimpleNamespace as NS

    torch: Any = importlib.import_module("torch")
    vk: Any = importlib.import_module("vllm.v1.kv_cache_interface")
    utils: Any = importlib.import_module("vllm.v1.core.kv_cache_utils")

    def pair(kind: str, bs: int) -> tuple[Any, kb.KVCacheSpec]:
        attn: dict[str, Any] = dict(block_size=bs, num_kv_heads=2, head_size=64)
        if kind == "full":
            return (
                vk.FullAttentionSpec(**attn, dtype=torch.float16),
                kb.FullAttentionSpec(**attn, dtype="float16"),
            )
        if kind == "swa":
            return (
                vk.SlidingWindowSpec(**attn, dtype=torch.float16, sliding_window=40),
                kb.SlidingWindowSpec(**attn, dtype="float16", sliding_window=40),
            )
        mode = "align" if kind == "mamba_align" else "none"
        m: dict[str, Any] = dict(block_size=bs, shapes=((4,),), mamba_cache_mode=mode)
        return (
            vk.MambaSpec(**m, dtypes=(torch.float32,)),
            kb.MambaSpec(**m, dtypes=("float32",)),
        )

    layouts = [
        [("full", 16)],
        [("swa", 32)],
        [("full", 32), ("swa", 16)],
        [("full", 16), ("swa", 16), ("full", 64)],
        [("full", 16), ("mamba", 24)],
        [("full", 16), ("mamba_align", 24)],
        [("mamba_align", 32), ("swa", 48)],
    ]
    settings = itertools.product((True, False), (False, True), (1, 2), (None, 4, 8, 12, 16))
    for layout, (caching, connector, dcp, unit) in itertools.product(layouts, list(settings)):
        pairs = [pair(kind, bs) for kind, bs in layout]
        names = [f"l{i}" for i in range(len(pairs))]
        theirs_cfg = vk.KVCacheConfig(
            num_blocks=100,
            kv_cache_tensors=[],
            kv_cache_groups=[
                vk.KVCacheGroupSpec([n], t) for n, (t, _) in zip(names, pairs, strict=True)
            ],
        )
        vllm_config = NS(
            cache_config=NS(
                block_size=layout[0][1], enable_prefix_caching=caching, prefix_match_unit=unit
            ),
            parallel_config=NS(decode_context_parallel_size=dcp),
            kv_transfer_config=NS() if connector else None,
        )
        try:
            want: Any = tuple(utils.resolve_kv_cache_block_sizes(theirs_cfg, vllm_config))
        except ValueError:
            want = "error"
        ours_cfg = _config(*(o for _, o in pairs))
        try:
            got: Any = ours_cfg.resolve_block_sizes(
                enable_prefix_caching=caching,
                connector_enabled=connector,
                dcp_world_size=dcp,
                prefix_match_unit=unit,
            )
        except ValueError:
            got = "error"
        assert got == want, (layout, caching, connector, dcp, unit)
