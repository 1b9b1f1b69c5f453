"""Differential test: `kvblocks.BlockPool` against the installed vLLM's (0.32 or 0.33)
`vllm.v1.core.block_pool.BlockPool`, with that release's null-block rule, driven through
the same random sequence of operations (allocate with prefix hits, grow, cache, free in
any order, touch, lookups, evict, reset) with events on. After every step both pools
must agree on the returned ids, the free queue order, every ref count (the null block's
included) and hash, the events, field by field, and the reuse reports of the blocks
released with `unpin_blocks` (the block ids each pool's `on_reuse` callback got, in order).

Needs vLLM (skipped otherwise): run it in a vLLM venv with kvblocks on PYTHONPATH
(`make test-vllm`).
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Literal

import kvblocks as kb
import pytest

pytest.importorskip("vllm")
from kvblocks.vllm._version_rules import rules
from vllm.v1.core.block_pool import BlockPool as VllmBlockPool
from vllm.v1.core.kv_cache_utils import get_block_hash

pytestmark = pytest.mark.vllm

HASH_BLOCK = 4  # tokens per request hash; groups use blocks of 4 or 8 tokens
STEPS = 10_000


@dataclass
class Req:
    """A request as a manager sees it: tokens, hashes at HASH_BLOCK, one group's table."""

    tokens: list[int]
    hashes: list[bytes]
    group: int
    block_size: int
    table: list[int] = field(default_factory=list)
    num_cached: int = 0

    @property
    def k(self) -> int:
        return self.block_size // HASH_BLOCK

    def view(self, i: int) -> bytes:
        """The hash of block i at the group's block size (the last one inside it)."""
        return self.hashes[(i + 1) * self.k - 1]

    def num_full(self) -> int:
        return len(self.hashes) // self.k


class Driver:
    """Both pools plus the shared model of who holds which block."""

    def __init__(
        self,
        seed: int,
        num_blocks: int,
        digest_size: int,
        caching: bool = True,
        medium: Literal["GPU", "CPU", "STORAGE"] = "GPU",
    ) -> None:
        self.rng = random.Random(seed)
        self.caching = caching
        self.n = num_blocks
        self.digest_size = digest_size
        self.vp = VllmBlockPool(
            num_blocks, caching, HASH_BLOCK, enable_kv_cache_events=True, medium=medium
        )
        self.kp = kb.BlockPool(
            num_blocks,
            caching,
            HASH_BLOCK,
            enable_kv_cache_events=True,
            count_null_block_refs=rules().count_null_block_refs,
            medium=medium,
        )
        self.reqs: list[Req] = []
        self.bags: list[list[int]] = []  # extra references taken by bare touches
        # A few shared prompts so that requests hit each other's prefixes.
        # Prompts scale with the pool so that requests mostly fit.
        plen = min(48, 2 * num_blocks)
        self.prompts = [[self.rng.randrange(6) for _ in range(plen)] for _ in range(3)]
        self.calls = 0
        self.seen: Counter[str] = Counter()  # event kinds, hits, duplicate keys
        # The blocks each pool's `on_reuse` callback reported, in call order.
        self.vllm_reused: list[int] = []
        self.kvblocks_reused: list[int] = []

    # ---------------------------------------------------------------- helpers

    def hash_chain(self, tokens: list[int], parent: bytes | None, start: int) -> list[bytes]:
        out: list[bytes] = []
        for s in range(start, len(tokens) - HASH_BLOCK + 1, HASH_BLOCK):
            data = (parent or b"") + bytes(tokens[s : s + HASH_BLOCK])
            parent = hashlib.blake2b(data, digest_size=self.digest_size).digest()
            out.append(parent)
        return out

    def fake_request(self, req: Req) -> SimpleNamespace:
        """What vLLM's cache_full_blocks reads from a Request."""
        return SimpleNamespace(
            block_hashes=req.hashes,
            all_token_ids=req.tokens,
            lora_request=None,
            session_id=None,
            mm_features=[],
            cache_salt=None,
            prompt_embeds=None,
        )

    def vblocks(self, ids: list[int]) -> list[Any]:
        return [self.vp.blocks[i] for i in ids]

    def lookup(self, h: bytes, groups: list[int]) -> list[int] | None:
        got = self.vp.get_cached_block(h, groups)
        mine = self.kp.get_cached_block(h, groups)
        self.calls += 2
        theirs = None if got is None else [b.block_id for b in got]
        assert mine == theirs
        return mine

    def touch(self, ids: list[int]) -> None:
        self.vp.touch(self.vblocks(ids))
        self.kp.touch(ids)
        self.calls += 2

    def free(self, ids: list[int]) -> None:
        self.vp.free_blocks(self.vblocks(ids))
        self.kp.free_blocks(ids)
        self.calls += 2

    def allocate(self, n: int) -> list[int]:
        got = [b.block_id for b in self.vp.get_new_blocks(n)]
        mine = self.kp.get_new_blocks(n)
        self.calls += 2
        assert mine == got
        return mine

    def cache(self, req: Req, num_full: int) -> None:
        if not self.caching:  # vLLM never caches with prefix caching off
            return
        args = (req.num_cached, num_full, req.block_size, req.group)
        self.vp.cache_full_blocks(self.fake_request(req), self.vblocks(req.table), *args)
        self.kp.cache_full_blocks(req.hashes, req.table, *args, req.tokens)
        self.calls += 2
        req.num_cached = max(req.num_cached, num_full)

    def ordered(self, ids: list[int]) -> list[int]:
        """A free order: reversed (as managers do), shuffled, or forward."""
        r = self.rng.random()
        if r < 0.5:
            return ids[::-1]
        if r < 0.8:
            out = ids[:]
            self.rng.shuffle(out)
            return out
        return ids[:]

    # ---------------------------------------------------------------- operations

    def op_new_request(self) -> None:
        rng = self.rng
        prompt = rng.choice(self.prompts)
        tokens = prompt[: rng.randrange(len(prompt) + 1)]
        tokens = tokens + [rng.randrange(6) for _ in range(rng.randrange(1, 12))]
        req = Req(tokens, self.hash_chain(tokens, None, 0), rng.randrange(2), rng.choice([4, 8]))
        hits: list[int] = []
        for i in range(req.num_full() if self.caching else 0):
            groups = [req.group] if rng.random() < 0.8 else [req.group, 1 - req.group]
            got = self.lookup(req.view(i), groups)
            if got is None:
                break
            hits.append(got[0])
            self.seen["hit"] += 1
        if hits:
            self.touch(hits)
        req.table = hits
        req.num_cached = len(hits)
        if not hits and rng.random() < 0.2:
            # Leading null blocks, not yet cached: cache_full_blocks skips them.
            req.table = [0] * rng.randint(1, 2)
        need = max(0, -(-len(tokens) // req.block_size) - len(req.table))
        if need > self.kp.get_num_free_blocks():
            self.free(self.ordered(req.table))
            return
        req.table += self.allocate(need)
        self.cache(req, rng.randint(req.num_cached, req.num_full()))
        self.reqs.append(req)

    def op_grow(self) -> None:
        if not self.reqs:
            return
        req = self.rng.choice(self.reqs)
        tokens = req.tokens + [self.rng.randrange(6) for _ in range(self.rng.randrange(1, 12))]
        need = max(0, -(-len(tokens) // req.block_size) - len(req.table))
        if need > self.kp.get_num_free_blocks():
            return
        parent = req.hashes[-1] if req.hashes else None
        req.hashes += self.hash_chain(tokens, parent, len(req.hashes) * HASH_BLOCK)
        req.tokens = tokens
        req.table += self.allocate(need)
        self.cache(req, req.num_full())

    def op_cache_more(self) -> None:
        if not self.reqs:
            return
        req = self.rng.choice(self.reqs)
        self.cache(req, self.rng.randint(req.num_cached, req.num_full()))

    def op_finish(self) -> None:
        if not self.reqs:
            return
        req = self.reqs.pop(self.rng.randrange(len(self.reqs)))
        self.free(self.ordered(req.table))

    def op_touch_random(self) -> None:
        ids = [self.rng.randrange(self.n) for _ in range(self.rng.randint(1, 4))]
        self.touch(ids)
        self.bags.append(ids)

    def op_free_bag(self) -> None:
        if self.bags:
            bag = self.bags.pop(self.rng.randrange(len(self.bags)))
            self.free(self.ordered(bag))

    def op_unpin_bag(self) -> None:
        """Releases a bag's references with `unpin_blocks` (its null entries, which
        `unpin_blocks` refuses, with `free_blocks`)."""
        if not self.bags:
            return
        bag = self.ordered(self.bags.pop(self.rng.randrange(len(self.bags))))
        real = [b for b in bag if b != 0]
        self.vp.unpin_blocks(self.vblocks(real), lambda b: self.vllm_reused.append(b.block_id))
        self.kp.unpin_blocks(real, self.kvblocks_reused.append)
        self.calls += 2
        self.seen["unpinned"] += len(real)
        if len(real) < len(bag):
            self.free([0] * (len(bag) - len(real)))

    def op_lookup(self) -> None:
        if self.reqs:
            req = self.rng.choice(self.reqs)
            if req.hashes:
                h = self.rng.choice(req.hashes)
                self.lookup(h, self.rng.sample([0, 1], self.rng.randint(1, 2)))

    def op_evict(self) -> None:
        ids = {self.rng.randrange(self.n) for _ in range(self.rng.randint(0, 4))}
        self.vp.evict_blocks(ids)
        self.kp.evict_blocks(ids)
        self.calls += 2

    def op_reset(self) -> None:
        if self.rng.random() < 0.5:  # drain first so that the reset succeeds
            while self.reqs:
                self.op_finish()
            while self.bags:
                self.op_free_bag()
        ok = self.vp.reset_prefix_cache()
        assert self.kp.reset_prefix_cache() is ok
        self.calls += 2

    def op_overdraw(self) -> None:
        n = self.kp.get_num_free_blocks() + 1
        with pytest.raises(ValueError):
            self.vp.get_new_blocks(n)
        with pytest.raises(ValueError):
            self.kp.get_new_blocks(n)
        self.calls += 2

    # ---------------------------------------------------------------- checking

    def check(self) -> None:
        vp, kp = self.vp, self.kp
        assert kp.get_free_block_ids() == [
            b.block_id for b in vp.free_block_queue.get_all_free_blocks()
        ]
        assert kp.get_num_free_blocks() == vp.get_num_free_blocks()
        assert kp.get_usage() == vp.get_usage()
        for blk in vp.blocks:
            assert kp.get_ref_cnt(blk.block_id) == blk.ref_cnt
            h = blk.block_hash
            assert kp.get_block_hash(blk.block_id) == (None if h is None else get_block_hash(h))
        theirs, mine = vp.take_events(), kp.take_events()
        assert len(mine) == len(theirs)
        for a, b in zip(theirs, mine, strict=True):
            assert type(a).__name__ == type(b).__name__
            for name in type(a).__struct_fields__:
                assert getattr(b, name) == getattr(a, name), (name, a, b)
        self.seen.update(type(e).__name__ for e in mine)
        assert self.kvblocks_reused == self.vllm_reused
        self.seen["reused"] += len(self.kvblocks_reused)
        self.kvblocks_reused.clear()
        self.vllm_reused.clear()

    def run(self, steps: int) -> None:
        ops = [
            (self.op_new_request, 30),
            (self.op_grow, 10),
            (self.op_cache_more, 6),
            (self.op_finish, 22),
            (self.op_touch_random, 8),
            (self.op_free_bag, 6),
            (self.op_unpin_bag, 4),
            (self.op_lookup, 8),
            (self.op_evict, 6),
            (self.op_reset, 1),
            (self.op_overdraw, 1),
        ]
        funcs = [f for f, _ in ops]
        weights = [w for _, w in ops]
        for _ in range(steps):
            self.rng.choices(funcs, weights)[0]()
            self.check()


@pytest.mark.parametrize(
    ("seed", "num_blocks", "digest_size", "medium"),
    [(0, 9, 32, "GPU"), (1, 17, 32, "CPU"), (2, 33, 16, "GPU"), (3, 64, 32, "STORAGE")],
)
def test_same_as_vllm(
    seed: int, num_blocks: int, digest_size: int, medium: Literal["GPU", "CPU", "STORAGE"]
) -> None:
    driver = Driver(seed, num_blocks, digest_size, medium=medium)
    driver.run(STEPS)
    # The run must have exercised hits, caching, eviction and resets, not only idled.
    seen = driver.seen
    assert min(seen["BlockStored"], seen["BlockRemoved"]) > STEPS // 20
    assert seen["hit"] > STEPS // 100
    assert seen["AllBlocksCleared"] > 0
    assert seen["reused"] > STEPS // 100
    print(f"seed={seed} blocks={num_blocks}: {STEPS} steps, {driver.calls} calls, {dict(seen)}")


def test_same_as_vllm_caching_off() -> None:
    driver = Driver(4, 17, 32, caching=False)
    driver.run(STEPS)
    assert driver.seen["BlockStored"] == driver.seen["BlockRemoved"] == 0
    assert driver.seen["AllBlocksCleared"] > 0
    assert driver.seen["reused"] > 0
    print(f"caching off, blocks=17: {STEPS} steps, {driver.calls} calls, {dict(driver.seen)}")
