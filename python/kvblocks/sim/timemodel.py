"""The step-time model: one scheduler step on a GPU as the sum of its kernels.

A step computes ``n`` new tokens for each scheduled request whose first ``c`` tokens are
already in the KV cache; ``T`` is the step's tokens and ``R`` its requests. Per GPU (tensor
parallelism ``tp`` splits weights, heads and KV ``tp`` ways), per layer:

* GEMMs: QKV, O, gate/up and down (``M = T`` rows), each
  ``launch + max(2 M N K / (peak * e(M)), bytes / (bandwidth * e_mem))`` with
  ``e(M) = e_max * M / (M + M_half)``: small token counts are bound by reading the weights
  and reach a lower fraction of the tensor peak;
* attention: a prefill chunk per request (causal FLOPs over its context, at an efficiency
  growing with the chunk and the context), the decodes of the step together (KV bytes read,
  at an efficiency growing with the batch); the KV cache write of the new tokens;
* elementwise kernels (two RMSNorms, rotary, SiLU-and-mul, residual add) by bytes moved;
* with ``tp > 1``, two all-reduces of ``T`` hidden vectors on the GPU's peer link;

then once per step the logits GEMM and the sampler for the ``R`` requests, and a CPU term.
Efficiencies and fixed times are per GPU (:mod:`kvblocks.sim.calibration`), fitted to
Vidur's A100 kernel profile. ``ctx`` is capped at the window for sliding-window layers (the
chunk for chunked local attention); a mamba layer reads and writes its state once per request.

``docs/simulate-time.md`` has the terms, the calibration, and the check against Vidur.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kvblocks._core import InvalidArgumentError
from kvblocks.sim.calibration import Calibration, Elementwise, calibration_for
from kvblocks.sim.presets import MODEL_PRESETS, KVLayout

__all__ = [
    "DEFAULT_GPU",
    "DEFAULT_MEMORY_UTILIZATION",
    "GPU_ALIASES",
    "GPU_PRESETS",
    "PEER_LINK_BYTES_PER_S",
    "TERMS",
    "GpuPreset",
    "StepCost",
    "StepTimeModel",
    "gpu_names_help",
    "gpu_preset_name",
    "kv_memory_after_weights",
]

DEFAULT_GPU = "h100-sxm"
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


PEER_LINK_BYTES_PER_S: dict[str, float] = {
    "a100-80gb": 300 * GB,
    "a100-40gb": 300 * GB,
    "h100-sxm": 450 * GB,
    "h200": 450 * GB,
    "gh200": 450 * GB,
    "b200": 900 * GB,
    "l40s": PCIE_GEN4_X16,
}
"""Each GPU's link to its tensor-parallel peers, one direction (half the datasheets'
bidirectional figure): NVLink 3 (A100, 600 GB/s), NVLink 4 (H100/H200 SXM and GH200,
900 GB/s), NVLink 5 (B200, 1.8 TB/s); the L40S has no NVLink (PCIe Gen4)."""

TERMS = (
    "gemm",
    "attention_prefill",
    "attention_decode",
    "kv_write",
    "elementwise",
    "logits_sampler",
    "all_reduce",
    "cpu",
)
"""The parts of a step (:meth:`StepTimeModel.cost`), in the order of :class:`StepCost`."""


@dataclass
class StepCost:
    """One step's time (per GPU), by part: the step is their sum."""

    tokens: int
    seconds: float
    parts: dict[str, float]
    """Seconds per :data:`TERMS` entry."""


class _Gemm(NamedTuple):
    """One GEMM kind of a layer: ``n * k`` weights (per GPU), ``per_step`` per step. With
    ``expert_share`` (a mixture of experts: the share of the weights one token routes to),
    ``M`` tokens read ``1 - (1 - share) ** M`` of ``weight_bytes`` (independent routing)."""

    n: float
    k: float
    weight_bytes: float
    per_step: int
    expert_share: float = 0.0


class _Attention(NamedTuple):
    """One attention group (per GPU): layers, query heads, head size, KV bytes per token,
    KV heads, window or 0, chunk or 0."""

    layers: int
    q_heads: float
    head_size: int
    kv_bytes_per_token: float
    kv_heads: float
    window: int
    chunk: int


class StepTimeModel:
    """Step times of one model on one GPU: the sum of its kernels (see the module docs).

    Args:
        layout: The KV cache layout (its groups give layers, heads, KV bytes, windows).
        preset: The model preset (hidden size, heads, MLP size, vocabulary, weights).
        gpu: The GPU preset.
        tp: Tensor-parallel degree: weights, heads and KV are split ``tp`` ways, and every
            layer all-reduces its attention and MLP outputs.
        cpu_s: Per-step CPU time; None: the calibration's.
        efficiency: Factor on every calibrated efficiency (1: as calibrated).
        fp8: Use the FP8 tensor peak for GEMMs and attention; else BF16.
        calibration: The kernel calibration; None: the GPU's (:mod:`kvblocks.sim.calibration`).
    """

    def __init__(
        self,
        layout: KVLayout,
        preset: str,
        gpu: GpuPreset,
        tp: int = 1,
        cpu_s: float | None = None,
        efficiency: float = 1.0,
        fp8: bool = False,
        calibration: Calibration | None = None,
    ) -> None:
        if tp < 1 or (cpu_s is not None and cpu_s < 0) or not efficiency > 0:
            raise InvalidArgumentError("tp >= 1, cpu time >= 0 and efficiency > 0 are required")
        p = MODEL_PRESETS[preset]
        peak = gpu.fp8_flops if fp8 else gpu.bf16_flops
        if peak is None:
            raise InvalidArgumentError(f"{gpu.description} has no FP8 tensor cores")
        cal = calibration if calibration is not None else calibration_for(gpu.name)
        if efficiency != 1.0:
            cal = cal.scaled(efficiency=efficiency)
        self.gpu, self.tp, self.cal = gpu, tp, cal
        self.cpu_s = cal.cpu_s if cpu_s is None else cpu_s
        self.peak = peak
        self.bw = gpu.hbm_bytes_per_s
        self.link = PEER_LINK_BYTES_PER_S[gpu.name]
        self.hidden = p.hidden_size
        # attention, embeddings and a dense MLP in the preset's bytes per parameter (bf16: 2);
        # without intermediate_size the rest of the weight bytes are the MLP's (MXFP4 experts)
        bytes_per_param = p.weights_bytes / p.params if p.intermediate_size else 2.0
        self.num_layers = sum(g.num_layers for g in layout.groups if g.kind in _LAYER_KINDS)
        h, t = p.hidden_size, tp
        ref = p.groups[0]
        # per layer (one group's heads stand for the model's: presets share head shapes)
        kv_heads, head = ref.num_kv_heads, ref.head_size
        qkv = (p.num_q_heads + 2 * kv_heads) * head
        o_k = p.num_q_heads * head
        gemms = [_Gemm(qkv / t, h, qkv * h * bytes_per_param / t, self.num_layers)]
        gemms.append(_Gemm(h, o_k / t, o_k * h * bytes_per_param / t, self.num_layers))
        attn_params = (qkv + o_k) * h
        embed = 2 * p.vocab_size * h
        if p.intermediate_size is not None:
            i = p.intermediate_size
            gemms.append(_Gemm(2 * i / t, h, 2 * i * h * bytes_per_param / t, self.num_layers))
            gemms.append(_Gemm(h, i / t, i * h * bytes_per_param / t, self.num_layers))
            self.mlp_per_token = 6 * i / t
        else:  # the rest of the parameters as one GEMM per layer
            rest_flop = max(0.0, p.flop_params - embed - self.num_layers * attn_params)
            dense = (embed + self.num_layers * attn_params) * bytes_per_param
            rest_bytes = max(0.0, p.weights_bytes - dense)
            per_layer = rest_flop / self.num_layers / t
            # an MoE's tokens each use the active share of the expert parameters
            total = max(1.0, p.params - embed - self.num_layers * attn_params)
            share = rest_flop / total if p.active_params is not None else 0.0
            per_gemm = rest_bytes / self.num_layers / t
            gemms.append(_Gemm(per_layer / h, h, per_gemm, self.num_layers, share))
            self.mlp_per_token = 2 * per_layer / h  # 6 I of a gated MLP of 3 h I parameters
        self._gemms = gemms
        self._logits = _Gemm(p.vocab_size / t, h, p.vocab_size * h * bytes_per_param / t, 1)
        self.vocab = p.vocab_size / t
        self.rope_per_token = 4 * (p.num_q_heads + kv_heads) * head / t
        self._attention: list[_Attention] = []
        self._state_bytes = 0.0  # mamba states read and written per request and step
        for g in layout.groups:
            if g.kind == "mamba":
                self._state_bytes += 2 * g.num_layers * g.page_size_bytes / t
                continue
            if g.kind not in _ATTENTION:
                continue
            q_heads = p.num_q_heads * g.num_kv_heads / ref.num_kv_heads
            window = (g.sliding_window or 0) if g.kind == "sliding_window" else 0
            chunk = (g.attention_chunk_size or 0) if g.kind == "chunked_local" else 0
            per_tok = g.page_size_bytes / g.block_size / t
            self._attention.append(
                _Attention(
                    g.num_layers, q_heads / t, g.head_size, per_tok, g.num_kv_heads / t,
                    window, chunk,
                )
            )  # fmt: skip
        self._acc = [0.0] * len(TERMS)  # seconds per part over the steps step_time timed
        # _parts' terms by token count and by request count (the model is fixed once built)
        self._by_tokens: dict[int, tuple[float, float, float, float]] = {}
        self._by_reqs: dict[int, float] = {}

    # ---------------------------------------------------------------- kernels
    def _gemm(self, m: int, g: _Gemm) -> float:
        cal = self.cal
        eff = cal.gemm_compute_efficiency * m / (m + cal.gemm_half_m)
        compute = 2.0 * m * g.n * g.k / (self.peak * eff)
        weights = g.weight_bytes
        if g.expert_share:
            weights *= 1.0 - (1.0 - g.expert_share) ** m
        memory = (weights + 2.0 * m * (g.k + g.n)) / (self.bw * cal.gemm_memory_efficiency)
        return cal.gemm_launch_s + (compute if compute > memory else memory)

    def _elementwise(self, k: Elementwise, nbytes: float) -> float:
        return k.launch_s + nbytes / (self.bw * k.efficiency)

    def _all_reduce(self, nbytes: float) -> float:
        t = self.tp
        ring = 2.0 * (t - 1) / t * nbytes / (self.link * self.cal.link_efficiency)
        return self.cal.all_reduce_launch_s + ring

    def _token_terms(self, tokens: int) -> tuple[float, float, float, float]:
        """The terms that depend only on the step's tokens: GEMMs, elementwise kernels
        (without the mamba states), KV cache writes and all-reduces."""
        cal = self.cal
        layers = self.num_layers
        gemm = 0.0
        for g in self._gemms:
            gemm += g.per_step * self._gemm(tokens, g)
        h = self.hidden
        ew = layers * (
            2 * self._elementwise(cal.norm, 4.0 * h * tokens)
            + self._elementwise(cal.rope, self.rope_per_token * tokens)
            + self._elementwise(cal.activation, self.mlp_per_token * tokens)
            + self._elementwise(cal.residual_add, 6.0 * h * tokens)
        )
        kv_write = 0.0
        for a in self._attention:
            kv_write += a.layers * self._elementwise(
                cal.kv_write, 2.0 * a.kv_bytes_per_token * tokens
            )
        ar = 2 * layers * self._all_reduce(2.0 * h * tokens) if self.tp > 1 else 0.0
        return gemm, ew, kv_write, ar

    def _request_terms(self, reqs: int) -> float:
        """The logits GEMM and the sampler of ``reqs`` requests."""
        return self._gemm(reqs, self._logits) + self._elementwise(
            self.cal.activation, 8.0 * reqs * self.vocab
        )

    def _parts(self, batch: Sequence[tuple[int, int]]) -> tuple[int, list[float]]:
        """Tokens, and seconds per :data:`TERMS` entry.

        The terms of the token count alone and of the request count alone are computed once
        per count (the same floats every time), the attention per step."""
        cal = self.cal
        tokens = 0
        for _, n in batch:
            tokens += n
        reqs = len(batch)
        by_tokens = self._by_tokens.get(tokens)
        if by_tokens is None:
            if len(self._by_tokens) >= _MEMO_SIZE:
                self._by_tokens.clear()
            by_tokens = self._by_tokens[tokens] = self._token_terms(tokens)
        gemm, ew, kv_write, ar = by_tokens
        head = self._by_reqs.get(reqs)
        if head is None:
            if len(self._by_reqs) >= _MEMO_SIZE:
                self._by_reqs.clear()
            head = self._by_reqs[reqs] = self._request_terms(reqs)
        if self._state_bytes:
            ew += self._state_bytes * reqs / (self.bw * cal.norm.efficiency)
        prefill = decode = 0.0
        peak, bw = self.peak, self.bw
        pl, pe, pq, ps = (
            cal.prefill_launch_s, cal.prefill_efficiency, cal.prefill_half_q,
            cal.prefill_half_ctx,
        )  # fmt: skip
        for a in self._attention:
            cap = a.window or a.chunk
            b = 0
            ctx = 0
            pre = 0.0
            flop_unit = 4.0 * a.q_heads * a.head_size
            for c, n in batch:
                if n == 1:
                    b += 1
                    ctx += c + 1 if not cap or c < cap else cap + 1
                    continue
                mid = c + (n + 1) / 2
                end = c + n
                if cap:
                    mid = min(mid, cap)
                    end = min(end, cap + n)
                eff = pe * n / (n + pq) * end / (end + ps)
                pre += pl + flop_unit * n * mid / (peak * eff)
            if b:
                x = b * a.kv_heads / 8.0
                eff = cal.decode_efficiency * x / (x + cal.decode_half_batch)
                dec = (ctx + b * cal.decode_request_tokens) * a.kv_bytes_per_token / (bw * eff)
                decode += a.layers * (cal.decode_launch_s + dec)
            prefill += a.layers * pre
        return tokens, [gemm, prefill, decode, kv_write, ew, head, ar, self.cpu_s]

    # ---------------------------------------------------------------- public
    def cost(self, batch: Sequence[tuple[int, int]]) -> StepCost:
        """The step that computes ``n`` tokens after ``c`` cached ones for each ``(c, n)``,
        by part."""
        tokens, parts = self._parts(batch)
        return StepCost(tokens, sum(parts), dict(zip(TERMS, parts, strict=True)))

    def step_time(self, batch: Sequence[tuple[int, int]]) -> float:
        """Seconds of the step (:meth:`cost`'s ``seconds``); adds its parts to
        :attr:`totals`."""
        _, parts = self._parts(batch)
        acc = self._acc
        for i, v in enumerate(parts):
            acc[i] += v
        return sum(parts)

    def shares(self) -> dict[str, float]:
        """Each part's fraction of the time of all steps :meth:`step_time` timed."""
        total = sum(self._acc)
        return {k: (v / total if total else 0.0) for k, v in zip(TERMS, self._acc, strict=True)}

    @property
    def all_reduce_share(self) -> float:
        """The all-reduces' fraction of the timed steps (0 without tensor parallelism)."""
        return self.shares()["all_reduce"]


_MEMO_SIZE = 1 << 16
"""The most token (or request) counts whose terms a model keeps; more start the memo over."""

_ATTENTION = ("full", "sliding_window", "chunked_local", "mla", "sliding_window_mla")
_LAYER_KINDS = (*_ATTENTION, "mamba", "circular_buffer")
