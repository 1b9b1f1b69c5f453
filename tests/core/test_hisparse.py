"""HiSparse's specs and group fields (vLLM 0.33's `HiSparseHotSpec`, `HiSparseResidentSpec`,
`KVCacheGroupSpec.host_resident` / `role`, `KVCacheConfig.hisparse_host_num_blocks`) in the
core, the layouts the manager refuses as vLLM's `HiSparseCoordinator` does, and its
coordinator calls through Python (`hisparse_*`), on a write-back trace read off vLLM 0.33.0.
"""

from __future__ import annotations

import math

import kvblocks as kb
import pytest

BS = 16


def full() -> kb.FullAttentionSpec:
    return kb.FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype="float32")


def hot(blocks_per_request: int = 2) -> kb.HiSparseHotSpec:
    return kb.HiSparseHotSpec(
        block_size=BS, page_size=BS * 4, blocks_per_request=blocks_per_request
    )


def resident() -> kb.HiSparseResidentSpec:
    return kb.HiSparseResidentSpec(block_size=BS, page_size=BS * 4)


def test_spec_fields_page_size_and_classes() -> None:
    h, r = hot(3), resident()
    assert (h.block_size, h.page_size, h.blocks_per_request) == (BS, 64, 3)
    assert (r.block_size, r.page_size) == (BS, 64)
    assert h.page_size_bytes == r.page_size_bytes == 64
    assert isinstance(h, kb.KVCacheSpec) and not isinstance(h, kb.AttentionSpec)
    assert isinstance(r, kb.KVCacheSpec) and not isinstance(r, kb.HiSparseHotSpec)
    assert h == hot(3) and h != hot(2) and hash(h) == hash(hot(3))
    assert repr(h) == "HiSparseHotSpec(block_size=16, page_size=64, blocks_per_request=3)"
    assert repr(r) == "HiSparseResidentSpec(block_size=16, page_size=64)"
    with pytest.raises(kb.InvalidSpecError):
        kb.HiSparseResidentSpec(block_size=0, page_size=64)


def test_max_memory_and_admission_cap() -> None:
    # The hot region is fixed; resident pages cover the tokens in flight, at most the
    # model length (older pages live on the host).
    assert hot(3).max_memory_usage_bytes(max_model_len=10_000) == 3 * 64
    r = resident()
    assert r.max_admission_blocks_per_request(256, 10_000) == math.ceil(256 / BS)
    assert r.max_admission_blocks_per_request(256, 40) == math.ceil(40 / BS)
    got = r.max_memory_usage_bytes(
        max_model_len=10_000, max_num_batched_tokens=200, max_concurrent_batches=2
    )
    assert got == math.ceil(400 / BS) * 64


def test_uniform_groups_and_merge_need_one_class() -> None:
    assert kb.UniformTypeKVCacheSpecs.is_uniform_type({"a": hot(), "b": hot()})
    assert not kb.UniformTypeKVCacheSpecs.is_uniform_type({"a": hot(), "b": resident()})
    assert kb.KVCacheSpec.merge([resident(), resident()]) == resident()
    with pytest.raises(kb.InvalidSpecError):
        kb.KVCacheSpec.merge([hot(2), hot(3)])


def test_group_role_and_host_fields() -> None:
    g = kb.KVCacheGroupSpec(["source"], full(), host_resident=True, role="hisparse_source")
    assert (g.host_resident, g.role) == (True, "hisparse_source")
    plain = kb.KVCacheGroupSpec(["source"], full())
    assert (plain.host_resident, plain.role) == (False, "default")
    assert g != plain
    assert "host_resident=True, role='hisparse_source'" in repr(g)
    with pytest.raises(kb.InvalidSpecError, match="hisparse_indexer"):
        kb.KVCacheGroupSpec(["x"], full(), role="hisparse")
    c = kb.KVCacheConfig(32, [], [g], hisparse_host_num_blocks=16)
    assert c.hisparse_host_num_blocks == 16
    assert kb.KVCacheConfig(32, [], [plain]).hisparse_host_num_blocks is None


def _groups(**kw: bool) -> list[kb.KVCacheGroupSpec]:
    """vLLM 0.33's HiSparse layout (`tests/v1/core/test_prefix_caching.py`): the
    host-resident source, its device indexer, the resident pages and the hot region."""
    groups = [
        kb.KVCacheGroupSpec(["source"], full(), host_resident=True, role="hisparse_source"),
        kb.KVCacheGroupSpec(["indexer"], full(), role="hisparse_indexer"),
        kb.KVCacheGroupSpec(["resident"], resident()),
        kb.KVCacheGroupSpec(["hot"], hot()),
    ]
    keep = [kw.get(name, True) for name in ("source", "indexer", "resident", "hot")]
    return [g for g, k in zip(groups, keep, strict=True) if k]


@pytest.mark.parametrize(
    ("groups", "host_blocks", "match"),
    [
        (_groups(source=False), 16, "need a hisparse_source group"),
        (_groups(source=False, resident=False), 16, "need a hisparse_source group"),
        (_groups(), None, "no hisparse_host_num_blocks"),
        ([*_groups()[2:], *_groups()[:2]], 16, "must precede the resident groups"),
    ],
)
def test_layouts_vllm_refuses(
    groups: list[kb.KVCacheGroupSpec], host_blocks: int | None, match: str
) -> None:
    config = kb.KVCacheConfig(32, [], groups, hisparse_host_num_blocks=host_blocks)
    with pytest.raises(kb.InvalidArgumentError, match=match):
        kb.KVCacheManager(config, 128, BS)


def test_write_back_through_the_coordinator_calls() -> None:
    # vLLM 0.33.0, the same layout and calls: transfers, their references, the host
    # prefix published once they complete, and the free order with unpinned pages first.
    config = kb.KVCacheConfig(32, [], _groups(), hisparse_host_num_blocks=16)
    mgr = kb.KVCacheManager(config, 128, BS)
    a = kb.Request("a", list(range(40)), kb.BlockHasher(BS))
    new = mgr.allocate_slots(a, 40)
    assert new is not None and new.get_block_ids() == ([1, 2, 3], [1, 2, 3], [4, 5, 6], [])
    a.num_computed_tokens = 40
    mgr.hisparse_advance_scheduled([("a", 40)])
    assert mgr.hisparse_build_offload_command() == [
        (0, 1, [4], True, False),
        (1, 2, [5], True, False),
    ]
    assert mgr.hisparse_build_offload_command() == []
    assert mgr.hisparse_has_pending_work()
    mgr.hisparse_update_spills({0: 1, 1: 1}, {0: 1, 1: 1})
    state = mgr.hisparse_request_state("a")
    assert state is not None
    assert (state["valid_pages"], state["ready_prefix_pages"]) == ([0, 1], 2)
    assert state["pinned_clean"] == [0, 1] and not mgr.hisparse_has_pending_work()
    assert mgr.hisparse_take_residency_updates(["a"]) == [("a", [0, 1, 2], [[4, 5, 6]])]
    assert mgr.hisparse_take_residency_updates(["a"]) == []
    assert mgr.hisparse_hot("a") == (False, False)
    mgr.free_request("a", False)
    assert mgr.hisparse_request_state("a") is None


def test_indexer_group_is_a_plain_full_attention_group() -> None:
    # Only the source role picks another manager in vLLM; the indexer is full attention.
    config = kb.KVCacheConfig(32, [], _groups(source=False, resident=False, hot=False))
    mgr = kb.KVCacheManager(config, 128, BS)
    assert mgr.usage == 0.0


def test_host_pool_view_events_join_the_managers_queue() -> None:
    # vLLM 0.33.0's `test_hisparse_events_report_host_and_device_placement`: host pages
    # are stored and removed as `CPU`, device pages as `GPU`, in one queue.
    config = kb.KVCacheConfig(32, [], _groups(), hisparse_host_num_blocks=16)
    mgr = kb.KVCacheManager(config, 128, BS, enable_kv_cache_events=True)
    a = kb.Request("a", list(range(64)), kb.BlockHasher(BS))
    assert mgr.allocate_slots(a, 64) is not None
    a.num_computed_tokens = 64
    mgr.hisparse_advance_scheduled([("a", 64)])
    done = {t[0]: 1 for t in mgr.hisparse_build_offload_command() or []}
    mgr.hisparse_update_spills(done, done)
    # The published pages' GPU copies: the resident blocks 5..8 of pages 0..3.
    assert sorted(blocks for _, group, blocks in mgr.hisparse_copies() if group == 0) == [
        [5],
        [6],
        [7],
        [8],
    ]
    stored = [e for e in mgr.take_events() if isinstance(e, kb.BlockStored)]
    assert {(e.group_idx, e.medium) for e in stored} == {(0, "CPU"), (1, "GPU")}
    host = mgr.hisparse_host_pool
    assert host is not None and host.medium == "CPU"
    host_block = mgr.get_block_ids("a")[0][0]
    host.evict_blocks({host_block})
    [removed] = mgr.take_events()
    assert isinstance(removed, kb.BlockRemoved)
    assert (removed.medium, removed.group_idx) == ("CPU", 0)
    assert (
        kb.KVCacheManager(kb.KVCacheConfig(32, [], [_groups()[1]]), 128, BS).hisparse_host_pool
        is None
    )
