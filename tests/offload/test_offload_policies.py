"""kvblocks' retention on the host tier (`kvblocks.OffloadManager` with a
`RetentionPolicy`; docs/offload.md), without vLLM: a tenant quota holds under a burst, a
pinned prefix survives a flood, a higher class outlives a flood of a lower one, the
order without rules is vLLM's LRU, and bad input is refused with kvblocks' errors.
"""

from __future__ import annotations

import random

import kvblocks as kb
import pytest


def _key(tag: str, i: int, group: int = 0) -> bytes:
    return f"{tag}{i:06d}".encode() + group.to_bytes(4, "big")


def _store(m: kb.OffloadManager, req: str, keys: list[bytes]) -> list[bytes]:
    """Stores keys and completes the store; returns the evicted keys."""
    out = m.prepare_store(keys, req)
    assert out is not None
    m.complete_store(out[0])
    return out[2]


def _resident(m: kb.OffloadManager, keys: list[bytes]) -> int:
    return sum(m.lookup(k) == "hit" for k in keys)


def _burst(policy: str | kb.RetentionPolicy) -> tuple[int, list[int]]:
    """A steady tenant fills 24 of 32 chunks, then a burst tenant stores 200 chunks in
    batches of 4. Returns the steady tenant's chunks left and the burst tenant's
    resident chunks after each batch."""
    m = kb.OffloadManager(32, policy)
    m.set_hints("steady", tenant="steady")
    steady = [_key("s", i) for i in range(24)]
    _store(m, "steady", steady)
    m.on_request_finished("steady")
    m.set_hints("burst", tenant="burst")
    burst = [_key("b", i) for i in range(200)]
    resident = []
    for i in range(0, 200, 4):
        _store(m, "burst", burst[i : i + 4])
        resident.append(_resident(m, burst))
    return _resident(m, steady), resident


def test_tenant_quota_holds_in_host_memory_under_a_burst() -> None:
    """With a quota of 4 the burst tenant never holds more than its quota plus the batch
    being stored, and the steady tenant keeps every chunk; under vLLM's LRU the burst
    flushes it."""
    kept, resident = _burst(kb.RetentionPolicy(tenant_quotas={"burst": 4}))
    assert kept == 24
    assert max(resident) <= 4 + 4
    assert resident[-1] == 8
    kept_lru, resident_lru = _burst("lru")
    assert kept_lru == 0
    assert resident_lru[-1] == 32


def _flood(m: kb.OffloadManager, prefix: list[bytes]) -> None:
    _store(m, "prefix", prefix)
    m.on_request_finished("prefix")
    for i in range(0, 500, 5):
        req = f"flood{i}"
        _store(m, req, [_key("f", j) for j in range(i, i + 5)])
        m.on_request_finished(req)


def test_a_pinned_prefix_survives_a_flood() -> None:
    """Pinned before it is stored, a prefix stays through 500 stores into 16 chunks; the
    same flood evicts it unpinned, and after unpin."""
    prefix = [_key("p", i) for i in range(4)]
    m = kb.OffloadManager(16, kb.RetentionPolicy())
    for k in prefix:
        m.pin(k)
    _flood(m, prefix)
    assert [m.lookup(k) for k in prefix] == ["hit"] * 4
    for k in prefix:
        m.unpin(k)
    _flood(m, [])
    assert [m.lookup(k) for k in prefix] == ["miss"] * 4
    unpinned = kb.OffloadManager(16, kb.RetentionPolicy())
    _flood(unpinned, prefix)
    assert [unpinned.lookup(k) for k in prefix] == ["miss"] * 4


def test_pins_count() -> None:
    m = kb.OffloadManager(8, kb.RetentionPolicy())
    k = _key("p", 0)
    m.pin(k)
    m.pin(k)
    m.unpin(k)
    _flood(m, [k])
    assert m.lookup(k) == "hit"
    m.unpin(k)
    with pytest.raises(kb.NotPinnedError):
        m.unpin(k)


def test_a_higher_class_outlives_a_flood_of_a_lower_one() -> None:
    m = kb.OffloadManager(16, kb.RetentionPolicy(classes=2, priority_classes={-1: 1}))
    m.set_hints("vip", priority=-1)
    vip = [_key("v", i) for i in range(6)]
    _store(m, "vip", vip)
    m.on_request_finished("vip")
    _flood(m, [])
    assert _resident(m, vip) == 6


def _random_run(policy: str | kb.RetentionPolicy, seed: int) -> list[object]:
    """Every decision of a random run: lookups, stores, loads, touches, finishes."""
    rng = random.Random(seed)
    m = kb.OffloadManager(20, policy, enable_events=True)
    keys = [_key("k", i, g) for i in range(60) for g in (0, 1)]
    trace: list[object] = []
    loads: list[list[bytes]] = []
    for step in range(3000):
        req = f"r{step // 40}"
        r = rng.random()
        if step % 40 == 0 and step:
            m.on_request_finished(f"r{step // 40 - 1}")
        if r < 0.4:
            start = rng.randrange(len(keys))
            batch = keys[start : start + rng.randint(1, 6)]
            m.set_positions(req, batch, [16 * (i + 1) for i in range(len(batch))])
            out = m.prepare_store(batch, req)
            trace.append(out)
            if out is not None:
                m.complete_store(out[0], rng.random() < 0.9)
        elif r < 0.6:
            ready = [k for k in rng.sample(keys, 4) if m.lookup(k) == "hit"]
            if ready:
                trace.append(m.prepare_load(ready, req))
                loads.append(ready)
        elif r < 0.75 and loads:
            m.complete_load(loads.pop(rng.randrange(len(loads))))
        else:
            m.touch(rng.sample(keys, 3))
        trace.append(m.take_events())
        trace.append([m.lookup(k) for k in keys])
    return trace


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_without_rules_the_retention_order_is_vllms_lru(seed: int) -> None:
    assert _random_run(kb.RetentionPolicy(), seed) == _random_run("lru", seed)


def test_bad_input() -> None:
    m = kb.OffloadManager(4, "lru")
    with pytest.raises(kb.InvalidArgumentError, match="bytes"):
        m.lookup("not bytes")  # type: ignore[arg-type]
    with pytest.raises(kb.InvalidArgumentError, match="4-byte group"):
        m.prepare_store([b"ab"], "r")
    with pytest.raises(kb.InvalidArgumentError, match="twice"):
        m.prepare_store([_key("a", 0), _key("a", 0)], "r")
    with pytest.raises(kb.InvalidArgumentError, match="not in the host tier"):
        m.prepare_load([_key("a", 0)], "r")
    out = m.prepare_store([_key("a", 0)], "r")
    assert out is not None
    with pytest.raises(kb.InvalidArgumentError, match="not ready"):
        m.prepare_load([_key("a", 0)], "r")
    m.complete_store([_key("a", 0)])
    with pytest.raises(kb.InvalidArgumentError, match="no load in flight"):
        m.complete_load([_key("a", 0)])
    assert m.num_evictable == 1
    with pytest.raises(kb.InvalidArgumentError, match="policy must be"):
        kb.OffloadManager(4, "fifo")
    with pytest.raises(kb.InvalidArgumentError, match="no clock"):
        kb.OffloadManager(4, kb.RetentionPolicy(ttl_s=5.0))
    with pytest.raises(kb.UnsupportedError, match="pins"):
        m.pin(_key("a", 0))
    with pytest.raises(kb.InvalidArgumentError, match="positions"):
        m.set_positions("r", [_key("a", 0)], [1, 2])
