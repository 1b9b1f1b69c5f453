"""Short soak (benches/python/soak.py runs the long one) and leak checks of the bindings:
no Python reference leaked on arguments or results (sys.getrefcount), no Python memory
growth over many calls (tracemalloc), no native growth on the error paths (RSS).
"""

from __future__ import annotations

import gc
import importlib.util
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kvblocks as kb
import pytest
from paths import ROOT

SOAK_PATH = ROOT / "benches" / "python" / "soak.py"
BS = 4


def load_soak() -> Any:
    spec = importlib.util.spec_from_file_location("kvblocks_soak", SOAK_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")
def test_short_soak_keeps_the_invariants() -> None:
    soak = load_soak()
    samples: list[float] = []
    warm_at = soak.soak(
        4_000, 300_000, seed=1, report=lambda _o, _t, rss: samples.append(rss), report_every=50_000
    )
    assert 0 < warm_at < 300_000  # the pool filled up, so blocks were recycled
    assert len(samples) == 6


def test_short_manager_soak_keeps_the_invariants() -> None:
    soak = load_soak()
    warm_at = soak.soak_manager(2_000, 60_000, seed=2)
    assert 0 < warm_at < 60_000  # the pool filled up: preemptions and reuse happened


def workload(pool: kb.BlockPool, hashes: list[bytes], tokens: list[int]) -> Callable[[], None]:
    """One round of every pool call, successful and failing, with fresh arguments."""

    def run() -> None:
        blocks = pool.get_new_blocks(3)
        pool.cache_full_blocks(hashes, blocks, 0, 2, BS, 0, tokens)
        assert pool.get_cached_block(hashes[0], [0]) == blocks[:1]
        pool.touch(blocks[:2])
        pool.free_blocks(blocks[:2][::-1])
        pool.free_blocks(blocks[::-1])
        pool.evict_blocks(set(blocks))
        pool.take_events()
        pool.get_free_block_ids()
        pool.get_block_hash(blocks[0])
        bad_ids: list[list[Any]] = [[blocks[0]], [2**40], ["x"], [pool.num_gpu_blocks + 10]]
        for bad in bad_ids:
            try:
                pool.free_blocks(bad)
            except (ValueError, OverflowError, TypeError):
                pass
        req = kb.Request("r", tokens, kb.BlockHasher(BS), cache_salt="s")
        req.append_output_token_ids([1, 2, 3, 4])
        _ = req.block_hashes
        kb.hash_block_tokens("sha256", hashes[0], tokens[:BS], ("a", 1))
        try:
            kb.hash_block_tokens("nope", None, tokens)
        except ValueError:
            pass

    return run


def setup() -> tuple[kb.BlockPool, list[bytes], list[int]]:
    pool = kb.BlockPool(64, True, BS, True)
    tokens = list(range(1000, 1000 + 3 * BS))
    hashes = kb.Request("h", tokens, kb.BlockHasher(BS)).block_hashes
    return pool, hashes, tokens


def manager_workload() -> tuple[Callable[[], None], list[object]]:
    """One round of every KVCacheManager call on a hybrid manager whose block ids are
    above 256 (real int objects, not CPython's small-int cache), and the objects whose
    reference counts must not move: the manager, its arguments and the id objects it
    hands out."""
    spec = kb.FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    swa = kb.SlidingWindowSpec(
        block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8
    )
    groups = [kb.KVCacheGroupSpec(["f"], spec), kb.KVCacheGroupSpec(["s"], swa)]
    mgr = kb.KVCacheManager(
        kb.KVCacheConfig(600, [], groups), 256, BS, log_stats=True, enable_kv_cache_events=True
    )
    filler = kb.Request("filler", list(range(16 * BS)), kb.BlockHasher(BS))
    assert mgr.allocate_slots(filler, filler.num_tokens) is not None
    tokens = list(range(5000, 5000 + 6 * BS + 1))

    def run() -> None:
        req = kb.Request("r", tokens, kb.BlockHasher(BS), cache_salt="s")
        blocks, hit = mgr.get_computed_blocks(req)
        new = mgr.allocate_slots(req, req.num_tokens - hit, hit, blocks, 2)
        assert new is not None
        new.get_block_ids()
        (blocks + new).get_block_ids(True)
        mgr.record_prefix_cache_stats(req, hit)
        req.num_computed_tokens = req.num_tokens
        req.append_output_token_ids(7)
        mgr.allocate_slots_batch([req], [1])
        mgr.get_block_ids("r")
        mgr.get_num_common_prefix_blocks("r")
        mgr.take_events()
        mgr.make_prefix_cache_stats()
        view = mgr.block_pool
        view.get_free_block_ids()
        view.get_ref_cnt(300)
        try:
            mgr.allocate_slots(req, 0)
        except ValueError:
            pass
        try:
            mgr.evict_blocks([10**6])
        except ValueError:
            pass
        mgr.free(req)

    run()
    (fa, _) = mgr.get_block_ids("filler")
    return run, [mgr, tokens, filler, fa, fa[-1], fa[-2]]


def pool_workload() -> tuple[Callable[[], None], list[object]]:
    pool, hashes, tokens = setup()
    return workload(pool, hashes, tokens), [pool, hashes, tokens, *hashes]


@pytest.mark.parametrize("make", [pool_workload, manager_workload])
def test_no_reference_leak(make: Callable[[], tuple[Callable[[], None], list[object]]]) -> None:
    run, watched = make()
    run()
    gc.collect()
    before = [sys.getrefcount(o) for o in watched]
    for _ in range(2_000):
        run()
    gc.collect()
    assert [sys.getrefcount(o) for o in watched] == before


@pytest.mark.parametrize("make", [pool_workload, manager_workload])
def test_no_python_memory_growth(
    make: Callable[[], tuple[Callable[[], None], list[object]]],
) -> None:
    run, _ = make()
    for _ in range(300):
        run()
    gc.collect()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for _ in range(1_000):
            run()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes retained over 1000 rounds"


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")
def test_no_native_growth_on_error_paths() -> None:
    soak = load_soak()
    pool, hashes, _ = setup()
    calls: list[Callable[[], object]] = [
        lambda: pool.free_blocks([5]),  # double free
        lambda: pool.touch([1, 10**6]),
        lambda: pool.cache_full_blocks(hashes, [1, 1], 0, 2, BS, 0),
        lambda: pool.get_new_blocks(10**6),
        lambda: kb.Request("r", [1, -1]),
    ]

    def round_of_errors(n: int) -> int:
        raised = 0
        for _ in range(n):
            for call in calls:
                try:
                    call()
                except (ValueError, OverflowError):
                    raised += 1
        return raised

    assert round_of_errors(10_000) == 50_000
    base = soak.rss_mib()
    assert round_of_errors(60_000) == 300_000
    # A leak of 8 bytes per failing call would be 2.4 MB here.
    assert soak.rss_mib() - base < 1.5
