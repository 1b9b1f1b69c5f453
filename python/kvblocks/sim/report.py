"""What ``kvblocks simulate`` reports: the JSON document, the summary, the sweep table and
the plot, all from the same :class:`Run` records.

The JSON schema (``kvblocks-simulate-v4``) is documented in ``docs/simulate-json.md``;
a change to a field's name or meaning bumps the version.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TextIO

import kvblocks
from kvblocks.retention_spec import RetentionSpec
from kvblocks.sim.capacity import TARGET, Probe, Search, wilson_interval
from kvblocks.sim.engine import ReplayResult
from kvblocks.sim.percentiles import percentiles
from kvblocks.sim.presets import MODEL_PRESETS, KVLayout
from kvblocks.sim.workloads import Trace

__all__ = [
    "SCHEMA",
    "Run",
    "Setup",
    "capacity_json",
    "fmt_bytes",
    "plot",
    "print_capacity",
    "print_summary",
    "print_sweep",
    "report_json",
    "run_json",
    "slo_attainment",
]

SCHEMA = "kvblocks-simulate-v4"


@dataclass(frozen=True)
class Setup:
    """What every run of one invocation shares: the preset and scheduler settings."""

    preset: str
    max_num_batched_tokens: int
    max_num_seqs: int
    prefix_caching: bool
    reserve_full_isl: bool
    hash_algo: str
    batch: bool
    sweep: str | None = None
    hardware: dict[str, Any] | None = None
    """The step-time model's GPU and settings (``hardware`` in the JSON)."""
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None


@dataclass
class Run:
    """One replay: the swept value (None without ``--sweep``; a spec string for
    ``retention``), its layout and result, and the vLLM comparison when one was made."""

    value: int | str | None
    layout: KVLayout
    result: ReplayResult
    vllm: dict[str, Any] | None = None
    fleet: dict[str, Any] | None = None
    """``{replicas, router, per_replica: [...]}``."""
    retention: RetentionSpec | None = None
    """The run's retention policy (None: ``lru``)."""
    gpu_only: ReplayResult | None = None
    """The same run without a host tier, for the TTFT change (runs with one only)."""


def _rate(hits: int, queried: int) -> float:
    return round(hits / queried, 6) if queried else 0.0


def _usage(res: ReplayResult) -> list[float]:
    """Per-step usage (vLLM's: 1 - free / (num_blocks - 1))."""
    assert res.series is not None
    total = max(1, res.num_blocks - 1)
    return [1.0 - f / total for f in res.series.free_blocks]


def slo_attainment(res: ReplayResult, ttft: float | None, tpot: float | None) -> float | None:
    """Fraction of finished requests with TTFT <= ``ttft`` and TPOT <= ``tpot`` (a bound
    not given always holds; a one-token request has no TPOT); None without bounds."""
    if ttft is None and tpot is None:
        return None
    n = len(res.ttft_s)
    if not n:
        return 0.0
    ok = 0
    for a, b in zip(res.ttft_s, res.tpot_s, strict=True):
        if (ttft is None or a <= ttft) and (tpot is None or math.isnan(b) or b <= tpot):
            ok += 1
    return round(ok / n, 6)


def run_json(run: Run, setup: Setup | None = None) -> dict[str, Any]:
    """One element of the document's ``runs`` (see ``docs/simulate-json.md``)."""
    r, lay = run.result, run.layout
    usage = _usage(r)
    c = r.ceilings  # None with --no-ceilings
    sim = r.simulated_s
    tenants = None
    if any(name for name in r.tenants):
        tenants = []
        for name, (n, q, h) in sorted(r.tenants.items()):
            ceil = c.tenants.get(name) if c is not None else None
            tenants.append(
                {
                    "cache_salt": name or None,
                    "requests": n,
                    "queried_tokens": q,
                    "hit_tokens": h,
                    "prefix_hit_rate": _rate(h, q),
                    "infinite_cache_hit_rate": _rate(ceil[3], q) if ceil else None,
                    "ideal_hit_rate": _rate(ceil[4], q) if ceil else None,
                }
            )
    loop_s = r.loop_s
    out: dict[str, Any] = {
        "value": run.value,
        "num_blocks": lay.num_blocks,
        "block_size": lay.groups[0].block_size,
        "bytes_per_block": lay.bytes_per_block,
        "kv_cache_bytes": lay.bytes_per_block * lay.num_blocks,
        "requests": r.requests,
        "rejected_requests": r.rejected,
        "length_capped_requests": r.length_capped,
        "prompt_tokens": r.prompt_tokens,
        "generated_tokens": r.generated_tokens,
        "steps": r.steps,
        "preemptions": r.preemptions,
        "prefix_hit_rate": round(r.hit_rate, 6),
        "queried_tokens": r.first_admission[1],
        "hit_tokens": r.first_admission[2],
        "preempted_hit_rate": round(r.preempted_hit_rate, 6),
        "preempted_requests": r.resumed[0],
        "preempted_queried_tokens": r.resumed[1],
        "preempted_hit_tokens": r.resumed[2],
        "infinite_cache_hit_rate": round(c.infinite_hit_rate, 6) if c else None,
        "ideal_hit_rate": round(c.ideal_hit_rate, 6) if c else None,
        "infinite_cache_hit_tokens": c.infinite_hit_tokens if c else None,
        "ideal_hit_tokens": c.ideal_hit_tokens if c else None,
        "tenants": tenants,
        "peak_usage": round(max(usage, default=0.0), 6),
        "mean_usage": round(sum(usage) / len(usage), 6) if usage else 0.0,
        "kv_total_ns": r.kv_total_ns,
        "kv_ns_per_step": round(r.kv_total_ns / r.steps, 1) if r.steps else 0.0,
        "kv_ns_per_generated_token": round(r.kv_total_ns / r.generated_tokens, 1)
        if r.generated_tokens
        else 0.0,
        "request_hash_ns": r.request_hash_ns,
        "wall_s": round(r.wall_s, 3),
        "synth_s": round(r.synth_ns / 1e9, 3),
        "steps_per_s": round(r.steps / loop_s, 1) if loop_s > 0 else 0.0,
        "sim_requests_per_s": round(r.requests / loop_s, 1) if loop_s > 0 else 0.0,
        "simulated_s": round(sim, 6),
        "throughput_tokens_per_s": round(r.generated_tokens / sim, 3) if sim > 0 else 0.0,
        "step_time_shares": {k: round(v, 6) for k, v in r.step_time_shares.items()}
        if r.step_time_shares is not None
        else None,
        "latency": {
            "ttft_s": percentiles(r.ttft_s),
            "tpot_s": percentiles(r.tpot_s),
            "e2e_s": percentiles(r.e2e_s),
        },
        "slo_attainment": slo_attainment(
            r,
            setup.slo_ttft_s if setup else None,
            setup.slo_tpot_s if setup else None,
        ),
        "fleet": run.fleet,
        "retention": (run.retention or RetentionSpec()).as_json(),
        "offload": _offload_json(run),
    }
    if run.vllm is not None:
        out["vllm"] = run.vllm
    return out


def _offload_json(run: Run) -> dict[str, Any] | None:
    """``runs[i].offload``: the host tier's numbers, None without one."""
    r = run.result
    o = r.offload
    if o is None:
        return None
    _, q, gpu = r.first_admission
    ttft = percentiles(r.ttft_s)
    base = percentiles(run.gpu_only.ttft_s) if run.gpu_only is not None else None
    change = None
    if base is not None and base["p50"] is not None and ttft["p50"] is not None:
        change = round(ttft["p50"] - base["p50"], 6)
    return {
        "capacity_bytes": o.capacity_bytes,
        "num_chunks": o.num_chunks,
        "chunk_tokens": o.chunk_tokens,
        "chunk_bytes": o.chunk_bytes,
        "policy": o.policy,
        "prompt_only": o.prompt_only,
        "store_threshold": o.store_threshold,
        "link_bytes_per_s": o.link_bytes_per_s,
        "gpu_hit_rate": _rate(gpu, q),
        "host_hit_rate": _rate(o.hit_tokens, q),
        "combined_hit_rate": _rate(gpu + o.hit_tokens, q),
        "gpu_hit_tokens": gpu,
        "host_hit_tokens": o.hit_tokens,
        "preempted_host_hit_tokens": o.resumed_hit_tokens,
        "loaded_chunks": o.loaded_chunks,
        "stored_chunks": o.stored_chunks,
        "evicted_chunks": o.evicted_chunks,
        "loaded_bytes": o.loaded_bytes,
        "stored_bytes": o.stored_bytes,
        "store_failures": o.store_failures,
        "stores_skipped": o.stores_skipped,
        "load_link_s": round(o.load_s, 6),
        "store_link_s": round(o.store_s, 6),
        "gpu_only_ttft_s": base,
        "ttft_p50_change_s": change,
    }


def report_json(setup: Setup, trace: Trace, runs: list[Run]) -> dict[str, Any]:
    """The whole ``--json`` document."""
    lay = runs[0].layout
    preset = MODEL_PRESETS[setup.preset]
    return {
        "schema": SCHEMA,
        "kvblocks_version": kvblocks.__version__,
        "workload": {
            "kind": trace.kind,
            "seed": trace.seed,
            "source": trace.source,
            "requests": len(trace.requests),
            "prompt_tokens": sum(r.prompt_len for r in trace.requests),
            "params": trace.params,
        },
        "model": {
            "preset": setup.preset,
            "model": preset.model,
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
            "max_num_batched_tokens": setup.max_num_batched_tokens,
            "max_num_seqs": setup.max_num_seqs,
            "max_model_len": lay.max_model_len,
            "prefix_caching": setup.prefix_caching,
            "reserve_full_isl": setup.reserve_full_isl,
            "hash_algo": setup.hash_algo,
            "batch": setup.batch,
        },
        "hardware": setup.hardware,
        "sweep": setup.sweep,
        "runs": [run_json(r, setup) for r in runs],
    }


def fmt_bytes(n: int) -> str:
    """``n`` bytes in binary units, e.g. ``16.0 GiB``."""
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


def _workload_name(trace: Trace) -> str:
    return trace.source or f"{trace.kind} (seed {trace.seed})"


def _model_line(setup: Setup, run: Run) -> str:
    j = run_json(run)
    return (
        f"{setup.preset} ({MODEL_PRESETS[setup.preset].model}), {j['num_blocks']:,} blocks "
        f"x {j['block_size']} tokens ({fmt_bytes(j['kv_cache_bytes'])})"
    )


def _pct_or(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _fmt_s(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 1:
        return f"{v:.2f} s"
    return f"{v * 1e3:.1f} ms"


def _pcts(p: dict[str, float | None]) -> str:
    return ", ".join(f"{name} {_fmt_s(v)}" for name, v in p.items())


def print_summary(out: TextIO, setup: Setup, trace: Trace, run: Run) -> None:
    """The table of one run."""
    j = run_json(run, setup)
    rows = [
        ("workload", _workload_name(trace)),
        ("model", _model_line(setup, run)),
        ("requests", f"{j['requests']:,}"),
    ]
    max_model_len = f"max_model_len {run.layout.max_model_len:,}"
    if j["rejected_requests"]:
        rows.append(
            (
                "  rejected",
                f"{j['rejected_requests']:,} (prompt of {max_model_len} tokens or more: "
                "vLLM refuses it)",
            )
        )
    if j["length_capped_requests"]:
        rows.append(
            (
                "  length capped",
                f"{j['length_capped_requests']:,} (output stopped at {max_model_len})",
            )
        )
    rows += [
        ("prompt tokens", f"{j['prompt_tokens']:,}"),
        ("generated tokens", f"{j['generated_tokens']:,}"),
        ("steps", f"{j['steps']:,}"),
        (
            "prefix hit rate",
            f"{j['prefix_hit_rate']:.1%} ({j['hit_tokens']:,} of {j['queried_tokens']:,} "
            "prompt tokens at first admission)",
        ),
        (
            "  infinite cache",
            f"{_pct_or(j['infinite_cache_hit_rate'])} (every block ever stored kept)",
        ),
        (
            "  ideal (Belady)",
            f"{_pct_or(j['ideal_hit_rate'])} (same memory, farthest next use out)",
        ),
        ("preemptions", f"{j['preemptions']:,}"),
    ]
    if j["preempted_requests"]:
        rows.append(
            (
                "preempted re-hits",
                f"{j['preempted_hit_rate']:.1%} ({j['preempted_hit_tokens']:,} of "
                f"{j['preempted_queried_tokens']:,} tokens, {j['preempted_requests']:,} "
                "re-admissions; not in the hit rate)",
            )
        )
    for t in j["tenants"] or ():
        rows.append(
            (
                f"  tenant {t['cache_salt'] or '(no salt)'}",
                f"{t['prefix_hit_rate']:.1%} hit, {_pct_or(t['infinite_cache_hit_rate'])} "
                f"infinite, {_pct_or(t['ideal_hit_rate'])} ideal ({t['requests']:,} requests, "
                f"{t['hit_tokens']:,} of {t['queried_tokens']:,} tokens)",
            )
        )
    rows.append(("retention", _retention_text(run.retention)))
    off = j["offload"]
    if off is not None:
        rows += [
            (
                "host tier",
                f"{fmt_bytes(off['capacity_bytes'])}, {off['num_chunks']:,} chunks of "
                f"{off['chunk_tokens']} tokens, {off['policy']}, "
                f"{off['link_bytes_per_s'] / 1e9:g} GB/s link",
            ),
            (
                "  hit rate",
                f"GPU {off['gpu_hit_rate']:.1%} + host {off['host_hit_rate']:.1%} = "
                f"{off['combined_hit_rate']:.1%} (first admissions)",
            ),
            (
                "  moved",
                f"{fmt_bytes(off['loaded_bytes'])} loaded, {fmt_bytes(off['stored_bytes'])} "
                f"stored, {off['evicted_chunks']:,} chunks evicted",
            ),
        ]
        base = off["gpu_only_ttft_s"]
        if base is not None:
            rows.append(
                (
                    "  TTFT change",
                    f"p50 {_fmt_s(base['p50'])} -> {_fmt_s(j['latency']['ttft_s']['p50'])}, "
                    f"p90 {_fmt_s(base['p90'])} -> {_fmt_s(j['latency']['ttft_s']['p90'])} "
                    "(GPU only -> with the host tier)",
                )
            )
    hw = setup.hardware or {}
    lat = j["latency"]
    rows += [
        (
            "simulated time",
            f"{j['simulated_s']:,.1f} s on {hw.get('gpu', '?')} x tp {hw.get('tp', 1)} "
            "(step-time model)",
        ),
        ("TTFT", _pcts(lat["ttft_s"])),
        ("TPOT", _pcts(lat["tpot_s"])),
        ("end to end", _pcts(lat["e2e_s"])),
        ("throughput", f"{j['throughput_tokens_per_s']:,.0f} generated tokens / s"),
    ]
    shares = j["step_time_shares"]
    if shares:
        top = sorted(((v, k) for k, v in shares.items() if v >= 0.005), reverse=True)
        rows.append(("step time", ", ".join(f"{k.replace('_', ' ')} {v:.0%}" for v, k in top)))
    if j["slo_attainment"] is not None:
        rows.append(
            (
                "SLO attainment",
                f"{j['slo_attainment']:.1%} (TTFT <= {setup.slo_ttft_s} s, "
                f"TPOT <= {setup.slo_tpot_s} s)",
            )
        )
    fl = j["fleet"]
    if fl is not None and fl["replicas"] > 1:
        per = ", ".join(f"{p['prefix_hit_rate']:.0%}/{p['requests']}" for p in fl["per_replica"])
        rows.append(
            ("fleet", f"{fl['replicas']} replicas, {fl['router']} (hit rate/requests: {per})")
        )
    rows += [
        ("peak usage", f"{j['peak_usage']:.1%}"),
        ("mean usage", f"{j['mean_usage']:.1%}"),
        ("KV time / step", _fmt_ns(j["kv_ns_per_step"])),
        ("KV time / token", _fmt_ns(j["kv_ns_per_generated_token"]) + " (per generated token)"),
        ("KV time total", _fmt_ns(j["kv_total_ns"])),
        ("hashing time", _fmt_ns(j["request_hash_ns"])),
        (
            "steps / s",
            f"{j['steps_per_s']:,.0f} (simulated, wall {j['wall_s']:.2f} s, of which "
            f"{j['synth_s']:.2f} s making tokens and ceilings)",
        ),
        ("requests / s", f"{j['sim_requests_per_s']:,.0f} (simulated per wall second)"),
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


def _retention_text(spec: RetentionSpec | None) -> str:
    if spec is None or spec.is_lru:
        return "lru (vLLM's order, no policy)"
    return f"{spec.spec} (docs/retention.md)"


def _value_text(key: str, value: int | str | None) -> str:
    if isinstance(value, str):
        return value
    if key in ("gpu_memory", "cpu_offload"):
        return fmt_bytes(value or 0)
    return f"{value:,}"


def print_sweep(out: TextIO, key: str, runs: list[Run], setup: Setup | None = None) -> None:
    """One row per swept value; then, when requests have cache salts, one row per swept
    value of per-tenant hit rates."""
    head = [key, "blocks", "memory", "hit rate", "infinite", "ideal", "preempt", "peak use",
            "mean use", "steps", "KV/step", "KV/token", "steps/s", "TTFT p50", "TTFT p99",
            "TPOT p50", "tok/s", "sim s", "req/s"]  # fmt: skip
    slo = setup is not None and (setup.slo_ttft_s is not None or setup.slo_tpot_s is not None)
    if slo:
        head.append("SLO")
    offload = any(run.result.offload is not None for run in runs)
    if offload:
        head += ["GPU hit", "host hit", "combined", "loaded", "stored"]
    compare = any(run.vllm is not None for run in runs)
    if compare:
        head += ["vs vLLM", "digests"]
    rows = [head]
    for run in runs:
        j = run_json(run, setup)
        value = _value_text(key, run.value)
        lat = j["latency"]
        row = [
            value, f"{j['num_blocks']:,}", fmt_bytes(j["kv_cache_bytes"]),
            f"{j['prefix_hit_rate']:.1%}", _pct_or(j["infinite_cache_hit_rate"]),
            _pct_or(j["ideal_hit_rate"]), f"{j['preemptions']:,}", f"{j['peak_usage']:.1%}",
            f"{j['mean_usage']:.1%}", f"{j['steps']:,}", _fmt_ns(j["kv_ns_per_step"]),
            _fmt_ns(j["kv_ns_per_generated_token"]), f"{j['steps_per_s']:,.0f}",
            _fmt_s(lat["ttft_s"]["p50"]), _fmt_s(lat["ttft_s"]["p99"]),
            _fmt_s(lat["tpot_s"]["p50"]), f"{j['throughput_tokens_per_s']:,.0f}",
            f"{j['simulated_s']:,.1f}", f"{j['sim_requests_per_s']:,.0f}",
        ]  # fmt: skip
        if slo:
            row.append(f"{j['slo_attainment']:.1%}")
        if offload:
            off = j["offload"]
            if off is None:
                row += [f"{j['prefix_hit_rate']:.1%}", "-", f"{j['prefix_hit_rate']:.1%}", "-", "-"]
            else:
                row += [
                    f"{off['gpu_hit_rate']:.1%}",
                    f"{off['host_hit_rate']:.1%}",
                    f"{off['combined_hit_rate']:.1%}",
                    fmt_bytes(off["loaded_bytes"]),
                    fmt_bytes(off["stored_bytes"]),
                ]
        if compare:
            v = run.vllm or {}
            row += [f"{v.get('speedup', '-')}x", "agree" if v.get("digests_agree") else "DIFFER"]
        rows.append(row)
    _write_table(out, rows)
    per = [run_json(run, setup)["tenants"] for run in runs]
    names = sorted({t["cache_salt"] or "(no salt)" for ts in per for t in ts or ()})
    if names:
        out.write("\nprefix hit rate per tenant (cache salt):\n")
        rows = [[key, "all", *names]]
        for run, ts in zip(runs, per, strict=True):
            rates = {t["cache_salt"] or "(no salt)": t["prefix_hit_rate"] for t in ts or ()}
            hit = run.result.hit_rate
            cells = [f"{rates[n]:.1%}" if n in rates else "-" for n in names]
            rows.append([_value_text(key, run.value), f"{hit:.1%}", *cells])
        _write_table(out, rows)


def _write_table(out: TextIO, rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + "\n")


def plot(path: str, setup: Setup, trace: Trace, runs: list[Run]) -> None:
    """Usage, cumulative hit rate and TTFT over simulated time (over steps for runs
    without time) of every run, preemptions marked, the ceilings as dashed lines; the
    title names workload, model, memory and blocks.

    Raises:
        ImportError: matplotlib is not installed.
        OSError: The file cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_u, ax_h, ax_l) = plt.subplots(3, 1, sharex=True, figsize=(10, 9))
    timed = all(run.result.series is not None and len(run.result.series.time_s) for run in runs)
    for run in runs:
        series = run.result.series
        assert series is not None
        xs = list(series.time_s) if timed else list(series.step)
        hit = [h / q if q else 0.0 for h, q in zip(series.hits, series.queried, strict=True)]
        label = f"{setup.sweep}={run.value}" if setup.sweep else "kvblocks"
        (line,) = ax_u.plot(xs, _usage(run.result), label=label, linewidth=0.8)
        color = line.get_color()
        ax_h.plot(xs, hit, color=color, linewidth=0.8, label=label)
        if timed:
            ax_l.plot(list(run.result.finish_s), list(run.result.ttft_s), ".", color=color,
                      markersize=2, label=f"{label} TTFT")  # fmt: skip
        marks = [s for s, p in zip(xs, series.preemptions, strict=True) if p]
        if marks:
            ax_u.plot(marks, [1.02] * len(marks), "v", color=color, markersize=4,
                      label=f"preemptions ({run.result.preemptions:,})")  # fmt: skip
        c = run.result.ceilings
        if c is not None and not setup.sweep:
            ax_h.axhline(c.infinite_hit_rate, color="gray", linestyle="--", linewidth=0.8,
                         label=f"infinite cache {c.infinite_hit_rate:.1%}")  # fmt: skip
            ax_h.axhline(c.ideal_hit_rate, color="gray", linestyle=":", linewidth=0.8,
                         label=f"ideal (Belady) {c.ideal_hit_rate:.1%}")  # fmt: skip
    first = runs[0]
    if setup.sweep:
        what = f"sweep of {setup.sweep}: " + ", ".join(str(r.value) for r in runs)
    else:
        what = (
            f"{fmt_bytes(first.layout.bytes_per_block * first.layout.num_blocks)}, "
            f"{first.layout.num_blocks:,} blocks x {first.layout.groups[0].block_size} tokens"
        )
    model = MODEL_PRESETS[setup.preset].model
    fig.suptitle(
        f"{_workload_name(trace)}, {len(trace.requests):,} requests\n"
        f"{setup.preset} ({model}), {what}",
        fontsize="medium",
    )
    ax_u.set_ylabel("KV block usage")
    ax_u.set_ylim(0, 1.06)
    ax_h.set_ylabel("prefix hit rate\n(first admissions, cumulative)")
    ax_h.set_ylim(0, 1)
    ax_l.set_ylabel("TTFT (s), at each\nrequest's finish")
    ax_l.set_xlabel("simulated time (s)" if timed else "scheduler step")
    ax_u.legend(fontsize="small", loc="lower right")
    ax_h.legend(fontsize="small", loc="lower right")
    if timed:
        ax_l.legend(fontsize="small", loc="upper left")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


def capacity_json(kind: str, search: Search[Run], setup: Setup) -> dict[str, Any]:
    """``capacity``: a ``--find-max-rate`` (``kind`` ``max_rate``) or ``--find-min-replicas``
    (``min_replicas``) search (``docs/simulate-time.md``, "Capacity search")."""
    best, nxt = search.best, search.next
    interval = wilson_interval(best.attainment, best.requests) if best is not None else None
    key = "rate_per_s" if kind == "max_rate" else "replicas"

    def value(p: Probe[Run] | None) -> float | int | None:
        if p is None:
            return None
        return round(p.value, 6) if kind == "max_rate" else int(p.value)

    return {
        "search": kind,
        "target": TARGET,
        "slo_ttft_s": setup.slo_ttft_s,
        "slo_tpot_s": setup.slo_tpot_s,
        key: value(best),
        "attainment": best.attainment if best is not None else None,
        "attainment_interval_95": [round(x, 6) for x in interval] if interval else None,
        "requests": best.requests if best is not None else None,
        f"next_{key}": value(nxt),
        "next_attainment": nxt.attainment if nxt is not None else None,
        "probes": [
            {key: value(p), "attainment": p.attainment, "met": p.met} for p in search.probes
        ],
    }


def print_capacity(out: TextIO, doc: dict[str, Any]) -> None:
    """The search's probes and its answer, from :func:`capacity_json`."""
    rate = doc["search"] == "max_rate"
    key = "rate_per_s" if rate else "replicas"
    slo = " and ".join(
        f"{name} <= {_fmt_s(v)}"
        for name, v in (("TTFT", doc["slo_ttft_s"]), ("TPOT", doc["slo_tpot_s"]))
        if v is not None
    )
    out.write(f"SLO: {slo} for {doc['target']:.0%} of requests\n")
    out.write(f"{'req/s' if rate else 'replicas':>10}  attainment\n")
    for p in doc["probes"]:
        shown = f"{p[key]:,.3f}" if rate else f"{p[key]}"
        out.write(f"{shown:>10}  {p['attainment']:.2%}{'' if p['met'] else '  (misses)'}\n")
    if doc[key] is None:
        out.write("no value tried meets the SLOs\n")
        return
    lo, hi = doc["attainment_interval_95"]
    what = f"{doc[key]:,.3f} req/s" if rate else f"{doc[key]} replicas"
    out.write(
        f"{'highest rate' if rate else 'fewest replicas'} meeting the SLOs: {what} "
        f"(attainment {doc['attainment']:.2%}, 95% interval {lo:.2%}-{hi:.2%} over "
        f"{doc['requests']:,} requests)"
    )
    nxt = doc[f"next_{key}"]
    if nxt is not None:
        shown = f"{nxt:,.3f} req/s" if rate else f"{nxt} replicas"
        out.write(f"; {shown} misses them ({doc['next_attainment']:.2%})")
    out.write("\n")
