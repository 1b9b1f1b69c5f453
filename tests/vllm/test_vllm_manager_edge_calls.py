"""`kvblocks.vllm.KVCacheManager` against vLLM 0.33's own manager on the calls vLLM's
`tests/v1/core` make that its scheduler does not: hit tokens passed without their blocks,
a `req_to_blocks` list held across steps, `truncate_computed_blocks` past a hit, and what
an EAGLE group registers under partial hash hits (vLLM's test spies on its managers'
`cache_blocks`; here the registered blocks themselves are compared).

Runs in a vLLM 0.33 venv (`make test-vllm`); skipped elsewhere.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

import kvblocks.vllm as kv  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm.v1.request import Request  # noqa: E402

if not hasattr(VllmManager, "truncate_computed_blocks"):
    pytest.skip("this vLLM has no partial hash hits", allow_module_level=True)

HASH_BS = 2


def full_mamba(mamba_block_size: int, num_blocks: int = 40) -> Any:
    """A full-attention group at the hash block size and an align-mode Mamba group."""
    full = FullAttentionSpec(block_size=HASH_BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
    mamba = MambaSpec(
        block_size=mamba_block_size,
        shapes=((1, 1),),
        dtypes=(torch.float32,),
        mamba_cache_mode="align",
    )
    groups = [KVCacheGroupSpec(["full"], full), KVCacheGroupSpec(["mamba"], mamba)]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def managers(cfg: Any, **kw: Any) -> tuple[Any, Any]:
    """vLLM's manager and kvblocks', with the scheduler block size of the Mamba group."""
    init_none_hash(sha256)
    scheduler_block_size = cfg.kv_cache_groups[1].kv_cache_spec.block_size
    args = dict(
        max_model_len=8192,
        scheduler_block_size=scheduler_block_size,
        hash_block_size=HASH_BS,
        enable_kv_cache_events=True,
        **kw,
    )
    return VllmManager(cfg, **args), kv.KVCacheManager(cfg, **args)


def request(rid: str, tokens: list[int]) -> Any:
    return Request(
        rid,
        tokens,
        SamplingParams(max_tokens=8),
        None,
        arrival_time=0.0,
        block_hasher=get_request_block_hasher(HASH_BS, sha256),
    )


def start(mgr: Any, rid: str, tokens: list[int], num_new_tokens: int) -> Any:
    """A new request's first step: its lookup, then `num_new_tokens` slots after the hit."""
    req = request(rid, tokens)
    blocks, hit, _ = mgr.get_computed_blocks(req)
    assert mgr.allocate_slots(req, num_new_tokens, hit, blocks) is not None
    return req


def ids(blocks: Any) -> list[int]:
    return [b.block_id for b in blocks]


def test_eagle_group_registers_the_unaligned_tail_as_vllm() -> None:
    """Partial hash hits with EAGLE: a 22-token prompt (not a multiple of the 8-token
    scheduler block) is registered to its end in the full-attention group, as vLLM does;
    the same events, cached counts and a later request's hit as vLLM's."""
    stock, ours = managers(full_mamba(4 * HASH_BS), use_eagle=True)
    num_tokens = 2 * 8 + 3 * HASH_BS
    prompt = list(range(num_tokens))
    for mgr in (stock, ours):
        start(mgr, "0", prompt, num_tokens)
    cached = [
        [m.num_cached_block["0"] for m in mgr.coordinator.single_type_managers]
        for mgr in (stock, ours)
    ]
    assert cached[1] == cached[0]
    assert cached[1][0] == num_tokens // HASH_BS
    assert ours.take_events() == stock.take_events()
    hits = []
    for mgr in (stock, ours):
        blocks, hit, _ = mgr.get_computed_blocks(request("1", [*prompt, 99, 98, 97]))
        hits.append((hit, blocks.get_block_ids()))
    assert hits[1] == hits[0]


def test_hit_tokens_without_their_blocks_allocate_as_vllm() -> None:
    """`allocate_slots(req, n, num_new_computed_tokens)` with no `new_computed_blocks`
    (a resumed request in vLLM's tests): vLLM takes the hit as empty and allocates every
    block; kvblocks gives the same tables and registers the same blocks."""
    stock, ours = managers(full_mamba(8, num_blocks=200))
    tables = []
    for mgr in (stock, ours):
        req = start(mgr, "0", [0] * 8, 8)
        for i in range(8):
            mgr.new_step_starts()
            req.num_computed_tokens = 8 + i
            req.append_output_token_ids([1])
            assert mgr.allocate_slots(req, 1) is not None
        mgr.free(req)
        mgr.new_step_starts()
        req.num_computed_tokens = 0
        _, hit, _ = mgr.get_computed_blocks(req)
        assert hit > 0
        assert mgr.allocate_slots(req, req.num_tokens - hit, hit) is not None
        tables.append((hit, mgr.get_block_ids("0")))
    assert tables[1] == tables[0]
    assert ours.take_events() == stock.take_events()


def test_req_to_blocks_is_live_across_steps_as_vllm() -> None:
    """A `req_to_blocks[request_id]` list read once and held: each later read sees the
    blocks allocated since, as vLLM's own list does, and after `free` the blocks it
    held then."""
    stock, ours = managers(full_mamba(4, num_blocks=24))
    held, reqs = [], []
    for mgr in (stock, ours):
        req = start(mgr, "0", [0] * 16, 8)
        held.append([m.req_to_blocks["0"] for m in mgr.coordinator.single_type_managers])
        req.num_computed_tokens = 8
        mgr.new_step_starts()
        assert mgr.allocate_slots(req, 8) is not None
        reqs.append(req)
    for theirs, mine in zip(held[0], held[1], strict=True):
        assert len(mine) == len(theirs) and ids(mine) == ids(theirs)
        assert mine == list(mine) and list(mine[1:3]) == list(mine)[1:3]
        assert mine[-1].block_id == theirs[-1].block_id
        with pytest.raises(IndexError):
            mine[len(theirs)]
    stock.free(reqs[0])
    ours.free(reqs[1])
    for theirs, mine in zip(held[0], held[1], strict=True):
        assert ids(mine) == ids(theirs) != []


def test_truncate_past_an_attention_hit_raises_what_vllm_raises() -> None:
    """`truncate_computed_blocks`: a short Mamba hit is cut, a short attention hit or an
    end off the block grid is refused as vLLM refuses it (an `AssertionError`; kvblocks'
    is also an `InvalidArgumentError`)."""
    stock, ours = managers(full_mamba(2 * HASH_BS, num_blocks=24))
    prompt = [0, 0, 1, 1, 2, 2, 3]
    answers = []
    for mgr in (stock, ours):
        mgr.free(start(mgr, "p", prompt, 6))
        mgr.new_step_starts()
        blocks, hit, _ = mgr.get_computed_blocks(request("c", [*prompt, 3]))
        full, mamba = (list(g) for g in blocks.blocks)
        short_mamba = mgr.create_kv_cache_blocks((full, []))
        cut = mgr.truncate_computed_blocks(short_mamba, 4).get_block_ids()
        refused = []
        for blocks_in, end in (((full[:1], mamba), 4), ((full, mamba), 3)):
            with pytest.raises(AssertionError) as error:
                mgr.truncate_computed_blocks(mgr.create_kv_cache_blocks(blocks_in), end)
            refused.append(error.type)
        answers.append((hit, cut, refused))
    assert answers[1][:2] == answers[0][:2]
    assert [len(group) for group in answers[1][1]] == [2, 0]
    assert all(issubclass(t, kv.AssertedInputError) for t in answers[1][2])
