"""Issue 16's acceptance: retention policies (pins, priority classes, TTL, sessions, tenant
quotas) against the plain-Python model of docs/retention.md (tests/support/model_retention.py).

* `TestPoolRetention`: a `kvblocks.BlockPool` with a hypothesis-drawn `RetentionPolicy` (or
  `retention=None`) and the model side by side, driven as the managers drive a pool, with
  pins, the clock, evictions and resets interleaved. After every step the free order, ref
  counts, hashes, usage, events and pin count must be the model's, and the issue's
  properties are checked on kvblocks' own state: a pinned cached block is never evicted;
  a pool takes the lowest class first, LRU within a class, and no block within its TTL
  while an expired one waits; no tenant keeps more unheld cached blocks than its quota;
  with no policy and no pin the pool is vLLM's (`model.PoolModel`) exactly.
* `TestManagerRetention`: a hybrid `KVCacheManager` (full attention and sliding windows)
  with requests that carry a priority, a session and a tenant (cache salt or LoRA), pinned
  and unpinned whole, against `RetentionManagerModel`, with the same properties across
  groups.
  Prefixes are also pinned by hash (`pin_hashes`).
* `test_model_without_policy_is_vllm`: the model itself, with no policy, is `PoolModel`.
* Bad input: unknown unpins, a clock that goes back, invalid policies, a class out of
  range; each raises a `KVBlocksError` and changes nothing.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import hypothesis.strategies as st
import kvblocks as kb
import manager_driver as md
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from model import NULL_BLOCK, GroupModel, Key, PoolModel, event_tuple, pool_state
from model_retention import PolicyModel, RetentionManagerModel, RetentionPoolModel, Tags
from pool_driver import HBS, PREFIXES, PoolDriving

TENANTS = ("a", "b", "c")
STEPS = [0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 25.0]  # clock steps: exact binary fractions


@st.composite
def policies(draw: st.DrawFn) -> PolicyModel:
    """A policy over 1 to 3 classes; times and quotas small enough to matter in a run."""
    k = draw(st.integers(1, 3))
    ttl_value = st.sampled_from([None, 1.0, 2.5, 5.0, 20.0])
    ttl: float | list[float | None] | None = draw(
        st.one_of(ttl_value, st.lists(ttl_value, min_size=k, max_size=k))
    )
    return PolicyModel(
        classes=k,
        default_class=draw(st.integers(0, k - 1)),
        priority_classes=draw(
            st.dictionaries(st.integers(-1, 2), st.integers(0, k - 1), max_size=3)
        ),
        ttl_s=ttl,
        session_s=draw(st.sampled_from([None, 1.0, 3.0, 10.0])),
        tenant_quotas=draw(
            st.dictionaries(st.sampled_from(TENANTS), st.integers(0, 4), max_size=2)
        ),
        default_tenant_quota=draw(st.sampled_from([None, None, 1, 3])),
    )


def make_policy(policy: PolicyModel | None) -> kb.RetentionPolicy | None:
    return None if policy is None else kb.RetentionPolicy(**policy.kwargs())


def free_kwargs(tags: Tags) -> dict[str, Any]:
    """`BlockPool.free_blocks` keywords for `tags` (left out where they are the default)."""
    out: dict[str, Any] = {}
    if tags.priority_class is not None:
        out["priority_class"] = tags.priority_class
    if tags.session:
        out["session"] = True
    if tags.tenant is not None:
        out["tenant"] = tags.tenant
    return out


@dataclass
class FreeInfo:
    """What the test itself saw when a block's last reference dropped."""

    at: float
    tags: Tags
    seq: int


def eviction_rank(
    policy: PolicyModel | None, info: FreeInfo | None, cached: bool, now: float
) -> tuple[float, ...]:
    """How early a free block must be evicted, from the rules alone: uncached blocks first,
    then expired ones, then class 0, ..., class k-1 (LRU inside: by idle time, then the
    order of the frees), then blocks in their session window (in the order they were
    freed). With no policy: cached blocks in the order they were freed (vLLM's LRU)."""
    if not cached:
        return (0.0,)
    assert info is not None, "a cached block became free unseen"
    if policy is None:
        return (1.0, 0.0, float(info.seq))
    cls = policy.default_class if info.tags.priority_class is None else info.tags.priority_class
    idle = info.at
    if info.tags.session and policy.session_s is not None:
        idle = info.at + policy.session_s
        if idle > now:
            return (2.0 + policy.classes, info.at, float(info.seq))
    ttl = policy.ttl(cls)
    if ttl is not None and idle + ttl <= now:
        return (0.5,)
    return (1.0 + cls, idle, float(info.seq))


def assert_tenant_counts(pool: kb.BlockPool, model: RetentionPoolModel) -> None:
    """`get_tenant_cached_blocks()`: each tenant with a quota and its unheld cached blocks."""
    got = pool.get_tenant_cached_blocks()
    policy = model.policy
    for tenant in {*TENANTS, "lora1", *got}:
        want = len(model.unheld_cached(tenant))
        if policy is None or policy.quota(tenant) is None:
            assert tenant not in got
        else:
            assert got.get(tenant, 0) == want, (tenant, got, want)


# --- the pool ----------------------------------------------------------------------------


@dataclass
class Live:
    req: kb.Request | None  # None: raw blocks, never cached
    tags: Tags
    tables: list[list[int]] = field(default_factory=lambda: [[], []])
    num_cached: list[int] = field(default_factory=lambda: [0, 0])


class PoolRetentionMachine(PoolDriving, RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.live: dict[str, Live] = {}
        self.next_id = 0
        self.pool: kb.BlockPool
        self.model: RetentionPoolModel
        self.vllm: PoolModel | None = None  # vLLM's pool, while no policy and no pin
        self.policy: PolicyModel | None = None
        self.known: list[bytes] = []  # block hashes seen, to pin
        self.pins: Counter[Key] = Counter()
        self.watch: dict[int, Key] = {}  # cached blocks seen under a pinned key
        self.info: dict[int, FreeInfo] = {}
        self.seq = 0
        self.now = 0.0

    @initialize(
        num_blocks=st.integers(2, 16),
        caching=st.sampled_from([True, True, True, False]),
        events=st.booleans(),
        policy=st.one_of(policies(), st.none()),
    )
    def init(
        self, num_blocks: int, caching: bool, events: bool, policy: PolicyModel | None
    ) -> None:
        self.policy = policy
        self.pool = kb.BlockPool(num_blocks, caching, HBS, events, retention=make_policy(policy))
        self.model = RetentionPoolModel(num_blocks, caching, events, policy)
        if policy is None:
            self.vllm = PoolModel(num_blocks, caching, events)

    # --- calling both ----------------------------------------------------------------
    def both(self, name: str, *args: Any, tags: Tags | None = None) -> Any:
        """Calls `name` on kvblocks, the model (and vLLM's model while it applies); all
        succeed with equal results, or all raise ValueError and kvblocks is unchanged."""
        model_args = args
        if name == "cache_full_blocks":
            model_args = (*args[:6], HBS, *args[6:])
        kwargs: dict[str, Any] = {}
        model_kwargs: dict[str, Any] = {}
        if name == "free_blocks":
            tags = tags or Tags()
            kwargs = free_kwargs(tags)
            model_kwargs = {"tags": tags}
        try:
            want = getattr(self.model, name)(*model_args, **model_kwargs)
        except ValueError:
            before = pool_state(self.pool)
            with pytest.raises(ValueError):
                getattr(self.pool, name)(*args, **kwargs)
            assert pool_state(self.pool) == before
            return None
        if self.vllm is not None:
            assert getattr(self.vllm, name)(*model_args) == want
        got = getattr(self.pool, name)(*args, **kwargs)
        assert got == want, (name, got, want)
        return got

    def get_new_blocks(self, n: int) -> list[int]:
        """Allocates, checking the eviction order against the rules directly."""
        free = self.pool.get_free_block_ids()
        cached = {b: self.pool.get_block_hash(b) is not None for b in free}
        new = self.both("get_new_blocks", n)
        assert isinstance(new, list)
        got = list(new)
        ranks = {b: eviction_rank(self.policy, self.info.get(b), cached[b], self.now) for b in free}
        rest = [b for b in free if b not in got]
        if self.policy is None:  # vLLM leaves a block whose hash was dropped in place
            got, rest = [b for b in got if cached[b]], [b for b in rest if cached[b]]
        for taken in got:
            for left in rest:
                mine, other = ranks[taken], ranks[left]
                assert mine[0] <= other[0], f"evicted {taken} {mine} before {left} {other}"
                if mine[0] == other[0] and mine[0] >= 1:
                    assert mine <= other, f"not LRU: {taken} {mine} before {left} {other}"
        return new

    def free(self, blocks: list[int], tags: Tags) -> None:
        before = {b: self.pool.get_ref_cnt(b) for b in blocks}
        self.both("free_blocks", blocks, tags=tags)
        for b in blocks:
            if b != NULL_BLOCK and before[b] and self.pool.get_ref_cnt(b) == 0:
                self.seq += 1
                self.info[b] = FreeInfo(self.now, tags, self.seq)

    def draw_tags(self, data: st.DataObject) -> Tags:
        k = 1 if self.policy is None else self.policy.classes
        return Tags(
            data.draw(st.none() | st.integers(0, k - 1), label="class"),
            data.draw(st.booleans(), label="session"),
            data.draw(st.sampled_from([None, None, *TENANTS]), label="tenant"),
        )

    # --- rules -----------------------------------------------------------------------
    @rule(
        data=st.data(),
        prefix=st.sampled_from(PREFIXES),
        tail=st.lists(st.integers(0, 3), min_size=1, max_size=12),
    )
    def add_request(self, data: st.DataObject, prefix: list[int], tail: list[int]) -> None:
        self.next_id += 1
        req = kb.Request(f"r{self.next_id}", prefix + tail, kb.BlockHasher(HBS))
        self.known += [h for h in req.block_hashes if h not in self.known]
        live = Live(req, self.draw_tags(data))
        if self.admit(live):
            self.live[req.request_id] = live

    @precondition(lambda self: any(live.req is not None for live in self.live.values()))
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 3), min_size=1, max_size=9))
    def decode(self, data: st.DataObject, tokens: list[int]) -> None:
        rid = data.draw(st.sampled_from(sorted(r for r, x in self.live.items() if x.req)))
        live = self.live[rid]
        assert live.req is not None
        live.req.append_output_token_ids(tokens)
        self.known += [h for h in live.req.block_hashes if h not in self.known]
        if sum(self.need(live, g) for g in (0, 1)) > self.model.num_free():
            self.finish_one(rid)  # preempted: no room to grow
            return
        self.grow(live)

    @precondition(lambda self: self.model.num_free() >= 2)
    @rule(data=st.data())
    def churn(self, data: st.DataObject) -> None:
        """A short request of fresh tokens, computed and freed at once under drawn tags:
        cached free blocks of every class, session and tenant, for the evictions to order."""
        blocks = data.draw(st.integers(1, min(4, self.model.num_free() * 2 // 3)), label="blocks")
        self.next_id += 1
        tokens = [1000 * self.next_id + i for i in range(blocks * HBS)]
        req = kb.Request(f"c{self.next_id}", tokens, kb.BlockHasher(HBS))
        self.known += req.block_hashes
        live = Live(req, self.draw_tags(data))
        self.grow(live)
        self.live[req.request_id] = live
        self.finish_one(req.request_id)

    @precondition(lambda self: self.model.num_free())
    @rule(data=st.data())
    def grab(self, data: st.DataObject) -> None:
        """Blocks taken without caching them (memory pressure: evicts cached ones)."""
        free = self.model.num_free()
        n = data.draw(st.sampled_from(sorted({1, (free + 1) // 2, free})), label="n")
        self.next_id += 1
        self.live[f"g{self.next_id}"] = Live(None, self.draw_tags(data), [self.get_new_blocks(n)])

    def finish_one(self, rid: str) -> None:
        live = self.live.pop(rid)
        for table in live.tables:
            self.free(table[::-1], live.tags)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        self.finish_one(data.draw(st.sampled_from(sorted(self.live))))

    @precondition(lambda self: self.known)
    @rule(data=st.data(), groups=st.sampled_from([[0], [1], [0, 1], [1, 0]]))
    def pin(self, data: st.DataObject, groups: list[int]) -> None:
        hashes = data.draw(
            st.lists(st.sampled_from(self.known), min_size=1, max_size=3, unique=True)
        )
        self.pool.pin(hashes, group_ids=groups)
        self.model.pin(hashes, groups)
        self.pins.update((h, g) for h in hashes for g in groups)
        self.vllm = None  # a pin changes vLLM's order (it takes blocks out of the queue)

    @precondition(lambda self: self.pins)
    @rule(data=st.data(), groups=st.sampled_from([[0], [1], [0, 1], [1, 0]]))
    def unpin(self, data: st.DataObject, groups: list[int]) -> None:
        pinned = sorted({h for h, _ in self.pins if all((h, g) in self.pins for g in groups)})
        if not pinned:
            return
        hashes = data.draw(st.lists(st.sampled_from(pinned), min_size=1, unique=True))
        before = {b: self.pool.get_ref_cnt(b) for b in range(self.pool.num_gpu_blocks)}
        self.pool.unpin(hashes, group_ids=groups)
        self.model.unpin(hashes, groups)
        self.pins.subtract((h, g) for h in hashes for g in groups)
        self.pins = +self.pins
        for b, key in list(self.watch.items()):
            if key not in self.pins:
                del self.watch[b]
        # Released blocks are freed untagged, in an order the rules leave open: one rank.
        self.seq += 1
        for b in range(1, self.pool.num_gpu_blocks):
            if before[b] and self.pool.get_ref_cnt(b) == 0:
                self.info[b] = FreeInfo(self.now, Tags(), self.seq)

    @precondition(lambda self: self.known)
    @rule(data=st.data(), group=st.sampled_from([0, 1]))
    def unpin_unknown(self, data: st.DataObject, group: int) -> None:
        """An unpin naming a key that is not pinned raises KeyError and changes nothing,
        even when the other keys of the call are pinned."""
        missing = [h for h in self.known if (h, group) not in self.pins]
        if not missing:
            return
        hashes = [data.draw(st.sampled_from(missing))]
        hashes += sorted({h for h, g in self.pins if g == group})[:2]
        before = pool_state(self.pool), self.pool.num_pinned_blocks
        with pytest.raises(KeyError) as err:
            self.pool.unpin(hashes, group_ids=[group])
        assert isinstance(err.value, kb.KVBlocksError)
        assert (pool_state(self.pool), self.pool.num_pinned_blocks) == before
        with pytest.raises(KeyError):
            self.model.unpin(hashes, [group])

    @rule(step=st.sampled_from(STEPS))
    def advance_time(self, step: float) -> None:
        self.now += step
        self.pool.advance_time(self.now)
        self.model.advance_time(self.now)
        if self.vllm is not None:
            assert pool_state(self.pool) == pool_state(self.vllm), "the clock moved a block"

    @rule(back=st.sampled_from([0.5, 1.0, 100.0]))
    def advance_time_backwards(self, back: float) -> None:
        before = pool_state(self.pool)
        with pytest.raises(ValueError):
            self.pool.advance_time(self.now - back)
        assert pool_state(self.pool) == before
        self.pool.advance_time(self.now)  # the clock still reads `now`: not going back

    @rule(ids=st.lists(st.integers(0, 26), max_size=4))
    def evict(self, ids: list[int]) -> None:
        self.both("evict_blocks", ids)
        for b in ids:
            self.watch.pop(b, None)

    @rule()
    def reset(self) -> None:
        held = any(live.tables != [[], []] for live in self.live.values())
        assert self.both("reset_prefix_cache") == (not held)
        if not held:
            self.watch.clear()

    # --- checks ----------------------------------------------------------------------
    @invariant()
    def same_state(self) -> None:
        self.pool.check_invariants()
        assert pool_state(self.pool) == pool_state(self.model)
        events = [event_tuple(e) for e in self.pool.take_events()]
        assert events == self.model.take_events()
        assert self.pool.num_pinned_blocks == self.model.num_pinned_blocks
        assert self.pool.now == self.model.now
        assert_tenant_counts(self.pool, self.model)
        if self.vllm is not None:
            assert pool_state(self.pool) == pool_state(self.vllm), "no policy: not vLLM's order"
            assert events == self.vllm.take_events()
        held = [0] * self.model.num_blocks
        for live in self.live.values():
            for table in live.tables:
                for b in table:
                    held[b] += b != NULL_BLOCK
        pinned = [int(p) for p in self.model.pinned]
        assert [h + p for h, p in zip(held, pinned, strict=True)][1:] == self.model.ref_cnt[1:]

    @invariant()
    def free_order_follows_the_rules(self) -> None:
        """The free list is the eviction order (`get_new_blocks` takes its head): ranks
        never decrease along it. With no policy only cached blocks are ordered (vLLM leaves
        a block whose hash was dropped where it is)."""
        now = self.now
        ranked = []
        for b in self.pool.get_free_block_ids():
            cached = self.pool.get_block_hash(b) is not None
            if cached or self.policy is not None:
                ranked.append((eviction_rank(self.policy, self.info.get(b), cached, now), b))
        for (first, a), (then, b) in itertools.pairwise(ranked):
            if first[0] == then[0] and first[0] < 1:
                continue  # uncached among themselves, expired among themselves: any order
            assert first <= then, f"free block {a} {first} is ahead of {b} {then}"

    @invariant()
    def pinned_blocks_stay(self) -> None:
        """A cached block under a pinned key keeps its hash and stays out of the free list,
        however much memory the other requests need."""
        free = set(self.pool.get_free_block_ids())
        for h, g in self.pins:
            got = self.pool.get_cached_block(h, [g])
            if got is not None:
                self.watch.setdefault(got[0], (h, g))
        for b, (h, _) in self.watch.items():
            assert self.pool.get_block_hash(b) == h, f"pinned block {b} was evicted"
            assert b not in free and self.pool.get_ref_cnt(b) >= 1

    @invariant()
    def tenants_within_quota(self) -> None:
        if self.policy is None:
            return
        count: Counter[str | None] = Counter()
        for b in self.pool.get_free_block_ids():
            info = self.info.get(b)
            if info is not None and self.pool.get_block_hash(b) is not None:
                count[info.tags.tenant] += 1
        for tenant in TENANTS:
            quota = self.policy.quota(tenant)
            if quota is not None:
                assert count[tenant] <= quota, f"tenant {tenant}: {count[tenant]} > {quota}"


TestPoolRetention = PoolRetentionMachine.TestCase
TestPoolRetention.settings = settings(
    max_examples=400,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# --- the manager -------------------------------------------------------------------------


class RetKbEngine(md.KbEngine):
    """kvblocks' manager with a retention policy; requests carry a priority and session."""

    def __init__(
        self,
        groups: list[GroupModel],
        num_blocks: int,
        caching: bool,
        scheduler: int,
        policy: PolicyModel | None,
        driver: RetDriver,
    ) -> None:
        self.policy = policy  # read by manager_options() in the base constructor
        self.driver = driver
        super().__init__(groups, num_blocks, caching, scheduler)

    def manager_options(self) -> dict[str, Any]:
        return {"retention": make_policy(self.policy)}

    def request_options(self) -> dict[str, Any]:
        priority, session = self.driver.pending
        return {"priority": priority, "session_id": session}


class RetDriver(md.Driver):
    """manager_driver's scheduler over the retention manager and its model."""

    def __init__(
        self,
        layout: list[tuple[int, int | None]],
        num_blocks: int,
        caching: bool,
        policy: PolicyModel | None,
    ) -> None:
        self.pending: tuple[int, str | None] = (0, None)
        self.policy = policy  # read by make_model() in the base constructor

        def factory(groups: list[GroupModel], n: int, c: bool, s: int) -> md.Engine:
            return RetKbEngine(groups, n, c, s, policy, self)

        super().__init__(factory, layout, num_blocks, caching)

    def make_model(
        self, groups: list[GroupModel], num_blocks: int, scheduler: int, caching: bool
    ) -> RetentionManagerModel:
        self.rmodel = RetentionManagerModel(
            groups, num_blocks, md.MAX_MODEL_LEN, HBS, scheduler, caching, self.policy
        )
        return self.rmodel

    def arrive(
        self,
        prefix: list[int],
        tail: list[int],
        salt: str | None,
        lora: int | None,
        priority: int = 0,
        session: str | None = None,
    ) -> None:
        self.pending = (priority, session)
        super().arrive(prefix, tail, salt, lora)
        tenant = salt if salt is not None else None if lora is None else f"lora{lora}"
        self.rmodel.set_request(f"r{self.next_id}", priority, session, tenant)

    def evict(self, ids: set[int]) -> None:
        """Evicts in ascending order on both sides (with a policy a dropped hash moves its
        free block to the head of `front`, so the order of the ids shows)."""
        order = sorted(b for b in ids if b < self.num_blocks)
        self.engine.mgr.evict_blocks(order)
        self.rmodel.pool.evict_blocks(order)

    def other_holders(self) -> list[int]:
        """A pin counts as one more holder of its block."""
        return [int(p) for p in self.rmodel.pool.pinned]

    def check(self) -> None:
        super().check()
        pool = self.rmodel.pool
        assert self.engine.mgr.block_pool.num_pinned_blocks == pool.num_pinned_blocks
        assert_tenant_counts(self.engine.mgr.block_pool, pool)


class ManagerRetentionMachine(RuleBasedStateMachine):
    """A hybrid manager with a policy, its requests pinned and unpinned whole."""

    driver: RetDriver

    def __init__(self) -> None:
        super().__init__()
        self.pinned: list[Any] = []  # requests, or hash lists, pinned (maybe twice)
        self.watch: dict[tuple[int, int], Key] = {}  # (group, block): its pinned key
        self.now = 0.0

    @initialize(
        layout=st.sampled_from(md.LAYOUTS[2:] + md.LAYOUTS[:1]),
        num_blocks=st.sampled_from([8, 12, 24]),
        policy=st.one_of(policies(), st.none()),
    )
    def init(
        self, layout: list[tuple[int, int | None]], num_blocks: int, policy: PolicyModel | None
    ) -> None:
        self.driver = RetDriver(layout, num_blocks, True, policy)

    @rule(
        prefix=st.sampled_from(md.PREFIXES),
        tail=st.lists(st.integers(0, 3), min_size=1, max_size=30),
        salt=st.sampled_from([None, "a", "b"]),
        lora=st.sampled_from([None, 1]),
        priority=st.integers(-1, 2),
        session=st.sampled_from([None, "s1", "s2"]),
        chunk=st.sampled_from([None, 4, 16, 80]),
    )
    def arrive(
        self,
        prefix: list[int],
        tail: list[int],
        salt: str | None,
        lora: int | None,
        priority: int,
        session: str | None,
        chunk: int | None,
    ) -> None:
        """A new request (a priority, a session, a tenant), admitted at once unless `chunk`
        is None."""
        self.driver.arrive(prefix, tail, salt, lora, priority, session)
        if chunk is not None:
            self.driver.admit(chunk, 0)

    @rule(index=st.integers(0, 63))
    def arrive_again(self, index: int) -> None:
        """A resent prompt, same tenant, admitted at once (so that hits are common)."""
        self.driver.arrive_again(index, None)
        for _ in range(len(self.driver.waiting)):
            self.driver.admit(md.MAX_MODEL_LEN, 0)

    @precondition(lambda self: self.driver.waiting)
    @rule(chunk=st.sampled_from([4, 7, 16, 80]), lookahead=st.sampled_from([0, 2]))
    def admit(self, chunk: int, lookahead: int) -> None:
        self.driver.admit(chunk, lookahead)

    @precondition(lambda self: self.driver.running)
    @rule(
        index=st.integers(0, 63),
        chunk=st.sampled_from([1, 4, 9, 80]),
        token=st.integers(0, 3),
        steps=st.integers(1, 4),
    )
    def step(self, index: int, chunk: int, token: int, steps: int) -> None:
        for _ in range(steps):
            self.driver.step(index, chunk, 0, token)
            self.driver.check()

    @precondition(lambda self: self.driver.running)
    @rule(index=st.integers(0, 63))
    def finish(self, index: int) -> None:
        self.driver.finish(index)

    @precondition(lambda self: self.driver.running or self.driver.waiting)
    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        reqs = [r for r in self.driver.running + self.driver.waiting if r.num_prompt_tokens >= HBS]
        if not reqs:
            return
        req = data.draw(st.sampled_from(reqs))
        self.driver.engine.mgr.pin(req)
        self.driver.rmodel.pin(req)
        self.pinned.append(req)

    @precondition(lambda self: self.driver.running or self.driver.waiting)
    @rule(data=st.data())
    def pin_hashes(self, data: st.DataObject) -> None:
        """A prefix pinned by its hashes (at the hash block size), e.g. a system prompt."""
        req = data.draw(st.sampled_from(self.driver.running + self.driver.waiting))
        if not req.block_hashes:
            return
        hashes = req.block_hashes[: data.draw(st.integers(1, len(req.block_hashes)))]
        self.driver.engine.mgr.pin_hashes(hashes)
        self.driver.rmodel.pool.pin_keys(self.driver.rmodel.hash_keys(hashes))
        self.pinned.append(hashes)

    @precondition(lambda self: self.pinned)
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        pinned = self.pinned.pop(data.draw(st.integers(0, len(self.pinned) - 1)))
        if isinstance(pinned, list):
            self.driver.engine.mgr.unpin_hashes(pinned)
            self.driver.rmodel.pool.unpin_keys(self.driver.rmodel.hash_keys(pinned))
        else:
            self.driver.engine.mgr.unpin(pinned)
            self.driver.rmodel.unpin(pinned)
        pins = self.driver.rmodel.pool.pins
        self.watch = {k: v for k, v in self.watch.items() if v in pins}

    @precondition(lambda self: self.driver.running or self.driver.waiting)
    @rule(data=st.data())
    def unpin_unpinned(self, data: st.DataObject) -> None:
        """Unpinning a request whose prompt is not (wholly) pinned raises KeyError and
        changes nothing."""
        req = data.draw(st.sampled_from(self.driver.running + self.driver.waiting))
        trial = copy.deepcopy(self.driver.rmodel.pool)
        try:
            trial.unpin_keys(self.driver.rmodel.prompt_keys(req))
        except KeyError:
            pool = self.driver.engine.mgr.block_pool
            before = pool_state(pool), pool.num_pinned_blocks
            with pytest.raises(KeyError) as err:
                self.driver.engine.mgr.unpin(req)
            assert isinstance(err.value, kb.KVBlocksError)
            assert (pool_state(pool), pool.num_pinned_blocks) == before

    @rule(
        op=st.sampled_from(["time", "time", "time", "back", "evict", "reset"]),
        step=st.sampled_from(STEPS),
        ids=st.sets(st.integers(1, 23), max_size=3),
    )
    def clock_and_cache(self, op: str, step: float, ids: set[int]) -> None:
        """The clock goes on (or is refused going back); blocks are evicted; the prefix
        cache is reset."""
        mgr = self.driver.engine.mgr
        if op == "time":
            self.now += step
            mgr.advance_time(self.now)
            self.driver.rmodel.pool.advance_time(self.now)
            assert mgr.now == self.now
        elif op == "back":
            before = pool_state(mgr.block_pool)
            with pytest.raises(ValueError):
                mgr.advance_time(self.now - 1.0)
            assert mgr.now == self.now
            assert pool_state(mgr.block_pool) == before
        elif op == "evict":
            self.driver.evict(ids)
            self.watch = {k: v for k, v in self.watch.items() if k[1] not in ids}
        else:
            self.driver.reset()
            if not self.driver.running:
                self.watch.clear()

    @invariant()
    def agree(self) -> None:
        if not hasattr(self, "driver"):
            return
        self.driver.check()
        pool = self.driver.engine.mgr.block_pool
        # Pins: every cached block of a pinned request's full prompt blocks, in every
        # group, stays cached and held while the pin holds.
        for h, g in self.driver.rmodel.pool.pins:
            got = pool.get_cached_block(h, [g])
            if got is not None:
                self.watch.setdefault((g, got[0]), (h, g))
        free = set(pool.get_free_block_ids())
        for (_, b), (h, _) in self.watch.items():
            assert pool.get_block_hash(b) == h, f"pinned block {b} was evicted"
            assert b not in free
        # Quotas, after every operation.
        policy = self.driver.policy
        if policy is not None:
            count = Counter(
                self.driver.rmodel.pool.tenant_of[b]
                for b in free
                if pool.get_block_hash(b) is not None
            )
            for tenant, n in count.items():
                quota = policy.quota(tenant)
                assert quota is None or n <= quota, f"tenant {tenant}: {n} > {quota}"


TestManagerRetention = ManagerRetentionMachine.TestCase
TestManagerRetention.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# --- the model itself ------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_model_without_policy_is_vllm(data: st.DataObject) -> None:
    """With no policy and no pin, the retention model is model.PoolModel (vLLM's order),
    whatever tags the frees carry and however the clock moves."""
    n = data.draw(st.integers(2, 12))
    ours, vllm = RetentionPoolModel(n, True, True), PoolModel(n, True, True)
    held: list[list[int]] = []
    hashes = [bytes([i]) * 32 for i in range(12)]
    for _ in range(data.draw(st.integers(0, 30))):
        op = data.draw(st.sampled_from(["get", "free", "cache", "evict", "reset", "time"]))
        if op == "get" and vllm.num_free():
            k = data.draw(st.integers(1, vllm.num_free()))
            got = ours.get_new_blocks(k)
            assert got == vllm.get_new_blocks(k)
            held.append(got)
        elif op == "free" and held:
            blocks = held.pop(data.draw(st.integers(0, len(held) - 1)))
            ours.free_blocks(blocks[::-1], Tags(0, True, "a"))
            vllm.free_blocks(blocks[::-1])
        elif op == "cache" and held:
            blocks = held[-1]
            start = data.draw(st.integers(0, 11 - len(blocks)))
            args = (hashes[start:], blocks, 0, len(blocks), 4, 0, 4)
            try:
                vllm.cache_full_blocks(*args)
            except ValueError:
                with pytest.raises(ValueError):
                    ours.cache_full_blocks(*args)
            else:
                ours.cache_full_blocks(*args)
        elif op == "evict":
            ids = data.draw(st.lists(st.integers(0, n - 1), max_size=3))
            ours.evict_blocks(ids)
            vllm.evict_blocks(ids)
        elif op == "reset":
            assert ours.reset_prefix_cache() == vllm.reset_prefix_cache()
        elif op == "time":
            ours.advance_time(ours.now + 1.0)
        assert pool_state(ours) == pool_state(vllm)
        assert ours.take_events() == vllm.take_events()


# --- bad input ---------------------------------------------------------------------------

VALID: dict[str, Any] = PolicyModel(
    classes=2, priority_classes={-1: 1}, ttl_s=[60.0, None], session_s=30.0
).kwargs()


@pytest.mark.parametrize(
    "bad",
    [
        {"classes": 0},
        {"classes": -1},
        {"default_class": 2},
        {"default_class": -1},
        {"priority_classes": {0: 2}},
        {"priority_classes": {0: -1}},
        {"ttl_s": -1.0},
        {"ttl_s": math.nan},
        {"ttl_s": math.inf},
        {"ttl_s": [1.0, 2.0, 3.0]},
        {"ttl_s": [1.0, -2.0]},
        {"session_s": -1.0},
        {"session_s": math.nan},
        {"tenant_quotas": {"a": -1}},
        {"default_tenant_quota": -1},
    ],
    ids=repr,
)
def test_invalid_policy_raises_value_error(bad: dict[str, Any]) -> None:
    kb.RetentionPolicy(**VALID)
    with pytest.raises(ValueError) as err:
        kb.RetentionPolicy(**(VALID | bad))
    assert isinstance(err.value, kb.KVBlocksError)


def cached_pool(policy: PolicyModel | None) -> tuple[kb.BlockPool, list[bytes], list[int]]:
    """A pool with one free request of three cached blocks."""
    pool = kb.BlockPool(8, True, HBS, True, retention=make_policy(policy))
    req = kb.Request("r", list(range(13)), kb.BlockHasher(HBS))
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(req.block_hashes, blocks, 0, 3, HBS, 0, req.all_token_ids)
    pool.free_blocks(blocks[::-1])
    pool.take_events()
    return pool, req.block_hashes, blocks


@pytest.mark.parametrize("cls", [2, -1])
def test_free_with_a_class_out_of_range_changes_nothing(cls: int) -> None:
    pool = kb.BlockPool(6, True, HBS, retention=make_policy(PolicyModel(classes=2)))
    blocks = pool.get_new_blocks(2)
    before = pool_state(pool)
    with pytest.raises(ValueError) as err:
        pool.free_blocks(blocks, priority_class=cls)
    assert isinstance(err.value, kb.KVBlocksError)
    assert pool_state(pool) == before
    pool.free_blocks(blocks, priority_class=1)


@pytest.mark.parametrize("policy", [None, PolicyModel(classes=2, ttl_s=5.0)], ids=["none", "ttl"])
def test_unpin_unknown_key_changes_nothing(policy: PolicyModel | None) -> None:
    pool, hashes, blocks = cached_pool(policy)
    pool.pin(hashes[:1], group_ids=[0])
    assert pool.num_pinned_blocks == 1
    before = pool_state(pool)
    for hs, groups in [(hashes[1:2], [0]), (hashes[:1], [1]), (hashes[:2], [0])]:
        with pytest.raises(KeyError) as err:
            pool.unpin(hs, group_ids=groups)
        assert isinstance(err.value, kb.KVBlocksError)
        assert pool_state(pool) == before
        assert pool.num_pinned_blocks == 1
    pool.pin(hashes[:1], group_ids=[0])  # pins count: two pins need two unpins
    pool.unpin(hashes[:1], group_ids=[0])
    assert pool.num_pinned_blocks == 1 and blocks[0] not in pool.get_free_block_ids()
    pool.unpin(hashes[:1], group_ids=[0])
    assert pool.num_pinned_blocks == 0 and blocks[0] in pool.get_free_block_ids()
    with pytest.raises(KeyError):
        pool.unpin(hashes[:1], group_ids=[0])
    assert pool.take_events() == []  # pins produce no event


@pytest.mark.parametrize("policy", [None, PolicyModel(session_s=2.0)], ids=["none", "session"])
def test_clock_going_back_changes_nothing(policy: PolicyModel | None) -> None:
    pool, _, _ = cached_pool(policy)
    pool.advance_time(3.0)
    before = pool_state(pool)
    for now in (2.5, -1.0, math.nan):
        with pytest.raises(ValueError) as err:
            pool.advance_time(now)
        assert isinstance(err.value, kb.KVBlocksError)
        assert pool_state(pool) == before
    pool.advance_time(3.0)  # the same time again is not going back
    mgr = kb.KVCacheManager(tmm_config(), 64, HBS, retention=make_policy(policy))
    mgr.advance_time(4.0)
    with pytest.raises(ValueError):
        mgr.advance_time(3.5)
    assert mgr.now == 4.0


def tmm_config() -> kb.KVCacheConfig:
    full = kb.FullAttentionSpec(block_size=HBS, num_kv_heads=1, head_size=8, dtype="float16")
    swa = kb.SlidingWindowSpec(
        block_size=HBS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8
    )
    return kb.KVCacheConfig(
        16, [], [kb.KVCacheGroupSpec(["f"], full), kb.KVCacheGroupSpec(["s"], swa)]
    )


def test_manager_unpin_of_unpinned_request_raises() -> None:
    mgr = kb.KVCacheManager(tmm_config(), 64, HBS, retention=make_policy(PolicyModel()))
    req = kb.Request("r", list(range(13)), kb.BlockHasher(HBS))
    assert mgr.allocate_slots(req, 13) is not None
    with pytest.raises(KeyError) as err:
        mgr.unpin(req)
    assert isinstance(err.value, kb.KVBlocksError)
    mgr.pin(req)
    # 3 full prompt blocks, in both groups (the sliding window's are still in its table).
    assert mgr.block_pool.num_pinned_blocks == 6
    mgr.free(req)
    free = mgr.block_pool.get_free_block_ids()
    assert all(mgr.block_pool.get_ref_cnt(b) == 1 for b in range(1, 16) if b not in free)
    mgr.unpin(req)
    assert mgr.block_pool.num_pinned_blocks == 0
    with pytest.raises(KeyError):
        mgr.unpin(req)


def test_worked_example() -> None:
    """The rules by hand, on kvblocks and the model: classes, a TTL, a session window, a
    quota and a pin, one step at a time."""
    policy = PolicyModel(classes=2, ttl_s=[5.0, None], session_s=3.0, tenant_quotas={"a": 1})
    hashes = [bytes([i]) * 32 for i in range(1, 9)]
    pool = kb.BlockPool(8, True, HBS, retention=make_policy(policy))
    model = RetentionPoolModel(8, True, False, policy)
    for p in (pool, model):
        assert p.get_new_blocks(6) == [1, 2, 3, 4, 5, 6]
    pool.cache_full_blocks(hashes, [1, 2, 3, 4, 5, 6], 0, 6, HBS, 0)
    model.cache_full_blocks(hashes, [1, 2, 3, 4, 5, 6], 0, 6, HBS, 0, HBS)

    def step(call: str, *args: Any, want: list[int], **kw: Any) -> None:
        getattr(pool, call)(*args, **kw)
        if call == "free_blocks":
            model.free_blocks(args[0], Tags(**kw))
        else:
            getattr(model, call)(*args)
        assert pool.get_free_block_ids() == model.queue == want

    step("free_blocks", [1], priority_class=1, want=[7, 1])
    step("free_blocks", [2], priority_class=0, want=[7, 2, 1])  # class 0 goes first
    step("free_blocks", [3], session=True, want=[7, 2, 1, 3])  # the session window: last
    step("advance_time", 3.0, want=[7, 2, 3, 1])  # window over: class 0, idle from 3.0
    step("advance_time", 5.0, want=[7, 2, 3, 1])  # 2 expires at 5.0: already at the head
    step("free_blocks", [4], tenant="a", want=[7, 2, 3, 4, 1])
    step("free_blocks", [5], tenant="a", want=[4, 7, 2, 3, 5, 1])  # over the quota: 4 goes
    assert pool.get_block_hash(4) is None and pool.get_tenant_cached_blocks() == {"a": 1}
    step("pin", [hashes[0]], [0], want=[4, 7, 2, 3, 5])  # block 1 held by its pin
    step("advance_time", 8.0, want=[4, 7, 2, 3, 5])  # 3 (idle since 3.0) expires, 5 not
    step("free_blocks", [6], priority_class=1, want=[4, 7, 2, 3, 5, 6])
    assert pool.get_new_blocks(5) == [4, 7, 2, 3, 5]  # block 1 stays cached
    assert pool.get_block_hash(1) == hashes[0] and pool.get_free_block_ids() == [6]
