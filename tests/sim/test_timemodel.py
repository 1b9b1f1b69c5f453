"""The step-time model, checked by hand on tiny cases (docs/simulate-time.md)."""

from __future__ import annotations

import json
import math

import pytest
from kvblocks.sim.cli import main
from kvblocks.sim.presets import MODEL_PRESETS, model_layout
from kvblocks.sim.timemodel import (
    GPU_PRESETS,
    StepTimeModel,
    gpu_preset_name,
    kv_memory_after_weights,
)

H100 = GPU_PRESETS["h100-sxm"]
P = MODEL_PRESETS["llama-3-8b"].params
KV_PER_TOKEN_LAYER = 2 * 8 * 128 * 2  # K and V, 8 heads x 128, bf16
ATTN_PER_CTX = 4 * 32 * 128  # QK^T and AV over 32 query heads x 128


def _model(tp: int = 1) -> StepTimeModel:
    layout = model_layout("llama-3-8b", num_blocks=100)
    return StepTimeModel(layout, "llama-3-8b", H100, tp=tp, overhead_s=0.0, efficiency=1.0)


def test_a_decode_step_is_bound_by_bytes() -> None:
    m = _model()
    cost = m.cost([(1000, 1)])
    flops = 2 * P + 32 * ATTN_PER_CTX * 1 * (1000 + 1)
    nbytes = 2 * P + 32 * KV_PER_TOKEN_LAYER * 1001
    assert cost.flops == pytest.approx(flops)
    assert cost.bytes == pytest.approx(nbytes)
    assert cost.bound == "memory"
    assert cost.seconds == pytest.approx(nbytes / 3.35e12)
    # ~4.8 ms: 16 GB of weights at 3.35 TB/s
    assert 4.5e-3 < cost.seconds < 5.0e-3
    assert m.step_time([(1000, 1)]) == pytest.approx(cost.seconds)


def test_a_long_prefill_is_bound_by_flops() -> None:
    m = _model()
    n = 8192
    cost = m.cost([(0, n)])
    flops = 2 * P * n + 32 * ATTN_PER_CTX * n * (n + 1) / 2
    assert cost.flops == pytest.approx(flops)
    assert cost.bound == "compute"
    assert cost.seconds == pytest.approx(flops / 989.5e12)
    assert m.step_time([(0, n)]) == pytest.approx(cost.seconds)


def test_overhead_efficiency_and_tp() -> None:
    layout = model_layout("llama-3-8b", num_blocks=100)
    base = _model().cost([(500, 1)] * 8)
    slow = StepTimeModel(layout, "llama-3-8b", H100, overhead_s=0.002, efficiency=0.5)
    default = StepTimeModel(layout, "llama-3-8b", H100)
    assert default.step_time([(500, 1)] * 8) == pytest.approx(0.0005 + base.seconds / 0.8)
    assert slow.step_time([(500, 1)] * 8) == pytest.approx(0.002 + 2 * base.seconds)
    tp2 = _model(tp=2).cost([(500, 1)] * 8)
    assert tp2.bytes == pytest.approx(base.bytes / 2)
    assert tp2.flops == pytest.approx(base.flops / 2)


def test_a_sliding_window_caps_the_context() -> None:
    layout = model_layout("gpt-oss-20b", num_blocks=100)
    m = StepTimeModel(layout, "gpt-oss-20b", H100, overhead_s=0.0, efficiency=1.0)
    short, long = m.cost([(200, 1)]), m.cost([(10_000, 1)])
    # past the window (128 + the new token) only the 12 full-attention layers read more
    kv_tok = 2 * 8 * 64 * 2
    assert long.bytes - short.bytes == pytest.approx(12 * kv_tok * (10_000 - 200))


def test_memory_after_weights() -> None:
    weights = MODEL_PRESETS["llama-3-8b"].weights_bytes
    free = kv_memory_after_weights(H100, weights)
    assert free == int(0.9 * (80 << 30)) - weights
    assert kv_memory_after_weights(H100, weights, tp=2) == int(0.9 * (80 << 30)) - weights // 2
    with pytest.raises(ValueError, match="do not fit"):
        kv_memory_after_weights(GPU_PRESETS["l40s"], MODEL_PRESETS["gpt-oss-120b"].weights_bytes)
    with pytest.raises(ValueError, match="FP8"):
        StepTimeModel(
            model_layout("llama-3-8b", num_blocks=10), "llama-3-8b", GPU_PRESETS["a100-80gb"],
            fp8=True,
        )  # fmt: skip


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
