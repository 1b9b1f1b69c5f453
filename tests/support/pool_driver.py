"""Driving a `kvblocks.BlockPool` the way the managers drive one (prefix hit, touch,
allocate, cache full blocks), beside a plain-Python pool model, over two groups with
different block sizes. Shared by the pool state machines of
tests/core/test_block_pool_model.py and tests/retention/test_retention_model.py.
"""

from __future__ import annotations

from typing import Any

import kvblocks as kb
from model import PoolModel

HBS = 4
GROUP_BLOCK_SIZES = (HBS, 2 * HBS)  # group 1 uses every second hash
PREFIXES = [[7] * 8, [1, 2, 3, 4, 5, 6, 7, 8, 9], []]


class PoolDriving:
    """Mixed into a hypothesis machine that holds `pool` and `model` and calls both through
    its own `both(name, *args)` (equal results, or both refuse and change nothing).

    A live request (`live`) has `req`, a `kb.Request`, and per group its block table
    (`tables`) and how many of its blocks are cached (`num_cached`).
    """

    pool: kb.BlockPool
    model: PoolModel

    def both(self, name: str, *args: Any) -> Any:
        """Supplied by the machine."""
        raise NotImplementedError

    def get_new_blocks(self, n: int) -> list[int]:
        new = self.both("get_new_blocks", n)
        assert isinstance(new, list)
        return new

    def hits(self, req: kb.Request, group: int) -> list[int]:
        """The request's prefix-cache hit in `group`, the same on both sides."""
        bs = GROUP_BLOCK_SIZES[group]
        k = bs // HBS
        out: list[int] = []
        for h in req.block_hashes[k - 1 :: k][: (req.num_tokens - 1) // bs]:
            got = self.pool.get_cached_block(h, [group])
            assert got == self.model.get_cached_block(h, [group])
            if got is None:
                break
            out.extend(got)
        return out

    def need(self, live: Any, group: int) -> int:
        """Blocks the request's table in `group` lacks for all its tokens."""
        return -(-live.req.num_tokens // GROUP_BLOCK_SIZES[group]) - len(live.tables[group])

    def grow(self, live: Any) -> None:
        """Allocates the blocks each table lacks, then caches the full ones."""
        for g, bs in enumerate(GROUP_BLOCK_SIZES):
            live.tables[g].extend(self.get_new_blocks(self.need(live, g)))
            if not self.model.enable_caching:
                continue
            full = live.req.num_tokens // bs
            self.both(
                "cache_full_blocks",
                live.req.block_hashes,
                live.tables[g],
                live.num_cached[g],
                full,
                bs,
                g,
                live.req.all_token_ids,
            )
            live.num_cached[g] = max(live.num_cached[g], full)

    def admit(self, live: Any) -> bool:
        """A new request takes its prefix hits (touched) and the blocks it lacks, unless
        they do not fit (then the scheduler would not admit it: False)."""
        req = live.req
        hits = [self.hits(req, g) if self.model.enable_caching else [] for g in (0, 1)]
        reused = {b for h in hits for b in h if self.model.ref_cnt[b] == 0}
        needed = sum(
            -(-req.num_tokens // bs) - len(h)
            for bs, h in zip(GROUP_BLOCK_SIZES, hits, strict=False)
        )
        if needed > self.model.num_free() - len(reused):
            return False
        for g in (0, 1):
            self.both("touch", hits[g])
            live.tables[g] = list(hits[g])
            live.num_cached[g] = len(hits[g])
        self.grow(live)
        return True
