"""Retention through `kvblocks.vllm` (docs/retention.md): vLLM's own `Request` objects carry
`priority`, `session_id` and `cache_salt`, and `install(retention=...)` gives vLLM's
scheduler a manager under the policy whose clock each scheduler step advances.

Runs where vLLM is importable (a vLLM venv, `make test-vllm`); skipped elsewhere.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

import kvblocks as kb  # noqa: E402
import kvblocks.vllm as kv  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request  # noqa: E402

BS = 16


def config(num_blocks: int = 40, hybrid: bool = False) -> Any:
    full = FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=8, dtype=torch.float16)
    groups = [KVCacheGroupSpec(["f"], full)]
    if hybrid:
        swa = SlidingWindowSpec(
            block_size=BS, num_kv_heads=2, head_size=8, dtype=torch.float16, sliding_window=32
        )
        groups.append(KVCacheGroupSpec(["s"], swa))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def manager(policy: kb.RetentionPolicy | None, **kw: Any) -> Any:
    init_none_hash(sha256)
    return kv.KVCacheManager(
        config(**kw),
        max_model_len=4096,
        scheduler_block_size=BS,
        hash_block_size=BS,
        retention=policy,
    )


def request(rid: str, first: int, blocks: int = 2, **kw: Any) -> Any:
    tokens = list(range(first, first + blocks * BS))
    return Request(
        rid,
        tokens,
        SamplingParams(max_tokens=4),
        None,
        arrival_time=0.0,
        block_hasher=get_request_block_hasher(BS, sha256),
        **kw,
    )


def run(mgr: Any, req: Any) -> list[int]:
    """Allocates the whole prompt, caches it, frees it; returns its block ids."""
    new = mgr.allocate_slots(req, req.num_tokens)
    assert new is not None
    req.num_computed_tokens = req.num_tokens
    ids: list[int] = new.get_block_ids()[0]
    mgr.free(req)
    return ids


def free_order(mgr: Any) -> list[int]:
    return [b.block_id for b in mgr.block_pool.free_block_queue.get_all_free_blocks()]


def test_session_and_priority_blocks_are_evicted_last() -> None:
    policy = kb.RetentionPolicy(classes=2, priority_classes={-1: 1}, session_s=60.0)
    mgr = manager(policy)
    session = run(mgr, request("a", 0, session_id="chat-1"))
    urgent = run(mgr, request("b", 1000, priority=-1))
    plain = run(mgr, request("c", 2000))
    order = free_order(mgr)
    # Class 0 (plain) first, then class 1 (urgent), then the session's blocks, each list
    # in vLLM's LRU order (a request's blocks freed tail first).
    assert order[-6:] == plain[::-1] + urgent[::-1] + session[::-1]
    mgr.block_pool.core.check_invariants()


def test_without_a_policy_the_order_is_vllms() -> None:
    mgr = manager(None)
    a = run(mgr, request("a", 0, session_id="chat-1"))
    b = run(mgr, request("b", 1000, priority=-1))
    assert free_order(mgr)[-4:] == a[::-1] + b[::-1]


def test_the_session_window_ends_with_the_clock() -> None:
    mgr = manager(kb.RetentionPolicy(session_s=5.0))
    session = run(mgr, request("a", 0, session_id="chat-1"))
    plain = run(mgr, request("b", 1000))
    assert free_order(mgr)[-4:] == plain[::-1] + session[::-1]
    mgr.advance_time(5.0)
    # The window ended: the session's blocks rejoin the LRU list, after the newer ones.
    assert free_order(mgr)[-4:] == plain[::-1] + session[::-1]
    mgr.advance_time(4.0 + 1.0)
    with pytest.raises(ValueError):
        mgr.advance_time(1.0)


def test_cache_salt_is_the_tenant_and_its_quota_holds() -> None:
    mgr = manager(kb.RetentionPolicy(tenant_quotas={"t1": 1}))
    run(mgr, request("a", 0, blocks=3, cache_salt="t1"))
    assert mgr.block_pool.core.get_tenant_cached_blocks() == {"t1": 1}
    _, num = mgr.get_computed_blocks(request("a2", 0, blocks=4, cache_salt="t1"))[:2]
    # Freed tail first, the prefix's last blocks are its least recently used: the quota
    # evicts them and keeps the first.
    assert num == BS
    run(mgr, request("c", 5000, blocks=3))  # no tenant: no quota
    assert mgr.block_pool.core.get_tenant_cached_blocks() == {"t1": 1}


def test_pin_a_vllm_request_across_groups() -> None:
    mgr = manager(None, num_blocks=12, hybrid=True)
    system = request("sys", 0, blocks=3)
    run(mgr, system)
    mgr.pin(system)
    pinned = mgr.block_pool.core.num_pinned_blocks
    assert pinned == 6  # three full prompt blocks in each of the two groups
    # Pressure: a long request takes every other block.
    big = request("big", 9000, blocks=(12 - 1 - pinned) // 2)
    assert mgr.allocate_slots(big, big.num_tokens) is not None
    mgr.free(big)
    _, hit = mgr.get_computed_blocks(request("sys2", 0, blocks=4))[:2]
    assert hit == 3 * BS
    mgr.unpin(system)
    assert mgr.block_pool.core.num_pinned_blocks == 0
    with pytest.raises(KeyError):
        mgr.unpin(system)


def test_install_passes_the_policy_and_steps_advance_the_clock() -> None:
    from vllm.v1.core.sched import scheduler as sched

    policy = kb.RetentionPolicy(session_s=30.0)
    kv.install(fallback=False, retention=policy)
    try:
        init_none_hash(sha256)
        mgr = sched.KVCacheManager(
            config(), max_model_len=4096, scheduler_block_size=BS, hash_block_size=BS
        )
        assert isinstance(mgr, kv.KVCacheManager) and mgr.retention == policy
        before = mgr.now
        mgr.new_step_starts()
        assert mgr.now >= before
    finally:
        kv.uninstall()
        kv.install(fallback=False)
        kv.uninstall()
