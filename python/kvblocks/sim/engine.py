"""The scheduler loop: a vLLM-style engine driving a KV cache manager, one step at a time.

The loop is the one the vLLM oracle's conformance driver (``driver_vllm.py``) runs (a subset of
vLLM 0.33's ``Scheduler.schedule`` with sync scheduling, FCFS, no spec decode, no
connectors, watermark 0). Each executed step (:meth:`Engine.step`):

0. arrivals whose step has come join ``waiting`` (a follow-up with ``after = R`` arrives
   ``arrival_step`` steps after the step in which R finished); idle steps are skipped;
   with ``ReplayOptions.max_model_len`` vLLM's length rules apply (:func:`served_output_tokens`):
   a request whose prompt leaves no room for an output token is rejected at arrival (its
   follow-ups still arrive after it), and an output stops where the sequence reaches
   ``max_model_len``;
1. ``new_step_starts()``; the token budget is ``max_num_batched_tokens``;
2. running requests, in order: ``allocate_slots(req, n)``; on failure the most recently
   admitted request is preempted (freed, moved to the front of ``waiting``) and the call
   retried, until it fits or the request preempted itself;
3. only if nothing was preempted: waiting requests are admitted while budget and seats
   last (``get_computed_blocks`` then ``allocate_slots`` with the prefix hit and
   ``full_sequence_must_fit``); then the references of the step's partial-hit copies
   are dropped (``release_block_copies``, counted in ``ReplayResult.block_copies``);
   with a Mamba group in "align" cache mode, steps 2 and 3 clip each prefill chunk as
   vLLM's scheduler does (:mod:`kvblocks.sim.mamba_split`): a running request whose
   chunk clips to 0 is skipped this step, a waiting one stops admission (the loop sets no
   shared-prefix junction on its requests, so the split never stops at one);
4. model step: every scheduled request computes its tokens; a request whose whole sequence
   is computed appends output token ``tok(out_seed, k)``; at ``max_output_tokens`` it
   finishes and is freed.

With ``ReplayOptions.time_model`` the loop runs in simulated time: arrivals are keyed by
seconds instead of steps (a follow-up ``arrival_step * step_s`` after its predecessor
finished), the clock ``Engine.now`` advances by the model's time of each executed step
(computed from the scheduled ``(cached tokens, new tokens)`` pairs before the model step)
and jumps over idle time, and each finished request records its TTFT, TPOT and end-to-end
latency. With ``external`` a fleet (:mod:`kvblocks.sim.fleet`) feeds the engine through
:meth:`Engine.submit` and receives its follow-ups.

The allocation digest is sha256 over the driver's lines (``G``/``A``/``P``/``F``/``S``) so an
implementation with identical behaviour prints the same digest as ``driver_vllm.py``.

Prefix-cache numbers follow vLLM 0.33's ``PrefixCacheStats``, recorded at admission: first
admissions and re-admissions after preemption are counted apart, and the hit rate
(:attr:`ReplayResult.hit_rate`) is over first admissions only, also per cache salt
(:attr:`ReplayResult.tenants`). Only manager calls, request construction and token appends
are timed.

With a host tier (``ReplayOptions.host_tier``, :mod:`kvblocks.sim.offload`) an admission
looks up the tier after the GPU prefix cache and loads its hit as external computed tokens,
scheduled requests offer their new full chunks for store, a step with transfers takes the
link time (loads before the forward pass, stores beside it) and the step's transfers
complete when it ends.

With a retention policy (``backend.retention``, ``docs/retention.md``) requests carry the
trace's ``priority`` and ``session_id`` besides the cache salt, and the manager's clock
follows the loop's: ``advance_time(now)`` at the start of every step and, with a time
model, again before the model step frees finished requests (so blocks freed in a step are
stamped with its end); without a time model the clock is the step number.

Driving it by hand::

    engine = Engine(trace, make_backend("kvblocks", layout), ReplayOptions())
    while not engine.done:
        info = engine.step()          # StepInfo: what this step scheduled, preempted, freed
    result = engine.finish()          # ReplayResult; replay(trace, backend) does all three
"""

from __future__ import annotations

import hashlib
import heapq
import math
import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, NamedTuple

from kvblocks._core import InvalidArgumentError, KVBlocksError
from kvblocks.sim.backends import Backend
from kvblocks.sim.ceilings import CeilingResult, Ceilings, block_keys
from kvblocks.sim.mamba_split import mamba_split_for
from kvblocks.sim.offload import HostTier, OffloadStats
from kvblocks.sim.percentiles import QUANTILES, nearest_rank
from kvblocks.sim.presets import KVLayout, resolve_block_sizes
from kvblocks.sim.workloads import Trace, TraceRequest, segment_tokens

__all__ = [
    "CALL_TYPES",
    "Engine",
    "FinishedRequest",
    "ReplayError",
    "ReplayOptions",
    "ReplayResult",
    "StepInfo",
    "StepSeries",
    "ceiling_block_size",
    "ids_str",
    "replay",
    "served_output_tokens",
]

CALL_TYPES = (
    "get_computed_blocks",
    "alloc_admit",
    "alloc_prefill_chunk",
    "alloc_decode",
    "alloc_failed",
    "free",
    "new_step_starts",
    "alloc_batch",
    "advance_time",
    "hisparse_connector",
)


class FinishedRequest(NamedTuple):
    """One finished request of a timed run (``--requests-out``): times in seconds, hits
    of its first admission in tokens."""

    request_id: str
    arrival_s: float
    ttft_s: float
    tpot_s: float
    """NaN for a request with one output token."""
    e2e_s: float
    prompt_tokens: int
    output_tokens: int
    gpu_hit_tokens: int
    """Found in the GPU prefix cache."""
    host_hit_tokens: int
    """Loaded from the host tier (``--cpu-offload``)."""
    preemptions: int
    engine: int = 0
    """The fleet's engine that served it."""


class ReplayError(KVBlocksError, RuntimeError):
    """The trace cannot be replayed (e.g. a request never fits an idle cache)."""


@dataclass
class ReplayOptions:
    """Scheduler settings and what to record.

    Attributes:
        max_num_batched_tokens: Token budget per step.
        max_num_seqs: Most running requests.
        reserve_full_isl: Admission needs the whole current sequence to fit.
        digest: Compute the allocation digest.
        events_out: Also write the digest lines here.
        max_steps: Abort after this many executed steps (0 = no limit).
        series: Record per-step usage and hit-rate series.
        ceilings: Record the run's prefix-cache events for the infinite-cache and Belady
            ceilings (:mod:`kvblocks.sim.ceilings`).
        progress: Called as ``progress(steps, finished, total)`` every ``progress_every``
            steps.
        progress_every: See ``progress``.
        time_model: Seconds of a step from its ``(cached, new)`` token pairs (e.g.
            :meth:`kvblocks.sim.timemodel.StepTimeModel.step_time`). When set the loop runs
            in time: requests arrive at their ``arrival_s`` (else ``arrival_step *
            step_s``), a follow-up ``arrival_step * step_s`` after its predecessor finished,
            the clock advances by each step's time and jumps over idle time, and the result
            records each request's latencies.
        step_s: Seconds per trace step when mapping steps to time (``time_model`` only).
        external: Requests come only through :meth:`Engine.submit` (a fleet's router),
            and follow-ups go to ``on_follow`` instead of this engine's queue.
        on_follow: ``on_follow(trace_index, arrival)`` for each follow-up that became due
            (``external`` only).
        max_model_len: vLLM's length rules with this context length
            (:func:`served_output_tokens`); None: none (every request runs whole).
        host_tier: The host-memory tier (vLLM's CPU offload) behind the GPU prefix cache;
            its chunk size must be the ceilings' block size when both are on.
    """

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    reserve_full_isl: bool = True
    digest: bool = True
    events_out: IO[str] | None = None
    max_steps: int = 0
    series: bool = False
    ceilings: bool = False
    progress: Callable[[int, int, int], None] | None = None
    progress_every: int = 1000
    time_model: Callable[[Sequence[tuple[int, int]]], float] | None = None
    step_s: float = 0.05
    external: bool = False
    on_follow: Callable[[int, float], None] | None = None
    max_model_len: int | None = None
    host_tier: HostTier | None = None


@dataclass
class StepSeries:
    """Per executed step: the step number, free blocks, cumulative prefix-cache queried and
    hit tokens of first admissions, running and waiting requests (at the end of the step)
    and the step's preemptions."""

    step: array[int] = field(default_factory=lambda: array("q"))
    free_blocks: array[int] = field(default_factory=lambda: array("q"))
    queried: array[int] = field(default_factory=lambda: array("q"))
    hits: array[int] = field(default_factory=lambda: array("q"))
    running: array[int] = field(default_factory=lambda: array("q"))
    waiting: array[int] = field(default_factory=lambda: array("q"))
    preemptions: array[int] = field(default_factory=lambda: array("q"))
    time_s: array[float] = field(default_factory=lambda: array("d"))
    """Simulated time at the end of the step (time model only)."""


@dataclass
class ReplayResult:
    """What a replay measured. ``samples`` holds one duration (ns) per manager call by
    :data:`CALL_TYPES` (``alloc_batch`` = one ``allocate_slots_batch`` call)."""

    impl: str
    num_blocks: int
    requests: int
    prompt_tokens: int
    samples: dict[str, array[int]]
    request_init_ns: int = 0
    append_ns: int = 0
    hash_calls: int = 0
    """Timed ``Request`` constructions and token appends (one timing pair each)."""
    steps: int = 0
    last_step: int = 0
    generated_tokens: int = 0
    preemptions: int = 0
    alloc_failures: int = 0
    batched_requests: int = 0
    block_copies: int = 0
    """Blocks copied on write: partial prefix hits, and cached Mamba partial tails their
    request writes on (``Backend.release_block_copies``)."""
    rejected: int = 0
    """Requests refused at arrival: the prompt leaves no room for an output token within
    ``max_model_len`` (:func:`served_output_tokens`)."""
    length_capped: int = 0
    """Requests whose output stopped at ``max_model_len`` before ``max_output_tokens``."""
    first_admission: list[int] = field(default_factory=lambda: [0, 0, 0])
    resumed: list[int] = field(default_factory=lambda: [0, 0, 0])
    tenants: dict[str, list[int]] = field(default_factory=dict)
    """Per cache salt (``""`` for none): ``[requests, queried, hit]`` tokens of first
    admissions, as ``first_admission``."""
    digest: str | None = None
    num_events: int = 0
    wall_s: float = 0.0
    final_free_blocks: int = 0
    series: StepSeries | None = None
    synth_ns: int = 0
    """Time in the loop spent making the workload's tokens and the ceilings' block keys
    (the simulator's own work, which numpy speeds up; :attr:`loop_s` leaves it out)."""
    ceilings: CeilingResult | None = None
    simulated_s: float = 0.0
    """Simulated time at the end of the run (time model only)."""
    ttft_s: array[float] = field(default_factory=lambda: array("d"))
    """Per finished request (time model only): arrival to first output token."""
    tpot_s: array[float] = field(default_factory=lambda: array("d"))
    """Per finished request: mean time per output token after the first (NaN for a
    request with one output token)."""
    e2e_s: array[float] = field(default_factory=lambda: array("d"))
    """Per finished request: arrival to last output token."""
    finish_s: array[float] = field(default_factory=lambda: array("d"))
    """Per finished request: its finish time (aligned with ``ttft_s`` and ``e2e_s``)."""
    finished: list[FinishedRequest] = field(default_factory=list)
    """Per finished request, in finishing order (time model only)."""
    step_time_shares: dict[str, float] | None = None
    """Each part's share of the simulated step time (set by whoever owns the time model:
    :meth:`kvblocks.sim.timemodel.StepTimeModel.shares`)."""
    offload: OffloadStats | None = None
    """The host tier's statistics (``ReplayOptions.host_tier`` only); ``first_admission``
    counts the GPU prefix cache's hits only."""

    @property
    def timed_calls(self) -> int:
        """Timing pairs in ``kv_total_ns + request_hash_ns``: manager calls and hash calls."""
        return sum(len(v) for v in self.samples.values()) + self.hash_calls

    @property
    def kv_total_ns(self) -> int:
        """Time in all manager calls."""
        return sum(sum(v) for v in self.samples.values())

    @property
    def request_hash_ns(self) -> int:
        """Time in request construction and token appends (block hashing)."""
        return self.request_init_ns + self.append_ns

    @property
    def queried_tokens(self) -> int:
        """Prefix-cache queried tokens (first admissions and re-admissions)."""
        return self.first_admission[1] + self.resumed[1]

    @property
    def hit_tokens(self) -> int:
        """Prefix-cache hit tokens (first admissions and re-admissions)."""
        return self.first_admission[2] + self.resumed[2]

    @property
    def hit_rate(self) -> float:
        """vLLM's logged prefix hit rate: hits / queries of first admissions only (a
        preempted request re-hitting its own blocks is counted apart)."""
        _, q, h = self.first_admission
        return h / q if q else 0.0

    @property
    def preempted_hit_rate(self) -> float:
        """Hits / queries of re-admissions after preemption (0 when there were none)."""
        _, q, h = self.resumed
        return h / q if q else 0.0

    @property
    def loop_s(self) -> float:
        """Wall time of the loop without the workload synthesis (``synth_ns``)."""
        return max(0.0, self.wall_s - self.synth_ns / 1e9)

    def calls(self) -> dict[str, dict[str, float]]:
        """Per call type: count, total, mean and percentiles (nearest rank, :mod:`~kvblocks.sim.
        percentiles`) in ns (the driver's fields)."""
        out: dict[str, dict[str, float]] = {}
        for t in CALL_TYPES:
            v = sorted(self.samples[t])
            tot = sum(v)
            out[t] = {
                "count": len(v),
                "total_ns": tot,
                "mean_ns": round(tot / len(v), 1) if v else 0,
                **{f"{name}_ns": nearest_rank(v, q) if v else 0 for name, q in QUANTILES},
                "max_ns": v[-1] if v else 0,
            }
        a, c = out["alloc_admit"], out["alloc_prefill_chunk"]
        n = a["count"] + c["count"]
        t_pf = a["total_ns"] + c["total_ns"]
        out["alloc_prefill"] = {
            "count": n,
            "total_ns": t_pf,
            "mean_ns": round(t_pf / n, 1) if n else 0,
        }
        return out


def served_output_tokens(rec: TraceRequest, max_model_len: int | None) -> int:
    """The output tokens vLLM 0.33 generates for ``rec`` with context ``max_model_len``
    (None: ``rec.max_output_tokens``).

    0 means vLLM refuses the request: its input processor rejects a prompt of
    ``max_model_len`` tokens or more (no room for one output token). Otherwise the output
    stops at ``max_output_tokens`` or where the sequence reaches ``max_model_len``,
    whichever comes first (the scheduler's ``check_stop``: ``FINISHED_LENGTH_CAPPED``).
    """
    if max_model_len is None:
        return rec.max_output_tokens
    return max(0, min(rec.max_output_tokens, max_model_len - rec.prompt_len))


def ids_str(block_ids: Sequence[Sequence[int]]) -> str:
    """Digest text of a per-group block table: groups joined by ';', ids by ','."""
    return ";".join(",".join(map(str, g)) for g in block_ids)


def ceiling_block_size(layout: KVLayout) -> int:
    """The hit granularity of ``layout``'s attention groups: their scheduler block size
    without prefix caching, as the core resolves it (the lcm of their block sizes, to which
    vLLM's hybrid coordinator aligns hits); a layout without attention groups hits at its
    hash block size."""
    attention = tuple(g for g in layout.groups if g.kind != "mamba")
    if not attention:
        return layout.hash_block_size
    return resolve_block_sizes(attention, False, layout.dcp_world_size)[0]


class _Slot:
    """The loop's own record of one live request."""

    __slots__ = (
        "arrival_s",
        "finished",
        "first_s",
        "gpu_hit",
        "host_hit",
        "keys",
        "max_out",
        "num_computed",
        "num_out",
        "num_tokens",
        "outputs",
        "preempted",
        "preemptions",
        "prefill_done",
        "prompt_len",
        "req",
        "rid",
        "salt",
        "stored",
    )

    def __init__(
        self, req: Any, rid: str, num_tokens: int, outputs: Sequence[int], salt: str | None
    ):
        self.req = req
        self.rid = rid
        self.num_tokens = num_tokens
        self.prompt_len = num_tokens
        self.num_computed = 0
        self.num_out = 0
        self.max_out = len(outputs)
        # tok(out_seed, k) for every k, computed at arrival; packed (one read per step, and
        # the Python ints of a tuple lie all over memory once many requests run)
        self.outputs = array("q", outputs)
        self.prefill_done = False
        self.preempted = False
        self.finished = False
        self.salt = salt
        self.keys: list[int] = []  # the ceilings' block keys of prompt + outputs
        self.stored = 0  # blocks of ``keys`` the ceilings saw stored
        self.arrival_s = 0.0
        self.first_s = -1.0  # time of the first output token, -1 before it
        self.gpu_hit = 0  # tokens the first admission found in the GPU prefix cache
        self.host_hit = 0  # ... and in the host tier
        self.preemptions = 0


class StepInfo(NamedTuple):
    """What one executed step did.

    Attributes:
        step: The step number (idle steps are skipped, so numbers can jump).
        scheduled: Requests that computed tokens.
        admitted: Requests admitted from ``waiting`` (first admissions and resumptions).
        preempted: Requests preempted.
        finished: Requests that finished.
        free_blocks: Free blocks at the end of the step.
    """

    step: int
    scheduled: int
    admitted: int
    preempted: int
    finished: int
    free_blocks: int


class Engine:
    """The scheduler loop over one trace and one backend (see the module docs).

    Call :meth:`step` until :attr:`done`, then :meth:`finish`; :meth:`run` does both.

    Args:
        trace: The workload.
        backend: The KV cache manager and its requests.
        options: Scheduler settings and what to record.
        layout: The backend's layout; needed only for ``options.ceilings`` (the ceilings'
            block size is :func:`ceiling_block_size`, their capacity the usable blocks
            divided among the KV cache groups).
    """

    def __init__(
        self,
        trace: Trace,
        backend: Backend,
        options: ReplayOptions | None = None,
        layout: KVLayout | None = None,
    ) -> None:
        self.options = opt = options or ReplayOptions()
        self.backend = backend
        self.trace = trace
        km = backend.manager
        self._num_free = km.block_pool.get_num_free_blocks
        # only with a policy: vLLM's manager has no clock, and without one it changes nothing
        self._advance: Callable[[float], None] | None = (
            km.advance_time if getattr(backend, "retention", None) is not None else None
        )
        self.num_blocks = self._num_free() + 1  # the null block is never free
        records = trace.requests
        self.result = ReplayResult(
            backend.name,
            self.num_blocks,
            0 if opt.external else len(records),  # external: counted as they are submitted
            0 if opt.external else sum(r.prompt_len for r in records),
            {t: array("q") for t in CALL_TYPES},
        )
        self._digest = hashlib.sha256() if opt.digest else None
        self._events = opt.events_out
        self._digest_on = self._digest is not None or self._events is not None
        self._series = StepSeries() if opt.series else None
        self.ceilings: Ceilings | None = None
        if opt.ceilings:
            if layout is None:
                raise InvalidArgumentError("the ceilings need the backend's layout")
            capacity = (self.num_blocks - 1) // len(layout.groups)
            self.ceilings = Ceilings(ceiling_block_size(layout), capacity)
        self.host = opt.host_tier
        self._key_block_size = 0  # tokens per block key; 0: no block keys are needed
        if self.host is not None:
            self._key_block_size = self.host.chunk_tokens
        if self.ceilings is not None:
            if self._key_block_size not in (0, self.ceilings.block_size):
                raise InvalidArgumentError(
                    f"the host tier's chunks ({self._key_block_size} tokens) must be the "
                    f"ceilings' blocks ({self.ceilings.block_size} tokens)"
                )
            self._key_block_size = self.ceilings.block_size
        self._followers: dict[str, list[int]] = {}
        # (arrival step, or arrival time with a time model; trace index)
        self._pending: list[tuple[float, int]] = []
        self._timed = opt.time_model is not None
        # vLLM's Mamba "align" chunk split; None for layouts without it
        self._split = mamba_split_for(
            backend.layout, backend.partial_hash_hits, opt.max_num_batched_tokens
        )
        self.now = 0.0
        """The simulated clock (time model only): the end of the last step."""
        for idx, rec in enumerate(records):
            if rec.after is not None:
                self._followers.setdefault(rec.after, []).append(idx)
            elif not opt.external:
                self._pending.append((self.arrival_time(rec), idx))
        heapq.heapify(self._pending)
        self.waiting: deque[_Slot] = deque()
        self.running: list[_Slot] = []
        self.num_finished = 0
        """Requests finished or rejected."""
        self.step_number = 0
        """The number the next executed step gets."""
        # what every step calls or appends to, looked up once
        self._new_step_starts = km.new_step_starts
        self._release_block_copies = backend.release_block_copies
        self._s_new_step = self.result.samples["new_step_starts"]
        self._t_wall0 = time.perf_counter()

    def arrival_time(self, rec: TraceRequest) -> float:
        """When a first request arrives: its step, or with a time model its ``arrival_s``
        (else ``arrival_step * step_s``)."""
        if not self._timed:
            return rec.arrival_step
        if rec.arrival_s is not None:
            return rec.arrival_s
        return rec.arrival_step * self.options.step_s

    @property
    def done(self) -> bool:
        """Every request of the trace (or, ``external``, every submitted one) finished."""
        return self.num_finished >= self.result.requests

    @property
    def idle(self) -> bool:
        """Nothing running or waiting."""
        return not self.running and not self.waiting

    def submit(self, idx: int, req: Any, arrival_s: float) -> None:
        """``external``: request ``idx`` of the trace (built as ``req``) arrives now; an idle
        engine's clock first jumps to ``arrival_s``."""
        rec = self.trace.requests[idx]
        if self.idle and arrival_s > self.now:
            self.now = arrival_s
        self.result.requests += 1
        self.result.prompt_tokens += rec.prompt_len
        self._new_slot(idx, arrival_s, req)

    def _new_slot(self, idx: int, arrival: float, req: Any = None) -> None:
        res = self.result
        rec = self.trace.requests[idx]
        num_out = served_output_tokens(rec, self.options.max_model_len)
        if num_out == 0:  # vLLM refuses it at arrival: it finishes there, with no output
            res.rejected += 1
            self.num_finished += 1
            self._release_followers(rec.request_id, arrival)
            return
        res.length_capped += num_out < rec.max_output_tokens
        pc = time.perf_counter_ns
        t0 = pc()
        prompt = rec.prompt_ids(self.trace.vocab_size)
        outputs = segment_tokens(rec.out_seed, num_out, self.trace.vocab_size)
        res.synth_ns += pc() - t0
        if req is None:
            req, dt = self.backend.make_request(
                rec.request_id,
                prompt,
                rec.max_output_tokens,
                cache_salt=rec.cache_salt,
                priority=rec.priority,
                session_id=rec.session_id,
            )
            res.request_init_ns += dt
            res.hash_calls += 1
        slot = _Slot(req, rec.request_id, rec.prompt_len, outputs, rec.cache_salt)
        slot.arrival_s = float(arrival)
        if self._key_block_size:
            t0 = pc()
            # the tokens the request will ever compute: the last output is never fed back
            tokens = prompt + list(outputs[:-1])
            slot.keys = block_keys(tokens, self._key_block_size, rec.cache_salt)
            res.synth_ns += pc() - t0
        if self.host is not None:
            self.host.add_request(rec.request_id, slot.keys, rec.priority, rec.cache_salt)
        self.waiting.append(slot)

    def _ev(self, line: str) -> None:
        self.result.num_events += 1
        if self._digest is not None:
            self._digest.update(line.encode())
        if self._events is not None:
            self._events.write(line)

    def _arrive(self) -> None:
        """Step 0: idle steps (idle time) are skipped; due arrivals join ``waiting`` (or are
        rejected); returns with a request waiting or running, or with the trace done."""
        pending = self._pending
        timed = self._timed
        while True:
            if self.idle:
                if not pending:
                    if self.done:  # the last arrivals were all rejected
                        return
                    raise ReplayError("no runnable requests left but the trace is not finished")
                if timed:
                    self.now = max(self.now, pending[0][0])
                elif pending[0][0] > self.step_number:
                    self.step_number = int(pending[0][0])
            clock = self.now if timed else self.step_number
            while pending and pending[0][0] <= clock:
                arrival, idx = heapq.heappop(pending)
                self._new_slot(idx, arrival)
            if not self.idle or self.done:
                return

    def _stored(self, slot: _Slot, upto_tokens: int) -> None:
        """The ceilings see the blocks an allocation up to ``upto_tokens`` cached."""
        assert self.ceilings is not None
        n = min(len(slot.keys), upto_tokens // self.ceilings.block_size)
        if n > slot.stored:
            self.ceilings.store(slot.keys[slot.stored : n])
            slot.stored = n

    def step(self) -> StepInfo:
        """Executes one scheduler step (steps 0-4 of the module docs).

        Raises:
            ReplayError: ``max_steps`` reached, or the waiting head never fits an idle
                cache.
        """
        opt, res = self.options, self.result
        if self.num_finished >= res.requests:
            raise ReplayError("the trace is finished")
        if self._pending or not (self.running or self.waiting):  # else nothing to arrive
            self._arrive()
            if self.idle:  # every remaining request was rejected: no step to run
                return StepInfo(self.step_number, 0, 0, 0, 0, self._num_free())
        if opt.max_steps and res.steps >= opt.max_steps:
            raise ReplayError(f"max_steps {opt.max_steps} reached at step {self.step_number}")
        pc = time.perf_counter_ns
        if self._advance is not None:
            self._advance_clock()
        t0 = pc()
        self._new_step_starts()
        self._s_new_step.append(pc() - t0)
        scheduled: list[tuple[_Slot, int]] = []
        preemptions_before = res.preemptions
        budget = self._schedule_running(opt.max_num_batched_tokens, scheduled)
        preempted = res.preemptions - preemptions_before
        admitted = 0
        if not preempted and self.waiting:  # (with nothing waiting, nothing to admit)
            admitted = self._schedule_waiting(budget, scheduled)
        if not scheduled and not self.running:
            head = self.waiting[0] if self.waiting else None
            raise ReplayError(
                f"step {self.step_number}: cannot admit {head.rid if head else None} "
                f"({head.num_tokens if head else 0} tokens) into an idle cache of "
                f"{self.num_blocks} blocks; raise the number of blocks"
            )
        res.block_copies += self._release_block_copies()
        hisparse = self.backend.hisparse
        if hisparse is not None:
            sent = hisparse.schedule(
                [(s.rid, s.num_computed, n, s.num_tokens) for s, n in scheduled],
                res.samples["hisparse_connector"],
            )
            if self._digest_on:
                self._ev(f"H {self.step_number} {sent}\n")
        host = self.host
        if host is not None:
            for slot, n in scheduled:
                host.store(slot.rid, slot.num_computed + n, slot.prompt_len)
        tm = opt.time_model
        if tm is not None:
            dt = tm([(slot.num_computed, n) for slot, n in scheduled])
            if host is not None:
                load_s, store_s = host.step_transfer_s()
                dt = max(dt + load_s, store_s)
            self.now += dt
            if self._advance is not None:
                self._advance_clock()
        finished = self._model_step(scheduled)
        if host is not None:
            host.end_step()
        if hisparse is not None:
            hisparse.complete(res.samples["hisparse_connector"])
            if self._digest_on:
                self._ev(f"h {hisparse.host_pool.get_num_free_blocks()}\n")
        free_blocks = self._num_free()
        if self._digest_on:
            self._ev(f"S {self.step_number} {free_blocks}\n")
        series = self._series
        if series is not None:
            first = res.first_admission
            series.step.append(self.step_number)
            series.free_blocks.append(free_blocks)
            series.queried.append(first[1])
            series.hits.append(first[2])
            series.running.append(len(self.running))
            series.waiting.append(len(self.waiting))
            series.preemptions.append(preempted)
            if self._timed:
                series.time_s.append(self.now)
        info = StepInfo(
            self.step_number, len(scheduled), admitted, preempted, finished, free_blocks
        )
        res.steps += 1
        self.step_number += 1
        return info

    def _advance_clock(self) -> None:
        """The manager's clock to the loop's (seconds with a time model, else the step)."""
        assert self._advance is not None
        now = self.now if self._timed else float(self.step_number)
        t0 = time.perf_counter_ns()
        self._advance(now)
        self.result.samples["advance_time"].append(time.perf_counter_ns() - t0)

    def _schedule_running(self, budget: int, scheduled: list[tuple[_Slot, int]]) -> int:
        """Step 2; returns the budget left."""
        res, running = self.result, self.running
        S = res.samples
        digest_on, ev = self._digest_on, self._ev
        track = self.ceilings is not None
        pc = time.perf_counter_ns
        batch = self.backend.batch
        split = self._split
        i = 0
        batch_failed = False
        if batch is not None and running:
            reqs: list[Any] = []
            ns: list[int] = []
            b = budget
            for slot in running:
                if b <= 0:
                    break
                n = slot.num_tokens - slot.num_computed
                if n > b:
                    n = b
                if split is not None:
                    n = split.clip(slot.num_computed, n, slot.prompt_len, slot.num_tokens)
                    if n == 0:  # the loop below skips it, as vLLM does
                        break
                reqs.append(slot.req)
                ns.append(n)
                b -= n
            t0 = pc()
            out = batch(reqs, ns)
            S["alloc_batch"].append(pc() - t0)
            res.batched_requests += len(out)
            ok = len(out)
            if ok and out[-1] is None:
                ok -= 1
                batch_failed = True
            if digest_on or track:
                for j in range(ok):
                    n = ns[j]
                    slot = running[j]
                    if digest_on:
                        ev(f"A {slot.rid} {n} 0 {ids_str(out[j])}\n")
                    if track:
                        self._stored(slot, slot.num_computed + n)
                    scheduled.append((slot, n))
                    budget -= n
            else:
                scheduled.extend(zip(running[:ok], ns[:ok], strict=True))
                budget -= sum(ns[:ok])
            i = ok
        if i >= len(running) or budget <= 0:  # all scheduled (the batch's common case)
            return budget
        km = self.backend.manager
        alloc, free, get_ids = km.allocate_slots, self.backend.free_preempted, km.get_block_ids
        s_dec, s_chunk, s_fail, s_free = (
            S["alloc_decode"], S["alloc_prefill_chunk"], S["alloc_failed"], S["free"]
        )  # fmt: skip
        while i < len(running) and budget > 0:
            slot = running[i]
            req = slot.req
            n = slot.num_tokens - slot.num_computed
            if n > budget:
                n = budget
            if split is not None:
                n = split.clip(slot.num_computed, n, slot.prompt_len, slot.num_tokens)
                if n == 0:  # no aligned chunk fits: vLLM skips the request this step
                    i += 1
                    continue
            samp = s_dec if slot.prefill_done else s_chunk
            while True:
                if batch_failed:  # allocate_slots_batch already made (and failed) this call
                    batch_failed = False
                    r = None
                else:
                    t0 = pc()
                    r = alloc(req, n)
                    dt = pc() - t0
                    (samp if r is not None else s_fail).append(dt)
                if digest_on:
                    ev(f"A {slot.rid} {n} 0 {'-' if r is None else ids_str(r.get_block_ids())}\n")
                if r is not None:
                    break
                res.alloc_failures += 1
                victim = running.pop()
                if digest_on:
                    ev(f"P {victim.rid} {ids_str(get_ids(victim.rid))}\n")
                vreq = victim.req
                t0 = pc()
                free(vreq)
                s_free.append(pc() - t0)
                vreq.num_computed_tokens = 0
                vreq.num_preemptions += 1
                victim.num_computed = 0
                victim.prefill_done = False
                victim.preempted = True
                victim.preemptions += 1
                victim.stored = 0  # its blocks are stored again when recomputed
                self.waiting.appendleft(victim)
                res.preemptions += 1
                if victim is slot:
                    break
            if r is None:
                break
            if track:
                self._stored(slot, slot.num_computed + n)
            scheduled.append((slot, n))
            budget -= n
            i += 1
        return budget

    def _schedule_waiting(self, budget: int, scheduled: list[tuple[_Slot, int]]) -> int:
        """Step 3; returns the number of requests admitted."""
        res, waiting, running = self.result, self.waiting, self.running
        km = self.backend.manager
        gcb, alloc = km.get_computed_blocks, km.allocate_slots
        s_gcb, s_admit, s_fail = (
            res.samples["get_computed_blocks"], res.samples["alloc_admit"],
            res.samples["alloc_failed"],
        )  # fmt: skip
        digest_on, ev = self._digest_on, self._ev
        ceilings = self.ceilings
        host = self.host
        first, resumed, tenants = res.first_admission, res.resumed, res.tenants
        max_seqs = self.options.max_num_seqs
        reserve = bool(self.options.reserve_full_isl)
        pc = time.perf_counter_ns
        split = self._split
        admitted = 0
        while budget > 0 and waiting and len(running) < max_seqs:
            slot = waiting[0]
            req = slot.req
            t0 = pc()
            got = gcb(req)
            s_gcb.append(pc() - t0)
            blocks, hit = got[0], got[1]
            if digest_on:
                ev(f"G {slot.rid} {hit} {ids_str(blocks.get_block_ids())}\n")
            ext = 0
            if host is not None:
                ext = host.lookup(slot.rid, hit, slot.num_tokens)
            n = slot.num_tokens - hit - ext
            if n > budget:
                n = budget
            if split is not None:
                n = split.clip(slot.num_computed, n, slot.prompt_len, slot.num_tokens, hit, ext)
                if n == 0:  # no aligned chunk fits: vLLM stops admitting
                    break
            t0 = pc()
            # vLLM's has_scheduled_reqs only gates the watermark, which is 0 here.
            r = alloc(
                req,
                n,
                num_new_computed_tokens=hit,
                new_computed_blocks=blocks,
                num_external_computed_tokens=ext,
                full_sequence_must_fit=reserve,
            )
            dt = pc() - t0
            (s_admit if r is not None else s_fail).append(dt)
            if digest_on:
                got_ids = "-" if r is None else ids_str(r.get_block_ids())
                ev(f"A {slot.rid} {n} {hit} {got_ids}\n")
            if r is None:
                res.alloc_failures += 1
                break
            waiting.popleft()
            if host is not None:
                host.load(slot.rid, hit, ext, not slot.preempted)
            st = resumed if slot.preempted else first
            st[0] += 1
            st[1] += slot.num_tokens
            st[2] += hit
            if not slot.preempted:
                slot.gpu_hit = hit
                slot.host_hit = ext
                t = tenants.get(slot.salt or "")
                if t is None:
                    t = tenants[slot.salt or ""] = [0, 0, 0]
                t[0] += 1
                t[1] += slot.num_tokens
                t[2] += hit
            if ceilings is not None:
                if not slot.preempted:
                    ceilings.lookup(slot.keys, slot.num_tokens, slot.salt, hit)
                self._stored(slot, hit + ext + n)
            running.append(slot)
            hit += ext
            req.num_computed_tokens = hit
            slot.num_computed = hit
            scheduled.append((slot, n))
            budget -= n
            admitted += 1
        return admitted

    def _model_step(self, scheduled: list[tuple[_Slot, int]]) -> int:
        """Step 4; returns the number of requests that finished."""
        res = self.result
        km = self.backend.manager
        free, get_ids = self.backend.free_finished, km.get_block_ids
        s_free = res.samples["free"]
        digest_on, ev = self._digest_on, self._ev
        append_batch = self.backend.append_batch
        pc = time.perf_counter_ns
        if append_batch is not None:
            # Every sampling request gets its token in one call; frees below keep their order.
            reqs = [s.req for s, n in scheduled if s.num_computed + n >= s.num_tokens]
            if reqs:
                tokens = [s.outputs[s.num_out] for s, n in scheduled
                          if s.num_computed + n >= s.num_tokens]  # fmt: skip
                t0 = pc()  # only the call is timed, as for the one-by-one appends
                append_batch(reqs, tokens)
                res.append_ns += pc() - t0
                res.hash_calls += 1
        finished = generated = 0
        timed = self._timed
        now = self.now  # the end of this step (the model step does not move it)
        for slot, n in scheduled:
            c = slot.num_computed + n
            slot.num_computed = c
            req = slot.req
            req.num_computed_tokens = c
            if c < slot.num_tokens:  # a prefill chunk short of the prompt's end
                continue
            slot.prefill_done = True
            k = slot.num_out
            if slot.first_s < 0:
                slot.first_s = now
            if append_batch is None:
                tok = slot.outputs[k]  # outside the timed window, as driver_vllm.py
                t0 = pc()
                req.append_output_token_ids(tok)
                res.append_ns += pc() - t0
                res.hash_calls += 1
            k += 1
            slot.num_out = k
            slot.num_tokens += 1
            generated += 1
            if k < slot.max_out:
                continue
            if digest_on:
                ev(f"F {slot.rid} {ids_str(get_ids(slot.rid))}\n")
            t0 = pc()
            free(req)
            s_free.append(pc() - t0)
            slot.finished = True
            if self.host is not None:
                self.host.finish_request(slot.rid)
            finished += 1
            self.num_finished += 1
            if timed:
                res.ttft_s.append(slot.first_s - slot.arrival_s)
                res.e2e_s.append(now - slot.arrival_s)
                res.finish_s.append(now)
                n_later = slot.max_out - 1
                tpot = (now - slot.first_s) / n_later if n_later else math.nan
                res.tpot_s.append(tpot)
                res.finished.append(
                    FinishedRequest(
                        slot.rid, slot.arrival_s, slot.first_s - slot.arrival_s, tpot,
                        now - slot.arrival_s, slot.prompt_len, slot.max_out,
                        slot.gpu_hit, slot.host_hit, slot.preemptions,
                    )
                )  # fmt: skip
            self._release_followers(slot.rid, now if timed else self.step_number)
        res.generated_tokens += generated
        if finished:
            self.running = [s for s in self.running if not s.finished]
        return finished

    def _release_followers(self, rid: str, done: float) -> None:
        """The follow-ups of request ``rid``, which finished (or was rejected) at ``done``
        (seconds with a time model, else the step), become due ``arrival_step`` steps later."""
        records, opt = self.trace.requests, self.options
        unit = opt.step_s if self._timed else 1
        for fidx in self._followers.get(rid, ()):
            arrival = done + records[fidx].arrival_step * unit
            if opt.external and opt.on_follow is not None:
                opt.on_follow(fidx, arrival)
            else:
                heapq.heappush(self._pending, (arrival, fidx))

    def finish(self) -> ReplayResult:
        """The result, after checking the end state.

        Raises:
            ReplayError: Steps remain, or the end state is inconsistent (tokens missing,
                blocks not returned).
        """
        res = self.result
        if not self.done:
            raise ReplayError(f"{res.requests - self.num_finished} requests are not finished")
        res.wall_s = time.perf_counter() - self._t_wall0
        res.simulated_s = self.now
        res.last_step = self.step_number - 1
        res.digest = self._digest.hexdigest() if self._digest is not None else None
        res.series = self._series
        if self.options.external:
            expect = res.generated_tokens  # the fleet checks the sum over its engines
        else:
            expect = sum(
                served_output_tokens(r, self.options.max_model_len) for r in self.trace.requests
            )
        if res.generated_tokens != expect:
            raise ReplayError(f"generated {res.generated_tokens} tokens, expected {expect}")
        res.final_free_blocks = self._num_free()
        if res.final_free_blocks != self.num_blocks - 1:
            raise ReplayError(
                f"{res.final_free_blocks} free blocks at the end, expected {self.num_blocks - 1}"
            )
        hisparse = self.backend.hisparse
        if hisparse is not None:
            host_free = hisparse.host_pool.get_num_free_blocks()
            if host_free != hisparse.host_blocks - 1:
                raise ReplayError(
                    f"{host_free} free host blocks at the end, expected {hisparse.host_blocks - 1}"
                )
        if self.ceilings is not None:
            res.ceilings = self.ceilings.result()  # after wall_s: not the loop's time
        if self.host is not None:
            res.offload = self.host.finish()
        return res

    def run(self) -> ReplayResult:
        """Steps until done (calling ``options.progress``), then :meth:`finish`."""
        progress, every = self.options.progress, max(1, self.options.progress_every)
        res = self.result
        while not self.done:
            self.step()
            if progress is not None and res.steps % every == 0:
                progress(res.steps, self.num_finished, res.requests)
        if progress is not None:
            progress(res.steps, self.num_finished, res.requests)
        return self.finish()


def replay(
    trace: Trace,
    backend: Backend,
    options: ReplayOptions | None = None,
    layout: KVLayout | None = None,
) -> ReplayResult:
    """Replay ``trace`` through ``backend``'s manager: ``Engine(...).run()``.

    ``layout`` (the backend's) is needed only for ``options.ceilings``.

    Raises:
        ReplayError: A request never fits an idle cache, ``max_steps`` was reached, or the
            end state is inconsistent (tokens missing, blocks not returned).
    """
    return Engine(trace, backend, options, layout).run()
