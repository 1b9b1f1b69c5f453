"""vLLM's KV cache metrics collector (`KVCacheMetricsCollector`) on kvblocks.vllm's
manager.

The core records the calls vLLM 0.33's `BlockPool` makes on its collector (each block
handed out, evicted first when caching is on; each block a hit touches; each block named
to `evict_blocks`; `src/pool/metrics.rs`) when the manager is built with
`record_block_metrics=True`. Each manager call that can make them is wrapped, on this
manager only, to hand them to the collector in order right after the call returns, so
the collector samples (`random.random()` per allocation) exactly as under vLLM's
manager. A manager without a collector has none of this: no wrapper, no recording.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: The collector method of each op code of the core's record (`take_block_metrics`).
_CALLS = ("on_block_allocated", "on_block_accessed", "on_block_evicted")


def attach(manager: Any, collector: Any) -> None:
    """Hands `manager`'s recorded pool calls to `collector` after each call that makes
    them (`allocate_slots`, `evict_blocks`, the pool view's `get_new_blocks`, `touch` and
    `evict_blocks`), and resets the collector when `reset_prefix_cache` succeeds, as
    vLLM's pool does.

    Args:
        manager: a `kvblocks.vllm.KVCacheManager` built with `record_block_metrics=True`.
        collector: vLLM's `KVCacheMetricsCollector` (or any object with its
            `on_block_allocated`, `on_block_accessed`, `on_block_evicted` and `reset`).
    """

    def replay() -> None:
        ops = manager.take_block_metrics()
        if ops:
            blocks = manager.block_objects([block_id for _, block_id in ops])
            for (op, _), block in zip(ops, blocks, strict=True):
                # Looked up per call, as vLLM's pool does.
                getattr(collector, _CALLS[op])(block)

    def replaying(call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            result = call(*args, **kwargs)
            replay()
            return result

        return wrapped

    reset = manager.reset_prefix_cache

    def reset_prefix_cache() -> bool:
        ok: bool = reset()
        if ok:
            collector.reset()
        return ok

    manager.allocate_slots = replaying(manager.allocate_slots)
    manager.evict_blocks = replaying(manager.evict_blocks)
    manager.reset_prefix_cache = reset_prefix_cache
    pool = manager.block_pool
    for name in ("get_new_blocks", "touch", "evict_blocks"):
        setattr(pool, name, replaying(getattr(pool, name)))
    pool.metrics_collector = collector
    replay()  # blocks handed out at construction (attention sinks)
