"""The step-time model: how long one scheduler step takes on a GPU, from a roofline.

A step computes ``n`` new tokens for each scheduled request whose first ``c`` tokens are
already in the KV cache. Per GPU (tensor parallelism ``tp`` splits weights and heads)::

    T      = sum of n                                      tokens in the step
    flops  = (2 * active_params * T
              + sum over attention layers l, requests r of
                4 * q_heads * head_size * n_r * ctx_l(c_r + (n_r + 1) / 2)) / tp
    bytes  = (weight_bytes
              + sum over layers l, requests r of kv_bytes_per_token_l * ctx_l(c_r + n_r)) / tp
    time   = overhead + max(flops / (peak_flops * efficiency),
                            bytes / (hbm_bandwidth * efficiency))

``ctx_l(x)`` is ``x`` for full attention and ``min(x, window)`` for a sliding window
(``x mod chunk`` for chunked local attention, roughly); a mamba layer reads its state once
per request. The attention term counts QK^T and AV (2 FLOPs per multiply-add each) over the
context each new token sees on average; the byte term reads the weights once per step and
every scheduled request's context from the KV cache once. Not modelled: tensor-parallel
communication, MoE routing imbalance, sampling, CPU scheduling beyond ``overhead``.

``docs/simulate-time.md`` has the formulas, the defaults and a comparison with a published
measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvblocks._core import InvalidArgumentError
from kvblocks.sim.presets import MODEL_PRESETS, KVLayout

__all__ = [
    "DEFAULT_EFFICIENCY",
    "DEFAULT_GPU",
    "DEFAULT_MEMORY_UTILIZATION",
    "DEFAULT_OVERHEAD_S",
    "GPU_ALIASES",
    "GPU_PRESETS",
    "GpuPreset",
    "StepCost",
    "StepTimeModel",
    "gpu_names_help",
    "gpu_preset_name",
    "kv_memory_after_weights",
]

DEFAULT_GPU = "h100-sxm"
DEFAULT_OVERHEAD_S = 0.0005
"""Per-step fixed cost (scheduler, kernel launches with CUDA graphs, sampling): 0.5 ms."""
DEFAULT_EFFICIENCY = 0.8
"""Fraction of peak FLOPs and bandwidth that kernels reach (docs/simulate-time.md fits it
to published single-request decode speeds: 74-77% of peak bandwidth)."""
DEFAULT_MEMORY_UTILIZATION = 0.9
"""vLLM's ``gpu_memory_utilization`` default."""

TB = 10**12
GB = 10**9


@dataclass(frozen=True)
class GpuPreset:
    """One GPU's published peaks (dense, no sparsity).

    Attributes:
        name: The preset's key (``--gpu``).
        description: The product.
        bf16_flops: Peak dense BF16 tensor FLOP/s.
        fp8_flops: Peak dense FP8 tensor FLOP/s (None: no FP8 tensor cores).
        hbm_bytes_per_s: Memory bandwidth, bytes/s.
        memory_bytes: Device memory, bytes (binary units, as GPU memory is quoted).
        host_link_bytes_per_s: The GPU's link to host memory, bytes/s in one direction
            (half the bidirectional figure datasheets quote): what a CPU offload tier's
            loads and stores move over (:mod:`kvblocks.sim.offload`).
    """

    name: str
    description: str
    bf16_flops: float
    fp8_flops: float | None
    hbm_bytes_per_s: float
    memory_bytes: int
    host_link_bytes_per_s: float


PCIE_GEN5_X16 = 64 * GB
"""PCIe Gen5 x16, one direction (the datasheets' "PCIe Gen5: 128 GB/s" is both)."""
PCIE_GEN4_X16 = 32 * GB
"""PCIe Gen4 x16, one direction (the datasheets' "PCIe Gen4: 64 GB/s" is both)."""
NVLINK_C2C = 450 * GB
"""NVLink-C2C between Grace and Hopper, one direction (the GH200 datasheet's 900 GB/s is
both)."""

GPU_PRESETS: dict[str, GpuPreset] = {
    g.name: g
    for g in (
        # NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column): BF16 1,979 TFLOPS and
        # FP8 3,958 TFLOPS *with sparsity* (dense is half), 3.35 TB/s HBM3, 80 GB.
        GpuPreset(
            "h100-sxm",
            "NVIDIA H100 SXM 80GB",
            989.5 * TB,
            1979 * TB,
            3.35 * TB,
            80 << 30,
            PCIE_GEN5_X16,
        ),
        # NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): same tensor cores as H100 SXM
        # (BF16 1,979 / FP8 3,958 TFLOPS sparse), 4.8 TB/s HBM3e, 141 GB.
        GpuPreset(
            "h200",
            "NVIDIA H200 SXM 141GB",
            989.5 * TB,
            1979 * TB,
            4.8 * TB,
            141 << 30,
            PCIE_GEN5_X16,
        ),
        # NVIDIA GH200 Grace Hopper Superchip datasheet (96 GB HBM3 version): the H100's
        # tensor cores (BF16 1,979 / FP8 3,958 TFLOPS sparse), 4 TB/s, and NVLink-C2C to
        # the Grace CPU's memory at 900 GB/s bidirectional.
        GpuPreset(
            "gh200",
            "NVIDIA GH200 Grace Hopper 96GB",
            989.5 * TB,
            1979 * TB,
            4.0 * TB,
            96 << 30,
            NVLINK_C2C,
        ),
        # NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM): BF16 312 TFLOPS dense
        # (624 sparse), no FP8, 2,039 GB/s HBM2e, 80 GB.
        GpuPreset(
            "a100-80gb", "NVIDIA A100 SXM 80GB", 312 * TB, None, 2.039 * TB, 80 << 30, PCIE_GEN4_X16
        ),
        # Same datasheet, A100 40GB: 1,555 GB/s HBM2, 40 GB.
        GpuPreset(
            "a100-40gb", "NVIDIA A100 40GB", 312 * TB, None, 1.555 * TB, 40 << 30, PCIE_GEN4_X16
        ),
        # NVIDIA DGX B200 datasheet: 8 GPUs, 72 PFLOPS FP8 training / 144 PFLOPS FP4
        # inference (sparse), 1,440 GB HBM3e, 64 TB/s: per GPU 4.5 PFLOPS FP8 dense,
        # 2.25 PFLOPS BF16 dense, 180 GB, 8 TB/s.
        GpuPreset(
            "b200", "NVIDIA B200 180GB", 2250 * TB, 4500 * TB, 8 * TB, 180 << 30, PCIE_GEN5_X16
        ),
        # NVIDIA L40S datasheet: BF16 362.05 TFLOPS and FP8 733 TFLOPS *with sparsity*
        # (dense is half), 864 GB/s GDDR6, 48 GB.
        GpuPreset(
            "l40s", "NVIDIA L40S 48GB", 181 * TB, 366.5 * TB, 864 * GB, 48 << 30, PCIE_GEN4_X16
        ),
    )
}


GPU_ALIASES: dict[str, str] = {"h100": "h100-sxm", "a100": "a100-80gb"}
"""Names users type for a preset: ``H100`` is the SXM part (the H100 of HGX servers and the
cloud), ``A100`` the 80 GB SXM part."""


def _gpu_key(name: str) -> str:
    """``name`` in lower case without spaces, ``-``, ``_`` or a leading ``nvidia``."""
    key = "".join(c for c in name.lower() if c not in " -_")
    return key.removeprefix("nvidia")


_GPU_NAMES = {_gpu_key(n): n for n in (*GPU_PRESETS, *GPU_ALIASES)}


def gpu_preset_name(name: str) -> str:
    """The :data:`GPU_PRESETS` key ``name`` means: a key or an alias of
    :data:`GPU_ALIASES`, in any case, spaces, ``-`` and ``_`` ignored, an ``NVIDIA`` in
    front allowed (``H100``, ``h100-sxm``, ``NVIDIA H100 SXM``, ``A100_40GB``).

    Raises:
        ValueError: No preset has that name.
    """
    found = _GPU_NAMES.get(_gpu_key(name))
    if found is None:
        raise InvalidArgumentError(
            f"unknown GPU {name!r} (choose from {gpu_names_help()}; case is ignored)"
        )
    return GPU_ALIASES.get(found, found)


def gpu_names_help() -> str:
    """The preset keys, each with its aliases: ``h100-sxm (H100), h200, ...``."""
    aliases: dict[str, list[str]] = {}
    for alias, key in GPU_ALIASES.items():
        aliases.setdefault(key, []).append(alias.upper())
    return ", ".join(
        f"{key} ({', '.join(aliases[key])})" if key in aliases else key for key in GPU_PRESETS
    )


def kv_memory_after_weights(
    gpu: GpuPreset, weight_bytes: int, tp: int = 1, utilization: float = DEFAULT_MEMORY_UTILIZATION
) -> int:
    """KV cache memory of one GPU: ``utilization * memory - weight_bytes / tp`` (vLLM's
    rule without the activation peak). Raises ValueError when the weights do not fit."""
    free = int(gpu.memory_bytes * utilization) - weight_bytes // tp
    if free <= 0:
        raise InvalidArgumentError(
            f"{weight_bytes / 2**30:.1f} GiB of weights over tp={tp} do not fit in "
            f"{utilization:.0%} of {gpu.description}'s memory; raise --tp"
        )
    return free


@dataclass
class StepCost:
    """The roofline terms of one step (per GPU)."""

    tokens: int
    flops: float
    bytes: float
    seconds: float
    flops_s: float = 0.0
    """``flops / (peak_flops * efficiency)``."""
    bytes_s: float = 0.0
    """``bytes / (hbm_bandwidth * efficiency)``."""

    @property
    def bound(self) -> str:
        """``"compute"`` or ``"memory"``: the larger roofline term."""
        return "compute" if self.flops_s >= self.bytes_s else "memory"


class StepTimeModel:
    """Step times of one model on one GPU (see the module docs).

    Args:
        layout: The KV cache layout (its groups give layers, KV bytes per token, windows).
        preset: The model preset (params, weight bytes, query heads).
        gpu: The GPU preset.
        tp: Tensor-parallel degree: weights, heads and KV reads are split ``tp`` ways.
        overhead_s: Fixed time per step.
        efficiency: Fraction of the peaks reached.
        fp8: Use the FP8 peak (FP8 weights and activations); else BF16.
    """

    def __init__(
        self,
        layout: KVLayout,
        preset: str,
        gpu: GpuPreset,
        tp: int = 1,
        overhead_s: float = DEFAULT_OVERHEAD_S,
        efficiency: float = DEFAULT_EFFICIENCY,
        fp8: bool = False,
    ) -> None:
        if tp < 1 or overhead_s < 0 or not 0 < efficiency <= 1:
            raise InvalidArgumentError(
                "tp >= 1, overhead >= 0 and 0 < efficiency <= 1 are required"
            )
        p = MODEL_PRESETS[preset]
        peak = gpu.fp8_flops if fp8 else gpu.bf16_flops
        if peak is None:
            raise InvalidArgumentError(f"{gpu.description} has no FP8 tensor cores")
        self.gpu, self.tp, self.overhead_s, self.efficiency = gpu, tp, overhead_s, efficiency
        self.flops_per_s = peak * efficiency
        self.bytes_per_s = gpu.hbm_bytes_per_s * efficiency
        self.linear_flops_per_token = 2.0 * p.flop_params / tp
        self.weight_bytes = p.weights_bytes / tp
        # (layers, attention FLOPs per token per context token, KV bytes per context token,
        #  window or 0, chunk or 0, state bytes per request (mamba))
        self._groups: list[tuple[int, float, float, int, int, float]] = []
        for g in layout.groups:
            page = g.page_size_bytes / tp
            if g.kind == "mamba":
                self._groups.append((g.num_layers, 0.0, 0.0, 0, 0, page))
                continue
            q_heads = p.num_q_heads * g.num_kv_heads // p.groups[0].num_kv_heads
            attn = 4.0 * q_heads * g.head_size / tp
            window = (g.sliding_window or 0) if g.kind == "sliding_window" else 0
            chunk = (g.attention_chunk_size or 0) if g.kind == "chunked_local" else 0
            self._groups.append((g.num_layers, attn, page / g.block_size, window, chunk, 0.0))

    def cost(self, batch: Sequence[tuple[int, int]]) -> StepCost:
        """The step that computes ``n`` tokens after ``c`` cached ones for each ``(c, n)``."""
        tokens = 0
        flops = 0.0
        nbytes = self.weight_bytes
        for layers, attn, kv_tok, window, chunk, state in self._groups:
            f = 0.0
            b = 0.0
            for c, n in batch:
                mid = c + (n + 1) / 2
                end = c + n
                if window:
                    mid = min(mid, window)
                    end = min(end, window + n)
                elif chunk:
                    mid = min(mid, chunk)
                    end = min(end, chunk + n)
                f += n * mid
                b += end
            flops += layers * attn * f
            nbytes += layers * (kv_tok * b + state * len(batch))
        for _, n in batch:
            tokens += n
        flops += self.linear_flops_per_token * tokens
        fs = flops / self.flops_per_s
        bs = nbytes / self.bytes_per_s
        return StepCost(tokens, flops, nbytes, self.overhead_s + max(fs, bs), fs, bs)

    def step_time(self, batch: Sequence[tuple[int, int]]) -> float:
        """Seconds of the step (:meth:`cost`'s ``seconds``), on the loop's fast path."""
        nbytes = self.weight_bytes
        flops = 0.0
        tokens = 0
        for _, n in batch:
            tokens += n
        for layers, attn, kv_tok, window, chunk, state in self._groups:
            f = 0.0
            b = 0
            if window or chunk:
                cap = window or chunk
                for c, n in batch:
                    f += n * min(c + (n + 1) / 2, cap)
                    b += min(c + n, cap + n)
            else:
                for c, n in batch:
                    f += n * (c + (n + 1) / 2)
                    b += c + n
            flops += layers * attn * f
            nbytes += layers * (kv_tok * b + state * len(batch))
        flops += self.linear_flops_per_token * tokens
        return self.overhead_s + max(flops / self.flops_per_s, nbytes / self.bytes_per_s)
