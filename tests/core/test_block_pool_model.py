"""kb.BlockPool against the plain-Python PoolModel, side by side (hypothesis state machine).

Requests with shared prefixes, cache salts and LoRA adapters are driven the way the
managers drive a pool (tests/support/pool_driver.py: prefix hit, touch, allocate, cache
full blocks; then decode, free in reverse), over two groups with different block sizes,
with evictions, resets and raw bad calls interleaved. After every step the free queue, ref
counts, block hashes, usage, events and every live request's cache hits must be identical,
and every block's ref count must equal the number of live block tables holding it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import kvblocks as kb
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from model import NULL_BLOCK, PoolModel, event_tuple, pool_state
from pool_driver import GROUP_BLOCK_SIZES, HBS, PREFIXES, PoolDriving


@dataclass
class Live:
    req: kb.Request
    tables: list[list[int]] = field(default_factory=lambda: [[], []])
    num_cached: list[int] = field(default_factory=lambda: [0, 0])


class PoolMachine(PoolDriving, RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.live: dict[str, Live] = {}
        self.next_id = 0
        self.pool: kb.BlockPool
        self.model: PoolModel

    @initialize(
        num_blocks=st.integers(1, 40),
        caching=st.booleans(),
        events=st.booleans(),
    )
    def init(self, num_blocks: int, caching: bool, events: bool) -> None:
        self.pool = kb.BlockPool(num_blocks, caching, HBS, events)
        self.model = PoolModel(num_blocks, caching, events)

    def both(self, name: str, *args: object) -> object:
        """Calls `name` on both; they must both succeed with equal results or both fail."""
        model_args = args
        if name == "cache_full_blocks":
            model_args = (*args[:6], HBS, *args[6:])
        try:
            want = getattr(self.model, name)(*model_args)
        except ValueError:
            before = pool_state(self.pool)
            with pytest.raises(ValueError):
                getattr(self.pool, name)(*args)
            assert pool_state(self.pool) == before
            return None
        got = getattr(self.pool, name)(*args)
        assert got == want, (name, got, want)
        return got

    @rule(
        prefix=st.sampled_from(PREFIXES),
        tail=st.lists(st.integers(0, 3), min_size=1, max_size=20),
        salt=st.sampled_from([None, "a", "b"]),
        lora=st.sampled_from([None, 1, 2]),
    )
    def add_request(
        self, prefix: list[int], tail: list[int], salt: str | None, lora: int | None
    ) -> None:
        self.next_id += 1
        req = kb.Request(
            f"r{self.next_id}",
            prefix + tail,
            kb.BlockHasher(HBS),
            cache_salt=salt,
            lora_name=None if lora is None else f"lora{lora}",
            lora_path=None if lora is None else f"/lora{lora}",
            lora_id=lora,
        )
        live = Live(req)
        if self.admit(live):
            self.live[req.request_id] = live

    @precondition(lambda self: self.live)
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 3), min_size=1, max_size=9))
    def decode(self, data: st.DataObject, tokens: list[int]) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        live = self.live[rid]
        live.req.append_output_token_ids(tokens)
        if sum(self.need(live, g) for g in (0, 1)) > self.model.num_free():
            self.free(rid)  # preempted: no room to grow
            return
        self.grow(live)

    def free(self, rid: str) -> None:
        live = self.live.pop(rid)
        for table in live.tables:
            self.both("free_blocks", table[::-1])

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        self.free(data.draw(st.sampled_from(sorted(self.live))))

    @rule(ids=st.lists(st.integers(0, 45), max_size=4))
    def evict(self, ids: list[int]) -> None:
        self.both("evict_blocks", ids)

    @rule()
    def reset(self) -> None:
        assert self.both("reset_prefix_cache") == (not self.live)

    @rule(
        name=st.sampled_from(["free_blocks", "touch"]), ids=st.lists(st.integers(0, 45), max_size=4)
    )
    def raw_bad_call(self, name: str, ids: list[int]) -> None:
        """A raw call that the model rejects must be rejected by kvblocks, unchanged."""
        trial = copy.deepcopy(self.model)
        try:
            getattr(trial, name)(ids)
        except ValueError:
            self.both(name, ids)

    @rule(
        prefix=st.sampled_from(PREFIXES),
        ids=st.lists(st.integers(0, 45), max_size=5),
        counts=st.tuples(st.integers(0, 5), st.integers(0, 5)),
        group=st.sampled_from([0, 1]),
    )
    def raw_cache(
        self, prefix: list[int], ids: list[int], counts: tuple[int, int], group: int
    ) -> None:
        """cache_full_blocks with arbitrary ids and counts (repeats, free or unknown blocks)."""
        req = kb.Request("raw", [*prefix, *range(20)], kb.BlockHasher(HBS))
        bs = GROUP_BLOCK_SIZES[group]
        self.both("cache_full_blocks", req.block_hashes, ids, *counts, bs, group, req.all_token_ids)

    @rule(n=st.integers(0, 50))
    def raw_get_new_blocks(self, n: int) -> None:
        if n > self.model.num_free():
            self.both("get_new_blocks", n)

    @invariant()
    def same_state(self) -> None:
        self.pool.check_invariants()
        assert pool_state(self.pool) == pool_state(self.model)
        assert [event_tuple(e) for e in self.pool.take_events()] == self.model.take_events()
        held = [0] * self.model.num_blocks
        for live in self.live.values():
            for table in live.tables:
                for b in table:
                    held[b] += b != NULL_BLOCK
        assert held[1:] == self.model.ref_cnt[1:]


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
