"""Decode and prefill context parallelism in `kvblocks.KVCacheManager`
(`dcp_world_size`, `pcp_world_size`): the block size of each group, the groups a world
size shards, hits at the sharded block size, and the configurations vLLM 0.33 refuses.
vLLM-side equality: tests/vllm/test_vllm_manager.py (the `*dcp*` configs)."""

from __future__ import annotations

from typing import Any

import kvblocks as kb
import pytest

ATTN: dict[str, Any] = {"num_kv_heads": 2, "head_size": 8, "dtype": "float16"}


def full(block_size: int = 16, **kw: Any) -> Any:
    return kb.FullAttentionSpec(block_size=block_size, **ATTN, **kw)


def swa(block_size: int = 16, **kw: Any) -> Any:
    return kb.SlidingWindowSpec(block_size=block_size, sliding_window=48, **ATTN, **kw)


def manager(specs: list[Any], hash_block_size: int, **kw: Any) -> kb.KVCacheManager:
    groups = [kb.KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)]
    return kb.KVCacheManager(kb.KVCacheConfig(64, [], groups), 4096, hash_block_size, **kw)


def test_dcp_scales_sharded_groups_and_keeps_replicated_ones() -> None:
    m = manager([full(), swa(dcp_sharded=False)], 16, dcp_world_size=4, pcp_world_size=2)
    assert m.group_block_sizes == [64, 16]
    assert m.group_context_parallel_sizes == [(4, 2), (1, 1)]


def test_pcp_alone_keeps_the_block_size() -> None:
    m = manager([full()], 16, pcp_world_size=4)
    assert m.group_block_sizes == [16]
    assert m.group_context_parallel_sizes == [(1, 4)]


def test_hits_land_on_sharded_blocks() -> None:
    m = manager([full()], 32, dcp_world_size=2)
    hasher = kb.BlockHasher(32, "sha256_cbor")
    prompt = list(range(100))
    first = kb.Request("a", prompt, hasher)
    blocks = m.allocate_slots(first, len(prompt))
    assert blocks is not None
    assert len(blocks.get_block_ids()[0]) == 4  # cdiv(100, 32)
    m.free(first)
    _, hit = m.get_computed_blocks(kb.Request("b", prompt, hasher))
    assert hit == 96


@pytest.mark.parametrize("sizes", [{"dcp_world_size": 0}, {"pcp_world_size": -1}])
def test_world_size_below_one_is_an_argument_error(sizes: dict[str, int]) -> None:
    with pytest.raises(kb.InvalidArgumentError):
        manager([full()], 16, **sizes)


def test_hash_block_size_must_be_the_sharded_block_size() -> None:
    with pytest.raises(kb.InvalidArgumentError, match="hash_block_size"):
        manager([full()], 16, dcp_world_size=2)


def test_sharded_sliding_window_refused_with_caching_only() -> None:
    with pytest.raises(kb.UnsupportedError, match="context parallelism"):
        manager([swa()], 32, dcp_world_size=2)
    m = manager([swa()], 32, dcp_world_size=2, enable_caching=False)
    assert m.group_block_sizes == [32]


def test_hybrid_refuses_a_sharded_sliding_window() -> None:
    with pytest.raises(kb.InvalidArgumentError, match="DCP with hybrid"):
        manager([full(), swa()], 32, dcp_world_size=2)
