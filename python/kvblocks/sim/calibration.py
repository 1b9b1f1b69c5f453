"""Kernel calibrations of the step-time model: how close each kind of kernel gets to a GPU's
datasheet peaks, and the fixed costs around them.

:class:`~kvblocks.sim.timemodel.StepTimeModel` sums a step's kernels; each kernel's time is
its FLOPs or bytes over a peak (the GPU preset's) times an efficiency from here, plus a fixed
launch time. The A100 numbers are least-squares fits to Vidur's profile of Llama-3-8B on one
A100-80GB (``tools/vidur/fit_a100.py``); every other GPU's and where they come from are in
``docs/simulate-time.md`` ("Calibration").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["A100", "CALIBRATIONS", "HOPPER", "Calibration", "Elementwise", "calibration_for"]


@dataclass(frozen=True)
class Elementwise:
    """A memory-bound kernel: ``launch_s + bytes / (bandwidth * efficiency)``."""

    launch_s: float
    efficiency: float


@dataclass(frozen=True)
class Calibration:
    """One GPU's kernel efficiencies (fractions of the preset's peaks) and fixed costs.

    Attributes:
        source: Where the numbers come from, in a few words.
        gemm_launch_s: Fixed time of one GEMM.
        gemm_compute_efficiency: Fraction of the tensor peak a large GEMM reaches.
        gemm_half_m: Rows (tokens) at which a GEMM reaches half that fraction: the
            efficiency is ``gemm_compute_efficiency * M / (M + gemm_half_m)``.
        gemm_memory_efficiency: Fraction of the memory bandwidth a GEMM's weight read
            reaches (small M, where a GEMM is bound by reading its weights).
        prefill_launch_s: Fixed time of one request's prefill attention.
        prefill_efficiency: Fraction of the tensor peak a long prefill attention reaches.
        prefill_half_q: Chunk tokens at half of it (first factor ``q / (q + half_q)``).
        prefill_half_ctx: Context (cached + chunk) at half of it (second factor).
        decode_launch_s: Fixed time of one layer's decode attention (all decodes together).
        decode_efficiency: Fraction of the bandwidth a large decode batch's KV read reaches.
        decode_half_batch: Decodes (at 8 KV heads per GPU) at half of it.
        decode_request_tokens: Per-request fixed cost of decode attention, in tokens of KV
            read.
        norm, rope, activation, residual_add: The elementwise kernels (bytes per token:
            RMSNorm ``4 h``, rotary ``4 (q + kv heads) d``, SiLU-and-mul ``6 I``, residual
            add ``6 h``).
        kv_write: The KV cache write (``reshape_and_cache``): ``4 kv_heads d`` bytes per
            token and layer (bf16 K and V read and written).
        link_efficiency: Fraction of the GPU-to-GPU link (one direction) an all-reduce's
            ring reaches.
        all_reduce_launch_s: Fixed time of one all-reduce.
        cpu_s: Per-step time on the CPU the GPU waits for (scheduling, input preparation,
            launches not hidden by CUDA graphs).
    """

    source: str
    gemm_launch_s: float
    gemm_compute_efficiency: float
    gemm_half_m: float
    gemm_memory_efficiency: float
    prefill_launch_s: float
    prefill_efficiency: float
    prefill_half_q: float
    prefill_half_ctx: float
    decode_launch_s: float
    decode_efficiency: float
    decode_half_batch: float
    decode_request_tokens: float
    norm: Elementwise
    rope: Elementwise
    activation: Elementwise
    residual_add: Elementwise
    kv_write: Elementwise
    link_efficiency: float
    all_reduce_launch_s: float
    cpu_s: float

    def scaled(self, efficiency: float = 1.0, launch: float = 1.0) -> Calibration:
        """Every efficiency times ``efficiency`` (capped at 1) and every kernel's fixed time
        times ``launch``; the all-reduce's and the CPU's fixed times unchanged."""

        def e(x: float) -> float:
            return min(1.0, x * efficiency)

        def el(k: Elementwise) -> Elementwise:
            return Elementwise(k.launch_s * launch, e(k.efficiency))

        return replace(
            self,
            gemm_launch_s=self.gemm_launch_s * launch,
            gemm_compute_efficiency=e(self.gemm_compute_efficiency),
            gemm_memory_efficiency=e(self.gemm_memory_efficiency),
            prefill_launch_s=self.prefill_launch_s * launch,
            prefill_efficiency=e(self.prefill_efficiency),
            decode_launch_s=self.decode_launch_s * launch,
            decode_efficiency=e(self.decode_efficiency),
            norm=el(self.norm),
            rope=el(self.rope),
            activation=el(self.activation),
            residual_add=el(self.residual_add),
            kv_write=el(self.kv_write),
            link_efficiency=e(self.link_efficiency),
        )


A100 = Calibration(
    source="fitted to Vidur's A100-80GB profile of Llama-3-8B (tools/vidur/fit_a100.py)",
    gemm_launch_s=7.94e-6,
    gemm_compute_efficiency=0.7148,
    gemm_half_m=67.9,
    gemm_memory_efficiency=0.8360,
    prefill_launch_s=1.42e-5,
    prefill_efficiency=0.4987,
    prefill_half_q=49.1,
    prefill_half_ctx=630.8,
    decode_launch_s=5.02e-6,
    decode_efficiency=0.8403,
    decode_half_batch=6.12,
    decode_request_tokens=46.8,
    norm=Elementwise(2.5e-6, 0.342),
    rope=Elementwise(2.5e-6, 0.459),
    activation=Elementwise(7.9e-6, 0.523),
    residual_add=Elementwise(1.49e-6, 0.952),
    # the rotary kernel's fit: both are one pass over K (and V) of the new tokens; Vidur's
    # profiled kv_cache_save is left out of its own step time (docs/simulate-time.md)
    kv_write=Elementwise(2.5e-6, 0.459),
    # Vidur's all_reduce_a100_dgx.csv, 2-8 GPUs of one DGX A100, 64 KiB-64 MiB, against
    # NVLink 3's 300 GB/s per direction; plus Vidur's own NCCL CPU launch term (0.02 ms)
    link_efficiency=0.534,
    all_reduce_launch_s=4.24e-5 + 2e-5,
    cpu_s=0.0,
)
"""A100 (SXM 80GB and 40GB): Vidur's profile (median |error| of the fits: GEMMs 5 %,
decode attention 5 %, prefill attention 11 %, elementwise 2-9 %). ``cpu_s`` is 0: Vidur,
whose step times these reproduce, models none (vLLM's CPU work overlaps the GPU's with
async scheduling)."""

HOPPER_LAUNCH_SCALE = 0.478
"""Hopper's kernel fixed times as a fraction of the A100 profile's: fitted so that
Llama-3.1-8B decoding alone on an H100 SXM takes InferenceBench's measured 6.48 ms per
token (vLLM 0.21, concurrency 1, contexts 300-1,100; docs/simulate-time.md)."""

HOPPER_PREFILL_SCALE = 0.627 / 0.564
"""Hopper's prefill attention efficiency over the A100's: FlashAttention-3 on an H100 SXM
reaches 621 TFLOP/s (0.627 of peak) at 16,384 tokens, BF16, head size 128 (pytorch/
benchmark PR #2391's tritonbench table), where Vidur's A100 profile reaches 176 TFLOP/s
(0.564) at 16,128 tokens."""

HOPPER = replace(
    A100.scaled(launch=HOPPER_LAUNCH_SCALE),
    prefill_efficiency=A100.prefill_efficiency * HOPPER_PREFILL_SCALE,
    source="A100's fractions of peak on the Hopper peaks; kernel fixed times fitted to a "
    "published vLLM H100 decode speed; prefill attention scaled to FlashAttention-3's",
)
"""H100, H200, GH200: no Hopper kernel profile was available offline, so the A100 fractions
of peak apply to the Hopper peaks except prefill attention's (FlashAttention-3's published
H100 figure), and the fixed times are fitted to one published vLLM measurement;
docs/simulate-time.md says what that means for the results."""

BLACKWELL = replace(
    HOPPER,
    source="Hopper's calibration on the B200 datasheet peaks (nothing B200 fitted)",
)
"""B200: Hopper's calibration on its own peaks; no B200 kernel measurement was used."""

CALIBRATIONS: dict[str, Calibration] = {
    "a100-80gb": A100,
    "a100-40gb": A100,
    "h100-sxm": HOPPER,
    "h200": HOPPER,
    "gh200": HOPPER,
    "b200": BLACKWELL,
    "l40s": replace(A100, source="A100's calibration on the L40S datasheet peaks (not fitted)"),
}


def calibration_for(gpu: str) -> Calibration:
    """The calibration of GPU preset ``gpu`` (a :data:`~kvblocks.sim.timemodel.GPU_PRESETS`
    key)."""
    return CALIBRATIONS[gpu]
