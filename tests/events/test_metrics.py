"""KV cache metrics: accumulation of a manager's PrefixCacheStats, usage and event
counters; Prometheus export."""

from __future__ import annotations

from types import SimpleNamespace

import kvblocks
import pytest
from event_fixtures import AllBlocksCleared, BlockRemoved, BlockStored
from kvblocks.metrics import KVCacheMetrics, PrefixCacheStats

FIELDS = (
    "requests",
    "queries",
    "hits",
    "preempted_requests",
    "preempted_queries",
    "preempted_hits",
)
LOOKUPS = [(32, 16, False), (10, 0, False), (48, 32, True), (7, 7, False)]


def _step() -> PrefixCacheStats:
    stats = PrefixCacheStats()
    for tokens, hits, preempted in LOOKUPS:
        stats.record(tokens, hits, preempted)
    return stats


def _stats(**fields: object) -> PrefixCacheStats:
    s = PrefixCacheStats()
    for name, value in fields.items():
        setattr(s, name, value)
    return s


def _metrics() -> KVCacheMetrics:
    sink = kvblocks.EventSink()
    sink.publish([BlockStored([1, 2], None, [1, 2, 3, 4], 2, None, "GPU", None, None, 0)])
    sink.publish([BlockRemoved([2], "GPU", 0), BlockRemoved([1], "GPU", 0), AllBlocksCleared()])
    while sink.next_payload(0.0) is not None:
        pass
    m = KVCacheMetrics(sink, labels={"engine": "0", "model_name": 'm"x'})
    m.observe(_step(), usage=0.25)
    m.observe(_stats(reset=True, requests=1, queries=4, hits=4))
    m.observe(None, usage=0.5)
    return m


def test_counters_accumulate_and_include_events() -> None:
    values = {s.name: s.value for s in _metrics().samples()}
    assert values["kvblocks:kv_cache_usage_perc"] == 0.5
    assert values["kvblocks:prefix_cache_requests"] == 4
    assert values["kvblocks:prefix_cache_queries"] == 53
    assert values["kvblocks:prefix_cache_hits"] == 27
    assert values["kvblocks:prefix_cache_preempted_hits"] == 32
    assert values["kvblocks:prefix_cache_resets"] == 1
    assert values["kvblocks:kv_cache_evictions"] == 2
    assert values["kvblocks:kv_events_published_batches"] == 2
    assert values["kvblocks:kv_events_published_events"] == 4
    assert values["kvblocks:kv_events_dropped_batches"] == 0


def test_bad_observations_raise_and_change_nothing() -> None:
    m = KVCacheMetrics()
    before = m.samples()
    bad = SimpleNamespace(**{f: 0 for f in FIELDS})
    bad.requests = -1
    with pytest.raises(ValueError):
        m.observe(bad)
    with pytest.raises(ValueError):
        m.observe(usage=1.5)
    assert m.samples() == before


def _parsed(text: str) -> dict[str, tuple[str, float, dict[str, str]]]:
    parser = pytest.importorskip("prometheus_client.parser")
    out = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                out[sample.name] = (family.type, sample.value, sample.labels)
    return out


def test_text_format_parses_back() -> None:
    m = _metrics()
    parsed = _parsed(m.prometheus_text())
    assert len(parsed) == len(m.samples())
    for s in m.samples():
        name = s.name + ("_total" if s.kind == "counter" else "")
        kind, value, labels = parsed[name]
        assert (kind, value) == (s.kind, s.value)
        assert labels == {"engine": "0", "model_name": 'm"x'}


def test_prometheus_client_collector_matches_text() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    m = _metrics()
    registry = prometheus_client.CollectorRegistry()
    registry.register(m.collector())
    exported = prometheus_client.generate_latest(registry).decode()
    assert _parsed(exported) == _parsed(m.prometheus_text())


def test_manager_steps() -> None:
    """A KVCacheManager's per-step stats and usage, and its events through publish_from."""
    spec = kvblocks.FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")
    config = kvblocks.KVCacheConfig(8, [], [kvblocks.KVCacheGroupSpec(["l0"], spec)])
    mgr = kvblocks.KVCacheManager(config, 64, 4, log_stats=True, enable_kv_cache_events=True)
    hasher = kvblocks.BlockHasher(4, "sha256")
    sink = kvblocks.EventSink()
    m = KVCacheMetrics(sink)
    want = dict.fromkeys(FIELDS, 0)
    for i, tokens in enumerate([list(range(12)), list(range(10)), list(range(50, 78))]):
        req = kvblocks.Request(f"r{i}", tokens, hasher)
        blocks, hit = mgr.get_computed_blocks(req)
        mgr.record_prefix_cache_stats(req, hit)
        assert mgr.allocate_slots(req, req.num_tokens - hit, hit, blocks) is not None
        mgr.free(req)
        stats = mgr.make_prefix_cache_stats()
        assert stats is not None
        for f in FIELDS:
            want[f] += getattr(stats, f)
        m.observe(stats, usage=mgr.usage)
        sink.publish_from(mgr)
    while sink.next_payload(0.0) is not None:
        pass
    values = {s.name.split(":")[1]: s.value for s in m.samples()}
    for f in FIELDS:
        assert values["prefix_cache_" + f] == want[f]
    assert (want["requests"], want["hits"]) == (3, 8)  # r1 hits r0's first two blocks
    assert values["kv_cache_usage_perc"] == mgr.usage
    assert values["kv_cache_evictions"] > 0  # r2 needs 7 of the 7 usable blocks
    # r1 caches no new full block: its step has no events and publishes nothing, as vLLM
    assert values["kv_events_published_batches"] == 2
