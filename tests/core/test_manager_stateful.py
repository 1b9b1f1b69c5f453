"""Hypothesis state machine over kvblocks.KVCacheManager: random requests with shared
prefixes, hits, chunked prefill, decode, preemption and frees, with the pool's invariants
checked after every step."""

from __future__ import annotations

from collections import Counter

import hypothesis.strategies as st
import kvblocks as kb
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

BS = 4
NUM_BLOCKS = 32
PREFIXES = [list(range(100, 160)), list(range(200, 230)), [7] * 50]


def make_config(kind: str) -> kb.KVCacheConfig:
    full = kb.FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    swa = kb.SlidingWindowSpec(
        block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=9
    )
    table: dict[str, list[kb.KVCacheSpec]] = {"full": [full], "hybrid": [full, swa], "swa": [swa]}
    specs = table[kind]
    groups = [kb.KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)]
    return kb.KVCacheConfig(NUM_BLOCKS, [], groups)


class ManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.hasher = kb.BlockHasher(BS, "sha256_cbor")
        self.mgr: kb.KVCacheManager
        self.waiting: list[kb.Request] = []
        self.running: list[kb.Request] = []
        self.next_id = 0

    @initialize(kind=st.sampled_from(["full", "hybrid", "swa"]), eagle=st.booleans())
    def setup(self, kind: str, eagle: bool) -> None:
        self.mgr = kb.KVCacheManager(make_config(kind), 256, BS, use_eagle=eagle and kind == "full")

    @rule(
        prefix=st.sampled_from(range(len(PREFIXES))), cut=st.integers(1, 60), tail=st.integers(0, 9)
    )
    def add_request(self, prefix: int, cut: int, tail: int) -> None:
        tokens = PREFIXES[prefix][:cut] + list(range(900, 900 + tail))
        self.waiting.append(kb.Request(f"r{self.next_id}", tokens, self.hasher))
        self.next_id += 1

    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        if not self.waiting:
            return
        req = self.waiting[0]
        blocks, hit = self.mgr.get_computed_blocks(req)
        assert hit <= req.num_tokens - 1
        assert hit % BS == 0
        n = data.draw(st.integers(1, req.num_tokens - hit))
        new = self.mgr.allocate_slots(req, n, hit, blocks)
        if new is None:
            return
        for group in new.get_block_ids():
            assert 0 not in group, "the null block is never handed out"
        self.waiting.pop(0)
        req.num_computed_tokens = hit + n
        self.running.append(req)
        self._after_compute(req)

    def _after_compute(self, req: kb.Request) -> None:
        if req.num_computed_tokens >= req.num_tokens:
            req.append_output_token_ids([req.num_tokens % 50])

    @rule(data=st.data())
    def step_running(self, data: st.DataObject) -> None:
        if not self.running:
            return
        req = data.draw(st.sampled_from(self.running))
        remaining = req.num_tokens - req.num_computed_tokens
        n = data.draw(st.integers(1, remaining)) if remaining > 1 else 1
        new = self.mgr.allocate_slots(req, n)
        if new is None:
            self._preempt(req)
            return
        for group in new.get_block_ids():
            assert 0 not in group
        req.num_computed_tokens += n
        self._after_compute(req)

    def _preempt(self, req: kb.Request) -> None:
        self.mgr.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.running.remove(req)
        self.waiting.insert(0, req)

    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        if self.running:
            self._preempt(data.draw(st.sampled_from(self.running)))

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        if self.running:
            req = data.draw(st.sampled_from(self.running))
            self.mgr.free(req)
            self.mgr.free(req)  # a second free is a no-op
            self.running.remove(req)
            assert self.mgr.get_block_ids(req.request_id) == tuple(
                [] for _ in range(self.mgr.num_kv_cache_groups)
            )

    @invariant()
    def pool_is_consistent(self) -> None:
        if not hasattr(self, "mgr"):
            return
        pool = self.mgr.block_pool
        owned: Counter[int] = Counter()
        for req in self.running + self.waiting:
            for group in self.mgr.get_block_ids(req.request_id):
                owned.update(b for b in group if b != 0)
        free = pool.get_free_block_ids()
        assert len(free) == len(set(free)) == pool.get_num_free_blocks()
        assert 0 not in free
        assert not set(free) & set(owned), "a block is both free and owned"
        for b in range(1, NUM_BLOCKS):
            assert pool.get_ref_cnt(b) == owned[b], f"ref_cnt of {b}"
        assert len(free) + len(owned) + 1 == NUM_BLOCKS


ManagerMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
TestManagerStateful = ManagerMachine.TestCase
