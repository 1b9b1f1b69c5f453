"""vLLM 0.33.0's BlockPool vs kvblocks.BlockPool, side by side, in ns per block.

Run in the oracle venv with kvblocks importable, e.g.:
    PYTHONPATH=$PWD/.oracle-site /work/oracle/venv/bin/python benches/python/bench_block_pool.py

Both pools get the same pool size and the same call sequence; each row reports the best of
several repeats (mean ns per block or per call) and the ratio vLLM / kvblocks. By default
the heap is frozen after building the pools (`gc.freeze()`, as vLLM's engine does after
init), so collections skip vLLM's 1M block objects; `--gc off` disables the collector while
timing, as `timeit` does.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import kvblocks as kb
from vllm.v1.core.block_pool import BlockPool as VllmBlockPool

BLOCK_SIZE = 16
HELD = 1000  # blocks held for the whole run, so that ids handed out are large ints


def best_ns(run: Callable[[], int], repeats: int) -> float:
    """Best over `repeats` of (elapsed ns / units), where `run` returns the units done."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        units = run()
        best = min(best, (time.perf_counter_ns() - t0) / units)
    return best


def alloc_free_vllm(pool: Any, n: int, iters: int) -> Callable[[], int]:
    def run() -> int:
        for _ in range(iters):
            blocks = pool.get_new_blocks(n)
            pool.free_blocks(reversed(blocks))
        return iters * n

    return run


def alloc_free_kb(pool: kb.BlockPool, n: int, iters: int) -> Callable[[], int]:
    def run() -> int:
        for _ in range(iters):
            ids = pool.get_new_blocks(n)
            pool.free_blocks(ids[::-1])
        return iters * n

    return run


class CacheBench:
    """Caches `n` fresh full blocks per call (new hashes every time, so no duplicates), then
    looks each hash up; only the cache call or the lookups are timed."""

    def __init__(self, n: int, rounds: int) -> None:
        self.n = n
        self.hashes = [[os.urandom(32) for _ in range(n)] for _ in range(rounds)]
        self.misses = [os.urandom(32) for _ in range(n)]
        self.tokens = list(range(n * BLOCK_SIZE))

    def vllm(self, pool: Any) -> tuple[float, float, float]:
        cache = hit = miss = float("inf")
        for hashes in self.hashes:
            blocks = pool.get_new_blocks(self.n)
            req = SimpleNamespace(
                block_hashes=hashes,
                all_token_ids=self.tokens,
                lora_request=None,
                session_id=None,
                mm_features=[],
                cache_salt=None,
                prompt_embeds=None,
            )
            t0 = time.perf_counter_ns()
            pool.cache_full_blocks(req, blocks, 0, self.n, BLOCK_SIZE, 0)
            t1 = time.perf_counter_ns()
            for h in hashes:
                pool.get_cached_block(h, [0])
            t2 = time.perf_counter_ns()
            for h in self.misses:
                pool.get_cached_block(h, [0])
            t3 = time.perf_counter_ns()
            pool.free_blocks(reversed(blocks))
            cache, hit, miss = min(cache, t1 - t0), min(hit, t2 - t1), min(miss, t3 - t2)
        return cache / self.n, hit / self.n, miss / self.n

    def kb(self, pool: kb.BlockPool) -> tuple[float, float, float]:
        cache = hit = miss = float("inf")
        for hashes in self.hashes:
            blocks = pool.get_new_blocks(self.n)
            t0 = time.perf_counter_ns()
            pool.cache_full_blocks(hashes, blocks, 0, self.n, BLOCK_SIZE, 0, self.tokens)
            t1 = time.perf_counter_ns()
            for h in hashes:
                pool.get_cached_block(h, [0])
            t2 = time.perf_counter_ns()
            for h in self.misses:
                pool.get_cached_block(h, [0])
            t3 = time.perf_counter_ns()
            pool.free_blocks(blocks[::-1])
            cache, hit, miss = min(cache, t1 - t0), min(hit, t2 - t1), min(miss, t3 - t2)
        return cache / self.n, hit / self.n, miss / self.n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1 << 20, help="pool size (1M)")
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--events", action="store_true", help="enable KV cache events")
    parser.add_argument("--gc", choices=["freeze", "off"], default="freeze")
    args = parser.parse_args()

    vp = VllmBlockPool(args.blocks, True, BLOCK_SIZE, enable_kv_cache_events=args.events)
    kp = kb.BlockPool(args.blocks, True, BLOCK_SIZE, enable_kv_cache_events=args.events)
    vp.get_new_blocks(HELD)
    kp.get_new_blocks(HELD)
    gc.collect()
    gc.freeze()
    if args.gc == "off":
        gc.disable()

    rows: list[tuple[str, str, float, float]] = []
    for n in (1, 16, 256):
        iters = max(8, 2048 // n)  # short repeats: the best one is rarely preempted
        v = best_ns(alloc_free_vllm(vp, n, iters), args.repeats)
        k = best_ns(alloc_free_kb(kp, n, iters), args.repeats)
        rows.append((f"get_new_blocks({n}) + free_blocks", "ns/block", v, k))

    bench = CacheBench(256, 50)
    v_cache, v_hit, v_miss = bench.vllm(vp)
    k_cache, k_hit, k_miss = bench.kb(kp)
    vp.take_events()
    kp.take_events()
    rows.append(("cache_full_blocks(256 blocks)", "ns/block", v_cache, k_cache))
    rows.append(("get_cached_block hit (1 group)", "ns/call", v_hit, k_hit))
    rows.append(("get_cached_block miss (1 group)", "ns/call", v_miss, k_miss))

    print(
        f"pool: {args.blocks} blocks, block_size {BLOCK_SIZE}, events {args.events}, "
        f"best of {args.repeats}"
    )
    print(f"{'operation':<36} {'unit':<9} {'vLLM':>10} {'kvblocks':>10} {'ratio':>8}")
    for name, unit, v, k in rows:
        print(f"{name:<36} {unit:<9} {v:>10.1f} {k:>10.1f} {v / k:>7.1f}x")


if __name__ == "__main__":
    main()
