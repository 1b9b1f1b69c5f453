"""The simulator's one percentile rule: nearest rank.

The ``q`` quantile of ``n`` ascending values is the value of rank ``ceil(q * n)`` (1-based):
always a value that occurred, never an interpolation. The latencies of the report and the
per-call manager times of :meth:`~kvblocks.sim.engine.ReplayResult.calls` both use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

__all__ = ["LATENCY_QUANTILES", "QUANTILES", "nearest_rank", "percentiles"]

QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
"""The percentiles of per-call manager times: name and quantile."""
LATENCY_QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p99.9", 0.999))
"""The percentiles of request latencies (TTFT, TPOT, end to end)."""

_T = TypeVar("_T", int, float)


def nearest_rank(sorted_values: Sequence[_T], q: float) -> _T:
    """The ``q`` quantile (``0 <= q <= 1``) of non-empty ascending ``sorted_values``."""
    n = len(sorted_values)
    return sorted_values[min(n - 1, max(0, math.ceil(q * n) - 1))]


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """``{p50, p90, p95, p99, p99.9}`` (:data:`LATENCY_QUANTILES`) of the non-NaN
    ``values``, rounded to 6 digits; None when there are none."""
    v = sorted(x for x in values if not math.isnan(x))
    return {name: round(nearest_rank(v, q), 6) if v else None for name, q in LATENCY_QUANTILES}
