"""The scheduler that drives a KV cache manager and the plain-Python `ManagerModel` side by
side (tests/core/test_manager_model.py; the retention models extend it in
tests/retention/test_retention_model.py).

A `Driver` plays vLLM's scheduler over an `Engine` (a real manager behind vLLM's names and
shapes) and the model: requests with shared prefixes, cache salts and LoRA adapters
arrive, are admitted with their prefix hit, prefilled in chunks, decode with lookahead
slots, get preempted when the pool is full, finish; blocks are evicted and the prefix
cache reset in between. `check()` compares the two after every step.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import kvblocks as kb
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
            scheduler = math.lcm(scheduler, g.block_size)
        self.engine = engine_factory(groups, num_blocks, caching, scheduler)
        self.model = self.make_model(groups, num_blocks, scheduler, caching)
        self.num_blocks = num_blocks
        self.waiting: list[Any] = []
        self.running: list[Any] = []
        self.next_id = 0
        self.hits = 0  # tokens reused from the prefix cache, for the statistics
        self.tenant: dict[str, tuple[str | None, int | None]] = {}
        self.history: list[tuple[list[int], tuple[str | None, int | None]]] = []

    def make_model(
        self, groups: list[GroupModel], num_blocks: int, scheduler: int, caching: bool
    ) -> ManagerModel:
        """The model beside the engine (a subclass may model more rules)."""
        return ManagerModel(
            groups,
            num_blocks,
            MAX_MODEL_LEN,
            HBS,
            scheduler,
            caching,
            count_null_block_refs=self.engine.counts_null_block_refs,
        )

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

    def other_holders(self) -> list[int]:
        """References each block has besides the running requests' tables: none here."""
        return [0] * self.num_blocks

    def check(self) -> None:
        for req in self.running + self.waiting:
            rid = req.request_id
            got = self.engine.block_ids(rid)
            want = [list(t) for t in self.model.get_block_ids(rid)]
            assert got == want, f"block table of {rid} differs: {got} != {want}"
        assert self.engine.free_queue() == self.model.pool.queue
        assert self.engine.usage() == self.model.usage()
        held = self.other_holders()
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


class KbEngine(Engine):
    def __init__(
        self, groups: list[GroupModel], num_blocks: int, caching: bool, scheduler: int
    ) -> None:
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
        self.config = config
        self.mgr = kb.KVCacheManager(
            config,
            MAX_MODEL_LEN,
            HBS,
            scheduler_block_size=scheduler,
            enable_caching=caching,
            **self.manager_options(),
        )
        self.hasher = kb.BlockHasher(HBS, "sha256")

    def manager_options(self) -> dict[str, Any]:
        """Further keyword arguments of the manager (a subclass adds its own)."""
        return {}

    def request_options(self) -> dict[str, Any]:
        """Further keyword arguments of each request (a subclass adds its own)."""
        return {}

    def make_request(self, rid: str, tokens: list[int], salt: str | None, lora: int | None) -> Any:
        lora_kw: dict[str, Any] = {}
        if lora is not None:
            lora_kw = {"lora_name": f"lora{lora}", "lora_path": f"/lora{lora}", "lora_id": lora}
        return kb.Request(
            rid, tokens, self.hasher, cache_salt=salt, **lora_kw, **self.request_options()
        )

    def get_computed_blocks(self, req: Any) -> tuple[Any, list[list[int]], int]:
        blocks, hit = self.mgr.get_computed_blocks(req)
        return blocks, [list(ids) for ids in blocks.get_block_ids()], hit

    def free_queue(self) -> list[int]:
        return list(self.mgr.block_pool.get_free_block_ids())

    def ref_cnt(self, block: int) -> int:
        return int(self.mgr.block_pool.get_ref_cnt(block))
