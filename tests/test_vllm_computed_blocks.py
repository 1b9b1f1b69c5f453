"""`get_block_ids_for_computed_tokens` and `truncate_computed_blocks` of
`kvblocks.vllm.KVCacheManager` against the installed vLLM's own manager, on a hybrid
full-attention and sliding-window model (the core decides per attention type; no class
names are read in Python).

Runs where vLLM is importable (a vLLM venv, `make test-vllm`); skipped elsewhere.
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
    SlidingWindowSpec,
)
from vllm.v1.request import Request  # noqa: E402

BS = 16
SPEC = dict(block_size=BS, num_kv_heads=2, head_size=8, dtype=torch.float16)


def managers() -> tuple[Any, Any]:
    specs = [FullAttentionSpec(**SPEC), SlidingWindowSpec(**SPEC, sliding_window=32)]
    groups = [KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)]
    cfg = KVCacheConfig(num_blocks=40, kv_cache_tensors=[], kv_cache_groups=groups)
    init_none_hash(sha256)
    args = dict(max_model_len=4096, scheduler_block_size=BS, hash_block_size=BS)
    return VllmManager(cfg, **args), kv.KVCacheManager(cfg, **args)


def request(rid: str, tokens: list[int]) -> Any:
    hasher = get_request_block_hasher(BS, sha256)
    return Request(rid, tokens, SamplingParams(max_tokens=8), None, 0.0, block_hasher=hasher)


def test_computed_token_blocks_and_cut_lookups_as_vllm() -> None:
    stock, ours = managers()
    prompt = list(range(100, 180))
    for mgr in (stock, ours):
        first = request("a", prompt)
        assert mgr.allocate_slots(first, len(prompt)) is not None
    for n in (0, 1, 16, 17, 40, 80):
        got = ours.get_block_ids_for_computed_tokens("a", n)
        assert got == stock.get_block_ids_for_computed_tokens("a", n), n
    want_hit = stock.get_computed_blocks(request("b", [*prompt, 1]))
    got_hit = ours.get_computed_blocks(request("b", [*prompt, 1]))
    assert got_hit[1] == want_hit[1] == 80
    for n in (0, 16, 48, 80):
        got = ours.truncate_computed_blocks(got_hit[0], n).get_block_ids()
        assert got == stock.truncate_computed_blocks(want_hit[0], n).get_block_ids(), n
