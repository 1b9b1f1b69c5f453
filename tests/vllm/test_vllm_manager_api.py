"""`kvblocks.vllm.KVCacheManager` against the installed vLLM's own manager (0.32 or 0.33),
call by call: the same vLLM `Request` objects through both, the same answers (block ids,
hit lengths, estimates, free order, the null block's ref count, events, stats), vLLM's
return shapes and block objects.

Runs where vLLM is importable (a vLLM venv, `make test-vllm`); skipped elsewhere.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

import kvblocks as kb  # noqa: E402
import kvblocks.vllm as kv  # noqa: E402
from vllm.distributed.kv_events import BlockStored  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus  # noqa: E402

BS = 16


def spec(**kw: Any) -> Any:
    return FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=8, dtype=torch.float16, **kw)


def config(*specs: Any, num_blocks: int = 40) -> Any:
    groups = [KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs or (spec(),))]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def managers(cfg: Any, **kw: Any) -> tuple[Any, Any]:
    init_none_hash(sha256)
    args = dict(max_model_len=4096, scheduler_block_size=BS, hash_block_size=BS, **kw)
    return VllmManager(cfg, **args), kv.KVCacheManager(cfg, **args)


def request(rid: str, tokens: list[int], session_id: str | None = None) -> Any:
    return Request(
        rid,
        tokens,
        SamplingParams(max_tokens=8),
        None,
        arrival_time=0.0,
        block_hasher=get_request_block_hasher(BS, sha256),
        session_id=session_id,
    )


def admit(mgr: Any, req: Any) -> tuple[Any, int]:
    """vLLM's admission: lookup, stats, allocation of the rest of the prompt."""
    blocks, hit, _ = mgr.get_computed_blocks(req)
    mgr.record_prefix_cache_stats(req, hit)
    new = mgr.allocate_slots(req, req.num_tokens - hit, hit, blocks)
    assert new is not None
    req.num_computed_tokens = req.num_tokens
    req.status = RequestStatus.RUNNING
    return new, hit


def pair(rid: str, tokens: list[int], session_id: str | None = None) -> tuple[Any, Any]:
    return request(rid, tokens, session_id), request(rid, tokens, session_id)


SHARED = list(range(100, 100 + 3 * BS))


def test_same_answers_as_vllm_call_by_call() -> None:
    stock, ours = managers(config(), log_stats=True, enable_kv_cache_events=True)
    reqs = [
        pair(f"r{i}", SHARED + list(range(1000 * i, 1000 * i + BS + i)), [None, f"s{i}"][i % 2])
        for i in range(4)
    ]
    for (a, b), i in zip(reqs, range(4), strict=True):
        new_a, hit_a = admit(stock, a)
        new_b, hit_b = admit(ours, b)
        assert (hit_b, new_b.get_block_ids()) == (hit_a, new_a.get_block_ids()), i
        assert ours.get_block_ids(b.request_id) == stock.get_block_ids(a.request_id)
        assert ours.estimate_cached_tokens(b) == stock.estimate_cached_tokens(a)
    for a, b in reqs[:2]:  # decode a block's worth, one token a step
        for t in range(BS):
            a.append_output_token_ids(t)
            b.append_output_token_ids(t)
            got = ours.allocate_slots(b, 1)
            want = stock.allocate_slots(a, 1)
            assert got.get_block_ids(allow_none=True) == want.get_block_ids(allow_none=True)
            a.num_computed_tokens += 1
            b.num_computed_tokens += 1
    events = ours.take_events()
    assert events == stock.take_events()
    assert events and all(isinstance(e, BlockStored) for e in events)
    assert {e.session_id for e in events} == {None, "s1", "s3"}  # each names its session
    # Deferred frees, as vLLM's scheduler does them under async scheduling.
    for a, b in reqs[:2]:
        popped_a = stock.pop_blocks_for_free(a)
        popped_b = ours.pop_blocks_for_free(b)
        assert [x.block_id for x in popped_b] == [x.block_id for x in popped_a]
        stock.block_pool.free_blocks(reversed(popped_a))
        ours.block_pool.free_blocks(reversed(popped_b))
    for a, b in reqs[2:]:
        stock.free(a)
        ours.free(b)
    free_a = [blk.block_id for blk in stock.block_pool.free_block_queue.get_all_free_blocks()]
    free_b = [blk.block_id for blk in ours.block_pool.free_block_queue.get_all_free_blocks()]
    assert free_b == free_a
    assert ours.take_events() == stock.take_events()
    s_a, s_b = stock.make_prefix_cache_stats(), ours.make_prefix_cache_stats()
    assert type(s_b) is type(s_a)
    assert (s_b.requests, s_b.queries, s_b.hits) == (s_a.requests, s_a.queries, s_a.hits)
    assert ours.usage == stock.usage


def test_stored_events_carry_each_blocks_extra_keys_as_vllms() -> None:
    """A salted LoRA request with two images: each `BlockStored` names its blocks' keys
    (the salt on the first, the adapter on all, the images where they fall), as vLLM's."""
    from test_vllm_hasher import mm_features
    from vllm.lora.request import LoRARequest

    stock, ours = managers(config(), enable_kv_cache_events=True)
    for mgr in (stock, ours):
        req = Request(
            "r",
            list(range(200, 200 + 5 * BS)),
            SamplingParams(max_tokens=8),
            None,
            lora_request=LoRARequest("adapter", 3, "/adapters/a"),
            cache_salt="tenant",
            mm_features=mm_features([("img-a", 4, 20), ("img-b", 50, 8)]),
            block_hasher=get_request_block_hasher(BS, sha256),
        )
        admit(mgr, req)
    events = ours.take_events()
    assert events == stock.take_events()
    assert [len(k) for k in events[0].extra_keys] == [3, 2, 1, 2, 1]


def test_computed_token_blocks_and_cut_lookups_as_vllm() -> None:
    """`get_block_ids_for_computed_tokens` and `truncate_computed_blocks` of a hybrid
    model: the core decides per attention type, no vLLM class name is read."""
    window = SlidingWindowSpec(
        block_size=BS, num_kv_heads=2, head_size=8, dtype=torch.float16, sliding_window=32
    )
    stock, ours = managers(config(spec(), window))
    prompt = list(range(100, 180))
    for mgr in (stock, ours):
        assert mgr.allocate_slots(request("a", prompt), len(prompt)) is not None
    for n in (0, 1, 16, 17, 40, 80):
        got = ours.get_block_ids_for_computed_tokens("a", n)
        assert got == stock.get_block_ids_for_computed_tokens("a", n), n
    want_hit = stock.get_computed_blocks(request("b", [*prompt, 1]))
    got_hit = ours.get_computed_blocks(request("b", [*prompt, 1]))
    assert got_hit[1] == want_hit[1] == 80
    for n in (0, 16, 48, 80):
        got = ours.truncate_computed_blocks(got_hit[0], n).get_block_ids()
        assert got == stock.truncate_computed_blocks(want_hit[0], n).get_block_ids(), n


@pytest.mark.parametrize("use_eagle", [False, True])
def test_a_flagged_eagle_group_drops_as_the_installed_vllm(use_eagle: bool) -> None:
    """A group flagged `is_eagle_group`: vLLM 0.32 drops its last hit block (the EAGLE
    drop) whatever `use_eagle` says, 0.33 only with `use_eagle`."""
    flagged = KVCacheConfig(
        num_blocks=40,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["l0"], spec(), is_eagle_group=True)],
    )
    stock, ours = managers(flagged, use_eagle=use_eagle)
    first, second = pair("a", [*SHARED, 1]), pair("b", [*SHARED, 2])
    hits = []
    for mgr, i in ((stock, 0), (ours, 1)):
        admit(mgr, first[i])
        hits.append(admit(mgr, second[i])[1])
    assert hits[1] == hits[0]
    assert ours.get_block_ids("b") == stock.get_block_ids("b")


def test_sliding_window_tables_free_the_null_block_as_the_installed_vllm() -> None:
    """A sliding-window table whose head fell out of the window: the popped table and
    the null block's ref count after freeing it are the installed release's (0.32
    returns and counts the leading nulls, 0.33 neither)."""
    window = SlidingWindowSpec(
        block_size=BS, num_kv_heads=2, head_size=8, dtype=torch.float16, sliding_window=2 * BS
    )
    stock, ours = managers(config(window))
    a, b = pair("a", list(range(6 * BS)))
    admit(stock, a)
    admit(ours, b)
    stock.remove_skipped_blocks("a", a.num_computed_tokens)
    ours.remove_skipped_blocks("a", b.num_computed_tokens)
    assert ours.get_block_ids("a") == stock.get_block_ids("a")
    assert 0 in stock.get_block_ids("a")[0]
    popped_a, popped_b = stock.pop_blocks_for_free(a), ours.pop_blocks_for_free(b)
    assert [x.block_id for x in popped_b] == [x.block_id for x in popped_a]
    stock.block_pool.free_blocks(reversed(popped_a))
    ours.block_pool.free_blocks(reversed(popped_b))
    assert ours.block_pool.null_block.ref_cnt == stock.block_pool.null_block.ref_cnt
    assert ours.block_pool.medium == stock.block_pool.medium == "GPU"


def test_block_objects_are_live_and_one_per_block() -> None:
    _, ours = managers(config())
    a = request("a", [*SHARED, 1])
    new, _ = admit(ours, a)
    first = new.blocks[0][0]
    assert first is ours.get_blocks("a").blocks[0][0]
    assert (first.ref_cnt, first.is_null) == (1, False)
    assert first.block_hash == a.block_hashes[0] + (0).to_bytes(4, "big")
    assert first.block_hash_num_tokens == BS
    b = request("b", [*SHARED, 2])
    blocks, hit, boundary = ours.get_computed_blocks(b)
    assert (hit, boundary) == (3 * BS, 0)
    assert blocks.blocks[0][0] is first
    ours.allocate_slots(b, b.num_tokens - hit, hit, blocks)
    assert first.ref_cnt == 2
    ours.free(a)
    ours.free(b)
    assert first.ref_cnt == 0 and first.block_hash is not None  # cached, evictable
    assert ours.block_pool.get_cached_block(a.block_hashes[0], [0]) == [first]
    assert ours.block_pool.null_block.is_null


def test_kv_cache_blocks_surface() -> None:
    _, ours = managers(config(spec(), spec()))
    a = request("a", list(range(2 * BS + 3)))
    new, _ = admit(ours, a)
    assert new.get_block_ids(group_ids=[1]) == (new.get_block_ids()[1],)
    assert new.get_unhashed_block_ids_all_groups() == [[3], [6]]
    empty = new.new_empty()
    assert empty.get_block_ids(allow_none=True) is None and len(empty.blocks) == 2
    assert ours.get_blocks("nobody") is ours.empty_kv_cache_blocks
    assert ours.get_computed_blocks(request("c", [7]))[0] is ours.empty_kv_cache_blocks


def test_unhashed_block_ids_keep_nulls_in_the_one_group_form() -> None:
    """vLLM's one-group `get_unhashed_block_ids` keeps the null blocks a sliding window left
    at the head of a table; the all-groups form drops them."""
    swa = SlidingWindowSpec(
        block_size=BS, num_kv_heads=2, head_size=8, dtype=torch.float16, sliding_window=BS
    )
    theirs, ours = managers(config(swa))
    answers = []
    for mgr, req in zip((theirs, ours), pair("a", list(range(5 * BS + 3))), strict=True):
        admit(mgr, req)
        mgr.remove_skipped_blocks(req.request_id, req.num_computed_tokens)
        blocks = mgr.get_blocks(req.request_id)
        answers.append(
            (blocks.get_unhashed_block_ids(), blocks.get_unhashed_block_ids_all_groups())
        )
    assert answers[1] == answers[0]
    one_group, all_groups = answers[1]
    assert 0 in one_group and 0 not in all_groups[0]


def test_coordinator_view_as_vllm_callers_read_it() -> None:
    from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator
    from vllm.v1.core.single_type_kv_cache_manager import (
        FullAttentionManager,
        SlidingWindowManager,
    )

    swa = SlidingWindowSpec(
        block_size=BS, num_kv_heads=2, head_size=8, dtype=torch.float16, sliding_window=32
    )
    _, ours = managers(config(spec(), swa))
    coord = ours.coordinator
    assert isinstance(coord, HybridKVCacheCoordinator)
    full, window = coord.single_type_managers
    assert isinstance(full, FullAttentionManager) and isinstance(window, SlidingWindowManager)
    assert (full.block_size, window.kv_cache_spec) == (BS, swa)
    a = request("a", list(range(3 * BS)))
    admit(ours, a)
    assert [b.block_id for b in full.req_to_blocks["a"]] == ours.get_block_ids("a")[0]
    assert full.num_cached_block["a"] == 3 and "zz" not in full.req_to_blocks
    need = coord.get_num_blocks_to_allocate("a", 5 * BS, ((), ()), 0, 3 * BS)
    assert need == 4  # two more blocks in each group
    assert ours.block_pool.get_num_free_blocks() == 40 - 1 - 6


@pytest.mark.parametrize("enable_caching", [True, False])
@pytest.mark.parametrize("num_groups", [1, 2])
def test_what_vllm_reads_of_the_manager_comes_from_the_core(
    enable_caching: bool, num_groups: int
) -> None:
    """The watermark in blocks, the coordinator class, each group's block size and
    `prefix_cache_lookup_enabled` are the core's answers, equal to vLLM's own manager's."""
    specs = [spec(), spec(sliding_window=32)][:num_groups]
    theirs, ours = managers(config(*specs), watermark=0.3, enable_caching=enable_caching)
    assert ours.watermark_blocks == theirs.watermark_blocks == int(0.3 * 40)
    assert type(theirs.coordinator).__name__ == ours.coordinator_kind
    assert isinstance(ours.coordinator, type(theirs.coordinator))
    assert [m.block_size for m in ours.coordinator.single_type_managers] == [
        m.block_size for m in theirs.coordinator.single_type_managers
    ]
    a = request("a", list(range(2 * BS)))
    for skip in (False, True):
        a.skip_reading_prefix_cache = skip
        assert ours.prefix_cache_lookup_enabled(a) == theirs.prefix_cache_lookup_enabled(a)


@pytest.mark.parametrize("layout", ["full", "full+swa+full", "swa+full+swa"])
@pytest.mark.parametrize("retention", [None, 0])
def test_coordinator_attributes_as_vllms(layout: str, retention: int | None) -> None:
    """The coordinator view's class name, `retention_interval` and (hybrid only)
    `attention_groups` (spec, group ids, manager class, use_eagle, full attention first)
    are vLLM's coordinator's; an assigned `retention_interval` is in force as in vLLM,
    and one the groups cannot use is refused and changes nothing."""
    swa = spec(sliding_window=32)
    specs = {"full": [spec()], "full+swa+full": [spec(), swa, spec()]}.get(
        layout, [swa, spec(), swa]
    )
    cfg = config(*specs)
    cfg.prefix_cache_retention_interval = retention
    theirs, ours = managers(cfg, use_eagle=True)
    assert type(ours.coordinator).__name__ == type(theirs.coordinator).__name__
    assert ours.coordinator.retention_interval == theirs.coordinator.retention_interval
    assert hasattr(ours.coordinator, "attention_groups") == hasattr(
        theirs.coordinator, "attention_groups"
    )
    if hasattr(theirs.coordinator, "attention_groups"):
        assert ours.coordinator.attention_groups == theirs.coordinator.attention_groups
    # Full attention only (`sliding_window` on a FullAttentionSpec is no sliding-window
    # group): 0 or None is usable, a positive interval is not (vLLM refuses it when
    # building, kvblocks when it is assigned too).
    new = None if retention == 0 else 0
    for mgr in (theirs, ours):
        mgr.coordinator.retention_interval = new
    assert ours.coordinator.retention_interval == theirs.coordinator.retention_interval == new
    for value in (4 * BS, -BS):
        with pytest.raises(kb.InvalidArgumentError):
            ours.coordinator.retention_interval = value
        assert ours.coordinator.retention_interval == new


@pytest.mark.parametrize("group_id", [0, 1])
def test_pool_cache_full_blocks_as_vllms(group_id: int) -> None:
    """vLLM's `BlockPool.cache_full_blocks` on the view: the same blocks become hits and
    the same `BlockStored` events (group index included) come out."""
    theirs, ours = managers(config(spec(), spec(sliding_window=32)), enable_kv_cache_events=True)
    for mgr in (theirs, ours):
        req = request("a", list(range(3 * BS)))
        blocks = mgr.block_pool.get_new_blocks(3)
        mgr.block_pool.cache_full_blocks(req, blocks, 0, 2, BS, group_id)
        mgr.block_pool.cache_full_blocks(req, blocks, 2, 2, BS, group_id)
    assert ours.block_pool.take_events() == theirs.block_pool.take_events()
    hashes = request("a", list(range(3 * BS))).block_hashes
    found = [
        [
            [b.block_id for b in hit] if hit else None
            for hit in (m.block_pool.get_cached_block(h, [group_id]) for h in hashes)
        ]
        for m in (theirs, ours)
    ]
    assert found[0] == found[1]
    assert [f is not None for f in found[1]] == [True, True, False]
    with pytest.raises(kb.UnsupportedError):
        ours.block_pool.cache_full_blocks(
            request("b", list(range(2 * BS))), [], 0, 2, BS, 0, block_mask=[True, False]
        )


def test_a_bad_watermark_is_the_cores_error() -> None:
    import kvblocks as kb

    args = dict(max_model_len=256, scheduler_block_size=BS, hash_block_size=BS)
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(kb.InvalidArgumentError, match="watermark must be a finite number"):
            kv.KVCacheManager(config(), watermark=bad, **args)


def test_a_configuration_kvblocks_cannot_serve_fails_at_construction() -> None:
    enc = EncoderOnlyAttentionSpec(block_size=BS, num_kv_heads=2, head_size=8, dtype=torch.half)
    args = dict(max_model_len=256, scheduler_block_size=BS, hash_block_size=BS)
    with pytest.raises(kv.UnsupportedConfigError, match="EncoderOnlyAttentionSpec"):
        kv.KVCacheManager(config(enc), **args)
    # vLLM 0.33 cannot look a DCP-sharded sliding window up either (it asserts there).
    import kvblocks as kb

    swa = SlidingWindowSpec(
        block_size=BS, num_kv_heads=2, head_size=8, dtype=torch.half, sliding_window=4 * BS
    )
    sharded = dict(max_model_len=256, scheduler_block_size=2 * BS, hash_block_size=2 * BS)
    with pytest.raises(kb.UnsupportedError, match="context parallelism"):
        kv.KVCacheManager(config(swa), dcp_world_size=2, **sharded)
    assert isinstance(kv.UnsupportedConfigError("x"), NotImplementedError)


def test_install_swaps_vllms_objects_and_uninstall_restores_them() -> None:
    import vllm.v1.core.kv_cache_utils as kcu
    import vllm.v1.core.sched.scheduler as sched
    import vllm.v1.engine.core as core

    before = (sched.KVCacheManager, kcu.get_request_block_hasher, core.get_request_block_hasher)
    kv.install()
    kv.install()  # idempotent
    try:
        assert kv.installed()
        assert sched.KVCacheManager is not before[0]
        built = sched.KVCacheManager(
            config(), max_model_len=256, scheduler_block_size=BS, hash_block_size=BS
        )
        assert isinstance(built, kv.KVCacheManager)
        hasher = kcu.get_request_block_hasher(BS, sha256)
        r = Request("h", list(range(40)), SamplingParams(), None, block_hasher=hasher)
        assert r.block_hashes == request("h", list(range(40))).block_hashes
    finally:
        kv.uninstall()
    assert (
        sched.KVCacheManager,
        kcu.get_request_block_hasher,
        core.get_request_block_hasher,
    ) == before
    assert not kv.installed()


@pytest.mark.parametrize(("switch", "module"), [("1", "kvblocks"), ("", "vllm")])
def test_vllms_plugin_loader_installs_kvblocks_only_when_switched_on(
    switch: str, module: str
) -> None:
    """A vLLM process loads kvblocks' `vllm.general_plugins` entry point (kvblocks
    installed as a distribution, as `make test-vllm` does); it installs on KVBLOCKS_VLLM=1."""
    import subprocess
    import sys
    from importlib.metadata import entry_points

    if not any(
        ep.value.startswith("kvblocks.") for ep in entry_points(group="vllm.general_plugins")
    ):
        pytest.skip("kvblocks is not installed as a distribution here")
    code = (
        "from vllm.plugins import load_general_plugins; load_general_plugins()\n"
        "import vllm.v1.core.sched.scheduler as s, vllm.v1.engine.core as c\n"
        "print(s.KVCacheManager.__module__.split('.')[0],"
        " c.get_request_block_hasher.__module__.split('.')[0])\n"
    )
    env = {**os.environ, "KVBLOCKS_VLLM": switch}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.split() == [module, module]


def test_prompt_longer_than_context_is_capped_as_vllm() -> None:
    """vLLM's manager caps a request's slots at max_model_len and counts blocks past the
    table as cached; `kvblocks.vllm` answers alike (kvblocks' own API refuses such a
    request instead: tests/core/test_bad_input.py)."""
    init_none_hash(sha256)
    args = dict(max_model_len=64, scheduler_block_size=BS, hash_block_size=BS)
    stock, ours = VllmManager(config(), **args), kv.KVCacheManager(config(), **args)
    a, b = pair("long", list(range(100)))
    want = stock.allocate_slots(a, 100)
    got = ours.allocate_slots(b, 100)
    assert got.get_block_ids() == want.get_block_ids() == ([1, 2, 3, 4],)
    c, d = pair("again", list(range(100)))
    blocks_c, hit_c, _ = stock.get_computed_blocks(c)
    blocks_d, hit_d, _ = ours.get_computed_blocks(d)
    assert (blocks_d.get_block_ids(), hit_d) == (blocks_c.get_block_ids(), hit_c)
