"""Differential test: `kvblocks.OffloadManager` against vLLM 0.33's
`CPUOffloadingManager`, with `lru` and with `arc`, driven through the same seeded random
sequence of operations: requests with positioned and unpositioned keys over shared
prefixes in two KV cache groups, lookups, stores that succeed, fail or stay in flight,
loads, touches, finished requests and cache resets, with and without a store threshold.
After every step both must agree on the result (lookup, chunk slots, keys to store,
evicted keys), the events, and the free and evictable chunk counts; every 50 steps on
the lookup of every key.

Needs vLLM 0.33 (skipped otherwise): run it with `make test-vllm VLLM=0.33 ...
VLLM_TESTS=offload/`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import kvblocks as kb
import pytest

pytest.importorskip("vllm")
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

if not hasattr(CachePolicy, "on_request_access"):  # vLLM 0.32's CachePolicy
    pytest.skip("the host tier's interface is vLLM 0.33's", allow_module_level=True)

from kvblocks.vllm import _offload
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

pytestmark = pytest.mark.vllm

#: Operations per run; each policy runs `len(_CONFIGS)` of them.
STEPS = 4_000
_CONFIGS = [  # (seed, num_chunks, store_threshold, max_tracker_size)
    (1, 24, 0, 64_000),
    (2, 40, 0, 64_000),
    (3, 16, 0, 64_000),
    (4, 24, 2, 40),
    (5, 32, 2, 64_000),
    (6, 12, 3, 30),
]
_LOOKUP = {
    LookupResult.MISS: "miss",
    LookupResult.HIT: "hit",
    LookupResult.HIT_PENDING: "hit_pending",
}


@dataclass
class _Req:
    req_id: str
    ctx: ReqContext
    keys: list[bytes]


@dataclass
class _Run:
    rng: random.Random
    theirs: CPUOffloadingManager
    ours: kb.OffloadManager
    docs: list[list[bytes]]
    universe: list[bytes]
    active: list[_Req] = field(default_factory=list)
    stores: list[list[bytes]] = field(default_factory=list)
    loads: list[list[bytes]] = field(default_factory=list)
    next_req: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    def count(self, op: str) -> None:
        self.counts[op] = self.counts.get(op, 0) + 1


def _docs(rng: random.Random) -> list[list[bytes]]:
    """Block-hash chains: later documents share prefixes with earlier ones."""
    docs: list[list[bytes]] = []
    for _ in range(12):
        shared = rng.choice(docs)[: rng.randint(0, 6)] if docs and rng.random() < 0.6 else []
        own = [rng.randbytes(8) for _ in range(rng.randint(3, 12))]
        docs.append(shared + own)
    return docs


def _new_request(run: _Run) -> None:
    rng = run.rng
    doc = rng.choice(run.docs)
    n = rng.randint(1, len(doc))
    groups = [0] if rng.random() < 0.5 else [0, 1]
    keys = [make_offload_key(h, g) for g in groups for h in doc[:n]]
    req_id = f"r{run.next_req}"
    run.next_req += 1
    ctx = ReqContext(req_id=req_id)
    run.theirs.on_new_request(ctx)
    run.ours.on_new_request(req_id)
    positioned = rng.random() < 0.85
    pos_keys, positions = [], []
    for key in keys:
        if positioned or rng.random() < 0.5:
            position = 16 * (doc.index(key[:-4]) + 1)
            ctx.set_offload_key_position(key, position)
            pos_keys.append(key)
            positions.append(position)
    run.ours.set_positions(req_id, pos_keys, positions)
    run.active.append(_Req(req_id, ctx, keys))


def _slice(rng: random.Random, keys: list[bytes]) -> list[bytes]:
    i = rng.randrange(len(keys))
    return keys[i : i + rng.randint(1, 8)]


def _store(run: _Run, req: _Req) -> Any:
    keys = _slice(run.rng, req.keys)
    out = run.theirs.prepare_store(keys, req.ctx)
    mine = run.ours.prepare_store(keys, req.req_id)
    if out is None:
        assert mine is None
        return None
    assert mine is not None
    expected = (
        list(out.keys_to_store),
        [int(i) for i in out.store_spec.block_ids],
        list(out.evicted_keys),
    )
    assert mine == expected
    if out.keys_to_store:
        run.stores.append(list(out.keys_to_store))
    return expected


def _complete_store(run: _Run) -> None:
    rng = run.rng
    keys = run.stores.pop(rng.randrange(len(run.stores)))
    if rng.random() < 0.2 and len(keys) > 1:  # a part now, the rest later
        cut = rng.randrange(1, len(keys))
        run.stores.append(keys[cut:])
        keys = keys[:cut]
    success = rng.random() < 0.85
    run.theirs.complete_store(keys, ReqContext(req_id="any"), success=success)
    run.ours.complete_store(keys, success)


def _load(run: _Run, req: _Req) -> None:
    keys = [
        k for k in _slice(run.rng, req.keys) if run.theirs.lookup(k, req.ctx) == LookupResult.HIT
    ]
    if not keys:
        return
    spec = run.theirs.prepare_load(keys, req.ctx)
    assert run.ours.prepare_load(keys, req.req_id) == [int(i) for i in spec.block_ids]
    run.loads.append(keys)


def _step(run: _Run) -> str:
    rng = run.rng
    r = rng.random()
    if not run.active or (len(run.active) < 5 and r < 0.08):
        _new_request(run)
        return "new_request"
    req = rng.choice(run.active)
    if r < 0.30:
        key = rng.choice(req.keys)
        assert run.ours.lookup(key) == _LOOKUP[run.theirs.lookup(key, req.ctx)]
        return "lookup"
    if r < 0.55:
        return "store" if _store(run, req) is not None else "store_refused"
    if r < 0.70 and run.stores:
        _complete_store(run)
        return "complete_store"
    if r < 0.80:
        _load(run, req)
        return "load"
    if r < 0.87 and run.loads:
        keys = run.loads.pop(rng.randrange(len(run.loads)))
        run.theirs.complete_load(keys, req.ctx)
        run.ours.complete_load(keys)
        return "complete_load"
    if r < 0.93:
        keys = _slice(rng, req.keys)
        run.theirs.touch(keys, req.ctx)
        run.ours.touch(keys)
        return "touch"
    if r < 0.997:
        run.active.remove(req)
        run.theirs.on_request_finished(req.ctx)
        run.ours.on_request_finished(req.req_id)
        return "finish"
    # vLLM never completes a transfer started before a reset.
    run.theirs.reset_cache()
    run.ours.reset_cache()
    run.stores.clear()
    run.loads.clear()
    return "reset"


def _events(manager: CPUOffloadingManager) -> list[tuple[list[bytes], bool, bool]]:
    return [(list(e.keys), e.removed, e.metadata_only) for e in manager.take_events()]


class _VllmManager:
    """vLLM's CPUOffloadingManager under a policy name, with OffloadManager's API: the
    differential run of kvblocks' policy classes inside vLLM's own manager."""

    def __init__(self, num_chunks: int, policy: str, **kwargs: Any) -> None:
        self.m = CPUOffloadingManager(num_chunks, cache_policy=policy, **kwargs)
        self.ctx: dict[str, ReqContext] = {}

    def on_new_request(self, req_id: str) -> None:
        self.ctx[req_id] = ReqContext(req_id=req_id)
        self.m.on_new_request(self.ctx[req_id])

    def set_positions(self, req_id: str, keys: list[bytes], positions: list[int]) -> None:
        for key, position in zip(keys, positions, strict=True):
            self.ctx[req_id].set_offload_key_position(key, position)

    def lookup(self, key: bytes) -> str:
        return _LOOKUP[self.m.lookup(key, ReqContext(req_id="probe"))]

    def prepare_store(self, keys: list[bytes], req_id: str) -> Any:
        out = self.m.prepare_store(keys, self.ctx[req_id])
        if out is None:
            return None
        ids = [int(i) for i in out.store_spec.block_ids]
        return (list(out.keys_to_store), ids, list(out.evicted_keys))

    def complete_store(self, keys: list[bytes], success: bool) -> None:
        self.m.complete_store(keys, ReqContext(req_id="any"), success=success)

    def prepare_load(self, keys: list[bytes], req_id: str) -> list[int]:
        return [int(i) for i in self.m.prepare_load(keys, self.ctx[req_id]).block_ids]

    def complete_load(self, keys: list[bytes]) -> None:
        self.m.complete_load(keys, ReqContext(req_id="any"))

    def touch(self, keys: list[bytes]) -> None:
        self.m.touch(keys, ReqContext(req_id="any"))

    def on_request_finished(self, req_id: str) -> None:
        self.m.on_request_finished(self.ctx.pop(req_id))

    def reset_cache(self) -> None:
        self.m.reset_cache()

    def take_events(self) -> list[tuple[list[bytes], bool, bool]]:
        return _events(self.m)

    @property
    def num_free(self) -> int:
        return int(self.m._get_num_free_chunks())

    @property
    def num_evictable(self) -> int:
        return int(self.m._num_evictable_cache_chunks)


def _ours(policy: str, in_vllm: bool, num_chunks: int, **kwargs: Any) -> Any:
    """kvblocks.OffloadManager, or vLLM's manager with kvblocks' policy class."""
    if in_vllm:
        _offload.register()
        return _VllmManager(num_chunks, f"kvblocks-{policy}", **kwargs)
    return kb.OffloadManager(num_chunks, policy, **kwargs)


def _run(
    policy: str,
    seed: int,
    num_chunks: int,
    threshold: int,
    tracker: int,
    in_vllm: bool = False,
) -> dict[str, int]:
    rng = random.Random(seed)
    docs = _docs(rng)
    universe = [make_offload_key(h, g) for d in docs for h in d for g in (0, 1)]
    options = {"enable_events": True, "store_threshold": threshold, "max_tracker_size": tracker}
    run = _Run(
        rng=rng,
        theirs=CPUOffloadingManager(num_chunks, cache_policy=policy, **options),
        ours=_ours(policy, in_vllm, num_chunks, **options),
        docs=docs,
        universe=universe,
    )
    for step in range(STEPS):
        op = _step(run)
        run.count(op)
        where = f"{policy} seed {seed} step {step} ({op})"
        assert run.ours.take_events() == _events(run.theirs), where
        assert run.ours.num_free == run.theirs._get_num_free_chunks(), where
        assert run.ours.num_evictable == run.theirs._num_evictable_cache_chunks, where
        if step % 50 == 0:
            ctx = ReqContext(req_id="probe")
            theirs = [_LOOKUP[run.theirs.lookup(k, ctx)] for k in universe]
            assert [run.ours.lookup(k) for k in universe] == theirs, where
    return run.counts


@pytest.mark.parametrize("in_vllm", [False, True], ids=["OffloadManager", "in-vllm-manager"])
@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_same_decisions_as_vllm(policy: str, in_vllm: bool) -> None:
    """0 divergences over len(_CONFIGS) * STEPS operations for each policy, for
    `kvblocks.OffloadManager` and for vLLM's own manager with `kvblocks-lru` /
    `kvblocks-arc`; every kind of operation happens, stores are refused, and stores
    fail."""
    totals: dict[str, int] = {}
    for config in _CONFIGS:
        for op, n in _run(policy, *config, in_vllm=in_vllm).items():
            totals[op] = totals.get(op, 0) + n
    assert sum(totals.values()) >= 20_000
    for op in (
        "new_request",
        "lookup",
        "store",
        "store_refused",
        "complete_store",
        "load",
        "complete_load",
        "touch",
        "finish",
        "reset",
    ):
        assert totals.get(op, 0) > 0, (op, totals)


def test_the_plugin_registers_the_policies() -> None:
    """The three names resolve to kvblocks' classes; `kvblocks:SPEC` loads out of tree
    with its spec; a bad spec fails where vLLM loads it."""
    _offload.register()
    _offload.register()  # idempotent
    for name, cls in _offload.POLICIES.items():
        assert CachePolicyFactory.get_cache_policy_cls(name) is getattr(_offload, cls)
    spec_cls = CachePolicyFactory.get_cache_policy_cls(
        "kvblocks:quota=t:1", "kvblocks.vllm._offload"
    )
    assert issubclass(spec_cls, _offload.KVBlocksRetentionPolicy)
    assert spec_cls.spec == "quota=t:1"
    with pytest.raises(ValueError):
        CachePolicyFactory.get_cache_policy_cls("kvblocks:quota=", "kvblocks.vllm._offload")


def test_the_kvblocks_policy_reads_its_spec_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`kvblocks` without KVBLOCKS_VLLM_RETENTION builds (the empty retention order); a
    bad spec there fails where vLLM builds the tier."""
    _offload.register()
    monkeypatch.delenv("KVBLOCKS_VLLM_RETENTION", raising=False)
    assert CPUOffloadingManager(4, cache_policy="kvblocks").prepare_store([], _ctx()) is not None
    monkeypatch.setenv("KVBLOCKS_VLLM_RETENTION", "classes=")
    with pytest.raises(ValueError):
        CPUOffloadingManager(4, cache_policy="kvblocks")


def _ctx() -> ReqContext:
    return ReqContext(req_id="r")


def _tenant_params(tenant: str) -> ReqContext:
    return ReqContext(req_id=tenant, kv_transfer_params={"kvblocks_tenant": tenant})


def test_a_quota_from_the_spec_holds_in_vllms_manager() -> None:
    """`kvblocks:quota=burst:2` in vLLM's manager: a burst tenant (named in its
    kv_transfer_params) evicts its own chunks, not the steady tenant's."""
    m = CPUOffloadingManager(
        8, cache_policy="kvblocks:quota=burst:2", cache_policy_module_path=_offload.__name__
    )
    steady = [make_offload_key(bytes([1, i]), 0) for i in range(4)]
    ctx = _tenant_params("steady")
    m.prepare_store(steady, ctx)
    m.complete_store(steady, ctx)
    burst_ctx = _tenant_params("burst")
    for i in range(20):
        keys = [make_offload_key(bytes([2, i, j]), 0) for j in range(2)]
        out = m.prepare_store(keys, burst_ctx)
        assert out is not None
        m.complete_store(keys, burst_ctx)
    assert all(m.lookup(k, ctx) is LookupResult.HIT for k in steady)
