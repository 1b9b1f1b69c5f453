"""A plain-Python reference model of vLLM 0.33.0's KV cache rules (the pool, full attention,
sliding window, the coordinators and `allocate_slots`; see docs/ARCHITECTURE.md), written
independently of kvblocks' code.

It uses kvblocks only to read a request's block hashes (the hashing itself is checked
against vLLM elsewhere). Everything else — the free queue, ref counts, the prefix map,
events, the managers' hit search, allocation and freeing — is re-derived here in the
simplest possible Python, so that a side-by-side state machine can compare the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MASK64 = (1 << 64) - 1
NULL_BLOCK = 0

Key = tuple[bytes, int]
"""A prefix-cache key: (block hash digest, group id)."""

Event = tuple[object, ...]
"""('stored', hashes, parent, tokens, block_size, group) | ('removed', hashes, group) |
('cleared',): the fields the model predicts, hashes in external (int) form."""


def external(block_hash: bytes) -> int:
    """The hash as vLLM's events publish it: the low 64 bits, big-endian."""
    return int.from_bytes(block_hash, "big") & MASK64


class PoolModel:
    """BlockPool: a list as the free queue, a dict of lists as the map. With
    `count_null_refs` (vLLM 0.32) touch and free count the null block's `ref_cnt[0]`."""

    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool = True,
        events: bool = False,
        count_null_refs: bool = False,
    ) -> None:
        if num_blocks < 1:
            raise ValueError("num_gpu_blocks must be positive")
        self.count_null_refs = count_null_refs
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.events_on = events
        self.ref_cnt = [0] * num_blocks
        self.hash_of: list[Key | None] = [None] * num_blocks
        self.hash_tokens = [0] * num_blocks  # tokens a block's key covers
        self.queue: list[int] = list(range(1, num_blocks))  # the null block is popped
        self.map: dict[Key, list[int]] = {}
        self.events: list[Event] = []

    # --- queries -------------------------------------------------------------------
    def num_free(self) -> int:
        return len(self.queue)

    def usage(self) -> float:
        total = self.num_blocks - 1
        return 0.0 if total == 0 else 1.0 - self.num_free() / total

    def cached_block(self, block_hash: bytes, group: int) -> int | None:
        blocks = self.map.get((block_hash, group))
        return blocks[0] if blocks else None

    def get_cached_block(self, block_hash: bytes, groups: list[int]) -> list[int] | None:
        out = [self.cached_block(block_hash, g) for g in groups]
        return None if any(b is None for b in out) else [b for b in out if b is not None]

    def _check(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block id {block} out of range")

    def _is_cached(self, block: int) -> bool:
        return self.enable_caching and self.hash_of[block] is not None

    # --- the free queue (a subclass may keep several free lists) --------------------
    def _unlink(self, block: int) -> None:
        """Takes a free block out of the free queue."""
        self.queue.remove(block)

    def _return_free(self, released: list[int]) -> None:
        """Blocks whose last reference a free dropped, in the free's order: the uncached
        ones go to the head of the queue, the cached ones to its tail."""
        cached = [b for b in released if self._is_cached(b)]
        self.queue = [b for b in released if not self._is_cached(b)] + self.queue + cached

    # --- mutators (each validates fully before changing anything) ------------------
    def _evict(self, block: int) -> None:
        key = self.hash_of[block]
        if key is None:
            return
        self.hash_of[block] = None
        blocks = self.map[key]
        blocks.remove(block)
        if not blocks:
            del self.map[key]
        if self.events_on:
            self.events.append(("removed", [external(key[0])], key[1]))

    def get_new_blocks(self, n: int) -> list[int]:
        if n < 0 or n > self.num_free():
            raise ValueError(f"cannot get {n} free blocks")
        out = self.queue[:n]
        for b in out:
            self._unlink(b)
            if self.enable_caching:
                self._evict(b)
            assert self.ref_cnt[b] == 0
            self.ref_cnt[b] = 1
        return out

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            self._check(b)
        for b in blocks:
            if b == NULL_BLOCK:
                self.ref_cnt[b] += self.count_null_refs
                continue
            if self.ref_cnt[b] == 0:
                self._unlink(b)
            self.ref_cnt[b] += 1

    def _drop_refs(self, blocks: list[int]) -> list[int]:
        """Checks the whole free first, then drops one reference per listed block; returns
        the blocks whose last reference dropped, in the free's order."""
        counts = list(self.ref_cnt)
        released: list[int] = []
        for b in blocks:
            self._check(b)
            if b == NULL_BLOCK:
                counts[b] -= self.count_null_refs
                continue
            if counts[b] == 0:
                raise ValueError(f"double free of block {b}")
            counts[b] -= 1
            if counts[b] == 0:
                released.append(b)
        self.ref_cnt = counts
        return released

    def free_blocks(self, blocks: list[int]) -> None:
        self._return_free(self._drop_refs(blocks))

    def cache_full_blocks(
        self,
        hashes: list[bytes],
        blocks: list[int],
        num_cached: int,
        num_full: int,
        block_size: int,
        group: int,
        hash_block_size: int,
        tokens: list[int] | None = None,
    ) -> None:
        if num_cached >= num_full:
            return
        if block_size <= 0 or block_size % hash_block_size:
            raise ValueError("block_size is not a multiple of hash_block_size")
        k = block_size // hash_block_size
        if num_full > len(blocks) or num_full > len(hashes) // k:
            raise ValueError("num_full_blocks exceeds the request")
        seen: set[int] = set()
        for i in range(num_cached, num_full):
            b = blocks[i]
            self._check(b)
            if b == NULL_BLOCK:
                continue
            # A block is cached once, except a partial entry (its key ends inside the
            # block) promoted to the full one.
            covered = self.hash_tokens[b]
            promotable = covered % block_size != 0 and covered < (i + 1) * block_size
            if b in seen or (self.hash_of[b] is not None and not promotable):
                raise ValueError(f"block {b} is already cached or listed twice")
            seen.add(b)
        stored: list[int] = []
        for i in range(num_cached, num_full):
            b = blocks[i]
            if b == NULL_BLOCK:
                continue
            key = (hashes[(i + 1) * k - 1], group)
            self._evict(b)
            self.hash_of[b] = key
            self.hash_tokens[b] = (i + 1) * block_size
            self.map.setdefault(key, []).append(b)
            self._on_cached(b)
            stored.append(external(key[0]))
        if self.events_on:
            parent = external(hashes[num_cached * k - 1]) if num_cached else None
            toks = (tokens or [])[num_cached * block_size : num_full * block_size]
            self.events.append(("stored", stored, parent, toks, block_size, group))

    def _on_cached(self, block: int) -> None:
        """`block` now carries its key in the prefix map (a subclass may react)."""

    def evict_blocks(self, blocks: list[int]) -> None:
        for b in blocks:
            self._check(b)
        for b in blocks:
            self._evict(b)

    def reset_prefix_cache(self) -> bool:
        if self.num_blocks - len(self.queue) != 1:
            return False
        self.map = {}
        self.hash_of = [None] * self.num_blocks
        if self.events_on:
            self.events.append(("cleared",))
        return True

    def take_events(self) -> list[Event]:
        out, self.events = self.events, []
        return out


def event_tuple(event: Any) -> Event:
    """A kvblocks event object in the model's tuple form."""
    name = type(event).__name__
    if name == "BlockStored":
        return (
            "stored",
            list(event.block_hashes),
            event.parent_block_hash,
            list(event.token_ids),
            event.block_size,
            event.group_idx,
        )
    if name == "BlockRemoved":
        return ("removed", list(event.block_hashes), event.group_idx)
    return ("cleared",)


def pool_state(pool: Any) -> tuple[object, ...]:
    """Everything observable about a `kb.BlockPool` or a `PoolModel`, in one value."""
    if isinstance(pool, PoolModel):
        return (
            list(pool.queue),
            list(pool.ref_cnt),
            [k[0] if k else None for k in pool.hash_of],
            pool.usage(),
        )
    n = pool.num_gpu_blocks
    return (
        pool.get_free_block_ids(),
        [pool.get_ref_cnt(b) for b in range(n)],
        [pool.get_block_hash(b) for b in range(n)],
        pool.get_usage(),
    )


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class GroupModel:
    """One KV cache group: full attention, or a sliding window of `sliding_window` tokens."""

    block_size: int
    sliding_window: int | None = None

    def skipped_tokens(self, num_computed: int) -> int:
        """Tokens before the window of the next token."""
        if self.sliding_window is None:
            return 0
        return max(0, num_computed - self.sliding_window + 1)


class ManagerModel:
    """KVCacheManager for full-attention and sliding-window
    groups, dense SWA retention, no EAGLE, no KV connector, no watermark.

    Requests are read through `request_id`, `num_tokens`, `num_computed_tokens` and
    `block_hashes` (at `hash_block_size`); the caller plays the scheduler. With
    `count_null_block_refs` the null block's references are counted (vLLM 0.32): a freed
    table hands over its null entries too.
    """

    def __init__(
        self,
        groups: list[GroupModel],
        num_blocks: int,
        max_model_len: int,
        hash_block_size: int,
        scheduler_block_size: int,
        enable_caching: bool = True,
        count_null_block_refs: bool = False,
    ) -> None:
        self.groups = groups
        self.pool = PoolModel(num_blocks, enable_caching, count_null_refs=count_null_block_refs)
        self.max_model_len = max_model_len
        self.hash_block_size = hash_block_size
        self.scheduler_block_size = scheduler_block_size
        self.caching = enable_caching
        self.hybrid = len(groups) > 1
        self.tables: list[dict[str, list[int]]] = [{} for _ in groups]
        self.num_cached: list[dict[str, int]] = [{} for _ in groups]
        # Spec groups: equal specs share one lookup; full attention first (5.5).
        specs: dict[GroupModel, list[int]] = {}
        for gid, g in enumerate(groups):
            specs.setdefault(g, []).append(gid)
        self.spec_groups = sorted(specs.items(), key=lambda kv: kv[0].sliding_window is not None)

    # --- lookups --------------------------------------------------------------------
    def _hashes(self, hashes: list[bytes], block_size: int) -> list[bytes]:
        k = block_size // self.hash_block_size
        return hashes[k - 1 :: k]

    def _lookup(self, block_hash: bytes, gids: list[int]) -> list[int] | None:
        return self.pool.get_cached_block(block_hash, gids)

    def _find_full(
        self, hashes: list[bytes], max_length: int, gids: list[int], bs: int, align: int
    ) -> tuple[list[list[int]], int]:
        lists: list[list[int]] = [[] for _ in gids]
        for h in self._hashes(hashes, bs)[: max_length // bs]:
            got = self._lookup(h, gids)
            if got is None:
                break
            for lst, b in zip(lists, got, strict=False):
                lst.append(b)
        hit = len(lists[0]) * bs
        hit -= hit % align
        return [lst[: cdiv(hit, bs)] for lst in lists], hit

    def _find_swa(
        self, hashes: list[bytes], max_length: int, gids: list[int], g: GroupModel, align: int
    ) -> tuple[list[list[int]], int]:
        bs, window = g.block_size, g.sliding_window
        assert window is not None
        need = cdiv(window - 1, bs)
        view = self._hashes(hashes, bs)
        m = max_length // bs
        lists = [[NULL_BLOCK] * m for _ in gids]
        run = 0
        found = False
        for i in range(m - 1, -1, -1):
            got = self._lookup(view[i], gids)
            if got is None:
                run = 0
                continue
            if run == 0 and bs != align and ((i + 1) * bs) % align:
                continue
            for lst, b in zip(lists, got, strict=False):
                lst[i] = b
            run += 1
            if run >= need:
                lists = [lst[: i + run] for lst in lists]
                found = True
                break
        if not found:
            lists = [lst[:run] for lst in lists]
            while bs != align and len(lists[0]) * bs % align:
                lists = [lst[:-1] for lst in lists]
        return lists, len(lists[0]) * bs

    def _find(
        self, hashes: list[bytes], max_length: int, g: GroupModel, gids: list[int], align: int
    ) -> tuple[list[list[int]], int]:
        if g.sliding_window is None:
            return self._find_full(hashes, max_length, gids, g.block_size, align)
        return self._find_swa(hashes, max_length, gids, g, align)

    def get_computed_blocks(self, req: Any) -> tuple[list[list[int]], int]:
        """Per-group hit blocks and the hit length in tokens (no ref count changes)."""
        empty: list[list[int]] = [[] for _ in self.groups]
        if not self.caching or req.skip_reading_prefix_cache:
            return empty, 0
        hashes = list(req.block_hashes)
        max_len = req.num_tokens - 1
        if not self.hybrid:
            g = self.groups[0]
            lists, hit = self._find(hashes, max_len, g, [0], g.block_size)
            return lists, hit
        out = list(empty)
        hit_length = max_len
        fa_done: dict[int, int] = {}
        align = self.scheduler_block_size
        while True:
            curr = hit_length
            for idx, (g, gids) in enumerate(self.spec_groups):
                if g.sliding_window is None and idx in fa_done:
                    curr = min(curr, fa_done[idx])
                    continue
                lists, length = self._find(hashes, curr, g, gids, align)
                curr = length
                if g.sliding_window is None:
                    fa_done[idx] = length
                for gid, lst in zip(gids, lists, strict=False):
                    out[gid] = lst
            if curr >= hit_length:
                break
            hit_length = curr
            if len(self.spec_groups) == 2 and self.spec_groups[0][0].sliding_window is None:
                break
        for g, gids in self.spec_groups:
            if g.sliding_window is None:
                for gid in gids:
                    out[gid] = out[gid][: cdiv(hit_length, g.block_size)]
        return out, hit_length

    # --- allocation -----------------------------------------------------------------
    def _num_to_allocate(
        self, gid: int, rid: str, num_tokens: int, hits: list[int], total_computed: int
    ) -> int:
        g = self.groups[gid]
        required = cdiv(num_tokens, g.block_size)
        table = self.tables[gid].get(rid, [])
        if rid in self.num_cached[gid]:
            return max(required - len(table), 0)
        skipped = g.skipped_tokens(total_computed) // g.block_size
        new = max(required - max(skipped, len(hits) + len(table)), 0)
        evictable = sum(
            1
            for b in hits[max(0, skipped - len(table)) :]
            if b != NULL_BLOCK and self.pool.ref_cnt[b] == 0
        )
        return new + evictable

    def _remove_skipped(self, rid: str, num_computed: int) -> None:
        for gid, g in enumerate(self.groups):
            skipped = g.skipped_tokens(num_computed)
            if skipped <= 0:
                continue
            table = self.tables[gid].setdefault(rid, [])
            removed: list[int] = []
            for i in range(min(skipped // g.block_size, len(table)) - 1, -1, -1):
                if table[i] == NULL_BLOCK:
                    break
                removed.append(table[i])
                table[i] = NULL_BLOCK
            self._free_blocks(rid, removed)

    def _cache(self, req: Any, num_tokens: int) -> None:
        hashes = list(req.block_hashes)
        for gid, g in enumerate(self.groups):
            n = num_tokens - num_tokens % self.scheduler_block_size if self.hybrid else num_tokens
            num_cached = self.num_cached[gid].get(req.request_id, 0)
            num_full = min(n, len(hashes) * self.hash_block_size) // g.block_size
            if num_cached >= num_full:
                continue
            table = self.tables[gid][req.request_id]
            self.pool.cache_full_blocks(
                hashes, table, num_cached, num_full, g.block_size, gid, self.hash_block_size
            )
            self.num_cached[gid][req.request_id] = num_full

    def allocate_slots(
        self,
        req: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed: list[list[int]] | None = None,
        num_lookahead_tokens: int = 0,
    ) -> list[list[int]] | None:
        """The new blocks per group, or None if they do not fit."""
        if num_new_tokens == 0 and num_new_computed_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0")
        rid = req.request_id
        hits = new_computed if new_computed is not None else [[] for _ in self.groups]
        local = req.num_computed_tokens + num_new_computed_tokens
        total = min(local, self.max_model_len)
        main = total + num_new_tokens
        need_slots = min(main + num_lookahead_tokens, self.max_model_len)
        self._remove_skipped(rid, total)
        n = sum(
            self._num_to_allocate(gid, rid, need_slots, hits[gid], local)
            for gid in range(len(self.groups))
        )
        if n > self.pool.num_free():
            return None
        if any(hits) and not any(rid in nc for nc in self.num_cached):
            for gid, g in enumerate(self.groups):
                skipped = g.skipped_tokens(local) // g.block_size
                kept = hits[gid][skipped:]
                self.pool.touch(kept)
                table = self.tables[gid].setdefault(rid, [])
                table.extend([NULL_BLOCK] * skipped + kept)
                self.num_cached[gid][rid] = len(table)
        new_blocks: list[list[int]] = []
        for gid, g in enumerate(self.groups):
            table = self.tables[gid].setdefault(rid, [])
            k = cdiv(need_slots, g.block_size) - len(table)
            got = self.pool.get_new_blocks(k) if k > 0 else []
            table.extend(got)
            new_blocks.append(got)
        if self.caching:
            self._cache(req, min(total + num_new_tokens, req.num_tokens))
        return new_blocks

    def _free_blocks(self, rid: str, blocks: list[int]) -> None:
        """Gives the request's blocks back to the pool (a subclass may tag the free)."""
        self.pool.free_blocks(blocks)

    def free(self, rid: str) -> None:
        for gid in range(len(self.groups)):
            table = self.tables[gid].pop(rid, [])
            self.num_cached[gid].pop(rid, None)
            self._free_blocks(rid, table[::-1])

    def get_block_ids(self, rid: str) -> tuple[list[int], ...]:
        return tuple(list(t.get(rid, [])) for t in self.tables)

    def usage(self) -> float:
        return self.pool.usage()
