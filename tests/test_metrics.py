"""KV cache metrics: vLLM's PrefixCacheStats rule, accumulation, Prometheus export."""

from __future__ import annotations

import kvblocks
import pytest
from event_fixtures import AllBlocksCleared, BlockRemoved, BlockStored
from kvblocks.metrics import KVCacheMetrics, PrefixCacheStats

LOOKUPS = [(32, 16, False), (10, 0, False), (48, 32, True), (7, 7, False)]


def _step() -> PrefixCacheStats:
    stats = PrefixCacheStats()
    for tokens, hits, preempted in LOOKUPS:
        stats.record(tokens, hits, preempted)
    return stats


def test_record_splits_preempted_requests() -> None:
    s = _step()
    assert (s.requests, s.queries, s.hits) == (3, 49, 23)
    assert (s.preempted_requests, s.preempted_queries, s.preempted_hits) == (1, 48, 32)


def test_record_matches_vllm() -> None:
    stats_mod = pytest.importorskip("vllm.v1.metrics.stats")
    theirs = stats_mod.PrefixCacheStats()
    for tokens, hits, preempted in LOOKUPS:
        theirs.record(tokens, hits, preempted)
    ours = _step()
    for field in ("requests", "queries", "hits", "preempted_requests", "preempted_queries"):
        assert getattr(ours, field) == getattr(theirs, field)
    assert ours.preempted_hits == theirs.preempted_hits


def _metrics() -> KVCacheMetrics:
    sink = kvblocks.EventSink()
    sink.publish([BlockStored([1, 2], None, [1, 2, 3, 4], 2, None, "GPU", None, None, 0)])
    sink.publish([BlockRemoved([2], "GPU", 0), BlockRemoved([1], "GPU", 0), AllBlocksCleared()])
    while sink.next_payload(0.0) is not None:
        pass
    m = KVCacheMetrics(sink, labels={"engine": "0", "model_name": 'm"x'})
    m.observe(_step(), usage=0.25)
    m.observe(PrefixCacheStats(reset=True, requests=1, queries=4, hits=4))
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
    with pytest.raises(ValueError):
        m.observe(PrefixCacheStats(requests=-1))
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
