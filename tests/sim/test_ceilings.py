"""The hit-rate ceilings (kvblocks.sim.ceilings) against naive references, and the
simulator's prefix hit rate against a plain LRU cache over Mooncake hash ids."""

from __future__ import annotations

import heapq
import json
import random
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

import kvblocks
import pytest
from kvblocks.sim import cli
from kvblocks.sim.ceilings import Ceilings, belady_hits, block_keys
from kvblocks.sim.workloads import synthetic_mooncake

needs_kb = pytest.mark.skipif(
    not hasattr(kvblocks, "KVCacheManager"), reason="kvblocks manager not built"
)

Log = list[tuple[int, list[int]]]
STORE, LOOKUP = 0, 1


# ------------------------------------------------------------------ naive references
def naive_infinite(log: Log) -> list[int]:
    """Hit blocks per lookup when nothing is ever evicted."""
    stored: set[int] = set()
    out = []
    for kind, keys in log:
        if kind == STORE:
            stored.update(keys)
            continue
        n = 0
        while n < len(keys) and keys[n] in stored:
            n += 1
        out.append(n)
    return out


def naive_belady(log: Log, capacity: int) -> list[int]:
    """Belady's rule written out: on a store into a full cache, scan the future for the
    next lookup of every cached key and of the new one; drop the farthest."""

    def next_use(key: int, after: int) -> tuple[int, int]:
        """(the next lookup listing ``key``, its place there); later places go first."""
        for pos in range(after + 1, len(log)):
            kind, keys = log[pos]
            if kind == LOOKUP and key in keys:
                return (pos, keys.index(key))
        return (len(log) + 1, 0)

    cache: set[int] = set()
    out = []
    for pos, (kind, keys) in enumerate(log):
        if kind == LOOKUP:
            n = 0
            while n < len(keys) and keys[n] in cache:
                n += 1
            out.append(n)
            continue
        for k in keys:
            if k in cache or capacity == 0:
                continue
            if len(cache) < capacity:
                cache.add(k)
                continue
            far = max(cache, key=lambda c: next_use(c, pos))
            if next_use(far, pos) > next_use(k, pos):
                cache.remove(far)
                cache.add(k)
    return out


def heap_belady(log: Log, capacity: int) -> list[int]:
    """Belady's rule with a Python heap with lazy deletion (the simulator's implementation
    before it moved to the extension): fast enough for logs too long for the naive one."""
    width = 1 + max((len(keys) for _, keys in log), default=0)
    never = (len(log) + 1) * width
    uses: dict[int, deque[int]] = {}
    for pos, (kind, keys) in enumerate(log):
        if kind == LOOKUP:
            for i, k in enumerate(keys):
                uses.setdefault(k, deque()).append(pos * width + i)

    def next_use(key: int) -> int:
        q = uses.get(key)
        return q[0] if q else never

    cached: dict[int, int] = {}
    heap: list[tuple[int, int]] = []
    out: list[int] = []
    for kind, keys in log:
        if kind == LOOKUP:
            hits, missed = 0, False
            for k in keys:
                uses[k].popleft()
                if k in cached:
                    hits += 0 if missed else 1
                    cached[k] = next_use(k)
                    heapq.heappush(heap, (-cached[k], k))
                else:
                    missed = True
            out.append(hits)
            continue
        for k in keys:
            if k in cached or capacity <= 0:
                continue
            nu = next_use(k)
            if len(cached) >= capacity:
                while cached.get(heap[0][1]) != -heap[0][0]:
                    heapq.heappop(heap)
                if -heap[0][0] <= nu:
                    continue
                del cached[heapq.heappop(heap)[1]]
            cached[k] = nu
            heapq.heappush(heap, (-nu, k))
    return out


def _random_log(rng: random.Random, n_events: int) -> Log:
    """Stores and lookups of prefix chains over a small tree of blocks."""
    chains = [[rng.randrange(1, 6)] for _ in range(3)]
    for _ in range(8):
        base = rng.choice(chains)
        chains.append([*base[: rng.randint(1, len(base))], rng.randrange(10, 40)])
    log: Log = []
    for _ in range(n_events):
        chain = rng.choice(chains)
        # a prefix of distinct keys, as block_keys makes them
        keys = list(dict.fromkeys(chain[: rng.randint(1, len(chain))]))
        log.append((rng.choice((STORE, LOOKUP)), keys))
    return log


# ------------------------------------------------------------------ tiny hand cases
def test_belady_by_hand() -> None:
    # Capacity 2. Stores a, b, then c into the full cache: a is looked up next (event 3),
    # c after it (4), b last (5), so b goes. LRU would drop a instead and miss it.
    a, b, c = 1, 2, 3
    log: Log = [(STORE, [a]), (STORE, [b]), (STORE, [c]), (LOOKUP, [a]), (LOOKUP, [c]),
                (LOOKUP, [b])]  # fmt: skip
    assert belady_hits(log, 2) == [1, 1, 0]
    assert naive_belady(log, 2) == [1, 1, 0]
    assert naive_infinite(log) == [1, 1, 1]
    # A new block used farther away than everything cached is not kept at all.
    log = [(STORE, [a, b]), (STORE, [c]), (LOOKUP, [a, b]), (LOOKUP, [c])]
    assert belady_hits(log, 2) == [2, 0]
    # A hit needs every block before it: [b] cached alone is no hit for [a, b].
    log = [(STORE, [b]), (LOOKUP, [a, b])]
    assert belady_hits(log, 4) == [0]
    # Blocks wanted by the same lookup: the later one in it goes, the prefix stays. Here
    # c comes last in [a, b, c], so it is not kept and a, b hit (dropping a: no hit).
    log = [(STORE, [a, b]), (STORE, [c]), (LOOKUP, [a, b, c])]
    assert belady_hits(log, 2) == [2]
    log = [(STORE, [b, c]), (STORE, [a]), (LOOKUP, [a, b, c])]
    assert belady_hits(log, 2) == [2]  # a replaces c


@pytest.mark.parametrize("seed", range(40))
def test_belady_and_infinite_match_naive_references(seed: int) -> None:
    rng = random.Random(seed)
    log = _random_log(rng, rng.randint(5, 40))
    inf = naive_infinite(log)
    for capacity in (0, 1, 2, 3, 5, 8, 100):
        ideal = belady_hits(log, capacity)
        assert ideal == naive_belady(log, capacity), capacity
        assert all(i <= j for i, j in zip(ideal, inf, strict=True))
    assert belady_hits(log, 10**6) == inf  # room for every block: nothing is ever evicted


@pytest.mark.parametrize("seed", range(3))
def test_belady_on_long_logs_matches_the_heap_reference(seed: int) -> None:
    # Long enough that the extension's heap is rebuilt (over 4,096 stale entries) many
    # times: a few hot chains looked up again and again, plus cold stores that evict.
    rng = random.Random(seed)
    chains = [[1000 * c + j for j in range(rng.randint(2, 12))] for c in range(40)]
    log: Log = []
    for i in range(6000):
        chain = chains[min(int(rng.expovariate(0.2)), len(chains) - 1)]
        keys = chain[: rng.randint(1, len(chain))]
        log.append((STORE if rng.random() < 0.4 else LOOKUP, keys))
        if i % 7 == 0:
            log.append((STORE, [10**6 + i, 10**6 + i + 1]))
    for capacity in (0, 5, 30, 120, 10**6):
        assert belady_hits(log, capacity) == heap_belady(log, capacity), capacity
    assert belady_hits(log, 10**6) == naive_infinite(log)


@pytest.mark.parametrize("seed", range(10))
def test_ceilings_record_the_log_they_are_given(seed: int) -> None:
    rng = random.Random(seed)
    log = _random_log(rng, 30)
    ceil = Ceilings(block_size=4, capacity=3)
    infinite = []
    for kind, keys in log:
        if kind == STORE:
            ceil.store(keys)
        else:  # num_tokens one past the keys' blocks: every key may hit
            infinite.append(ceil.lookup(keys, 4 * len(keys) + 1, tenant=None))
    assert infinite == [4 * n for n in naive_infinite(log)]
    res = ceil.result()
    lookups = [keys for kind, keys in log if kind == LOOKUP]
    assert res.queried_tokens == sum(4 * len(k) + 1 for k in lookups)
    assert res.ideal_hit_tokens == 4 * sum(naive_belady(log, 3))
    assert res.infinite_hit_tokens == sum(infinite)


def test_lookup_never_hits_the_last_token() -> None:
    ceil = Ceilings(block_size=4, capacity=10)
    keys = block_keys(list(range(8)), 4)
    ceil.store(keys)
    assert ceil.lookup(keys, 8) == 4  # 8 tokens: at most 7 hit, so one block
    assert ceil.lookup(keys, 9) == 8


def test_block_keys_share_exactly_the_common_prefix() -> None:
    a = block_keys([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    b = block_keys([1, 2, 3, 4, 5, 6, 7, 0, 9, 9, 9, 9], 4)
    assert len(a) == 2 and len(b) == 3
    assert a[0] == b[0] and a[1] != b[1]
    assert block_keys([1, 2, 3, 4], 4, salt="t") != block_keys([1, 2, 3, 4], 4)


# ------------------------------------------------------------------ Mooncake references
BLOCK = 512


def lru_reference(records: list[dict[str, Any]], capacity: int) -> float:
    """Token hit rate of a plain LRU cache of ``capacity`` blocks over the hash ids.

    A request looks up its hash ids in order up to its last full block before the last
    token (vLLM always recomputes the last token), then uses every full block of its
    prompt, plus the blocks its prompt tail and outputs fill (ids of its own), most
    recently the first (vLLM frees a request's blocks tail first).
    """
    lru: OrderedDict[object, None] = OrderedDict()
    queried = hits = 0
    for i, r in enumerate(records):
        n, ids = r["input_length"], r["hash_ids"]
        found = 0
        for h in ids[: (n - 1) // BLOCK]:
            if h not in lru:
                break
            found += 1
        queried += n
        hits += found * BLOCK
        own = (n + r["output_length"] - 1) // BLOCK - n // BLOCK
        for key in reversed(ids[: n // BLOCK] + [("own", i, j) for j in range(own)]):
            lru[key] = None
            lru.move_to_end(key)
        while len(lru) > capacity:
            lru.popitem(last=False)
    return hits / queried


def seen_before_share(records: list[dict[str, Any]]) -> float:
    """The share of prompt tokens whose hash id an earlier request had as a full block."""
    seen: set[int] = set()
    queried = hits = 0
    for r in records:
        n, ids = r["input_length"], r["hash_ids"]
        queried += n
        hits += BLOCK * sum(h in seen for h in ids[: (n - 1) // BLOCK])
        seen.update(ids[: n // BLOCK])
    return hits / queried


def _simulate_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert cli.main(["simulate", *argv]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


@needs_kb
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_mooncake_hit_rate_equals_an_lru_over_hash_ids(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, seed: int
) -> None:
    # Sessions far enough apart that the running requests hold a small part of the cache.
    records = synthetic_mooncake(
        seed, 150, session_gap_ms=20000, turn_gap_ms=(5000, 30000), max_output=100
    )
    path = tmp_path / "mc.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    doc = _simulate_json(
        capsys, "--trace", str(path), "--model", "llama-3.1-8b", "--block-size", "512",
        "--sweep", "num_blocks=100,150,200,400,100000", "--json",
    )  # fmt: skip
    share = seen_before_share(records)
    evicting = 0
    for run in doc["runs"]:
        assert run["infinite_cache_hit_rate"] == pytest.approx(share, abs=1e-6)
        assert run["prefix_hit_rate"] <= run["infinite_cache_hit_rate"]
        if run["peak_usage"] > 0.75:
            continue  # running requests hold much of the cache: LRU is not the model
        lru = lru_reference(records, run["num_blocks"] - 1)
        assert run["prefix_hit_rate"] == pytest.approx(lru, abs=0.01), run["num_blocks"]
        evicting += run["prefix_hit_rate"] < share - 0.002
    assert evicting  # at least one compared size evicts blocks it later misses
