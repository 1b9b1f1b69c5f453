"""Bad input, in one place: every call kvblocks refuses raises a specific exception of one
tree and changes nothing.

1. The table: one row per bad call across the public API (wrong types, negative and huge
   numbers, unknown ids, double frees, token ids outside u32, empty and oversized inputs,
   unknown hash algorithms, specs that do not merge). Each row raises its specific
   exception, and the state digest of the object it was called on is the same after the
   call as before.
2. Single cases that need more than one call: a double free, a prompt beyond
   max_model_len, an empty prompt, caching an unknown request.
3. The exception tree: every error kvblocks raises for bad input is a
   `kvblocks.KVBlocksError` and still an instance of the builtin it raised before (vLLM's
   type in the same case).
4. Errors raised outside the core: the binding layer's own checks, kvblocks.device,
   kvblocks.events, kvblocks.metrics and kvblocks.sim.

Each object's tests also check a few bad calls of their own (`test_block_pool.py`,
`test_manager.py`, `test_request.py`, `test_spec.py`, ...). That no hostile value at all
makes Rust panic is a sweep of its own, `test_no_panic.py`.
"""

# Every row passes a wrong type or value on purpose:
# mypy: disable-error-code="arg-type,list-item,dict-item,call-arg,misc"

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kvblocks as kb
import pytest
from model import pool_state

BS = 4
TOKENS = list(range(3 * BS + 1))


def full(**kw: Any) -> kb.FullAttentionSpec:
    args: dict[str, Any] = {"block_size": BS, "num_kv_heads": 1, "head_size": 8, "dtype": "float16"}
    return kb.FullAttentionSpec(**(args | kw))


def swa(**kw: Any) -> kb.SlidingWindowSpec:
    args: dict[str, Any] = {
        "block_size": BS,
        "num_kv_heads": 1,
        "head_size": 8,
        "dtype": "float16",
        "sliding_window": 8,
    }
    return kb.SlidingWindowSpec(**(args | kw))


def config(*groups: kb.KVCacheSpec) -> kb.KVCacheConfig:
    return kb.KVCacheConfig(
        16, [], [kb.KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(groups or (full(),))]
    )


class World:
    """A pool holding one request's blocks (two cached, one partial) and a free block."""

    def __init__(self) -> None:
        self.pool = kb.BlockPool(8, True, BS, True)
        self.req = kb.Request("r", TOKENS, kb.BlockHasher(BS), cache_salt="s")
        self.hashes = self.req.block_hashes
        self.table = self.pool.get_new_blocks(4)
        self.pool.cache_full_blocks(self.hashes, self.table, 0, 2, BS, 0, TOKENS)
        self.free = self.pool.get_free_block_ids()[0]
        self.pool.take_events()
        # A hybrid manager (full attention + sliding window) holding one request.
        self.mgr = kb.KVCacheManager(config(full(), swa()), 64, BS, enable_kv_cache_events=True)
        self.mreq = kb.Request("m", TOKENS, kb.BlockHasher(BS))
        assert self.mgr.allocate_slots(self.mreq, len(TOKENS)) is not None
        self.mgr.take_events()

    def digest(self) -> tuple[object, ...]:
        pool, req, view = self.pool, self.req, self.mgr.block_pool
        return (
            self.mgr.get_block_ids("m"),
            self.mgr.retention_interval,
            view.get_free_block_ids(),
            [view.get_ref_cnt(b) for b in range(view.num_gpu_blocks)],
            [view.get_block_hash(b) for b in range(view.num_gpu_blocks)],
            self.mgr.take_events(),
            self.mgr.get_computed_blocks(kb.Request("probe", TOKENS, kb.BlockHasher(BS)))[1],
            pool_state(pool),
            [pool.get_cached_block(h, [0]) for h in self.hashes],
            pool.take_events(),
            req.all_token_ids,
            req.block_hashes,
            (req.num_computed_tokens, req.num_in_flight_tokens, req.num_preemptions),
            req.skip_reading_prefix_cache,
        )


def setter(name: str, value: Any) -> Callable[[World], None]:
    return lambda w: setattr(w.req, name, value)


def no_world(call: Callable[[], Any]) -> Callable[[World], Any]:
    return lambda _w: call()


# --- 1. The table ----------------------------------------------------------------------

# (label, call on a fresh World, expected exception)
TABLE: list[tuple[str, Callable[[World], Any], type[Exception]]] = [
    # --- BlockPool ---------------------------------------------------------------------
    ("BlockPool: zero blocks", no_world(lambda: kb.BlockPool(0)), ValueError),
    ("BlockPool: negative blocks", no_world(lambda: kb.BlockPool(-1)), OverflowError),
    ("BlockPool: beyond u32 ids", no_world(lambda: kb.BlockPool(2**32)), ValueError),
    ("BlockPool: str size", no_world(lambda: kb.BlockPool("8")), TypeError),
    ("BlockPool: zero hash block", no_world(lambda: kb.BlockPool(8, True, 0)), ValueError),
    ("get_new_blocks: negative", lambda w: w.pool.get_new_blocks(-1), OverflowError),
    ("get_new_blocks: more than free", lambda w: w.pool.get_new_blocks(5), ValueError),
    ("get_new_blocks: huge", lambda w: w.pool.get_new_blocks(2**64), OverflowError),
    ("get_new_blocks: float", lambda w: w.pool.get_new_blocks(1.0), TypeError),
    (
        "free_blocks: double free",
        lambda w: w.pool.free_blocks([w.table[0], w.table[0]]),
        ValueError,
    ),
    ("free_blocks: a free block", lambda w: w.pool.free_blocks([w.table[1], w.free]), ValueError),
    ("free_blocks: unknown id", lambda w: w.pool.free_blocks([w.table[1], 8]), ValueError),
    ("free_blocks: negative id", lambda w: w.pool.free_blocks([w.table[1], -1]), OverflowError),
    ("free_blocks: id beyond u32", lambda w: w.pool.free_blocks([2**32]), OverflowError),
    ("free_blocks: None", lambda w: w.pool.free_blocks(None), TypeError),
    ("free_blocks: str ids", lambda w: w.pool.free_blocks(["1"]), TypeError),
    ("touch: unknown id", lambda w: w.pool.touch([w.free, 99]), ValueError),
    ("touch: negative id", lambda w: w.pool.touch([w.free, -5]), OverflowError),
    ("touch: not a sequence", lambda w: w.pool.touch(3), TypeError),
    (
        "cache_full_blocks: past the hashes",
        lambda w: w.pool.cache_full_blocks(w.hashes, w.table, 2, 4, BS, 0),
        ValueError,
    ),
    (
        "cache_full_blocks: already cached",
        lambda w: w.pool.cache_full_blocks(w.hashes, w.table, 1, 3, BS, 0),
        ValueError,
    ),
    (
        "cache_full_blocks: a block listed twice",
        lambda w: w.pool.cache_full_blocks(
            kb.Request("d", list(range(6 * BS)), kb.BlockHasher(BS)).block_hashes,
            [*w.table[:3], w.table[2]],
            2,
            4,
            BS,
            0,
        ),
        ValueError,
    ),
    (
        "cache_full_blocks: block size not a multiple",
        lambda w: w.pool.cache_full_blocks(w.hashes, w.table, 2, 3, BS + 1, 0),
        ValueError,
    ),
    (
        "cache_full_blocks: zero block size",
        lambda w: w.pool.cache_full_blocks(w.hashes, w.table, 2, 3, 0, 0),
        ValueError,
    ),
    (
        "cache_full_blocks: unknown block",
        lambda w: w.pool.cache_full_blocks(w.hashes, [*w.table[:2], 50], 2, 3, BS, 0),
        ValueError,
    ),
    (
        "cache_full_blocks: hash too long",
        lambda w: w.pool.cache_full_blocks([b"x" * 33] * 3, w.table, 2, 3, BS, 0),
        ValueError,
    ),
    (
        "cache_full_blocks: str hash",
        lambda w: w.pool.cache_full_blocks(["h"] * 3, w.table, 2, 3, BS, 0),
        TypeError,
    ),
    (
        "cache_full_blocks: negative count",
        lambda w: w.pool.cache_full_blocks(w.hashes, w.table, -1, 3, BS, 0),
        OverflowError,
    ),
    (
        "cache_full_blocks: negative group",
        lambda w: w.pool.cache_full_blocks(w.hashes, w.table, 2, 3, BS, -1),
        OverflowError,
    ),
    (
        "cache_full_blocks: token beyond u32",
        lambda w: w.pool.cache_full_blocks(w.hashes, w.table, 2, 3, BS, 0, [2**32] * 12),
        OverflowError,
    ),
    (
        "get_cached_block: hash too long",
        lambda w: w.pool.get_cached_block(b"x" * 33, [0]),
        ValueError,
    ),
    ("get_cached_block: str hash", lambda w: w.pool.get_cached_block("h", [0]), TypeError),
    (
        "get_cached_block: negative group",
        lambda w: w.pool.get_cached_block(w.hashes[0], [-1]),
        OverflowError,
    ),
    ("evict_blocks: unknown id", lambda w: w.pool.evict_blocks({w.table[0], 8}), ValueError),
    ("evict_blocks: negative id", lambda w: w.pool.evict_blocks([w.table[0], -1]), OverflowError),
    ("evict_blocks: not iterable", lambda w: w.pool.evict_blocks(1), TypeError),
    ("reset_prefix_cache: an argument", lambda w: w.pool.reset_prefix_cache(True), TypeError),
    ("get_num_free_blocks: an argument", lambda w: w.pool.get_num_free_blocks(0), TypeError),
    ("get_usage: an argument", lambda w: w.pool.get_usage(0), TypeError),
    ("get_free_block_ids: an argument", lambda w: w.pool.get_free_block_ids(0), TypeError),
    ("take_events: an argument", lambda w: w.pool.take_events(0), TypeError),
    ("check_invariants: an argument", lambda w: w.pool.check_invariants(0), TypeError),
    ("get_ref_cnt: unknown id", lambda w: w.pool.get_ref_cnt(8), ValueError),
    ("get_ref_cnt: negative id", lambda w: w.pool.get_ref_cnt(-1), OverflowError),
    ("get_block_hash: unknown id", lambda w: w.pool.get_block_hash(2**31), ValueError),
    ("get_block_hash: str id", lambda w: w.pool.get_block_hash("1"), TypeError),
    # --- hashing -------------------------------------------------------------------------
    ("BlockHasher: unknown algorithm", no_world(lambda: kb.BlockHasher(BS, "md5")), ValueError),
    ("BlockHasher: zero block", no_world(lambda: kb.BlockHasher(0)), ValueError),
    ("BlockHasher: negative block", no_world(lambda: kb.BlockHasher(-4)), ValueError),
    ("none_hash: unknown algorithm", no_world(lambda: kb.none_hash("sha512")), ValueError),
    ("none_hash: not a str", no_world(lambda: kb.none_hash(1)), TypeError),
    (
        "hash_block_tokens: unknown algorithm",
        no_world(lambda: kb.hash_block_tokens("crc32", None, [1])),
        ValueError,
    ),
    (
        "hash_block_tokens: token beyond u32",
        no_world(lambda: kb.hash_block_tokens("sha256", None, [2**32])),
        OverflowError,
    ),
    (
        "hash_block_tokens: negative token",
        no_world(lambda: kb.hash_block_tokens("sha256", None, [-1])),
        OverflowError,
    ),
    (
        "hash_block_tokens: parent too long",
        no_world(lambda: kb.hash_block_tokens("sha256", b"p" * 33, [1])),
        ValueError,
    ),
    (
        "hash_block_tokens: float extra key",
        no_world(lambda: kb.hash_block_tokens("sha256", None, [1], (1.5,))),
        TypeError,
    ),
    # --- Request -------------------------------------------------------------------------
    ("Request: token beyond u32", no_world(lambda: kb.Request("q", [1, 2**32])), OverflowError),
    ("Request: negative token", no_world(lambda: kb.Request("q", [-1])), OverflowError),
    ("Request: str tokens", no_world(lambda: kb.Request("q", "abc")), TypeError),
    ("Request: int id", no_world(lambda: kb.Request(1, [1])), TypeError),
    (
        "Request: lora id 0",
        no_world(lambda: kb.Request("q", [1], lora_name="a", lora_path="/a", lora_id=0)),
        ValueError,
    ),
    (
        "Request: mm features overlap",
        no_world(lambda: kb.Request("q", [1, 2, 3], mm_features=[("h", 0, 2), ("i", 1, 1)])),
        ValueError,
    ),
    ("Request: empty prompt", no_world(lambda: kb.Request("q", [])), ValueError),
    (
        "Request: lora path without name",
        no_world(lambda: kb.Request("q", [1], lora_path="/a")),
        ValueError,
    ),
    (
        "append: token beyond u32",
        lambda w: w.req.append_output_token_ids([1, 2**32]),
        OverflowError,
    ),
    ("append: negative token", lambda w: w.req.append_output_token_ids(-1), OverflowError),
    ("append: None", lambda w: w.req.append_output_token_ids(None), TypeError),
    ("append: floats", lambda w: w.req.append_output_token_ids([1.0]), TypeError),
    ("num_computed_tokens: negative", setter("num_computed_tokens", -1), OverflowError),
    ("num_in_flight_tokens: str", setter("num_in_flight_tokens", "1"), TypeError),
    ("num_preemptions: beyond u32", setter("num_preemptions", 2**32), OverflowError),
    ("skip_reading_prefix_cache: int", setter("skip_reading_prefix_cache", 1), TypeError),
    ("request_id: read-only", setter("request_id", "x"), AttributeError),
    # --- specs ---------------------------------------------------------------------------
    (
        "merge: full with sliding window",
        no_world(lambda: kb.FullAttentionSpec.merge([full(), swa()])),
        ValueError,
    ),
    (
        "merge: different block sizes",
        no_world(lambda: kb.FullAttentionSpec.merge([full(), full(block_size=8)])),
        ValueError,
    ),
    ("merge: nothing", no_world(lambda: kb.FullAttentionSpec.merge([])), ValueError),
    ("merge: not specs", no_world(lambda: kb.FullAttentionSpec.merge([1])), TypeError),
    ("spec: zero block size", no_world(lambda: full(block_size=0)), ValueError),
    ("spec: negative heads", no_world(lambda: full(num_kv_heads=-1)), ValueError),
    ("spec: huge block size", no_world(lambda: full(block_size=2**70)), OverflowError),
    ("spec: unknown dtype", no_world(lambda: full(dtype="float7")), ValueError),
    (
        "spec: page size overflows u64",
        no_world(lambda: full(block_size=2**40, num_kv_heads=2**40).page_size_bytes),
        ValueError,
    ),
    ("sliding window: zero window", no_world(lambda: swa(sliding_window=0)), ValueError),
    (
        "chunked: zero chunk",
        no_world(
            lambda: kb.ChunkedLocalAttentionSpec(
                block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", attention_chunk_size=0
            )
        ),
        ValueError,
    ),
    (
        "mamba: dtypes do not match shapes",
        no_world(lambda: kb.MambaSpec(block_size=BS, shapes=[[1], [2]], dtypes=["float16"])),
        ValueError,
    ),
    (
        "mamba: unknown cache mode",
        no_world(
            lambda: kb.MambaSpec(
                block_size=BS, shapes=[[1]], dtypes=["float16"], mamba_cache_mode="some"
            )
        ),
        ValueError,
    ),
    (
        "max_memory_usage_bytes: negative",
        no_world(lambda: full().max_memory_usage_bytes(max_model_len=-1)),
        ValueError,
    ),
    (
        "max_admission_blocks: negative",
        no_world(lambda: swa().max_admission_blocks_per_request(-1, 8)),
        ValueError,
    ),
    (
        "uniform: no layers",
        no_world(lambda: kb.UniformTypeKVCacheSpecs(block_size=BS, kv_cache_specs={})),
        ValueError,
    ),
    (
        "uniform: mixed types",
        no_world(
            lambda: kb.UniformTypeKVCacheSpecs(
                block_size=BS, kv_cache_specs={"a": full(), "b": swa()}
            )
        ),
        ValueError,
    ),
    (
        "uniform: not a mapping",
        no_world(lambda: kb.UniformTypeKVCacheSpecs.from_specs([full()])),
        TypeError,
    ),
    (
        "is_uniform_type: not specs",
        no_world(lambda: kb.UniformTypeKVCacheSpecs.is_uniform_type({"a": 1})),
        TypeError,
    ),
    # --- config --------------------------------------------------------------------------
    ("KVCacheTensor: negative size", no_world(lambda: kb.KVCacheTensor(-1, ["a"])), ValueError),
    ("KVCacheTensor: str layers", no_world(lambda: kb.KVCacheTensor(8, "a")), TypeError),
    (
        "KVCacheGroupSpec: not a spec",
        no_world(lambda: kb.KVCacheGroupSpec(["a"], "full")),
        TypeError,
    ),
    ("KVCacheConfig: zero blocks", no_world(lambda: kb.KVCacheConfig(0, [], [])), ValueError),
    (
        "KVCacheConfig: group without layers",
        no_world(lambda: kb.KVCacheConfig(8, [], [kb.KVCacheGroupSpec([], full())])),
        ValueError,
    ),
    (
        "resolve_block_sizes: no groups",
        no_world(lambda: kb.KVCacheConfig(8, [], []).resolve_block_sizes()),
        ValueError,
    ),
    (
        "resolve_block_sizes: bad prefix_match_unit",
        no_world(
            lambda: config(full(), swa(block_size=8)).resolve_block_sizes(prefix_match_unit=3)
        ),
        ValueError,
    ),
    (
        "resolve_block_sizes: dcp_world_size 0",
        no_world(lambda: config(full(), swa()).resolve_block_sizes(dcp_world_size=0)),
        ValueError,
    ),
    (
        "resolve_block_sizes: dcp overflow",
        no_world(lambda: config(full(), swa()).resolve_block_sizes(dcp_world_size=2**63)),
        ValueError,
    ),
    # --- KVCacheManager -------------------------------------------------------------------
    (
        "KVCacheManager: zero max_model_len",
        no_world(lambda: kb.KVCacheManager(config(), 0, BS)),
        ValueError,
    ),
    (
        "KVCacheManager: negative max_model_len",
        no_world(lambda: kb.KVCacheManager(config(), -1, BS)),
        OverflowError,
    ),
    (
        "KVCacheManager: zero hash block",
        no_world(lambda: kb.KVCacheManager(config(), 64, 0)),
        ValueError,
    ),
    (
        "KVCacheManager: scheduler not a multiple",
        no_world(lambda: kb.KVCacheManager(config(), 64, BS, scheduler_block_size=6)),
        ValueError,
    ),
    ("KVCacheManager: not a config", no_world(lambda: kb.KVCacheManager("cfg", 64, BS)), TypeError),
    (
        "retention_interval: not a multiple of the scheduler block",
        lambda w: setattr(w.mgr, "retention_interval", BS + 1),
        ValueError,
    ),
    (
        "retention_interval: negative",
        lambda w: setattr(w.mgr, "retention_interval", -BS),
        ValueError,
    ),
    ("retention_interval: str", lambda w: setattr(w.mgr, "retention_interval", "0"), TypeError),
    ("get_computed_blocks: not a request", lambda w: w.mgr.get_computed_blocks("m"), TypeError),
    (
        "get_computed_blocks: hashed at another block size",
        lambda w: w.mgr.get_computed_blocks(kb.Request("q", TOKENS, kb.BlockHasher(2))),
        ValueError,
    ),
    ("allocate_slots: zero tokens", lambda w: w.mgr.allocate_slots(w.mreq, 0), ValueError),
    ("allocate_slots: negative tokens", lambda w: w.mgr.allocate_slots(w.mreq, -1), OverflowError),
    (
        "allocate_slots: huge lookahead",
        lambda w: w.mgr.allocate_slots(w.mreq, 1, 0, None, 2**64),
        OverflowError,
    ),
    (
        "allocate_slots: hits for one group of two",
        lambda w: w.mgr.allocate_slots(
            kb.Request("q", TOKENS, kb.BlockHasher(BS)), 5, 8, kb.KVCacheBlocks([[1, 2]])
        ),
        ValueError,
    ),
    (
        "allocate_slots: unknown hit block",
        lambda w: w.mgr.allocate_slots(
            kb.Request("q", TOKENS, kb.BlockHasher(BS)), 5, 8, kb.KVCacheBlocks([[1, 99], [0, 2]])
        ),
        ValueError,
    ),
    (
        "allocate_slots: hashed at another block size",
        lambda w: w.mgr.allocate_slots(kb.Request("q", TOKENS, kb.BlockHasher(8)), 4),
        ValueError,
    ),
    (
        "allocate_slots: hits not KVCacheBlocks",
        lambda w: w.mgr.allocate_slots(w.mreq, 1, 4, [[1], [2]]),
        TypeError,
    ),
    (
        "allocate_slots_batch: lengths differ",
        lambda w: w.mgr.allocate_slots_batch([w.mreq], [1, 1]),
        ValueError,
    ),
    (
        "allocate_slots_batch: not requests",
        lambda w: w.mgr.allocate_slots_batch(["m"], [1]),
        TypeError,
    ),
    ("free: not a request", lambda w: w.mgr.free("m"), TypeError),
    ("get_block_ids: not a str", lambda w: w.mgr.get_block_ids(1), TypeError),
    ("cache_blocks: negative", lambda w: w.mgr.cache_blocks(w.mreq, -1), OverflowError),
    (
        "cache_blocks: hashed at another block size",
        lambda w: w.mgr.cache_blocks(kb.Request("m", TOKENS, kb.BlockHasher(2)), 8),
        ValueError,
    ),
    ("evict_blocks (manager): unknown id", lambda w: w.mgr.evict_blocks({1, 99}), ValueError),
    ("evict_blocks (manager): negative id", lambda w: w.mgr.evict_blocks([-1]), OverflowError),
    (
        "record_prefix_cache_stats: negative",
        lambda w: w.mgr.record_prefix_cache_stats(w.mreq, -1),
        OverflowError,
    ),
    (
        "get_num_common_prefix_blocks: not a str",
        lambda w: w.mgr.get_num_common_prefix_blocks(1),
        TypeError,
    ),
    (
        "KVCacheManager.block_pool.get_ref_cnt: unknown id",
        lambda w: w.mgr.block_pool.get_ref_cnt(99),
        ValueError,
    ),
    (
        "KVCacheManager.block_pool.get_block_hash: negative",
        lambda w: w.mgr.block_pool.get_block_hash(-1),
        OverflowError,
    ),
    ("KVCacheBlocks: negative id", no_world(lambda: kb.KVCacheBlocks([[-1]])), OverflowError),
    ("KVCacheBlocks: flat list", no_world(lambda: kb.KVCacheBlocks([1, 2])), TypeError),
    ("KVCacheBlocks: adding a list", no_world(lambda: [*kb.KVCacheBlocks([[1]]), [2]]), TypeError),
    (
        "PrefixCacheStats.record: negative",
        no_world(lambda: kb.PrefixCacheStats().record(-1, 0, False)),
        OverflowError,
    ),
    # --- event publishing ---------------------------------------------------------------
    ("EventSink: unknown format", no_world(lambda: kb.EventSink(format="xml")), ValueError),
    ("EventSink: zero queue", no_world(lambda: kb.EventSink(max_queue_size=0)), ValueError),
    ("EventSink: negative queue", no_world(lambda: kb.EventSink(max_queue_size=-1)), OverflowError),
    ("EventSink.publish: not events", no_world(lambda: kb.EventSink().publish([1])), TypeError),
    (
        "EventSink.next_payload: negative timeout",
        no_world(lambda: kb.EventSink().next_payload(-1.0)),
        ValueError,
    ),
    (
        "encode_event_batch: unknown format",
        no_world(lambda: kb.encode_event_batch(0.0, [], format="json")),
        ValueError,
    ),
    (
        "append_token_ids_batch: lengths differ",
        lambda w: kb.append_token_ids_batch([w.req], [1, 2]),
        ValueError,
    ),
    (
        "append_token_ids_batch: token beyond u32",
        lambda w: kb.append_token_ids_batch([w.req], [2**32]),
        OverflowError,
    ),
    (
        "append_token_ids_batch: a request twice",
        lambda w: kb.append_token_ids_batch([w.req, w.req], [1, 2]),
        RuntimeError,
    ),
    # --- events --------------------------------------------------------------------------
    (
        "BlockStored: negative hash",
        no_world(lambda: kb.BlockStored([-1], None, [], 1, None, "GPU", None)),
        OverflowError,
    ),
    (
        "BlockStored: float extra key",
        no_world(lambda: kb.BlockStored([1], None, [], 1, None, "GPU", None, [(1.5,)])),
        TypeError,
    ),
    (
        "BlockRemoved: hash beyond u64",
        no_world(lambda: kb.BlockRemoved([2**64], "GPU")),
        OverflowError,
    ),
    ("AllBlocksCleared: an argument", no_world(lambda: kb.AllBlocksCleared(1)), TypeError),
]


@pytest.mark.parametrize(("label", "call", "exc"), TABLE, ids=[row[0] for row in TABLE])
def test_bad_input_raises_and_changes_nothing(
    label: str, call: Callable[[World], Any], exc: type[Exception]
) -> None:
    world = World()
    before = world.digest()
    with pytest.raises(exc):
        call(world)
    assert world.digest() == before


def test_the_world_is_usable_after_every_bad_call() -> None:
    """All the bad calls in a row on one World, then it still allocates and frees."""
    world = World()
    for _label, call, exc in TABLE:
        with pytest.raises(exc):
            call(world)
    world.pool.free_blocks(world.table[::-1])
    assert world.pool.get_num_free_blocks() == 7
    assert world.pool.get_cached_block(world.hashes[0], [0]) == [world.table[0]]


# --- 2. Single cases -------------------------------------------------------------------


def test_freeing_a_request_twice_changes_nothing_the_second_time() -> None:
    """vLLM's `free` pops the tables with a default: a second free (or freeing a request
    never allocated) is a no-op, not an error; the pool is not double-freed."""
    world = World()
    world.mgr.free(world.mreq)
    after_first = world.digest()
    assert world.mgr.block_pool.get_num_free_blocks() == 15
    world.mgr.free(world.mreq)
    world.mgr.free(kb.Request("never", [1, 2, 3]))
    assert world.digest() == after_first


def test_prompt_beyond_max_model_len_is_refused() -> None:
    """kvblocks' own API refuses to allocate for a request longer than max_model_len
    (vLLM's scheduler never sends one; `kvblocks.vllm` clamps as vLLM's manager does)."""
    mgr = kb.KVCacheManager(config(full()), 8 * BS, BS)
    req = kb.Request("long", list(range(20 * BS)), kb.BlockHasher(BS))
    with pytest.raises(ValueError, match="max_model_len"):
        mgr.allocate_slots(req, req.num_tokens)
    with pytest.raises(ValueError, match="max_model_len"):
        mgr.allocate_slots_batch([req], [1])
    assert mgr.block_pool.get_num_free_blocks() == 15
    assert mgr.get_block_ids("long") == ([],)
    short = kb.Request("short", list(range(8 * BS)), kb.BlockHasher(BS))
    assert mgr.allocate_slots(short, short.num_tokens) is not None


def test_empty_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one prompt token"):
        kb.Request("empty", [], kb.BlockHasher(BS))


def test_cache_blocks_of_an_unknown_request() -> None:
    """vLLM raises KeyError when there is a full block to cache for a request it holds
    no blocks for, and does nothing when there is none."""
    mgr = kb.KVCacheManager(config(full()), 64, BS)
    req = kb.Request("stranger", list(range(2 * BS)), kb.BlockHasher(BS))
    with pytest.raises(KeyError):
        mgr.cache_blocks(req, 2 * BS)
    mgr.cache_blocks(req, BS - 1)
    assert mgr.block_pool.get_num_free_blocks() == 15
    assert mgr.get_block_ids("stranger") == ([],)


# --- 3. The exception tree -------------------------------------------------------------

# Each class of the tree and the builtin it also derives from.
CLASSES: list[tuple[type[kb.KVBlocksError], type[Exception]]] = [
    (kb.InvalidArgumentError, ValueError),
    (kb.OutOfBlocksError, ValueError),
    (kb.BlockOutOfRangeError, ValueError),
    (kb.DoubleFreeError, ValueError),
    (kb.UnknownAlgorithmError, ValueError),
    (kb.UnknownRequestError, KeyError),
    (kb.InvalidSpecError, ValueError),
    (kb.UnsupportedError, NotImplementedError),
    (kb.NotPinnedError, KeyError),
    (kb.InvalidTypeError, TypeError),
    (kb.IntOverflowError, OverflowError),
    (kb.BlockIndexError, IndexError),
    (kb.UnknownLayerError, KeyError),
    (kb.InvalidEventError, ValueError),
    (kb.UnknownEngineError, KeyError),
    (kb.HashMismatchError, ValueError),
]

# Rows of the bad-input table whose error Python or PyO3 raises before the core sees the
# call: argument conversion (wrong type, out of an integer range), read-only attributes,
# a request borrowed twice by one call.
CONVERSION_ERRORS = (TypeError, OverflowError, AttributeError, RuntimeError)


def test_base_class() -> None:
    assert issubclass(kb.KVBlocksError, Exception)
    assert not issubclass(
        kb.KVBlocksError,
        (ValueError, KeyError, NotImplementedError, TypeError, OverflowError, IndexError),
    )
    assert kb.KVBlocksError.__module__ == "kvblocks._core"
    assert kb.KVBlocksError.__doc__


@pytest.mark.parametrize(("cls", "builtin"), CLASSES, ids=[c.__name__ for c, _ in CLASSES])
def test_class_bases(cls: type[kb.KVBlocksError], builtin: type[Exception]) -> None:
    assert cls.__bases__ == (kb.KVBlocksError, builtin)
    assert issubclass(cls, kb.KVBlocksError) and issubclass(cls, builtin)
    assert cls.__module__ == "kvblocks._core" and cls.__doc__
    assert getattr(kb, cls.__name__) is cls
    assert cls.__name__ in kb.__all__
    err = cls("message")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and back.args == ("message",)
    with pytest.raises(builtin):
        raise err


def test_one_class_per_variant() -> None:
    """Every exported subclass is in CLASSES (one per `KvError` variant, and the binding
    layer's four)."""
    exported = {
        v
        for v in vars(kb).values()
        if isinstance(v, type) and issubclass(v, kb.KVBlocksError) and v is not kb.KVBlocksError
    }
    assert exported == {c for c, _ in CLASSES}


@pytest.mark.parametrize(("label", "call", "exc"), TABLE, ids=[row[0] for row in TABLE])
def test_bad_input_errors_are_kvblocks_errors(
    label: str, call: Callable[[World], Any], exc: type[Exception]
) -> None:
    """The bad-input table, swept: each row still raises its builtin type, and every error
    that is not an argument conversion is a KVBlocksError."""
    with pytest.raises(exc) as info:
        call(World())
    if exc in CONVERSION_ERRORS:
        return
    assert isinstance(info.value, kb.KVBlocksError), f"{label}: {info.value!r}"


def test_specific_classes() -> None:
    world = World()
    with pytest.raises(kb.OutOfBlocksError):
        world.pool.get_new_blocks(5)
    with pytest.raises(kb.DoubleFreeError):
        world.pool.free_blocks([world.free])
    with pytest.raises(kb.BlockOutOfRangeError):
        world.pool.touch([99])
    with pytest.raises(kb.UnknownAlgorithmError):
        kb.BlockHasher(BS, "md5")
    mgr = kb.KVCacheManager(config(full()), 64, BS)
    with pytest.raises(kb.UnknownRequestError):
        mgr.cache_blocks(kb.Request("stranger", list(range(2 * BS)), kb.BlockHasher(BS)), 2 * BS)
    with pytest.raises(kb.InvalidArgumentError):
        mgr.block_table(["x"], group_id=1)


def test_vllm_unsupported_config_error_is_in_the_tree() -> None:
    from kvblocks.vllm import UnsupportedConfigError

    assert issubclass(UnsupportedConfigError, kb.UnsupportedError)
    assert issubclass(UnsupportedConfigError, kb.KVBlocksError)
    assert issubclass(UnsupportedConfigError, NotImplementedError)


# --- 4. Errors raised outside the core -------------------------------------------------


def _vllm_like_request(**fields: Any) -> SimpleNamespace:
    """The attributes `RequestBlockHasher` reads from a vLLM `Request`."""
    base: dict[str, Any] = {
        "_all_token_ids": list(range(2 * BS)),
        "block_hashes": [],
        "lora_request": None,
        "cache_salt": None,
        "mm_features": [],
        "prompt_embeds": None,
    }
    return SimpleNamespace(**{**base, **fields})


def test_request_hasher_errors() -> None:
    from kvblocks._core import RequestBlockHasher

    with pytest.raises(kb.InvalidArgumentError, match="num_hash_lookahead_tokens"):
        RequestBlockHasher(BS, "sha256", -1)
    hasher = RequestBlockHasher(BS, "sha256")
    position = SimpleNamespace(offset=-1, length=2)
    feature = SimpleNamespace(mm_position=position, identifier="image")
    with pytest.raises(kb.InvalidArgumentError, match="mm_position"):
        hasher(_vllm_like_request(mm_features=[feature]))
    embeds = [[0.0]] * (2 * BS)
    with pytest.raises(kb.InvalidArgumentError, match="without tensor_data"):
        hasher(_vllm_like_request(prompt_embeds=embeds))
    odd = RequestBlockHasher(BS, "sha256", tensor_data=lambda _: b"odd")
    with pytest.raises(kb.InvalidArgumentError, match="rows"):
        odd(_vllm_like_request(prompt_embeds=embeds))
    with pytest.raises(kb.InvalidTypeError, match="cache_salt"):
        hasher(_vllm_like_request(cache_salt=3))
    with pytest.raises(kb.IntOverflowError):
        hasher(_vllm_like_request(_all_token_ids=[2**70] * (2 * BS)))


def test_binding_type_and_overflow_checks() -> None:
    mgr = kb.KVCacheManager(config(full()), 64, BS)
    request = kb.Request("r", list(range(2 * BS)), kb.BlockHasher(BS))
    with pytest.raises(kb.InvalidTypeError, match="new_computed_blocks"):
        mgr.allocate_slots(request, BS, 0, "not blocks")  # type: ignore[arg-type]
    with pytest.raises(kb.IntOverflowError, match="u32"):
        kb.Request("big", [2**40] * BS, kb.BlockHasher(BS))


@pytest.mark.parametrize("have_zmq", [True, False])
def test_events_errors(have_zmq: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad publisher arguments are refused before pyzmq (optional) is imported, so the
    error is the same with or without it."""
    from kvblocks.events import ZmqEventPublisher, offset_endpoint_port

    if not have_zmq:
        monkeypatch.setitem(sys.modules, "zmq", None)  # `import zmq` raises ImportError
    with pytest.raises(kb.InvalidArgumentError, match="endpoint"):
        offset_endpoint_port("ipc:///tmp/x", 1)
    with pytest.raises(kb.InvalidArgumentError, match="buffer_steps"):
        ZmqEventPublisher(buffer_steps=-1)


def test_metrics_errors() -> None:
    from kvblocks.metrics import KVCacheMetrics

    metrics = KVCacheMetrics()
    with pytest.raises(kb.InvalidArgumentError, match="usage"):
        metrics.observe(usage=2.0)
    counts = dict.fromkeys(
        ("queries", "hits", "preempted_requests", "preempted_queries", "preempted_hits"), 0
    )
    stats = SimpleNamespace(requests=-1, **counts)
    with pytest.raises(kb.InvalidArgumentError, match="non-negative"):
        metrics.observe(stats)


def test_sim_errors(tmp_path: Path) -> None:
    from kvblocks.sim import presets, workloads
    from kvblocks.sim.engine import ReplayError

    with pytest.raises(kb.InvalidArgumentError, match="unknown workload"):
        workloads.generate("nonsense")
    with pytest.raises(kb.InvalidArgumentError, match="memory size"):
        presets.parse_memory("lots")
    assert issubclass(workloads.TraceError, kb.InvalidArgumentError)
    assert issubclass(ReplayError, kb.KVBlocksError) and issubclass(ReplayError, RuntimeError)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[1, 2]\n")
    with pytest.raises(workloads.TraceError) as info:
        workloads.read_trace(str(bad))
    assert isinstance(info.value, kb.KVBlocksError) and isinstance(info.value, ValueError)


def test_device_errors() -> None:
    torch = pytest.importorskip("torch")
    from kvblocks.device import KVPages, block_table, slot_mapping

    spec = full()
    names = ["layer.0"]
    num_blocks = 8
    tensors = [kb.KVCacheTensor(num_blocks * spec.page_size_bytes, names)]
    cfg = kb.KVCacheConfig(num_blocks, tensors, [kb.KVCacheGroupSpec(names, spec)])
    pages = KVPages(cfg)
    with pytest.raises(kb.BlockIndexError, match="out of range"):
        pages.zero_blocks([num_blocks])
    with pytest.raises(kb.InvalidTypeError, match="integers"):
        pages.zero_blocks(torch.tensor([1.0]))
    with pytest.raises(kb.InvalidArgumentError, match="duplicate"):
        pages.copy_blocks([1, 2], [3, 3])
    with pytest.raises(kb.UnknownLayerError, match="no layer"):
        pages.kv_cache("nonsense")
    with pytest.raises(kb.InvalidArgumentError, match="layout"):
        KVPages(cfg, layout="XYZ")  # type: ignore[arg-type]
    with pytest.raises(kb.InvalidArgumentError, match="max_blocks"):
        block_table([[1]], -1)
    with pytest.raises(kb.IntOverflowError, match="int32"):
        block_table([[2**40]], 1)
    with pytest.raises(kb.InvalidTypeError, match="2-D"):
        slot_mapping(torch.zeros(3, dtype=torch.int32), [0], [1], BS)
