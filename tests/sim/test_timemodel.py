"""The step-time model: its kernels checked by hand, and its step times against Vidur's
trained predictor on A100 / Llama-3-8B (docs/simulate-time.md)."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import statistics
from pathlib import Path

import pytest
from kvblocks.sim.calibration import A100, CALIBRATIONS, HOPPER
from kvblocks.sim.cli import main
from kvblocks.sim.presets import MODEL_PRESETS, model_layout
from kvblocks.sim.timemodel import (
    GPU_PRESETS,
    TERMS,
    StepTimeModel,
    gpu_preset_name,
    kv_memory_after_weights,
)
from paths import ROOT

A100_80 = GPU_PRESETS["a100-80gb"]
H100 = GPU_PRESETS["h100-sxm"]
VIDUR_STEPS = Path(__file__).parent / "data" / "vidur_a100_llama3_8b_steps.csv"


def _model(preset: str = "llama-3-8b", gpu: str = "a100-80gb", tp: int = 1) -> StepTimeModel:
    layout = model_layout(preset, num_blocks=100)
    return StepTimeModel(layout, preset, GPU_PRESETS[gpu], tp=tp)


def _vidur_rows() -> list[tuple[list[tuple[int, int]], bool, float]]:
    """(the step's (cached, new) pairs, inside Vidur's profile, Vidur's ms)."""
    lines = [line for line in VIDUR_STEPS.read_text().splitlines() if not line.startswith("#")]
    rows = []
    for r in csv.DictReader(lines):
        batch = [(int(c), int(n)) for c, n in (p.split(":") for p in r["prefills"].split())]
        batch += [(int(r["decode_context"]), 1)] * int(r["decodes"])
        rows.append((batch, r["in_profile"] == "1", float(r["vidur_ms"])))
    return rows


def test_step_times_match_vidur_inside_its_profile() -> None:
    m = _model()
    errors = {True: [], False: []}  # type: dict[bool, list[float]]
    for batch, inside, vidur_ms in _vidur_rows():
        errors[inside].append(abs(m.step_time(batch) * 1e3 / vidur_ms - 1))
    inside = errors[True]
    # the bounds where Vidur measured every kernel of the step
    assert len(inside) >= 25
    assert statistics.median(inside) <= 0.10
    assert max(inside) <= 0.25
    # everywhere (Vidur's forests repeat their last profiled value past it): the median holds
    assert statistics.median(inside + errors[False]) <= 0.10


def test_the_step_is_the_sum_of_its_kernels() -> None:
    m = _model()
    cost = m.cost([(0, 512)] + [(640, 1)] * 31)
    assert list(cost.parts) == list(TERMS)
    assert cost.seconds == pytest.approx(sum(cost.parts.values()))
    assert cost.parts["attention_prefill"] > 0 and cost.parts["attention_decode"] > 0
    assert cost.parts["all_reduce"] == 0  # one GPU
    assert m.step_time([(0, 512)] + [(640, 1)] * 31) == pytest.approx(cost.seconds)


def test_a_small_decode_step_reads_the_weights() -> None:
    # one decode: every GEMM is bound by its weights at the GEMMs' fitted bandwidth
    m = _model()
    gemm = m.cost([(1000, 1)]).parts["gemm"]
    weights = 32 * 2 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336)
    at_fit = weights / (A100_80.hbm_bytes_per_s * A100.gemm_memory_efficiency)
    launches = 4 * 32 * A100.gemm_launch_s
    assert gemm == pytest.approx(at_fit + launches, rel=0.01)  # and the activations


def test_a_long_prefill_is_bound_by_flops() -> None:
    m = _model()
    n = 8192
    gemm = m.cost([(0, n)]).parts["gemm"]
    flops = 2 * n * 32 * 4096 * (6144 + 4096 + 3 * 14336)
    assert gemm == pytest.approx(
        flops / (312e12 * A100.gemm_compute_efficiency * n / (n + A100.gemm_half_m)), rel=0.01
    )


def test_decode_attention_grows_with_context_and_batch() -> None:
    m = _model()

    def attn(batch: list[tuple[int, int]]) -> float:
        return m.cost(batch).parts["attention_decode"]

    assert attn([(4096, 1)] * 64) > 1.9 * attn([(2048, 1)] * 64)
    assert attn([(1024, 1)] * 128) > attn([(1024, 1)] * 64)
    # a bigger batch reads its bytes at a higher efficiency
    assert attn([(1024, 1)] * 128) < 2 * attn([(1024, 1)] * 64)


def test_efficiency_scales_and_cpu_adds() -> None:
    layout = model_layout("llama-3-8b", num_blocks=100)
    base = _model().step_time([(500, 1)] * 8)
    slow = StepTimeModel(layout, "llama-3-8b", A100_80, efficiency=0.5)
    cpu = StepTimeModel(layout, "llama-3-8b", A100_80, cpu_s=0.002)
    assert cpu.step_time([(500, 1)] * 8) == pytest.approx(base + 0.002)
    # every efficiency halved: the non-fixed part of each kernel doubles
    assert 1.8 * base < slow.step_time([(500, 1)] * 8) < 2 * base


def test_tensor_parallelism_splits_the_kernels_and_adds_all_reduces() -> None:
    one = _model("llama-3.1-70b", "h100-sxm", tp=1).cost([(0, 2048)])
    two = _model("llama-3.1-70b", "h100-sxm", tp=2).cost([(0, 2048)])
    four = _model("llama-3.1-70b", "h100-sxm", tp=4).cost([(0, 2048)])
    assert one.parts["all_reduce"] == 0 < two.parts["all_reduce"]
    assert two.parts["gemm"] == pytest.approx(one.parts["gemm"] / 2, rel=0.05)
    assert four.seconds < two.seconds < one.seconds
    # 2 all-reduces per layer of 2048 x 8192 bf16 on NVLink 4
    ring = 2 * 80 * (2 * 0.5 * 2048 * 8192 * 2 / (450e9 * A100.link_efficiency))
    assert two.parts["all_reduce"] == pytest.approx(ring + 160 * A100.all_reduce_launch_s)


def test_a_sliding_window_caps_the_context() -> None:
    def growth(window: int) -> float:
        layout = model_layout("gpt-oss-20b", num_blocks=100, overrides={"sliding_window": window})
        m = StepTimeModel(layout, "gpt-oss-20b", H100)
        long, short = m.cost([(10_000, 1)] * 32), m.cost([(200, 1)] * 32)
        return long.parts["attention_decode"] - short.parts["attention_decode"]

    # past the window only the 12 full-attention layers of 24 read more
    assert growth(128) == pytest.approx(growth(100_000) / 2, rel=0.01)


def test_a_mixture_of_experts_reads_the_experts_its_tokens_touch() -> None:
    m = _model("gpt-oss-120b", "h100-sxm")
    one = m.cost([(100, 1)]).parts["gemm"]
    many = m.cost([(100, 1)] * 256).parts["gemm"]
    # 256 tokens touch nearly every expert (1 - (1 - 0.026) ** 256 > 0.99): all weights but
    # the embeddings' (the logits GEMM is apart), read at the GEMMs' bandwidth
    experts_and_attention = MODEL_PRESETS["gpt-oss-120b"].weights_bytes - 2 * 201088 * 2880 * 2
    assert many > 0.99 * experts_and_attention / (
        H100.hbm_bytes_per_s * HOPPER.gemm_memory_efficiency
    )
    assert one < many / 5  # one token: its 4 experts of 128 per layer


def test_every_gpu_has_a_calibration() -> None:
    assert set(CALIBRATIONS) == set(GPU_PRESETS)
    for name in GPU_PRESETS:
        m = _model(gpu=name)
        assert 0 < m.step_time([(100, 1)]) < 0.1


def test_memory_after_weights() -> None:
    weights = MODEL_PRESETS["llama-3-8b"].weights_bytes
    free = kv_memory_after_weights(H100, weights)
    assert free == int(0.9 * (80 << 30)) - weights
    assert kv_memory_after_weights(H100, weights, tp=2) == int(0.9 * (80 << 30)) - weights // 2
    with pytest.raises(ValueError, match="do not fit"):
        kv_memory_after_weights(GPU_PRESETS["l40s"], MODEL_PRESETS["gpt-oss-120b"].weights_bytes)
    with pytest.raises(ValueError, match="FP8"):
        StepTimeModel(model_layout("llama-3-8b", num_blocks=10), "llama-3-8b", A100_80, fp8=True)


def test_every_gpu_preset_is_sane() -> None:
    for g in GPU_PRESETS.values():
        assert g.bf16_flops > 1e14 and g.hbm_bytes_per_s > 5e11 and g.memory_bytes >= 40 << 30
        assert g.fp8_flops is None or math.isclose(g.fp8_flops, 2 * g.bf16_flops, rel_tol=0.02)


@pytest.mark.parametrize(
    ("typed", "preset"),
    [("H100", "h100-sxm"), ("NVIDIA H100 SXM", "h100-sxm"), ("h100_sxm", "h100-sxm"),
     ("H200", "h200"), ("A100", "a100-80gb"), ("a100-40GB", "a100-40gb"), ("L40S", "l40s")],
)  # fmt: skip
def test_gpu_names_are_what_users_type(
    capsys: pytest.CaptureFixture[str], typed: str, preset: str
) -> None:
    assert gpu_preset_name(typed) == preset
    argv = ["simulate", "--gpu", typed, "--num-requests", "2", "--no-ceilings", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["hardware"]["gpu"] == preset
    # the KV cache is what the named GPU holds after the default model's weights
    run = doc["runs"][0]
    free = kv_memory_after_weights(
        GPU_PRESETS[preset], MODEL_PRESETS[doc["model"]["preset"]].weights_bytes
    )
    assert free - run["bytes_per_block"] < run["kv_cache_bytes"] <= free


def test_unknown_gpu_lists_presets_and_aliases() -> None:
    with pytest.raises(ValueError, match=r"unknown GPU 'H300' \(choose from h100-sxm \(H100\)"):
        gpu_preset_name("H300")


@pytest.mark.parametrize("tp", [2, 4])
def test_a_70b_preset_runs_tensor_parallel(capsys: pytest.CaptureFixture[str], tp: int) -> None:
    argv = ["simulate", "--model", "llama-3.1-70b", "--gpu", "h100", "--tp", str(tp),
            "--num-requests", "8", "--no-ceilings", "--json"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["hardware"]["tp"] == tp
    shares = doc["runs"][0]["step_time_shares"]
    assert 0 < shares["all_reduce"] < 0.5
    assert sum(shares.values()) == pytest.approx(1, abs=1e-5)


def test_a_70b_preset_needs_tensor_parallelism(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--model", "llama-3.1-70b", "--gpu", "h100", "--num-requests", "2"]
    assert main(argv) == 2
    assert "do not fit" in capsys.readouterr().err


def _e2e_rows() -> list[dict[str, str]]:
    path = VIDUR_STEPS.with_name("vidur_a100_llama3_8b_e2e.csv")
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines))


@pytest.mark.parametrize("row", _e2e_rows(), ids=lambda r: f"{r['rate']}-per-s")
def test_end_to_end_matches_vidur(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, row: dict[str, str]
) -> None:
    # the trace Vidur replayed, from the same generator (tools/vidur/poisson_trace.py)
    spec = importlib.util.spec_from_file_location(
        "poisson_trace", ROOT / "tools" / "vidur" / "poisson_trace.py"
    )
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    gen.main(float(row["rate"]), int(row["requests"]), int(row["seed"]), str(tmp_path / "t"))
    argv = ["simulate", "--trace", str(tmp_path / "t.jsonl"), "--step-ms", "0.1", "--model",
            "llama-3-8b", "--gpu", "a100", "--no-ceilings", "--json"]  # fmt: skip
    assert main(argv) == 0
    run = json.loads(capsys.readouterr().out)["runs"][0]
    ours = (
        run["latency"]["ttft_s"]["p50"] * 1e3,
        run["latency"]["tpot_s"]["p50"] * 1e3,
        run["throughput_tokens_per_s"],
    )
    vidur = (float(row["ttft_p50_ms"]), float(row["tpot_p50_ms"]), float(row["tokens_per_s"]))
    for a, b in zip(ours, vidur, strict=True):
        assert a == pytest.approx(b, rel=0.15)
