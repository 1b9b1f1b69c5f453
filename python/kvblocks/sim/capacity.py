"""Capacity search: the highest arrival rate served within SLOs, and the fewest replicas for
a rate (``kvblocks simulate --find-max-rate`` / ``--find-min-replicas``).

A rate is requests per second of the requests that follow no other (a session's first turn;
a follow-up keeps its delay after its predecessor). :func:`at_rate` rescales a trace's
arrival times to a rate; a search runs the simulation at a rate (or a replica count) and
reads its SLO attainment, the fraction of requests meeting both SLOs. The target is
:data:`TARGET` (99 %).

* :func:`find_max_rate`: doubles (or halves) from a start until the target is bracketed,
  bisects (geometric mean) until the bracket is within ``rel_tol``, then checks that the
  rate 10 % above the answer misses the target (attainment is not monotone in the rate in
  every trace; where the check passes, the search goes on above it).
* :func:`find_min_replicas`: doubles the replicas until the target is met, then bisects.

The answer's confidence is reported two ways: the bracket (the highest rate meeting the
target lies below the lowest rate found to miss it, ``next``), and a 95 % Wilson interval
on the attainment measured at the answer over its requests (:func:`wilson_interval`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from kvblocks._core import InvalidArgumentError
from kvblocks.sim.workloads import Trace

__all__ = [
    "NEXT_RATE_FACTOR",
    "TARGET",
    "Probe",
    "Search",
    "at_rate",
    "find_max_rate",
    "find_min_replicas",
    "trace_rate",
    "wilson_interval",
]

TARGET = 0.99
"""Fraction of requests that must meet the SLOs."""
NEXT_RATE_FACTOR = 1.1
""":func:`find_max_rate` checks that this times the answer misses the target."""

_R = TypeVar("_R")


@dataclass
class Probe(Generic[_R]):
    """One simulation of a search: its rate (or replicas), attainment, requests and run."""

    value: float
    attainment: float
    requests: int
    run: _R

    @property
    def met(self) -> bool:
        """At least :data:`TARGET` of the requests met the SLOs."""
        return self.attainment >= TARGET


@dataclass
class Search(Generic[_R]):
    """A search's outcome: ``best`` meets the target (None: nothing tried did), ``next`` is
    the lowest value tried above it that misses it (None: none did), ``probes`` every run
    in order."""

    best: Probe[_R] | None = None
    next: Probe[_R] | None = None
    probes: list[Probe[_R]] = field(default_factory=list)


def _first_arrivals(trace: Trace, step_s: float) -> list[tuple[int, float]]:
    """(index, arrival in seconds) of the requests that follow no other."""
    out = []
    for i, r in enumerate(trace.requests):
        if r.after is None:
            out.append((i, r.arrival_s if r.arrival_s is not None else r.arrival_step * step_s))
    return out


def trace_rate(trace: Trace, step_s: float) -> float:
    """The trace's own rate: first arrivals after the first, over the time they span.

    Raises:
        ValueError: Fewer than two first arrivals, or all at one time.
    """
    times = sorted(t for _, t in _first_arrivals(trace, step_s))
    if len(times) < 2 or times[-1] <= times[0]:
        raise InvalidArgumentError(
            "a rate needs a workload whose requests arrive over time (two or more arrivals "
            "at different times)"
        )
    return (len(times) - 1) / (times[-1] - times[0])


def at_rate(trace: Trace, rate: float, step_s: float) -> Trace:
    """``trace`` with its first arrivals' times scaled to ``rate`` per second (the first
    arrival keeps its time; follow-ups keep their delays).

    Raises:
        ValueError: ``rate`` is not positive, or the trace has no rate (:func:`trace_rate`).
    """
    if not rate > 0 or not math.isfinite(rate):
        raise InvalidArgumentError(f"a rate must be > 0, got {rate}")
    first = _first_arrivals(trace, step_s)
    factor = trace_rate(trace, step_s) / rate
    t0 = min(t for _, t in first)
    requests = list(trace.requests)
    for i, t in first:
        requests[i] = replace(requests[i], arrival_s=t0 + (t - t0) * factor)
    params = {**trace.params, "request_rate": rate}
    return Trace(requests, trace.kind, trace.seed, trace.vocab_size, trace.source, params)


def wilson_interval(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``p`` over ``n`` trials (95 % by
    default); ``(0, 1)`` for ``n == 0``."""
    if n <= 0:
        return 0.0, 1.0
    d = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, mid - half), min(1.0, mid + half)


def find_max_rate(
    probe: Callable[[float], Probe[_R]],
    start: float,
    rel_tol: float = 0.05,
    max_probes: int = 40,
) -> Search[_R]:
    """The highest rate whose :class:`Probe` meets :data:`TARGET` (see the module docs);
    ``next`` is the probe at :data:`NEXT_RATE_FACTOR` times it, which misses.

    Args:
        probe: Runs the simulation at a rate.
        start: The first rate tried.
        rel_tol: Bisect until the bracket's ends are within this fraction.
        max_probes: Most simulations (the search stops there with what it has).
    """
    s: Search[_R] = Search()
    rate = start
    while len(s.probes) < max_probes:
        s.probes.append(probe(rate))
        met = [p for p in s.probes if p.met]
        s.best = max(met, key=lambda p: p.value) if met else None
        floor = s.best.value if s.best is not None else 0.0
        above = [p for p in s.probes if not p.met and p.value > floor]
        s.next = min(above, key=lambda p: p.value) if above else None
        if s.best is None:
            assert s.next is not None
            rate = s.next.value / 2
        elif s.next is None:
            rate = s.best.value * 2
        elif s.next.value > s.best.value * (1 + rel_tol):
            rate = math.sqrt(s.best.value * s.next.value)
        else:
            check = s.best.value * NEXT_RATE_FACTOR
            done = [p for p in above if math.isclose(p.value, check, rel_tol=1e-9)]
            if done:
                s.next = done[0]
                break
            rate = check
    return s


def find_min_replicas(probe: Callable[[int], Probe[_R]], max_replicas: int = 1024) -> Search[_R]:
    """The fewest replicas whose :class:`Probe` meets :data:`TARGET`: doubles from 1 until
    met, then bisects (``next`` is then the largest count tried that misses it)."""
    s: Search[_R] = Search()
    n = 1
    while True:
        p = probe(n)
        s.probes.append(p)
        if p.met:
            s.best = p
            break
        s.next = p
        if n >= max_replicas:
            return s
        n = min(2 * n, max_replicas)
    lo = int(s.next.value) if s.next is not None else 0  # misses (0: none tried)
    hi = n  # meets
    while hi - lo > 1:
        mid = (lo + hi) // 2
        p = probe(mid)
        s.probes.append(p)
        if p.met:
            hi, s.best = mid, p
        else:
            lo, s.next = mid, p
    return s
