"""`RouterMetrics`: a `KVIndex`'s per-engine freshness and stream counters as Prometheus
metrics (`kvblocks_router:*`, one series per engine, labelled ``engine``), in the text
format or as a prometheus_client collector, like `kvblocks.metrics.KVCacheMetrics`."""

from __future__ import annotations

from collections.abc import Mapping

from kvblocks._core import KVIndex
from kvblocks.metrics import MetricSample, MetricsExporter

__all__ = ["FRESHNESS", "RouterMetrics"]

FRESHNESS = ("exact", "catching_up", "stale", "mismatched")
"""The freshness states, in the order of the ``freshness`` gauge's values (0 is exact)."""

_COUNTERS = (
    ("batches", "kv_events_batches", "Event batches applied."),
    ("events", "kv_events_events", "Events applied."),
    ("duplicates", "kv_events_duplicates", "Batches dropped as duplicates."),
    ("gaps", "kv_events_gaps", "Gaps in the batches' sequence numbers."),
    ("resets", "kv_events_resets", "Publisher restarts seen, and resets."),
    ("hash_checks", "hash_checks", "Stored events whose hashes were recomputed."),
    ("hash_mismatches", "hash_mismatches", "Hash checks that failed."),
)


class RouterMetrics(MetricsExporter):
    """Metrics of `index`, named ``<prefix>:<metric>``."""

    def __init__(
        self,
        index: KVIndex,
        *,
        prefix: str = "kvblocks_router",
        labels: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(prefix, labels)
        self._index = index

    def samples(self) -> list[MetricSample]:
        """Every engine's current values."""
        out = []
        for engine in self._index.engines():
            st = self._index.status(engine)
            lab = (("engine", engine),)
            gauges = [
                (
                    "freshness",
                    "0 exact, 1 catching_up, 2 stale, 3 mismatched.",
                    FRESHNESS.index(st["freshness"]),
                ),
                ("exact", "1 while the engine's view is exact.", int(st["freshness"] == "exact")),
                ("held_batches", "Batches held behind an open gap.", st["held"]),
                ("blocks", "Blocks the engine holds, every group and medium.", st["blocks"]),
                (
                    "last_seq",
                    "The last sequence number applied (-1: none).",
                    -1 if st["last_seq"] is None else st["last_seq"],
                ),
            ]
            for name, doc, value in gauges:
                out.append(MetricSample(self._name(name), "gauge", doc, value, lab))
            for key, name, doc in _COUNTERS:
                out.append(MetricSample(self._name(name), "counter", doc, st[key], lab))
        return out
