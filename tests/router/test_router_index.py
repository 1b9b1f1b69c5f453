"""kvblocks.router.KVIndex against the managers it indexes: engines (kvblocks managers
with events on) run multi-tenant traffic (shared prefixes, cache salts, LoRA adapters,
chunked prefills, preemptions, evictions, prefix-cache resets, duplicate blocks, a
sliding-window and a hybrid layout), their events go through the wire (map and array
layouts) into the index, and after every step each probe's hit per engine must equal that
engine's own `get_computed_blocks`. Then each fault of the stream, one test each.

`KVBLOCKS_ROUTER_PROBES` sets the probes per step (default 6; the docs' 100,000-probe run
used 60).
"""

from __future__ import annotations

import os
import random
from typing import Any

import kvblocks as kb
import pytest
from kvblocks._core import external_block_hashes
from kvblocks.router import KVIndex
from manager_driver import HBS, MAX_MODEL_LEN, PREFIXES, Driver, KbEngine, random_run

SEED = os.environ.get("PYTHONHASHSEED")
LAYOUTS: list[list[tuple[int, int | None]]] = [
    [(4, None)],
    [(4, 8)],
    [(4, None), (4, 8)],
    [(4, None), (4, 8), (4, 13)],
]
PROBES = int(os.environ.get("KVBLOCKS_ROUTER_PROBES", "6"))


class EventEngine(KbEngine):
    def manager_options(self) -> dict[str, Any]:
        return {"enable_kv_cache_events": True}


class Feed:
    """One engine: its driver, and the stream of its events into the index."""

    def __init__(self, index: KVIndex, name: str, layout: list[tuple[int, int | None]], fmt: str):
        self.name = name
        self.fmt = fmt
        self.driver = Driver(EventEngine, layout, 40, True)
        self.seq = 0
        self.scheduler = self.driver.model.scheduler_block_size
        register(index, name, self.driver, seed=SEED)

    def take(self) -> bytes:
        events = self.driver.engine.mgr.take_events()
        return kb.encode_event_batch(0.0, events, format=self.fmt)

    def publish(self, index: KVIndex) -> None:
        index.ingest(self.name, self.take(), self.seq)
        self.seq += 1


def register(index: KVIndex, name: str, driver: Driver, seed: str | None) -> None:
    index.add_engine(
        name,
        driver.engine.config,
        max_model_len=MAX_MODEL_LEN,
        hash_block_size=HBS,
        hash_algo="sha256",
        python_hash_seed=seed,
        scheduler_block_size=driver.model.scheduler_block_size,
    )


def probe(rng: random.Random, history: list[list[int]]) -> tuple[list[int], str | None, int | None]:
    if history and rng.random() < 0.7:
        tokens = list(rng.choice(history))
        tokens = tokens[: rng.randrange(1, len(tokens) + 1)] + [rng.randrange(4)] * rng.randrange(3)
    else:
        tokens = rng.choice(PREFIXES) + [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
    return tokens[: MAX_MODEL_LEN - 8], rng.choice([None, None, "a", "b"]), rng.choice([None, 1, 2])


def divergences(index: KVIndex, feeds: list[Feed], rng: random.Random) -> tuple[int, int]:
    """(probes, probes whose index hit differs from the engine's own), over all engines."""
    history = [t for f in feeds for t, _ in f.driver.history]
    n = bad = 0
    for i in range(PROBES):
        tokens, salt, lora = probe(rng, history)
        lora_kw: dict[str, Any] = {}
        if lora is not None:
            lora_kw = {"lora_name": f"lora{lora}", "lora_path": f"/lora{lora}"}
        hits = index.hits(tokens, cache_salt=salt, **lora_kw)
        for f in feeds:
            req = f.driver.engine.make_request(f"probe{i}", tokens, salt, lora)
            _, want = f.driver.engine.mgr.get_computed_blocks(req)
            n += 1
            bad += hits[f.name].gpu_tokens != want
    return n, bad


def test_the_index_answers_what_each_engine_would() -> None:
    index = KVIndex()
    feeds = [
        Feed(index, f"e{i}", layout, ["map", "array"][i % 2]) for i, layout in enumerate(LAYOUTS)
    ]
    rng = random.Random(7)
    probes = bad = hits = 0
    for _ in range(150):
        for f in feeds:
            random_run(f.driver, rng, 1)
            f.publish(index)
        n, b = divergences(index, feeds, rng)
        probes += n
        bad += b
        hits += sum(h.gpu_tokens > 0 for h in index.hits(PREFIXES[0] + [0, 1]).values())
    assert probes >= 150 * PROBES * len(feeds)
    assert bad == 0, f"{bad} of {probes} probes differ"
    assert hits > 0, "the traffic never cached a shared prefix"
    for f in feeds:
        st = index.status(f.name)
        assert st["freshness"] == "exact"
        assert st["hash_checks"] > 0


def settled(index: KVIndex, feed: Feed, rng: random.Random) -> int:
    """Runs a few more steps (events delivered in order) and returns the divergences."""
    for _ in range(20):
        random_run(feed.driver, rng, 1)
        feed.publish(index)
    return divergences(index, [feed], rng)[1]


def one_engine(layout: list[tuple[int, int | None]] | None = None) -> tuple[KVIndex, Feed]:
    index = KVIndex()
    return index, Feed(index, "e", layout or [(4, None), (4, 8)], "map")


def warm(index: KVIndex, feed: Feed, rng: random.Random, steps: int = 30) -> None:
    for _ in range(steps):
        random_run(feed.driver, rng, 1)
        feed.publish(index)


def test_a_dropped_batch_is_caught_up_by_replay() -> None:
    index, feed = one_engine()
    rng = random.Random(1)
    warm(index, feed, rng)
    random_run(feed.driver, rng, 3)
    lost, seq = feed.take(), feed.seq
    feed.seq += 1
    random_run(feed.driver, rng, 3)
    feed.publish(index)
    st = index.status("e")
    assert (st["freshness"], st["held"], st["gaps"]) == ("catching_up", 1, 1)
    assert index.hits([1, 2, 3, 4, 5])["e"].freshness == "catching_up"
    assert index.ingest("e", lost, seq) == (2, "exact")
    assert divergences(index, [feed], rng)[1] == 0
    assert settled(index, feed, rng) == 0


def test_a_duplicated_batch_is_dropped() -> None:
    index, feed = one_engine()
    rng = random.Random(2)
    warm(index, feed, rng)
    random_run(feed.driver, rng, 3)
    payload = feed.take()
    index.ingest("e", payload, feed.seq)
    assert index.ingest("e", payload, feed.seq) == (0, "exact")
    feed.seq += 1
    assert index.status("e")["duplicates"] == 1
    assert settled(index, feed, rng) == 0


def test_reordered_batches_are_applied_in_order() -> None:
    index, feed = one_engine()
    rng = random.Random(3)
    warm(index, feed, rng)
    batches = []
    for _ in range(4):
        random_run(feed.driver, rng, 2)
        batches.append((feed.take(), feed.seq))
        feed.seq += 1
    for payload, seq in [batches[2], batches[0], batches[3], batches[1]]:
        index.ingest("e", payload, seq)
    assert index.status("e")["freshness"] == "exact"
    assert divergences(index, [feed], rng)[1] == 0


def test_a_restarted_publisher_resets_the_engine() -> None:
    index, feed = one_engine()
    rng = random.Random(4)
    warm(index, feed, rng)
    assert index.status("e")["blocks"] > 0
    # The engine restarts: a new, empty manager, and its publisher counts from 0 again.
    feed.driver = Driver(EventEngine, [(4, None), (4, 8)], 40, True)
    feed.seq = 0
    warm(index, feed, rng, 5)
    st = index.status("e")
    assert (st["resets"], st["freshness"]) == (1, "exact")
    assert divergences(index, [feed], rng)[1] == 0


def test_an_unrecoverable_gap_is_stale_until_a_clear() -> None:
    index, feed = one_engine()
    rng = random.Random(5)
    warm(index, feed, rng)
    random_run(feed.driver, rng, 5)
    feed.take()
    feed.seq += 1
    warm(index, feed, rng, 3)
    assert index.skip_gap("e") == "stale"
    warm(index, feed, rng, 3)
    assert index.status("e")["freshness"] == "stale"
    while feed.driver.running:  # vLLM resets the prefix cache only with no block in use
        feed.driver.finish(0)
    feed.driver.reset()  # reset_prefix_cache: AllBlocksCleared
    feed.publish(index)
    assert index.status("e")["freshness"] == "exact"
    assert settled(index, feed, rng) == 0


def test_a_wrong_python_hash_seed_is_caught() -> None:
    index = KVIndex()
    driver = Driver(EventEngine, [(4, None)], 40, True)
    register(index, "e", driver, seed="not-the-engine-seed")
    driver.arrive([5, 6, 7, 8, 9, 10, 11, 12, 13], [], None, None)
    driver.admit(64, 0)
    payload = kb.encode_event_batch(0.0, driver.engine.mgr.take_events())
    with pytest.raises(kb.HashMismatchError, match="PYTHONHASHSEED"):
        index.ingest("e", payload, 0)
    st = index.status("e")
    assert (st["freshness"], st["hash_mismatches"], st["blocks"]) == ("mismatched", 1, 0)
    assert index.hits([5, 6, 7, 8, 9, 10, 11, 12, 13])["e"].freshness == "mismatched"


def test_bad_input_leaves_the_index_unchanged() -> None:
    index, feed = one_engine([(4, None)])
    rng = random.Random(6)
    warm(index, feed, rng)
    before = index.status("e")
    random_run(feed.driver, rng, 5)
    good = feed.take()
    for bad in [
        good[: len(good) // 2],
        good + b"\x00",
        b"\xc1",
        b"\x93\xcb" + b"\x00" * 8 + b"\x91\x01\xc0",
    ]:
        with pytest.raises(kb.InvalidEventError):
            index.ingest("e", bad, feed.seq)
    with pytest.raises(kb.InvalidEventError, match="exceeds"):
        index.ingest("e", bytes(257 << 20), feed.seq)
    with pytest.raises(kb.UnknownEngineError):
        index.ingest("nope", good, feed.seq)
    with pytest.raises(kb.UnknownEngineError):
        index.hits([1, 2, 3], engines=["nope"])
    stored = kb.BlockStored([1], None, [0, 1, 2, 3], 4, None, "GPU", None, group_idx=3)
    with pytest.raises(kb.InvalidEventError, match="group_idx 3"):
        index.ingest("e", kb.encode_event_batch(0.0, [stored]), feed.seq)
    stored = kb.BlockStored([1], None, list(range(8)), 8, None, "GPU", None, group_idx=0)
    with pytest.raises(kb.InvalidEventError, match="block_size 8"):
        index.ingest("e", kb.encode_event_batch(0.0, [stored]), feed.seq)
    with pytest.raises(kb.InvalidArgumentError):
        index.hits([])
    assert index.status("e") == before
    index.ingest("e", good, feed.seq)
    feed.seq += 1
    assert divergences(index, [feed], rng)[1] == 0


def test_host_tier_hits_follow_the_gpu_hit() -> None:
    index = KVIndex()
    config = kb.KVCacheConfig(
        40,
        [],
        [
            kb.KVCacheGroupSpec(
                ["l"],
                kb.FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16"),
            )
        ],
    )
    index.add_engine("e", config, max_model_len=80, hash_block_size=4, host_tier=True)
    tokens = list(range(20))
    hashes = external_block_hashes(
        kb.Request("r", tokens, kb.BlockHasher(4, "sha256_cbor")).block_hashes
    )
    gpu = kb.BlockStored(hashes[:2], None, tokens[:8], 4, None, "GPU", None, group_idx=0)
    cpu = kb.BlockStored(hashes[2:4], hashes[1], tokens[8:16], 4, None, "CPU", None, group_idx=0)
    index.ingest("e", kb.encode_event_batch(0.0, [gpu, cpu]), 0)
    hit = index.hits(tokens)["e"]
    assert (hit.gpu_tokens, hit.host_tokens, hit.gpu_blocks, hit.host_blocks) == (8, 8, 2, 2)
    removed = kb.BlockRemoved([hashes[1]], "GPU", group_idx=0)
    index.ingest("e", kb.encode_event_batch(0.0, [removed]), 1)
    hit = index.hits(tokens)["e"]
    assert (hit.gpu_tokens, hit.host_tokens) == (4, 0)
    # Chunks of two blocks: the chunk holding the GPU hit's end is looked up from its
    # start, and counts only where the run reaches a whole chunk past the GPU hit.
    index.add_engine(
        "c", config, max_model_len=80, hash_block_size=4, host_tier=True, host_block_size=8
    )
    cpu = kb.BlockStored(hashes[:4], None, tokens[:16], 4, None, "CPU", None, group_idx=0)
    index.ingest("c", kb.encode_event_batch(0.0, [gpu, cpu]), 0)
    assert (index.hits(tokens)["c"].gpu_tokens, index.hits(tokens)["c"].host_tokens) == (8, 8)
    index.ingest("c", kb.encode_event_batch(0.0, [removed]), 1)
    assert (index.hits(tokens)["c"].gpu_tokens, index.hits(tokens)["c"].host_tokens) == (4, 12)
    with pytest.raises(kb.InvalidArgumentError, match="host_block_size 6"):
        index.add_engine(
            "x", config, max_model_len=80, hash_block_size=4, host_tier=True, host_block_size=6
        )
    swa = kb.KVCacheConfig(
        40,
        [],
        [
            kb.KVCacheGroupSpec(
                ["l"],
                kb.SlidingWindowSpec(
                    block_size=4, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8
                ),
            )
        ],
    )
    with pytest.raises(kb.UnsupportedError, match="full-attention"):
        index.add_engine("x", swa, max_model_len=80, hash_block_size=4, host_tier=True)
    assert sorted(index.engines()) == ["c", "e"]
