"""Trace replay: a vLLM-style scheduler loop driving a KV cache manager.

The loop is the one specified by ``tools/vllm-oracle/driver_vllm.py`` (a faithful subset of
vLLM 0.33's ``Scheduler.schedule`` with sync scheduling, FCFS, no spec decode, no
connectors, watermark 0). Each executed step:

0. arrivals whose step has come join ``waiting`` (a follow-up with ``after = R`` arrives
   ``arrival_step`` steps after the step in which R finished); idle steps are skipped;
1. ``new_step_starts()``; the token budget is ``max_num_batched_tokens``;
2. running requests, in order: ``allocate_slots(req, n)``; on failure the most recently
   admitted request is preempted (freed, moved to the front of ``waiting``) and the call
   retried, until it fits or the request preempted itself;
3. only if nothing was preempted: waiting requests are admitted while budget and seats
   last (``get_computed_blocks`` then ``allocate_slots`` with the prefix hit and
   ``full_sequence_must_fit``);
4. model step: every scheduled request computes its tokens; a request whose whole sequence
   is computed appends output token ``tok(out_seed, k)``; at ``max_output_tokens`` it
   finishes and is freed.

The allocation digest is sha256 over the driver's lines (``G``/``A``/``P``/``F``/``S``) so an
implementation with identical behaviour prints the same digest as ``driver_vllm.py``.

Backends: :class:`KvblocksBackend` (optionally with the batched decode call
``allocate_slots_batch``) and :class:`VllmBackend` (vLLM 0.33, imported only when built).
Only manager calls, request construction and token appends are timed.
"""

from __future__ import annotations

import hashlib
import heapq
import importlib
import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from kvblocks.presets import KVLayout, build_kvblocks_manager, build_vllm_manager
from kvblocks.workloads import Trace, expand_segment

__all__ = [
    "CALL_TYPES",
    "Backend",
    "KvblocksBackend",
    "ReplayError",
    "ReplayOptions",
    "ReplayResult",
    "VllmBackend",
    "make_backend",
    "replay",
    "vllm_available",
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
)


class ReplayError(RuntimeError):
    """The trace cannot be replayed (e.g. a request never fits an idle cache)."""


class Backend(Protocol):
    """A KV cache manager plus its request type."""

    name: str
    manager: Any
    """Has vLLM's ``get_computed_blocks``, ``allocate_slots``, ``free``, ``get_block_ids``,
    ``new_step_starts`` and ``block_pool.get_num_free_blocks``."""
    batch: Callable[[list[Any], list[int]], list[Any]] | None
    """``allocate_slots_batch`` when the running loop should use it, else None."""
    append_batch: Callable[[list[Any], list[int]], None] | None
    """``append_token_ids_batch`` when the model step should append in one call, else None."""

    def make_request(self, request_id: str, prompt: list[int], max_tokens: int) -> tuple[Any, int]:
        """A new request and the nanoseconds its construction (incl. hashing) took."""
        ...


class KvblocksBackend:
    """kvblocks' ``KVCacheManager`` and ``Request``; ``batch`` turns on the batch calls
    (``allocate_slots_batch`` for the running loop, ``append_token_ids_batch`` for the model
    step)."""

    name = "kvblocks"

    def __init__(self, layout: KVLayout, hash_algo: str = "sha256_cbor", batch: bool = False):
        import kvblocks as kb

        k: Any = kb
        self.manager = build_kvblocks_manager(layout)
        self._request = k.Request
        self._hasher = k.BlockHasher(layout.hash_block_size, hash_algo)
        self.batch = self.manager.allocate_slots_batch if batch else None
        self.append_batch = k.append_token_ids_batch if batch else None

    def make_request(self, request_id: str, prompt: list[int], max_tokens: int) -> tuple[Any, int]:
        """See :class:`Backend`."""
        pc = time.perf_counter_ns
        t0 = pc()
        req = self._request(request_id, prompt, self._hasher)
        return req, pc() - t0


class VllmBackend:
    """vLLM 0.33's ``KVCacheManager`` and ``Request`` (imports vLLM)."""

    name = "vllm"

    def __init__(self, layout: KVLayout, hash_algo: str = "sha256_cbor"):
        # importlib keeps vLLM (an optional, untyped dependency) out of the type check.
        utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
        hashing = importlib.import_module("vllm.utils.hashing")
        self.manager = build_vllm_manager(layout)
        self.batch: Callable[[list[Any], list[int]], list[Any]] | None = None
        self.append_batch: Callable[[list[Any], list[int]], None] | None = None
        self._request = importlib.import_module("vllm.v1.request").Request
        self._params = importlib.import_module("vllm.sampling_params").SamplingParams
        hash_fn = hashing.get_hash_fn_by_name(hash_algo)
        utils.init_none_hash(hash_fn)
        self._hasher = utils.get_request_block_hasher(layout.hash_block_size, hash_fn)

    def make_request(self, request_id: str, prompt: list[int], max_tokens: int) -> tuple[Any, int]:
        """See :class:`Backend`."""
        params = self._params(max_tokens=max_tokens)
        pc = time.perf_counter_ns
        t0 = pc()
        req = self._request(
            request_id=request_id,
            prompt_token_ids=prompt,
            sampling_params=params,
            pooling_params=None,
            arrival_time=0.0,
            block_hasher=self._hasher,
        )
        return req, pc() - t0


def vllm_available() -> str | None:
    """vLLM's version if vLLM is importable, else None."""
    try:
        vllm = importlib.import_module("vllm")
    except Exception:  # a broken vLLM install is as unusable as a missing one
        return None
    return str(getattr(vllm, "__version__", "unknown"))


def make_backend(
    impl: str, layout: KVLayout, hash_algo: str = "sha256_cbor", batch: bool = False
) -> Backend:
    """``impl`` = ``"kvblocks"`` or ``"vllm"``; ``batch`` only applies to kvblocks."""
    if impl == "kvblocks":
        return KvblocksBackend(layout, hash_algo, batch)
    if impl == "vllm":
        return VllmBackend(layout, hash_algo)
    raise ValueError(f"unknown implementation {impl!r}")


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
        progress: Called as ``progress(steps, finished, total)`` every ``progress_every``
            steps.
        progress_every: See ``progress``.
    """

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    reserve_full_isl: bool = True
    digest: bool = True
    events_out: IO[str] | None = None
    max_steps: int = 0
    series: bool = False
    progress: Callable[[int, int, int], None] | None = None
    progress_every: int = 1000


@dataclass
class StepSeries:
    """Per executed step: the step number, free blocks, cumulative prefix-cache queried and
    hit tokens, running and waiting requests (at the end of the step)."""

    step: array[int] = field(default_factory=lambda: array("q"))
    free_blocks: array[int] = field(default_factory=lambda: array("q"))
    queried: array[int] = field(default_factory=lambda: array("q"))
    hits: array[int] = field(default_factory=lambda: array("q"))
    running: array[int] = field(default_factory=lambda: array("q"))
    waiting: array[int] = field(default_factory=lambda: array("q"))


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
    first_admission: list[int] = field(default_factory=lambda: [0, 0, 0])
    resumed: list[int] = field(default_factory=lambda: [0, 0, 0])
    digest: str | None = None
    num_events: int = 0
    wall_s: float = 0.0
    final_free_blocks: int = 0
    series: StepSeries | None = None

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
        """Prefix-cache hit tokens."""
        return self.first_admission[2] + self.resumed[2]

    @property
    def hit_rate(self) -> float:
        """hit_tokens / queried_tokens (0 when nothing was queried)."""
        q = self.queried_tokens
        return self.hit_tokens / q if q else 0.0

    def calls(self) -> dict[str, dict[str, float]]:
        """Per call type: count, total, mean and percentiles in ns (the driver's fields)."""
        out: dict[str, dict[str, float]] = {}
        for t in CALL_TYPES:
            v = sorted(self.samples[t])
            tot = sum(v)
            out[t] = {
                "count": len(v),
                "total_ns": tot,
                "mean_ns": round(tot / len(v), 1) if v else 0,
                "p50_ns": _pct(v, 0.5),
                "p90_ns": _pct(v, 0.9),
                "p99_ns": _pct(v, 0.99),
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


def _pct(sorted_vals: Sequence[int], q: float) -> int:
    if not sorted_vals:
        return 0
    k = min(len(sorted_vals) - 1, max(0, round(q * (len(sorted_vals) - 1))))
    return sorted_vals[k]


def ids_str(block_ids: Sequence[Sequence[int]]) -> str:
    """Digest text of a per-group block table: groups joined by ';', ids by ','."""
    return ";".join(",".join(map(str, g)) for g in block_ids)


class _Slot:
    """The loop's own record of one live request."""

    __slots__ = (
        "finished",
        "max_out",
        "num_computed",
        "num_out",
        "num_tokens",
        "outputs",
        "preempted",
        "prefill_done",
        "req",
        "rid",
    )

    def __init__(self, req: Any, rid: str, num_tokens: int, outputs: list[int]):
        self.req = req
        self.rid = rid
        self.num_tokens = num_tokens
        self.num_computed = 0
        self.num_out = 0
        self.max_out = len(outputs)
        self.outputs = outputs  # tok(out_seed, k) for every k, computed at arrival
        self.prefill_done = False
        self.preempted = False
        self.finished = False


def replay(trace: Trace, backend: Backend, options: ReplayOptions | None = None) -> ReplayResult:
    """Replay ``trace`` through ``backend``'s manager with the scheduler loop above.

    Raises:
        ReplayError: A request never fits an idle cache, ``max_steps`` was reached, or the
            end state is inconsistent (tokens missing, blocks not returned).
    """
    opt = options or ReplayOptions()
    km = backend.manager
    pool = km.block_pool
    num_free = pool.get_num_free_blocks
    num_blocks = num_free() + 1  # the null block is never free
    records = trace.requests
    vocab = trace.vocab_size
    res = ReplayResult(
        backend.name,
        num_blocks,
        len(records),
        sum(r.prompt_len for r in records),
        {t: array("q") for t in CALL_TYPES},
    )
    S = res.samples
    s_gcb, s_admit, s_chunk = S["get_computed_blocks"], S["alloc_admit"], S["alloc_prefill_chunk"]
    s_dec, s_fail, s_free = S["alloc_decode"], S["alloc_failed"], S["free"]
    s_nss, s_batch = S["new_step_starts"], S["alloc_batch"]
    gcb, alloc, free, nss = km.get_computed_blocks, km.allocate_slots, km.free, km.new_step_starts
    get_ids = km.get_block_ids
    batch = backend.batch
    append_batch = backend.append_batch
    make_request = backend.make_request
    pc = time.perf_counter_ns
    budget0 = opt.max_num_batched_tokens
    max_seqs = opt.max_num_seqs
    reserve = bool(opt.reserve_full_isl)
    digest = hashlib.sha256() if opt.digest else None
    events = opt.events_out
    digest_on = digest is not None or events is not None
    n_events = 0

    def ev(line: str) -> None:
        nonlocal n_events
        n_events += 1
        if digest is not None:
            digest.update(line.encode())
        if events is not None:
            events.write(line)

    series = StepSeries() if opt.series else None
    progress, progress_every = opt.progress, max(1, opt.progress_every)

    followers: dict[str, list[int]] = {}
    pending: list[tuple[int, int]] = []  # (arrival step, trace index)
    for idx, rec in enumerate(records):
        if rec.after is not None:
            followers.setdefault(rec.after, []).append(idx)
        else:
            pending.append((rec.arrival_step, idx))
    heapq.heapify(pending)
    waiting: deque[_Slot] = deque()
    running: list[_Slot] = []
    first, resumed = res.first_admission, res.resumed
    n_total = len(records)
    n_finished = 0
    step = 0
    steps = 0
    generated = 0
    preemptions = 0
    failures = 0
    batched = 0
    init_ns = 0
    append_ns = 0
    hash_calls = 0

    t_wall0 = time.perf_counter()
    while n_finished < n_total:
        # 0. arrivals (idle steps are skipped)
        if not running and not waiting:
            if not pending:
                raise ReplayError("no runnable requests left but the trace is not finished")
            if pending[0][0] > step:
                step = pending[0][0]
        while pending and pending[0][0] <= step:
            _, idx = heapq.heappop(pending)
            rec = records[idx]
            req, dt = make_request(rec.request_id, rec.prompt_ids(vocab), rec.max_output_tokens)
            init_ns += dt
            hash_calls += 1
            outputs = expand_segment(rec.out_seed, rec.max_output_tokens, vocab)
            waiting.append(_Slot(req, rec.request_id, rec.prompt_len, outputs))
        if opt.max_steps and steps >= opt.max_steps:
            raise ReplayError(f"max_steps {opt.max_steps} reached at step {step}")

        # 1. step start
        t0 = pc()
        nss()
        s_nss.append(pc() - t0)
        budget = budget0
        scheduled: list[tuple[_Slot, int]] = []
        preempted_any = False

        # 2. running requests
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
                reqs.append(slot.req)
                ns.append(n)
                b -= n
            t0 = pc()
            out = batch(reqs, ns)
            s_batch.append(pc() - t0)
            batched += len(out)
            ok = len(out)
            if ok and out[-1] is None:
                ok -= 1
                batch_failed = True
            for j in range(ok):
                n = ns[j]
                slot = running[j]
                if digest_on:
                    ev(f"A {slot.rid} {n} 0 {ids_str(out[j])}\n")
                scheduled.append((slot, n))
                budget -= n
            i = ok
        while i < len(running) and budget > 0:
            slot = running[i]
            req = slot.req
            n = slot.num_tokens - slot.num_computed
            if n > budget:
                n = budget
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
                failures += 1
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
                waiting.appendleft(victim)
                preemptions += 1
                preempted_any = True
                if victim is slot:
                    break
            if r is None:
                break
            scheduled.append((slot, n))
            budget -= n
            i += 1

        # 3. waiting requests (only when nothing was preempted)
        if not preempted_any:
            while budget > 0 and waiting and len(running) < max_seqs:
                slot = waiting[0]
                req = slot.req
                t0 = pc()
                got = gcb(req)
                s_gcb.append(pc() - t0)
                blocks, hit = got[0], got[1]
                if digest_on:
                    ev(f"G {slot.rid} {hit} {ids_str(blocks.get_block_ids())}\n")
                n = slot.num_tokens - hit
                if n > budget:
                    n = budget
                t0 = pc()
                # vLLM's has_scheduled_reqs only gates the watermark, which is 0 here.
                r = alloc(
                    req,
                    n,
                    num_new_computed_tokens=hit,
                    new_computed_blocks=blocks,
                    full_sequence_must_fit=reserve,
                )
                dt = pc() - t0
                (s_admit if r is not None else s_fail).append(dt)
                if digest_on:
                    got_ids = "-" if r is None else ids_str(r.get_block_ids())
                    ev(f"A {slot.rid} {n} {hit} {got_ids}\n")
                if r is None:
                    failures += 1
                    break
                waiting.popleft()
                st = resumed if slot.preempted else first
                st[0] += 1
                st[1] += slot.num_tokens
                st[2] += hit
                running.append(slot)
                req.num_computed_tokens = hit
                slot.num_computed = hit
                scheduled.append((slot, n))
                budget -= n

        if not scheduled and not running:
            head = waiting[0] if waiting else None
            raise ReplayError(
                f"step {step}: cannot admit {head.rid if head else None} "
                f"({head.num_tokens if head else 0} tokens) into an idle cache of "
                f"{num_blocks} blocks; raise the number of blocks"
            )

        # 4. model step
        finished_any = False
        if append_batch is not None:
            # Every sampling request gets its token in one call; frees below keep their order.
            sampled = [slot for slot, n in scheduled if slot.num_computed + n >= slot.num_tokens]
            if sampled:
                reqs = [s.req for s in sampled]
                tokens = [s.outputs[s.num_out] for s in sampled]
                t0 = pc()  # only the call is timed, as for the one-by-one appends
                append_batch(reqs, tokens)
                append_ns += pc() - t0
                hash_calls += 1
        for slot, n in scheduled:
            c = slot.num_computed + n
            slot.num_computed = c
            req = slot.req
            req.num_computed_tokens = c
            if c >= slot.num_tokens:
                slot.prefill_done = True
                k = slot.num_out
                if append_batch is None:
                    tok = slot.outputs[k]  # outside the timed window, as driver_vllm.py
                    t0 = pc()
                    req.append_output_token_ids(tok)
                    append_ns += pc() - t0
                    hash_calls += 1
                slot.num_out = k + 1
                slot.num_tokens += 1
                generated += 1
                if k + 1 >= slot.max_out:
                    if digest_on:
                        ev(f"F {slot.rid} {ids_str(get_ids(slot.rid))}\n")
                    t0 = pc()
                    free(req)
                    s_free.append(pc() - t0)
                    slot.finished = True
                    finished_any = True
                    n_finished += 1
                    for fidx in followers.get(slot.rid, ()):
                        heapq.heappush(pending, (step + records[fidx].arrival_step, fidx))
        if finished_any:
            running = [s for s in running if not s.finished]
        if digest_on:
            ev(f"S {step} {num_free()}\n")
        if series is not None:
            series.step.append(step)
            series.free_blocks.append(num_free())
            series.queried.append(first[1] + resumed[1])
            series.hits.append(first[2] + resumed[2])
            series.running.append(len(running))
            series.waiting.append(len(waiting))
        steps += 1
        step += 1
        if progress is not None and steps % progress_every == 0:
            progress(steps, n_finished, n_total)

    res.wall_s = time.perf_counter() - t_wall0
    res.steps, res.last_step = steps, step - 1
    res.generated_tokens, res.preemptions, res.alloc_failures = generated, preemptions, failures
    res.batched_requests = batched
    res.request_init_ns, res.append_ns, res.hash_calls = init_ns, append_ns, hash_calls
    res.digest = digest.hexdigest() if digest is not None else None
    res.num_events = n_events
    res.series = series
    expect = sum(r.max_output_tokens for r in records)
    if generated != expect:
        raise ReplayError(f"generated {generated} tokens, expected {expect}")
    res.final_free_blocks = num_free()
    if res.final_free_blocks != num_blocks - 1:
        raise ReplayError(
            f"{res.final_free_blocks} free blocks at the end, expected {num_blocks - 1}"
        )
    if progress is not None:
        progress(steps, n_finished, n_total)
    return res
