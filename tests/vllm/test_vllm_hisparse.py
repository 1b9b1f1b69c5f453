"""`kvblocks.vllm` converts vLLM 0.33's HiSparse configuration (as `tests/v1/core/
test_prefix_caching.py`'s `make_hisparse_kv_cache_config` builds it): the two HiSparse
spec classes with vLLM's page sizes, per-request memory and resident admission cap, the
groups' `host_resident` and `role`, and the host pool size. Then a differential driver
runs the same random scheduler and connector calls on vLLM's `KVCacheManager` with its
`HiSparseCoordinator` and on `kvblocks.vllm`'s, and compares after every call what either
side can observe: block tables, residency rows, hot regions, transfers, residency updates,
row mirrors, request states, GPU copies, both pools' free queues, reference counts and
hashes, and the shared event queue. Run in a vLLM 0.33 venv (`make test-vllm`).
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from kvblocks.vllm._config import convert_config, convert_spec  # noqa: E402
from vllm.v1 import kv_cache_interface as vi  # noqa: E402

if not hasattr(vi, "HiSparseHotSpec"):
    pytest.skip("this vLLM has no HiSparse", allow_module_level=True)

BS = 16


def _vllm_config(max_model_len: int, max_in_flight_tokens: int) -> SimpleNamespace:
    """The parts of a `VllmConfig` that the HiSparse specs' `max_memory_usage_bytes` read."""
    return SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=max_model_len),
        max_in_flight_tokens=max_in_flight_tokens,
    )


def _hisparse_config(
    host_num_blocks: int = 16,
    num_blocks: int = 32,
    num_resident_groups: int = 1,
    order: str = "source-first",
) -> Any:
    """vLLM's HiSparse layout: host-resident source, indexer, then resident pages and a
    hot region per resident group (as vLLM's tests build it). A hand-built layout may
    order the groups otherwise (vLLM requires only the source before the resident
    groups): ``indexer-first`` swaps the first two, ``hot-first`` moves the last hot
    group to the front."""
    source = vi.FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
    role = vi.KVCacheGroupRole
    groups = [
        vi.KVCacheGroupSpec(["source"], source, role=role.HISPARSE_SOURCE, host_resident=True),
        vi.KVCacheGroupSpec(
            ["indexer"], source, enable_kv_transfer=False, role=role.HISPARSE_INDEXER
        ),
    ]
    for i in range(num_resident_groups):
        groups += [
            vi.KVCacheGroupSpec(
                [f"resident_{i}"], vi.HiSparseResidentSpec(block_size=BS, page_size=BS * 4)
            ),
            vi.KVCacheGroupSpec(
                [f"hot_{i}"],
                vi.HiSparseHotSpec(block_size=BS, page_size=BS * 4, blocks_per_request=2),
                enable_kv_transfer=False,
            ),
        ]
    if order == "indexer-first":
        groups[:2] = groups[1::-1]
    elif order == "hot-first":
        groups.insert(0, groups.pop())
    return vi.KVCacheConfig(
        num_blocks=num_blocks,
        hisparse_host_num_blocks=host_num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=groups,
    )


@pytest.mark.parametrize(("max_model_len", "in_flight"), [(128, 256), (4096, 256), (100, 8)])
def test_specs_page_size_memory_and_cap_equal_vllms(max_model_len: int, in_flight: int) -> None:
    cfg = _vllm_config(max_model_len, in_flight)
    for theirs in (
        vi.HiSparseHotSpec(block_size=BS, page_size=320, blocks_per_request=3),
        vi.HiSparseResidentSpec(block_size=BS, page_size=320),
    ):
        ours = convert_spec(theirs)
        assert type(ours).__name__ == type(theirs).__name__
        assert ours.page_size_bytes == theirs.page_size_bytes
        got = ours.max_memory_usage_bytes(
            max_model_len=max_model_len, max_num_batched_tokens=in_flight
        )
        assert got == theirs.max_memory_usage_bytes(cfg)
    resident = vi.HiSparseResidentSpec(block_size=BS, page_size=320)
    assert convert_spec(resident).max_admission_blocks_per_request(
        in_flight, max_model_len
    ) == resident.max_admission_blocks_per_request(in_flight, max_model_len)


def test_config_keeps_roles_host_groups_and_host_pool() -> None:
    theirs = _hisparse_config(host_num_blocks=24)
    ours = convert_config(theirs)
    assert ours.hisparse_host_num_blocks == 24
    assert [g.host_resident for g in ours.kv_cache_groups] == [
        g.host_resident for g in theirs.kv_cache_groups
    ]
    assert [g.role for g in ours.kv_cache_groups] == [g.role.value for g in theirs.kv_cache_groups]
    assert [type(g.kv_cache_spec).__name__ for g in ours.kv_cache_groups] == [
        type(g.kv_cache_spec).__name__ for g in theirs.kv_cache_groups
    ]


def _ids(blocks: Any) -> list[int]:
    return [b.block_id for b in blocks]


def _pool_view(pool: Any) -> tuple[Any, ...]:
    """What a pool shows: its free queue, and each block's references and hash."""
    return (
        _ids(pool.free_block_queue.get_all_free_blocks()),
        [b.ref_cnt for b in pool.blocks],
        [b.block_hash for b in pool.blocks],
    )


def _event_view(e: Any) -> tuple[Any, ...]:
    fields = sorted(f for f in type(e).__struct_fields__ if f != "extra_keys")
    return (type(e).__name__, *(getattr(e, f) for f in fields))


def _state_view(state: Any) -> tuple[Any, ...] | None:
    if state is None:
        return None
    return (
        set(state.valid_pages),
        state.ready_prefix_pages,
        dict(state.pending_pages),
        set(state.pinned_clean),
        set(state.unpinned_pages),
        state.pages_to_adopt,
        state.synced_pages,
        set(state.stale_pages),
    )


def _coordinator_view(c: Any, request_ids: list[str]) -> tuple[Any, ...]:
    return (
        {rid: _state_view(c.request_states.get(rid)) for rid in request_ids},
        {h: _ids(blocks) for h, blocks in c.copies.items()},
        list(c.pending_spills),
        [
            (t.transfer_id, t.host_block_id, t.resident_block_ids, t.after_forward, t.restore)
            for t in c.spills_to_send
        ],
        [
            [_ids(m.get_residency_row(rid)) for m in c.resident_managers]
            + [(m.has_hot(rid), rid in m.hot_required) for m in c.hot_managers]
            for rid in request_ids
        ],
        c.has_pending_work(),
        c.has_pending_reclamation(),
    )


def _on_host(side: _Side, block: Any) -> bool:
    """Whether a block object is one of the host pool's (kvblocks says so; vLLM's block
    knows its pool)."""
    if hasattr(block, "on_host"):
        return bool(block.on_host)
    return block.pool is side.coordinator.get_host_block_pool()


class _Side:
    """One manager (vLLM's or kvblocks.vllm's), its coordinator and its requests."""

    def __init__(self, manager: Any) -> None:
        from vllm.v1.hisparse.coordinator import get_hisparse_coordinator

        self.manager = manager
        self.coordinator = get_hisparse_coordinator(manager)
        self.requests: dict[str, Any] = {}
        #: Requests whose external import has not landed, with the tokens it brings.
        self.importing: dict[str, int] = {}
        self.held: list[Any] = []


class _Driver:
    """Random scheduler and connector calls on both sides, compared after each."""

    def __init__(
        self,
        seed: int,
        *,
        caching: bool,
        num_blocks: int,
        host_blocks: int,
        resident_groups: int,
        prefill_lookahead: int,
        order: str = "source-first",
    ) -> None:
        from kvblocks.vllm import KVCacheManager
        from vllm.utils.hashing import sha256_cbor
        from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        init_none_hash(sha256_cbor)
        self.rng = random.Random(seed)
        self.hasher = get_request_block_hasher(BS, sha256_cbor)
        self.max_model_len = 16 * BS
        kwargs = dict(
            max_model_len=self.max_model_len,
            scheduler_block_size=BS,
            hash_block_size=BS,
            enable_caching=caching,
            enable_kv_cache_events=True,
            num_prefill_lookahead=prefill_lookahead,
        )

        def config() -> Any:
            return _hisparse_config(host_blocks, num_blocks, resident_groups, order)

        self.sides = (
            _Side(VllmManager(config(), **kwargs)),
            _Side(KVCacheManager(config(), **kwargs)),
        )
        self.prefixes = [[self.rng.randrange(1000) for _ in range(5 * BS)] for _ in range(3)]
        self.next_id = 0
        #: Preempted requests, to admit again: (id, prompt).
        self.waiting: list[tuple[str, list[int]]] = []
        self.in_flight: list[int] = []
        #: The calls so far and what they returned (the tail goes into failure messages).
        self.trace: list[str] = []

    def both(self, call: Any) -> Any:
        """`call(side)` on both sides; the results (or the exception types) must be equal."""
        out = []
        for side in self.sides:
            try:
                out.append(("ok", call(side)))
            except Exception as error:
                out.append(("raised", type(error).__name__))
        assert out[0] == out[1], (out, self.trace[-6:])
        assert out[0][0] == "ok", (out[0], self.trace[-6:])
        self.trace.append(f"{getattr(call, '__qualname__', call)} -> {out[0][1]}")
        return out[0][1]

    def check(self) -> None:
        """Compares both sides."""
        rids = sorted(self.sides[0].requests)
        views = []
        for side in self.sides:
            m, c = side.manager, side.coordinator
            views.append(
                (
                    _pool_view(m.block_pool),
                    _pool_view(c.get_host_block_pool()),
                    {rid: [list(g) for g in m.get_block_ids(rid)] for rid in rids},
                    _coordinator_view(c, rids),
                    [_event_view(e) for e in m.take_events()],
                )
            )
        for a, b, what in zip(
            views[0],
            views[1],
            ("device pool", "host pool", "tables", "coordinator", "events"),
            strict=True,
        ):
            assert b == a, (what, self.trace[-6:])

    def admit(self) -> None:
        """A new request (or a preempted one again, from the start): its prefix hit,
        then its first chunk; or, sometimes, an external import of part of its prompt
        that lands later (`land`)."""
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        if self.waiting and self.rng.random() < 0.5:
            rid, prompt = self.waiting.pop(0)
        else:
            rid = f"r{self.next_id}"
            self.next_id += 1
            prompt = self.rng.choice(self.prefixes)[: self.rng.randrange(1, 5 * BS)]
            prompt = prompt + [self.rng.randrange(1000) for _ in range(self.rng.randrange(2 * BS))]
            prompt = prompt or [1]
        chunk = self.rng.choice([len(prompt), BS, 2 * BS + 3])
        external = self.rng.choice([0, 0, 0, BS - 1, BS, 2 * BS + 5])

        def run(side: _Side) -> Any:
            request = Request(
                rid, list(prompt), SamplingParams(max_tokens=64), None, block_hasher=self.hasher
            )
            m = side.manager
            computed, hit, _ = m.get_computed_blocks(request)
            ext = min(external, len(prompt) - 1 - hit)
            if ext > 0:
                blocks = m.allocate_slots(
                    request,
                    0,
                    num_new_computed_tokens=hit,
                    new_computed_blocks=computed,
                    num_external_computed_tokens=ext,
                    delay_cache_blocks=True,
                    full_sequence_must_fit=True,
                )
                if blocks is None:
                    return (hit, ext, None)
                side.requests[rid] = request
                side.importing[rid] = hit + ext
                return (hit, ext, [_ids(g) for g in blocks.blocks])
            new = min(len(prompt) - hit, chunk)
            if new <= 0:
                return (hit, None)
            blocks = m.allocate_slots(
                request, new, num_new_computed_tokens=hit, new_computed_blocks=computed
            )
            if blocks is None:
                return (hit, None)
            side.requests[rid] = request
            request.num_computed_tokens = hit
            self.advance(side, request, new)
            return (hit, [_ids(g) for g in blocks.blocks])

        self.both(run)

    def land(self) -> None:
        """An import lands (the connector's `finish_host_import`); a failed one is
        dropped, a good one caches its prefix and runs on."""
        from vllm.v1.request import RequestStatus

        importing = sorted(self.sides[0].importing)
        if not importing:
            return
        rid = self.rng.choice(importing)
        failed = self.rng.random() < 0.25

        def run(side: _Side) -> Any:
            tokens = side.importing.pop(rid)
            request = side.requests[rid]
            side.coordinator.finish_host_import(rid, failed=failed)
            if failed:
                del side.requests[rid]
                request.status = RequestStatus.FINISHED_ABORTED
                side.manager.free(request)
                return None
            request.num_computed_tokens = tokens
            side.manager.cache_blocks(request, tokens)
            return tokens

        self.both(run)

    def advance(self, side: _Side, request: Any, new: int) -> None:
        num_tokens = min(request.num_computed_tokens + new, request.num_tokens)
        side.coordinator.advance_scheduled([(request.request_id, num_tokens)])
        request.num_computed_tokens = num_tokens

    def running(self) -> list[str]:
        side = self.sides[0]
        return sorted(r for r in side.requests if r not in side.importing)

    def step(self) -> None:
        if not self.running():
            return
        rid = self.rng.choice(self.running())
        token = self.rng.randrange(1000)
        chunk = self.rng.choice([1, BS, 40])

        def run(side: _Side) -> Any:
            request = side.requests[rid]
            if request.num_computed_tokens >= request.num_tokens:
                if request.num_tokens >= self.max_model_len - 1:
                    return "full"
                request.append_output_token_ids(token)
            new = min(chunk, request.num_tokens - request.num_computed_tokens)
            blocks = side.manager.allocate_slots(request, new)
            if blocks is None:
                return None
            self.advance(side, request, new)
            return [_ids(g) for g in blocks.blocks]

        self.both(run)

    def offload(self) -> None:
        def run(side: _Side) -> Any:
            command = side.coordinator.build_offload_command()
            return (
                None
                if command is None
                else [
                    (
                        t.transfer_id,
                        t.host_block_id,
                        tuple(t.resident_block_ids),
                        t.after_forward,
                        t.restore,
                    )
                    for t in command.page_transfers
                ]
            )

        for transfer in self.both(run) or []:
            self.in_flight.append(transfer[0])

    def report(self) -> None:
        """Workers report some transfers of one request. (vLLM publishes the requests
        one `update_spills` completes in the order of a set of their ids, which varies
        from one process to the next, and the first to publish a hash keeps it: one
        request per call keeps vLLM's answer the same in every process.)"""
        if not self.in_flight:
            return
        pending = self.sides[0].coordinator.pending_spills
        owner = {i: pending[i].page[0] for i in self.in_flight if i in pending}
        if not owner:
            return
        rid = self.rng.choice(sorted(set(owner.values())))
        mine = [i for i in self.in_flight if owner.get(i) == rid]
        done = self.rng.sample(mine, self.rng.randrange(1, len(mine) + 1))
        enqueue_only = self.rng.random() < 0.3
        if not enqueue_only:
            self.in_flight = [i for i in self.in_flight if i not in done]
        enqueued = {i: 1 for i in done}
        completed = {} if enqueue_only else {i: 1 for i in done}
        self.both(lambda side: side.coordinator.update_spills(enqueued, completed))

    def worker_views(self) -> None:
        rids = self.running()
        rows = [(rid, self.sides[0].requests[rid].num_computed_tokens, 1) for rid in rids]

        def run(side: _Side) -> Any:
            c = side.coordinator
            updates = c.take_residency_updates(rids)
            return (
                {r: (u.pages, [list(g) for g in u.block_ids]) for r, u in updates.items()},
                c.build_row_mirrors(rows),
                c.all_context_pages_resident(rows),
            )

        self.both(run)

    def finish(self) -> None:
        """A running request finishes, or is preempted (and waits to be admitted again);
        its blocks are freed at once, or popped and freed later (deferred)."""
        from vllm.v1.request import RequestStatus

        if not self.running():
            return
        rid = self.rng.choice(self.running())
        status = self.rng.choice([RequestStatus.FINISHED_STOPPED, RequestStatus.PREEMPTED])
        deferred = self.rng.random() < 0.3
        if status == RequestStatus.PREEMPTED:
            self.waiting.append((rid, list(self.sides[0].requests[rid].prompt_token_ids)))

        def run(side: _Side) -> Any:
            request = side.requests.pop(rid)
            request.status = status
            if deferred:
                blocks = side.manager.pop_blocks_for_free(request)
                side.manager.block_pool.free_blocks(reversed(blocks))
                return [(b.block_id, _on_host(side, b)) for b in blocks]
            side.manager.free(request)
            return (rid, status.name)

        self.both(run)

    def pressure(self) -> None:
        take = self.rng.random() < 0.5

        def run(side: _Side) -> Any:
            pool = side.manager.block_pool
            if take:
                n = self.rng_n
                side.held.append(pool.get_new_blocks(n))
                return _ids(side.held[-1])
            if side.held:
                pool.free_blocks(side.held.pop(0))
            return None

        self.rng_n = self.rng.randrange(
            0, max(1, self.sides[0].manager.block_pool.get_num_free_blocks() // 2)
        )
        self.both(run)

    def run(self, steps: int) -> None:
        ops = [
            self.admit,
            self.step,
            self.step,
            self.step,
            self.offload,
            self.report,
            self.report,
            self.worker_views,
            self.finish,
            self.pressure,
            self.land,
        ]
        for _ in range(steps):
            op = self.rng.choice(ops)
            if op in (self.step, self.finish) and not self.running():
                op = self.admit
            op()
            self.check()
            if self.rng.random() < 0.01:
                self.both(lambda side: side.manager.reset_prefix_cache())
                self.check()


@pytest.mark.parametrize(
    ("seed", "caching", "num_blocks", "host_blocks", "resident_groups", "lookahead"),
    [
        (1, True, 40, 32, 1, 0),
        (2, False, 40, 32, 1, 0),
        (3, True, 24, 20, 2, 0),
        (4, True, 64, 24, 1, 2),
        (5, True, 20, 48, 1, 0),
        (6, True, 48, 12, 1, 0),
        (7, False, 32, 64, 2, 1),
        (8, True, 40, 40, 1, 0),
    ],
)
@pytest.mark.parametrize("order", ["source-first", "indexer-first", "hot-first"])
def test_random_calls_match_vllms_coordinator(
    seed: int,
    caching: bool,
    num_blocks: int,
    host_blocks: int,
    resident_groups: int,
    lookahead: int,
    order: str,
) -> None:
    driver = _Driver(
        seed,
        caching=caching,
        num_blocks=num_blocks,
        host_blocks=host_blocks,
        resident_groups=resident_groups,
        prefill_lookahead=lookahead,
        order=order,
    )
    driver.run(800)
