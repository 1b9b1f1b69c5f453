"""Two ceilings on the prefix hit rate of a run: an infinite cache and Belady's.

Both replay the run's own sequence of prefix-cache events, in the order the scheduler
loop made them:

* a **store** when ``allocate_slots`` succeeds: the request's full blocks up to its
  computed-plus-scheduled tokens enter the cache (vLLM caches blocks at allocation);
* a **lookup** when a request is admitted for the first time: the longest prefix of its
  blocks found in the cache, at most ``(num_tokens - 1) // block_size`` blocks (vLLM
  always recomputes the last token).

The **infinite cache** keeps every block ever stored. **Belady's cache** holds as many
blocks as the real one and, when full, evicts the block whose next lookup is farthest in
the future (a block that nothing looks up again first; of two blocks the same lookup
wants next, the later one in it); a stored block whose own next lookup is the farthest is
not kept at all. Hits need whole prefixes, so Belady's rule is a strong policy here
rather than a proven optimum. Blocks are identified by a hash chain over the
tokens (:func:`block_keys`), in the full-attention view: a block hits when it and every
block before it were stored, whatever the model's other attention groups do.

The log, the infinite cache and Belady's pass run in the extension
(``kvblocks._core.CeilingLog``, ``src/ceilings.rs``): a Mooncake-sized trace logs about
18 M block keys, too many for a Python heap.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from kvblocks import _core

__all__ = ["CeilingResult", "Ceilings", "belady_hits", "block_keys"]

_LOOKUP = 1
_STORE = 0


def block_keys(tokens: Sequence[int], block_size: int, salt: str | None = None) -> list[int]:
    """One key per full block of ``tokens``; equal keys mean equal prefixes.

    Key ``i`` is xxh3-64 of block ``i``'s tokens seeded with key ``i - 1`` (the first
    block's seed hashes the cache salt, as vLLM's extra key), so the keys of two token
    lists agree exactly up to their first differing block, in every process; a collision
    needs about 2**32 blocks. Tokens are ints in ``u32`` range.
    """
    return _core.ceiling_block_keys(tokens, block_size, salt)


@dataclass
class CeilingResult:
    """Hit tokens of the first admissions under each ceiling, per tenant too.

    Attributes:
        queried_tokens: Tokens of the first admissions (as the run's prefix hit rate).
        infinite_hit_tokens: Hits had every stored block been kept.
        ideal_hit_tokens: Hits of Belady's cache of the same size.
        tenants: Per cache salt (``""`` for none): ``[requests, queried, hit, infinite,
            ideal]`` tokens (``hit``: the real cache's).
    """

    queried_tokens: int
    infinite_hit_tokens: int
    ideal_hit_tokens: int
    tenants: dict[str, list[int]]

    @property
    def infinite_hit_rate(self) -> float:
        """``infinite_hit_tokens / queried_tokens`` (0 when nothing was queried)."""
        return _rate(self.infinite_hit_tokens, self.queried_tokens)

    @property
    def ideal_hit_rate(self) -> float:
        """``ideal_hit_tokens / queried_tokens`` (0 when nothing was queried)."""
        return _rate(self.ideal_hit_tokens, self.queried_tokens)


def _rate(hits: int, queried: int) -> float:
    return hits / queried if queried else 0.0


class Ceilings:
    """Records a run's stores and first-admission lookups (see the module docs).

    Args:
        block_size: Tokens per block (the hit granularity of the real cache).
        capacity: Blocks the real cache holds (for Belady's).
    """

    def __init__(self, block_size: int, capacity: int) -> None:
        self.block_size = block_size
        self.capacity = capacity
        self._log = _core.CeilingLog()
        self._lookups: list[tuple[int, int, int]] = []  # (tenant, queried, real hit)
        self._infinite: array[int] = array("q")  # hit blocks per lookup
        self._tenants: dict[str, int] = {}

    def store(self, keys: Sequence[int]) -> None:
        """Blocks that entered the cache, in block order."""
        if keys:
            self._log.store(keys)

    def lookup(
        self, keys: Sequence[int], num_tokens: int, tenant: str | None = None, hit: int = 0
    ) -> int:
        """A first admission of a request of ``num_tokens`` tokens whose full blocks have
        ``keys`` and that the real cache hit ``hit`` tokens of; returns the infinite cache's
        hit in tokens."""
        hits = self._log.lookup(keys[: (num_tokens - 1) // self.block_size])
        t = self._tenants.setdefault(tenant or "", len(self._tenants))
        self._lookups.append((t, num_tokens, hit))
        self._infinite.append(hits)
        return hits * self.block_size

    def result(self) -> CeilingResult:
        """Both ceilings over everything recorded so far (Belady's is computed here)."""
        ideal = self._log.belady(max(self.capacity, 0))
        bs = self.block_size
        names = list(self._tenants)
        per = [[0, 0, 0, 0, 0] for _ in names]
        lookups = zip(self._lookups, self._infinite, ideal, strict=True)
        for (t, queried, hit), inf, opt in lookups:
            row = per[t]
            row[0] += 1
            row[1] += queried
            row[2] += hit
            row[3] += inf * bs
            row[4] += opt * bs
        return CeilingResult(
            sum(r[1] for r in per),
            sum(r[3] for r in per),
            sum(r[4] for r in per),
            dict(zip(names, per, strict=True)),
        )


def belady_hits(log: Sequence[tuple[int, list[int]]], capacity: int) -> list[int]:
    """Hit blocks of every lookup in ``log`` under Belady's rule with ``capacity`` blocks.

    ``log`` holds ``(0, keys)`` for a store and ``(1, keys)`` for a lookup, in event order.
    A key's next use is the next lookup that lists it; of two keys next used by the same
    lookup, the one later in it goes first (a hit needs every block before it). Next uses
    are found in one backward pass, the farthest cached key by a heap with lazy deletion.
    """
    rec = _core.CeilingLog()
    for kind, keys in log:
        if kind == _LOOKUP:
            rec.lookup(keys)
        else:
            rec.store(keys)
    return rec.belady(max(capacity, 0))
