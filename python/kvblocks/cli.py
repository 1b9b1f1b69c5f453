"""The ``kvblocks`` command line: ``kvblocks simulate`` replays a workload through the manager.

``kvblocks simulate`` runs a request workload (a built-in generator or a trace file)
through the vLLM-style scheduler loop of :mod:`kvblocks.replay` on a model's KV cache
and prints a summary: requests, tokens, prefix hit rate, preemptions, peak and mean block
usage, KV-manager time per step and per generated token, simulated steps per second.

JSON output (``--json``), schema ``kvblocks-simulate-v1``, one object on stdout::

    {"schema": "kvblocks-simulate-v1",
     "workload": {"kind": str, "seed": int|null, "source": str|null,
                  "requests": int, "prompt_tokens": int},
     "model": {"preset": str, "groups": [{"kind": str, "num_layers": int,
               "block_size": int, "page_size_bytes": int}, ...]},
     "scheduler": {"max_num_batched_tokens": int, "max_num_seqs": int,
                   "max_model_len": int, "prefix_caching": bool,
                   "reserve_full_isl": bool, "hash_algo": str, "batch": bool},
     "sweep": str|null,                       # the swept parameter, e.g. "num_blocks"
     "runs": [{                               # one per sweep value (one without --sweep)
        "value": int|null,                    # the swept value
        "num_blocks": int, "block_size": int, "bytes_per_block": int,
        "kv_cache_bytes": int,
        "requests": int, "prompt_tokens": int, "generated_tokens": int,
        "steps": int, "preemptions": int,
        "queried_tokens": int, "hit_tokens": int, "prefix_hit_rate": float,
        "peak_usage": float, "mean_usage": float,    # fractions of num_blocks - 1
        "kv_total_ns": int, "kv_ns_per_step": float,
        "kv_ns_per_generated_token": float, "request_hash_ns": int,
        "wall_s": float, "steps_per_s": float,
        "vllm": {                             # only with --compare-vllm
           "version": str, "kv_total_ns": int, "request_hash_ns": int,
           "wall_s": float, "speedup": float,   # vLLM / kvblocks, KV + hashing time
           "digest": str, "kvblocks_digest": str, "digests_agree": bool}}]}
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from kvblocks.presets import MODEL_PRESETS, KVLayout, model_layout, parse_memory
from kvblocks.replay import ReplayError, ReplayOptions, ReplayResult, make_backend, replay
from kvblocks.replay import vllm_available as _vllm_version
from kvblocks.workloads import KINDS, Trace, TraceError, WorkloadParams, generate, read_trace

__all__ = ["main"]

SCHEMA = "kvblocks-simulate-v1"
DEFAULT_NUM_REQUESTS = 1000
DEFAULT_GPU_MEMORY = "16GiB"
SWEEP_KEYS: dict[str, Callable[[str], int]] = {
    "num_blocks": int,
    "block_size": int,
    "gpu_memory": parse_memory,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
}


class _UsageError(Exception):
    """A bad option value found after parsing (reported argparse-style, exit 2)."""


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid positive integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not v > 0 or not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return v


def _memory(text: str) -> int:
    try:
        return parse_memory(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _sweep(text: str) -> tuple[str, list[int]]:
    key, sep, values = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or key not in SWEEP_KEYS:
        raise argparse.ArgumentTypeError(
            f"expected KEY=V1,V2,... with KEY one of {', '.join(SWEEP_KEYS)}: {text!r}"
        )
    try:
        parsed = [SWEEP_KEYS[key](v.strip()) for v in values.split(",") if v.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"bad {key} value in {text!r}: {e}") from None
    if not parsed or any(v < 1 for v in parsed):
        raise argparse.ArgumentTypeError(f"{key} values must be positive: {text!r}")
    return key, parsed


def build_parser() -> argparse.ArgumentParser:
    """The ``kvblocks`` argument parser."""
    ap = argparse.ArgumentParser(prog="kvblocks", description="kvblocks command line tools.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sp = sub.add_parser(
        "simulate",
        help="replay a workload through the KV cache manager and summarize it",
        description="Replay a request workload through kvblocks' KV cache manager with a "
        "vLLM-style scheduler loop and summarize cache behaviour and manager time.",
        epilog="--json prints one object of schema kvblocks-simulate-v1 "
        "(documented in kvblocks/cli.py).",
    )
    sp.set_defaults(parser=sp)
    w = sp.add_argument_group("workload")
    src = w.add_mutually_exclusive_group()
    src.add_argument(
        "--workload",
        choices=KINDS,
        default="shared-prefix",
        help="built-in generator (default shared-prefix)",
    )
    src.add_argument(
        "--trace",
        metavar="FILE",
        help="kvtrace-v1 or Mooncake JSON-lines trace instead of a generator",
    )
    w.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    w.add_argument(
        "--num-requests",
        type=_positive_int,
        default=None,
        help=f"requests, or sessions for agentic (default {DEFAULT_NUM_REQUESTS}; "
        "agentic 100; long-context 16)",
    )
    w.add_argument(
        "--rate",
        type=_positive_float,
        default=None,
        help="arrivals per step (default per workload: 0.5, agentic 0.1, long-context 0.02)",
    )
    w.add_argument(
        "--num-system-prompts",
        type=_positive_int,
        default=None,
        help="shared system prompts (default 8, agentic 4)",
    )
    w.add_argument(
        "--max-requests",
        type=_positive_int,
        default=None,
        help="use only the first N requests of the workload",
    )
    w.add_argument(
        "--mooncake-block",
        type=_positive_int,
        default=512,
        help="tokens per Mooncake hash id (default 512)",
    )
    w.add_argument(
        "--step-ms",
        type=_positive_float,
        default=50.0,
        help="ms per scheduler step for Mooncake timestamps (default 50)",
    )
    m = sp.add_argument_group("model and cache")
    m.add_argument(
        "--model",
        default="llama-3-8b",
        help=f"model preset: {', '.join(MODEL_PRESETS)} (default llama-3-8b)",
    )
    m.add_argument(
        "--block-size",
        type=_positive_int,
        default=None,
        help="tokens per block (default 16; hybrid-mamba: vLLM's page-matching size)",
    )
    size = m.add_mutually_exclusive_group()
    size.add_argument("--num-blocks", type=_positive_int, default=None, help="KV cache blocks")
    size.add_argument(
        "--gpu-memory",
        type=_memory,
        default=None,
        metavar="SIZE",
        help=f"KV cache memory budget, e.g. 40GiB (default {DEFAULT_GPU_MEMORY})",
    )
    m.add_argument("--num-layers", type=_positive_int, help="override: layers per attention group")
    m.add_argument("--num-kv-heads", type=_positive_int, help="override: KV heads")
    m.add_argument("--head-size", type=_positive_int, help="override: head size")
    m.add_argument("--dtype", help="override: KV dtype (bfloat16, float16, float32, float8_e4m3fn)")
    m.add_argument("--sliding-window", type=_positive_int, help="override: sliding window")
    m.add_argument("--no-prefix-caching", action="store_true")
    s = sp.add_argument_group("scheduler")
    s.add_argument("--max-num-batched-tokens", type=_positive_int, default=8192)
    s.add_argument("--max-num-seqs", type=_positive_int, default=256)
    s.add_argument("--max-model-len", type=_positive_int, default=262144)
    s.add_argument(
        "--reserve-full-isl",
        type=int,
        choices=(0, 1),
        default=1,
        help="admission needs the whole sequence to fit (vLLM default 1)",
    )
    s.add_argument(
        "--hash-algo",
        default="sha256_cbor",
        choices=("sha256_cbor", "sha256", "xxhash_cbor", "xxhash"),
    )
    s.add_argument(
        "--no-batch",
        action="store_true",
        help="decode one allocate_slots call per request instead of allocate_slots_batch",
    )
    o = sp.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print JSON (schema in the epilog)")
    o.add_argument("--plot", metavar="FILE.png", help="plot usage and hit rate over steps")
    o.add_argument(
        "--progress",
        action="store_true",
        help="progress bar on stderr even when it is not a terminal",
    )
    o.add_argument(
        "--compare-vllm",
        action="store_true",
        help="also replay through vLLM 0.33.0 (if importable): speed ratio, digests",
    )
    o.add_argument(
        "--sweep",
        type=_sweep,
        metavar="KEY=V1,V2,...",
        help=f"one run per value; KEY: {', '.join(SWEEP_KEYS)}",
    )
    return ap


# --------------------------------------------------------------------------- helpers
class _ProgressBar:
    """A one-line progress bar on a stream (finished requests / total)."""

    def __init__(self, stream: TextIO, label: str, width: int = 30):
        self.stream, self.label, self.width = stream, label, width
        self.t0 = time.perf_counter()

    def __call__(self, steps: int, finished: int, total: int) -> None:
        frac = finished / total if total else 1.0
        fill = int(frac * self.width)
        bar = "#" * fill + "." * (self.width - fill)
        el = time.perf_counter() - self.t0
        self.stream.write(
            f"\r{self.label} [{bar}] {frac:6.1%} {finished}/{total} requests, "
            f"step {steps}, {el:5.1f}s"
        )
        if finished == total:
            self.stream.write("\n")
        self.stream.flush()


@dataclass
class _Run:
    value: int | None
    layout: KVLayout
    result: ReplayResult
    vllm: dict[str, Any] | None = None


def _usage(res: ReplayResult) -> tuple[float, float, list[float]]:
    """Peak, mean and per-step usage (vLLM's: 1 - free / (num_blocks - 1))."""
    assert res.series is not None
    total = max(1, res.num_blocks - 1)
    usage = [1.0 - f / total for f in res.series.free_blocks]
    if not usage:
        return 0.0, 0.0, usage
    return max(usage), sum(usage) / len(usage), usage


def _load_workload(args: argparse.Namespace) -> Trace:
    if args.trace:
        trace = read_trace(args.trace, mooncake_block=args.mooncake_block, step_ms=args.step_ms)
    else:
        n = args.num_requests
        if n is None:
            n = {"agentic": 100, "long-context": 16}.get(args.workload, DEFAULT_NUM_REQUESTS)
        params = WorkloadParams(n, args.rate, args.num_system_prompts)
        trace = generate(args.workload, args.seed, params)
    return trace.truncated(args.max_requests or 0)


def _layout(args: argparse.Namespace, **over: int) -> KVLayout:
    opts = {
        "block_size": args.block_size,
        "num_blocks": args.num_blocks,
        "gpu_memory": args.gpu_memory,
        "max_num_batched_tokens": args.max_num_batched_tokens,
    }
    opts.update(over)
    if "num_blocks" in over:
        opts["gpu_memory"] = None
    elif "gpu_memory" in over:
        opts["num_blocks"] = None
    if opts["num_blocks"] is None and opts["gpu_memory"] is None:
        opts["gpu_memory"] = parse_memory(DEFAULT_GPU_MEMORY)
    fields = ("num_layers", "num_kv_heads", "head_size", "dtype", "sliding_window")
    overrides = {k: getattr(args, k) for k in fields if getattr(args, k) is not None}
    try:
        return model_layout(
            args.model,
            block_size=opts["block_size"],
            num_blocks=opts["num_blocks"],
            gpu_memory=opts["gpu_memory"],
            max_model_len=args.max_model_len,
            enable_caching=not args.no_prefix_caching,
            max_in_flight_tokens=opts["max_num_batched_tokens"],
            overrides=overrides,
        )
    except ValueError as e:
        raise _UsageError(str(e)) from None


def _options(args: argparse.Namespace, over: dict[str, int], digest: bool) -> ReplayOptions:
    return ReplayOptions(
        max_num_batched_tokens=over.get("max_num_batched_tokens", args.max_num_batched_tokens),
        max_num_seqs=over.get("max_num_seqs", args.max_num_seqs),
        reserve_full_isl=bool(args.reserve_full_isl),
        digest=digest,
        series=True,
    )


def _run_one(
    args: argparse.Namespace, trace: Trace, value: int | None, show_progress: bool
) -> _Run:
    over: dict[str, int] = {} if value is None else {args.sweep[0]: value}
    layout = _layout(args, **{k: v for k, v in over.items() if k != "max_num_seqs"})
    if trace.max_seq_len > layout.max_model_len:
        raise _UsageError(
            f"the workload has a {trace.max_seq_len}-token sequence > --max-model-len "
            f"{layout.max_model_len}"
        )
    opts = _options(args, over, digest=args.compare_vllm)
    try:
        backend = make_backend("kvblocks", layout, args.hash_algo, batch=not args.no_batch)
    except (ValueError, TypeError, OverflowError) as e:  # a configuration kvblocks rejects
        raise _UsageError(str(e)) from None
    if show_progress:
        label = "simulate" if value is None else f"{args.sweep[0]}={value}"
        opts.progress, opts.progress_every = _ProgressBar(sys.stderr, label), 200
    run = _Run(value, layout, replay(trace, backend, opts))
    if args.compare_vllm:
        opts = _options(args, over, digest=True)
        backend = make_backend("vllm", layout, args.hash_algo)
        if show_progress:
            opts.progress, opts.progress_every = _ProgressBar(sys.stderr, "vLLM    "), 200
        vres = replay(trace, backend, opts)
        ours = run.result.kv_total_ns + run.result.request_hash_ns
        theirs = vres.kv_total_ns + vres.request_hash_ns
        run.vllm = {
            "version": _vllm_version(),
            "kv_total_ns": vres.kv_total_ns,
            "request_hash_ns": vres.request_hash_ns,
            "wall_s": round(vres.wall_s, 3),
            "speedup": round(theirs / max(1, ours), 2),
            "digest": vres.digest,
            "kvblocks_digest": run.result.digest,
            "digests_agree": vres.digest == run.result.digest,
        }
    return run


def _run_json(run: _Run) -> dict[str, Any]:
    r, lay = run.result, run.layout
    peak, mean, _ = _usage(r)
    out: dict[str, Any] = {
        "value": run.value,
        "num_blocks": lay.num_blocks,
        "block_size": lay.groups[0].block_size,
        "bytes_per_block": lay.bytes_per_block,
        "kv_cache_bytes": lay.bytes_per_block * lay.num_blocks,
        "requests": r.requests,
        "prompt_tokens": r.prompt_tokens,
        "generated_tokens": r.generated_tokens,
        "steps": r.steps,
        "preemptions": r.preemptions,
        "queried_tokens": r.queried_tokens,
        "hit_tokens": r.hit_tokens,
        "prefix_hit_rate": round(r.hit_rate, 6),
        "peak_usage": round(peak, 6),
        "mean_usage": round(mean, 6),
        "kv_total_ns": r.kv_total_ns,
        "kv_ns_per_step": round(r.kv_total_ns / r.steps, 1) if r.steps else 0.0,
        "kv_ns_per_generated_token": round(r.kv_total_ns / r.generated_tokens, 1)
        if r.generated_tokens
        else 0.0,
        "request_hash_ns": r.request_hash_ns,
        "wall_s": round(r.wall_s, 3),
        "steps_per_s": round(r.steps / r.wall_s, 1) if r.wall_s > 0 else 0.0,
    }
    if run.vllm is not None:
        out["vllm"] = run.vllm
    return out


def _report_json(args: argparse.Namespace, trace: Trace, runs: list[_Run]) -> dict[str, Any]:
    lay = runs[0].layout
    return {
        "schema": SCHEMA,
        "workload": {
            "kind": trace.kind,
            "seed": trace.seed,
            "source": trace.source,
            "requests": len(trace.requests),
            "prompt_tokens": sum(r.prompt_len for r in trace.requests),
        },
        "model": {
            "preset": args.model,
            "groups": [
                {
                    "kind": g.kind,
                    "num_layers": g.num_layers,
                    "block_size": g.block_size,
                    "page_size_bytes": g.page_size_bytes,
                }
                for g in lay.groups
            ],
        },
        "scheduler": {
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "max_num_seqs": args.max_num_seqs,
            "max_model_len": args.max_model_len,
            "prefix_caching": not args.no_prefix_caching,
            "reserve_full_isl": bool(args.reserve_full_isl),
            "hash_algo": args.hash_algo,
            "batch": not args.no_batch,
        },
        "sweep": args.sweep[0] if args.sweep else None,
        "runs": [_run_json(r) for r in runs],
    }


def _fmt_bytes(n: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _fmt_ns(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} us"
    return f"{ns:.0f} ns"


def _print_summary(out: TextIO, args: argparse.Namespace, trace: Trace, run: _Run) -> None:
    j = _run_json(run)
    lay = run.layout
    src = trace.source or f"{trace.kind} (seed {trace.seed})"
    rows = [
        ("workload", src),
        (
            "model",
            f"{args.model}, {lay.num_blocks:,} blocks x {j['block_size']} tokens "
            f"({_fmt_bytes(j['kv_cache_bytes'])})",
        ),
        ("requests", f"{j['requests']:,}"),
        ("prompt tokens", f"{j['prompt_tokens']:,}"),
        ("generated tokens", f"{j['generated_tokens']:,}"),
        ("steps", f"{j['steps']:,}"),
        (
            "prefix hit rate",
            f"{j['prefix_hit_rate']:.1%} ({j['hit_tokens']:,} of {j['queried_tokens']:,} tokens)",
        ),
        ("preemptions", f"{j['preemptions']:,}"),
        ("peak usage", f"{j['peak_usage']:.1%}"),
        ("mean usage", f"{j['mean_usage']:.1%}"),
        ("KV time / step", _fmt_ns(j["kv_ns_per_step"])),
        ("KV time / token", _fmt_ns(j["kv_ns_per_generated_token"]) + " (per generated token)"),
        ("KV time total", _fmt_ns(j["kv_total_ns"])),
        ("hashing time", _fmt_ns(j["request_hash_ns"])),
        ("steps / s", f"{j['steps_per_s']:,.0f} (simulated, wall {j['wall_s']:.2f} s)"),
    ]
    if run.vllm is not None:
        v = run.vllm
        rows.append(
            (
                "vs vLLM " + str(v["version"]),
                f"{v['speedup']}x faster (KV + hashing), digests "
                f"{'agree' if v['digests_agree'] else 'DIFFER'}",
            )
        )
    width = max(len(k) for k, _ in rows)
    for k, val in rows:
        out.write(f"  {k:<{width}}  {val}\n")


def _print_sweep(out: TextIO, key: str, runs: list[_Run]) -> None:
    head = [key, "blocks", "hit rate", "preempt", "peak use", "mean use", "steps", "KV/step",
            "KV/token", "steps/s"]  # fmt: skip
    compare = any(run.vllm is not None for run in runs)
    if compare:
        head += ["vs vLLM", "digests"]
    rows = [head]
    for run in runs:
        j = _run_json(run)
        row = [
            str(run.value), f"{j['num_blocks']:,}", f"{j['prefix_hit_rate']:.1%}",
            f"{j['preemptions']:,}", f"{j['peak_usage']:.1%}", f"{j['mean_usage']:.1%}",
            f"{j['steps']:,}", _fmt_ns(j["kv_ns_per_step"]),
            _fmt_ns(j["kv_ns_per_generated_token"]), f"{j['steps_per_s']:,.0f}",
        ]  # fmt: skip
        if run.vllm is not None:
            row += [f"{run.vllm['speedup']}x", "agree" if run.vllm["digests_agree"] else "DIFFER"]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        out.write("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + "\n")


def _plot(path: str, key: str | None, runs: list[_Run]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise _UsageError("--plot needs matplotlib (pip install matplotlib)") from None
    fig, (ax_u, ax_h) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    for run in runs:
        series = run.result.series
        assert series is not None
        _, _, usage = _usage(run.result)
        hit = [h / q if q else 0.0 for h, q in zip(series.hits, series.queried, strict=True)]
        label = f"{key}={run.value}" if key else None
        ax_u.plot(list(series.step), usage, label=label, linewidth=0.8)
        ax_h.plot(list(series.step), hit, label=label, linewidth=0.8)
    ax_u.set_ylabel("KV block usage")
    ax_h.set_ylabel("prefix hit rate (cumulative)")
    ax_h.set_xlabel("scheduler step")
    if key:
        ax_u.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _simulate(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.model not in MODEL_PRESETS:
        ap.error(
            f"argument --model: unknown preset {args.model!r} "
            f"(choose from {', '.join(MODEL_PRESETS)})"
        )
    if args.compare_vllm:
        version = _vllm_version()
        if version is None:
            ap.error(
                "--compare-vllm: vLLM is not importable in this Python "
                "(install vllm==0.33.0, or run from its environment)"
            )
        if version != "0.33.0":
            print(
                f"kvblocks simulate: warning: vLLM {version} is not 0.33.0; digests may differ",
                file=sys.stderr,
            )
    if args.plot and not args.plot.lower().endswith(".png"):
        ap.error("argument --plot: expected a .png file name")
    try:
        trace = _load_workload(args)
    except (TraceError, ValueError) as e:
        ap.error(str(e))
    show_progress = args.progress or sys.stderr.isatty()
    values: Sequence[int | None] = args.sweep[1] if args.sweep else [None]
    try:
        runs = [_run_one(args, trace, v, show_progress) for v in values]
        if args.plot:
            _plot(args.plot, args.sweep[0] if args.sweep else None, runs)
    except _UsageError as e:
        ap.error(str(e))
    except ReplayError as e:
        print(f"kvblocks simulate: error: {e}", file=sys.stderr)
        return 1
    out = sys.stdout
    if args.json:
        out.write(json.dumps(_report_json(args, trace, runs)) + "\n")
    elif args.sweep:
        _print_sweep(out, args.sweep[0], runs)
    else:
        _print_summary(out, args, trace, runs[0])
    if args.plot and not args.json:
        out.write(f"plot written to {os.path.abspath(args.plot)}\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvblocks`` console script; returns the exit status."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.command is None:
        ap.print_help(sys.stderr)
        return 2
    sim: argparse.ArgumentParser = args.parser
    return _simulate(sim, args)
