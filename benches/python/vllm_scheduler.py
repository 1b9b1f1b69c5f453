"""vLLM 0.33.0's scheduler step, stock against `kvblocks.vllm.install()`, in one process.

Run in the oracle venv with this build of kvblocks importable (see `make test-vllm`):

    PYTHONPATH=.oracle-site $VREF/bin/python benches/python/vllm_scheduler.py [--json]

A shared-prefix workload (every prompt starts with the same 512-token system prompt, a
unique question of 8..300 tokens, 32..400 outputs, few blocks so that the scheduler
preempts) runs through vLLM's real `Scheduler` with a fake model runner at 64 and 256
running requests. Rounds alternate which side goes first; every number is the median over
rounds. Per side and round there are two runs of the same workload:

- plain: `schedule()` + `update_from_output()` per step, timed around the pair (the fake
  runner's output is built outside the window), over the steps that run at full batch;
- wrapped: every public method of the scheduler's manager instance is wrapped, on both
  sides alike, by one timer that sums the time spent inside it. The timer's own cost per
  call (what it reads around an empty call, measured for positional calls and for calls
  with keywords, whose forwarding costs the wrapper more) is measured too, and `KV net`
  subtracts each call's cost from the raw sum.

Last, `Request()` with a 32k-token prompt (vllm_request_bench.py beside this file).
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import kvblocks.vllm
import torch
import vllm.v1.core.kv_cache_utils as kv_cache_utils
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK_SIZE = 16
SYSTEM_PROMPT = 512
MAX_MODEL_LEN = 2048
# running -> (requests, blocks, max_num_batched_tokens, arrivals per step)
LEVELS = {64: (200, 1200, 2048, 4), 256: (800, 4800, 8192, 16)}
OPT_125M = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "activation_function": "relu",
    "bos_token_id": 2,
    "eos_token_id": 2,
    "pad_token_id": 1,
    "do_layer_norm_before": True,
    "ffn_dim": 3072,
    "hidden_size": 768,
    "max_position_embeddings": 2048,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "torch_dtype": "float16",
    "vocab_size": 50272,
    "word_embed_proj_dim": 768,
}


def make_scheduler(model_dir: str, running: int) -> Scheduler:
    _, blocks, batched, _ = LEVELS[running]
    model_config = ModelConfig(
        model=model_dir, dtype="float16", seed=0, skip_tokenizer_init=True, max_model_len=2048
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=running,
        max_num_batched_tokens=batched,
        max_model_len=MAX_MODEL_LEN,
        enable_chunked_prefill=True,
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
    vllm_config = VllmConfig(
        scheduler_config=scheduler_config, model_config=model_config, cache_config=cache_config
    )
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)]
    )
    cache_config.num_gpu_blocks = blocks
    register_all_kvcache_specs(vllm_config)
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        block_size=BLOCK_SIZE,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(vllm_config),
    )


def make_requests(running: int, seed: int = 7) -> list[tuple[int, Request]]:
    num, _, _, per_step = LEVELS[running]
    kv_cache_utils.init_none_hash(sha256)
    hasher = kv_cache_utils.get_request_block_hasher(BLOCK_SIZE, sha256)  # the side's own
    rng = random.Random(seed)
    system = [rng.randrange(100, 50000) for _ in range(SYSTEM_PROMPT)]
    out = []
    for i in range(num):
        question = [rng.randrange(100, 50000) for _ in range(rng.randrange(8, 300))]
        params = SamplingParams(max_tokens=rng.randrange(32, 400), ignore_eos=True)
        params.update_from_generation_config({}, 2)
        req = Request(f"r{i}", system + question, params, None, block_hasher=hasher)
        out.append((i // per_step, req))
    return out


class Timer:
    """Sums the time spent inside wrapped calls; the same wrapper on both sides. A public
    method the manager calls on itself is inside the outer window and is not counted twice."""

    def __init__(self) -> None:
        self.ns = 0
        self.calls = 0
        self.kw_calls = 0  # calls with keyword arguments (their wrapper costs more)
        self.depth = 0
        self.by_name: dict[str, list[int]] = {}  # name -> [ns, calls] over the whole run

    def wrap(self, fn: Callable[..., Any], name: str = "") -> Callable[..., Any]:
        clock = time.perf_counter_ns
        acc = self.by_name.setdefault(name, [0, 0])

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return fn(*args, **kwargs)
            self.depth = 1
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = clock() - t0
                self.ns += dt
                self.calls += 1
                self.kw_calls += bool(kwargs)
                acc[0] += dt
                acc[1] += 1
                self.depth = 0

        return timed


def wrap_manager(manager: Any, timer: Timer) -> list[str]:
    """Wrap every public method of the manager instance (instance attributes shadow them)."""
    names = []
    for name in dir(type(manager)):
        if name.startswith("_") or not inspect.isroutine(getattr(type(manager), name, None)):
            continue  # properties and getters (usage, block_pool, ...) are not wrapped
        setattr(manager, name, timer.wrap(getattr(manager, name), name))
        names.append(name)
    return names


def timer_cost_ns(keywords: bool, n: int = 200_000) -> float:
    """What the timer reads around an empty call, per call: positional only, or shaped like
    vLLM's per-step `allocate_slots(request, n, num_lookahead_tokens=k)` (forwarding
    keywords through `**kwargs` costs the wrapper a dict and its unpacking)."""

    def empty(*args: Any, **kwargs: Any) -> None:
        return None

    timer = Timer()
    f = timer.wrap(empty)
    if keywords:
        for _ in range(n):
            f(None, 1, num_lookahead_tokens=0)
    else:
        for _ in range(n):
            f(None, 1)
    return timer.ns / n


def drive(running: int, model_dir: str, wrapped: bool) -> dict[str, Any]:
    scheduler = make_scheduler(model_dir, running)
    module = type(scheduler.kv_cache_manager).__module__
    assert module.startswith("kvblocks") == kvblocks.vllm.installed(), module
    timer = Timer()
    if wrapped:
        wrap_manager(scheduler.kv_cache_manager, timer)
    requests = make_requests(running)
    by_id = {r.request_id: r for _, r in requests}
    pending = list(reversed(requests))
    emitted: dict[str, int] = {}
    clock = time.perf_counter_ns
    step = steps_full = step_ns = kv_ns = kv_calls = kw_calls = preempted = 0
    gc.collect()
    while pending or scheduler.has_requests():
        while pending and pending[-1][0] <= step:
            scheduler.add_request(pending.pop()[1])
        kv0, calls0, kw0 = timer.ns, timer.calls, timer.kw_calls
        t0 = clock()
        out = scheduler.schedule()
        t1 = clock()
        req_ids = list(out.num_scheduled_tokens)
        sampled = []
        for req_id in req_ids:
            if by_id[req_id].is_prefill_chunk:
                sampled.append([])
            else:
                n = emitted.get(req_id, 0)
                emitted[req_id] = n + 1
                sampled.append([100 + (int(req_id[1:]) * 7919 + n * 104729) % 49000])
        runner_out = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
        )
        t2 = clock()
        scheduler.update_from_output(out, runner_out)
        t3 = clock()
        step += 1
        preempted += len(out.preempted_req_ids or ())
        if len(req_ids) >= running:
            steps_full += 1
            step_ns += (t1 - t0) + (t3 - t2)
            kv_ns += timer.ns - kv0
            kv_calls += timer.calls - calls0
            kw_calls += timer.kw_calls - kw0
    methods = {
        name: {"us_per_step": ns / step / 1e3, "calls_per_step": calls / step}
        for name, (ns, calls) in sorted(timer.by_name.items(), key=lambda kv: -kv[1][0])
        if calls
    }
    return {
        "methods": methods,
        "steps": step,
        "full_steps": steps_full,
        "preemptions": preempted,
        "step_us": step_ns / max(steps_full, 1) / 1e3,
        "kv_us": kv_ns / max(steps_full, 1) / 1e3,
        "kv_calls": kv_calls / max(steps_full, 1),
        "kw_calls": kw_calls / max(steps_full, 1),
    }


def set_side(side: str) -> None:
    if side == "kvblocks":
        kvblocks.vllm.install(fallback=False)
    elif hasattr(kvblocks.vllm, "uninstall"):
        kvblocks.vllm.uninstall()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--running", type=int, nargs="*", default=sorted(LEVELS), choices=LEVELS)
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--stock-only", action="store_true", help="time stock vLLM alone")
    p.add_argument(
        "--request-rounds",
        type=int,
        default=15,
        help="rounds of vllm_request_bench.py's Request() with a 32k prompt (0: skip)",
    )
    args = p.parse_args()
    have_kb = hasattr(kvblocks.vllm, "install")
    sides = ["stock"] if args.stock_only or not have_kb else ["stock", "kvblocks"]
    if not have_kb and not args.stock_only:
        print("kvblocks.vllm.install() is not in this build: stock only", file=sys.stderr)
    model_dir = tempfile.mkdtemp(prefix="opt-125m-")
    (Path(model_dir) / "config.json").write_text(json.dumps(OPT_125M))
    cost = statistics.median(timer_cost_ns(False) for _ in range(5))
    cost_kw = statistics.median(timer_cost_ns(True) for _ in range(5))
    rows: dict[str, Any] = {"timer_cost_ns": cost, "timer_cost_kw_ns": cost_kw, "levels": {}}
    try:
        for running in args.running:
            runs: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
            methods: dict[str, list[dict[str, dict[str, float]]]] = {s: [] for s in sides}
            for r in range(args.rounds):
                order = sides if r % 2 == 0 else sides[::-1]
                for side in order:
                    set_side(side)
                    plain = drive(running, model_dir, wrapped=False)
                    wrapped = drive(running, model_dir, wrapped=True)
                    positional = wrapped["kv_calls"] - wrapped["kw_calls"]
                    timer_us = (positional * cost + wrapped["kw_calls"] * cost_kw) / 1e3
                    kv_net = wrapped["kv_us"] - timer_us
                    methods[side].append(wrapped.pop("methods"))
                    del plain["methods"]
                    runs[side].append({**plain, "kv_us": wrapped["kv_us"], "kv_net_us": kv_net,
                                       "kv_calls": wrapped["kv_calls"],
                                       "wrapped_step_us": wrapped["step_us"]})  # fmt: skip
            level: dict[str, Any] = {
                side: {k: statistics.median(x[k] for x in rs) for k in rs[0]}
                for side, rs in runs.items()
            }
            for side, ms in methods.items():  # whole runs, all steps: where the time goes
                med = {
                    name: {
                        k: statistics.median(m.get(name, {}).get(k, 0.0) for m in ms)
                        for k in ("us_per_step", "calls_per_step")
                    }
                    for name in ms[0]
                }
                level[side]["methods"] = dict(
                    sorted(med.items(), key=lambda kv: -kv[1]["us_per_step"])
                )
            if len(sides) == 2:
                s, k = level["stock"], level["kvblocks"]
                level["ratio"] = {
                    "step": s["step_us"] / k["step_us"],
                    "kv": s["kv_us"] / k["kv_us"],
                    "kv_net": s["kv_net_us"] / max(k["kv_net_us"], 1e-9),
                }
            rows["levels"][running] = level
    finally:
        if have_kb:
            kvblocks.vllm.uninstall()
    if len(sides) == 2 and args.request_rounds:
        # Request() with a 32k-token prompt, vLLM's hasher against kvblocks' (sha256, as
        # the workload above and vLLM's default), from the sibling bench.
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from vllm_request_bench import bench_request

        rows["request_32k"] = bench_request("sha256", 32 * 1024, rounds=args.request_rounds)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"timer cost per wrapped call: {cost:.0f} ns positional, {cost_kw:.0f} ns with "
        f"keywords; medians of {args.rounds} rounds"
    )
    head = f"{'running':>7} {'side':<9} {'step µs':>9} {'KV µs':>8} {'KV net µs':>10}"
    print(head + f" {'KV calls':>9} {'full steps':>10} {'steps':>6} {'preempt':>8}")
    for running, level in rows["levels"].items():
        for side in sides:
            x = level[side]
            print(
                f"{running:>7} {side:<9} {x['step_us']:>9.1f} {x['kv_us']:>8.1f} "
                f"{x['kv_net_us']:>10.1f} {x['kv_calls']:>9.1f} {x['full_steps']:>10.0f} "
                f"{x['steps']:>6.0f} {x['preemptions']:>8.0f}"
            )
        if "ratio" in level:
            q = level["ratio"]
            print(
                f"{running:>7} {'ratio':<9} {q['step']:>8.2f}x {q['kv']:>7.1f}x "
                f"{q['kv_net']:>9.1f}x"
            )
    print("\nKV time by method, whole runs (µs per step, calls per step), top 6:")
    for running, level in rows["levels"].items():
        for side in sides:
            top = list(level[side]["methods"].items())[:6]
            cells = ", ".join(
                f"{n} {m['us_per_step']:.1f} ({m['calls_per_step']:.1f})" for n, m in top
            )
            print(f"{running:>7} {side:<9} {cells}")
    if "request_32k" in rows:
        r = rows["request_32k"]
        print(
            f"Request() with a 32k-token prompt (sha256): stock {r['vllm_ns'] / 1e3:.0f} µs, "
            f"kvblocks {r['kvblocks_ns'] / 1e3:.0f} µs, {r['ratio']:.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
