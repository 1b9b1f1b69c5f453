"""KV cache metrics: vLLM's prefix-cache statistics, usage, evictions and event counters,
exported in the Prometheus text format (and as a prometheus_client collector when that
package is installed).

`KVCacheMetrics` accumulates scheduler steps into counters: feed it the `PrefixCacheStats`
a manager makes each step (`KVCacheManager.make_prefix_cache_stats()`, or vLLM's own; read
by attribute), the usage, and optionally an event publisher or sink whose counters it
reports. Evictions are the block hashes announced as removed by the published
`BlockRemoved` events.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from kvblocks._core import InvalidArgumentError, PrefixCacheStats

__all__ = [
    "KVCacheMetrics",
    "MetricSample",
    "MetricsExporter",
    "PrefixCacheStats",
    "StatsSource",
    "prometheus_collector",
    "prometheus_text",
]


class StatsSource(Protocol):
    """Anything with the event counters of `kvblocks.EventSink.stats()`."""

    def stats(self) -> dict[str, int]: ...


@dataclass(frozen=True)
class MetricSample:
    """One exported value."""

    name: str
    kind: Literal["counter", "gauge"]
    help: str
    value: float
    labels: tuple[tuple[str, str], ...] = ()
    """The sample's own labels, after the exporter's."""


_STEP_COUNTERS = (
    ("requests", "prefix_cache_requests", "Requests that looked up the prefix cache."),
    ("queries", "prefix_cache_queries", "Prefix cache queries, in tokens."),
    ("hits", "prefix_cache_hits", "Prefix cache hits, in tokens."),
    (
        "preempted_requests",
        "prefix_cache_preempted_requests",
        "Previously preempted requests that looked up the prefix cache.",
    ),
    ("preempted_queries", "prefix_cache_preempted_queries", "Queries of preempted requests."),
    ("preempted_hits", "prefix_cache_preempted_hits", "Hits of preempted requests."),
)

_EVENT_COUNTERS = (
    ("removed_blocks", "kv_cache_evictions", "Block hashes removed from the prefix cache."),
    ("published_batches", "kv_events_published_batches", "Event batches published."),
    ("published_events", "kv_events_published_events", "Events published (snapshots too)."),
    ("dropped_batches", "kv_events_dropped_batches", "Event batches dropped (full queue)."),
    ("dropped_events", "kv_events_dropped_events", "Events in dropped batches."),
    ("snapshots", "kv_events_snapshots", "Cache snapshots published."),
    ("snapshots_refused", "kv_events_snapshots_refused", "Snapshots refused after drops."),
)


class MetricsExporter:
    """What every kvblocks exporter shares: metric names ``<prefix>:<metric>``, labels on
    every sample, the text format and the prometheus_client collector. A subclass gives
    `samples`."""

    def __init__(self, prefix: str, labels: Mapping[str, str] | None) -> None:
        self._prefix = prefix
        self._labels = dict(labels or {})

    def samples(self) -> list[MetricSample]:
        """Every metric's current value."""
        raise NotImplementedError

    def prometheus_text(self) -> str:
        """The Prometheus text exposition format (version 0.0.4); counters get ``_total``."""
        return prometheus_text(self.samples(), self._labels)

    def collector(self) -> Any:
        """A prometheus_client collector (register it on a registry); needs that package."""
        return prometheus_collector(self.samples, self._labels)

    def _name(self, name: str) -> str:
        return f"{self._prefix}:{name}"


class KVCacheMetrics(MetricsExporter):
    """Cumulative KV cache metrics, named ``<prefix>:<metric>`` like vLLM's ``vllm:*``."""

    def __init__(
        self,
        events: StatsSource | None = None,
        *,
        prefix: str = "kvblocks",
        labels: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(prefix, labels)
        self._events = events
        self._totals = dict.fromkeys((attr for attr, _, _ in _STEP_COUNTERS), 0)
        self._resets = 0
        self._usage = 0.0

    def observe(self, stats: Any | None = None, usage: float | None = None) -> None:
        """Adds one step's `PrefixCacheStats` (any object with its fields; ``None`` is
        skipped) and sets the current KV cache usage (0..1)."""
        if stats is not None:
            for attr in self._totals:
                value = getattr(stats, attr)
                if not isinstance(value, int) or value < 0:
                    raise InvalidArgumentError(f"{attr} must be a non-negative int, got {value!r}")
            for attr in self._totals:
                self._totals[attr] += getattr(stats, attr)
            self._resets += bool(getattr(stats, "reset", False))
        if usage is not None:
            if not 0.0 <= usage <= 1.0:
                raise InvalidArgumentError(f"usage must be in [0, 1], got {usage!r}")
            self._usage = usage

    def samples(self) -> list[MetricSample]:
        """Every metric's current value."""
        out = [
            MetricSample(
                self._name("kv_cache_usage_perc"),
                "gauge",
                "KV-cache usage. 1 means 100 percent usage.",
                self._usage,
            )
        ]
        for attr, name, doc in _STEP_COUNTERS:
            out.append(MetricSample(self._name(name), "counter", doc, self._totals[attr]))
        out.append(
            MetricSample(
                self._name("prefix_cache_resets"), "counter", "Prefix cache resets.", self._resets
            )
        )
        if self._events is not None:
            stats = self._events.stats()
            for key, name, doc in _EVENT_COUNTERS:
                out.append(MetricSample(self._name(name), "counter", doc, stats[key]))
        return out


def prometheus_text(samples: Iterable[MetricSample], labels: Mapping[str, str]) -> str:
    """``samples`` in the Prometheus text exposition format (version 0.0.4), each with
    ``labels`` then its own; counters get ``_total``; samples of one name share their
    ``HELP`` and ``TYPE`` lines."""
    lines: list[str] = []
    seen: set[str] = set()
    for s in samples:
        suffix = "_total" if s.kind == "counter" else ""
        if s.name not in seen:
            seen.add(s.name)
            lines.append(f"# HELP {s.name}{suffix} {s.help}")
            lines.append(f"# TYPE {s.name}{suffix} {s.kind}")
        pairs = [*sorted(labels.items()), *s.labels]
        label_text = "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}" if pairs else ""
        lines.append(f"{s.name}{suffix}{label_text} {_number(s.value)}")
    return "\n".join(lines) + "\n"


def prometheus_collector(
    samples: Callable[[], Iterable[MetricSample]], labels: Mapping[str, str]
) -> Any:
    """A prometheus_client collector of ``samples()`` (called on each scrape), each with
    ``labels`` then its own; needs that package."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    names = sorted(labels)
    values = [labels[n] for n in names]

    class _Collector:
        def collect(self) -> Iterator[Any]:
            families: dict[str, Any] = {}
            for s in samples():
                family = families.get(s.name)
                if family is None:
                    cls = CounterMetricFamily if s.kind == "counter" else GaugeMetricFamily
                    own = [k for k, _ in s.labels]
                    family = families[s.name] = cls(s.name, s.help, labels=[*names, *own])
                family.add_metric([*values, *(v for _, v in s.labels)], s.value)
            yield from families.values()

    return _Collector()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, float) and math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
