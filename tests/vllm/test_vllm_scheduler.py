"""The installed vLLM's (0.32 or 0.33) real Scheduler and AsyncScheduler, stock against
`kvblocks.vllm.install()`.

The same shared-prefix workload (a common system prompt, few blocks, enough running
requests that the scheduler preempts) is driven through vLLM's `schedule()` /
`update_from_output()` with a fake model runner, once on stock vLLM and once with kvblocks
installed. What the model runner is handed (new requests' block tables, cached requests'
new blocks and resumptions, finished and preempted ids, scheduled token counts, blocks to
zero, common-prefix blocks) and what the scheduler reports back (sampled tokens, finish
reasons, prefill stats, usage, prefix-cache stats) must be equal at every step.

Each run hashes requests with the hasher vLLM's module exposes at the time: vLLM's own on
the stock run, kvblocks' once installed. Runs in a vLLM venv (`make test-vllm`);
skipped where vLLM is not importable.
"""

from __future__ import annotations

import json
import os
import random
from collections import deque
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

import kvblocks.vllm  # noqa: E402
import vllm.v1.core.kv_cache_utils as kv_cache_utils  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    ModelConfig,
    ObservabilityConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.sched import scheduler as vllm_scheduler  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

STOCK_MANAGER = vllm_scheduler.KVCacheManager

BLOCK_SIZE = 16
NUM_BLOCKS = 1200
MAX_RUNNING = 64
NUM_REQUESTS = 200
SYSTEM_PROMPT = 512  # tokens shared by every request
MAX_BATCHED_TOKENS = 2048
MAX_MODEL_LEN = 2048
EOS = 2

# The model the configs name: opt-125m's published config.json, written locally (no hub).
OPT_125M = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "activation_function": "relu",
    "bos_token_id": 2,
    "do_layer_norm_before": True,
    "eos_token_id": 2,
    "pad_token_id": 1,
    "ffn_dim": 3072,
    "hidden_size": 768,
    "max_position_embeddings": 2048,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "torch_dtype": "float16",
    "vocab_size": 50272,
    "word_embed_proj_dim": 768,
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("opt-125m")
    (path / "config.json").write_text(json.dumps(OPT_125M))
    return path


@pytest.fixture
def kvblocks_vllm() -> Any:
    """kvblocks.vllm for the test to install() once its stock run is done; uninstall()
    runs on teardown whatever happened, so later tests see stock vLLM."""
    if not hasattr(kvblocks.vllm, "install"):
        pytest.skip("kvblocks.vllm.install() is not in this build")
    kvblocks.vllm.uninstall()
    try:
        yield kvblocks.vllm
    finally:
        kvblocks.vllm.uninstall()
    assert vllm_scheduler.KVCacheManager is STOCK_MANAGER


def make_scheduler(
    model_dir: Path,
    async_scheduling: bool,
    kv_cache_metrics_sample: float | None = None,
    *,
    kv_cache_config: KVCacheConfig | None = None,
    **parts: Any,
) -> Scheduler:
    """A scheduler as vLLM's engine core builds one: one full-attention group (or
    `kv_cache_config`'s layout); with `kv_cache_metrics_sample`, vLLM's KV cache metrics
    collector on at that rate; `parts`: more of `VllmConfig` (a KV connector, KV events)."""
    model_config = ModelConfig(
        model=str(model_dir),
        dtype="float16",
        seed=0,
        skip_tokenizer_init=True,
        max_model_len=MAX_MODEL_LEN,
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=MAX_RUNNING,
        max_num_batched_tokens=MAX_BATCHED_TOKENS,
        max_model_len=MAX_MODEL_LEN,
        enable_chunked_prefill=True,
        async_scheduling=async_scheduling,
        is_encoder_decoder=False,
        watermark=0.0,
    )
    cache_config = CacheConfig(
        block_size=BLOCK_SIZE,
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        enable_prefix_caching=True,
        prefix_caching_hash_algo="sha256",
    )
    observability = (
        ObservabilityConfig()
        if kv_cache_metrics_sample is None
        else ObservabilityConfig(
            kv_cache_metrics=True, kv_cache_metrics_sample=kv_cache_metrics_sample
        )
    )
    vllm_config = VllmConfig(
        scheduler_config=scheduler_config,
        model_config=model_config,
        cache_config=cache_config,
        observability_config=observability,
        **parts,
    )
    if kv_cache_config is None:
        spec = FullAttentionSpec(
            block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
        )
        kv_cache_config = KVCacheConfig(
            num_blocks=NUM_BLOCKS,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
        )
    cache_config.num_gpu_blocks = kv_cache_config.num_blocks
    register_all_kvcache_specs(vllm_config)
    cls = AsyncScheduler if async_scheduling else Scheduler
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        block_size=BLOCK_SIZE,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(vllm_config),
    )


def make_requests(seed: int) -> list[tuple[int, Request]]:
    """(arrival step, request): a shared system prompt, a unique question, 32..400 outputs."""
    kv_cache_utils.init_none_hash(sha256)
    # Looked up now, not at import: install() swaps the module attribute.
    hasher = kv_cache_utils.get_request_block_hasher(BLOCK_SIZE, sha256)
    rng = random.Random(seed)
    system = [rng.randrange(100, 50000) for _ in range(SYSTEM_PROMPT)]
    out = []
    for i in range(NUM_REQUESTS):
        question = [rng.randrange(100, 50000) for _ in range(rng.randrange(8, 300))]
        params = SamplingParams(max_tokens=rng.randrange(32, 400), ignore_eos=True)
        params.update_from_generation_config({}, EOS)
        request = Request(
            request_id=f"r{i}",
            prompt_token_ids=system + question,
            sampling_params=params,
            pooling_params=None,
            block_hasher=hasher,
        )
        out.append((i // 4, request))  # four arrivals per step
    return out


def token_for(req_id: str, n: int) -> int:
    return 100 + (int(req_id[1:]) * 7919 + n * 104729) % 49000


def snapshot_output(out: Any) -> dict[str, Any]:
    """What the model runner is handed, in a comparable form."""
    cached = out.scheduled_cached_reqs
    return {
        "new": [
            (r.req_id, [list(g) for g in r.block_ids], r.num_computed_tokens)
            for r in out.scheduled_new_reqs
        ],
        "cached": [
            (
                req_id,
                None if ids is None else [list(g) for g in ids],
                computed,
                req_id in cached.resumed_req_ids,
            )
            for req_id, ids, computed in zip(
                cached.req_ids, cached.new_block_ids, cached.num_computed_tokens, strict=True
            )
        ],
        "num_scheduled_tokens": dict(out.num_scheduled_tokens),
        "total": out.total_num_scheduled_tokens,
        "finished": sorted(out.finished_req_ids),
        "preempted": sorted(out.preempted_req_ids or ()),
        "to_zero": None if out.new_block_ids_to_zero is None else list(out.new_block_ids_to_zero),
        "common_prefix": list(out.num_common_prefix_blocks),
    }


def snapshot_result(result: dict[int, Any]) -> list[Any]:
    """What update_from_output returns: per-request outputs and the scheduler stats."""
    snap: list[Any] = []
    for client, outs in sorted(result.items()):
        for o in outs.outputs:
            snap.append((client, o.request_id, list(o.new_token_ids), o.finish_reason))
            snap.append(repr(o.prefill_stats))
        stats = outs.scheduler_stats
        if stats is not None:
            p = stats.prefix_cache_stats
            snap.append(
                (
                    stats.num_running_reqs,
                    stats.num_waiting_reqs,
                    round(stats.kv_cache_usage, 12),
                    (p.requests, p.queries, p.hits, p.reset),
                    (p.preempted_requests, p.preempted_queries, p.preempted_hits),
                )
            )
    return snap


def drive(scheduler: Scheduler, requests: list[tuple[int, Request]], async_: bool) -> list[Any]:
    """Run the workload to completion; one snapshot per scheduler step."""
    by_id = {r.request_id: r for _, r in requests}
    pending = deque(requests)
    in_flight: deque[tuple[Any, ModelRunnerOutput]] = deque()
    emitted: dict[str, int] = {}
    steps: list[Any] = []
    step = 0
    while pending or scheduler.has_requests() or in_flight:
        while pending and pending[0][0] <= step:
            scheduler.add_request(pending.popleft()[1])
        out = scheduler.schedule()
        step += 1
        # The runner samples a token for every scheduled request whose prefill completes.
        req_ids = list(out.num_scheduled_tokens)
        sampled = []
        for req_id in req_ids:
            if by_id[req_id].is_prefill_chunk:
                sampled.append([])
            else:
                n = emitted.get(req_id, 0)
                emitted[req_id] = n + 1
                sampled.append([token_for(req_id, n)])
        runner_out = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
        )
        snap: dict[str, Any] = {"step": step, "out": snapshot_output(out)}
        if out.total_num_scheduled_tokens:
            in_flight.append((out, runner_out))
        # Async scheduling keeps one step in flight: the output of step N arrives after
        # step N+1 is scheduled (as vLLM's test_async_scheduler.py feeds it).
        while in_flight and (len(in_flight) > int(async_) or not out.total_num_scheduled_tokens):
            done_out, done_runner = in_flight.popleft()
            snap.setdefault("results", []).append(
                snapshot_result(scheduler.update_from_output(done_out, done_runner))
            )
        steps.append(snap)
        assert step < 20_000, "workload did not finish"
    assert scheduler.get_num_unfinished_requests() == 0
    return steps


def run(model_dir: Path, async_: bool, installed: bool) -> tuple[list[Any], int]:
    scheduler = make_scheduler(model_dir, async_)
    manager_module = type(scheduler.kv_cache_manager).__module__
    assert manager_module.startswith("kvblocks") == installed, manager_module
    hasher_module = kv_cache_utils.get_request_block_hasher.__module__
    assert hasher_module.startswith("kvblocks") == installed, hasher_module
    steps = drive(scheduler, make_requests(seed=12), async_)
    preemptions = sum(len(s["out"]["preempted"]) for s in steps)
    return steps, preemptions


@pytest.mark.parametrize("async_", [False, True], ids=["Scheduler", "AsyncScheduler"])
def test_block_tables_equal_stock_at_every_step(
    model_dir: Path, kvblocks_vllm: Any, async_: bool
) -> None:
    stock, stock_preemptions = run(model_dir, async_, installed=False)
    kvblocks_vllm.install()
    kvblocks_vllm.install()  # idempotent
    ours, our_preemptions = run(model_dir, async_, installed=True)

    assert len(stock) > 200, len(stock)
    assert stock_preemptions >= 10, stock_preemptions
    assert sum(bool(s["out"]["cached"]) for s in stock) > 100
    assert any(c[3] for s in stock for c in s["out"]["cached"])  # preempted ones resumed
    for a, b in zip(stock, ours, strict=False):
        assert a == b, f"step {a['step']} differs"
    assert len(stock) == len(ours)
    assert our_preemptions == stock_preemptions


def collector_calls(model_dir: Path) -> tuple[list[tuple[str, int, bool]], int]:
    """The scheduler's KV cache metrics collector (sampling a quarter of the blocks, from a
    seeded `random`) over the workload: each call with its block id and whether the block
    is sampled after it, and the eviction events the scheduler's stats carried."""
    random.seed(3)
    scheduler = make_scheduler(model_dir, False, kv_cache_metrics_sample=0.25)
    collector = scheduler.kv_metrics_collector
    assert scheduler.kv_cache_manager.metrics_collector is collector
    calls: list[tuple[str, int, bool]] = []
    for name in ("on_block_allocated", "on_block_accessed", "on_block_evicted"):
        method = getattr(collector, name)

        def logged(block: Any, name: str = name, method: Any = method) -> None:
            method(block)
            calls.append((name, block.block_id, block.block_id in collector.block_metrics))

        setattr(collector, name, logged)
    events = 0
    make_stats = scheduler.make_stats

    def counting_stats(*args: Any, **kwargs: Any) -> Any:
        nonlocal events
        stats = make_stats(*args, **kwargs)
        events += len(stats.kv_cache_eviction_events) if stats is not None else 0
        return stats

    scheduler.make_stats = counting_stats  # type: ignore[method-assign]
    drive(scheduler, make_requests(seed=12), False)
    return calls, events


def test_kv_cache_metrics_collector_equal_stock(model_dir: Path, kvblocks_vllm: Any) -> None:
    """With `kv_cache_metrics` on, the scheduler's collector gets the same calls on the same
    blocks, samples the same blocks and reports as many evictions on kvblocks as stock."""
    if "kv_cache_metrics" not in ObservabilityConfig.__dataclass_fields__:
        pytest.skip("this vLLM has no KV cache metrics collector")
    stock = collector_calls(model_dir)
    kvblocks_vllm.install()
    ours = collector_calls(model_dir)
    kinds = {name for name, _, _ in stock[0]}
    assert kinds == {"on_block_allocated", "on_block_accessed", "on_block_evicted"}
    assert stock[1] > 0
    assert ours == stock
