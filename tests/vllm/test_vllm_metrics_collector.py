"""vLLM's KV cache metrics collector on `kvblocks.vllm.KVCacheManager`: driven with the
same requests, a collector handed to kvblocks' manager gets the same calls, in the same
order, on the same block ids, as one handed to vLLM's own manager, and so the same
sampling decisions and eviction metrics (`kvblocks/vllm/_metrics.py`).

Runs where vLLM is importable (a vLLM venv, `make test-vllm`); skipped elsewhere.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

import kvblocks.vllm as kv  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager  # noqa: E402
from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request  # noqa: E402

BS = 16
ATTN: dict[str, Any] = {"block_size": BS, "num_kv_heads": 2, "head_size": 8}


class RecordingCollector(KVCacheMetricsCollector):
    """vLLM's collector, logging each call, with its own random stream (the two managers'
    collectors would otherwise draw from one global stream in turn)."""

    def __init__(self, sample_rate: float, seed: int) -> None:
        super().__init__(sample_rate)
        self.rng = random.Random(seed)
        self.calls: list[tuple[str, int]] = []

    def should_sample_block(self) -> bool:
        return self.rng.random() < self.sample_rate

    def on_block_allocated(self, block: Any) -> None:
        self.calls.append(("allocated", block.block_id))
        super().on_block_allocated(block)

    def on_block_accessed(self, block: Any) -> None:
        self.calls.append(("accessed", block.block_id))
        super().on_block_accessed(block)

    def on_block_evicted(self, block: Any) -> None:
        self.calls.append(("evicted", block.block_id))
        super().on_block_evicted(block)

    def reset(self) -> None:
        self.calls.append(("reset", -1))
        super().reset()


SPECS = {
    "full": [FullAttentionSpec(**ATTN, dtype=torch.float16)],
    "full_swa": [
        FullAttentionSpec(**ATTN, dtype=torch.float16),
        SlidingWindowSpec(**ATTN, dtype=torch.float16, sliding_window=48),
    ],
}


class Pair:
    """One request, as vLLM's `Request`, twice (one per manager)."""

    def __init__(self, rid: str, tokens: list[int]) -> None:
        hasher = get_request_block_hasher(BS, sha256)
        self.reqs = [
            Request(rid, tokens, SamplingParams(max_tokens=8), None, block_hasher=hasher)
            for _ in range(2)
        ]


def run(specs: str, enable_caching: bool, sample_rate: float, seed: int) -> list[Any]:
    """Drives both managers through admissions with prefix hits, chunked prefill, decode,
    frees, `evict_blocks` and prefix-cache resets; checks both collectors after each."""
    init_none_hash(sha256)
    rng = random.Random(seed)
    cfg = KVCacheConfig(
        num_blocks=30,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(SPECS[specs])],
    )
    collectors = [RecordingCollector(sample_rate, seed) for _ in range(2)]
    args = dict(max_model_len=1024, scheduler_block_size=BS, hash_block_size=BS)
    managers = [
        cls(cfg, enable_caching=enable_caching, metrics_collector=c, **args)
        for cls, c in zip((VllmManager, kv.KVCacheManager), collectors, strict=True)
    ]
    prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(20, 120))] for _ in range(3)]
    running: list[Pair] = []
    for step in range(150):
        if rng.random() < 0.6:
            prompt = rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randrange(40))]
            p = Pair(f"r{step}", prompt)
            answers = [m.get_computed_blocks(r) for m, r in zip(managers, p.reqs, strict=True)]
            hits = {hit for _, hit, *_ in answers}
            assert len(hits) == 1
            hit = hits.pop()
            n = min(p.reqs[0].num_tokens - hit, rng.randrange(1, 80))
            new = [
                m.allocate_slots(r, n, hit, blocks)
                for m, r, (blocks, *_) in zip(managers, p.reqs, answers, strict=True)
            ]
            assert (new[0] is None) == (new[1] is None)
            if new[0] is not None:
                for r in p.reqs:
                    r.num_computed_tokens = hit + n
                running.append(p)
        for p in list(running):
            left = p.reqs[0].num_tokens - p.reqs[0].num_computed_tokens
            n = min(left, rng.randrange(1, 48)) if left > 0 else 1
            if left == 0:
                for r in p.reqs:
                    r.append_output_token_ids(7)
            got = [m.allocate_slots(r, n) for m, r in zip(managers, p.reqs, strict=True)]
            assert (got[0] is None) == (got[1] is None)
            if got[0] is None or rng.random() < 0.1 or len(running) > 5:
                for m, r in zip(managers, p.reqs, strict=True):
                    m.free(r)
                running.remove(p)
                continue
            for r in p.reqs:
                r.num_computed_tokens += n
        if rng.random() < 0.1:
            ids = [
                b.block_id for b in managers[0].block_pool.free_block_queue.get_all_free_blocks()
            ]
            victims = set(rng.sample(ids, min(3, len(ids))))
            for m in managers:
                m.evict_blocks(victims)
        if not running and rng.random() < 0.3:
            assert managers[0].reset_prefix_cache() == managers[1].reset_prefix_cache()
        assert collectors[1].calls == collectors[0].calls, step
        assert collectors[1].block_metrics.keys() == collectors[0].block_metrics.keys()
        want, got_events = collectors[0].drain_events(), collectors[1].drain_events()
        assert [len(e.reuse_gaps_seconds) for e in got_events] == [
            len(e.reuse_gaps_seconds) for e in want
        ]
    return collectors[0].calls


@pytest.mark.parametrize("specs", sorted(SPECS))
@pytest.mark.parametrize("enable_caching", [True, False])
@pytest.mark.parametrize("sample_rate", [1.0, 0.3])
def test_same_collector_calls_as_vllm(specs: str, enable_caching: bool, sample_rate: float) -> None:
    calls = run(specs, enable_caching, sample_rate, seed=len(specs) + int(enable_caching))
    kinds = {kind for kind, _ in calls}
    assert {"allocated", "evicted" if enable_caching else "allocated"} <= kinds
    if enable_caching:
        assert "accessed" in kinds


def test_no_collector_no_recording() -> None:
    """Without a collector the manager records nothing and keeps the core's methods."""
    cfg = KVCacheConfig(
        num_blocks=10,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["l0"], SPECS["full"][0])],
    )
    m = kv.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=BS, hash_block_size=BS)
    assert "allocate_slots" not in vars(m)
    assert m.block_pool.metrics_collector is None
    init_none_hash(sha256)
    r = Pair("a", list(range(40))).reqs[0]
    assert m.allocate_slots(r, 40) is not None
    assert m.take_block_metrics() == []
