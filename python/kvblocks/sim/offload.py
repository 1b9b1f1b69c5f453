"""The host-memory tier of a run: vLLM 0.33's CPU offload (``--kv-offloading-size``, backend
``native``: the ``OffloadingConnector`` with a ``CPUOffloadingManager``), driven by the
same Rust tier vLLM loads through ``kvblocks.vllm`` (:class:`kvblocks.OffloadManager`).

What the engine does with it (:mod:`kvblocks.sim.engine`), after vLLM's connector:

* **lookup** at admission: the GPU prefix cache first, then the tier for the chunks after
  the GPU hit, the longest run of ready chunks (``get_num_new_matched_tokens``; a chunk
  whose store is still in flight ends the run), at most ``(num_tokens - 1) //
  chunk_tokens`` chunks in all, the last token is always computed;
* **load** of the host hit: ``prepare_load`` at admission, ``complete_load`` when the step
  ends; the loaded tokens count as computed (``num_external_computed_tokens``);
* **store** after scheduling, for each scheduled request: its full chunks up to the
  tokens computed after the step, the prompt's only by default (vLLM's
  ``offload_prompt_only``), offered from the request's first chunk at every admission
  (chunks the tier holds are skipped by ``prepare_store``; with ``store_threshold >= 2`` a
  chunk is stored once offered that often); ``complete_store`` when the step ends;
* the request's accesses reach the policy when it finishes (``on_request_finished``).

A chunk is one block of the layout's hit granularity (:func:`kvblocks.sim.engine.
ceiling_block_size`, vLLM's ``blocks_per_chunk = 1``) and holds every group's KV of it
(``KVLayout.bytes_per_block``, rounded up to the 4 KiB page as vLLM's shared region
does); the tier holds ``size // chunk_bytes`` chunks. Keys are the ceilings' block keys
(:func:`kvblocks.sim.ceilings.block_keys`) with group index 0, the full-attention view.

Time: loads move host to device before the step's forward pass (a synchronous load), so
the step takes ``model time + loaded bytes / link``; stores move device to host on the
other direction of the link while the step runs, so a step lasts at least ``stored bytes
/ link``. The link is the GPU preset's (``GpuPreset.host_link_bytes_per_s``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvblocks import OffloadManager
from kvblocks._core import InvalidArgumentError

__all__ = ["PAGE_ALIGNMENT", "HostTier", "OffloadStats", "chunk_bytes", "offload_key"]

PAGE_ALIGNMENT = 4096
"""vLLM's ``SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT`` (``mmap.PAGESIZE``): a chunk's
host bytes are rounded up to it."""

_GROUP0 = (0).to_bytes(4, "big")


def chunk_bytes(bytes_per_block: int) -> int:
    """Host bytes of one chunk of ``bytes_per_block`` KV bytes (rounded up to the page)."""
    return -(-bytes_per_block // PAGE_ALIGNMENT) * PAGE_ALIGNMENT


def offload_key(block_key: int) -> bytes:
    """vLLM's ``OffloadKey`` for a block key: 8 key bytes, then group index 0 (4 bytes,
    big-endian)."""
    return block_key.to_bytes(8, "little", signed=True) + _GROUP0


@dataclass
class OffloadStats:
    """What the tier did in a run.

    Attributes:
        num_chunks: The tier's capacity in chunks.
        chunk_tokens: Tokens per chunk.
        chunk_bytes: Host bytes per chunk.
        link_bytes_per_s: The host link's bandwidth, one direction.
        policy: ``lru``, ``arc`` or a retention spec.
        prompt_only: Only prompt chunks are stored.
        store_threshold: vLLM's ``store_threshold``.
        hit_tokens: Tokens loaded from the tier at first admissions (``hit_rate``'s kin).
        resumed_hit_tokens: Tokens loaded at re-admissions after preemption.
        loaded_chunks: Chunks loaded (all admissions).
        stored_chunks: Chunks stored.
        evicted_chunks: Chunks evicted to make room.
        store_failures: ``prepare_store`` calls that found no room (nothing evictable).
        stores_skipped: Store candidates the threshold skipped.
        load_s: Link time of the loads (one direction).
        store_s: Link time of the stores (the other direction).
    """

    num_chunks: int
    chunk_tokens: int
    chunk_bytes: int
    link_bytes_per_s: float
    policy: str
    prompt_only: bool = True
    store_threshold: int = 0
    hit_tokens: int = 0
    resumed_hit_tokens: int = 0
    loaded_chunks: int = 0
    stored_chunks: int = 0
    evicted_chunks: int = 0
    store_failures: int = 0
    stores_skipped: int = 0
    load_s: float = 0.0
    store_s: float = 0.0

    @property
    def loaded_bytes(self) -> int:
        """Bytes moved host to device."""
        return self.loaded_chunks * self.chunk_bytes

    @property
    def stored_bytes(self) -> int:
        """Bytes moved device to host."""
        return self.stored_chunks * self.chunk_bytes

    @property
    def capacity_bytes(self) -> int:
        """Host bytes the tier's chunks take."""
        return self.num_chunks * self.chunk_bytes


@dataclass
class _Req:
    keys: list[bytes]
    ints: list[int]
    offered: int = 0  # chunks offered for store since the last admission
    looked_up: tuple[list[int], int] = ([], 0)  # the last lookup's keys and start (log only)


class HostTier:
    """The tier of one engine (see the module docs).

    Args:
        num_chunks: Capacity in chunks (``>= 1``).
        policy: ``"lru"``, ``"arc"`` or a ``kvblocks.RetentionPolicy``.
        policy_name: How the report names the policy.
        chunk_tokens: Tokens per chunk (the engine's block keys' block size).
        chunk_bytes: Host bytes per chunk.
        link_bytes_per_s: Host link bandwidth, one direction.
        prompt_only: Store prompt chunks only (vLLM's default ``offload_prompt_only``).
        store_threshold: vLLM's ``store_threshold`` (``>= 2``: store a chunk once offered
            that often).
        log: Record the tier's input in :attr:`log`, for checks that replay it:
            ``("load", rid, keys, start, first)`` for each admission (the block keys its
            lookup read the tier for, from chunk index ``start``, the one after the GPU
            hit; ``first`` for a first admission), ``("store", rid, keys, start)`` for
            each offer and ``("finish", rid)``.

    Raises:
        InvalidArgumentError: A bad capacity, size or bandwidth.
    """

    def __init__(
        self,
        num_chunks: int,
        policy: Any,
        policy_name: str,
        chunk_tokens: int,
        chunk_bytes: int,
        link_bytes_per_s: float,
        prompt_only: bool = True,
        store_threshold: int = 0,
        log: bool = False,
    ) -> None:
        if num_chunks < 1 or chunk_tokens < 1 or chunk_bytes < 1 or not link_bytes_per_s > 0:
            raise InvalidArgumentError(
                "the host tier needs num_chunks, chunk_tokens, chunk_bytes >= 1 and a "
                f"positive link bandwidth (got {num_chunks}, {chunk_tokens}, {chunk_bytes}, "
                f"{link_bytes_per_s})"
            )
        self.manager = OffloadManager(num_chunks, policy, store_threshold=store_threshold)
        self._retention = not isinstance(policy, str)
        self.chunk_tokens = chunk_tokens
        self.prompt_only = prompt_only
        self.stats = OffloadStats(
            num_chunks,
            chunk_tokens,
            chunk_bytes,
            link_bytes_per_s,
            policy_name,
            prompt_only,
            store_threshold,
        )
        self.log: list[tuple[Any, ...]] | None = [] if log else None
        self._reqs: dict[str, _Req] = {}
        self._loads: list[bytes] = []
        self._stores: list[bytes] = []
        self._step_loaded = 0
        self._step_stored = 0

    def add_request(
        self, rid: str, block_keys: list[int], priority: int = 0, tenant: str | None = None
    ) -> None:
        """A request arrived with the block keys of every token it will compute."""
        keys = [offload_key(k) for k in block_keys]
        m = self.manager
        m.on_new_request(rid)
        t = self.chunk_tokens
        m.set_positions(rid, keys, [(i + 1) * t for i in range(len(keys))])
        if self._retention:
            m.set_hints(rid, priority=priority, tenant=tenant)
        self._reqs[rid] = _Req(keys, block_keys)

    def lookup(self, rid: str, gpu_hit: int, num_tokens: int) -> int:
        """Tokens the tier adds after a GPU hit of ``gpu_hit`` tokens (a multiple of the
        chunk size) for a request of ``num_tokens`` tokens; nothing is loaded yet."""
        r = self._reqs[rid]
        t = self.chunk_tokens
        start, end = gpu_hit // t, (num_tokens - 1) // t
        if self.log is not None:
            r.looked_up = (r.ints[start:end], start)
        lookup = self.manager.lookup
        n = 0
        for key in r.keys[start:end]:
            if lookup(key) != "hit":
                break
            n += 1
        return n * t

    def load(self, rid: str, gpu_hit: int, host_hit: int, first: bool) -> None:
        """The admission went through: load the ``host_hit`` tokens after ``gpu_hit``, and
        offer the request's chunks for store again from its first."""
        r = self._reqs[rid]
        r.offered = 0
        if self.log is not None:
            self.log.append(("load", rid, *r.looked_up, first))
        if not host_hit:
            return
        t = self.chunk_tokens
        keys = r.keys[gpu_hit // t : (gpu_hit + host_hit) // t]
        self.manager.prepare_load(keys, rid)
        self._loads.extend(keys)
        self._step_loaded += len(keys)
        st = self.stats
        st.loaded_chunks += len(keys)
        if first:
            st.hit_tokens += host_hit
        else:
            st.resumed_hit_tokens += host_hit

    def store(self, rid: str, computed: int, prompt_len: int) -> None:
        """The request's tokens up to ``computed`` are computed after this step: offer
        its new full chunks."""
        r = self._reqs[rid]
        if self.prompt_only:
            computed = min(computed, prompt_len)
        n = min(len(r.keys), computed // self.chunk_tokens)
        if n <= r.offered:
            return
        keys = r.keys[r.offered : n]
        if self.log is not None:
            self.log.append(("store", rid, r.ints[r.offered : n], r.offered))
        r.offered = n
        out = self.manager.prepare_store(keys, rid)
        st = self.stats
        if out is None:
            st.store_failures += 1
            return
        stored, _, evicted = out
        self._stores.extend(stored)
        self._step_stored += len(stored)
        st.stored_chunks += len(stored)
        st.evicted_chunks += len(evicted)

    def step_transfer_s(self) -> tuple[float, float]:
        """Link seconds of this step's loads and stores."""
        st = self.stats
        per = st.chunk_bytes / st.link_bytes_per_s
        return self._step_loaded * per, self._step_stored * per

    def end_step(self) -> None:
        """The step's transfers are done: loaded chunks are released, stored ones become
        readable."""
        m = self.manager
        load_s, store_s = self.step_transfer_s()
        st = self.stats
        st.load_s += load_s
        st.store_s += store_s
        if self._loads:
            m.complete_load(self._loads)
            self._loads = []
        if self._stores:
            m.complete_store(self._stores)
            self._stores = []
        self._step_loaded = self._step_stored = 0

    def finish_request(self, rid: str) -> None:
        """The request finished: its accesses reach the policy."""
        self.manager.on_request_finished(rid)
        del self._reqs[rid]
        if self.log is not None:
            self.log.append(("finish", rid))

    def finish(self) -> OffloadStats:
        """The run's statistics."""
        self.stats.stores_skipped = self.manager.stores_skipped
        return self.stats
