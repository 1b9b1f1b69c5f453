"""The plain-Python ManagerModel side by side with a real KV cache manager.

A `Driver` plays vLLM's scheduler: requests with
shared prefixes, cache salts and LoRA adapters arrive, are admitted with their prefix hit,
prefilled in chunks, decode with lookahead slots, get preempted when the pool is full,
finish; blocks are evicted and the prefix cache reset in between. Every call goes to the
real manager and to the model; after every step the hit lengths and blocks, the new
blocks, every live block table, the free queue and the usage must agree, and every block's
ref count must equal the number of live tables holding it.

* `TestManagerMachine`: hypothesis drives kvblocks' `KVCacheManager` against the model
  (full attention, sliding window and hybrid groups, caching on and off).
* `test_model_matches_vllm`: the same driver, seeded, checks the model itself against
  the installed vLLM's (0.32 or 0.33) `KVCacheManager`, with that release's null-block
  rule (skipped without vLLM).
"""

# vLLM and torch are optional (the oracle venv has them; mypy here does not):
# mypy: disable-error-code="import-not-found"

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from model import NULL_BLOCK, GroupModel, ManagerModel

HBS = 4
MAX_MODEL_LEN = 80
PREFIXES = [[7] * 12, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], []]

# Group layouts: (block_size, sliding_window or None) per group. Hash block size 4; the
# scheduler block size is the lcm of the group block sizes. A full-attention group with
# blocks larger than the hash block is left out: vLLM 0.33 then also registers the prompt
# tail as a partial prefix-cache entry (`FullAttentionManager._cache_partial_tail_block`),
# which the model does not implement.
LAYOUTS: list[list[tuple[int, int | None]]] = [
    [(4, None)],
    [(4, 8)],
    [(4, None), (4, 8)],
    [(4, None), (4, 8), (4, 8)],
    [(4, None), (4, 8), (4, 13)],
]


class Engine:
    """What the driver needs from a real manager; subclasses adapt kvblocks and vLLM.

    Calls that both managers take with vLLM's names and shapes live here, on ``self.mgr``.
    """

    mgr: Any
    #: Whether the manager counts the null block's references (vLLM 0.32's rule).
    counts_null_block_refs = False

    def make_request(self, rid: str, tokens: list[int], salt: str | None, lora: int | None) -> Any:
        raise NotImplementedError

    def get_computed_blocks(self, req: Any) -> tuple[Any, list[list[int]], int]:
        """(the handle to pass to allocate_slots, block ids per group, hit tokens)."""
        raise NotImplementedError

    def allocate_slots(
        self, req: Any, num_new: int, num_hit: int, handle: Any, lookahead: int
    ) -> list[list[int]] | None:
        out = self.mgr.allocate_slots(req, num_new, num_hit, handle, num_lookahead_tokens=lookahead)
        return None if out is None else [list(ids) for ids in out.get_block_ids()]

    def free(self, req: Any) -> None:
        self.mgr.free(req)

    def block_ids(self, rid: str) -> list[list[int]]:
        return [list(ids) for ids in self.mgr.get_block_ids(rid)]

    def free_queue(self) -> list[int]:
        raise NotImplementedError

    def ref_cnt(self, block: int) -> int:
        raise NotImplementedError

    def evict(self, ids: set[int]) -> None:
        self.mgr.evict_blocks(ids)

    def reset(self) -> bool:
        return bool(self.mgr.reset_prefix_cache())

    def usage(self) -> float:
        return float(self.mgr.usage)


class Driver:
    """The scheduler: waiting and running requests over one engine and the model."""

    def __init__(
        self,
        engine_factory: Callable[[list[GroupModel], int, bool, int], Engine],
        layout: list[tuple[int, int | None]],
        num_blocks: int,
        caching: bool,
    ) -> None:
        groups = [GroupModel(bs, sw) for bs, sw in layout]
        scheduler = 1
        for g in groups:
            scheduler = scheduler * g.block_size // _gcd(scheduler, g.block_size)
        self.engine = engine_factory(groups, num_blocks, caching, scheduler)
        self.model = ManagerModel(
            groups,
            num_blocks,
            MAX_MODEL_LEN,
            HBS,
            scheduler,
            caching,
            count_null_block_refs=self.engine.counts_null_block_refs,
        )
        self.num_blocks = num_blocks
        self.waiting: list[Any] = []
        self.running: list[Any] = []
        self.next_id = 0
        self.hits = 0  # tokens reused from the prefix cache, for the statistics
        self.tenant: dict[str, tuple[str | None, int | None]] = {}
        self.history: list[tuple[list[int], tuple[str | None, int | None]]] = []

    def arrive(
        self, prefix: list[int], tail: list[int], salt: str | None, lora: int | None
    ) -> None:
        self.next_id += 1
        tokens = (prefix + tail)[: MAX_MODEL_LEN - 8]
        rid = f"r{self.next_id}"
        self.tenant[rid] = (salt, lora)
        self.history.append((tokens, (salt, lora)))
        self.waiting.append(self.engine.make_request(rid, tokens, salt, lora))

    def arrive_again(self, index: int, tenant: tuple[str | None, int | None] | None) -> None:
        """A new request with the tokens of an earlier one (a resent prompt), under the
        same tenant (`None`) or another: it may hit only in the first case."""
        if self.history:
            tokens, same = self.history[index % len(self.history)]
            salt, lora = tenant or same
            self.arrive(tokens, [], salt, lora)

    def admit(self, chunk: int, lookahead: int) -> None:
        """Admits the first waiting request: prefix hit, then its first chunk."""
        if not self.waiting:
            return
        req = self.waiting[0]
        handle, got, hit = self.engine.get_computed_blocks(req)
        want, want_hit = self.model.get_computed_blocks(req)
        assert (got, hit) == (want, want_hit), "prefix hit differs"
        num_new = min(chunk, req.num_tokens - hit)
        new = self.engine.allocate_slots(req, num_new, hit, handle, lookahead)
        expect = self.model.allocate_slots(req, num_new, hit, want, lookahead)
        assert new == expect, f"allocate_slots of a new request differs: {new} != {expect}"
        if new is None:
            return
        self.hits += hit
        self.waiting.pop(0)
        req.num_computed_tokens = hit + num_new
        self.running.append(req)

    def step(self, index: int, chunk: int, lookahead: int, token: int) -> None:
        """One step of a running request: the next prefill chunk, or one decode token."""
        if not self.running:
            return
        req = self.running[index % len(self.running)]
        if req.num_computed_tokens >= req.num_tokens:
            if req.num_tokens >= MAX_MODEL_LEN - 1:
                self.finish(index)
                return
            req.append_output_token_ids([token])
        num_new = min(chunk, req.num_tokens - req.num_computed_tokens)
        new = self.engine.allocate_slots(req, num_new, 0, None, lookahead)
        expect = self.model.allocate_slots(req, num_new, 0, None, lookahead)
        assert new == expect, f"allocate_slots of a running request differs: {new} != {expect}"
        if new is None:
            # Preempt it, as vLLM's scheduler does with its lowest-priority request.
            self.running.remove(req)
            self.engine.free(req)
            self.model.free(req.request_id)
            req.num_computed_tokens = 0
            req.num_preemptions += 1
            self.waiting.append(req)
            return
        req.num_computed_tokens += num_new

    def finish(self, index: int) -> None:
        if not self.running:
            return
        req = self.running.pop(index % len(self.running))
        self.engine.free(req)
        self.model.free(req.request_id)

    def evict(self, ids: set[int]) -> None:
        ids = {b for b in ids if b < self.num_blocks}
        self.engine.evict(ids)
        self.model.pool.evict_blocks(sorted(ids))

    def reset(self) -> None:
        assert self.engine.reset() == self.model.pool.reset_prefix_cache()

    def check(self) -> None:
        for req in self.running + self.waiting:
            rid = req.request_id
            got = self.engine.block_ids(rid)
            want = [list(t) for t in self.model.get_block_ids(rid)]
            assert got == want, f"block table of {rid} differs: {got} != {want}"
        assert self.engine.free_queue() == self.model.pool.queue
        assert self.engine.usage() == self.model.usage()
        held = [0] * self.num_blocks
        for req in self.running:
            for table in self.model.get_block_ids(req.request_id):
                for b in table:
                    held[b] += b != NULL_BLOCK
        assert held[1:] == self.model.pool.ref_cnt[1:], "a block's ref count is not its owners"
        # Tenant isolation: requests with a different cache salt or LoRA adapter never
        # hold the same block.
        owner: dict[int, tuple[str | None, int | None]] = {}
        for req in self.running:
            tenant = self.tenant[req.request_id]
            for table in self.engine.block_ids(req.request_id):
                for b in table:
                    if b != NULL_BLOCK:
                        assert owner.setdefault(b, tenant) == tenant, f"block {b} shared by tenants"
        assert [self.engine.ref_cnt(b) for b in range(self.num_blocks)] == self.model.pool.ref_cnt


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def random_run(driver: Driver, rng: random.Random, steps: int) -> None:
    """A seeded random schedule over `driver`."""
    for _ in range(steps):
        r = rng.random()
        if r < 0.05:
            driver.arrive_again(rng.randrange(64), rng.choice([None, None, ("a", 1)]))
        elif r < 0.2:
            tail = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
            salt = rng.choice([None, None, "a", "b"])
            lora = rng.choice([None, None, 1, 2])
            driver.arrive(rng.choice(PREFIXES), tail, salt, lora)
        elif r < 0.4:
            driver.admit(rng.choice([4, 8, 16, 64]), rng.choice([0, 0, 2, 5]))
        elif r < 0.85:
            driver.step(
                rng.randrange(64), rng.choice([4, 8, 64]), rng.choice([0, 0, 3]), rng.randrange(4)
            )
        elif r < 0.95:
            driver.finish(rng.randrange(64))
        elif r < 0.99:
            driver.evict({rng.randrange(1, driver.num_blocks) for _ in range(3)})
        else:
            driver.reset()
        driver.check()


# --- the installed vLLM (checks the model itself) -----------------------------------


class VllmEngine(Engine):
    def __init__(
        self, groups: list[GroupModel], num_blocks: int, caching: bool, scheduler: int
    ) -> None:
        import torch
        from kvblocks.vllm._version_rules import rules
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            SlidingWindowSpec,
        )
        from vllm.v1.request import Request

        self.counts_null_block_refs = rules().count_null_block_refs
        init_none_hash(sha256)
        specs: list[Any] = []
        for g in groups:
            common = {
                "block_size": g.block_size,
                "num_kv_heads": 1,
                "head_size": 8,
                "dtype": torch.float16,
            }
            if g.sliding_window is None:
                specs.append(FullAttentionSpec(**common))
            else:
                specs.append(SlidingWindowSpec(**common, sliding_window=g.sliding_window))
        config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)],
        )
        self.mgr = KVCacheManager(config, MAX_MODEL_LEN, scheduler, HBS, enable_caching=caching)
        self.hasher = get_request_block_hasher(HBS, sha256)
        self.request_cls = Request
        self.lora_cls = LoRARequest
        self.params = SamplingParams(max_tokens=MAX_MODEL_LEN)
        self.reqs: dict[str, Any] = {}

    def make_request(self, rid: str, tokens: list[int], salt: str | None, lora: int | None) -> Any:
        lora_req = None if lora is None else self.lora_cls(f"lora{lora}", lora, f"/lora{lora}")
        req = self.request_cls(
            rid,
            tokens,
            self.params,
            None,
            lora_request=lora_req,
            cache_salt=salt,
            block_hasher=self.hasher,
        )
        self.reqs[rid] = req
        return req

    def get_computed_blocks(self, req: Any) -> tuple[Any, list[list[int]], int]:
        blocks, hit = self.mgr.get_computed_blocks(req)[:2]
        return blocks, [list(ids) for ids in blocks.get_block_ids()], hit

    def free_queue(self) -> list[int]:
        return [b.block_id for b in self.mgr.block_pool.free_block_queue.get_all_free_blocks()]

    def ref_cnt(self, block: int) -> int:
        return int(self.mgr.block_pool.blocks[block].ref_cnt)


@pytest.mark.vllm
@pytest.mark.parametrize("layout", LAYOUTS, ids=[str(x) for x in LAYOUTS])
@pytest.mark.parametrize("caching", [True, False])
def test_model_matches_vllm(layout: list[tuple[int, int | None]], caching: bool) -> None:
    pytest.importorskip("vllm")
    hits = 0
    for seed in range(6):
        rng = random.Random(seed)
        driver = Driver(VllmEngine, layout, rng.choice([12, 24, 48]), caching)
        random_run(driver, rng, 400)
        hits += driver.hits
    assert (hits > 0) == caching


# --- kvblocks ------------------------------------------------------------------------


class KbEngine(Engine):
    def __init__(
        self, groups: list[GroupModel], num_blocks: int, caching: bool, scheduler: int
    ) -> None:
        import kvblocks as kb

        specs: list[kb.KVCacheSpec] = []
        for g in groups:
            common: dict[str, Any] = {
                "block_size": g.block_size,
                "num_kv_heads": 1,
                "head_size": 8,
                "dtype": "float16",
            }
            if g.sliding_window is None:
                specs.append(kb.FullAttentionSpec(**common))
            else:
                specs.append(kb.SlidingWindowSpec(**common, sliding_window=g.sliding_window))
        config = kb.KVCacheConfig(
            num_blocks, [], [kb.KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)]
        )
        self.kb = kb
        self.mgr = kb.KVCacheManager(
            config, MAX_MODEL_LEN, HBS, scheduler_block_size=scheduler, enable_caching=caching
        )
        self.hasher = kb.BlockHasher(HBS, "sha256")

    def make_request(self, rid: str, tokens: list[int], salt: str | None, lora: int | None) -> Any:
        lora_kw: dict[str, Any] = {}
        if lora is not None:
            lora_kw = {"lora_name": f"lora{lora}", "lora_path": f"/lora{lora}", "lora_id": lora}
        return self.kb.Request(rid, tokens, self.hasher, cache_salt=salt, **lora_kw)

    def get_computed_blocks(self, req: Any) -> tuple[Any, list[list[int]], int]:
        blocks, hit = self.mgr.get_computed_blocks(req)
        return blocks, [list(ids) for ids in blocks.get_block_ids()], hit

    def free_queue(self) -> list[int]:
        return list(self.mgr.block_pool.get_free_block_ids())

    def ref_cnt(self, block: int) -> int:
        return int(self.mgr.block_pool.get_ref_cnt(block))


class ManagerMachine(RuleBasedStateMachine):
    """kvblocks' KVCacheManager and the model under one hypothesis-chosen schedule."""

    driver: Driver

    @initialize(
        layout=st.sampled_from(LAYOUTS),
        num_blocks=st.sampled_from([6, 12, 24, 48]),
        caching=st.booleans(),
    )
    def init(self, layout: list[tuple[int, int | None]], num_blocks: int, caching: bool) -> None:
        self.driver = Driver(KbEngine, layout, num_blocks, caching)

    @rule(
        prefix=st.sampled_from(PREFIXES),
        tail=st.lists(st.integers(0, 3), min_size=1, max_size=40),
        salt=st.sampled_from([None, "a", "b"]),
        lora=st.sampled_from([None, 1, 2]),
    )
    def arrive(
        self, prefix: list[int], tail: list[int], salt: str | None, lora: int | None
    ) -> None:
        self.driver.arrive(prefix, tail, salt, lora)

    @rule(
        index=st.integers(0, 63),
        tenant=st.none() | st.tuples(st.sampled_from([None, "a"]), st.sampled_from([None, 2])),
    )
    def arrive_again(self, index: int, tenant: tuple[str | None, int | None] | None) -> None:
        """A resent prompt, admitted at once in one chunk (so that hits are common)."""
        self.driver.arrive_again(index, tenant)
        for _ in range(len(self.driver.waiting)):
            self.driver.admit(MAX_MODEL_LEN, 0)

    @precondition(lambda self: self.driver.waiting)
    @rule(chunk=st.sampled_from([1, 4, 7, 16, 80]), lookahead=st.sampled_from([0, 2, 5]))
    def admit(self, chunk: int, lookahead: int) -> None:
        self.driver.admit(chunk, lookahead)

    @precondition(lambda self: self.driver.running)
    @rule(
        index=st.integers(0, 63),
        chunk=st.sampled_from([1, 4, 9, 80]),
        lookahead=st.sampled_from([0, 3]),
        token=st.integers(0, 3),
    )
    def step(self, index: int, chunk: int, lookahead: int, token: int) -> None:
        self.driver.step(index, chunk, lookahead, token)

    @precondition(lambda self: self.driver.running)
    @rule(index=st.integers(0, 63))
    def finish(self, index: int) -> None:
        self.driver.finish(index)

    @rule(ids=st.sets(st.integers(1, 47), max_size=3))
    def evict(self, ids: set[int]) -> None:
        self.driver.evict(ids)

    @rule()
    def reset(self) -> None:
        self.driver.reset()

    @invariant()
    def agree(self) -> None:
        if hasattr(self, "driver"):
            self.driver.check()


TestManagerMachine = ManagerMachine.TestCase
TestManagerMachine.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
