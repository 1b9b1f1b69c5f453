"""vLLM 0.33's host-tier cache policies vs kvblocks', per key, in one process.

Run in the vLLM 0.33 venv with kvblocks on PYTHONPATH, e.g.:
    VLLM_TARGET_DEVICE=cpu PYTHONPATH=$PWD/.oracle-site.0.33 \\
        /work/main/.venv-vllm-0.33/bin/python benches/python/offload_policies.py

For each policy (`lru`, `arc`) three implementations run the same calls:

- `vllm`: vLLM's `CPUOffloadingManager` with its own Python policy (stock);
- `vllm+kvblocks`: vLLM's manager with kvblocks' policy (`kvblocks-lru` / `kvblocks-arc`,
  what `eviction_policy` selects through the plugin);
- `kvblocks`: `kvblocks.OffloadManager`, manager and policy in Rust (the simulator's).

One round builds a fresh tier of `--chunks` chunks per implementation and times, per key:
`prepare_store` of `--keys` new keys in batches of `--batch` (evicting once full), each
followed by its `complete_store` (timed apart), then `lookup` of every key (the last
`--chunks` hit) and `touch` of every key in batches. The
implementations alternate within each round (rotated start); the table gives the median
over `--rounds` rounds of ns per key, and the ratio vLLM / other.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import kvblocks as kb
from kvblocks.vllm._offload import register
from vllm.v1.kv_offload.base import ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

OPS = ("prepare_store", "complete_store", "lookup", "touch")


def one_round(
    m: Any,
    req: Any,
    extra: tuple[Any, ...],
    stored_of: Callable[[Any], list[bytes]],
    keys: list[bytes],
    batch: int,
) -> dict[str, float]:
    """ns per key of each op on manager `m`; `req` names the request in `prepare_store`,
    `extra` follows the keys in the other calls (vLLM's request context, or nothing)."""
    batches = [keys[i : i + batch] for i in range(0, len(keys), batch)]
    prepare = complete = 0
    for b in batches:
        t0 = time.perf_counter_ns()
        out = m.prepare_store(b, req)
        t1 = time.perf_counter_ns()
        m.complete_store(stored_of(out), *extra)
        complete += time.perf_counter_ns() - t1
        prepare += t1 - t0
    t0 = time.perf_counter_ns()
    for key in keys:
        m.lookup(key, *extra)
    t1 = time.perf_counter_ns()
    for b in batches:
        m.touch(b, *extra)
    t2 = time.perf_counter_ns()
    return {
        "prepare_store": prepare / len(keys),
        "complete_store": complete / len(keys),
        "lookup": (t1 - t0) / len(keys),
        "touch": (t2 - t1) / len(keys),
    }


def round_vllm(policy: str, keys: list[bytes], chunks: int, batch: int) -> dict[str, float]:
    """vLLM's manager under `policy` (a factory name)."""
    ctx = ReqContext(req_id="bench")
    m = CPUOffloadingManager(chunks, cache_policy=policy)
    return one_round(m, ctx, (ctx,), lambda o: [] if o is None else o.keys_to_store, keys, batch)


def round_kvblocks(policy: str, keys: list[bytes], chunks: int, batch: int) -> dict[str, float]:
    """`kvblocks.OffloadManager`."""
    m = kb.OffloadManager(chunks, policy)
    return one_round(m, "bench", (), lambda o: [] if o is None else o[0], keys, batch)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--chunks", type=int, default=8192)
    p.add_argument("--keys", type=int, default=32768)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    register()
    keys = [make_offload_key(i.to_bytes(32, "big"), 0) for i in range(args.keys)]
    impls: dict[str, Callable[[str], dict[str, float]]] = {
        "vllm": lambda pol: round_vllm(pol, keys, args.chunks, args.batch),
        "vllm+kvblocks": lambda pol: round_vllm(f"kvblocks-{pol}", keys, args.chunks, args.batch),
        "kvblocks": lambda pol: round_kvblocks(pol, keys, args.chunks, args.batch),
    }
    names = list(impls)
    print(
        f"{args.keys} keys into {args.chunks} chunks, batches of {args.batch}, "
        f"median of {args.rounds} alternated rounds, ns per key"
    )
    print(
        "| policy | op | vllm | vllm+kvblocks | kvblocks | vllm / vllm+kvblocks | vllm / kvblocks |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    gc.collect()
    gc.freeze()
    for policy in ("lru", "arc"):
        samples: dict[str, dict[str, list[float]]] = {n: {op: [] for op in OPS} for n in names}
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                for op, ns in impls[name](policy).items():
                    samples[name][op].append(ns)
        for op in OPS:
            med = {n: statistics.median(samples[n][op]) for n in names}
            print(
                f"| {policy} | {op} | {med['vllm']:.0f} | {med['vllm+kvblocks']:.0f} | "
                f"{med['kvblocks']:.0f} | {med['vllm'] / med['vllm+kvblocks']:.2f} | "
                f"{med['vllm'] / med['kvblocks']:.2f} |"
            )


if __name__ == "__main__":
    main()
