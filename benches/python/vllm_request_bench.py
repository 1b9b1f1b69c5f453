"""vLLM 0.33.0's `Request()` with a long prompt: vLLM's block hasher against kvblocks'.

Run in the oracle venv with this build of kvblocks on the path (`make test-vllm` leaves
it in .oracle-site):

    PYTHONPATH=.oracle-site .venv-vllm-oracle/bin/python benches/python/vllm_request_bench.py

Times `vllm.v1.request.Request(...)` with a 32k-token prompt (which hashes every full
block of the prompt through the request's `block_hasher`) with
`vllm.v1.core.kv_cache_utils.get_request_block_hasher` and with
`kvblocks.vllm.get_request_block_hasher`, in one process, alternating rounds, and reports
the medians and their ratio per algorithm. Also times a decode step
(`append_output_token_ids` of one token, the hasher's early return) for each, and
`Request()` with a hasher that returns no hash: `Request()`'s own work (copying the
prompt, ...), which both sides pay and no hasher can remove.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import kvblocks.vllm as kv
import vllm.v1.core.kv_cache_utils as kcu
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.request import Request


def _time_ns(fn: Callable[[], object], inner: int) -> float:
    """Mean wall-clock ns of `fn` over `inner` back-to-back calls, GC paused."""
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        return (time.perf_counter_ns() - t0) / inner
    finally:
        gc.enable()


def _no_hash(request: Request) -> list[bytes]:
    """A block hasher that hashes nothing."""
    return []


def bench_request(
    algo: str = "sha256_cbor",
    prompt_tokens: int = 32 * 1024,
    hash_block_size: int = 16,
    rounds: int = 15,
    inner: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """`Request()` with a `prompt_tokens`-token prompt, vLLM's hasher against kvblocks'.

    Alternates one round of `inner` constructions per side, `rounds` times, and returns
    the median ns per `Request()` of each side, their ratio, the same for one decode
    append (no new block) per side, and the median ns of `Request()` with a no-op hasher.
    """
    fn = get_hash_fn_by_name(algo)
    kcu.init_none_hash(fn)
    hashers = {
        "vllm": kcu.get_request_block_hasher(hash_block_size, fn),
        "kvblocks": kv.get_request_block_hasher(hash_block_size, fn),
    }
    rng = random.Random(seed)
    prompt = [rng.randrange(150_000) for _ in range(prompt_tokens)]
    params = SamplingParams(max_tokens=16)

    def make(side: str) -> Request:
        return Request("r", prompt, params, None, block_hasher=hashers[side])

    # Same hashes on both sides before timing anything.
    want = make("vllm").block_hashes
    assert make("kvblocks").block_hashes == want and len(want) == prompt_tokens // hash_block_size
    times: dict[str, list[float]] = {side: [] for side in hashers}
    decode: dict[str, list[float]] = {side: [] for side in hashers}
    own: list[float] = []
    for r in range(rounds):
        order = list(hashers) if r % 2 == 0 else list(hashers)[::-1]
        for side in order:
            times[side].append(_time_ns(lambda s=side: make(s), inner))
            req = make(side)
            decode[side].append(_time_ns(lambda req=req: req.append_output_token_ids(1), 200))
        alone = lambda: Request("r", prompt, params, None, block_hasher=_no_hash)  # noqa: E731
        own.append(_time_ns(alone, inner))
    med = {side: statistics.median(v) for side, v in times.items()}
    dmed = {side: statistics.median(v) for side, v in decode.items()}
    return {
        "algo": algo,
        "prompt_tokens": prompt_tokens,
        "vllm_ns": med["vllm"],
        "kvblocks_ns": med["kvblocks"],
        "ratio": med["vllm"] / med["kvblocks"],
        "decode_vllm_ns": dmed["vllm"],
        "decode_kvblocks_ns": dmed["kvblocks"],
        "request_alone_ns": statistics.median(own),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=32 * 1024)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--algos", default="sha256_cbor,xxhash_cbor,sha256,xxhash")
    args = ap.parse_args()
    print(
        f"{'algo':<12} {'vLLM Request()':>15} {'kvblocks':>12} {'ratio':>7}"
        f" {'decode vLLM':>12} {'decode kvb':>11} {'no-op hasher':>13}"
    )
    for algo in args.algos.split(","):
        try:
            r = bench_request(algo, args.tokens, rounds=args.rounds)
        except ModuleNotFoundError as e:  # vLLM's xxhash algorithms need `xxhash`
            print(f"{algo:<12} skipped: {e}")
            continue
        print(
            f"{algo:<12} {r['vllm_ns'] / 1e3:>12.0f} µs {r['kvblocks_ns'] / 1e3:>9.0f} µs"
            f" {r['ratio']:>6.1f}x {r['decode_vllm_ns']:>9.0f} ns"
            f" {r['decode_kvblocks_ns']:>8.0f} ns {r['request_alone_ns'] / 1e3:>10.0f} µs"
        )


if __name__ == "__main__":
    main()
