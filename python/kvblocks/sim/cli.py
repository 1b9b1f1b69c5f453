"""The ``kvblocks`` command line: ``kvblocks simulate`` replays a workload through the manager.

``kvblocks simulate`` runs a request workload (a built-in generator or a trace file, see
``docs/trace-kvtrace.md`` and ``docs/trace-mooncake.md``) through the scheduler loop of
:mod:`kvblocks.sim.engine` on a model's KV cache and prints a summary: requests, tokens,
the prefix hit rate with its two ceilings, preemptions, peak and mean block usage,
KV-manager time per step and per generated token, simulated steps per second.
``--json`` prints one document instead (``docs/simulate-json.md``).

Errors are one line on stderr (exit status 2 for bad input, 1 when the run cannot go on,
130 on Ctrl-C); the usage is printed only by ``--help``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import kvblocks
from kvblocks.retention_spec import RetentionSpec, SpecError, parse_retention, split_sweep
from kvblocks.sim.backends import make_backend, vllm_available
from kvblocks.sim.calibration import calibration_for
from kvblocks.sim.capacity import Probe, at_rate, find_max_rate, find_min_replicas, trace_rate
from kvblocks.sim.engine import (
    ReplayError,
    ReplayOptions,
    ReplayResult,
    ceiling_block_size,
    replay,
)
from kvblocks.sim.fleet import (
    DEFAULT_CACHE_THRESHOLD,
    INDEXED_ROUTERS,
    ROUTERS,
    Fleet,
    merged_result,
)
from kvblocks.sim.offload import HostTier, chunk_bytes
from kvblocks.sim.parallel import RayUnavailableError, run_in_processes, run_on_ray
from kvblocks.sim.percentiles import percentiles
from kvblocks.sim.presets import MODEL_PRESETS, KVLayout, model_layout, parse_memory
from kvblocks.sim.report import (
    Run,
    Setup,
    capacity_json,
    plot,
    print_capacity,
    print_summary,
    print_sweep,
    report_json,
    slo_attainment,
)
from kvblocks.sim.requests_out import check_path, write_requests
from kvblocks.sim.timemodel import (
    DEFAULT_GPU,
    DEFAULT_MEMORY_UTILIZATION,
    GPU_PRESETS,
    StepTimeModel,
    gpu_names_help,
    gpu_preset_name,
    kv_memory_after_weights,
)
from kvblocks.sim.workloads import KINDS, Trace, TraceError, WorkloadParams, generate, read_trace

__all__ = ["build_parser", "main"]

DEFAULT_NUM_REQUESTS = 1000
DEFAULT_GPU_MEMORY = "16GiB"
DEFAULT_MODEL = "llama-3.1-8b"
"""Its 128k context (vLLM's default ``max_model_len``: the model's) holds every built-in
workload's longest sequence."""
SWEEP_KEYS: dict[str, Callable[[str], int]] = {
    "num_blocks": int,
    "block_size": int,
    "gpu_memory": parse_memory,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "replicas": int,
}
ZERO_SWEEP_KEYS = ("cpu_offload",)
"""Sweep keys whose 0 is a value (no host tier)."""
OFFLOAD_POLICIES = ("lru", "arc")
"""vLLM's own CPU offload policy names (``eviction_policy``)."""


def offload_size(text: str) -> int:
    """``--cpu-offload``'s bytes: a memory size (:func:`~kvblocks.sim.presets.parse_memory`)
    or 0 (no host tier).

    Raises:
        ValueError: Neither.
    """
    if text.strip() == "0":
        return 0
    return parse_memory(text)


SWEEP_KEYS["cpu_offload"] = offload_size
RETENTION_SWEEP = "retention"  # --sweep retention=SPEC1,SPEC2,... (kvblocks.retention_spec)


class UsageError(Exception):
    """Bad input found after parsing (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: the usage is for ``--help`` only."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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


def _non_negative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not v >= 0 or not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return v


def _memory(text: str) -> int:
    try:
        return parse_memory(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _offload_memory(text: str) -> int:
    try:
        return offload_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _model(text: str) -> str:
    if text not in MODEL_PRESETS:
        raise argparse.ArgumentTypeError(
            f"unknown preset {text!r} (choose from {', '.join(MODEL_PRESETS)})"
        )
    return text


def _gpu(text: str) -> str:
    try:
        return gpu_preset_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _retention(text: str) -> RetentionSpec:
    try:
        return parse_retention(text)
    except SpecError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _offload_policy(text: str) -> str | RetentionSpec:
    if text in OFFLOAD_POLICIES:
        return text
    spec = _retention(text)
    return "lru" if spec.is_lru else spec


def _sweep(text: str) -> tuple[str, list[int] | list[RetentionSpec]]:
    key, sep, values = text.partition("=")
    key = key.strip().replace("-", "_")
    if sep and key == RETENTION_SWEEP:
        specs = [_retention(v) for v in split_sweep(values)]
        if len({sp.spec for sp in specs}) < len(specs):
            raise argparse.ArgumentTypeError(f"the same policy twice in {text!r}")
        return key, specs
    if not sep or key not in SWEEP_KEYS:
        raise argparse.ArgumentTypeError(
            f"expected KEY=V1,V2,... with KEY one of {', '.join(SWEEP_KEYS)}, "
            f"{RETENTION_SWEEP}: {text!r}"
        )
    try:
        parsed = [SWEEP_KEYS[key](v.strip()) for v in values.split(",") if v.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"bad {key} value in {text!r}: {e}") from None
    low = 0 if key in ZERO_SWEEP_KEYS else 1
    if not parsed or any(v < low for v in parsed):
        what = "non-negative" if low == 0 else "positive"
        raise argparse.ArgumentTypeError(f"{key} values must be {what}: {text!r}")
    return key, parsed


def _presets_help() -> str:
    width = max(len(name) for name in MODEL_PRESETS)
    lines = ["model presets (--model; max_model_len is the default --max-model-len):"]
    for p in MODEL_PRESETS.values():
        lines.append(f"  {p.name:<{width}}  {p.model}, max_model_len {p.max_model_len:,}")
        lines.append(f"  {'':<{width}}  {p.description}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The ``kvblocks`` argument parser."""
    version = f"kvblocks {kvblocks.__version__}"
    ap = _Parser(prog="kvblocks", description="kvblocks command line tools.")
    ap.add_argument("--version", action="version", version=version)
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sp = sub.add_parser(
        "simulate",
        help="replay a workload through the KV cache manager and summarize it",
        description="Replay a request workload through kvblocks' KV cache manager with a "
        "vLLM-style scheduler loop and summarize cache behaviour and manager time.",
        epilog=f"{_presets_help()}\n\n--json prints one object of schema "
        "kvblocks-simulate-v4 (docs/simulate-json.md); the step-time model: "
        "docs/simulate-time.md.\nTrace formats: "
        "docs/trace-kvtrace.md, docs/trace-mooncake.md. Retention policies: "
        "docs/retention.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sp.add_argument("--version", action="version", version=version)
    sp.set_defaults(parser=sp)
    w = sp.add_argument_group("workload")
    src = w.add_mutually_exclusive_group()
    src.add_argument(
        "--workload",
        choices=KINDS,
        default="shared-prefix",
        help="built-in generator (default shared-prefix; multi-tenant: three chat tenants, an "
        "agent tenant with sessions and a bursty tenant, see docs/retention.md)",
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
        help=f"requests, or sessions for agentic, arrivals (chat requests and agent "
        f"sessions) for multi-tenant (default {DEFAULT_NUM_REQUESTS}; agentic 100; "
        "long-context 16)",
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
        "--tenants",
        type=_positive_int,
        default=None,
        help="give generated sessions N cache salts in turn (tenants share no blocks)",
    )
    w.add_argument(
        "--burst-every",
        type=_positive_int,
        default=None,
        metavar="STEPS",
        help="multi-tenant: steps between the bursty tenant's bursts (default 600)",
    )
    w.add_argument(
        "--burst-size",
        type=int,
        default=None,
        metavar="N",
        help="multi-tenant: requests per burst (default 48; 0: no bursts)",
    )
    w.add_argument(
        "--request-rate",
        type=_positive_float,
        default=None,
        metavar="R",
        help="rescale the workload's arrivals to R requests per second (first turns; "
        "follow-ups keep their delays)",
    )
    w.add_argument(
        "--max-requests",
        type=_positive_int,
        default=None,
        help="use only the first N requests of the workload",
    )
    w.add_argument(
        "--mooncake-block-size",
        "--mooncake-block",
        dest="mooncake_block",
        type=_positive_int,
        default=512,
        help="tokens per Mooncake hash id (default 512)",
    )
    w.add_argument(
        "--step-ms",
        type=_positive_float,
        default=50.0,
        help="ms per trace step: maps generator arrival steps and follow-up delays to "
        "time, and Mooncake timestamps to steps without time (default 50)",
    )
    m = sp.add_argument_group("model and cache")
    m.add_argument(
        "--model",
        type=_model,
        default=DEFAULT_MODEL,
        help=f"model preset (default {DEFAULT_MODEL}; the list is below)",
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
        help=f"KV cache memory, e.g. 40GiB (default {DEFAULT_GPU_MEMORY}); units are binary: "
        "40GB = 40G = 40GiB",
    )
    m.add_argument("--num-layers", type=_positive_int, help="override: layers per attention group")
    m.add_argument("--num-kv-heads", type=_positive_int, help="override: KV heads")
    m.add_argument("--head-size", type=_positive_int, help="override: head size")
    m.add_argument("--dtype", help="override: KV dtype (bfloat16, float16, float32, float8_e4m3fn)")
    m.add_argument("--sliding-window", type=_positive_int, help="override: sliding window")
    m.add_argument("--no-prefix-caching", action="store_true")
    m.add_argument(
        "--retention",
        type=_retention,
        default=None,
        metavar="SPEC",
        help="prefix-cache retention policy, e.g. 'session=30', 'ttl=600', 'quota=2000', "
        "'quota=tenant-a:2000,tenant-b:500', 'classes=2,priority=-1:1'; items joined by "
        "',' or ';' (default lru: vLLM's order; grammar in docs/retention.md)",
    )
    h = sp.add_argument_group("host-memory tier (vLLM's CPU offload, docs/simulate-offload.md)")
    h.add_argument(
        "--cpu-offload",
        type=_offload_memory,
        default=0,
        metavar="SIZE",
        help="host memory for evicted KV, e.g. 64GiB (vLLM's --kv-offloading-size; default 0: "
        "no host tier)",
    )
    h.add_argument(
        "--offload-policy",
        type=_offload_policy,
        default="lru",
        metavar="POLICY",
        help="the host tier's order: lru or arc (vLLM's), or a retention spec as --retention "
        "(kvblocks' policy; default lru)",
    )
    h.add_argument(
        "--offload-decode",
        action="store_true",
        help="store decode tokens' chunks too (vLLM's offload_prompt_only=false; default: "
        "prompt chunks only)",
    )
    h.add_argument(
        "--offload-store-threshold",
        type=int,
        default=0,
        metavar="N",
        help="store a chunk once offered N times (vLLM's store_threshold; default 0: always)",
    )
    h.add_argument(
        "--host-link-gbps",
        type=_positive_float,
        default=None,
        metavar="GB/S",
        help="host link bandwidth per direction in GB/s (default the GPU's: PCIe Gen5 x16 64 "
        "for H100/H200/B200, Gen4 32 for A100/L40S, NVLink-C2C 450 for GH200)",
    )
    s = sp.add_argument_group("scheduler")
    s.add_argument("--max-num-batched-tokens", type=_positive_int, default=8192)
    s.add_argument("--max-num-seqs", type=_positive_int, default=256)
    s.add_argument(
        "--max-model-len",
        type=_positive_int,
        default=None,
        help="longest sequence (default: the preset model's context length); as in vLLM, a "
        "prompt this long or longer is rejected and an output stops here (both counted)",
    )
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
    t = sp.add_argument_group("time model (docs/simulate-time.md) and fleet")
    t.add_argument(
        "--gpu",
        type=_gpu,
        default=None,
        help=f"GPU of the step-time model: {gpu_names_help()}; case, spaces, - and _ "
        f"ignored (default {DEFAULT_GPU}); given, --gpu-memory defaults to what it holds "
        "after the weights",
    )
    t.add_argument("--tp", type=_positive_int, default=1, help="tensor parallel GPUs (default 1)")
    t.add_argument("--fp8", action="store_true", help="use the GPU's FP8 peak (default BF16)")
    t.add_argument(
        "--step-overhead-ms",
        type=_non_negative_float,
        default=None,
        metavar="MS",
        help="CPU time per step the GPU waits for (default: the GPU calibration's, 0 ms: "
        "vLLM's async scheduling hides it)",
    )
    t.add_argument(
        "--efficiency",
        type=_positive_float,
        default=1.0,
        metavar="F",
        help="multiply every calibrated kernel efficiency by F (default 1: as calibrated; "
        "docs/simulate-time.md)",
    )
    t.add_argument(
        "--gpu-memory-utilization",
        type=_positive_float,
        default=DEFAULT_MEMORY_UTILIZATION,
        help="fraction of GPU memory for weights and KV cache with --gpu "
        f"(default {DEFAULT_MEMORY_UTILIZATION}, vLLM's)",
    )
    t.add_argument("--slo-ttft", type=_positive_float, metavar="S", help="TTFT target, seconds")
    t.add_argument("--slo-tpot", type=_positive_float, metavar="S", help="TPOT target, seconds")
    t.add_argument(
        "--replicas", type=_positive_int, default=1, help="engines in the fleet (default 1)"
    )
    t.add_argument(
        "--router",
        choices=ROUTERS,
        default="round-robin",
        help="how the fleet picks an engine per request (default round-robin)",
    )
    t.add_argument(
        "--router-load-weight",
        type=float,
        default=0.0,
        metavar="W",
        help="prefix-aware: W > 0 = Dynamo's cost instead, blocks to prefill + W x active "
        "blocks (default 0: the cache-threshold rule); kv-aware: W (default 1)",
    )
    t.add_argument(
        "--router-cache-threshold",
        type=float,
        default=DEFAULT_CACHE_THRESHOLD,
        metavar="F",
        help="prefix-aware: a request whose longest cached prefix covers more than F of its "
        "blocks goes to that engine, else to the least loaded (SGLang's cache-aware rule; "
        f"default {DEFAULT_CACHE_THRESHOLD}; 0 = longest prefix always)",
    )
    c = sp.add_argument_group("capacity search (docs/simulate-time.md)")
    search = c.add_mutually_exclusive_group()
    search.add_argument(
        "--find-max-rate",
        action="store_true",
        help="the highest --request-rate at which 99%% of requests meet --slo-ttft and "
        "--slo-tpot (bisection from the workload's own rate, or --request-rate)",
    )
    search.add_argument(
        "--find-min-replicas",
        type=_positive_float,
        default=None,
        metavar="RATE",
        help="the fewest --replicas at which 99%% of requests meet the SLOs at RATE "
        "requests per second",
    )
    o = sp.add_argument_group("output")
    o.add_argument(
        "--no-ceilings",
        action="store_true",
        help="skip the infinite-cache and Belady ceilings (reported as null): faster on "
        "long traces",
    )
    o.add_argument("--json", action="store_true", help="print JSON (schema in the epilog)")
    o.add_argument(
        "--plot",
        metavar="FILE.png",
        help="plot usage and hit rate over steps (needs matplotlib: pip install 'kvblocks[sim]')",
    )
    o.add_argument(
        "--requests-out",
        metavar="FILE",
        help="write one record per finished request: arrival, TTFT, TPOT, end to end, hit "
        "tokens per tier, preemptions, engine (CSV for .csv, else JSON lines)",
    )
    o.add_argument(
        "--progress",
        action="store_true",
        help="progress bar on stderr even when it is not a terminal",
    )
    o.add_argument(
        "--compare-vllm",
        action="store_true",
        help="also replay through vLLM 0.33.0 if importable: speed ratio, digests",
    )
    o.add_argument(
        "--sweep",
        type=_sweep,
        metavar="KEY=V1,V2,...",
        help=f"one run per value; KEY: {', '.join(SWEEP_KEYS)}, {RETENTION_SWEEP} (policies "
        "split by commas, one policy's items joined by +: retention=lru,session=30,"
        "session=30+quota=2000); cpu_offload=0,64GiB,256GiB plans the host tier",
    )
    o.add_argument(
        "--jobs",
        type=_positive_int,
        default=1,
        metavar="N",
        help="--sweep: run the sweep's configurations in N processes at once (default 1); "
        "the report is the same as one after another",
    )
    o.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="run the configurations as tasks on a Ray cluster (ray.init(address=ADDRESS); "
        "needs ray): local starts one on this machine for the run, auto attaches to the one "
        "running here (ray start --head); the report is the same as one after another",
    )
    return ap


# --------------------------------------------------------------------------- checks
def _check_plot_path(path: str) -> None:
    """Fails before the run if the plot cannot be written."""
    if not path.lower().endswith(".png"):
        raise UsageError(f"--plot: expected a .png file name, got {path!r}")
    if os.path.isdir(path):
        raise UsageError(f"--plot: {path} is a directory")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"--plot: no such directory: {folder}")
    target = path if os.path.exists(path) else folder
    if not os.access(target, os.W_OK):
        raise UsageError(f"--plot: cannot write {path} (permission denied)")
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib (pip install 'kvblocks[sim]')")


def _load_workload(args: argparse.Namespace) -> Trace:
    if args.trace:
        trace = read_trace(args.trace, mooncake_block=args.mooncake_block, step_ms=args.step_ms)
    else:
        n = args.num_requests
        if n is None:
            n = {"agentic": 100, "long-context": 16}.get(args.workload, DEFAULT_NUM_REQUESTS)
        if args.workload != "multi-tenant" and (
            args.burst_every is not None or args.burst_size is not None
        ):
            raise UsageError("--burst-every and --burst-size are for --workload multi-tenant")
        if args.burst_size is not None and args.burst_size < 0:
            raise UsageError(f"--burst-size must be >= 0, got {args.burst_size}")
        params = WorkloadParams(
            n, args.rate, args.num_system_prompts, args.burst_every, args.burst_size
        )
        trace = generate(args.workload, args.seed, params)
    trace = trace.truncated(args.max_requests or 0)
    if args.tenants:
        trace = trace.with_tenants(args.tenants)
    if args.request_rate is not None and not args.find_max_rate:
        trace = at_rate(trace, args.request_rate, args.step_ms / 1e3)
    return trace


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
        if args.gpu is not None:
            gpu = GPU_PRESETS[args.gpu]
            weights = MODEL_PRESETS[args.model].weights_bytes
            try:
                per_gpu = kv_memory_after_weights(
                    gpu, weights, args.tp, min(1.0, args.gpu_memory_utilization)
                )
            except ValueError as e:
                raise UsageError(str(e)) from None
            opts["gpu_memory"] = per_gpu * args.tp
        else:
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
        raise UsageError(str(e)) from None


# --------------------------------------------------------------------------- runs
class _Progress:
    """A tqdm bar of finished requests (rate and ETA included), fed by the engine."""

    def __init__(self, label: str, total: int) -> None:
        # importlib: tqdm ships no type information
        tqdm = importlib.import_module("tqdm").tqdm
        self.bar = tqdm(
            total=total, desc=label, unit="req", file=sys.stderr, dynamic_ncols=True, leave=True
        )

    def __call__(self, steps: int, finished: int, total: int) -> None:
        self.bar.set_postfix_str(f"step {steps:,}", refresh=False)
        self.bar.update(finished - self.bar.n)

    def close(self) -> None:
        self.bar.close()


def _replay(
    impl: str,
    args: argparse.Namespace,
    trace: Trace,
    layout: KVLayout,
    over: dict[str, int],
    label: str | None,
    digest: bool,
    retention: RetentionSpec | None = None,
) -> tuple[ReplayResult, dict[str, Any]]:
    replicas = over.get("replicas", args.replicas)
    if replicas > 1 and impl != "kvblocks":
        raise UsageError("--compare-vllm replays one engine; drop --replicas")
    events = replicas > 1 and args.router in INDEXED_ROUTERS
    offload = over.get("cpu_offload", args.cpu_offload)
    if offload and replicas > 1:
        raise UsageError("--cpu-offload models one engine's host tier; drop --replicas")
    try:
        policy = retention.build() if retention is not None else None
    except SpecError as e:
        raise UsageError(f"--retention: {e}") from None
    try:
        backends = [
            make_backend(
                impl,
                layout,
                args.hash_algo,
                batch=not args.no_batch,
                events=events,
                retention=policy,
            )
            for _ in range(replicas)
        ]
    except OverflowError:
        raise UsageError(f"{layout.num_blocks:,} blocks: more than a pool can hold") from None
    except (ValueError, TypeError) as e:  # a configuration the manager rejects
        raise UsageError(str(e)) from None
    try:
        tm = StepTimeModel(
            layout,
            args.model,
            GPU_PRESETS[args.gpu or DEFAULT_GPU],
            args.tp,
            None if args.step_overhead_ms is None else args.step_overhead_ms / 1e3,
            args.efficiency,
            args.fp8,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    opts = ReplayOptions(
        max_num_batched_tokens=over.get("max_num_batched_tokens", args.max_num_batched_tokens),
        max_num_seqs=over.get("max_num_seqs", args.max_num_seqs),
        reserve_full_isl=bool(args.reserve_full_isl),
        digest=digest,
        series=True,
        ceilings=not args.no_ceilings,
        progress_every=200,
        time_model=tm.step_time,
        step_s=args.step_ms / 1e3,
        max_model_len=layout.max_model_len,
        host_tier=_host_tier(args, layout, offload) if offload else None,
    )
    if replicas > 1:
        weight = max(0.0, args.router_load_weight)
        threshold = min(1.0, max(0.0, args.router_cache_threshold))
        fleet_run = Fleet(trace, backends, opts, args.router, layout, weight, threshold)
        fr = fleet_run.run()
        per = [_replica_json(r) for r in fr.engines]
        fleet: dict[str, Any] = {"replicas": replicas, "router": args.router, "per_replica": per}
        if args.router in INDEXED_ROUTERS:
            fleet["cache_threshold"] = threshold
            fleet["load_weight"] = fleet_run.load_weight
        merged = merged_result(fr)
        merged.step_time_shares = tm.shares()
        return merged, fleet
    bar = _Progress(label, len(trace.requests)) if label is not None else None
    opts.progress = bar
    try:
        res = replay(trace, backends[0], opts, layout)
    finally:
        if bar is not None:
            bar.close()
    res.step_time_shares = tm.shares()
    return res, {"replicas": 1, "router": None, "per_replica": [_replica_json(res)]}


def _cpu_s(args: argparse.Namespace) -> float:
    """The per-step CPU term: ``--step-overhead-ms`` or the GPU calibration's."""
    if args.step_overhead_ms is not None:
        return float(args.step_overhead_ms) / 1e3
    return calibration_for(args.gpu or DEFAULT_GPU).cpu_s


def host_link_bytes_per_s(args: argparse.Namespace) -> float:
    """The host link of the run: ``--host-link-gbps`` or the GPU preset's."""
    if args.host_link_gbps is not None:
        return float(args.host_link_gbps) * 1e9
    return GPU_PRESETS[args.gpu or DEFAULT_GPU].host_link_bytes_per_s


def _host_tier(args: argparse.Namespace, layout: KVLayout, size: int) -> HostTier:
    """The host tier of ``size`` bytes for one engine."""
    per_chunk = chunk_bytes(layout.bytes_per_block)
    num_chunks = size // per_chunk
    if num_chunks < 1:
        raise UsageError(
            f"--cpu-offload {size:,} bytes holds no chunk of {per_chunk:,} bytes (one block)"
        )
    if args.offload_store_threshold < 0:
        raise UsageError(
            f"--offload-store-threshold must be >= 0, got {args.offload_store_threshold}"
        )
    spec = args.offload_policy
    try:
        policy = spec if isinstance(spec, str) else spec.build()
    except SpecError as e:
        raise UsageError(f"--offload-policy: {e}") from None
    name = spec if isinstance(spec, str) else spec.spec
    try:
        return HostTier(
            num_chunks,
            policy,
            name,
            ceiling_block_size(layout),
            per_chunk,
            host_link_bytes_per_s(args),
            prompt_only=not args.offload_decode,
            store_threshold=args.offload_store_threshold,
        )
    except ValueError as e:  # a retention policy the host tier cannot run
        raise UsageError(f"--offload-policy {name}: {e}") from None


def _replica_json(r: ReplayResult) -> dict[str, Any]:
    """One engine of a fleet: ``runs[i].fleet.per_replica[j]``."""
    total = max(1, r.num_blocks - 1)
    usage = [1.0 - f / total for f in r.series.free_blocks] if r.series is not None else []
    _, q, h = r.first_admission
    return {
        "requests": r.requests,
        "prefix_hit_rate": round(h / q, 6) if q else 0.0,
        "queried_tokens": q,
        "hit_tokens": h,
        "generated_tokens": r.generated_tokens,
        "preemptions": r.preemptions,
        "steps": r.steps,
        "peak_usage": round(max(usage, default=0.0), 6),
        "mean_usage": round(sum(usage) / len(usage), 6) if usage else 0.0,
        "ttft_s": percentiles(r.ttft_s),
        "simulated_s": round(r.simulated_s, 6),
    }


def _run_one(
    args: argparse.Namespace,
    trace: Trace,
    value: int | RetentionSpec | None,
    show_progress: bool,
    vllm: bool,
) -> Run:
    retention: RetentionSpec | None = args.retention
    over: dict[str, int] = {}
    if isinstance(value, RetentionSpec):
        retention = value
    elif value is not None:
        over = {args.sweep[0]: value}
    layout = _layout(
        args,
        **{k: v for k, v in over.items() if k not in ("max_num_seqs", "replicas", "cpu_offload")},
    )
    shown = value.spec if isinstance(value, RetentionSpec) else value
    name = "kvblocks" if value is None else f"{args.sweep[0]}={shown}"
    label = name if show_progress else None
    res, fleet = _replay("kvblocks", args, trace, layout, over, label, vllm, retention)
    run = Run(shown, layout, res, fleet=fleet, retention=retention)
    if vllm:
        label = "vLLM" if show_progress else None
        vres, _ = _replay("vllm", args, trace, layout, over, label, True)
        ours = run.result.kv_total_ns + run.result.request_hash_ns
        theirs = vres.kv_total_ns + vres.request_hash_ns
        run.vllm = {
            "version": vllm_available(),
            "kv_total_ns": vres.kv_total_ns,
            "request_hash_ns": vres.request_hash_ns,
            "wall_s": round(vres.wall_s, 3),
            "speedup": round(theirs / max(1, ours), 2),
            "digest": vres.digest,
            "kvblocks_digest": run.result.digest,
            "digests_agree": vres.digest == run.result.digest,
        }
    return run


def _run_job(job: tuple[argparse.Namespace, Trace, int | RetentionSpec | None, bool]) -> Run:
    """One sweep configuration in a worker process (no progress bar)."""
    args, trace, value, vllm = job
    return _run_one(args, trace, value, False, vllm)


def _run_parallel(
    args: argparse.Namespace,
    trace: Trace,
    values: Sequence[int | RetentionSpec | None],
    vllm: bool,
) -> list[Run]:
    """The sweep's configurations elsewhere, each one :func:`_run_job`, in sweep order: as
    Ray tasks with ``--ray``, else in ``--jobs`` spawned processes
    (:mod:`kvblocks.sim.parallel`)."""
    # The namespace without its parser (which holds argparse's local functions).
    plain = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "parser"})
    jobs = [(plain, trace, v, vllm) for v in values]
    if args.ray is None:
        return run_in_processes(_run_job, jobs, args.jobs)
    try:
        return run_on_ray(_run_job, jobs, args.ray)
    except RayUnavailableError as e:
        raise UsageError(str(e)) from None


def _attach_gpu_only(
    args: argparse.Namespace, trace: Trace, runs: list[Run], show_progress: bool
) -> None:
    """Gives runs with a host tier the GPU-only run for the TTFT change: a sweep of
    ``cpu_offload`` its 0 run (when it has one), a single run one more replay."""
    if args.sweep and args.sweep[0] == "cpu_offload":
        base = next((r.result for r in runs if r.value == 0), None)
        for r in runs:
            if r.result.offload is not None:
                r.gpu_only = base
        return
    if args.cpu_offload and not args.sweep:
        layout = runs[0].layout
        label = "GPU only" if show_progress else None
        over = {"cpu_offload": 0}
        res, _ = _replay("kvblocks", args, trace, layout, over, label, False, args.retention)
        runs[0].gpu_only = res


def _capacity(args: argparse.Namespace, setup: Setup, trace: Trace, show_progress: bool) -> int:
    """``--find-max-rate`` / ``--find-min-replicas``: the search, its table or JSON."""
    if args.slo_ttft is None and args.slo_tpot is None:
        raise UsageError("a capacity search needs --slo-ttft and/or --slo-tpot")
    if args.sweep or args.compare_vllm or args.plot or args.ray is not None:
        raise UsageError(
            "a capacity search runs alone: drop --sweep, --compare-vllm, --plot, --ray"
        )
    step_s = args.step_ms / 1e3
    max_rate = args.find_max_rate
    tqdm = importlib.import_module("tqdm").tqdm
    bar = tqdm(desc="find-max-rate" if max_rate else "find-min-replicas", unit="run",
               file=sys.stderr, disable=not show_progress, dynamic_ncols=True)  # fmt: skip

    def run_at(rate: float, replicas: int) -> tuple[Run, float, int]:
        scaled = at_rate(trace, rate, step_s)
        run = _run_one(argparse.Namespace(**{**vars(args), "replicas": replicas}), scaled,
                       None, False, False)  # fmt: skip
        att = slo_attainment(run.result, args.slo_ttft, args.slo_tpot) or 0.0
        bar.set_postfix_str(f"{rate:,.3f} req/s x {replicas}: {att:.1%}", refresh=False)
        bar.update(1)
        return run, att, len(run.result.ttft_s)

    try:
        if max_rate:
            start = args.request_rate or trace_rate(trace, step_s)

            def by_rate(rate: float) -> Probe[Run]:
                run, att, n = run_at(rate, args.replicas)
                return Probe(rate, att, n, run)

            search = find_max_rate(by_rate, start)
        else:
            rate = args.find_min_replicas

            def by_replicas(n: int) -> Probe[Run]:
                run, att, k = run_at(rate, n)
                return Probe(n, att, k, run)

            search = find_min_replicas(by_replicas)
    except ValueError as e:
        raise UsageError(str(e)) from None
    finally:
        bar.close()
    doc = capacity_json("max_rate" if max_rate else "min_replicas", search, setup)
    if search.best is not None:
        _write_requests(args, [search.best.run])
    out = sys.stdout
    if args.json:
        best = search.best.run if search.best is not None else search.probes[-1].run
        rate = search.best.value if max_rate and search.best is not None else None
        shown = at_rate(trace, rate, step_s) if rate is not None else trace
        full = report_json(setup, shown, [best])
        full["capacity"] = doc
        out.write(json.dumps(full) + "\n")
    else:
        print_capacity(out, doc)
    out.flush()
    return 0


def _write_requests(args: argparse.Namespace, runs: list[Run]) -> None:
    """``--requests-out``: every run's finished requests."""
    if args.requests_out:
        n = write_requests(args.requests_out, [(r.value, r.result.finished) for r in runs])
        print(f"{n:,} requests written to {os.path.abspath(args.requests_out)}", file=sys.stderr)


def _warn(message: str) -> None:
    print(f"kvblocks simulate: {message}", file=sys.stderr)


def _simulate(args: argparse.Namespace) -> int:
    compare = False
    if args.compare_vllm:
        version = vllm_available()
        if version is None:
            _warn(
                "--compare-vllm: vLLM is not importable in this Python; running kvblocks only "
                "(install vllm==0.33.0, or run from its environment)"
            )
        else:
            compare = True
            if version != "0.33.0":
                _warn(f"warning: vLLM {version} is not 0.33.0; digests may differ")
    if args.plot:
        _check_plot_path(args.plot)
    if args.requests_out:
        try:
            check_path(args.requests_out)
        except ValueError as e:
            raise UsageError(str(e)) from None
    swept_retention = bool(args.sweep) and args.sweep[0] == RETENTION_SWEEP
    if swept_retention and args.retention is not None:
        raise UsageError("--retention and --sweep retention=... both given; keep one")
    if compare and (swept_retention or (args.retention is not None and not args.retention.is_lru)):
        raise UsageError("--compare-vllm: vLLM has no retention policies; drop --retention")
    try:
        trace = _load_workload(args)
    except (TraceError, ValueError) as e:
        raise UsageError(str(e)) from None
    setup = Setup(
        args.model,
        args.max_num_batched_tokens,
        args.max_num_seqs,
        not args.no_prefix_caching,
        bool(args.reserve_full_isl),
        args.hash_algo,
        not args.no_batch,
        args.sweep[0] if args.sweep else None,
        hardware={
            "gpu": args.gpu or DEFAULT_GPU,
            "tp": args.tp,
            "fp8": args.fp8,
            "step_overhead_s": _cpu_s(args),
            "efficiency": args.efficiency,
            "calibration": calibration_for(args.gpu or DEFAULT_GPU).source,
            "gpu_memory_utilization": args.gpu_memory_utilization if args.gpu else None,
            "step_s": args.step_ms / 1e3,
            "host_link_bytes_per_s": host_link_bytes_per_s(args),
        },
        slo_ttft_s=args.slo_ttft,
        slo_tpot_s=args.slo_tpot,
    )
    show_progress = args.progress or sys.stderr.isatty()
    if args.find_max_rate or args.find_min_replicas is not None:
        return _capacity(args, setup, trace, show_progress)
    values: Sequence[int | RetentionSpec | None] = args.sweep[1] if args.sweep else [None]
    if args.ray is not None and args.jobs > 1:
        raise UsageError("--ray runs the configurations on the Ray cluster: drop --jobs")
    if args.ray is not None or (args.jobs > 1 and len(values) > 1):
        runs = _run_parallel(args, trace, values, compare)
    else:
        runs = [_run_one(args, trace, v, show_progress, compare) for v in values]
    _attach_gpu_only(args, trace, runs, show_progress)
    _write_requests(args, runs)
    out = sys.stdout
    if args.json:
        out.write(json.dumps(report_json(setup, trace, runs)) + "\n")
    elif args.sweep:
        print_sweep(out, args.sweep[0], runs, setup)
    else:
        print_summary(out, setup, trace, runs[0])
    out.flush()
    if args.plot:
        try:
            plot(args.plot, setup, trace, runs)
        except OSError as e:
            _warn(f"error: cannot write the plot {args.plot}: {e.strerror or e}")
            return 1
        print(f"plot written to {os.path.abspath(args.plot)}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvblocks`` console script; returns the exit status."""
    ap = build_parser()
    args, extra = ap.parse_known_args(argv)
    if extra:  # reported by the subcommand that was given them
        parser: argparse.ArgumentParser = getattr(args, "parser", ap)
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        ap.print_help(sys.stderr)
        return 2
    try:
        return _simulate(args)
    except UsageError as e:
        _warn(f"error: {e}")
        return 2
    except ReplayError as e:
        _warn(f"error: {e}")
        return 1
    except KeyboardInterrupt:
        _warn("interrupted")
        return 130
    except BrokenPipeError:
        # the reader went away (| head): stop quietly, as other command line tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
