"""A plain-Python reference model of vLLM 0.33.0's KV cache rules, written from the
semantics reference (sections 3, 4.8, 4.9, 5, 6.3), independent of kvblocks' code.

It uses kvblocks only to read a request's block hashes (the hashing itself is checked
against vLLM elsewhere). Everything else — the free queue, ref counts, the prefix map,
events, the managers' hit search, allocation and freeing — is re-derived here in the
simplest possible Python, so that a side-by-side state machine can compare the two.
"""

from __future__ import annotations

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
    """BlockPool (section 3): a list as the free queue, a dict of lists as the map."""

    def __init__(self, num_blocks: int, enable_caching: bool = True, events: bool = False) -> None:
        if num_blocks < 1:
            raise ValueError("num_gpu_blocks must be positive")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.events_on = events
        self.ref_cnt = [0] * num_blocks
        self.hash_of: list[Key | None] = [None] * num_blocks
        self.queue: list[int] = list(range(1, num_blocks))  # the null block is popped
        self.map: dict[Key, list[int]] = {}
        self.events: list[Event] = []

    # --- queries -------------------------------------------------------------------
    def num_free(self) -> int:
        return len(self.queue)

    def usage(self) -> float:
        total = self.num_blocks - 1
        return 0.0 if total == 0 else 1.0 - len(self.queue) / total

    def cached_block(self, block_hash: bytes, group: int) -> int | None:
        blocks = self.map.get((block_hash, group))
        return blocks[0] if blocks else None

    def get_cached_block(self, block_hash: bytes, groups: list[int]) -> list[int] | None:
        out = [self.cached_block(block_hash, g) for g in groups]
        return None if any(b is None for b in out) else [b for b in out if b is not None]

    def _check(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block id {block} out of range")

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
        if n < 0 or n > len(self.queue):
            raise ValueError(f"cannot get {n} free blocks")
        out, self.queue = self.queue[:n], self.queue[n:]
        for b in out:
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
                continue
            if self.ref_cnt[b] == 0:
                self.queue.remove(b)
            self.ref_cnt[b] += 1

    def free_blocks(self, blocks: list[int]) -> None:
        counts = list(self.ref_cnt)
        first: list[int] = []
        last: list[int] = []
        for b in blocks:
            self._check(b)
            if b == NULL_BLOCK:
                continue
            if counts[b] == 0:
                raise ValueError(f"double free of block {b}")
            counts[b] -= 1
            if counts[b] == 0:
                (last if self.enable_caching and self.hash_of[b] else first).append(b)
        self.ref_cnt = counts
        self.queue = first + self.queue + last

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
        for b in blocks[num_cached:num_full]:
            self._check(b)
            if b != NULL_BLOCK and (self.hash_of[b] is not None or b in seen):
                raise ValueError(f"block {b} is already cached or listed twice")
            seen.add(b)
        stored: list[int] = []
        for i in range(num_cached, num_full):
            b = blocks[i]
            if b == NULL_BLOCK:
                continue
            key = (hashes[(i + 1) * k - 1], group)
            self.hash_of[b] = key
            self.map.setdefault(key, []).append(b)
            stored.append(external(key[0]))
        if self.events_on:
            parent = external(hashes[num_cached * k - 1]) if num_cached else None
            toks = (tokens or [])[num_cached * block_size : num_full * block_size]
            self.events.append(("stored", stored, parent, toks, block_size, group))

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
