"""The KV cache managers a replay can drive: kvblocks' and vLLM 0.33's.

:class:`KvblocksBackend` (optionally with the batched calls ``allocate_slots_batch`` and
``append_token_ids_batch``) and :class:`VllmBackend` (vLLM imported only when one is built)
build the manager of a :class:`~kvblocks.sim.presets.KVLayout` and its requests. Only
request construction is timed here; the engine times the manager calls.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any, Protocol

from kvblocks._core import InvalidArgumentError
from kvblocks.sim.hisparse import HiSparseConnector, hisparse_connector
from kvblocks.sim.presets import KVLayout, build_kvblocks_manager, build_vllm_manager

__all__ = ["Backend", "KvblocksBackend", "VllmBackend", "make_backend", "vllm_available"]


class Backend(Protocol):
    """A KV cache manager plus its request type."""

    name: str
    manager: Any
    """Has vLLM's ``get_computed_blocks``, ``allocate_slots``, ``free``, ``get_block_ids``,
    ``new_step_starts`` and ``block_pool.get_num_free_blocks``."""
    batch: Callable[[list[Any], list[int]], list[Any]] | None
    """``allocate_slots_batch`` when the running loop should use it, else None."""
    append_batch: Callable[[list[Any], list[int]], None] | None
    """``append_token_ids_batch`` when the model step should append in one call, else None."""
    retention: Any
    """The manager's ``kvblocks.RetentionPolicy``, or None (vLLM's LRU order): with one,
    the engine advances the manager's clock (``advance_time``) every step."""
    layout: KVLayout
    """The layout the manager was built from."""
    hash_algo: str
    """The requests' hash algorithm (vLLM's ``--prefix-caching-hash-algo``)."""
    partial_hash_hits: bool
    """The manager's ``enable_partial_hash_hits`` (prefix hits inside a block)."""
    hisparse: HiSparseConnector | None
    """HiSparse's connector, for a layout with a host pool (else None)."""
    free_finished: Callable[[Any], None]
    """Frees a finished request (``manager.free``, or HiSparse's)."""
    free_preempted: Callable[[Any], None]
    """Frees a preempted request (``manager.free``, or HiSparse's)."""

    def make_request(
        self,
        request_id: str,
        prompt: list[int],
        max_tokens: int,
        cache_salt: str | None = None,
        priority: int = 0,
        session_id: str | None = None,
    ) -> tuple[Any, int]:
        """A new request and the nanoseconds its construction (incl. hashing) took.
        ``priority`` and ``session_id`` only matter to a retention policy."""
        ...

    def release_block_copies(self) -> int:
        """Drops the references of this step's partial-hit copies (copy on write), as
        vLLM's scheduler does once it handed them to the worker; returns their number."""
        ...


class KvblocksBackend:
    """kvblocks' ``KVCacheManager`` and ``Request``; ``batch`` turns on the batch calls
    (``allocate_slots_batch`` for the running loop, ``append_token_ids_batch`` for the model
    step); ``retention`` is a ``kvblocks.RetentionPolicy`` (None: vLLM's LRU order)."""

    name = "kvblocks"
    hisparse: HiSparseConnector | None
    free_finished: Callable[[Any], None]
    free_preempted: Callable[[Any], None]

    def __init__(
        self,
        layout: KVLayout,
        hash_algo: str = "sha256_cbor",
        batch: bool = False,
        events: bool = False,
        retention: Any = None,
    ):
        import kvblocks as kb

        k: Any = kb
        self.retention = retention
        self.manager = build_kvblocks_manager(layout, events, retention)
        self.layout = layout
        self.hash_algo = hash_algo
        self.partial_hash_hits: bool = self.manager.enable_partial_hash_hits
        self._request = k.Request
        self._hasher = k.BlockHasher(
            layout.hash_block_size, hash_algo, layout.num_hash_lookahead_tokens
        )
        self.batch = self.manager.allocate_slots_batch if batch else None
        self.append_batch = k.append_token_ids_batch if batch else None
        _connect(self, "kvblocks")

    def release_block_copies(self) -> int:
        """See :class:`Backend`."""
        pairs = self.manager.take_block_copies()
        if pairs:
            self.manager.block_pool.free_blocks([b for pair in pairs for b in pair])
        return len(pairs)

    def make_request(
        self,
        request_id: str,
        prompt: list[int],
        max_tokens: int,
        cache_salt: str | None = None,
        priority: int = 0,
        session_id: str | None = None,
    ) -> tuple[Any, int]:
        """See :class:`Backend` (without a policy, ``priority`` and ``session_id`` change
        nothing)."""
        pc = time.perf_counter_ns
        t0 = pc()
        req = self._request(
            request_id,
            prompt,
            self._hasher,
            cache_salt=cache_salt,
            priority=priority,
            session_id=session_id,
        )
        return req, pc() - t0


class VllmBackend:
    """vLLM 0.33's ``KVCacheManager`` and ``Request`` (imports vLLM)."""

    name = "vllm"
    hisparse: HiSparseConnector | None
    free_finished: Callable[[Any], None]
    free_preempted: Callable[[Any], None]

    def __init__(self, layout: KVLayout, hash_algo: str = "sha256_cbor"):
        # importlib keeps vLLM (an optional, untyped dependency) out of the type check.
        utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
        hashing = importlib.import_module("vllm.utils.hashing")
        self.manager = build_vllm_manager(layout)
        self.layout = layout
        self.hash_algo = hash_algo
        # vLLM 0.32's coordinator has no partial hits
        self.partial_hash_hits = bool(
            getattr(self.manager.coordinator, "enable_partial_hash_hits", False)
        )
        self.retention: Any = None
        self.batch: Callable[[list[Any], list[int]], list[Any]] | None = None
        self.append_batch: Callable[[list[Any], list[int]], None] | None = None
        self._request = importlib.import_module("vllm.v1.request").Request
        self._params = importlib.import_module("vllm.sampling_params").SamplingParams
        hash_fn = hashing.get_hash_fn_by_name(hash_algo)
        utils.init_none_hash(hash_fn)
        # vLLM 0.32's hasher takes no lookahead: passed only when set.
        lookahead = [layout.num_hash_lookahead_tokens] if layout.num_hash_lookahead_tokens else []
        self._hasher = utils.get_request_block_hasher(layout.hash_block_size, hash_fn, *lookahead)
        _connect(self, "vllm")

    def release_block_copies(self) -> int:
        """See :class:`Backend`."""
        copies, retained = self.manager.take_kv_cache_block_copies()
        if retained:
            self.manager.block_pool.free_blocks(retained)
        return len(copies)

    def make_request(
        self,
        request_id: str,
        prompt: list[int],
        max_tokens: int,
        cache_salt: str | None = None,
        priority: int = 0,
        session_id: str | None = None,
    ) -> tuple[Any, int]:
        """See :class:`Backend` (vLLM's manager has no retention: ``priority`` and
        ``session_id`` are not passed)."""
        params = self._params(max_tokens=max_tokens)
        pc = time.perf_counter_ns
        t0 = pc()
        req = self._request(
            request_id=request_id,
            prompt_token_ids=prompt,
            sampling_params=params,
            pooling_params=None,
            arrival_time=0.0,
            cache_salt=cache_salt,
            block_hasher=self._hasher,
        )
        return req, pc() - t0


def _connect(backend: KvblocksBackend | VllmBackend, impl: str) -> None:
    """Sets ``backend``'s ``hisparse`` connector and free calls."""
    m = backend.manager
    hs = None if backend.layout.hisparse_host_num_blocks is None else hisparse_connector(impl, m)
    backend.hisparse = hs
    backend.free_finished = m.free if hs is None else hs.free_finished
    backend.free_preempted = m.free if hs is None else hs.free_preempted


def vllm_available() -> str | None:
    """vLLM's version if vLLM is importable, else None."""
    try:
        vllm = importlib.import_module("vllm")
    except Exception:  # a broken vLLM install is as unusable as a missing one
        return None
    return str(getattr(vllm, "__version__", "unknown"))


def make_backend(
    impl: str,
    layout: KVLayout,
    hash_algo: str = "sha256_cbor",
    batch: bool = False,
    events: bool = False,
    retention: Any = None,
) -> Backend:
    """``impl`` = ``"kvblocks"`` or ``"vllm"``; ``batch``, ``events`` (KV cache events) and
    ``retention`` (a ``kvblocks.RetentionPolicy``) only apply to kvblocks."""
    if impl == "kvblocks":
        return KvblocksBackend(layout, hash_algo, batch, events, retention)
    if impl == "vllm":
        if retention is not None:
            raise InvalidArgumentError("vLLM's KV cache manager has no retention policies")
        return VllmBackend(layout, hash_algo)
    raise InvalidArgumentError(f"unknown implementation {impl!r}")
