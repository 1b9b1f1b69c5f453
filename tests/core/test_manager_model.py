"""The plain-Python ManagerModel side by side with a real KV cache manager.

A `Driver` (tests/support/manager_driver.py) plays vLLM's scheduler: requests with
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
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from manager_driver import (
    HBS,
    LAYOUTS,
    MAX_MODEL_LEN,
    PREFIXES,
    Driver,
    Engine,
    KbEngine,
    random_run,
)
from model import GroupModel

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
