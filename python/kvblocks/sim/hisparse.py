"""HiSparse's connector in the replay loop, on kvblocks' manager and on vLLM 0.33's.

A layout with a host-resident group (:func:`~kvblocks.sim.presets.replay_layout`'s
``hisparse``) needs vLLM's ``HiSparseConnector`` beside the scheduler: it moves pages
between the GPU resident groups and the host pool, and only its calls make host pages
valid and publish them. The engine (:mod:`kvblocks.sim.engine`) drives it each step:

1. after scheduling (vLLM's ``build_connector_meta``), :meth:`HiSparseConnector.schedule`:
   ``advance_scheduled`` with each scheduled request's computed tokens after the step,
   ``build_offload_command``, ``take_host_block_copies``, one ``build_row_mirrors`` per
   request, ``all_context_pages_resident`` and ``take_residency_updates``;
2. after the model step and its frees (vLLM's ``update_connector_output``),
   :meth:`HiSparseConnector.complete`: a worker that finishes all of the step's work
   reports the host copies done (``release_completed_host_copies``) and every transfer of
   the step's command enqueued and completed, one ``update_spills`` call per transfer, in
   the command's order. (vLLM publishes the requests that one call completes in the order
   of a Python set of their ids, which changes from one process to the next; one transfer
   per call keeps its answer the same in every process.)

A finished request is freed as finished and a preempted one as not (vLLM's
``request.is_finished()``): HiSparse keeps a finished request's publication while its
transfers are in flight. Only the connector's calls are timed, one sample each
(with the turning of each answer into plain values, on either side).
"""

from __future__ import annotations

import importlib
import time
from array import array
from collections.abc import Sequence
from typing import Any

__all__ = ["HiSparseConnector", "KvblocksHiSparse", "VllmHiSparse", "hisparse_connector"]

Transfer = tuple[int, int, tuple[int, ...], bool, bool]
"""One page transfer: id, host block, resident blocks, after the forward, restore."""


class HiSparseConnector:
    """The connector's calls on one manager (see the module docs); subclasses adapt the
    calls of kvblocks' core or of vLLM's coordinator to the same plain values."""

    def __init__(self, manager: Any, host_pool: Any) -> None:
        self.manager = manager
        self.host_pool = host_pool
        self.host_blocks: int = host_pool.get_num_free_blocks() + 1  # with its null block
        self._transfers: list[int] = []
        self._copies: list[int] = []

    # ---- the calls, adapted
    def _advance(self, requests: list[tuple[str, int]]) -> None:
        raise NotImplementedError

    def _offload(self) -> list[Transfer]:
        raise NotImplementedError

    def _host_copies(self) -> list[tuple[int, int]]:
        raise NotImplementedError

    def _row_mirrors(self, request: tuple[str, int, int]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _all_resident(self, requests: list[tuple[str, int, int]]) -> bool:
        raise NotImplementedError

    def _residency_updates(self, request_ids: list[str]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _release_copies(self, dst_block_ids: list[int]) -> None:
        raise NotImplementedError

    def _update_spills(self, transfer_id: int) -> None:
        raise NotImplementedError

    def free_finished(self, request: Any) -> None:
        """Frees a request that finished."""
        raise NotImplementedError

    def free_preempted(self, request: Any) -> None:
        """Frees a request that was preempted."""
        raise NotImplementedError

    # ---- the loop
    def schedule(self, scheduled: Sequence[tuple[str, int, int, int]], out: array[int]) -> str:
        """Step 1 for ``scheduled`` = (request id, computed tokens, scheduled tokens,
        tokens of the request), in scheduling order; each call's time goes to ``out``.
        Returns what the connector sends the workers, as one line of text."""
        pc = time.perf_counter_ns
        rows = [(rid, start, count) for rid, start, count, _ in scheduled]
        advance = [(rid, min(start + count, n)) for rid, start, count, n in scheduled]
        t0 = pc()
        self._advance(advance)
        t1 = pc()
        transfers = self._offload()
        t2 = pc()
        copies = self._host_copies()
        t3 = pc()
        out.extend((t1 - t0, t2 - t1, t3 - t2))
        mirrors = []
        for row in rows:
            t0 = pc()
            mirror = self._row_mirrors(row)
            out.append(pc() - t0)
            mirrors.append(mirror)
        t0 = pc()
        resident = self._all_resident(rows)
        t1 = pc()
        updates = self._residency_updates([rid for rid, _, _ in rows])
        out.extend((t1 - t0, pc() - t1))
        self._transfers = [t[0] for t in transfers]
        self._copies = [dst for _, dst in copies]
        return f"{transfers} {copies} {mirrors} {int(resident)} {updates}"

    def complete(self, out: array[int]) -> None:
        """Step 2: the workers finished the step's copies and transfers."""
        pc = time.perf_counter_ns
        if self._copies:
            t0 = pc()
            self._release_copies(self._copies)
            out.append(pc() - t0)
        for transfer_id in self._transfers:
            t0 = pc()
            self._update_spills(transfer_id)
            out.append(pc() - t0)
        self._transfers, self._copies = [], []


class KvblocksHiSparse(HiSparseConnector):
    """The connector's calls on ``kvblocks.KVCacheManager`` (its ``hisparse_*`` methods)."""

    def __init__(self, manager: Any) -> None:
        super().__init__(manager, manager.hisparse_host_pool)

    def _advance(self, requests: list[tuple[str, int]]) -> None:
        self.manager.hisparse_advance_scheduled(requests)

    def _offload(self) -> list[Transfer]:
        command = self.manager.hisparse_build_offload_command()
        return [] if command is None else [(i, h, tuple(r), a, s) for i, h, r, a, s in command]

    def _host_copies(self) -> list[tuple[int, int]]:
        copies: list[tuple[int, int]] = self.manager.hisparse_take_host_block_copies()
        return copies

    def _row_mirrors(self, request: tuple[str, int, int]) -> list[tuple[Any, ...]]:
        return [
            (tuple(starts), dest, rows)
            for starts, dest, rows in self.manager.hisparse_build_row_mirrors([request])
        ]

    def _all_resident(self, requests: list[tuple[str, int, int]]) -> bool:
        return bool(self.manager.hisparse_all_context_pages_resident(requests))

    def _residency_updates(self, request_ids: list[str]) -> list[tuple[Any, ...]]:
        return [
            (rid, list(pages), [list(g) for g in block_ids])
            for rid, pages, block_ids in self.manager.hisparse_take_residency_updates(request_ids)
        ]

    def _release_copies(self, dst_block_ids: list[int]) -> None:
        self.manager.hisparse_release_completed_host_copies(dst_block_ids)

    def _update_spills(self, transfer_id: int) -> None:
        self.manager.hisparse_update_spills({transfer_id: 1}, {transfer_id: 1})

    def free_finished(self, request: Any) -> None:
        """See :class:`HiSparseConnector` (``free`` frees as finished)."""
        self.manager.free(request)

    def free_preempted(self, request: Any) -> None:
        """See :class:`HiSparseConnector`."""
        self.manager.free_request(request.request_id, False)


class VllmHiSparse(HiSparseConnector):
    """The connector's calls on vLLM 0.33's ``HiSparseCoordinator`` (imports vLLM)."""

    def __init__(self, manager: Any) -> None:
        coordinator = importlib.import_module("vllm.v1.hisparse.coordinator")
        self.coordinator = coordinator.get_hisparse_coordinator(manager)
        self._status = importlib.import_module("vllm.v1.request").RequestStatus
        super().__init__(manager, self.coordinator.get_host_block_pool())

    def _advance(self, requests: list[tuple[str, int]]) -> None:
        self.coordinator.advance_scheduled(requests)

    def _offload(self) -> list[Transfer]:
        command = self.coordinator.build_offload_command()
        if command is None:
            return []
        return [
            (t.transfer_id, t.host_block_id, tuple(t.resident_block_ids), t.after_forward,
             t.restore)
            for t in command.page_transfers
        ]  # fmt: skip

    def _host_copies(self) -> list[tuple[int, int]]:
        return [(c.src_block_id, c.dst_block_id) for c in self.coordinator.take_host_block_copies()]

    def _row_mirrors(self, request: tuple[str, int, int]) -> list[tuple[Any, ...]]:
        return [
            (tuple(m.source_starts), m.destination_start, m.num_rows)
            for m in self.coordinator.build_row_mirrors((request,))
        ]

    def _all_resident(self, requests: list[tuple[str, int, int]]) -> bool:
        return bool(self.coordinator.all_context_pages_resident(requests))

    def _residency_updates(self, request_ids: list[str]) -> list[tuple[Any, ...]]:
        return [
            (rid, list(u.pages), [list(g) for g in u.block_ids])
            for rid, u in self.coordinator.take_residency_updates(request_ids).items()
        ]

    def _release_copies(self, dst_block_ids: list[int]) -> None:
        self.coordinator.release_completed_host_copies(dst_block_ids)

    def _update_spills(self, transfer_id: int) -> None:
        self.coordinator.update_spills({transfer_id: 1}, {transfer_id: 1})

    def free_finished(self, request: Any) -> None:
        """See :class:`HiSparseConnector` (vLLM's scheduler sets the status first)."""
        request.status = self._status.FINISHED_LENGTH_CAPPED
        self.manager.free(request)

    def free_preempted(self, request: Any) -> None:
        """See :class:`HiSparseConnector` (a waiting request is not finished)."""
        self.manager.free(request)


def hisparse_connector(impl: str, manager: Any) -> HiSparseConnector:
    """The connector for a manager of ``impl`` (``"kvblocks"`` or ``"vllm"``)."""
    return KvblocksHiSparse(manager) if impl == "kvblocks" else VllmHiSparse(manager)
