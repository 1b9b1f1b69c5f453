#!/usr/bin/env python3
"""Replay a trace through kvblocks (and/or vLLM 0.33) and time the KV cache manager.

The conformance and speed driver of the project: the scheduler loop of
``kvblocks.sim.engine`` (the one the oracle's ``driver_vllm.py`` runs), the same flags, and
ONE JSON line on stdout with the driver's field names (``calls``, ``kv_total_ns``,
``request_hash_ns``, ``digest``, ...). Digests equal to the driver's mean identical block
allocation.

    python benches/python/replay.py TRACE.jsonl --config hybrid --num-blocks 32768
    python benches/python/replay.py TRACE.jsonl --impl vllm          # vLLM's manager
    python benches/python/replay.py TRACE.jsonl --batch               # allocate_slots_batch
    python benches/python/replay.py TRACE.jsonl --compare             # all three, one line
    python benches/python/replay.py TRACE.jsonl --compare --repeat 3  # medians of 3 rounds

``--compare`` replays vLLM, kvblocks and kvblocks with the batched decode call in one
process and prints ``{"runs": {name: summary}, "compare": {...}}``: per kvblocks run the
ratio vLLM / kvblocks of (KV-manager time + hashing time), and whether all digests agree.
Every timed call's measurement also holds part of its own ``perf_counter_ns`` pair (what an
empty window reads, ``timer_window_ns``: about 60-140 ns here), which is much of a kvblocks
call: ``kv_plus_hash_speedup_net_of_timer`` is the same ratio with
``timed_calls * timer_window_ns`` taken out of both sides. vLLM's own time moves by up to
half from run to run on a shared machine: ``--repeat N`` replays the three N times in turn
and reports each ratio's median (``rounds`` lists every round's ratios).
Run it inside the oracle venv with kvblocks installed via ``pip install --target``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

from kvblocks.sim.backends import make_backend, vllm_available
from kvblocks.sim.engine import ReplayError, ReplayOptions, ReplayResult, replay
from kvblocks.sim.presets import (
    REPLAY_CONFIGS,
    KVLayout,
    hisparse_min_host_blocks,
    replay_layout,
)
from kvblocks.sim.workloads import Trace, TraceError, read_trace


def timer_overhead_ns(n: int = 200000) -> int:
    """Best-of-5 cost of one timing pair around nothing."""
    pc = time.perf_counter_ns
    best = None
    for _ in range(5):
        t0 = pc()
        for _ in range(n):
            a = pc()
            _ = pc() - a
        per = (pc() - t0) / n
        best = per if best is None else min(best, per)
    return round(best or 0)


def timer_window_ns(n: int = 200000) -> int:
    """Best-of-5 mean of what a timing window around nothing reads: the part of the pair's
    cost that lands inside every timed call's measurement."""
    pc = time.perf_counter_ns
    best = None
    for _ in range(5):
        total = 0
        for _ in range(n):
            a = pc()
            total += pc() - a
        best = total / n if best is None else min(best, total / n)
    return round(best or 0)


def summary(
    res: ReplayResult, args: argparse.Namespace, trace: Trace, layout: KVLayout, setup_s: float
) -> dict[str, Any]:
    """The driver's summary fields for one replay."""
    n_req, gen = res.requests, res.generated_tokens
    kv_total = res.kv_total_ns
    version = vllm_available() if res.impl == "vllm" else None
    if res.impl != "vllm":
        import kvblocks

        version = kvblocks.__version__
    return {
        "impl": res.impl + ("-batch" if res.samples["alloc_batch"] else ""),
        "version": version,
        "python": platform.python_version(),
        "label": args.label,
        "trace": os.path.abspath(args.trace),
        "kind": trace.kind,
        "trace_seed": trace.seed,
        "config": {
            "kv_config": args.config,
            "num_blocks": layout.num_blocks,
            "block_size": args.block_size,
            "sliding_window": args.sliding_window
            if args.config in ("hybrid", "swa", "deepseek-v4")
            else None,
            "chunk_size": args.chunk_size if args.config == "chunked" else None,
            "dcp_world_size": args.dcp_world_size,
            "hisparse_host_blocks": layout.hisparse_host_num_blocks,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "max_num_seqs": args.max_num_seqs,
            "max_model_len": args.max_model_len,
            "prefix_caching": not args.no_prefix_caching,
            "reserve_full_isl": args.reserve_full_isl,
            "hash_algo": args.hash_algo,
        },
        "requests": n_req,
        "prompt_tokens": res.prompt_tokens,
        "generated_tokens": gen,
        "steps": res.steps,
        "last_step": res.last_step,
        "preemptions": res.preemptions,
        "alloc_failures": res.alloc_failures,
        "block_copies": res.block_copies,
        "prefix_cache": {
            "queried_tokens": res.queried_tokens,
            "hit_tokens": res.hit_tokens,
            "hit_rate": round(res.hit_tokens / res.queried_tokens, 6)
            if res.queried_tokens
            else 0.0,
            "first_admission": dict(
                zip(("requests", "queried_tokens", "hit_tokens"), res.first_admission, strict=True)
            ),
            "resumed": dict(
                zip(("requests", "queried_tokens", "hit_tokens"), res.resumed, strict=True)
            ),
        },
        "calls": res.calls(),
        "batched_requests": res.batched_requests,
        "kv_total_ns": kv_total,
        "kv_ns_per_request": round(kv_total / n_req, 1) if n_req else 0,
        "kv_ns_per_generated_token": round(kv_total / gen, 1) if gen else 0,
        "request_hash_ns": res.request_hash_ns,
        "request_init_ns": res.request_init_ns,
        "append_token_ns": res.append_ns,
        "timer_overhead_ns": args.timer_overhead,
        "timer_window_ns": args.timer_window,
        "timed_calls": res.timed_calls,
        "replay_wall_s": round(res.wall_s, 3),
        "setup_s": round(setup_s, 3),
        "final_free_blocks": res.final_free_blocks,
        "digest": res.digest,
        "num_events": res.num_events,
    }


def run_one(
    impl: str, batch: bool, args: argparse.Namespace, trace: Trace, layout: KVLayout
) -> dict[str, Any]:
    t0 = time.perf_counter()
    backend = make_backend(impl, layout, args.hash_algo, batch)
    events = None
    if args.events_out:
        suffix = "" if not args.compare else f".{impl}{'-batch' if batch else ''}"
        events = open(args.events_out + suffix, "w")
    opts = ReplayOptions(
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        reserve_full_isl=bool(args.reserve_full_isl),
        digest=not args.no_digest,
        events_out=events,
        max_steps=args.max_steps,
    )
    gc.collect()
    if not args.no_gc_freeze:
        gc.freeze()  # as vLLM's engine core does after start-up
    setup_s = time.perf_counter() - t0
    try:
        res = replay(trace, backend, opts)
    finally:
        if events is not None:
            events.close()
        gc.unfreeze()
    return summary(res, args, trace, layout, setup_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="kvtrace-v1 or Mooncake JSON-lines trace")
    ap.add_argument("--impl", choices=("kvblocks", "vllm"), default="kvblocks")
    ap.add_argument(
        "--batch", action="store_true", help="kvblocks: running loop through allocate_slots_batch"
    )
    ap.add_argument(
        "--compare",
        action="store_true",
        help="run vLLM, kvblocks and kvblocks --batch; print ratios and digest check",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="with --compare: run the three N times, alternating; ratios are the medians",
    )
    ap.add_argument("--config", choices=REPLAY_CONFIGS, default="full")
    ap.add_argument("--num-blocks", type=int, default=32768)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--sliding-window", type=int, default=1024)
    ap.add_argument("--chunk-size", type=int, default=8192, help="chunked local attention chunk")
    ap.add_argument("--dcp-world-size", type=int, default=1, help="decode context parallel ranks")
    ap.add_argument(
        "--hisparse-host-blocks",
        default=None,
        help="--config hisparse: blocks of the host pool (default: --num-blocks), or 'min': "
        "the fewest vLLM lays out for the trace's longest sequence",
    )
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=262144)
    ap.add_argument("--no-prefix-caching", action="store_true")
    ap.add_argument(
        "--retention-interval",
        type=int,
        default=None,
        help="vLLM 0.33's prefix_cache_retention_interval: sparse caching of sliding-window "
        "and Mamba states, one per N tokens (0: only the reachable boundaries; default: dense)",
    )
    ap.add_argument("--reserve-full-isl", type=int, choices=(0, 1), default=1)
    ap.add_argument(
        "--hash-algo",
        default="sha256_cbor",
        help="sha256_cbor (default), xxhash_cbor, ...; vLLM also has sha256",
    )
    ap.add_argument("--max-requests", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument(
        "--events-out", help="write the digest lines here (.IMPL suffix with --compare)"
    )
    ap.add_argument("--no-digest", action="store_true")
    ap.add_argument("--no-gc-freeze", action="store_true")
    ap.add_argument("--label", default=None)
    ap.add_argument("--mooncake-block", type=int, default=512)
    ap.add_argument("--step-ms", type=float, default=50.0)
    args = ap.parse_args(argv)
    for name in (
        "num_blocks",
        "block_size",
        "max_num_batched_tokens",
        "max_num_seqs",
        "max_model_len",
        "sliding_window",
        "chunk_size",
        "dcp_world_size",
        "repeat",
    ):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if args.retention_interval is not None and args.retention_interval < 0:
        ap.error("--retention-interval must be non-negative")
    if (args.compare or args.impl == "vllm") and vllm_available() is None:
        ap.error("vLLM is not importable in this Python (use the oracle venv)")
    try:
        trace = read_trace(args.trace, mooncake_block=args.mooncake_block, step_ms=args.step_ms)
    except TraceError as e:
        ap.error(str(e))
    trace = trace.truncated(args.max_requests)
    if trace.max_seq_len > args.max_model_len:
        ap.error(f"trace has a {trace.max_seq_len}-token sequence > --max-model-len")
    host_blocks: int | None = None
    if args.hisparse_host_blocks == "min":
        host_blocks = hisparse_min_host_blocks(trace.max_seq_len, args.block_size)
    elif args.hisparse_host_blocks is not None:
        if not args.hisparse_host_blocks.isdigit() or int(args.hisparse_host_blocks) < 1:
            ap.error("--hisparse-host-blocks must be a positive number or 'min'")
        host_blocks = int(args.hisparse_host_blocks)
    layout = replay_layout(
        args.config,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        sliding_window=args.sliding_window,
        chunk_size=args.chunk_size,
        enable_caching=not args.no_prefix_caching,
        max_in_flight_tokens=args.max_num_batched_tokens,
        dcp_world_size=args.dcp_world_size,
        retention_interval=args.retention_interval,
        hisparse_host_blocks=host_blocks,
    )
    args.timer_overhead = timer_overhead_ns()
    args.timer_window = timer_window_ns()
    runs = (
        [("vllm", False), ("kvblocks", False), ("kvblocks", True)]
        if args.compare
        else [(args.impl, args.batch)]
    )
    rounds: list[dict[str, dict[str, Any]]] = []
    try:
        for _ in range(args.repeat if args.compare else 1):
            out: dict[str, dict[str, Any]] = {}
            for impl, batch in runs:
                out[impl + ("-batch" if batch else "")] = run_one(impl, batch, args, trace, layout)
            rounds.append(out)
    except ReplayError as e:
        print(f"replay: error: {e}", file=sys.stderr)
        return 1
    if not args.compare:
        print(json.dumps(next(iter(rounds[0].values())), separators=(",", ":")), flush=True)
        return 0
    per_round = [speedups(out, args.timer_window) for out in rounds]
    digests = {r["digest"] for out in rounds for r in out.values()}
    cmp: dict[str, Any] = {"digests_agree": len(digests) == 1, "rounds": len(rounds)}
    for name in per_round[0]:
        # The median over rounds: vLLM's own time moves by up to half between runs here.
        cmp[name] = {
            k: statistics.median(r[name][k] for r in per_round) for k in per_round[0][name]
        }
        c = cmp[name]
        print(
            f"{name}: KV+hash {c['kv_plus_hash_speedup']}x faster than vLLM "
            f"(KV {c['kv_speedup']}x, hash {c['hash_speedup']}x; "
            f"{c['kv_plus_hash_speedup_net_of_timer']}x net of timer overhead)"
            + (f", median of {len(rounds)} rounds" if len(rounds) > 1 else ""),
            file=sys.stderr,
        )
    print(f"digests agree: {cmp['digests_agree']}", file=sys.stderr)
    doc = {"runs": rounds[-1], "compare": cmp, "rounds": per_round}
    print(json.dumps(doc, separators=(",", ":")), flush=True)
    return 0 if cmp["digests_agree"] else 1


def speedups(out: dict[str, dict[str, Any]], timer_window: int) -> dict[str, dict[str, float]]:
    """Each kvblocks run's speed ratios against the vLLM run of the same round."""
    base = out["vllm"]
    base_ns = base["kv_total_ns"] + base["request_hash_ns"]
    ratios: dict[str, dict[str, float]] = {}
    for name, r in out.items():
        if name == "vllm":
            continue
        r_ns = r["kv_total_ns"] + r["request_hash_ns"]
        ratios[name] = {
            "kv_speedup": round(base["kv_total_ns"] / max(1, r["kv_total_ns"]), 2),
            "hash_speedup": round(base["request_hash_ns"] / max(1, r["request_hash_ns"]), 2),
            "kv_plus_hash_speedup": round(base_ns / max(1, r_ns), 2),
            # The same ratio with what an empty timing window reads (timer_window_ns,
            # measured before the runs) taken out of both sides once per timed call.
            "kv_plus_hash_speedup_net_of_timer": round(
                (base_ns - base["timed_calls"] * timer_window)
                / max(1, r_ns - r["timed_calls"] * timer_window),
                2,
            ),
        }
    return ratios


if __name__ == "__main__":
    sys.exit(main())
