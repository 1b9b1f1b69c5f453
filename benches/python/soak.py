"""Soak test of `kvblocks.BlockPool`: millions of operations driven as a serving engine
drives the pool (prefix hits, touch, allocate, cache, decode, preempt, free, evict, reset),
printing operations, seconds and RSS at intervals, then checking the invariants.

    python benches/python/soak.py [--ops 10000000] [--blocks 1000000] [--seed 0]

Every count below is a kvblocks call. At the end every live request is freed and the pool
must be whole again: all blocks free, all ref counts 0, the queue a permutation of the
blocks, `check_invariants()` clean, the prefix cache resettable. Exit status 1 if an
invariant fails or RSS grew more than `--rss-slack-mib` after warm-up (the first tenth).
tests/test_soak.py runs a short version of `soak()`.
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


def documents(n: int, max_blocks: int, rng: random.Random) -> list[list[bytes]]:
    """Chained block hashes of `n` token streams; streams share prefixes in families."""
    out: list[list[bytes]] = []
    for d in range(n):
        family = d % 8
        tokens = [family] * (BS * (1 + family)) + [rng.randrange(50_000) for _ in range(max_blocks * BS)]
        out.append(kb.Request(f"doc{d}", tokens[: max_blocks * BS], kb.BlockHasher(BS)).block_hashes)
    return out


def soak(
    num_blocks: int,
    num_ops: int,
    seed: int = 0,
    report: Callable[[int, float, float], None] | None = None,
    report_every: int = 1_000_000,
) -> kb.BlockPool:
    """Runs about `num_ops` pool calls; returns the drained pool (asserts the invariants)."""
    if num_blocks <= 64 * 2:
        raise ValueError("the pool must hold at least two of the largest requests")
    rng = random.Random(seed)
    pool = kb.BlockPool(num_blocks, True, BS, False)
    docs = documents(64, 64, rng)
    live: list[list[int]] = []
    held = 0  # blocks referenced by live tables, with multiplicity
    ops = 0
    next_report = report_every
    start = time.perf_counter()
    while ops < num_ops:
        action = rng.random()
        if action < 0.45 or not live:
            # Admit a request: prefix hit, touch, allocate, cache its full blocks.
            hashes = docs[rng.randrange(len(docs))]
            length = rng.randrange(1, len(hashes) * BS)
            full = length // BS
            hits: list[int] = []
            for h in hashes[: (length - 1) // BS]:
                got = pool.get_cached_block(h, [0])
                ops += 1
                if got is None:
                    break
                hits.append(got[0])
            need = -(-length // BS) - len(hits)
            if need + len(hits) > pool.get_num_free_blocks():
                # Preempt the oldest request to make room.
                table = live.pop(0)
                pool.free_blocks(table[::-1])
                held -= len(table)
                ops += 2
                continue
            pool.touch(hits)
            table = hits + pool.get_new_blocks(need)
            pool.cache_full_blocks(hashes, table, len(hits), full, BS, 0)
            live.append(table)
            held += len(table)
            ops += 4
        elif action < 0.75:
            # Decode: a random request grows by one block, if there is room.
            table = live[rng.randrange(len(live))]
            if pool.get_num_free_blocks() > 0:
                table.extend(pool.get_new_blocks(1))
                held += 1
            ops += 2
        elif action < 0.97:
            # Finish a random request.
            i = rng.randrange(len(live))
            live[i], live[-1] = live[-1], live[i]
            table = live.pop()
            pool.free_blocks(table[::-1])
            held -= len(table)
            ops += 1
        elif action < 0.995:
            pool.evict_blocks({rng.randrange(1, num_blocks) for _ in range(8)})
            ops += 1
        else:
            assert pool.reset_prefix_cache() is (held == 0)
            ops += 1
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
    return pool


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=10_000_000)
    ap.add_argument("--blocks", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rss-slack-mib", type=float, default=16.0)
    args = ap.parse_args()
    samples: list[tuple[int, float, float]] = []

    def report(ops: int, seconds: float, rss: float) -> None:
        samples.append((ops, seconds, rss))
        print(f"ops={ops:>11,}  t={seconds:8.1f}s  rss={rss:8.1f} MiB", flush=True)

    print(f"pool of {args.blocks:,} blocks, {args.ops:,} ops; rss at start {rss_mib():.1f} MiB")
    t0 = time.perf_counter()
    try:
        soak(args.blocks, args.ops, args.seed, report, max(args.ops // 20, 1))
    except (AssertionError, RuntimeError) as exc:
        print(f"INVARIANT FAILED: {exc!r}")
        return 1
    total = time.perf_counter() - t0
    warm = samples[len(samples) // 10][2] if samples else rss_mib()
    end = samples[-1][2] if samples else rss_mib()
    print(f"done: {args.ops:,} ops in {total:.1f}s ({args.ops / total / 1e6:.2f} M ops/s); "
          f"rss after warm-up {warm:.1f} MiB, at end {end:.1f} MiB; invariants hold")
    if end - warm > args.rss_slack_mib:
        print(f"RSS GREW by {end - warm:.1f} MiB after warm-up")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
