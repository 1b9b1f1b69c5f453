"""`kvblocks.vllm.KVCacheManager`: vLLM's `KVCacheManager` on the kvblocks core, with the
rules of the installed release (0.32 or 0.33; `_version_rules.py`).

The scheduler's per-step calls (`allocate_slots`, `get_computed_blocks`, `free`,
`get_blocks`, `cache_blocks`, ...) are the core's own methods, inherited: one boundary
crossing per call, vLLM's `Request` read in place. What is here is vLLM's Python-level
surface: its constructor, the coordinator and pool views its callers reach into, its
event and stats classes, and the per-step hand-overs as vLLM's types (partial-hit copies,
finished partial tails).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import kvblocks as kb
from kvblocks._core import KVCacheBlock
from kvblocks.vllm import _hisparse
from kvblocks.vllm._config import UnsupportedConfigError, convert_config
from kvblocks.vllm._metrics import attach as attach_metrics_collector
from kvblocks.vllm._version_rules import rules

_T = TypeVar("_T")


def _block_ids(blocks: Iterable[Any]) -> list[int]:
    """Block ids of vLLM-style block objects (or of ids themselves)."""
    return [b if isinstance(b, int) else b.block_id for b in blocks]


class AssertedInputError(kb.InvalidArgumentError, AssertionError):
    """Input vLLM 0.33 refuses with an `assert` (`truncate_computed_blocks` past a hit or
    off the block grid): kvblocks' `InvalidArgumentError`, and an `AssertionError` as
    vLLM's callers catch it."""


class _FreeQueueView:
    """vLLM's `free_block_queue`, as far as its callers read it."""

    def __init__(self, pool: BlockPool) -> None:
        self._view = pool
        self._pool = pool.core

    @property
    def num_free_blocks(self) -> int:
        return self._pool.get_num_free_blocks()

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The free blocks, head (allocated next) to tail."""
        return self._view.objects(self._pool.get_free_block_ids())


class BlockPool:
    """vLLM's `BlockPool` surface over the manager's pool, taking and returning block
    objects (`KVCacheBlock`) as vLLM's does; ids are accepted wherever blocks are. With
    `host`, over HiSparse's host pool (vLLM's `SharedEventQueueBlockPool`: its events
    join the manager's queue, which its `take_events` drains)."""

    def __init__(self, manager: KVCacheManager, *, host: bool = False) -> None:
        self._manager = manager
        self._host = host
        pool = manager.hisparse_host_pool if host else None
        self._pool: kb.BlockPool = pool or kb.KVCacheManager.block_pool.__get__(manager)
        self.num_gpu_blocks: int = self._pool.num_gpu_blocks
        self.enable_caching: bool = self._pool.enable_caching
        self.hash_block_size: int = self._pool.hash_block_size
        self.enable_kv_cache_events: bool = self._pool.enable_kv_cache_events
        self.medium: str = self._pool.medium
        self.free_block_queue = _FreeQueueView(self)
        #: vLLM's `KVCacheMetricsCollector`, if the manager was given one (`_metrics.py`).
        self.metrics_collector: Any = None

    @property
    def core(self) -> kb.BlockPool:
        """The kvblocks pool underneath, with what vLLM's lacks: pins, the retention
        clock, per-tenant counts, `check_invariants` (docs/retention.md)."""
        return self._pool

    def objects(self, block_ids: Sequence[int]) -> list[KVCacheBlock]:
        """The block objects of this pool's `block_ids`."""
        return self._manager.block_objects(block_ids, host=self._host)

    @property
    def blocks(self) -> list[KVCacheBlock]:
        """Every block of the pool, the null block first."""
        return self.objects(list(range(self.num_gpu_blocks)))

    @property
    def null_block(self) -> KVCacheBlock:
        return self.objects([0])[0]

    def get_num_free_blocks(self) -> int:
        return self._pool.get_num_free_blocks()

    def get_usage(self) -> float:
        return self._pool.get_usage()

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        return self.objects(self._pool.get_new_blocks(num_blocks))

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None:
        """Frees the blocks; with HiSparse, blocks of the other pool (the host's, or the
        device's for the host pool) are freed there, after this pool's, as vLLM routes
        each block to its own pool."""
        if self._manager.hisparse_host_group_id is None:
            self._pool.free_blocks(_block_ids(ordered_blocks))
            return
        own: list[Any] = []
        other: list[Any] = []
        for block in ordered_blocks:
            on_host = getattr(block, "on_host", self._host)
            (own if on_host == self._host else other).append(block)
        self._pool.free_blocks(_block_ids(own))
        if other:
            pools = (self._manager.block_pool, self._manager.hisparse_block_pool)
            pool = pools[not self._host]
            assert pool is not None
            pool.free_blocks(other)

    def touch(self, blocks: Iterable[Any]) -> None:
        self._pool.touch(_block_ids(blocks))

    def cache_full_blocks(
        self,
        request: Any,
        blocks: Sequence[Any],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: Sequence[bool] | None = None,
    ) -> None:
        """vLLM's pool call: caches `blocks[num_cached_blocks:num_full_blocks]` under the
        request's hashes, with `BlockStored` events naming `kv_cache_group_id`. A
        `block_mask` that skips a block is not supported (kvblocks' managers keep that
        rule in the core)."""
        if block_mask is not None and not all(block_mask):
            raise kb.UnsupportedError("cache_full_blocks with a block_mask that skips blocks")
        self._pool.cache_full_blocks(
            list(request.block_hashes),
            _block_ids(blocks),
            num_cached_blocks,
            num_full_blocks,
            block_size,
            kv_cache_group_id,
            token_ids=list(request.all_token_ids),
        )

    def cache_partial_block(
        self,
        request: Any,
        block: Any,
        num_tokens: int,
        kv_cache_group_id: int,
        block_size: int,
        replace_existing_hashes: bool = False,
    ) -> Any:
        """vLLM 0.33's pool call: the request's prefix of `num_tokens` tokens (a multiple of
        the hash block size) becomes a cache entry of `block`, vLLM's
        `BlockHashWithGroupId` of it returned (None for the null block)."""
        if block_size % self.hash_block_size:
            raise kb.InvalidArgumentError(
                f"block_size {block_size} is not a multiple of the hash block size "
                f"{self.hash_block_size}"
            )
        hashes = list(request.block_hashes)
        self._pool.cache_partial_block(
            hashes,
            block.block_id,
            num_tokens,
            kv_cache_group_id,
            token_ids=list(request.all_token_ids),
            replace_existing_hashes=replace_existing_hashes,
        )
        if block.is_null:
            return None
        from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

        return make_block_hash_with_group_id(
            hashes[num_tokens // self.hash_block_size - 1], kv_cache_group_id
        )

    def get_cached_block(
        self, block_hash: bytes, kv_cache_group_ids: Sequence[int]
    ) -> list[KVCacheBlock] | None:
        ids = self._pool.get_cached_block(block_hash, list(kv_cache_group_ids))
        return None if ids is None else self.objects(ids)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self._pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        if self._host:
            return self._pool.reset_prefix_cache()
        return self._manager.reset_prefix_cache()

    def take_events(self) -> list[Any]:
        if self._host:
            return self._manager.take_events()
        return _to_vllm_events(self._pool.take_events())


class _LiveBlocks(Sequence[KVCacheBlock]):
    """One request's block list in one group, as vLLM's live `req_to_blocks[request_id]`:
    while the manager knows the request, each access reads the core's table now (a
    caller holding it across steps sees the blocks added since). Once the request is
    freed it keeps the blocks it last read, as vLLM's list keeps those `free` popped
    with it (blocks added after its last read are not among them). Read-only; compares
    equal to a list of the same blocks. Each access is one read of the core's tables: a
    request the manager no longer knows has empty tables in every group, and a known one
    never goes back to all-empty, so all-empty tables keep the last read."""

    __hash__ = None  # type: ignore[assignment]  # a list's equality, unhashable as a list

    def __init__(self, manager: KVCacheManager, group_id: int, request_id: str) -> None:
        self._manager = manager
        self._group_id = group_id
        self._request_id = request_id
        self._last: list[KVCacheBlock] = []
        self._blocks()

    def _blocks(self) -> list[KVCacheBlock]:
        tables = kb.KVCacheManager.get_block_ids(self._manager, self._request_id)
        if any(tables):
            on_host = self._group_id == self._manager.hisparse_host_group_id
            self._last = self._manager.block_objects(tables[self._group_id], host=on_host)
        return self._last

    def __getitem__(self, index: Any) -> Any:
        return self._blocks()[index]

    def __len__(self) -> int:
        return len(self._blocks())

    def __iter__(self) -> Iterator[KVCacheBlock]:
        return iter(self._blocks())

    def __reversed__(self) -> Iterator[KVCacheBlock]:
        return reversed(self._blocks())

    def __contains__(self, block: object) -> bool:
        return block in self._blocks()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _LiveBlocks):
            return self._blocks() == other._blocks()
        if isinstance(other, list):
            return self._blocks() == other
        return NotImplemented

    def __repr__(self) -> str:
        return repr(self._blocks())


class _RequestTables(Mapping[str, Sequence[KVCacheBlock]]):
    """vLLM's `req_to_blocks` of one group: request id -> its live block list."""

    def __init__(self, manager: KVCacheManager, group_id: int) -> None:
        self._manager = manager
        self._group_id = group_id

    def __getitem__(self, request_id: str) -> Sequence[KVCacheBlock]:
        if request_id not in self._manager.request_ids():
            raise KeyError(request_id)
        return _LiveBlocks(self._manager, self._group_id, request_id)

    def __iter__(self) -> Iterator[str]:
        return iter(self._manager.request_ids())

    def __len__(self) -> int:
        return len(self._manager.request_ids())


class _PerRequest(Mapping[str, _T]):
    """A per-request field of one group as vLLM's dict of it (`num_cached_block`,
    Mamba's `_checkpoints`): request id -> value, for the requests that have one."""

    def __init__(self, manager: KVCacheManager, read: Callable[[str], _T | None]) -> None:
        self._manager = manager
        self._read = read

    def __getitem__(self, request_id: str) -> _T:
        value = self._read(request_id)
        if value is None:
            raise KeyError(request_id)
        return value

    def _known(self) -> list[str]:
        return [r for r in self._manager.request_ids() if self._read(r) is not None]

    def __iter__(self) -> Iterator[str]:
        return iter(self._known())

    def __len__(self) -> int:
        return len(self._known())


class SingleTypeManagerView:
    """One group's manager as vLLM's callers read it (`block_size`, `kv_cache_spec`,
    `req_to_blocks`, `num_cached_block`, the group's context-parallel world sizes)."""

    def __init__(self, manager: KVCacheManager, group_id: int, spec: Any, block_size: int):
        self.kv_cache_group_id = group_id
        self.kv_cache_spec = spec
        self.block_size = block_size
        sizes = manager.group_context_parallel_sizes[group_id]
        self.dcp_world_size, self.pcp_world_size = sizes
        self.block_pool = manager.block_pool
        self.req_to_blocks = _RequestTables(manager, group_id)
        self.num_cached_block = _PerRequest(
            manager, lambda r: manager.num_cached_blocks(r, group_id)
        )
        # Mamba's `_checkpoints` (read by vLLM's tests): this step's prefill checkpoint,
        # `(position, table index)`.
        self._checkpoints = _PerRequest(manager, lambda r: manager.mamba_checkpoint(r, group_id))
        self.new_block_ids: list[int] = []
        self._manager = manager

    @property
    def cache_hit_alignment_tokens(self) -> int:
        """The granularity of prefix hits, in tokens (the hash block size with partial
        hits, the scheduler block size otherwise)."""
        return self._manager.cache_hit_alignment_tokens

    def take_new_block_ids(self) -> list[int]:
        return []

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Any],
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """The blocks this group would take for the allocation (a dry run)."""
        return self._manager.get_group_num_blocks_to_allocate(
            self.kv_cache_group_id,
            request_id,
            num_tokens,
            _block_ids(new_computed_blocks),
            total_computed_tokens,
            num_local_computed_tokens,
            num_tokens_main_model,
            apply_admission_cap,
            prefill_end,
        )


def _registered_view(bases: tuple[type, ...], vllm_class: type) -> type:
    """A subclass of `bases` named as vLLM's `vllm_class` (an ABC), which counts it as
    its own, so callers' `isinstance` checks and class-name checks hold; it inherits none
    of vLLM's code."""
    key = (bases, vllm_class)
    view = _VIEW_CLASSES.get(key)
    if view is None:
        view = type(vllm_class.__name__, bases, {"__module__": __name__})
        vllm_class.register(view)  # type: ignore[attr-defined]
        _VIEW_CLASSES[key] = view
    return view


_VIEW_CLASSES: dict[tuple[tuple[type, ...], type], type] = {}

#: vLLM's HiSparse manager classes, by name, and what their views add.
_HISPARSE_VIEWS = {
    "HiSparseSourceManager": _hisparse.HiSparseSourceView,
    "HiSparseResidentManager": _hisparse.HiSparseResidentView,
    "HiSparseHotManager": _hisparse.HiSparseHotView,
}


def _manager_view(manager: KVCacheManager, group_id: int, group: Any, block_size: int) -> Any:
    from vllm.v1.core.single_type_kv_cache_manager import KVCacheSpecRegistry

    spec = group.kv_cache_spec
    vllm_class = KVCacheSpecRegistry.get_manager_class(spec, getattr(group, "role", None))
    extra = _HISPARSE_VIEWS.get(vllm_class.__name__)
    bases = (SingleTypeManagerView,) if extra is None else (extra, SingleTypeManagerView)
    view = _registered_view(bases, vllm_class)(manager, group_id, spec, block_size)
    if isinstance(view, _hisparse.HiSparseSourceView):
        view.block_pool = manager.hisparse_block_pool
    if isinstance(view, _hisparse.HiSparseHotView):
        view.blocks_per_request = spec.blocks_per_request
    return view


def _coordinator_view(manager: KVCacheManager, config: Any) -> CoordinatorView:
    """The coordinator view, registered with the vLLM class the core's coordinator
    stands for (`coordinator_kind`)."""
    from vllm.v1.core import kv_cache_coordinator as kc

    vllm_class: type = getattr(kc, manager.coordinator_kind)
    view: CoordinatorView = _registered_view((CoordinatorView,), vllm_class)(manager, config)
    return view


class CoordinatorView:
    """vLLM's coordinator as its callers read it: the groups' managers, the pool and the
    dry-run `get_num_blocks_to_allocate`."""

    eagle_group_ids: tuple[int, ...] = ()

    def __init__(self, manager: KVCacheManager, config: Any) -> None:
        self._manager = manager
        self._config = config
        self.block_pool = manager.block_pool
        self.single_type_managers = [
            _manager_view(manager, i, g, block_size)
            for i, (g, block_size) in enumerate(
                zip(config.kv_cache_groups, manager.group_block_sizes, strict=True)
            )
        ]
        self.group_block_sizes = tuple(manager.group_block_sizes)
        self.full_attention_group_id: int | None = manager.full_attention_group_id
        self.num_reprefillable_tokens = manager.num_reprefillable_tokens
        self.enable_partial_hash_hits = manager.enable_partial_hash_hits
        self.scheduler_block_size = manager.scheduler_block_size
        self.hash_block_size = manager.hash_block_size
        # vLLM's private name of the hit granularity (read by its tests).
        self._cache_hit_alignment_tokens = manager.cache_hit_alignment_tokens

    @property
    def retention_interval(self) -> int | None:
        """The `prefix_cache_retention_interval` in force, as vLLM's coordinator keeps it
        (the config's, until assigned)."""
        return self._manager.retention_interval

    @retention_interval.setter
    def retention_interval(self, value: int | None) -> None:
        """Every later step reads the new interval, as in vLLM. The core checks it as at
        construction (vLLM does not re-check an assignment): an interval the groups
        cannot use raises `kvblocks.InvalidArgumentError` and changes nothing."""
        self._manager.retention_interval = value

    @property
    def attention_groups(self) -> list[Any]:
        """The hybrid coordinator's spec groups in lookup order, as vLLM's `SpecGroup`
        tuples (spec, group ids, vLLM's manager class, use_eagle). vLLM's other
        coordinators have no such attribute, so neither do their views."""
        groups = self._manager.spec_groups
        if groups is None:
            raise AttributeError(
                f"'{type(self).__name__}' object has no attribute 'attention_groups'"
            )
        from vllm.v1.core.kv_cache_coordinator import SpecGroup
        from vllm.v1.core.single_type_kv_cache_manager import KVCacheSpecRegistry

        out = []
        for group_ids, use_eagle in groups:
            spec = self._config.kv_cache_groups[group_ids[0]].kv_cache_spec
            manager_cls = KVCacheSpecRegistry.get_manager_class(spec, None)
            out.append(SpecGroup(spec, list(group_ids), manager_cls, use_eagle))
        return out

    def find_longest_cache_hit_per_group(
        self, block_hashes: Sequence[bytes], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], tuple[int, ...]]:
        """Each spec group's own longest hit: block objects and hit length per group."""
        ids, lengths = self._manager.find_longest_cache_hit_per_group(
            list(block_hashes), max_cache_hit_length
        )
        return tuple(self._manager.block_objects(g) for g in ids), tuple(lengths)

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Sequence[Any]],
        num_encoder_tokens: int,
        total_computed_tokens: int,
        num_local_computed_tokens: int = 0,
        num_tokens_main_model: int | None = None,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """A dry run of an allocation: the blocks it would take from the pool
        (`prefill_end`, where the request's prefill ends, is read under retention 0)."""
        return self._manager.get_num_blocks_to_allocate(
            request_id,
            num_tokens,
            [_block_ids(g) for g in new_computed_blocks],
            num_encoder_tokens,
            total_computed_tokens,
            num_tokens if num_tokens_main_model is None else num_tokens_main_model,
            apply_admission_cap,
            num_local_computed_tokens,
            prefill_end,
        )

    def new_step_starts(self) -> None:
        self._manager.new_step_starts()


def _to_vllm_events(events: Sequence[Any]) -> list[Any]:
    """kvblocks' event objects as vLLM's `vllm.distributed.kv_events` classes."""
    from vllm.distributed import kv_events

    out = []
    for e in events:
        cls = getattr(kv_events, type(e).__name__)
        fields = set(cls.__struct_fields__)
        out.append(cls(**{f: getattr(e, f) for f in e.__struct_fields__ if f in fields}))
    return out


class KVCacheManager(kb.KVCacheManager):
    """vLLM's `KVCacheManager`, built from vLLM's own `KVCacheConfig` with every parameter
    the 0.32 or 0.33 scheduler passes, running on the kvblocks core with the installed
    release's rules (`_version_rules.Rules`; vLLM 0.32 has no `num_hash_lookahead_tokens`
    and calls `get_computed_blocks(request)` with no cap).

    A configuration kvblocks cannot serve raises `UnsupportedConfigError` (a
    `NotImplementedError`) here, naming it.
    """

    kv_cache_config: Any
    max_model_len: int
    enable_caching: bool
    enable_kv_cache_events: bool
    use_eagle: bool
    log_stats: bool
    metrics_collector: Any
    mamba_shared_prefix_checkpoint: bool
    #: HiSparse's host-resident group and its host pool (None without HiSparse groups).
    hisparse_host_group_id: int | None
    hisparse_block_pool: BlockPool | None
    retained_hit_group_ids: tuple[int, ...]
    empty_kv_cache_blocks: kb.KVCacheBlocks
    coordinator: CoordinatorView
    prefix_cache_stats: Any
    _vllm_block_pool: BlockPool
    _stats_class: Any

    def __new__(
        cls,
        kv_cache_config: Any,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        watermark: float = 0.0,
        enable_mamba_shared_prefix_checkpoint: bool = False,
        *,
        retention: kb.RetentionPolicy | None = None,
    ) -> KVCacheManager:
        release = rules()
        flagged = any(g.is_eagle_group for g in kv_cache_config.kv_cache_groups)
        self = super().__new__(
            cls,
            convert_config(kv_cache_config),
            max_model_len,
            hash_block_size,
            scheduler_block_size=scheduler_block_size,
            max_in_flight_tokens=max_in_flight_tokens,
            enable_caching=enable_caching,
            # The core drops the EAGLE block in flagged groups only with use_eagle (0.33).
            use_eagle=use_eagle or (release.flagged_eagle_groups_drop and flagged),
            log_stats=log_stats,
            enable_kv_cache_events=enable_kv_cache_events,
            watermark=watermark,
            record_new_block_ids=kv_cache_config.needs_kv_cache_zeroing,
            count_null_block_refs=release.count_null_block_refs,
            mamba_none_prefix_caching=release.mamba_none_prefix_caching,
            dcp_world_size=dcp_world_size,
            pcp_world_size=pcp_world_size,
            retention=retention,
            num_prefill_lookahead=num_prefill_lookahead,
            num_hash_lookahead_tokens=num_hash_lookahead_tokens,
            record_block_metrics=metrics_collector is not None,
        )
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.metrics_collector = metrics_collector
        self.mamba_shared_prefix_checkpoint = (
            enable_mamba_shared_prefix_checkpoint and self.arm_mamba_shared_prefix_checkpoint()
        )
        self.retained_hit_group_ids = ()
        self.empty_kv_cache_blocks = self.get_blocks("")
        self._vllm_block_pool = BlockPool(self)
        layout = self.hisparse_layout()
        self.hisparse_host_group_id = None if layout is None else layout["host_group"]
        self.hisparse_block_pool = None if layout is None else BlockPool(self, host=True)
        self.coordinator = _coordinator_view(self, kv_cache_config)
        if layout is not None:
            _hisparse.coordinator_class()(self, self.coordinator.single_type_managers)
            self.free = self._free_with_hisparse  # type: ignore[method-assign]
            self.pop_blocks_for_free = self._pop_with_hisparse  # type: ignore[method-assign]
        from vllm.v1.metrics.stats import PrefixCacheStats

        self._stats_class = PrefixCacheStats
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.stats_mirror = self.prefix_cache_stats
        if retention is not None:
            self._start_clock()
        if metrics_collector is not None:
            attach_metrics_collector(self, metrics_collector)
        return self

    def _start_clock(self) -> None:
        """With a retention policy, each scheduler step (vLLM calls `new_step_starts`
        once per `schedule()`) advances the core's clock to the seconds since this
        manager was built. The core never reads a clock itself."""
        start = time.monotonic()
        step = super().new_step_starts

        def new_step_starts() -> None:
            step()
            self.advance_time(time.monotonic() - start)

        self.new_step_starts = new_step_starts  # type: ignore[method-assign]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Everything is set up in `__new__` (the core object is built there)."""

    @property
    def block_pool(self) -> BlockPool:  # type: ignore[override]
        """The pool, with vLLM's `BlockPool` surface (block objects in and out)."""
        return self._vllm_block_pool

    def make_prefix_cache_stats(self) -> Any:
        """The stats since the last call (vLLM's class), or None without `log_stats`."""
        if super().make_prefix_cache_stats() is None:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = self.stats_mirror = self._stats_class()
        return stats

    #: `(blocks, num_hit_tokens, shared_prefix_boundary)`, as vLLM 0.32 and 0.33 (0.32's
    #: scheduler passes no `max_cache_hit_length`).
    get_computed_blocks = kb.KVCacheManager.find_cache_hit  # type: ignore[assignment]

    def _free_with_hisparse(self, request: Any) -> None:
        """`free`, telling HiSparse whether the request finished (its publication
        survives a finished request's free, not a preemption)."""
        self.free_request(request.request_id, request.is_finished())

    def _pop_with_hisparse(self, request: Any) -> list[KVCacheBlock]:
        """`pop_blocks_for_free`, telling HiSparse whether the request finished; the
        host-resident group's blocks are the host pool's objects."""
        groups = self.pop_blocks_for_free_by_group(request.request_id, request.is_finished())
        out: list[KVCacheBlock] = []
        for group_id, ids in enumerate(groups):
            out += self.block_objects(ids, host=group_id == self.hisparse_host_group_id)
        return out

    def pop_blocks_for_free(self, request: Any) -> list[KVCacheBlock]:  # type: ignore[override]
        return self.block_objects(super().pop_blocks_for_free(request))

    def take_events(self) -> list[Any]:
        """The events since the last call, as vLLM's event classes."""
        events = super().take_events()
        return _to_vllm_events(events) if events else []

    def create_kv_cache_blocks(self, blocks: Sequence[Sequence[Any]]) -> kb.KVCacheBlocks:
        return self.kv_cache_blocks([_block_ids(g) for g in blocks])

    def truncate_computed_blocks(
        self, blocks: kb.KVCacheBlocks, num_computed_tokens: int
    ) -> kb.KVCacheBlocks:
        """The lookup result cut at `num_computed_tokens`; an end vLLM asserts against
        raises `AssertedInputError`, as vLLM's callers catch it."""
        try:
            return super().truncate_computed_blocks(blocks, num_computed_tokens)
        except kb.InvalidArgumentError as error:
            raise AssertedInputError(str(error)) from error

    def take_kv_cache_block_copies(self) -> tuple[list[Any], list[KVCacheBlock]]:
        """The partial-hit copies queued since the last call, as vLLM's
        `KVCacheBlockCopy`, and their endpoints, each holding a reference the caller drops
        with `block_pool.free_blocks` once the copy has run."""
        pairs = self.take_block_copies()
        if not pairs:
            return [], []
        from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy

        copies = [KVCacheBlockCopy(src_block_id=s, dst_block_id=d) for s, d in pairs]
        return copies, self.block_objects([b for pair in pairs for b in pair])

    def finalize_partial_tail_offloads(self, request: Any) -> list[tuple[int, int, int]]:
        """The align-mode Mamba partial tails a finishing request cached itself and did
        not overwrite, `[(group_id, block_id, boundary_tokens), ...]`."""
        return self.finalize_partial_tails(
            request.request_id, request.num_computed_tokens, request.num_in_flight_tokens
        )

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        super().remove_skipped_blocks(request_id, processed_computed_tokens, num_prompt_tokens)


__all__ = ["AssertedInputError", "BlockPool", "KVCacheManager", "UnsupportedConfigError"]
