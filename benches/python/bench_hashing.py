"""vLLM 0.33.0 vs kvblocks block hashing (sha256_cbor, block size 16), per block.

Run in the oracle venv with kvblocks installed to a side folder:

    maturin build --release -o dist
    /work/oracle/venv/bin/pip install -q --no-deps --target dist/site dist/kvblocks-*.whl
    PYTHONPATH=dist/site /work/oracle/venv/bin/python benches/python/bench_hashing.py

Four ways of hashing the same chained prompt, all timed in this process:
* vLLM ``hash_block_tokens`` called per block (the baseline);
* vLLM ``Request`` + ``get_request_block_hasher`` (the whole prompt);
* ``kb.hash_block_tokens`` called per block;
* ``kb.Request`` + ``kb.BlockHasher`` (the whole prompt, one call).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import kvblocks as kb
import vllm.v1.core.kv_cache_utils as kcu
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.request import Request

ALGO = "sha256_cbor"
BS = 16


def best_ns(fn: Callable[[], object], repeat: int) -> tuple[int, int]:
    """Best wall-clock and best thread-CPU time of `repeat` runs, in ns.

    CPU time is reported too because the build machine is shared: waiting for a core
    inflates wall-clock time, not this thread's CPU time.
    """
    walls, cpus = [], []
    for _ in range(repeat):
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        fn()
        cpus.append(time.thread_time_ns() - c0)
        walls.append(time.perf_counter_ns() - w0)
    return min(walls), min(cpus)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16 * 2048)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()

    rng = random.Random(0)
    prompt = [rng.randrange(150_000) for _ in range(args.tokens)]
    blocks = [prompt[i : i + BS] for i in range(0, len(prompt) - BS + 1, BS)]
    n = len(blocks)

    fn = get_hash_fn_by_name(ALGO)
    kcu.init_none_hash(fn)
    assert kcu.NONE_HASH == kb.none_hash(ALGO), "NONE_HASH differs (PYTHONHASHSEED?)"

    def vllm_per_block() -> list[bytes]:
        out, parent = [], None
        for b in blocks:
            parent = kcu.hash_block_tokens(fn, parent, b, None)
            out.append(parent)
        return out

    def vllm_request() -> list[bytes]:
        hasher = kcu.get_request_block_hasher(BS, fn)
        req = Request("r", prompt, SamplingParams(max_tokens=1), None, block_hasher=hasher)
        return list(req.block_hashes)

    def kb_per_block() -> list[bytes]:
        out, parent = [], None
        for b in blocks:
            parent = kb.hash_block_tokens(ALGO, parent, b)
            out.append(parent)
        return out

    hasher = kb.BlockHasher(BS, ALGO)

    def kb_request() -> list[bytes]:
        return kb.Request("r", prompt, hasher).block_hashes

    want = vllm_per_block()
    assert vllm_request() == want and kb_per_block() == want and kb_request() == want

    rows = [
        ("vllm hash_block_tokens per block", best_ns(vllm_per_block, args.repeat)),
        ("vllm Request (whole prompt)", best_ns(vllm_request, args.repeat)),
        ("kvblocks hash_block_tokens per block", best_ns(kb_per_block, args.repeat)),
        ("kvblocks Request (whole prompt)", best_ns(kb_request, args.repeat)),
    ]
    base_wall, base_cpu = rows[0][1]
    print(f"{ALGO}, block size {BS}, {n} chained blocks, best of {args.repeat}")
    print(f"{'':38s} {'wall ns/block':>14s} {'speedup':>8s} {'cpu ns/block':>13s} {'speedup':>8s}")
    for name, (wall, cpu) in rows:
        print(
            f"{name:38s} {wall / n:14.1f} {base_wall / wall:7.1f}x"
            f" {cpu / n:13.1f} {base_cpu / cpu:7.1f}x"
        )


if __name__ == "__main__":
    main()
