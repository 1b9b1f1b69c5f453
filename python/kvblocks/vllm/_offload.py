"""kvblocks' cache policies for vLLM 0.33's host-memory (CPU offload) tier, on the Rust
core (`kvblocks.OffloadPolicy`; docs/offload.md).

The plugin registers three names in vLLM's `CachePolicyFactory` (`register()`): select
one with the offloading connector's `eviction_policy` in `kv_connector_extra_config`.

- ``kvblocks-lru``: vLLM's ``lru``, the same decisions.
- ``kvblocks-arc``: vLLM's ``arc``, the same decisions.
- ``kvblocks``: kvblocks' retention order over the same chunks (pins, tenant quotas,
  priority classes), with the retention spec in ``KVBLOCKS_VLLM_RETENTION``. In the
  connector's extra config, ``eviction_policy: "kvblocks:SPEC"`` with
  ``cache_policy_module_path: "kvblocks.vllm._offload"`` gives the spec itself (vLLM's
  out-of-tree loading; `__getattr__`). A request's class and tenant come from its
  ``kv_transfer_params`` (``kvblocks_priority``, ``kvblocks_tenant``).

This module imports vLLM: only vLLM's factory (or the plugin) imports it.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

from kvblocks import OffloadPolicy, OffloadRequest, RetentionPolicy

#: The names `register()` adds to vLLM's CachePolicyFactory, and their classes.
POLICIES = {
    "kvblocks-lru": "KVBlocksLRUPolicy",
    "kvblocks-arc": "KVBlocksARCPolicy",
    "kvblocks": "KVBlocksRetentionPolicy",
}
#: The name of the retention order; ``kvblocks:SPEC`` carries its spec (`__getattr__`).
RETENTION_PREFIX = "kvblocks"


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


class _KVBlocksPolicy(CachePolicy):  # type: ignore[misc]  # vLLM is untyped here
    """vLLM's CachePolicy interface over a `kvblocks.OffloadPolicy`."""

    def __init__(self, cache_capacity: int) -> None:
        # CachePolicy's own constructor only: vLLM's LRU and ARC classes, which the two
        # drop-ins below subclass, would build their Python structures.
        CachePolicy.__init__(self, cache_capacity)
        self._core = OffloadPolicy(self._order(), cache_capacity)

    def _order(self) -> str | RetentionPolicy:
        """The core policy: "lru", "arc" or a retention policy."""
        raise NotImplementedError

    def _request(self, req_context: ReqContext) -> OffloadRequest:
        state = req_context.get_state(_RequestState)
        if state is None or state.owner is not self:
            state = _RequestState(self, OffloadRequest(**_hints(req_context)))
            req_context.set_state(state)
        core: OffloadRequest = state.core
        return core

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


class KVBlocksLRUPolicy(_KVBlocksPolicy, LRUCachePolicy):  # type: ignore[misc]
    """vLLM 0.33's ``lru`` on kvblocks' core (``kvblocks-lru``): a drop-in for vLLM's
    `LRUCachePolicy` (a subclass; every method is kvblocks'), with `_heap` as a read-only
    snapshot of the lazy heap."""

    def _order(self) -> str | RetentionPolicy:
        return "lru"

    @property
    def _heap(self) -> list[tuple[tuple[int, int], bytes]]:
        """The heap's entries, stale ones included (a copy)."""
        heap: list[tuple[tuple[int, int], bytes]] = self._core.heap()
        return heap


class KVBlocksARCPolicy(_KVBlocksPolicy, ARCCachePolicy):  # type: ignore[misc]
    """vLLM 0.33's ``arc`` on kvblocks' core (``kvblocks-arc``): a drop-in for vLLM's
    `ARCCachePolicy` (a subclass; every method is kvblocks'), with its lists as read-only
    snapshots and `target_t1_size` readable and settable."""

    def _order(self) -> str | RetentionPolicy:
        return "arc"

    def _list(self, name: str) -> OrderedDict[OffloadKey, Any]:
        keys: list[OffloadKey] = self._core.lists()[name]
        if name in ("b1", "b2"):
            return OrderedDict.fromkeys(keys)
        return OrderedDict((key, self._core.get(key)) for key in keys)

    @property
    def t1(self) -> OrderedDict[OffloadKey, Any]:
        """T1, oldest first: key to chunk (a copy)."""
        return self._list("t1")

    @property
    def t2(self) -> OrderedDict[OffloadKey, Any]:
        """T2, oldest first: key to chunk (a copy)."""
        return self._list("t2")

    @property
    def b1(self) -> OrderedDict[OffloadKey, Any]:
        """Ghost list B1, oldest first (a copy)."""
        return self._list("b1")

    @property
    def b2(self) -> OrderedDict[OffloadKey, Any]:
        """Ghost list B2, oldest first (a copy)."""
        return self._list("b2")

    @property
    def target_t1_size(self) -> float:
        """The adaptive target size of T1."""
        target = self._core.target_t1_size
        assert target is not None  # an ARC core
        return target

    @target_t1_size.setter
    def target_t1_size(self, target: float) -> None:
        self._core.target_t1_size = target


class KVBlocksRetentionPolicy(_KVBlocksPolicy):
    """kvblocks' retention order on the host tier (``kvblocks``; docs/offload.md), with the
    spec in ``KVBLOCKS_VLLM_RETENTION`` (or in the class name: `__getattr__`)."""

    #: The retention spec; None: read ``KVBLOCKS_VLLM_RETENTION`` when built.
    spec: str | None = None

    def _order(self) -> str | RetentionPolicy:
        from kvblocks.retention_spec import parse_retention
        from kvblocks.vllm._install import ENV_RETENTION

        spec = (self.spec if self.spec is not None else os.environ.get(ENV_RETENTION, "")).strip()
        policy: RetentionPolicy | None = parse_retention(spec).build() if spec else None
        return policy or RetentionPolicy()


_by_spec: dict[str, type[KVBlocksRetentionPolicy]] = {}


def __getattr__(name: str) -> type[KVBlocksRetentionPolicy]:
    """``kvblocks:SPEC``: the retention order with SPEC, for vLLM's out-of-tree loading
    (``eviction_policy: "kvblocks:quota=batch:20000"`` with ``cache_policy_module_path:
    "kvblocks.vllm._offload"`` in the connector's extra config; vLLM's factory then takes
    this attribute of this module).

    Raises:
        AttributeError: any other name.
        SpecError: a bad spec.
    """
    prefix = f"{RETENTION_PREFIX}:"
    if not name.startswith(prefix):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    spec = name[len(prefix) :]
    if spec not in _by_spec:
        from kvblocks.retention_spec import parse_retention

        parse_retention(spec)  # a bad spec fails here, where vLLM loads the policy
        attrs = {"spec": spec, "__doc__": f"kvblocks' retention order with {spec!r}."}
        _by_spec[spec] = type(name, (KVBlocksRetentionPolicy,), attrs)
    return _by_spec[spec]


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
