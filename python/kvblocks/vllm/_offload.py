"""kvblocks' cache policies for vLLM 0.33's host-memory (CPU offload) tier, on the Rust
core (`kvblocks.OffloadPolicy`; docs/offload.md).

The plugin registers three names in vLLM's `CachePolicyFactory` (`register()`): select
one with the offloading connector's `eviction_policy` in `kv_connector_extra_config`.

- ``kvblocks-lru``: vLLM's ``lru``, the same decisions.
- ``kvblocks-arc``: vLLM's ``arc``, the same decisions.
- ``kvblocks``: kvblocks' retention order over the same chunks (pins, tenant quotas,
  priority classes), from the retention spec in the connector's extra config
  (``kvblocks_retention``) when vLLM's config is current, else from
  ``KVBLOCKS_VLLM_RETENTION``. A request's class and tenant come from its
  ``kv_transfer_params`` (``kvblocks_priority``, ``kvblocks_tenant``).

This module imports vLLM: only vLLM's factory (or the plugin) imports it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus

from kvblocks import OffloadPolicy, OffloadRequest, RetentionPolicy

#: The names `register()` adds to vLLM's CachePolicyFactory, and their classes.
POLICIES = {
    "kvblocks-lru": "KVBlocksLRUPolicy",
    "kvblocks-arc": "KVBlocksARCPolicy",
    "kvblocks": "KVBlocksRetentionPolicy",
}
#: The key of the retention spec in the connector's `kv_connector_extra_config`.
EXTRA_CONFIG_RETENTION = "kvblocks_retention"


@dataclass(slots=True)
class _RequestState:
    """A request's core state in one policy (kept on vLLM's ReqContext)."""

    owner: object
    core: OffloadRequest


def _hints(req_context: ReqContext) -> dict[str, Any]:
    """The retention hints in a request's kv_transfer_params."""
    params = req_context.kv_transfer_params or {}
    tenant = params.get("kvblocks_tenant")
    return {
        "priority": int(params.get("kvblocks_priority", 0)),
        "tenant": None if tenant is None else str(tenant),
    }


class _KVBlocksPolicy(CachePolicy):
    """vLLM's CachePolicy interface over a `kvblocks.OffloadPolicy`."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._core = OffloadPolicy(self._order(), cache_capacity)

    def _order(self) -> str | RetentionPolicy:
        """The core policy: "lru", "arc" or a retention policy."""
        raise NotImplementedError

    def _request(self, req_context: ReqContext) -> OffloadRequest:
        state = req_context.get_state(_RequestState)
        if state is None or state.owner is not self:
            state = _RequestState(self, OffloadRequest(**_hints(req_context)))
            req_context.set_state(state)
        return state.core

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        chunk: ChunkStatus | None = self._core.get(key)
        return chunk

    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext) -> None:
        position = req_context.get_offload_key_position(key)
        self._core.insert(key, chunk, position, self._request(req_context))

    def remove(self, key: OffloadKey) -> None:
        self._core.remove(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        self._core.touch(list(keys))

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        self._core.on_store_miss(list(keys))

    def on_request_access(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        keys = list(keys)
        positions = [req_context.get_offload_key_position(k) for k in keys]
        self._core.on_request_access(keys, positions, self._request(req_context))

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: set[OffloadKey],
        reused_keys: set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        keys = [key for group in key_groups for key in group]
        positions = [req_context.get_offload_key_position(k) for k in keys]
        self._core.on_request_finished(keys, positions, insertion_only_keys, reused_keys)

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        evicted: list[tuple[OffloadKey, ChunkStatus]] | None = self._core.evict(n, protected)
        return evicted

    def clear(self) -> None:
        self._core.clear()

    def mark_evictable(self, key: OffloadKey) -> None:
        self._core.mark_evictable(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._core.mark_non_evictable(key)


class KVBlocksLRUPolicy(_KVBlocksPolicy):
    """vLLM 0.33's ``lru`` on kvblocks' core (``kvblocks-lru``)."""

    def _order(self) -> str | RetentionPolicy:
        return "lru"


class KVBlocksARCPolicy(_KVBlocksPolicy):
    """vLLM 0.33's ``arc`` on kvblocks' core (``kvblocks-arc``)."""

    def _order(self) -> str | RetentionPolicy:
        return "arc"


def retention_spec() -> str:
    """The retention spec of the ``kvblocks`` policy: the connector's extra config
    (``kvblocks_retention``) when vLLM's config is current, else
    ``KVBLOCKS_VLLM_RETENTION``, else "" (vLLM's LRU order)."""
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    transfer = None if config is None else config.kv_transfer_config
    extra = {} if transfer is None else (transfer.kv_connector_extra_config or {})
    if EXTRA_CONFIG_RETENTION in extra:
        return str(extra[EXTRA_CONFIG_RETENTION])
    from kvblocks.vllm._install import ENV_RETENTION

    return os.environ.get(ENV_RETENTION, "").strip()


class KVBlocksRetentionPolicy(_KVBlocksPolicy):
    """kvblocks' retention order on the host tier (``kvblocks``; docs/offload.md)."""

    def _order(self) -> str | RetentionPolicy:
        from kvblocks.retention_spec import parse_retention

        policy: RetentionPolicy | None = parse_retention(retention_spec()).build()
        return policy or RetentionPolicy()


def register() -> None:
    """Adds `POLICIES` to vLLM's CachePolicyFactory (names already there are kept). A
    vLLM whose CachePolicy predates 0.33's interface (no `on_request_access`; 0.32's
    `insert` takes no request) is left alone."""
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    if not hasattr(CachePolicy, "on_request_access"):
        return
    for name, cls in POLICIES.items():
        if name not in CachePolicyFactory._registry:
            CachePolicyFactory.register_cache_policy(name, __name__, cls)
