"""A fleet: N engines, each with its own KV cache manager, behind a router.

Requests arrive in time (the engines run a step-time model); at each arrival the router
picks one engine, which queues the request. The engines step independently, each on its
own clock; the fleet loop always handles the earliest event next: an arrival (routed when
no busy engine's clock is behind it) or the step of the busy engine whose clock is
earliest. A follow-up turn becomes an arrival when its predecessor finishes, and is routed
again like any request.

Routers (:data:`ROUTERS`):

* ``round-robin``: engines in turn;
* ``least-loaded``: the fewest running plus waiting requests (lowest index on ties);
* ``prefix-aware``: as KV-aware routers score engines (SGLang's cache-aware router, llm-d's
  precise prefix-cache scorer, Dynamo's KV router): by the prefix of the request each
  engine would hit, from :class:`kvblocks.router.KVIndex` fed **only by the engines' KV
  cache events** (drained after every step with ``take_events()`` and encoded as their
  ZMQ publisher would send them), so a hit is what that engine's ``get_computed_blocks``
  would return (its rules, its ``num_tokens - 1`` cap, per group). The default is the
  SGLang Model Gateway's cache-aware rule: when the longest hit covers more than
  ``cache_threshold`` (default 0.3, its default) of the request's blocks, the engine
  holding it (the load breaks ties); otherwise the least loaded engine (fewest running
  plus waiting requests). A new session, which matches only its shared system prompt,
  thus goes where there is room, and its later turns follow their own context.
  ``cache_threshold = 0`` is the pure longest-prefix rule, which piles every session that
  shares a system prompt onto one engine. ``load_weight > 0`` switches to Dynamo's cost
  instead (as ``kv-aware``);
* ``kv-aware``: Dynamo's cost on the same index: ``blocks to prefill (the request's
  blocks minus the engine's hit) + load_weight * active blocks`` (blocks of its running
  and waiting requests; ``load_weight`` 1 unless given), then fewer requests, then the
  lowest index.

Both rules are :func:`kvblocks.router._policy.route_scores`, which the Ray Serve router
(:mod:`kvblocks.router.ray`) shares.
"""

from __future__ import annotations

import heapq
import os
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvblocks._core import InvalidArgumentError, encode_event_batch
from kvblocks.router import KVIndex
from kvblocks.router._policy import (
    DEFAULT_CACHE_THRESHOLD,
    DEFAULT_KV_AWARE_WEIGHT,
    route_scores,
)
from kvblocks.sim.backends import Backend
from kvblocks.sim.ceilings import CeilingResult
from kvblocks.sim.engine import (
    Engine,
    ReplayError,
    ReplayOptions,
    ReplayResult,
    StepSeries,
    served_output_tokens,
)
from kvblocks.sim.presets import build_kvblocks_config
from kvblocks.sim.workloads import Trace

__all__ = [
    "DEFAULT_CACHE_THRESHOLD",
    "DEFAULT_KV_AWARE_WEIGHT",
    "INDEXED_ROUTERS",
    "ROUTERS",
    "Fleet",
    "FleetResult",
    "merged_result",
    "router_index",
]

ROUTERS = ("round-robin", "least-loaded", "prefix-aware", "kv-aware")

INDEXED_ROUTERS = ("prefix-aware", "kv-aware")
"""The routers that read the engines' caches (their engines publish events)."""


def router_index(backends: Sequence[Backend]) -> KVIndex:
    """A :class:`kvblocks.router.KVIndex` of the fleet's engines, named ``"0"``,
    ``"1"``, ...: each registered with its layout and hashing, as a router in front of them
    would register them."""
    index = KVIndex()
    for e, b in enumerate(backends):
        layout = b.layout
        index.add_engine(
            str(e),
            build_kvblocks_config(layout),
            max_model_len=layout.max_model_len,
            hash_block_size=layout.hash_block_size,
            hash_algo=b.hash_algo,
            python_hash_seed=os.environ.get("PYTHONHASHSEED"),
            started_empty=True,
            scheduler_block_size=layout.scheduler_block_size,
            enable_caching=layout.enable_caching,
            use_eagle=layout.use_eagle,
            dcp_world_size=layout.dcp_world_size,
            num_hash_lookahead_tokens=layout.num_hash_lookahead_tokens,
        )
    return index


@dataclass
class FleetResult:
    """A fleet run: the engines' results plus the fleet's own series and routing."""

    router: str
    engines: list[ReplayResult]
    series: StepSeries = field(default_factory=StepSeries)
    wall_s: float = 0.0
    simulated_s: float = 0.0
    requests: int = 0


class Fleet:
    """N engines over one trace behind a router (see the module docs).

    Args:
        trace: The workload.
        backends: One backend per engine (prefix-aware routing needs managers built with
            ``enable_kv_cache_events=True``).
        options: Every engine's options; ``time_model`` is required.
        router: One of :data:`ROUTERS`.
        layout: The backends' layout (for ``options.ceilings``).
        load_weight: ``prefix-aware``: weight of the active blocks against the blocks to
            prefill; 0 = the cache-threshold rule (see the module docs).
        cache_threshold: ``prefix-aware`` with ``load_weight = 0``: the cached share of a
            request's blocks above which it goes to the engine with the longest prefix
            rather than the least loaded one.
    """

    def __init__(
        self,
        trace: Trace,
        backends: Sequence[Backend],
        options: ReplayOptions,
        router: str,
        layout: Any = None,
        load_weight: float = 0.0,
        cache_threshold: float = DEFAULT_CACHE_THRESHOLD,
    ) -> None:
        if router not in ROUTERS:
            raise InvalidArgumentError(
                f"unknown router {router!r}; choose from {', '.join(ROUTERS)}"
            )
        if options.time_model is None:
            raise InvalidArgumentError("a fleet runs in time: options.time_model is required")
        self.trace = trace
        self.router = router
        self.replicas = n = len(backends)
        self._arrivals: list[tuple[float, int]] = []
        self.engines: list[Engine] = []
        for b in backends:
            opt = ReplayOptions(**{**options.__dict__, "external": True, "progress": None})
            opt.on_follow = self._follow
            self.engines.append(Engine(trace, b, opt, layout))
        first = self.engines[0]
        for idx, rec in enumerate(trace.requests):
            if rec.after is None:
                self._arrivals.append((first.arrival_time(rec), idx))
        heapq.heapify(self._arrivals)
        self.index = router_index(backends) if router in INDEXED_ROUTERS else None
        self._rr = 0
        if router == "kv-aware" and load_weight <= 0:
            load_weight = DEFAULT_KV_AWARE_WEIGHT
        self.load_weight = load_weight
        self.cache_threshold = cache_threshold
        self._block: int = int(backends[0].manager.block_pool.hash_block_size)
        self._make = backends[0].make_request
        self.num_finished = 0
        self.total = len(trace.requests)
        self.series = StepSeries()
        self._queried = 0
        self._hits = 0
        self._free = [e.num_blocks - 1 for e in self.engines]
        # Running totals over the engines, kept as each event changes one engine: the sum
        # of ``_free``, running and waiting requests, finished (or rejected) requests.
        self._free_sum = sum(self._free)
        self._running = 0
        self._waiting = 0
        self._finished = 0
        # (clock, engine) of every busy engine, a heap: an engine's clock moves only when it
        # steps, or when an idle engine is given a request (then it joins the heap).
        self._busy: list[tuple[float, int]] = []
        self._names = [str(e) for e in range(n)]
        # active_blocks per engine, with the (steps, requests) of the engine it counted
        self._active: list[tuple[int, int, int]] = [(-1, -1, 0)] * n
        self.routed = [0] * n
        self._t0 = time.perf_counter()

    def _follow(self, idx: int, arrival: float) -> None:
        heapq.heappush(self._arrivals, (arrival, idx))

    @property
    def done(self) -> bool:
        """Every request finished."""
        return self._finished >= self.total

    def load(self, e: int) -> int:
        """Requests running or waiting on engine ``e``."""
        eng = self.engines[e]
        return len(eng.running) + len(eng.waiting)

    def choose(self, req: Any) -> int:
        """The engine the router sends request ``req`` to."""
        n = self.replicas
        if self.router == "round-robin":
            e = self._rr
            self._rr = (e + 1) % n
            return e
        loads = [self.load(e) for e in range(n)]
        if self.index is None:
            return min(range(n), key=lambda e: (loads[e], e))
        hits = self.index.hits_from_hashes(req.block_hashes, req.num_tokens)
        b = self._block
        match = [hits[name].gpu_tokens // b for name in self._names]
        w = self.load_weight
        active = [self.active_blocks(e) for e in range(n)] if w > 0 else None
        score = route_scores(
            match,
            len(req.block_hashes),
            load_weight=w,
            cache_threshold=self.cache_threshold,
            active_blocks=active,
        )
        if score is None:
            return min(range(n), key=lambda e: (loads[e], -match[e], e))
        return min(range(n), key=lambda e: (score[e], loads[e], e))

    def active_blocks(self, e: int) -> int:
        """Blocks of the requests running or waiting on engine ``e`` (their tokens over
        the block size), as Dynamo's router counts an engine's load."""
        eng = self.engines[e]
        # counted again only after the engine stepped or was given a request
        stamp = (eng.result.steps, eng.result.requests)
        steps, requests, blocks = self._active[e]
        if (steps, requests) == stamp:
            return blocks
        b = self._block
        tokens = sum(-(-s.num_tokens // b) for s in eng.running)
        blocks = tokens + sum(-(-s.num_tokens // b) for s in eng.waiting)
        self._active[e] = (*stamp, blocks)
        return blocks

    def _route(self, arrival: float, idx: int) -> None:
        rec = self.trace.requests[idx]
        eng0 = self.engines[0]
        t0 = time.perf_counter_ns()
        prompt = rec.prompt_ids(self.trace.vocab_size)
        synth = time.perf_counter_ns() - t0
        req, dt = self._make(
            rec.request_id,
            prompt,
            rec.max_output_tokens,
            cache_salt=rec.cache_salt,
            priority=rec.priority,
            session_id=rec.session_id,
        )
        e = self.choose(req)
        eng = self.engines[e]
        eng.result.request_init_ns += dt
        eng.result.hash_calls += 1
        eng0.result.synth_ns += synth
        was_idle = eng.idle
        waiting, finished = len(eng.waiting), eng.num_finished
        eng.submit(idx, req, arrival)
        self._waiting += len(eng.waiting) - waiting
        self._finished += eng.num_finished - finished  # a request refused at arrival
        if was_idle and not eng.idle:
            heapq.heappush(self._busy, (eng.now, e))
        self.routed[e] += 1

    def step(self) -> None:
        """Handles the earliest event: an arrival, or one engine's step."""
        arrivals, busy = self._arrivals, self._busy
        if arrivals and (not busy or arrivals[0][0] <= busy[0][0]):
            arrival, idx = heapq.heappop(arrivals)
            self._route(arrival, idx)
            return
        if not busy:
            raise ReplayError("no runnable requests left but the trace is not finished")
        # the earliest clock, the lowest index among equal ones (as min over the engines)
        i = heapq.heappop(busy)[1]
        nxt = self.engines[i]
        res = nxt.result
        running, waiting, finished = len(nxt.running), len(nxt.waiting), nxt.num_finished
        first = res.first_admission
        queried, hits = first[1], first[2]
        info = nxt.step()
        self._queried += first[1] - queried
        self._hits += first[2] - hits
        self._running += len(nxt.running) - running
        self._waiting += len(nxt.waiting) - waiting
        self._finished += nxt.num_finished - finished
        if nxt.running or nxt.waiting:
            heapq.heappush(busy, (nxt.now, i))
        if self.index is not None:
            events = nxt.backend.manager.take_events()
            if events:  # as an engine's publisher: a batch per step with events
                self.index.ingest(self._names[i], encode_event_batch(0.0, events))
        free = info.free_blocks
        self._free_sum += free - self._free[i]
        self._free[i] = free
        s = self.series
        s.step.append(len(s.step))
        s.time_s.append(nxt.now)
        s.free_blocks.append(self._free_sum // self.replicas)  # the mean engine's free blocks
        s.queried.append(self._queried)
        s.hits.append(self._hits)
        s.running.append(self._running)
        s.waiting.append(self._waiting)
        s.preemptions.append(info.preempted)

    def run(self) -> FleetResult:
        """Runs to the end; checks every engine's end state."""
        while not self.done:
            self.step()
        results = [e.finish() for e in self.engines]
        max_model_len = self.engines[0].options.max_model_len
        expect = sum(served_output_tokens(r, max_model_len) for r in self.trace.requests)
        got = sum(r.generated_tokens for r in results)
        if got != expect:
            raise ReplayError(f"generated {got} tokens, expected {expect}")
        out = FleetResult(self.router, results, self.series)
        out.wall_s = time.perf_counter() - self._t0
        out.simulated_s = max(e.now for e in self.engines)
        out.requests = self.total
        return out


def merged_result(fr: FleetResult) -> ReplayResult:
    """The fleet as one :class:`ReplayResult`: counts, manager timings and latencies summed
    or pooled over the engines; ``steps`` counts every engine's steps; ``series`` is the
    fleet's (one point per engine step: the mean engine's free blocks, the fleet's
    cumulative hits); ``wall_s`` the fleet loop's. The ceilings are each engine's (over
    the requests routed to it, with its memory), summed."""
    first = fr.engines[0]
    out = ReplayResult(
        first.impl,
        first.num_blocks,
        sum(r.requests for r in fr.engines),
        sum(r.prompt_tokens for r in fr.engines),
        {k: array("q") for k in first.samples},
    )
    for index, r in enumerate(fr.engines):
        for k, v in r.samples.items():
            out.samples[k].extend(v)
        out.request_init_ns += r.request_init_ns
        out.append_ns += r.append_ns
        out.hash_calls += r.hash_calls
        out.steps += r.steps
        out.generated_tokens += r.generated_tokens
        out.preemptions += r.preemptions
        out.alloc_failures += r.alloc_failures
        out.batched_requests += r.batched_requests
        out.rejected += r.rejected
        out.length_capped += r.length_capped
        out.synth_ns += r.synth_ns
        out.num_events += r.num_events
        for i in range(3):
            out.first_admission[i] += r.first_admission[i]
            out.resumed[i] += r.resumed[i]
        for name, vals in r.tenants.items():
            acc = out.tenants.setdefault(name, [0, 0, 0])
            for j, x in enumerate(vals):
                acc[j] += x
        for name in ("ttft_s", "tpot_s", "e2e_s", "finish_s"):
            getattr(out, name).extend(getattr(r, name))
        out.finished.extend(f._replace(engine=index) for f in r.finished)
    out.wall_s = fr.wall_s
    out.simulated_s = fr.simulated_s
    out.series = fr.series
    out.final_free_blocks = first.final_free_blocks
    ceilings = [r.ceilings for r in fr.engines if r.ceilings is not None]
    if ceilings:
        tenants: dict[str, list[int]] = {}
        for c in ceilings:
            for name, vals in c.tenants.items():
                acc = tenants.setdefault(name, [0] * len(vals))
                for j, x in enumerate(vals):
                    acc[j] += x
        out.ceilings = CeilingResult(
            sum(c.queried_tokens for c in ceilings),
            sum(c.infinite_hit_tokens for c in ceilings),
            sum(c.ideal_hit_tokens for c in ceilings),
            tenants,
        )
    return out
