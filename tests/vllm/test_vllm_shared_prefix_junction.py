"""The shared-prefix junction under sparse retention, vLLM's manager against kvblocks'.

Found by the real engine (test_vllm_engine.py's hybrid model): vLLM's scheduler stores
`get_computed_blocks`'s `shared_prefix_boundary` on the request
(`request.shared_prefix_boundary`), and vLLM's `cache_blocks` keeps the sliding-window
blocks ending at that junction reachable (`reachable_boundaries`), so a third request with
the prefix hits. kvblocks missed the attribute until the engine showed it: no hits at
all on a hybrid model where stock hit. Runs where vLLM is importable.
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
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request  # noqa: E402

BS = 32


def trace(manager_class: Any) -> list[tuple[int, int, Any]]:
    """Three requests sharing a 96-token prefix, admitted in one step the way vLLM's
    scheduler does (the boundary stored on the request); each one's hit."""
    spec = {"block_size": BS, "num_kv_heads": 2, "head_size": 32, "dtype": torch.float32}
    config = KVCacheConfig(
        num_blocks=72,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["s"], SlidingWindowSpec(**spec, sliding_window=64)),
            KVCacheGroupSpec(["f"], FullAttentionSpec(**spec)),
        ],
        prefix_cache_retention_interval=0,  # what the engine sets: sparse retention on
    )
    init_none_hash(sha256)
    hasher = get_request_block_hasher(BS, sha256)
    manager = manager_class(
        config,
        max_model_len=1024,
        scheduler_block_size=BS,
        hash_block_size=BS,
        max_in_flight_tokens=4096,
    )
    manager.new_step_starts()
    prefix = list(range(1, 3 * BS + 11))
    out = []
    for i, suffix_len in enumerate((60, 190, 170)):
        tokens = prefix + [1000 + 7 * i + j for j in range(suffix_len)]
        params = SamplingParams(max_tokens=8)
        request = Request(str(i), tokens, params, None, 0, block_hasher=hasher)
        blocks, hit, boundary = manager.get_computed_blocks(request)
        request.shared_prefix_boundary = boundary
        out.append((hit, boundary, blocks.get_block_ids()))
        manager.allocate_slots(
            request,
            len(tokens) - hit,
            num_new_computed_tokens=hit,
            new_computed_blocks=blocks,
            has_scheduled_reqs=i > 0,
        )
    return out


def test_a_junction_stays_reachable_for_a_sibling() -> None:
    theirs = trace(KVCacheManager)
    assert theirs[2][0] > 0  # the case is live: vLLM's third request hits
    assert trace(kv.KVCacheManager) == theirs
