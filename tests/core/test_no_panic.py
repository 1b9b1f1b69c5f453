"""No Rust panic reaches Python: every public callable of `kvblocks`, each argument slot
replaced in turn by each hostile value (boundary ints, wrong types, huge sequences), must
return or raise an ordinary `Exception` (a pyo3 `PanicException` derives from
`BaseException` only), and a pool or request that raised must be unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kvblocks as kb
import pytest
from kvblocks.router import KVIndex
from model import pool_state

HOSTILE: list[Any] = [
    0,
    -1,
    1,
    2**32,
    2**32 - 1,
    2**63,
    2**64,
    -(2**63),
    10**30,
    1.5,
    float("nan"),
    float("inf"),
    "",
    "x" * 300,
    b"",
    b"\xff" * 33,
    None,
    True,
    [],
    [-1],
    [2**32],
    [2**64],
    [None],
    ["a"],
    [[1]],
    [0] * 5000,
    (1, 2),
    {"a": 1},
    {1, 2},
    object(),
]

BS = 4


def spec() -> kb.FullAttentionSpec:
    return kb.FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")


def swa() -> kb.SlidingWindowSpec:
    return kb.SlidingWindowSpec(
        block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8
    )


def config() -> kb.KVCacheConfig:
    groups = [kb.KVCacheGroupSpec(["a"], spec()), kb.KVCacheGroupSpec(["b"], swa())]
    return kb.KVCacheConfig(8, [kb.KVCacheTensor(1024, ["a", "b"])], groups)


def fresh_pool() -> kb.BlockPool:
    pool = kb.BlockPool(8, True, BS, True)
    blocks = pool.get_new_blocks(3)
    req = kb.Request("r", list(range(9)), kb.BlockHasher(BS))
    pool.cache_full_blocks(req.block_hashes, blocks, 0, 2, BS, 0, req.all_token_ids)
    pool.free_blocks(blocks[2:])
    pool.take_events()
    return pool


def pinned_pool() -> kb.BlockPool:
    pool = fresh_pool()
    pool.pin([H], [0])
    return pool


def pinned_manager() -> kb.KVCacheManager:
    mgr = fresh_manager()
    mgr.pin(fresh_request())
    return mgr


def fresh_manager() -> kb.KVCacheManager:
    mgr = kb.KVCacheManager(config(), 64, BS)
    req = fresh_request()
    assert mgr.allocate_slots(req, req.num_tokens) is not None
    return mgr


def hisparse_manager() -> kb.KVCacheManager:
    """vLLM's HiSparse layout (source, indexer, resident, hot) holding request "r"."""
    groups = [
        kb.KVCacheGroupSpec(["source"], spec(), host_resident=True, role="hisparse_source"),
        kb.KVCacheGroupSpec(["indexer"], spec(), role="hisparse_indexer"),
        kb.KVCacheGroupSpec(["resident"], kb.HiSparseResidentSpec(block_size=BS, page_size=64)),
        kb.KVCacheGroupSpec(
            ["hot"], kb.HiSparseHotSpec(block_size=BS, page_size=64, blocks_per_request=2)
        ),
    ]
    mgr = kb.KVCacheManager(kb.KVCacheConfig(32, [], groups, hisparse_host_num_blocks=16), 64, BS)
    req = fresh_request()
    assert mgr.allocate_slots(req, req.num_tokens) is not None
    mgr.hisparse_advance_scheduled([("r", req.num_tokens)])
    return mgr


def fresh_sink() -> kb.EventSink:
    sink = kb.EventSink(max_queue_size=4)
    sink.publish([kb.AllBlocksCleared()])  # so that next_payload never waits
    return sink


def fresh_index() -> KVIndex:
    """An index of one engine that has applied one batch."""
    index = KVIndex()
    index.add_engine("e", config(), max_model_len=64, hash_block_size=4)
    mgr = kb.KVCacheManager(config(), 64, 4, enable_kv_cache_events=True)
    mgr.allocate_slots(kb.Request("r", list(range(12)), kb.BlockHasher(4, "sha256_cbor")), 12)
    index.ingest("e", kb.encode_event_batch(0.0, mgr.take_events()), 0)
    return index


def index_state(index: KVIndex) -> tuple[object, ...]:
    return (index.engines(), [index.status(e) for e in index.engines()], index.memory())


def fresh_request() -> kb.Request:
    return kb.Request("r", list(range(9)), kb.BlockHasher(BS), cache_salt="s")


def request_state(req: kb.Request) -> tuple[object, ...]:
    return (
        req.all_token_ids,
        req.block_hashes,
        req.num_computed_tokens,
        req.num_in_flight_tokens,
        req.num_preemptions,
        req.skip_reading_prefix_cache,
    )


H = kb.hash_block_tokens("sha256", None, [1, 2, 3, 4])


K = b"k" * 8 + (0).to_bytes(4, "big")  # an OffloadKey: a block hash and its group index


class Chunk:
    """The chunk object vLLM's CPU manager hands an offload policy."""

    def __init__(self, chunk_id: int) -> None:
        self.chunk_id = chunk_id
        self.ref_cnt = 0


def fresh_offload_manager(policy: str | kb.RetentionPolicy = "lru") -> kb.OffloadManager:
    """A tier of 4 chunks holding K, with request "r" known."""
    tier = kb.OffloadManager(4, policy, enable_events=True)
    tier.on_new_request("r")
    tier.prepare_store([K], "r")
    tier.complete_store([K])
    return tier


def pinned(target: Any, key: bytes) -> Any:
    """`target` (an offload manager or policy) with `key` pinned."""
    target.pin(key)
    return target


def loading_offload_manager() -> kb.OffloadManager:
    """`fresh_offload_manager` with K's load in flight."""
    tier = fresh_offload_manager()
    tier.prepare_load([K], "r")
    return tier


def fresh_offload_policy(order: str | kb.RetentionPolicy = "arc") -> kb.OffloadPolicy:
    """A policy of 4 chunks holding K (evictable)."""
    policy = kb.OffloadPolicy(order, 4)
    policy.insert(K, Chunk(0), 0, kb.OffloadRequest())
    return policy


def offload_state(target: kb.OffloadManager | kb.OffloadPolicy) -> tuple[object, ...]:
    if isinstance(target, kb.OffloadPolicy):
        return (target.lists(), target.heap(), target.target_t1_size, target.get(K) is None)
    return (
        target.num_free,
        target.num_evictable,
        target.num_write_pending,
        target.stores_skipped,
        target.lookup(K),
    )


# (name, target factory or None, the call with valid arguments, its valid arguments)
Call = tuple[str, Callable[[], Any] | None, Callable[..., Any], list[Any]]


def calls() -> list[Call]:
    pool_args: list[tuple[str, list[Any]]] = [
        ("get_new_blocks", [1]),
        ("free_blocks", [[1]]),
        ("touch", [[1]]),
        ("cache_full_blocks", [[H], [4], 0, 1, BS, 0, [1, 2, 3, 4]]),
        ("cache_partial_block", [[H], 4, BS, 0, [1, 2, 3, 4], True]),
        ("get_cached_block", [H, [0]]),
        ("evict_blocks", [{1}]),
        ("reset_prefix_cache", []),
        ("get_num_free_blocks", []),
        ("get_usage", []),
        ("get_free_block_ids", []),
        ("get_ref_cnt", [1]),
        ("get_block_hash", [1]),
        ("take_events", []),
        ("check_invariants", []),
        ("advance_time", [2.5]),
        ("pin", [[H], [0]]),
        ("get_tenant_cached_blocks", []),
        ("unpin_blocks", [[1], print]),
    ]
    pool_calls: list[Call] = [
        (f"BlockPool.{name}", fresh_pool, getattr(kb.BlockPool, name), args)
        for name, args in pool_args
    ]
    pool_calls.append(("BlockPool.unpin", pinned_pool, kb.BlockPool.unpin, [[H], [0]]))
    request_calls: list[Call] = [
        (
            "Request.append_output_token_ids",
            fresh_request,
            kb.Request.append_output_token_ids,
            [[1]],
        ),
        *[
            (f"Request.{prop}", fresh_request, lambda r, v, p=prop: setattr(r, p, v), [value])
            for prop, value in (
                ("num_computed_tokens", 1),
                ("num_in_flight_tokens", 1),
                ("num_preemptions", 1),
                ("skip_reading_prefix_cache", True),
            )
        ],
    ]
    free_calls: list[Call] = [
        ("BlockPool", None, kb.BlockPool, [8, True, BS, False]),
        (
            "Request",
            None,
            lambda *a: kb.Request(a[0], a[1], a[2], cache_salt=a[3]),
            ["r", [1, 2], kb.BlockHasher(2), "s"],
        ),
        (
            "Request(kw)",
            None,
            lambda *a: kb.Request(
                "r", [1, 2], lora_name=a[0], lora_path=a[1], lora_id=a[2], mm_features=a[3]
            ),
            ["n", "/p", 1, [("h", 0, 1)]],
        ),
        ("BlockHasher", None, kb.BlockHasher, [BS, "sha256"]),
        (
            "RetentionPolicy",
            None,
            lambda *a: kb.RetentionPolicy(
                classes=a[0], ttl_s=a[1], session_s=a[2], tenant_quotas=a[3], priority_classes=a[4]
            ),
            [2, [1.0, None], 3.0, {"t": 4}, {-1: 1}],
        ),
        ("hash_block_tokens", None, kb.hash_block_tokens, ["sha256", H, [1, 2], ("k",)]),
        ("none_hash", None, kb.none_hash, ["sha256"]),
        ("BlockStored", None, kb.BlockStored, [[1], None, [1], 1, None, "GPU", None, None, 0]),
        ("BlockRemoved", None, kb.BlockRemoved, [[1], "GPU", 0]),
        ("AllBlocksCleared", None, kb.AllBlocksCleared, []),
        ("KVCacheTensor", None, kb.KVCacheTensor, [1024, ["a"]]),
        (
            "KVCacheGroupSpec",
            None,
            lambda *a: kb.KVCacheGroupSpec(a[0], a[1], a[2], host_resident=a[3], role=a[4]),
            [["a"], spec(), False, True, "hisparse_source"],
        ),
        (
            "KVCacheConfig",
            None,
            lambda *a: kb.KVCacheConfig(a[0], a[1], a[2], a[3], hisparse_host_num_blocks=a[4]),
            [8, [], [kb.KVCacheGroupSpec(["a"], spec())], None, 4],
        ),
        (
            "KVCacheConfig.resolve_block_sizes",
            None,
            lambda *a: config().resolve_block_sizes(
                enable_prefix_caching=a[0],
                connector_enabled=a[1],
                dcp_world_size=a[2],
                prefix_match_unit=a[3],
            ),
            [True, False, 1, None],
        ),
        ("KVCacheSpec.merge", None, kb.FullAttentionSpec.merge, [[spec(), spec()]]),
        (
            "KVCacheSpec.max_memory_usage_bytes",
            None,
            lambda *a: spec().max_memory_usage_bytes(
                max_model_len=a[0],
                max_num_batched_tokens=a[1],
                max_num_encoder_input_tokens=a[2],
                max_concurrent_batches=a[3],
                dcp_world_size=a[4],
            ),
            [64, 16, None, 1, 1],
        ),
        (
            "SlidingWindowSpec.max_admission_blocks_per_request",
            None,
            swa().max_admission_blocks_per_request,
            [16, 64],
        ),
        (
            "ChunkedLocalAttentionSpec",
            None,
            lambda *a: kb.ChunkedLocalAttentionSpec(
                block_size=a[0], num_kv_heads=1, head_size=8, dtype=a[1], attention_chunk_size=a[2]
            ),
            [BS, "float16", 8],
        ),
        (
            "FullAttentionSpec",
            None,
            lambda *a: kb.FullAttentionSpec(
                block_size=a[0],
                num_kv_heads=a[1],
                head_size=a[2],
                dtype=a[3],
                head_size_v=a[4],
                sliding_window=a[5],
                attention_chunk_size=a[6],
                page_size_padded=a[7],
            ),
            [BS, 1, 8, "float16", None, None, None, None],
        ),
        (
            "SlidingWindowSpec",
            None,
            lambda *a: kb.SlidingWindowSpec(
                block_size=a[0],
                num_kv_heads=1,
                head_size=8,
                dtype="float16",
                sliding_window=a[1],
                extra_retained_tokens=a[2],
            ),
            [BS, 8, 0],
        ),
        (
            "MLAAttentionSpec",
            None,
            lambda *a: kb.MLAAttentionSpec(
                block_size=a[0],
                num_kv_heads=1,
                head_size=a[1],
                dtype="float16",
                cache_dtype_str=a[2],
                alignment=a[3],
            ),
            [BS, 8, None, None],
        ),
        (
            "SlidingWindowMLASpec",
            None,
            lambda *a: kb.SlidingWindowMLASpec(
                block_size=a[0],
                num_kv_heads=1,
                head_size=a[1],
                dtype="float16",
                sliding_window=a[2],
                alignment=a[3],
                bounded_replay=a[4],
            ),
            [BS, 8, 8, None, False],
        ),
        (
            "RSWASpec",
            None,
            lambda *a: kb.RSWASpec(
                block_size=a[0], num_kv_heads=1, head_size=8, dtype="float16", rswa_window=a[1]
            ),
            [BS, 8],
        ),
        (
            "CircularBufferSpec",
            None,
            lambda *a: kb.CircularBufferSpec(
                block_size=a[0], num_kv_heads=a[1], head_size=8, dtype="float16"
            ),
            [BS, 1],
        ),
        (
            "SinkFullAttentionSpec",
            None,
            lambda *a: kb.SinkFullAttentionSpec(
                block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sink_len=a[0]
            ),
            [4],
        ),
        (
            "CrossAttentionSpec",
            None,
            lambda *a: kb.CrossAttentionSpec(
                block_size=a[0], num_kv_heads=a[1], head_size=8, dtype="float16"
            ),
            [BS, 1],
        ),
        (
            "MambaSpec",
            None,
            lambda *a: kb.MambaSpec(
                block_size=a[0],
                shapes=a[1],
                dtypes=a[2],
                mamba_type=a[3],
                mamba_cache_mode=a[4],
                num_speculative_blocks=a[5],
            ),
            [BS, [[2, 3]], ["float16"], "mamba2", "none", 0],
        ),
        (
            "HiSparseHotSpec",
            None,
            lambda *a: kb.HiSparseHotSpec(block_size=a[0], page_size=a[1], blocks_per_request=a[2]),
            [BS, 64, 2],
        ),
        (
            "HiSparseResidentSpec",
            None,
            lambda *a: kb.HiSparseResidentSpec(block_size=a[0], page_size=a[1]),
            [BS, 64],
        ),
        (
            "HiSparseResidentSpec.max_admission_blocks_per_request",
            None,
            kb.HiSparseResidentSpec(block_size=BS, page_size=64).max_admission_blocks_per_request,
            [16, 64],
        ),
        (
            "UniformTypeKVCacheSpecs",
            None,
            lambda *a: kb.UniformTypeKVCacheSpecs(block_size=a[0], kv_cache_specs=a[1]),
            [BS, {"a": spec()}],
        ),
        (
            "UniformTypeKVCacheSpecs.from_specs",
            None,
            kb.UniformTypeKVCacheSpecs.from_specs,
            [{"a": spec(), "b": swa()}],
        ),
        (
            "UniformTypeKVCacheSpecs.is_uniform_type",
            None,
            kb.UniformTypeKVCacheSpecs.is_uniform_type,
            [{"a": spec()}],
        ),
    ]
    manager_args: list[tuple[str, list[Any]]] = [
        ("get_computed_blocks", [fresh_request()]),
        (
            "allocate_slots",
            [kb.Request("q", [1, 2, 3], kb.BlockHasher(BS)), 3, 0, None, 0, 0, False, 0, False],
        ),
        ("allocate_slots_batch", [[fresh_request()], [1]]),
        ("free", [fresh_request()]),
        ("get_block_ids", ["r"]),
        ("get_block_ids_for_computed_tokens", ["r", 16]),
        ("truncate_computed_blocks", [fresh_manager().kv_cache_blocks([[1, 2], [3]]), 4]),
        ("block_table", [["r", "x"], 0]),
        ("cache_blocks", [fresh_request(), 8]),
        ("new_step_starts", []),
        ("take_boundary_state_offloads", []),
        ("take_block_copies", []),
        ("finalize_partial_tails", ["r", 16, 0]),
        ("arm_mamba_shared_prefix_checkpoint", []),
        ("mamba_checkpoint", ["r", 0]),
        ("evict_blocks", [{1}]),
        ("reset_prefix_cache", []),
        ("get_num_common_prefix_blocks", ["r"]),
        ("take_block_metrics", []),
        ("take_events", []),
        ("record_prefix_cache_stats", [fresh_request(), 4]),
        ("make_prefix_cache_stats", []),
        ("find_cache_hit", [fresh_request(), 8]),
        ("prefix_cache_lookup_enabled", [fresh_request()]),
        ("get_computed_blocks_for_connector", [fresh_request(), 8]),
        ("find_longest_cache_hit_per_group", [[b"\x01" * 32], 16]),
        ("pop_blocks_for_free", [fresh_request()]),
        ("estimate_cached_tokens", [fresh_request()]),
        ("get_blocks", ["r"]),
        ("take_new_block_ids", []),
        ("record_blocks_for_zeroing", ["r", 0]),
        ("block_objects", [[1, 2]]),
        ("kv_cache_blocks", [[[1, 2]]]),
        ("request_ids", []),
        ("num_cached_blocks", ["r", 0]),
        ("get_num_blocks_to_allocate", ["r", 32, [[]], 0, 0, 32, False]),
        ("remove_skipped_blocks", ["r", 16, 16]),
        ("advance_time", [1.0]),
        ("pin", [fresh_request()]),
        ("pin_hashes", [[H]]),
    ]
    manager_calls: list[Call] = [
        (f"KVCacheManager.{name}", fresh_manager, getattr(kb.KVCacheManager, name), args)
        for name, args in manager_args
    ]
    manager_calls += [
        (f"KVCacheManager.{name}", hisparse_manager, getattr(kb.KVCacheManager, name), args)
        for name, args in (
            ("free_request", ["r", True]),
            ("hisparse_advance_scheduled", [[("r", 16)]]),
            ("hisparse_build_offload_command", []),
            ("hisparse_update_spills", [{0: 1}, {0: 1}]),
            ("hisparse_take_residency_updates", [["r"]]),
            ("hisparse_build_row_mirrors", [[("r", 0, 16)]]),
            ("hisparse_all_context_pages_resident", [[("r", 0, 16)]]),
            ("hisparse_has_pending_work", []),
            ("hisparse_has_pending_reclamation", []),
            ("hisparse_complete_host_import", ["r", 16]),
            ("hisparse_require_hot", ["r"]),
            ("hisparse_hot", ["r"]),
            ("hisparse_request_state", ["r"]),
            ("hisparse_copies", []),
            ("hisparse_residency_row", ["r", 2, 0]),
            ("hisparse_plan_prefix_materialization", ["r", 16]),
            ("hisparse_update_residency", ["r"]),
            ("hisparse_layout", []),
            ("hisparse_set_max_spill_pages", [3]),
            ("hisparse_state_ids", []),
            ("hisparse_pending_spill_ids", []),
            ("hisparse_spills_to_send", []),
            ("hisparse_allocate_hot", ["r", 3]),
            ("hisparse_take_host_block_copies", []),
            ("hisparse_release_completed_host_copies", [[1, 2]]),
            ("pop_blocks_for_free_by_group", ["r", True]),
            ("get_group_num_blocks_to_allocate", [0, "r", 32, [1], 16, 16, 32]),
            ("block_objects", [[1, 2], True]),
        )
    ]
    manager_calls += [
        (
            "KVCacheManager.hisparse_finish_host_import",
            hisparse_manager,
            lambda m, r, f: m.hisparse_finish_host_import(r, failed=f),
            ["r", False],
        )
    ]
    manager_calls += [
        (f"KVCacheManager.{name}", pinned_manager, getattr(kb.KVCacheManager, name), args)
        for name, args in (
            ("unpin", [fresh_request()]),
            ("unpin_hashes", [fresh_request().block_hashes]),
        )
    ]
    view_calls: list[Call] = [
        (
            f"KVCacheManager.block_pool.{name}",
            lambda: fresh_manager().block_pool,
            getattr(kb.BlockPool, name),
            args,
        )
        for name, args in [
            ("get_num_free_blocks", []),
            ("get_usage", []),
            ("get_free_block_ids", []),
            ("get_ref_cnt", [1]),
            ("get_block_hash", [1]),
        ]
    ]
    other_calls: list[Call] = [
        (
            "KVCacheManager",
            None,
            lambda *a: kb.KVCacheManager(
                a[0],
                a[1],
                a[2],
                scheduler_block_size=a[3],
                max_in_flight_tokens=a[4],
                enable_caching=a[5],
                use_eagle=a[6],
                log_stats=a[7],
                enable_kv_cache_events=a[8],
            ),
            [config(), 64, BS, None, None, True, False, True, True],
        ),
        ("KVCacheBlocks", None, kb.KVCacheBlocks, [[[1, 2], [3]]]),
        ("KVCacheBlocks.get_block_ids", None, kb.KVCacheBlocks([[1], []]).get_block_ids, [True]),
        *[
            (
                f"KVCacheBlocks.{name}",
                None,
                getattr(fresh_manager().kv_cache_blocks([[1, 2]]), name),
                [],
            )
            for name in ("get_unhashed_block_ids", "get_unhashed_block_ids_all_groups", "new_empty")
        ],
        ("PrefixCacheStats", None, kb.PrefixCacheStats, []),
        ("PrefixCacheStats.record", None, kb.PrefixCacheStats().record, [10, 4, False]),
        *[
            (
                f"PrefixCacheStats.{field}",
                None,
                lambda v, f=field: setattr(kb.PrefixCacheStats(), f, v),
                [value],
            )
            for field, value in [
                ("reset", True),
                ("requests", 1),
                ("queries", 1),
                ("hits", 1),
                ("preempted_requests", 1),
                ("preempted_queries", 1),
                ("preempted_hits", 1),
            ]
        ],
    ]
    sink_args: list[tuple[str, list[Any]]] = [
        ("publish", [[kb.AllBlocksCleared()], 1.0, 0]),
        ("publish_from", [fresh_manager(), 1.0]),
        ("request_snapshot", []),
        ("next_payload", [0.0]),
        ("close", []),
        ("stats", []),
        ("cached_keys", []),
    ]
    event_calls: list[Call] = [
        (f"EventSink.{name}", fresh_sink, getattr(kb.EventSink, name), args)
        for name, args in sink_args
    ]
    event_calls += [
        (
            "EventSink",
            None,
            lambda *a: kb.EventSink(max_queue_size=a[0], format=a[1], data_parallel_rank=a[2]),
            [8, "map", 0],
        ),
        (
            "encode_event_batch",
            None,
            lambda *a: kb.encode_event_batch(a[0], a[1], a[2], format=a[3]),
            [0.0, [kb.AllBlocksCleared()], None, "array"],
        ),
        (
            "append_token_ids_batch",
            None,
            lambda *a: kb.append_token_ids_batch(a[0], a[1]),
            [[fresh_request()], [1]],
        ),
    ]
    offload_args: list[tuple[str, list[Any]]] = [
        ("set_positions", ["r", [K], [16]]),
        ("set_hints", ["r"]),
        ("on_new_request", ["q"]),
        ("lookup", [K]),
        ("prepare_load", [[K], "r"]),
        ("touch", [[K]]),
        ("prepare_store", [[K[:-1] + b"\x01"], "r"]),
        ("complete_store", [[K], False]),
        ("on_request_finished", ["r"]),
        ("reset_cache", []),
        ("take_events", []),
    ]
    policy_args: list[tuple[str, list[Any]]] = [
        ("get", [K]),
        ("insert", [K[:-1] + b"\x01", Chunk(1), 0, kb.OffloadRequest()]),
        ("remove", [K]),
        ("touch", [[K]]),
        ("on_store_miss", [[K]]),
        ("on_request_access", [[K], [0], kb.OffloadRequest()]),
        ("on_request_finished", [[K], [0], [], []]),
        ("evict", [1, []]),
        ("clear", []),
        ("mark_evictable", [K]),
        ("mark_non_evictable", [K]),
        ("lists", []),
        ("heap", []),
    ]
    offload_calls: list[Call] = [
        (f"OffloadManager.{name}", fresh_offload_manager, getattr(kb.OffloadManager, name), args)
        for name, args in offload_args
    ] + [
        (f"OffloadPolicy.{name}", fresh_offload_policy, getattr(kb.OffloadPolicy, name), args)
        for name, args in policy_args
    ]
    offload_calls += [
        (f"{cls.__name__}.{name}", factory, getattr(cls, name), [K])
        for cls, retained in (
            (kb.OffloadManager, lambda: fresh_offload_manager(kb.RetentionPolicy())),
            (kb.OffloadPolicy, lambda: fresh_offload_policy(kb.RetentionPolicy())),
        )
        for name, factory in (("pin", retained), ("unpin", lambda r=retained: pinned(r(), K)))
    ]
    offload_calls += [
        (
            "OffloadManager.complete_load",
            loading_offload_manager,
            kb.OffloadManager.complete_load,
            [[K]],
        ),
        (
            "OffloadManager",
            None,
            lambda *a: kb.OffloadManager(
                a[0], a[1], enable_events=a[2], store_threshold=a[3], max_tracker_size=a[4]
            ),
            [4, "arc", True, 2, 16],
        ),
        ("OffloadPolicy", None, kb.OffloadPolicy, ["lru", 4]),
        (
            "OffloadRequest",
            None,
            lambda *a: kb.OffloadRequest(priority=a[0], tenant=a[1]),
            [1, "t"],
        ),
    ]
    router_args: list[tuple[str, list[Any]]] = [
        ("add_engine", ["e1", config()]),
        ("remove_engine", ["e"]),
        ("engines", []),
        ("ingest", ["e", kb.encode_event_batch(0.0, [kb.AllBlocksCleared()]), 1]),
        ("skip_gap", ["e"]),
        ("reset_engine", ["e"]),
        ("status", ["e"]),
        ("memory", []),
        ("hits", [[1, 2, 3, 4, 5]]),
        ("hits_from_hashes", [[b"\x01" * 32], 5]),
    ]
    router_calls: list[Call] = [
        (f"KVIndex.{name}", fresh_index, getattr(KVIndex, name), args)
        for name, args in router_args
        if name != "add_engine"
    ] + [
        (
            "KVIndex.add_engine",
            fresh_index,
            lambda ix, *a: ix.add_engine(a[0], a[1], max_model_len=a[2], hash_block_size=a[3]),
            ["e1", config(), 64, 4],
        )
    ]
    return (
        router_calls
        + offload_calls
        + pool_calls
        + request_calls
        + free_calls
        + manager_calls
        + view_calls
        + other_calls
        + event_calls
    )


CALLS = calls()


def manager_state(mgr: kb.KVCacheManager) -> tuple[object, ...]:
    view = mgr.block_pool
    n = view.num_gpu_blocks
    return (
        mgr.get_block_ids("r"),
        view.get_free_block_ids(),
        [view.get_ref_cnt(b) for b in range(n)],
        [view.get_block_hash(b) for b in range(n)],
        mgr.usage,
    )


def state(target: Any) -> object:
    if isinstance(target, kb.BlockPool):
        return pool_state(target)
    if isinstance(target, kb.KVCacheManager):
        return manager_state(target)
    if isinstance(target, kb.EventSink):
        return (target.closed, target.pending, target.stale, target.stats())
    if isinstance(target, (kb.OffloadManager, kb.OffloadPolicy)):
        return offload_state(target)
    if isinstance(target, KVIndex):
        return index_state(target)
    return request_state(target)


@pytest.mark.parametrize(("name", "factory", "fn", "args"), CALLS, ids=[c[0] for c in CALLS])
def test_no_panic_reaches_python(
    name: str, factory: Callable[[], Any] | None, fn: Callable[..., Any], args: list[Any]
) -> None:
    target = factory() if factory else None
    prefix = [target] if target is not None else []
    fn(*prefix, *args)  # the valid call works
    variants = [
        [*list(args[:i]), v, *list(args[i + 1 :])] for i in range(len(args)) for v in HOSTILE
    ]
    variants.append([*args, 1])  # one argument too many
    for variant in variants:
        target = factory() if factory else None
        before = state(target) if target is not None else None
        try:
            fn(*([target] if target is not None else []), *variant)
        except Exception:
            if target is not None:
                assert state(target) == before, (name, variant)
        except BaseException as exc:  # a PanicException
            pytest.fail(f"{name}{tuple(variant)!r} raised {type(exc).__name__}: {exc}")


SETTABLE = {"Request": fresh_request, "PrefixCacheStats": kb.PrefixCacheStats}
NOT_CONSTRUCTIBLE = {"KVCacheSpec", "AttentionSpec", "KVCacheBlock"}


def test_every_public_callable_is_swept() -> None:
    swept = {c[0].split("(")[0] for c in CALLS}
    for cls_name in kb.__all__:
        obj = getattr(kb, cls_name)
        if isinstance(obj, type) and issubclass(obj, kb.KVBlocksError):
            continue  # exception classes: test_bad_input.py, section 3
        if not isinstance(obj, type):
            if callable(obj):
                assert cls_name in swept
            continue
        for attr, value in vars(obj).items():
            if attr.startswith("_"):
                continue
            if callable(value) or isinstance(value, classmethod):
                owner = "KVCacheSpec" if attr in ("merge", "max_memory_usage_bytes") else cls_name
                key = f"{owner}.{attr}"
                if attr == "max_admission_blocks_per_request":
                    key = f"SlidingWindowSpec.{attr}"
                assert key in swept, key
            elif cls_name in SETTABLE:
                instance = SETTABLE[cls_name]()
                try:
                    setattr(instance, attr, getattr(instance, attr))
                except AttributeError:
                    continue  # read-only
                assert f"{cls_name}.{attr}" in swept, attr
        if cls_name not in NOT_CONSTRUCTIBLE:
            assert cls_name in swept, cls_name
