"""vLLM 0.33's `HiSparseCoordinator` and its three managers as views over the core's
HiSparse state (`src/hisparse/`, `src/kv_cache_manager/hisparse.rs`).

The rules run in the core: the scheduler's calls reach them through the manager's own
methods, and the connector's through the coordinator view here, one crossing each. What
is here converts: plain ids into vLLM's block objects (host blocks are objects of their
own, as in vLLM, where a host and a device block with the same id differ) and into
vLLM's `SparseKV*` types.

vLLM's `get_hisparse_coordinator(manager)` works unchanged: each HiSparse manager view
carries the coordinator view as `coordinator`, which that function returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import kvblocks as kb
from kvblocks._core import KVCacheBlock

if TYPE_CHECKING:
    from kvblocks.vllm._manager import KVCacheManager


class _RequestStates(Mapping[str, Any]):
    """vLLM's `request_states`: request id -> its residency state, read now (a
    snapshot with `_HiSparseRequestState`'s fields, pages as sets)."""

    _SETS = ("valid_pages", "pinned_clean", "unpinned_pages", "stale_pages")

    def __init__(self, manager: KVCacheManager) -> None:
        self._manager = manager

    def __getitem__(self, request_id: str) -> Any:
        state = self._manager.hisparse_request_state(request_id)
        if state is None:
            raise KeyError(request_id)
        fields = dict(state)
        for name in self._SETS:
            fields[name] = set(fields[name])  # type: ignore[call-overload]
        return SimpleNamespace(**fields)

    def __iter__(self) -> Iterator[str]:
        return iter(self._manager.hisparse_state_ids())

    def __len__(self) -> int:
        return len(self._manager.hisparse_state_ids())


class _PendingSpills(MutableMapping[int, Any]):
    """vLLM's `pending_spills`: the transfers in flight by id, read now. A caller may
    add entries of its own (vLLM's tests insert one to keep the scheduler alive), which
    `has_pending_work` counts; the core's transfers cannot be removed by a caller."""

    def __init__(self, manager: KVCacheManager) -> None:
        self._manager = manager
        self._added: dict[int, Any] = {}

    def _core_ids(self) -> list[int]:
        return self._manager.hisparse_pending_spill_ids()

    def __getitem__(self, spill_id: int) -> Any:
        if spill_id in self._added:
            return self._added[spill_id]
        if spill_id in self._core_ids():
            return SimpleNamespace(transfer_id=spill_id)
        raise KeyError(spill_id)

    def __setitem__(self, spill_id: int, value: Any) -> None:
        if spill_id in self._core_ids():
            raise kb.InvalidArgumentError(f"transfer {spill_id} is the core's, in flight")
        self._added[spill_id] = value

    def __delitem__(self, spill_id: int) -> None:
        if spill_id in self._added:
            del self._added[spill_id]
        elif spill_id in self._core_ids():
            raise kb.InvalidArgumentError(
                f"transfer {spill_id} is in flight: update_spills completes it"
            )
        else:
            raise KeyError(spill_id)

    def clear(self) -> None:
        """Removes the entries the caller added (the core's stay until completed)."""
        self._added.clear()

    def __iter__(self) -> Iterator[int]:
        return iter([*self._core_ids(), *self._added])

    def __len__(self) -> int:
        return len(self._core_ids()) + len(self._added)


def _transfer(spec: tuple[int, int, list[int], bool, bool]) -> Any:
    from vllm.v1.hisparse.types import SparseKVPageTransfer

    transfer_id, host_block_id, resident_block_ids, after_forward, restore = spec
    return SparseKVPageTransfer(
        transfer_id=transfer_id,
        host_block_id=host_block_id,
        resident_block_ids=tuple(resident_block_ids),
        after_forward=after_forward,
        restore=restore,
    )


def coordinator_class() -> type:
    """The coordinator view class: a subclass of vLLM's `HiSparseCoordinator` (so
    `get_hisparse_coordinator`'s `isinstance` holds) overriding every public name of
    it, checked when first built, so no vLLM code runs on kvblocks' state."""
    global _COORDINATOR_CLASS
    if _COORDINATOR_CLASS is None:
        from vllm.v1.hisparse.coordinator import HiSparseCoordinator

        cls = type("HiSparseCoordinator", (HiSparseCoordinatorView, HiSparseCoordinator), {})
        cls.__module__ = __name__
        missing = [
            name
            for name in dir(HiSparseCoordinator)
            if not name.startswith("_")
            and not any(name in vars(c) for c in HiSparseCoordinatorView.__mro__[:-1])
        ]
        if missing:
            raise kb.UnsupportedError(
                "this vLLM's HiSparseCoordinator has names kvblocks does not serve: "
                + ", ".join(missing)
            )
        _COORDINATOR_CLASS = cls
    return _COORDINATOR_CLASS


_COORDINATOR_CLASS: type | None = None


class HiSparseCoordinatorView:
    """vLLM's `HiSparseCoordinator` over the core's HiSparse state. Built by the manager
    (`kvblocks.vllm.KVCacheManager`) with its views; never by vLLM's `__init__`."""

    def __init__(self, manager: KVCacheManager, managers: Sequence[Any]) -> None:
        layout = manager.hisparse_layout()
        assert layout is not None
        self._manager = manager
        self.managers = tuple(managers)
        self.max_model_len = manager.max_model_len
        self.num_reprefillable_tokens = manager.num_reprefillable_tokens
        self.host_group_id: int | None = layout["host_group"]
        self.host_manager = self.managers[layout["host_group"]]
        self.resident_managers = tuple(self.managers[g] for g in layout["resident_groups"])
        self.hot_managers = tuple(self.managers[g] for g, _ in layout["hot_groups"])
        self.has_host_cache = True
        self.gpu_pool = manager.block_pool if self.resident_managers else None
        self.transition_watermark: int = layout["transition_watermark"]
        self.request_states = _RequestStates(manager)
        self.pending_spills = _PendingSpills(manager)
        for view in self.managers:
            if isinstance(view, HiSparseManagerMixin):
                view.coordinator = self

    @property
    def max_spill_pages(self) -> int:
        """Transfers one step may plan, all requests together."""
        layout = self._manager.hisparse_layout()
        assert layout is not None
        return int(layout["max_spill_pages"])

    @max_spill_pages.setter
    def max_spill_pages(self, pages: int) -> None:
        self._manager.hisparse_set_max_spill_pages(pages)

    @property
    def spills_to_send(self) -> list[Any]:
        """The transfers planned and not yet handed over by `build_offload_command`."""
        return [_transfer(t) for t in self._manager.hisparse_spills_to_send()]

    @property
    def copies(self) -> dict[bytes, tuple[KVCacheBlock, ...]]:
        """Published host block hash (vLLM's `BlockHashWithGroupId`) -> the GPU copies
        of that page, one per resident group, read now."""
        out: dict[bytes, tuple[KVCacheBlock, ...]] = {}
        for block_hash, group_id, blocks in self._manager.hisparse_copies():
            key = block_hash + group_id.to_bytes(4, "big")
            out[key] = tuple(self._manager.block_objects(blocks))
        return out

    # The scheduler's calls run these inside the manager (allocate_slots, cache_blocks,
    # free); a direct call has no kvblocks equivalent.
    def _inside_manager(self, name: str) -> kb.UnsupportedError:
        return kb.UnsupportedError(
            f"HiSparseCoordinator.{name}: kvblocks runs it inside the manager's own calls"
        )

    def commit_computed_blocks(self, request_id: str, num_host_pages: int) -> None:
        raise self._inside_manager("commit_computed_blocks")

    def publish_when_ready(self, *args: Any, **kwargs: Any) -> None:
        raise self._inside_manager("publish_when_ready")

    def record_pending_host_import(self, request_id: str, num_tokens: int) -> None:
        raise self._inside_manager("record_pending_host_import")

    def free(self, request_id: str) -> None:
        raise self._inside_manager("free")

    def take_host_block_copies(self) -> tuple[Any, ...]:
        """The host copy-on-write work of partial host hits, as vLLM's
        `KVCacheBlockCopy`; both endpoints stay held until released."""
        from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy

        return tuple(
            KVCacheBlockCopy(src_block_id=src, dst_block_id=dst)
            for src, dst in self._manager.hisparse_take_host_block_copies()
        )

    def release_completed_host_copies(self, dst_block_ids: Iterable[int]) -> None:
        self._manager.hisparse_release_completed_host_copies(list(dst_block_ids))

    def get_host_block_pool(self) -> Any:
        return self.host_manager.block_pool

    def update_residency(self, request_id: str) -> None:
        self._manager.hisparse_update_residency(request_id)

    def advance_scheduled(self, requests: Iterable[tuple[str, int]]) -> None:
        self._manager.hisparse_advance_scheduled(list(requests))

    def plan_prefix_materialization(self, request_id: str, num_computed_tokens: int) -> None:
        self._manager.hisparse_plan_prefix_materialization(request_id, num_computed_tokens)

    def finish_host_import(self, request_id: str, *, failed: bool) -> None:
        self._manager.hisparse_finish_host_import(request_id, failed=failed)

    def complete_host_import(self, request_id: str, num_computed_tokens: int) -> None:
        self._manager.hisparse_complete_host_import(request_id, num_computed_tokens)

    def build_row_mirrors(self, requests: Iterable[tuple[str, int, int]]) -> tuple[Any, ...]:
        if not self.resident_managers:
            return ()
        from vllm.v1.hisparse.types import SparseKVRowMirror

        return tuple(
            SparseKVRowMirror(source_starts=tuple(starts), destination_start=dest, num_rows=rows)
            for starts, dest, rows in self._manager.hisparse_build_row_mirrors(list(requests))
        )

    def all_context_pages_resident(self, requests: Iterable[tuple[str, int, int]]) -> bool:
        return self._manager.hisparse_all_context_pages_resident(list(requests))

    def take_residency_updates(self, request_ids: Iterable[str]) -> dict[str, Any]:
        from vllm.v1.hisparse.types import SparseKVResidencyUpdate

        return {
            request_id: SparseKVResidencyUpdate(pages=pages, block_ids=tuple(block_ids))
            for request_id, pages, block_ids in self._manager.hisparse_take_residency_updates(
                list(request_ids)
            )
        }

    def build_offload_command(self) -> Any:
        transfers = self._manager.hisparse_build_offload_command()
        if transfers is None:
            return None
        from vllm.v1.hisparse.types import SparseKVOffloadCommand

        return SparseKVOffloadCommand(page_transfers=[_transfer(t) for t in transfers])

    def has_pending_reclamation(self) -> bool:
        return self._manager.hisparse_has_pending_reclamation()

    def has_pending_work(self) -> bool:
        return self._manager.hisparse_has_pending_work() or bool(self.pending_spills._added)

    def update_spills(
        self, enqueued_counts: Mapping[int, int], completed_counts: Mapping[int, int]
    ) -> None:
        self._manager.hisparse_update_spills(dict(enqueued_counts), dict(completed_counts))


class HiSparseManagerMixin:
    """What vLLM's HiSparse managers add to a group's view."""

    coordinator: Any = None
    _manager: KVCacheManager
    kv_cache_group_id: int


class HiSparseSourceView(HiSparseManagerMixin):
    """The source group's additions: its pool is the host pool."""

    retains_longer_hit = True
    block_pool: Any


class HiSparseResidentView(HiSparseManagerMixin):
    """vLLM's `HiSparseResidentManager` additions: the residency row."""

    def get_residency_row(self, request_id: str, start: int = 0) -> list[KVCacheBlock]:
        ids = self._manager.hisparse_residency_row(request_id, self.kv_cache_group_id, start)
        return self._manager.block_objects(ids)

    def get_resident_page(self, request_id: str, block_idx: int) -> KVCacheBlock | None:
        row = self._manager.hisparse_residency_row(request_id, self.kv_cache_group_id, block_idx)
        if not row or row[0] == 0:
            return None
        return self._manager.block_objects(row[:1])[0]


class HiSparseHotView(HiSparseManagerMixin):
    """vLLM's `HiSparseHotManager` additions: the hot regions."""

    blocks_per_request: int

    def require_hot(self, request_id: str) -> None:
        self._manager.hisparse_require_hot(request_id)

    def has_hot(self, request_id: str) -> bool:
        return self._manager.hisparse_hot(request_id)[0]

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[KVCacheBlock]:
        """Fills the request's region if it needs one (the token counts do not matter to
        a hot group); the new blocks."""
        ids = self._manager.hisparse_allocate_hot(request_id, self.kv_cache_group_id)
        return self._manager.block_objects(ids)

    @property
    def hot_required(self) -> set[str]:
        """The requests that need their hot regions, read now."""
        return {r for r in self._manager.request_ids() if self._manager.hisparse_hot(r)[1]}
