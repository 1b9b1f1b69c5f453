"""Request workloads for trace replay: built-in generators and trace-file readers.

Token rule (kvtrace-v1, ``docs/trace-kvtrace.md``; the oracle's ``trace.py`` draws the same;
all ids in ``[0, vocab)``)::

    splitmix64(x) = mix(x + 0x9E3779B97F4A7C15 mod 2**64)
    tok(seed, i)  = splitmix64(splitmix64(seed) + i mod 2**64) mod vocab

A prompt segment ``(seed, n)`` expands to ``[tok(seed, 0), ..., tok(seed, n - 1)]`` and output
token ``k`` of a request is ``tok(out_seed, k)``, so outputs never depend on scheduling.

Built-in generators (:func:`generate`) follow trace.py's four kinds draw for draw, so the same
kind, seed and sizes give the same requests as ``trace.py --kind KIND --seed SEED``.

Trace files (:func:`read_trace`):

* **kvtrace-v1**: JSON lines, a header object with ``"format": "kvtrace-v1"`` and one object
  per request (``request_id``, ``arrival_step``, ``after``, ``prompt`` segments or
  ``prompt_token_ids``, ``out_seed``, ``max_output_tokens``).
* **Mooncake**: JSON lines with ``timestamp`` (ms), ``input_length``, ``output_length`` and
  ``hash_ids``. Each hash id stands for one ``mooncake_block`` -token block whose tokens are
  synthesized from the id alone (equal ids give equal tokens); the last block is cut to
  ``input_length``. A request arrives at step ``timestamp // step_ms``. Optional
  ``session_id``, ``tenant`` (the cache salt) and ``priority`` feed retention policies.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass, field, replace
from typing import Any

from kvblocks._core import InvalidArgumentError

__all__ = [
    "DEFAULT_SIZES",
    "KINDS",
    "MULTI_TENANT_STEADY",
    "TRACE_PY_KINDS",
    "VOCAB_SIZE",
    "Trace",
    "TraceError",
    "TraceRequest",
    "WorkloadParams",
    "expand_segment",
    "generate",
    "read_trace",
    "segment_tokens",
    "splitmix64",
    "synthetic_mooncake",
    "tok",
]

VOCAB_SIZE = 150000
MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_C1 = 0xBF58476D1CE4E5B9
_C2 = 0x94D049BB133111EB
# Mixed into a Mooncake hash id to get its segment seed, so Mooncake tokens do not collide
# with kvtrace segments that happen to use small seeds.
_MOONCAKE_SALT = 0x6D6F6F6E63616B65

_np: Any
try:  # optional: only makes prompt expansion faster
    import numpy

    _np = numpy
except ImportError:  # pragma: no cover - exercised only where numpy is absent
    _np = None


def splitmix64(x: int) -> int:
    """SplitMix64 of ``x`` (all arithmetic mod 2**64)."""
    z = (x + _GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * _C1) & MASK64
    z = ((z ^ (z >> 27)) * _C2) & MASK64
    return z ^ (z >> 31)


def tok(seed: int, i: int, vocab_size: int = VOCAB_SIZE) -> int:
    """Token ``i`` of the stream ``seed``."""
    return splitmix64((splitmix64(seed) + i) & MASK64) % vocab_size


def expand_segment(seed: int, n: int, vocab_size: int = VOCAB_SIZE) -> list[int]:
    """``[tok(seed, 0), ..., tok(seed, n - 1)]`` (numpy-accelerated when importable)."""
    base = splitmix64(seed)
    if _np is None or n < 64:
        return [splitmix64((base + i) & MASK64) % vocab_size for i in range(n)]
    np = _np
    with np.errstate(over="ignore"):
        z = np.arange(n, dtype=np.uint64)
        z += np.uint64((base + _GOLDEN) & MASK64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_C1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_C2)
        z = z ^ (z >> np.uint64(31))
        z %= np.uint64(vocab_size)
    out: list[int] = z.tolist()
    return out


@functools.lru_cache(maxsize=1024)
def segment_tokens(seed: int, n: int, vocab_size: int = VOCAB_SIZE) -> tuple[int, ...]:
    """:func:`expand_segment` as a tuple, memoized: system prompts, quoted turns and
    Mooncake hash ids repeat."""
    return tuple(expand_segment(seed, n, vocab_size))


@dataclass(frozen=True)
class TraceRequest:
    """One request of a workload.

    Attributes:
        request_id: Unique id.
        arrival_step: Arrival step; for a follow-up (``after`` set) the delay after the
            step in which ``after`` produced its last token.
        segments: Prompt as ``(seed, n)`` segments (empty when ``token_ids`` is given).
        out_seed: Seed of the output tokens.
        max_output_tokens: The request finishes after this many output tokens.
        after: Request id this one follows (agentic turns), or None.
        token_ids: Explicit prompt token ids, or None.
        cache_salt: The tenant's cache salt (vLLM's ``cache_salt``: requests share cached
            blocks only within one salt), or None.
        arrival_s: Arrival time in seconds when the trace gives one (Mooncake's
            ``timestamp`` / 1000); None = ``arrival_step`` times the step length. Only the
            time model reads it.
        priority: vLLM's request priority (an int, lower is more urgent; default 0). Only a
            retention policy's ``priority_classes`` reads it (``docs/retention.md``).
        session_id: The session (conversation, agent run) the request belongs to, or None.
            Only a retention policy with ``session_s`` reads it.
    """

    request_id: str
    arrival_step: int
    segments: tuple[tuple[int, int], ...]
    out_seed: int
    max_output_tokens: int
    after: str | None = None
    token_ids: tuple[int, ...] | None = None
    cache_salt: str | None = None
    arrival_s: float | None = None
    priority: int = 0
    session_id: str | None = None

    @property
    def prompt_len(self) -> int:
        """Number of prompt tokens."""
        if self.token_ids is not None:
            return len(self.token_ids)
        return sum(n for _, n in self.segments)

    def prompt_ids(self, vocab_size: int = VOCAB_SIZE) -> list[int]:
        """The prompt's token ids."""
        if self.token_ids is not None:
            return list(self.token_ids)
        out: list[int] = []
        for seed, n in self.segments:
            out.extend(segment_tokens(seed, n, vocab_size))
        return out


@dataclass
class Trace:
    """A workload: requests in trace order plus where they came from."""

    requests: list[TraceRequest]
    kind: str
    seed: int | None = None
    vocab_size: int = VOCAB_SIZE
    source: str | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def truncated(self, max_requests: int) -> Trace:
        """The first ``max_requests`` requests, dropping follow-ups of removed ones."""
        if max_requests <= 0 or max_requests >= len(self.requests):
            return self
        kept = self.requests[:max_requests]
        ids = {r.request_id for r in kept}
        kept = [r for r in kept if r.after is None or r.after in ids]
        return Trace(kept, self.kind, self.seed, self.vocab_size, self.source, self.params)

    def with_tenants(self, n: int) -> Trace:
        """Cache salts ``tenant-0`` .. ``tenant-{n-1}`` given in turn to the requests that
        follow no other; a follow-up keeps its session's salt."""
        salts: dict[str, str] = {}
        out = []
        roots = 0
        for r in self.requests:
            if r.after is not None and r.after in salts:
                salt = salts[r.after]
            else:
                salt = f"tenant-{roots % n}"
                roots += 1
            salts[r.request_id] = salt
            out.append(replace(r, cache_salt=salt))
        params = {**self.params, "tenants": n}
        return Trace(out, self.kind, self.seed, self.vocab_size, self.source, params)

    @property
    def max_seq_len(self) -> int:
        """Longest prompt + output of any request."""
        return max((r.prompt_len + r.max_output_tokens for r in self.requests), default=0)


class TraceError(InvalidArgumentError):
    """A trace file that cannot be read; the message names the file and line."""


# --------------------------------------------------------------------------- generators
TRACE_PY_KINDS = ("shared-prefix", "no-reuse", "long-context", "agentic")
"""The kinds the oracle's ``trace.py`` also generates, draw for draw."""
KINDS = (*TRACE_PY_KINDS, "multi-tenant")
# kind -> (num_requests (sessions for agentic), rate per step)
DEFAULT_SIZES: dict[str, tuple[int, float]] = {
    "shared-prefix": (2000, 0.5),
    "no-reuse": (2000, 0.5),
    "long-context": (32, 0.02),
    "agentic": (300, 0.1),
    "multi-tenant": (1000, 0.5),
}
# The generator's seed offset per kind (trace.py's: the sorted index of its four kinds).
_KIND_SEED = {"agentic": 0, "long-context": 1, "no-reuse": 2, "shared-prefix": 3, "multi-tenant": 4}
MULTI_TENANT_STEADY = ("chat-a", "chat-b", "chat-c")
"""The steady chat tenants of the ``multi-tenant`` workload (its other two: ``agent`` and
``burst``)."""
DEFAULT_BURST_EVERY = 600
DEFAULT_BURST_SIZE = 48


@dataclass(frozen=True)
class WorkloadParams:
    """Sizes of a generated workload.

    Attributes:
        num_requests: Requests (sessions for ``agentic``); None = the kind's default.
        rate: Poisson arrivals (requests, or sessions) per step; None = the kind's default.
        num_system_prompts: Shared system prompts; None = 8 (agentic: 4; multi-tenant: 4
            per tenant).
    """

    num_requests: int | None = None
    rate: float | None = None
    num_system_prompts: int | None = None
    burst_every: int | None = None
    """``multi-tenant``: steps from one burst's start to the next (None = 600)."""
    burst_size: int | None = None
    """``multi-tenant``: requests per burst (None = 48)."""


class _Draws:
    """The random draws of the generators, in trace.py's order."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def seed(self) -> int:
        return self.rng.getrandbits(63)

    def uniform(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def segment(self, lo: int, hi: int) -> tuple[int, int]:
        seed = self.seed()
        return (seed, self.uniform(lo, hi))

    def arrivals(self, n: int, rate: float) -> list[int]:
        t = 0.0
        steps = []
        for _ in range(n):
            steps.append(int(t))
            t += self.rng.expovariate(rate)
        return steps

    def zipf(self, k: int) -> int:
        return self.rng.choices(range(k), weights=[1.0 / (j + 1) for j in range(k)])[0]


def _independent(
    d: _Draws, prefix: str, n: int, rate: float, prompt: tuple[int, int], output: tuple[int, int]
) -> list[TraceRequest]:
    arrivals = d.arrivals(n, rate)
    out = []
    for i in range(n):
        seg = d.segment(*prompt)
        out_seed = d.seed()
        out.append(
            TraceRequest(f"{prefix}-{i:06d}", arrivals[i], (seg,), out_seed, d.uniform(*output))
        )
    return out


def _shared_prefix(d: _Draws, n: int, rate: float, n_sys: int) -> list[TraceRequest]:
    systems = [d.segment(1024, 4096) for _ in range(n_sys)]
    arrivals = d.arrivals(n, rate)
    out = []
    for i in range(n):
        system = systems[d.zipf(n_sys)]
        user = d.segment(50, 2000)
        out_seed = d.seed()
        out.append(
            TraceRequest(f"sp-{i:06d}", arrivals[i], (system, user), out_seed, d.uniform(50, 1000))
        )
    return out


def _agentic(d: _Draws, n_sessions: int, rate: float, n_sys: int) -> list[TraceRequest]:
    systems = [d.segment(1024, 4096) for _ in range(n_sys)]
    starts = d.arrivals(n_sessions, rate)
    out: list[TraceRequest] = []
    for s in range(n_sessions):
        n_turns = d.uniform(2, 12)
        system = systems[d.zipf(n_sys)]
        prompt: tuple[tuple[int, int], ...] = (system, d.segment(100, 1000))
        prev: TraceRequest | None = None
        for t in range(n_turns):
            rid = f"ag-{s:05d}-{t:02d}"
            out_seed, max_out = d.seed(), d.uniform(50, 500)
            # session_id: trace.py's "session" field, as a string
            if prev is None:
                rec = TraceRequest(rid, starts[s], prompt, out_seed, max_out, session_id=str(s))
            else:
                # Turn t quotes turn t-1's prompt and full output, then new tokens.
                prompt = (*prompt, (prev.out_seed, prev.max_output_tokens), d.segment(50, 2000))
                delay = d.uniform(1, 20)
                rec = TraceRequest(
                    rid, delay, prompt, out_seed, max_out, after=prev.request_id, session_id=str(s)
                )
            out.append(rec)
            prev = rec
    return out


def _multi_tenant(
    d: _Draws, n: int, rate: float, n_sys: int, burst_every: int, burst_size: int
) -> list[TraceRequest]:
    """Steady tenants with recurring prompts, an agent tenant with sessions, and a tenant
    that bursts one-off long prompts (see :func:`generate`)."""
    systems = {
        t: [d.segment(1024, 3072) for _ in range(n_sys)] for t in (*MULTI_TENANT_STEADY, "agent")
    }
    arrivals = d.arrivals(n, rate)
    out: list[tuple[int, TraceRequest]] = []  # (arrival of the session's first request, rec)
    n_sessions = 0
    for i in range(n):
        if d.uniform(0, 4) == 0:  # one in five: an agent session of 2-5 turns
            sid = f"agent-{n_sessions:04d}"
            n_sessions += 1
            prompt: tuple[tuple[int, int], ...] = (
                systems["agent"][d.zipf(n_sys)],
                d.segment(100, 1000),
            )
            prev: TraceRequest | None = None
            for t in range(d.uniform(2, 5)):
                rid = f"{sid}-{t:02d}"
                out_seed, max_out = d.seed(), d.uniform(50, 200)
                if prev is None:
                    rec = TraceRequest(
                        rid, arrivals[i], prompt, out_seed, max_out, cache_salt="agent",
                        session_id=sid,
                    )  # fmt: skip
                else:
                    prompt = (*prompt, (prev.out_seed, prev.max_output_tokens), d.segment(50, 500))
                    rec = TraceRequest(
                        rid, d.uniform(20, 200), prompt, out_seed, max_out, after=prev.request_id,
                        cache_salt="agent", session_id=sid,
                    )  # fmt: skip
                out.append((arrivals[i], rec))
                prev = rec
            continue
        tenant = MULTI_TENANT_STEADY[d.uniform(0, len(MULTI_TENANT_STEADY) - 1)]
        prompt = (systems[tenant][d.zipf(n_sys)], d.segment(50, 500))
        out.append(
            (arrivals[i], TraceRequest(
                f"{tenant}-{i:06d}", arrivals[i], prompt, d.seed(), d.uniform(50, 200),
                cache_salt=tenant,
            ))
        )  # fmt: skip
    end = arrivals[-1] if arrivals else 0
    k = 0
    start = burst_every // 2
    while start <= end:
        step = start
        for j in range(burst_size):
            out.append(
                (step, TraceRequest(
                    f"burst-{k:03d}-{j:03d}", step, (d.segment(2048, 6144),), d.seed(),
                    d.uniform(50, 100), cache_salt="burst", priority=1,
                ))
            )  # fmt: skip
            step += d.uniform(2, 10)
        k += 1
        start += burst_every
    # trace order: by the arrival of the first request of each session (stable), so
    # --max-requests keeps a prefix in time and every follow-up after its predecessor
    return [rec for _, rec in sorted(out, key=lambda x: x[0])]


def generate(kind: str, seed: int = 0, params: WorkloadParams | None = None) -> Trace:
    """A deterministic workload of one of :data:`KINDS`.

    Args:
        kind: ``shared-prefix`` (chat with shared system prompts), ``no-reuse``,
            ``long-context`` (32k-128k prompts), ``agentic`` (multi-turn sessions, each
            turn with its session's ``session_id``) or ``multi-tenant`` (kvblocks' own, not
            in ``trace.py``): ``num_requests`` arrivals at ``rate``, one in five an agent
            session (tenant ``agent``, 2-5 turns, each quoting the one before and arriving
            20-200 steps, i.e. tool calls of 1-10 s, after it; with a ``session_id``), the
            others a chat request of tenant ``chat-a``, ``chat-b`` or ``chat-c`` (one of the
            tenant's ``num_system_prompts`` 1k-3k-token prompts, Zipf, then 50-500 new
            tokens); meanwhile tenant ``burst`` sends, every ``burst_every`` steps from
            ``burst_every / 2`` on, ``burst_size`` one-off 2k-6k-token prompts 2-10 steps
            apart, with ``priority`` 1 (the others 0). Every sequence fits an 8k context.
        seed: Random seed; the same (kind, seed, params) always gives the same trace.
        params: Sizes and rates; defaults per kind.

    Returns:
        The trace.

    Raises:
        ValueError: Unknown kind or non-positive sizes.
    """
    if kind not in KINDS:
        raise InvalidArgumentError(f"unknown workload {kind!r}; choose from {', '.join(KINDS)}")
    p = params or WorkloadParams()
    n_def, rate_def = DEFAULT_SIZES[kind]
    n = n_def if p.num_requests is None else p.num_requests
    rate = rate_def if p.rate is None else p.rate
    n_sys = p.num_system_prompts or (4 if kind in ("agentic", "multi-tenant") else 8)
    if n < 1 or rate <= 0 or n_sys < 1:
        raise InvalidArgumentError("num_requests, rate and num_system_prompts must be positive")
    burst_every = p.burst_every or DEFAULT_BURST_EVERY
    burst_size = DEFAULT_BURST_SIZE if p.burst_size is None else p.burst_size
    if burst_every < 1 or burst_size < 0:
        raise InvalidArgumentError("burst_every must be positive and burst_size not negative")
    d = _Draws(seed * 1_000_003 + _KIND_SEED[kind])
    if kind == "shared-prefix":
        reqs = _shared_prefix(d, n, rate, n_sys)
    elif kind == "no-reuse":
        reqs = _independent(d, "nr", n, rate, (100, 4000), (50, 1000))
    elif kind == "long-context":
        reqs = _independent(d, "lc", n, rate, (32768, 131072), (100, 1000))
    elif kind == "agentic":
        reqs = _agentic(d, n, rate, n_sys)
    else:
        reqs = _multi_tenant(d, n, rate, n_sys, burst_every, burst_size)
    info: dict[str, Any] = {"num_requests": n, "rate": rate}
    if kind in ("shared-prefix", "agentic", "multi-tenant"):
        info["num_system_prompts"] = n_sys
    if kind == "multi-tenant":
        info["burst_every"] = burst_every
        info["burst_size"] = burst_size
    return Trace(reqs, kind, seed, VOCAB_SIZE, None, info)


def synthetic_mooncake(
    seed: int = 0,
    num_sessions: int = 50,
    *,
    num_system_prompts: int = 4,
    max_turns: int = 6,
    session_gap_ms: float = 2000.0,
    turn_gap_ms: tuple[float, float] = (2000.0, 20000.0),
    max_output: int = 300,
    block: int = 512,
    sessions: bool = False,
    tenants: int = 0,
) -> list[dict[str, Any]]:
    """Conversations as Mooncake-format records (``timestamp``, ``input_length``,
    ``output_length``, ``hash_ids``), for examples and tests; no real trace's numbers.

    Sessions arrive ``session_gap_ms`` apart on average and open with one of
    ``num_system_prompts`` shared prompts (1-6 hash blocks); each turn quotes the previous
    turn's full blocks and adds 1-6 new ones, and ends in a partial block of a new id, so
    a hash id always stands for the same prefix, as in Mooncake's traces. With
    ``sessions`` each record also has its conversation's ``session_id`` (``s0``, ``s1``,
    ...); with ``tenants`` > 0 a ``tenant`` (``tenant-0`` ... in turn per conversation,
    which then share no blocks across tenants). Neither changes the other fields.
    """
    rng = random.Random(seed)
    next_id = 0

    def fresh(k: int) -> list[int]:
        nonlocal next_id
        next_id += k
        return list(range(next_id - k, next_id))

    systems = [fresh(rng.randint(1, 6)) for _ in range(num_system_prompts)]
    weights = [1.0 / (j + 1) for j in range(num_system_prompts)]
    records: list[dict[str, Any]] = []
    start = 0.0
    for k in range(num_sessions):
        start += rng.expovariate(1.0 / session_gap_ms)
        prefix = rng.choices(systems, weights)[0]
        t = start
        for _ in range(rng.randint(1, max_turns)):
            full = prefix + fresh(rng.randint(1, 6))
            rec: dict[str, Any] = {
                "timestamp": int(t),
                "input_length": len(full) * block + rng.randint(1, block - 1),
                "output_length": rng.randint(1, max_output),
                "hash_ids": full + fresh(1),
            }
            if sessions:
                rec["session_id"] = f"s{k}"
            if tenants > 0:
                rec["tenant"] = f"tenant-{k % tenants}"
            records.append(rec)
            prefix = full
            t += rng.uniform(*turn_gap_ms)
    records.sort(key=lambda r: int(r["timestamp"]))
    return records


# --------------------------------------------------------------------------- trace files
def _int_field(obj: dict[str, Any], key: str, lo: int) -> int:
    v = obj.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise InvalidArgumentError(f"{key!r} must be an integer >= {lo}, got {v!r}")
    return v


def _retention_fields(obj: dict[str, Any], *session_keys: str) -> tuple[int, str | None]:
    """The optional ``priority`` (an int, default 0) and session id (the first of
    ``session_keys`` present: a non-empty string or an int, kept as a string)."""
    prio = obj.get("priority", 0)
    if prio is None:
        prio = 0
    if not isinstance(prio, int) or isinstance(prio, bool):
        raise InvalidArgumentError(f"'priority' must be an integer, got {prio!r}")
    for key in session_keys:
        sid = obj.get(key)
        if sid is None:
            continue
        if isinstance(sid, bool) or not isinstance(sid, (str, int)) or sid == "":
            raise InvalidArgumentError(
                f"{key!r} must be a non-empty string, an integer or null, got {sid!r}"
            )
        return prio, str(sid)
    return prio, None


def _kvtrace_request(obj: dict[str, Any]) -> TraceRequest:
    rid = obj.get("request_id")
    if not isinstance(rid, str) or not rid:
        raise InvalidArgumentError(f"'request_id' must be a non-empty string, got {rid!r}")
    after = obj.get("after")
    if after is not None and not isinstance(after, str):
        raise InvalidArgumentError(f"'after' must be a request id or null, got {after!r}")
    token_ids: tuple[int, ...] | None = None
    segments: list[tuple[int, int]] = []
    if obj.get("prompt_token_ids") is not None:
        ids = obj["prompt_token_ids"]
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids
        ):
            raise InvalidArgumentError("'prompt_token_ids' must be a list of non-negative integers")
        token_ids = tuple(ids)
    else:
        prompt = obj.get("prompt")
        if not isinstance(prompt, list):
            raise InvalidArgumentError("needs 'prompt' segments or 'prompt_token_ids'")
        for seg in prompt:
            if (
                not isinstance(seg, list)
                or len(seg) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in seg)
                or seg[0] < 0
                or seg[1] < 0
            ):
                raise InvalidArgumentError(
                    f"prompt segment must be [seed, n] of non-negative ints: {seg!r}"
                )
            segments.append((seg[0], seg[1]))
    salt = obj.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise InvalidArgumentError(f"'cache_salt' must be a non-empty string or null, got {salt!r}")
    # "session": what trace.py writes (the session's number, null outside agentic)
    prio, session = _retention_fields(obj, "session_id", "session")
    req = TraceRequest(
        rid,
        _int_field(obj, "arrival_step", 0),
        tuple(segments),
        _int_field(obj, "out_seed", 0),
        _int_field(obj, "max_output_tokens", 1),
        after,
        token_ids,
        salt,
        priority=prio,
        session_id=session,
    )
    if req.prompt_len < 1:
        raise InvalidArgumentError("empty prompt")
    return req


def _mooncake_request(obj: dict[str, Any], index: int, block: int, step_ms: float) -> TraceRequest:
    ts = obj.get("timestamp")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or ts < 0:
        raise InvalidArgumentError(f"'timestamp' must be a non-negative number (ms), got {ts!r}")
    n_in = _int_field(obj, "input_length", 1)
    n_out = _int_field(obj, "output_length", 1)
    hash_ids = obj.get("hash_ids")
    if not isinstance(hash_ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) for h in hash_ids
    ):
        raise InvalidArgumentError("'hash_ids' must be a list of integers")
    need = -(-n_in // block)
    if len(hash_ids) != need:
        raise InvalidArgumentError(
            f"input_length {n_in} needs {need} hash ids of {block} tokens, got {len(hash_ids)}"
        )
    segs = [(splitmix64((h ^ _MOONCAKE_SALT) & MASK64), block) for h in hash_ids]
    last_seed, _ = segs[-1]
    segs[-1] = (last_seed, n_in - (need - 1) * block)
    out_seed = splitmix64(index ^ _MOONCAKE_SALT)
    tenant = obj.get("tenant")
    if tenant is not None and (not isinstance(tenant, str) or not tenant):
        raise InvalidArgumentError(f"'tenant' must be a non-empty string or null, got {tenant!r}")
    prio, session = _retention_fields(obj, "session_id")
    return TraceRequest(
        f"mc-{index:06d}", int(ts // step_ms), tuple(segs), out_seed, n_out,
        cache_salt=tenant, arrival_s=ts / 1000, priority=prio, session_id=session,
    )  # fmt: skip


def read_trace(path: str, *, mooncake_block: int = 512, step_ms: float = 50.0) -> Trace:
    """Read a kvtrace-v1 or Mooncake trace (the format is detected from the first line).

    Args:
        path: JSON-lines file.
        mooncake_block: Tokens per Mooncake hash id.
        step_ms: Milliseconds per scheduler step when mapping Mooncake timestamps.

    Returns:
        The trace.

    Raises:
        TraceError: Unreadable file or a malformed line (the message names file and line).
    """
    if mooncake_block < 1 or step_ms <= 0:
        raise InvalidArgumentError("mooncake_block and step_ms must be positive")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: cannot read trace: {e}") from None
    fmt: str | None = None
    header: dict[str, Any] = {}
    reqs: list[TraceRequest] = []
    ids: set[str] = set()
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise InvalidArgumentError("not a JSON object")
            if fmt is None:
                if "format" in obj:
                    if obj["format"] != "kvtrace-v1":
                        raise InvalidArgumentError(f"unsupported trace format {obj['format']!r}")
                    fmt, header = "kvtrace-v1", obj
                    continue
                if "hash_ids" in obj or "input_length" in obj:
                    fmt = "mooncake"
                else:
                    raise InvalidArgumentError("neither a kvtrace-v1 header nor a Mooncake record")
            if fmt == "mooncake":
                req = _mooncake_request(obj, len(reqs), mooncake_block, step_ms)
            else:
                req = _kvtrace_request(obj)
                if req.after is not None and req.after not in ids:
                    raise InvalidArgumentError(
                        f"'after' names {req.after!r}, not an earlier request"
                    )
            if req.request_id in ids:
                raise InvalidArgumentError(f"duplicate request_id {req.request_id!r}")
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            raise TraceError(f"{path}:{lineno}: {e}") from None
        ids.add(req.request_id)
        reqs.append(req)
    if not reqs:
        raise TraceError(f"{path}: no requests")
    vocab = header.get("vocab_size", VOCAB_SIZE)
    if not isinstance(vocab, int) or vocab < 2:
        raise TraceError(f"{path}:1: 'vocab_size' must be an integer >= 2")
    if fmt == "kvtrace-v1":
        kind = str(header.get("kind", "kvtrace"))
        seed = header.get("seed") if isinstance(header.get("seed"), int) else None
        params: dict[str, Any] = dict(header.get("params") or {})
    else:
        kind, seed, params = "mooncake", None, {"block": mooncake_block, "step_ms": step_ms}
    return Trace(reqs, kind, seed, vocab, path, params)
