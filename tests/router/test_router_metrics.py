"""kvblocks.router.RouterMetrics: each engine's freshness and stream counters, in the
Prometheus text format and as a prometheus_client collector."""

from __future__ import annotations

import kvblocks as kb
import pytest
from kvblocks.router import KVIndex, RouterMetrics


def engine_index() -> tuple[KVIndex, kb.KVCacheManager]:
    spec = kb.FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")
    config = kb.KVCacheConfig(16, [], [kb.KVCacheGroupSpec(["l"], spec)])
    index = KVIndex()
    index.add_engine("e0", config, max_model_len=64, hash_block_size=4)
    mgr = kb.KVCacheManager(config, 64, 4, enable_kv_cache_events=True)
    return index, mgr


def test_a_gap_shows_in_the_metrics() -> None:
    index, mgr = engine_index()
    metrics = RouterMetrics(index, labels={"fleet": "f"})
    text = metrics.prometheus_text()
    assert 'kvblocks_router:freshness{fleet="f",engine="e0"} 1.0' in text  # batch 0 not seen
    mgr.allocate_slots(kb.Request("r", list(range(12)), kb.BlockHasher(4, "sha256_cbor")), 12)
    index.ingest("e0", kb.encode_event_batch(0.0, mgr.take_events()), 2)
    text = metrics.prometheus_text()
    assert 'kvblocks_router:held_batches{fleet="f",engine="e0"} 1.0' in text
    assert 'kvblocks_router:kv_events_gaps_total{fleet="f",engine="e0"} 1.0' in text
    assert text.count("# TYPE kvblocks_router:freshness gauge") == 1


def test_the_collector_reports_every_engine() -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest

    index, _ = engine_index()
    registry = CollectorRegistry()
    registry.register(RouterMetrics(index).collector())
    out = generate_latest(registry).decode()
    assert 'kvblocks_router:exact{engine="e0"} 0.0' in out
    assert 'kvblocks_router:blocks{engine="e0"} 0.0' in out
