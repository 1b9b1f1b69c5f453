"""The KV-aware routing rules, shared by the simulated fleet (`kvblocks.sim.fleet`) and the
Ray Serve router (`kvblocks.router.ray`): from each engine's hit (in blocks) on a request,
the score that decides before load, or none when load alone decides.

- Dynamo's cost (``load_weight > 0``): ``blocks to prefill (the request's blocks minus
  the engine's hit) + load_weight * active blocks`` (the blocks of the engine's running
  and waiting requests); the lowest cost wins, load breaks ties.
- SGLang's cache-threshold rule (``load_weight == 0``): when the longest hit covers more
  than ``cache_threshold`` of the request's blocks, the longest hit wins (load breaks
  ties); otherwise the least loaded engine (the longer hit breaks ties).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvblocks._core import InvalidArgumentError

__all__ = ["DEFAULT_CACHE_THRESHOLD", "DEFAULT_KV_AWARE_WEIGHT", "route_scores"]

DEFAULT_KV_AWARE_WEIGHT = 1.0
"""The weight of an engine's active blocks in Dynamo's cost, unless given."""

DEFAULT_CACHE_THRESHOLD = 0.3
"""The cached share of a request's blocks above which it follows its prefix (the SGLang
Model Gateway's ``cache_threshold`` default)."""


def route_scores(
    match_blocks: Sequence[int],
    num_blocks: int,
    *,
    load_weight: float,
    cache_threshold: float,
    active_blocks: Sequence[float] | None = None,
) -> list[float] | None:
    """Each engine's score for a request (lower is better; load breaks ties), or None
    when the request goes to the least loaded engine (its hit breaking ties).

    Args:
        match_blocks: Each engine's hit on the request, in blocks.
        num_blocks: The request's blocks.
        load_weight: Dynamo's weight of active blocks; 0 = the cache-threshold rule.
        cache_threshold: The threshold rule's share of the request's blocks.
        active_blocks: Each engine's active blocks (required when ``load_weight > 0``).
    """
    if load_weight < 0 or not 0 <= cache_threshold <= 1:
        raise InvalidArgumentError(
            f"load_weight must be >= 0 and cache_threshold in [0, 1], got {load_weight} "
            f"and {cache_threshold}"
        )
    if load_weight == 0:
        if max(match_blocks, default=0) <= cache_threshold * num_blocks:
            return None
        return [-float(m) for m in match_blocks]
    if active_blocks is None or len(active_blocks) != len(match_blocks):
        raise InvalidArgumentError("Dynamo's cost needs every engine's active blocks")
    return [
        num_blocks - m + load_weight * a for m, a in zip(match_blocks, active_blocks, strict=True)
    ]
