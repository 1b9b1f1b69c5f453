"""kvblocks.KVCacheManager: the Python API, worked examples and error handling."""

from __future__ import annotations

import kvblocks as kb
import pytest

BS = 16


def full(bs: int = BS) -> kb.FullAttentionSpec:
    return kb.FullAttentionSpec(block_size=bs, num_kv_heads=2, head_size=8, dtype="float16")


def swa(window: int, bs: int = BS) -> kb.SlidingWindowSpec:
    return kb.SlidingWindowSpec(
        block_size=bs, num_kv_heads=2, head_size=8, dtype="float16", sliding_window=window
    )


def config(num_blocks: int, *specs: kb.KVCacheSpec) -> kb.KVCacheConfig:
    groups = [kb.KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)]
    return kb.KVCacheConfig(num_blocks, [], groups)


HASHER = kb.BlockHasher(BS, "sha256_cbor")


def req(rid: str, tokens: list[int]) -> kb.Request:
    return kb.Request(rid, tokens, HASHER)


def admit(mgr: kb.KVCacheManager, r: kb.Request) -> tuple[list[list[int]], int, object]:
    blocks, hit = mgr.get_computed_blocks(r)
    new = mgr.allocate_slots(r, r.num_tokens - hit, hit, blocks)
    if new is not None:
        r.num_computed_tokens = r.num_tokens
    return list(blocks.get_block_ids()), hit, None if new is None else new.get_block_ids()


def test_trace_a_prefill_and_free_order() -> None:
    mgr = kb.KVCacheManager(config(11, full()), 1024, BS, enable_kv_cache_events=True)
    common = list(range(48))
    r0 = req("0", common + list(range(100, 107)))
    assert admit(mgr, r0) == ([[]], 0, ([1, 2, 3, 4],))
    r1 = req("1", common + list(range(200, 205)))
    assert admit(mgr, r1) == ([[1, 2, 3]], 48, ([5],))
    assert mgr.block_pool.get_ref_cnt(1) == 2
    assert mgr.get_block_ids("1") == ([1, 2, 3, 5],)
    mgr.free(r0)
    mgr.free(r1)
    assert mgr.block_pool.get_free_block_ids() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    events = mgr.take_events()
    stored = [e for e in events if isinstance(e, kb.BlockStored)]
    assert len(stored) == 1 and len(stored[0].block_hashes) == 3
    assert stored[0].kv_cache_spec_kind == "full_attention"
    assert mgr.block_pool.get_block_hash(1) == r0.block_hashes[0]
    assert mgr.block_pool.get_block_hash(4) is None


def test_hybrid_hit_per_group() -> None:
    mgr = kb.KVCacheManager(config(40, full(), swa(32), swa(32)), 1024, BS)
    r0 = req("0", list(range(55)))
    assert admit(mgr, r0)[2] == ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12])
    blocks, hit = mgr.get_computed_blocks(req("1", list(range(48)) + [999] * 7))
    assert (blocks.get_block_ids(), hit) == (([1, 2, 3], [0, 6, 7], [0, 10, 11]), 48)
    mgr.evict_blocks({7, 11})
    assert mgr.get_computed_blocks(req("2", list(range(55))))[1] == 32
    assert mgr.get_num_common_prefix_blocks("0") == [0, 0, 0]


def test_batch_decode_stops_after_first_none() -> None:
    mgr = kb.KVCacheManager(config(4, full()), 1024, BS)
    reqs = [req(f"r{i}", list(range(i * 100, i * 100 + 16))) for i in range(3)]
    for r in reqs:
        assert mgr.allocate_slots(r, 16) is not None
        r.num_computed_tokens = 16
        r.append_output_token_ids([1])
    # 3 requests need a second block each, but no block is free.
    assert mgr.block_pool.get_num_free_blocks() == 0
    assert mgr.allocate_slots_batch(reqs, [1, 1, 1]) == [None]
    mgr.free(reqs[2])
    got = mgr.allocate_slots_batch(reqs, [1, 1, 1])
    assert got == [((3,),), None]
    assert mgr.get_block_ids("r0") == ([1, 3],)
    with pytest.raises(ValueError):
        mgr.allocate_slots_batch(reqs, [1, 1])
    with pytest.raises(ValueError):
        mgr.allocate_slots_batch(reqs, [1, 0, 1])


def test_batch_equals_one_by_one() -> None:
    a = kb.KVCacheManager(config(30, full(), swa(32)), 1024, BS)
    b = kb.KVCacheManager(config(30, full(), swa(32)), 1024, BS)
    ra = [req(f"r{i}", list(range(i, i + 20 + i))) for i in range(4)]
    rb = [req(f"r{i}", list(range(i, i + 20 + i))) for i in range(4)]
    for x, y in zip(ra, rb, strict=True):
        a.allocate_slots(x, x.num_tokens)
        b.allocate_slots(y, y.num_tokens)
    for _ in range(40):
        for r in ra + rb:
            r.num_computed_tokens = r.num_tokens
            r.append_output_token_ids([5])
        one = []
        for r in ra:
            new = a.allocate_slots(r, 1)
            one.append(None if new is None else tuple(map(tuple, new.get_block_ids())))
            if new is None:
                break
        assert b.allocate_slots_batch(rb, [1] * len(rb)) == one
        if one and one[-1] is None:
            break
    assert a.block_pool.get_free_block_ids() == b.block_pool.get_free_block_ids()


def test_batch_entries_without_new_blocks_and_any_sequence() -> None:
    mgr = kb.KVCacheManager(config(40, full(), swa(32)), 1024, BS)
    reqs = [req(f"r{i}", list(range(i * 50, i * 50 + 20))) for i in range(3)]
    for r in reqs:
        assert mgr.allocate_slots(r, r.num_tokens) is not None
        r.num_computed_tokens = r.num_tokens
        r.append_output_token_ids([1])
    # 21 tokens fit in the 2 blocks of each group: no new block for anyone.
    got = mgr.allocate_slots_batch(tuple(reqs), (1, 1, 1))
    assert got == [((), ())] * 3
    assert all(isinstance(g, tuple) for entry in got if entry is not None for g in entry)
    for r in reqs:
        r.append_output_token_ids([2] * 12)
        r.num_computed_tokens = r.num_tokens - 1
    # 33 tokens: each request gets its third block, one per group.
    got = mgr.allocate_slots_batch(reqs, [1, 1, 1])
    entries = [e for e in got if e is not None]
    assert [len(g) for entry in entries for g in entry] == [1, 1] * 3
    assert [mgr.get_block_ids(r.request_id)[0][-1] for r in reqs] == [e[0][0] for e in entries]
    with pytest.raises(TypeError):
        mgr.allocate_slots_batch([reqs[0], "r1"], [1, 1])  # type: ignore[list-item]
    with pytest.raises(OverflowError):
        mgr.allocate_slots_batch(reqs, [1, -1, 1])


def test_results_that_add_nothing_share_one_immutable_empty_blocks() -> None:
    mgr = kb.KVCacheManager(config(10, full()), 1024, BS)
    r = req("r", list(range(20)))
    assert mgr.allocate_slots(r, 20) is not None
    r.num_computed_tokens = 20
    r.append_output_token_ids(7)
    added = mgr.allocate_slots(r, 1)  # 21 tokens fit in the 2 blocks held
    miss, hit = mgr.get_computed_blocks(req("x", [9] * 40))
    assert added is not None and hit == 0
    assert added is miss
    assert added.get_block_ids() == ([],)
    assert added.get_block_ids(allow_none=True) is None
    with pytest.raises(AttributeError):
        added.blocks = [[1]]  # type: ignore[attr-defined]
    assert mgr.get_block_ids("r") == ([1, 2],)


def test_kv_cache_blocks_api() -> None:
    x = kb.KVCacheBlocks([[1, 2], []])
    y = kb.KVCacheBlocks([[3], [4]])
    assert (x + y).get_block_ids() == ([1, 2, 3], [4])
    assert kb.KVCacheBlocks([[], []]).get_block_ids(allow_none=True) is None
    assert x == kb.KVCacheBlocks([[1, 2], []])
    assert x != y


def test_bad_input_raises_and_changes_nothing() -> None:
    mgr = kb.KVCacheManager(config(11, full()), 1024, BS)
    r = req("a", list(range(40)))
    mgr.allocate_slots(r, 40)
    r.num_computed_tokens = 40
    before = (mgr.block_pool.get_free_block_ids(), mgr.get_block_ids("a"))
    with pytest.raises(ValueError):
        mgr.allocate_slots(r, 0)
    with pytest.raises(OverflowError):
        mgr.allocate_slots(r, -1)
    with pytest.raises(TypeError):
        mgr.allocate_slots(r, 1, new_computed_blocks=[[1]])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        mgr.allocate_slots("a", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        mgr.allocate_slots(r, 4, 8, kb.KVCacheBlocks([[1]]))  # a running request
    with pytest.raises(ValueError):
        mgr.block_pool.get_ref_cnt(11)
    assert (mgr.block_pool.get_free_block_ids(), mgr.get_block_ids("a")) == before
    # Silent no-ops, as vLLM's scheduler relies on them.
    mgr.free(req("never", [1, 2, 3]))
    assert mgr.get_block_ids("never") == ([],)
    mgr.free(r)
    mgr.free(r)
    assert mgr.block_pool.get_num_free_blocks() == 10
    assert mgr.usage == 0.0


def test_invalid_configs() -> None:
    with pytest.raises(ValueError):
        kb.KVCacheManager(config(11, full(32)), 1024, BS)  # hash 16 != block 32, one group
    mamba = kb.MambaSpec(block_size=1024, shapes=[[4]], dtypes=["float32"])
    with pytest.raises(kb.UnsupportedError, match="align"):
        # Mamba prefix caching needs align mode (vLLM 0.33 asserts it; 0.32 allows it)
        kb.KVCacheManager(config(11, full(), mamba), 1024, BS)
    mgr = kb.KVCacheManager(config(11, full(), mamba), 1024, BS, enable_caching=False)
    assert mgr.num_kv_cache_groups == 2


def test_retention_interval_set_after_construction() -> None:
    """A `retention_interval` assigned after construction caches as a manager built with
    it: under retention 0 Mamba "align" keeps only the state at the replay boundary (69
    tokens, floored to 64), not every block-aligned state as dense caching does."""
    mamba = kb.MambaSpec(block_size=BS, shapes=[[4]], dtypes=["float32"], mamba_cache_mode="align")

    def manager(retention: int | None) -> kb.KVCacheManager:
        groups = [kb.KVCacheGroupSpec(["f"], full()), kb.KVCacheGroupSpec(["m"], mamba)]
        return kb.KVCacheManager(kb.KVCacheConfig(40, [], groups, retention), 1024, BS)

    def hashed(mgr: kb.KVCacheManager) -> list[bool]:
        r = req("0", list(range(70)))
        for n in (32, 16, 22):
            assert mgr.allocate_slots(r, n) is not None
            r.num_computed_tokens += n
        pool = mgr.block_pool
        return [pool.get_block_hash(b) is not None for b in range(pool.num_gpu_blocks)]

    assigned = manager(None)
    assigned.retention_interval = 0
    assert assigned.retention_interval == 0
    assert hashed(assigned) == hashed(manager(0)) != hashed(manager(None))


def test_stats_and_reset() -> None:
    mgr = kb.KVCacheManager(config(11, full()), 1024, BS, log_stats=True)
    r = req("a", list(range(40)))
    mgr.record_prefix_cache_stats(r, 16)
    r.num_preemptions = 1
    mgr.record_prefix_cache_stats(r, 32)
    s = mgr.make_prefix_cache_stats()
    assert s is not None
    assert (s.requests, s.queries, s.hits) == (1, 40, 16)
    assert (s.preempted_requests, s.preempted_queries, s.preempted_hits) == (1, 40, 32)
    mgr.allocate_slots(r, 40)
    assert not mgr.reset_prefix_cache()
    mgr.free(r)
    assert mgr.reset_prefix_cache()
    s = mgr.make_prefix_cache_stats()
    assert s is not None and s.reset and s.requests == 0
    plain = kb.KVCacheManager(config(11, full()), 1024, BS)
    assert plain.make_prefix_cache_stats() is None


@pytest.mark.parametrize("counted", [False, True])
def test_null_block_refs_counted_as_vllm_0_32(counted: bool) -> None:
    """`count_null_block_refs` (vLLM 0.32): a table whose skipped prefix was nulled counts
    the null block down when it is freed, and `pop_blocks_for_free` keeps the leading
    nulls. Off (0.33): never counted, and a popped table starts at its first real block.
    (The pool's `touch` counts it up: test_block_pool.py.)"""
    mgr = kb.KVCacheManager(config(20, swa(32)), 1024, BS, count_null_block_refs=counted)
    tokens = list(range(6 * BS))
    r0 = req("0", tokens)
    admit(mgr, r0)
    mgr.remove_skipped_blocks("0", r0.num_tokens)
    table = mgr.get_block_ids("0")[0]
    nulls = table.index(next(b for b in table if b != 0))
    assert nulls > 0 and table[:nulls] == [0] * nulls
    # A second request hits the first one's window; its out-of-window hits become
    # nulls in its table without being touched (both releases).
    r1 = req("1", [*tokens, 999])
    _, hit, _ = admit(mgr, r1)
    r1_nulls = mgr.get_block_ids("1")[0].count(0)
    assert hit > 0 and r1_nulls > 0
    assert mgr.block_pool.get_ref_cnt(0) == 0
    popped = mgr.pop_blocks_for_free(r0)
    assert popped == (table if counted else table[nulls:])
    mgr.block_pool.free_blocks(popped[::-1])
    mgr.free(r1)
    expected = -nulls - r1_nulls if counted else 0
    assert mgr.block_pool.get_ref_cnt(0) == expected
    assert mgr.block_objects([0])[0].ref_cnt == expected
    assert mgr.block_pool.get_num_free_blocks() == 19
