"""Behaviour of `kvblocks.BlockPool`: vLLM 0.33.0's BlockPool ordering (two worked traces,
checked against vLLM), events, reset, and bad input leaving the pool unchanged."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import kvblocks as kb
import pytest

BS = 16
MASK64 = (1 << 64) - 1


def chain_hashes(tokens: Sequence[int], block_size: int = BS) -> list[bytes]:
    """A stand-in for vLLM's request.block_hashes: one chained digest per full block."""
    out: list[bytes] = []
    parent = b"none"
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tokens[start : start + block_size]
        parent = hashlib.sha256(parent + b"".join(t.to_bytes(4, "little") for t in block)).digest()
        out.append(parent)
    return out


def external(h: bytes) -> int:
    return int.from_bytes(h, "big") & MASK64


class Req:
    """A request as the manager drives the pool: tokens, hashes and a block table."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.hashes = chain_hashes(tokens)
        self.blocks: list[int] = []
        self.num_cached = 0


def hit(pool: kb.BlockPool, req: Req) -> list[int]:
    """The longest cached prefix of `req` (group 0), as `find_longest_cache_hit`."""
    out: list[int] = []
    for h in req.hashes:
        got = pool.get_cached_block(h, [0])
        if got is None:
            break
        out.extend(got)
    return out


def schedule(pool: kb.BlockPool, req: Req) -> list[int]:
    """Hit, touch, allocate the rest, cache the full blocks; returns the new blocks."""
    hits = hit(pool, req)
    pool.touch(hits)
    need = -(-len(req.tokens) // BS) - len(hits)
    new = pool.get_new_blocks(need)
    req.blocks = hits + new
    req.num_cached = len(hits)
    full = len(req.tokens) // BS
    pool.cache_full_blocks(req.hashes, req.blocks, req.num_cached, full, BS, 0, req.tokens)
    req.num_cached = max(req.num_cached, full)
    return new


def finish(pool: kb.BlockPool, req: Req) -> None:
    pool.free_blocks(req.blocks[::-1])


def snapshot(pool: kb.BlockPool, hashes: Sequence[bytes] = ()) -> tuple[Any, ...]:
    n = pool.num_gpu_blocks
    return (
        pool.get_free_block_ids(),
        pool.get_num_free_blocks(),
        pool.get_usage(),
        [pool.get_ref_cnt(b) for b in range(n)],
        [pool.get_block_hash(b) for b in range(n)],
        [pool.get_cached_block(h, [0, 1]) for h in hashes],
        [pool.get_cached_block(h, [0]) for h in hashes],
    )


def test_construction() -> None:
    pool = kb.BlockPool(11)
    assert (pool.num_gpu_blocks, pool.enable_caching, pool.hash_block_size) == (11, True, 16)
    assert pool.enable_kv_cache_events is False
    assert pool.get_num_free_blocks() == 10
    assert pool.get_free_block_ids() == list(range(1, 11))
    assert pool.get_usage() == 0.0
    assert pool.get_ref_cnt(0) == 0
    assert pool.take_events() == []
    assert "num_gpu_blocks=11" in repr(pool)
    assert kb.BlockPool(1).get_usage() == 0.0


def test_trace_a_prefill() -> None:
    pool = kb.BlockPool(11, enable_caching=True, hash_block_size=BS, enable_kv_cache_events=True)
    common = list(range(3 * BS))
    req0 = Req([*common, *range(100, 107)])
    assert schedule(pool, req0) == [1, 2, 3, 4]
    req1 = Req([*common, *range(200, 205)])
    assert hit(pool, req1) == [1, 2, 3]
    assert schedule(pool, req1) == [5]
    assert [pool.get_ref_cnt(b) for b in (1, 2, 3, 4, 5)] == [2, 2, 2, 1, 1]
    finish(pool, req0)
    finish(pool, req1)
    assert pool.get_free_block_ids() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    pool.take_events()

    req2 = Req([*common, *range(300, 306)])
    assert schedule(pool, req2) == [5]
    assert pool.take_events() == []  # nothing evicted, nothing newly full
    finish(pool, req2)
    assert pool.get_free_block_ids() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    req3 = Req(list(range(1000, 1160)))
    hits = hit(pool, req3)
    assert hits == []
    assert pool.get_new_blocks(10) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    removed = [kb.BlockRemoved([external(h)], "GPU", 0) for h in reversed(req0.hashes)]
    assert pool.take_events() == removed
    assert all(pool.get_block_hash(b) is None for b in range(11))
    assert pool.get_usage() == 1.0


def test_trace_b_touch_keeps_hit_blocks() -> None:
    pool = kb.BlockPool(3, enable_kv_cache_events=True)
    req0 = Req(list(range(BS)))
    req1 = Req(list(range(100, 100 + BS)))
    assert schedule(pool, req0) == [1]
    assert schedule(pool, req1) == [2]
    finish(pool, req0)
    finish(pool, req1)
    assert pool.get_free_block_ids() == [1, 2]
    pool.take_events()
    req2 = Req(list(range(2 * BS)))
    assert schedule(pool, req2) == [2]
    assert req2.blocks == [1, 2]
    assert pool.take_events() == [
        kb.BlockRemoved([external(req1.hashes[0])], "GPU", 0),
        kb.BlockStored(
            block_hashes=[external(req2.hashes[1])],
            parent_block_hash=external(req2.hashes[0]),
            token_ids=req2.tokens[BS:],
            block_size=BS,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            extra_keys=[None],
            group_idx=0,
        ),
    ]


def test_caching_off_frees_lifo() -> None:
    pool = kb.BlockPool(8, enable_caching=False)
    blocks = pool.get_new_blocks(3)
    assert blocks == [1, 2, 3]
    pool.free_blocks(blocks[::-1])
    assert pool.get_free_block_ids() == [3, 2, 1, 4, 5, 6, 7]
    assert pool.get_new_blocks(3) == [3, 2, 1]


def test_free_order_given_is_kept() -> None:
    pool = kb.BlockPool(8)
    tokens = list(range(4 * BS))
    hashes = chain_hashes(tokens)
    blocks = pool.get_new_blocks(6)
    pool.cache_full_blocks(hashes, blocks, 0, 4, BS, 0)
    # Hashed blocks go to the tail in the given order, unhashed ones to the head.
    pool.free_blocks([blocks[2], blocks[5], blocks[0], blocks[4], blocks[3], blocks[1]])
    assert pool.get_free_block_ids() == [6, 5, 7, 3, 1, 4, 2]


def test_id_sequences_of_any_kind() -> None:
    pool = kb.BlockPool(8)
    ids = pool.get_new_blocks(4)
    pool.touch(tuple(ids))
    pool.touch(range(1, 5))
    assert [pool.get_ref_cnt(b) for b in ids] == [3, 3, 3, 3]
    pool.free_blocks(range(4, 0, -1))
    pool.free_blocks((4, 3, 2, 1))
    pool.free_blocks([4, 3, 2, 1])
    assert pool.get_free_block_ids() == [4, 3, 2, 1, 5, 6, 7]


def test_shared_block_is_freed_when_last_reference_drops() -> None:
    pool = kb.BlockPool(4)
    [b] = pool.get_new_blocks(1)
    pool.touch([b, b])
    assert pool.get_ref_cnt(b) == 3
    pool.free_blocks([b, b])
    assert pool.get_ref_cnt(b) == 1
    assert b not in pool.get_free_block_ids()
    pool.free_blocks([b])
    assert pool.get_free_block_ids()[0] == b


def test_touch_unlinks_free_cached_block() -> None:
    pool = kb.BlockPool(6)
    hashes = chain_hashes(list(range(2 * BS)))
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(hashes, blocks, 0, 2, BS, 0)
    pool.free_blocks(blocks[::-1])
    assert pool.get_free_block_ids() == [3, 4, 5, 2, 1]
    pool.touch([1])
    assert pool.get_free_block_ids() == [3, 4, 5, 2]
    assert pool.get_ref_cnt(1) == 1


def test_duplicates_first_inserted_wins() -> None:
    pool = kb.BlockPool(6, enable_kv_cache_events=True)
    tokens = list(range(BS))
    hashes = chain_hashes(tokens)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks(hashes, [a], 0, 1, BS, 0, tokens)
    pool.cache_full_blocks(hashes, [b], 0, 1, BS, 0, tokens)
    assert pool.get_block_hash(a) == pool.get_block_hash(b) == hashes[0]
    assert pool.get_cached_block(hashes[0], [0]) == [a]
    assert pool.get_cached_block(hashes[0], [1]) is None
    assert pool.get_cached_block(hashes[0], [0, 1]) is None
    pool.evict_blocks({a})
    assert pool.get_cached_block(hashes[0], [0]) == [b]
    assert pool.get_block_hash(a) is None
    pool.evict_blocks({b})
    assert pool.get_cached_block(hashes[0], [0]) is None
    events = pool.take_events()
    assert [type(e) for e in events] == [kb.BlockStored] * 2 + [kb.BlockRemoved] * 2


def test_groups_are_separate_keys() -> None:
    pool = kb.BlockPool(6)
    hashes = chain_hashes(list(range(BS)))
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks(hashes, [a], 0, 1, BS, 0)
    pool.cache_full_blocks(hashes, [b], 0, 1, BS, 1)
    assert pool.get_cached_block(hashes[0], [0, 1]) == [a, b]
    assert pool.get_cached_block(hashes[0], [1, 0]) == [b, a]


def test_larger_block_uses_last_hash_inside() -> None:
    pool = kb.BlockPool(6, hash_block_size=4, enable_kv_cache_events=True)
    tokens = list(range(16))
    hashes = chain_hashes(tokens, 4)  # 4 hashes at 4 tokens
    blocks = pool.get_new_blocks(2)  # 2 blocks of 8 tokens
    pool.cache_full_blocks(hashes, blocks, 0, 1, 8, 0, tokens)
    pool.cache_full_blocks(hashes, blocks, 1, 2, 8, 0, tokens)
    assert [pool.get_block_hash(b) for b in blocks] == [hashes[1], hashes[3]]
    first, second = pool.take_events()
    assert isinstance(first, kb.BlockStored) and isinstance(second, kb.BlockStored)
    assert (first.block_hashes, first.parent_block_hash) == ([external(hashes[1])], None)
    assert first.token_ids == tokens[:8]
    assert second.parent_block_hash == external(hashes[1])
    assert second.token_ids == tokens[8:]
    assert second.block_size == 8


def test_null_blocks_are_skipped() -> None:
    pool = kb.BlockPool(6, enable_kv_cache_events=True)
    tokens = list(range(3 * BS))
    hashes = chain_hashes(tokens)
    [b] = pool.get_new_blocks(1)
    before = snapshot(pool, hashes)
    pool.free_blocks([0])
    pool.touch([0, 0])
    pool.evict_blocks({0})
    assert snapshot(pool, hashes) == before
    pool.cache_full_blocks(hashes, [0, 0, b], 0, 3, BS, 0, tokens)
    assert pool.get_ref_cnt(0) == 0
    assert pool.get_block_hash(0) is None
    [event] = pool.take_events()
    assert isinstance(event, kb.BlockStored)
    assert event.block_hashes == [external(hashes[2])]
    assert event.token_ids == tokens  # the whole range, skipped blocks included
    assert event.extra_keys == [None]


def test_stored_event_fields() -> None:
    pool = kb.BlockPool(8, enable_kv_cache_events=True)
    tokens = list(range(3 * BS + 5))
    hashes = chain_hashes(tokens)
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(hashes, blocks, 0, 1, BS, 2, tokens)
    pool.cache_full_blocks(hashes, blocks, 1, 3, BS, 2, tokens)
    pool.cache_full_blocks(hashes, blocks, 3, 3, BS, 2, tokens)  # nothing newly full
    first, second = pool.take_events()
    assert first == kb.BlockStored(
        [external(hashes[0])], None, tokens[:BS], BS, None, "GPU", None, [None], 2
    )
    assert isinstance(second, kb.BlockStored)
    assert second.block_hashes == [external(h) for h in hashes[1:3]]
    assert second.parent_block_hash == external(hashes[0])
    assert second.token_ids == tokens[BS : 3 * BS]
    assert second.group_idx == 2
    assert second.extra_keys == [None, None]
    assert (second.kv_cache_spec_kind, second.session_id, second.locality) == (None, None, None)
    assert pool.take_events() == []


def test_events_off_records_nothing() -> None:
    pool = kb.BlockPool(4)
    hashes = chain_hashes(list(range(BS)))
    blocks = pool.get_new_blocks(1)
    pool.cache_full_blocks(hashes, blocks, 0, 1, BS, 0, list(range(BS)))
    pool.evict_blocks(set(blocks))
    assert pool.take_events() == []


def test_evict_blocks_keeps_queue_position_and_follows_set_order() -> None:
    pool = kb.BlockPool(12, enable_kv_cache_events=True)
    tokens = list(range(10 * BS))
    hashes = chain_hashes(tokens)
    blocks = pool.get_new_blocks(10)
    pool.cache_full_blocks(hashes, blocks, 0, 10, BS, 0, tokens)
    pool.free_blocks(blocks[5:][::-1])
    pool.take_events()
    queue = pool.get_free_block_ids()
    ids = {9, 2, 7, 4}
    pool.evict_blocks(ids)
    assert pool.get_free_block_ids() == queue
    assert [pool.get_ref_cnt(b) for b in (2, 4, 7, 9)] == [1, 1, 0, 0]
    assert pool.take_events() == [kb.BlockRemoved([external(hashes[b - 1])], "GPU", 0) for b in ids]
    pool.evict_blocks([9, 2])  # already uncached: no event
    assert pool.take_events() == []


def test_reset_prefix_cache() -> None:
    pool = kb.BlockPool(6, enable_kv_cache_events=True)
    tokens = list(range(2 * BS))
    hashes = chain_hashes(tokens)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(hashes, blocks, 0, 2, BS, 0, tokens)
    pool.take_events()
    assert pool.reset_prefix_cache() is False
    assert pool.take_events() == []
    assert pool.get_cached_block(hashes[0], [0]) == [blocks[0]]
    pool.free_blocks(blocks[::-1])
    queue = pool.get_free_block_ids()
    assert pool.reset_prefix_cache() is True
    assert pool.take_events() == [kb.AllBlocksCleared()]
    assert pool.get_free_block_ids() == queue
    assert all(pool.get_block_hash(b) is None for b in range(6))
    assert pool.get_cached_block(hashes[0], [0]) is None
    # Reallocating a reset block evicts nothing.
    pool.get_new_blocks(5)
    assert pool.take_events() == []


def test_event_classes() -> None:
    stored = kb.BlockStored(
        block_hashes=[1, 2],
        parent_block_hash=None,
        token_ids=[5, 6],
        block_size=1,
        lora_id=None,
        medium="GPU",
        lora_name="adapter",
        extra_keys=[("adapter", ("img", 3), b"\x00", True, None, -1), None],
        group_idx=0,
    )
    assert stored.extra_keys == [("adapter", ("img", 3), b"\x00", True, None, -1), None]
    assert stored.lora_name == "adapter"
    assert stored.lookahead_token_ids is None
    same = kb.BlockStored(
        [1, 2], None, [5, 6], 1, None, "GPU", "adapter",
        [("adapter", ("img", 3), b"\x00", True, None, -1), None], 0,
    )  # fmt: skip
    assert stored == same and hash(stored) == hash(same)
    assert stored != kb.BlockStored([1, 2], None, [5, 6], 1, None, "GPU", "adapter")
    assert kb.BlockStored.__struct_fields__[:4] == [
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
    ]
    assert repr(stored).startswith("BlockStored(block_hashes=[1, 2], parent_block_hash=None,")
    assert "lora_name='adapter'" in repr(stored)
    removed = kb.BlockRemoved(block_hashes=[7], medium="GPU", group_idx=1)
    assert (removed.block_hashes, removed.medium, removed.group_idx) == ([7], "GPU", 1)
    assert removed != kb.BlockRemoved([7], "GPU", 2)
    assert repr(removed) == (
        "BlockRemoved(block_hashes=[7], medium='GPU', group_idx=1, locality=None, ownership=None)"
    )
    assert kb.AllBlocksCleared() == kb.AllBlocksCleared()
    assert repr(kb.AllBlocksCleared()) == "AllBlocksCleared()"
    assert removed != kb.AllBlocksCleared()
    with pytest.raises(AttributeError):
        removed.medium = "CPU"  # type: ignore[misc]
    with pytest.raises(TypeError):
        kb.BlockStored([1], None, [], 1, None, "GPU", None, [[1, 2]])
    with pytest.raises(TypeError):
        kb.BlockStored([1], None, [], 1, None, "GPU", None, [(1.5,)])
    with pytest.raises(OverflowError):
        kb.BlockStored([1], None, [], 1, None, "GPU", None, [(1 << 70,)])
    with pytest.raises(OverflowError):
        kb.BlockRemoved([-1], "GPU")


def _bad_calls(
    pool: kb.BlockPool, hashes: list[bytes], in_use: list[int], free: int
) -> list[tuple[type[Exception], Callable[[], object]]]:
    n = pool.num_gpu_blocks
    a = in_use[0]
    return [
        (OverflowError, lambda: pool.get_new_blocks(-1)),
        (ValueError, lambda: pool.get_new_blocks(pool.get_num_free_blocks() + 1)),
        (OverflowError, lambda: pool.get_new_blocks(1 << 70)),
        (TypeError, lambda: pool.get_new_blocks("1")),  # type: ignore[arg-type]
        (ValueError, lambda: pool.free_blocks([a, n])),
        (ValueError, lambda: pool.free_blocks([a, free])),
        (ValueError, lambda: pool.free_blocks([a, a])),
        (OverflowError, lambda: pool.free_blocks([a, -1])),
        (TypeError, lambda: pool.free_blocks([a, 1.5])),  # type: ignore[list-item]
        (TypeError, lambda: pool.free_blocks("ab")),  # type: ignore[arg-type]
        (TypeError, lambda: pool.free_blocks(None)),  # type: ignore[arg-type]
        (ValueError, lambda: pool.touch([free, n + 5])),
        (OverflowError, lambda: pool.touch([free, 1 << 40])),
        (ValueError, lambda: pool.cache_full_blocks(hashes, in_use, 0, 5, BS, 0)),
        (ValueError, lambda: pool.cache_full_blocks(hashes[:1], in_use, 0, 2, BS, 0)),
        (ValueError, lambda: pool.cache_full_blocks(hashes, [in_use[1], n], 0, 2, BS, 0)),
        (ValueError, lambda: pool.cache_full_blocks(hashes, in_use, 0, 1, BS + 1, 0)),
        (ValueError, lambda: pool.cache_full_blocks(hashes, in_use, 0, 1, 0, 0)),
        (ValueError, lambda: pool.cache_full_blocks([b"\x01" * 33, *hashes], in_use, 0, 1, BS, 0)),
        (TypeError, lambda: pool.cache_full_blocks(["ab", *hashes], in_use, 0, 1, BS, 0)),  # type: ignore[list-item]
        (OverflowError, lambda: pool.cache_full_blocks(hashes, in_use, -1, 1, BS, 0)),
        (OverflowError, lambda: pool.cache_full_blocks(hashes, in_use, 0, 1, BS, -1)),
        (ValueError, lambda: pool.cache_full_blocks(hashes, [in_use[1], a], 0, 2, BS, 0)),
        (TypeError, lambda: pool.cache_full_blocks(hashes, in_use[1:], 0, 1, BS, 0, ["x"])),  # type: ignore[list-item]
        (OverflowError, lambda: pool.cache_full_blocks(hashes, in_use[1:], 0, 1, BS, 0, [-1])),
        (ValueError, lambda: pool.get_cached_block(b"\x00" * 33, [0])),
        (TypeError, lambda: pool.get_cached_block("abc", [0])),  # type: ignore[arg-type]
        (OverflowError, lambda: pool.get_cached_block(hashes[0], [-1])),
        (ValueError, lambda: pool.evict_blocks({a, n})),
        (OverflowError, lambda: pool.evict_blocks({a, -1})),
        (TypeError, lambda: pool.evict_blocks(3)),  # type: ignore[arg-type]
        (ValueError, lambda: pool.get_ref_cnt(n)),
        (OverflowError, lambda: pool.get_ref_cnt(-1)),
        (ValueError, lambda: pool.get_block_hash(n)),
        (ValueError, lambda: pool.unpin_blocks([a, 0], print)),
        (ValueError, lambda: pool.unpin_blocks([a, n], print)),
        (ValueError, lambda: pool.unpin_blocks([a, free], print)),
        (ValueError, lambda: pool.unpin_blocks([a, a], print)),
        (OverflowError, lambda: pool.unpin_blocks([a, -1], print)),
        (TypeError, lambda: pool.unpin_blocks([a], 3)),  # type: ignore[arg-type]
    ]


def test_bad_input_raises_and_changes_nothing() -> None:
    pool = kb.BlockPool(8, enable_kv_cache_events=True)
    tokens = list(range(3 * BS))
    hashes = chain_hashes(tokens)
    in_use = pool.get_new_blocks(3)
    pool.cache_full_blocks(hashes, in_use, 0, 1, BS, 0, tokens)  # block in_use[0] cached
    free = pool.get_free_block_ids()[0]
    pool.take_events()
    for exc, call in _bad_calls(pool, hashes, in_use, free):
        before = snapshot(pool, hashes)
        with pytest.raises(exc):
            call()
        assert snapshot(pool, hashes) == before, call
        assert pool.take_events() == []


@pytest.mark.parametrize(
    ("args", "exc"),
    [((0,), ValueError), ((-1,), OverflowError), ((4, True, 0), ValueError), (("4",), TypeError)],
)
def test_bad_construction(args: tuple[Any, ...], exc: type[Exception]) -> None:
    with pytest.raises(exc):
        kb.BlockPool(*args)


@pytest.mark.parametrize("counted", [False, True])
def test_null_block_refs_counted_as_vllm_0_32(counted: bool) -> None:
    """With `count_null_block_refs` (vLLM 0.32) touch and free_blocks count the null
    block's ref_cnt, which may go negative; it never enters the free queue either way."""
    pool = kb.BlockPool(6, count_null_block_refs=counted)
    blocks = pool.get_new_blocks(2)
    pool.touch([0, 0, blocks[0]])
    assert pool.get_ref_cnt(0) == (2 if counted else 0)
    pool.free_blocks([0, 0, 0, blocks[0], blocks[0], blocks[1]])
    assert pool.get_ref_cnt(0) == (-1 if counted else 0)
    assert 0 not in pool.get_free_block_ids() and pool.get_num_free_blocks() == 5
    with pytest.raises(kb.DoubleFreeError):
        pool.free_blocks([0, blocks[1]])
    assert pool.get_ref_cnt(0) == (-1 if counted else 0)  # a failed free changes nothing


def test_unpin_blocks_reports_reuse_in_vllm_order() -> None:
    """`unpin_blocks`: the queue orders and callback orders of vLLM 0.33.0's `BlockPool`
    on the same calls (tests/vllm/test_vllm_block_pool.py replays random ones on both)."""
    reused: list[int] = []
    pool = kb.BlockPool(6)
    assert pool.get_new_blocks(5) == [1, 2, 3, 4, 5]
    pool.touch([2])
    pool.unpin_blocks([4, 2, 1], reused.append)
    assert pool.get_free_block_ids() == [4, 1]  # the tail, in the given order
    assert [pool.get_ref_cnt(b) for b in (1, 2, 4)] == [0, 1, 0]
    pool.free_blocks([5, 3])
    assert pool.get_free_block_ids() == [5, 3, 4, 1]
    assert pool.get_new_blocks(2) == [5, 3]
    assert reused == []
    pool.free_blocks([5, 3])
    pool.unpin_blocks([2], reused.append)
    assert pool.get_new_blocks(4) == [5, 3, 4, 1]
    assert reused == [4, 1]
    pool.free_blocks([1])
    assert pool.get_new_blocks(2) == [1, 2]
    assert reused == [4, 1, 2]  # each block reports once

    # A reset reports every watched block, in the order each was first unpinned.
    reused.clear()
    pool = kb.BlockPool(6, enable_kv_cache_events=True)
    pool.get_new_blocks(5)
    pool.unpin_blocks([3], reused.append)
    pool.unpin_blocks([1, 4], reused.append)
    pool.touch([3])
    pool.unpin_blocks([3], reused.append)  # keeps its first place
    pool.free_blocks([2, 5])
    assert pool.reset_prefix_cache()
    assert reused == [3, 1, 4]
    assert pool.get_free_block_ids() == [2, 5, 1, 4, 3]
    pool.get_new_blocks(5)
    assert reused == [3, 1, 4]


def test_unpin_callbacks_may_read_the_pool_and_all_run() -> None:
    pool = kb.BlockPool(5)
    pool.get_new_blocks(4)
    seen: list[tuple[int, int]] = []

    def reads_the_pool(block: int) -> None:
        seen.append((block, pool.get_num_free_blocks()))

    def fails(block: int) -> None:
        raise RuntimeError(f"block {block}")

    pool.unpin_blocks([1], fails)
    pool.unpin_blocks([2], reads_the_pool)
    pool.unpin_blocks([3], fails)
    with pytest.raises(RuntimeError, match="block 1"):
        pool.get_new_blocks(3)
    # The call completed: the blocks were handed out, and every callback ran.
    assert pool.get_num_free_blocks() == 0
    assert seen == [(2, 0)]
    pool.free_blocks([1, 2, 3])
    pool.get_new_blocks(3)
    assert seen == [(2, 0)]  # reported once


def test_unpin_blocks_refused_where_it_cannot_report() -> None:
    kept = kb.BlockPool(4, retention=kb.RetentionPolicy())
    kept.get_new_blocks(1)
    with pytest.raises(kb.UnsupportedError):
        kept.unpin_blocks([1], print)
    assert kept.get_ref_cnt(1) == 1

    spec = kb.FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    config = kb.KVCacheConfig(4, [], [kb.KVCacheGroupSpec(["l"], spec)])
    manager_pool = kb.KVCacheManager(config, 1024, BS).block_pool
    blocks = manager_pool.get_new_blocks(1)
    with pytest.raises(kb.UnsupportedError):
        manager_pool.unpin_blocks(blocks, print)
    assert manager_pool.get_ref_cnt(blocks[0]) == 1


def test_a_host_pool_names_its_medium_in_events() -> None:
    pool = kb.BlockPool(4, enable_kv_cache_events=True, medium="CPU")
    assert pool.medium == "CPU"
    assert kb.BlockPool(4).medium == "GPU"
    tokens = list(range(BS))
    blocks = pool.get_new_blocks(1)
    pool.cache_full_blocks(chain_hashes(tokens), blocks, 0, 1, BS, 0, tokens)
    pool.free_blocks(blocks)
    pool.evict_blocks(blocks)
    events = pool.take_events()
    assert [type(e).__name__ for e in events] == ["BlockStored", "BlockRemoved"]
    assert {e.medium for e in events} == {"CPU"}
    with pytest.raises(kb.InvalidArgumentError, match="medium"):
        kb.BlockPool(4, medium="DISK")  # type: ignore[arg-type]
