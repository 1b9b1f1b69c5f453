"""Soak test of `kvblocks.BlockPool`: millions of operations driven as a serving engine
drives the pool (prefix hits, touch, allocate, cache, decode, preempt, free, evict, reset),
printing operations, seconds and RSS at intervals, then checking the invariants.

    python benches/python/soak.py [--ops 10000000] [--blocks 1000000] [--seed 0]

Every count below is a kvblocks call. At the end every live request is freed and the pool
must be whole again: all blocks free, all ref counts 0, the queue a permutation of the
blocks, `check_invariants()` clean, the prefix cache resettable. Exit status 1 if an
invariant fails or RSS grew more than `--rss-slack-mib` after warm-up (the first tenth).
tests/core/test_soak.py runs a short version of `soak()`.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable

import kvblocks as kb

BS = 16


def rss_mib() -> float:
    """Resident set size of this process (Linux /proc)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def soak(
    num_blocks: int,
    num_ops: int,
    seed: int = 0,
    report: Callable[[int, float, float], None] | None = None,
    report_every: int = 1_000_000,
) -> int:
    """Runs about `num_ops` kvblocks calls, then drains the pool and asserts the invariants.

    Returns the operation count at which the pool first reached 90% usage (the end of
    warm-up: from there on the driver's own data stops growing).
    """
    if num_blocks <= 64 * 2:
        raise ValueError("the pool must hold at least two of the largest requests")
    rng = random.Random(seed)
    pool = kb.BlockPool(num_blocks, True, BS, False)
    hasher = kb.BlockHasher(BS)
    # Eight prompt families (system prompts of 1..8 blocks) and a random token stream
    # that request tails are cut from: requests share prefixes, never whole contents.
    prefixes = [[f] * (BS * (1 + f)) for f in range(8)]
    stream = [rng.randrange(50_000) for _ in range(1 << 16)]
    live: list[list[int]] = []
    held = 0  # blocks referenced by live tables, with multiplicity
    ops = 0
    warm_at = -1
    next_report = report_every
    start = time.perf_counter()
    while ops < num_ops:
        action = rng.random()
        full_pool = pool.get_usage() > 0.9
        ops += 1
        if warm_at < 0 and full_pool:
            warm_at = ops
        if (action < 0.5 and not full_pool) or not live:
            # Admit a request: prefix hit, touch, allocate, cache its full blocks.
            off = rng.randrange(len(stream) - 48 * BS)
            tokens = prefixes[rng.randrange(8)] + stream[off : off + rng.randrange(1, 48 * BS)]
            hashes = kb.Request("r", tokens, hasher).block_hashes
            hits: list[int] = []
            for h in hashes[: (len(tokens) - 1) // BS]:
                got = pool.get_cached_block(h, [0])
                ops += 1
                if got is None:
                    break
                hits.append(got[0])
            need = -(-len(tokens) // BS) - len(hits)
            if need + len(hits) > pool.get_num_free_blocks():
                # Preempt the oldest request to make room.
                table = live.pop(0)
                pool.free_blocks(table[::-1])
                held -= len(table)
                ops += 2
                continue
            pool.touch(hits)
            table = hits + pool.get_new_blocks(need)
            pool.cache_full_blocks(hashes, table, len(hits), len(tokens) // BS, BS, 0)
            live.append(table)
            held += len(table)
            ops += 4
        elif action < 0.8:
            # Decode: a random request grows by one block, if there is room.
            table = live[rng.randrange(len(live))]
            if pool.get_num_free_blocks() > 0:
                table.extend(pool.get_new_blocks(1))
                held += 1
                ops += 1
        elif action < 0.995:
            # Finish a random request.
            i = rng.randrange(len(live))
            live[i], live[-1] = live[-1], live[i]
            table = live.pop()
            pool.free_blocks(table[::-1])
            held -= len(table)
        elif action < 0.999:
            pool.evict_blocks({rng.randrange(1, num_blocks) for _ in range(8)})
        else:
            assert pool.reset_prefix_cache() is (held == 0)
        if ops >= next_report:
            next_report += report_every
            if report:
                report(ops, time.perf_counter() - start, rss_mib())
    pool.check_invariants()
    for table in live:
        pool.free_blocks(table[::-1])
    pool.check_invariants()
    free = pool.get_free_block_ids()
    assert sorted(free) == list(range(1, num_blocks)), "blocks lost or duplicated"
    assert pool.get_num_free_blocks() == num_blocks - 1
    assert all(pool.get_ref_cnt(b) == 0 for b in range(num_blocks))
    assert pool.reset_prefix_cache()
    assert all(pool.get_block_hash(b) is None for b in range(0, num_blocks, 997))
    return warm_at


def soak_manager(
    num_blocks: int,
    num_ops: int,
    seed: int = 0,
    report: Callable[[int, float, float], None] | None = None,
    report_every: int = 1_000_000,
) -> int:
    """`soak` through a hybrid `KVCacheManager` (full attention + sliding window of 128
    tokens): admission with prefix hits, chunked prefill, decode with lookahead,
    preemption, finish, eviction and resets, one kvblocks call per operation. Returns
    the operation count at which the pool first reached 90% usage."""
    rng = random.Random(seed)
    full = kb.FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    swa = kb.SlidingWindowSpec(
        block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=128
    )
    groups = [kb.KVCacheGroupSpec(["full"], full), kb.KVCacheGroupSpec(["swa"], swa)]
    max_len = 64 * BS
    mgr = kb.KVCacheManager(kb.KVCacheConfig(num_blocks, [], groups), max_len, BS)
    hasher = kb.BlockHasher(BS)
    prefixes = [[f] * (BS * (1 + f)) for f in range(8)]
    stream = [rng.randrange(50_000) for _ in range(1 << 16)]
    live: list[kb.Request] = []
    ops = 0
    warm_at = -1
    next_id = 0
    next_report = report_every
    start = time.perf_counter()
    while ops < num_ops:
        action = rng.random()
        full_pool = mgr.usage > 0.9
        if warm_at < 0 and full_pool:
            warm_at = ops
        if (action < 0.3 and not full_pool) or not live:
            off = rng.randrange(len(stream) - 40 * BS)
            tokens = prefixes[rng.randrange(8)] + stream[off : off + rng.randrange(1, 40 * BS)]
            next_id += 1
            req = kb.Request(f"r{next_id}", tokens, hasher)
            blocks, hit = mgr.get_computed_blocks(req)
            chunk = min(rng.choice([64, 256, 1024]), req.num_tokens - hit)
            ops += 3
            if mgr.allocate_slots(req, chunk, hit, blocks) is None:
                mgr.free(live.pop(0))  # preempt the oldest to make room
                continue
            req.num_computed_tokens = hit + chunk
            live.append(req)
        elif action < 0.9:
            req = live[rng.randrange(len(live))]
            if req.num_computed_tokens >= req.num_tokens:
                if req.num_tokens >= max_len - 8:
                    live.remove(req)
                    mgr.free(req)
                    ops += 1
                    continue
                req.append_output_token_ids(rng.randrange(50_000))
            n = min(64, req.num_tokens - req.num_computed_tokens)
            ops += 1
            if mgr.allocate_slots(req, n, 0, None, rng.choice([0, 0, 4])) is None:
                live.remove(req)
                mgr.free(req)
                req.num_computed_tokens = 0
                req.num_preemptions += 1
            else:
                req.num_computed_tokens += n
        elif action < 0.998:
            i = rng.randrange(len(live))
            live[i], live[-1] = live[-1], live[i]
            mgr.free(live.pop())
            ops += 1
        elif action < 0.9995:
            mgr.evict_blocks({rng.randrange(1, num_blocks) for _ in range(8)})
            ops += 1
        else:
            assert mgr.reset_prefix_cache() is (not live)
            ops += 1
        if ops >= next_report:
            next_report += report_every
            if report:
                report(ops, time.perf_counter() - start, rss_mib())
                # The prefix map's table grows (doubling) as cached blocks accumulate,
                # bounded by the pool size: show the count beside the RSS.
                view = mgr.block_pool
                cached = sum(view.get_block_hash(b) is not None for b in range(num_blocks))
                print(f"    cached blocks: {cached:,}", flush=True)
    for req in live:
        mgr.free(req)
    view = mgr.block_pool
    assert sorted(view.get_free_block_ids()) == list(range(1, num_blocks)), "blocks lost"
    assert all(view.get_ref_cnt(b) == 0 for b in range(num_blocks))
    assert mgr.reset_prefix_cache()
    return warm_at


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=10_000_000)
    ap.add_argument("--blocks", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rss-slack-mib", type=float, default=16.0)
    ap.add_argument(
        "--manager", action="store_true", help="drive a hybrid KVCacheManager, not a pool"
    )
    args = ap.parse_args()
    samples: list[tuple[int, float, float]] = []

    def report(ops: int, seconds: float, rss: float) -> None:
        samples.append((ops, seconds, rss))
        print(f"ops={ops:>11,}  t={seconds:8.1f}s  rss={rss:8.1f} MiB", flush=True)

    what = "hybrid manager" if args.manager else "pool"
    print(f"{what} of {args.blocks:,} blocks, {args.ops:,} ops; rss at start {rss_mib():.1f} MiB")
    t0 = time.perf_counter()
    try:
        run = soak_manager if args.manager else soak
        warm_at = run(args.blocks, args.ops, args.seed, report, max(args.ops // 20, 1))
    except (AssertionError, RuntimeError) as exc:
        print(f"INVARIANT FAILED: {exc!r}")
        return 1
    total = time.perf_counter() - t0
    # RSS must be flat over the second half of the run (after warm-up: the pool full and
    # the prefix cache populated).
    after = [rss for ops, _, rss in samples if ops >= max(warm_at, args.ops // 2)]
    if warm_at < 0 or not after:
        print("the pool never filled: run more ops to measure RSS after warm-up")
        return 1
    at_full = next(rss for ops, _, rss in samples if ops >= warm_at)
    half, end = after[0], after[-1]
    print(
        f"done: {args.ops:,} ops in {total:.1f}s ({args.ops / total / 1e6:.2f} M ops/s); "
        f"pool 90% full at op {warm_at:,} (rss {at_full:.1f} MiB); rss at half-way "
        f"{half:.1f} MiB, max after {max(after):.1f} MiB, at end {end:.1f} MiB; "
        "invariants hold"
    )
    if max(after) - half > args.rss_slack_mib:
        print(f"RSS GREW by {max(after) - half:.1f} MiB over the second half")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
