"""Fit the A100 calibration of kvblocks' step-time model to Vidur's A100 profile.

Development time only, in a Python with numpy and scipy (the Vidur venv):

    python tools/vidur/fit_a100.py ../shared/data/vidur-a100-llama3-8b

It prints the constants ``python/kvblocks/sim/calibration.py`` carries as ``A100``
(docs/simulate-time.md, "Calibration"). Inputs, from Vidur's profile of Llama-3-8B on one
A100-80GB: ``main/mlp_a100_llama3_8b.csv`` (GEMMs and elementwise ops per token count, TP 1),
``attn/*.csv`` (FlashInfer prefill and decode attention) and ``main/all_reduce_a100_dgx.csv``
(NCCL all-reduce in one DGX A100). Profile times are milliseconds per layer; every fit
minimises the squared log error.
"""

from __future__ import annotations

import csv
import glob
import sys
from collections.abc import Callable

import numpy as np
from scipy.optimize import least_squares

PEAK = 312e12  # A100 dense BF16
BW = 2.039e12  # A100 80GB HBM2e
NVLINK = 300e9  # NVLink 3, one direction
HID, INTER, NQ, NKV, D = 4096, 14336, 32, 8, 128
KV_TOK = 2 * NKV * D * 2  # K and V bytes per token and layer
GEMMS = {  # (N, K) of the four GEMMs of a layer
    "attn_pre_proj": ((NQ + 2 * NKV) * D, HID),
    "attn_post_proj": (HID, NQ * D),
    "mlp_up_proj": (2 * INTER, HID),
    "mlp_down_proj": (HID, INTER),
}
ELEMENTWISE = {  # bytes moved per token (bf16, read + write)
    "input_layernorm": 4 * HID,
    "post_attention_layernorm": 4 * HID,
    "attn_rope": 4 * (NQ + NKV) * D,
    "mlp_act": 6 * INTER,
    "add": 6 * HID,
}
Resid = Callable[[np.ndarray], np.ndarray]


def fit(name: str, resid: Resid, x0: list[float], lo: list[float], hi: list[float]) -> None:
    """Fits and prints the parameters with the median and largest |log error|."""
    res = least_squares(resid, x0, bounds=(lo, hi))
    err = np.abs(resid(res.x))
    params = ", ".join(f"{v:.4g}" for v in res.x)
    print(f"{name}: {params}  |log err| median {np.median(err):.3f}, max {err.max():.3f}")


def gemms(rows: list[dict[str, float]]) -> None:
    m = np.array([r["num_tokens"] for r in rows])

    def resid(p: np.ndarray) -> np.ndarray:
        t0, emax, m0, em = p
        out = []
        for op, (n, k) in GEMMS.items():
            y = np.array([r[op] for r in rows]) * 1e-3
            compute = 2.0 * m * n * k / (PEAK * emax * m / (m + m0))
            memory = 2.0 * (n * k + m * k + m * n) / (BW * em)
            out.append(np.log((t0 + np.maximum(compute, memory)) / y))
        return np.concatenate(out)

    fit("gemm launch, e_max, M_half, e_mem", resid, [5e-6, 0.75, 50, 0.8], [0, 0.1, 0, 0.1],
        [1e-4, 1, 5000, 1])  # fmt: skip


def elementwise(rows: list[dict[str, float]]) -> None:
    m = np.array([r["num_tokens"] for r in rows])
    for op, per_token in ELEMENTWISE.items():
        y = np.array([r[op] for r in rows]) * 1e-3

        def resid(p: np.ndarray, y: np.ndarray = y, per_token: int = per_token) -> np.ndarray:
            return np.log((p[0] + m * per_token / (BW * p[1])) / y)

        fit(f"{op} launch, e", resid, [3e-6, 0.5], [0, 0.01], [1e-4, 1])


def attention(rows: list[dict[str, float]]) -> None:
    pre = [r for r in rows if r["c"] > 0]
    q = np.array([r["c"] for r in pre])
    kv = np.array([r["kv"] for r in pre])
    y = np.array([r["pre"] for r in pre]) * 1e-3

    def prefill(p: np.ndarray) -> np.ndarray:
        t0, emax, q0, s0 = p
        flops = 4.0 * NQ * D * q * (kv + (q + 1) / 2)
        s = kv + q
        return np.log((t0 + flops / (PEAK * emax * q / (q + q0) * s / (s + s0))) / y)

    fit("prefill launch, e_max, q_half, ctx_half", prefill, [1e-5, 0.6, 1000, 100],
        [0, 0.05, 0, 0], [1e-4, 1, 1e5, 1e5])  # fmt: skip
    dec = [r for r in rows if r["c"] == 0]
    b = np.array([r["b"] for r in dec])
    ctx = np.array([r["kv"] for r in dec])
    yd = np.array([r["dec"] for r in dec]) * 1e-3

    def decode(p: np.ndarray) -> np.ndarray:
        t0, emax, b0, c0 = p
        return np.log((t0 + b * (ctx + c0) * KV_TOK / (BW * emax * b / (b + b0))) / yd)

    fit("decode launch, e_max, batch_half, request_tokens", decode, [5e-6, 0.85, 20, 50],
        [0, 0.05, 0, 0], [1e-4, 1, 1e4, 1e4])  # fmt: skip


def all_reduce(rows: list[dict[str, str]]) -> None:
    sel = [
        r for r in rows
        if r["num_workers"] == r["devices_per_node"] and r["num_workers"] in ("2", "4", "8")
        and int(r["size"]) >= 65536
    ]  # fmt: skip
    n = np.array([int(r["num_workers"]) for r in sel])
    size = np.array([int(r["size"]) for r in sel])
    y = np.array([float(r["time_stats.all_reduce.median"]) for r in sel]) * 1e-3

    def resid(p: np.ndarray) -> np.ndarray:
        return np.log((p[0] + 2 * (n - 1) / n * size / (NVLINK * p[1])) / y)

    fit("all-reduce launch, link efficiency", resid, [2e-5, 0.6], [0, 0.01], [1e-3, 1])


def main(root: str) -> None:
    mlp = []
    for r in csv.DictReader(open(f"{root}/main/mlp_a100_llama3_8b.csv")):
        if r["num_tensor_parallel_workers"] == "1" and int(r["num_tokens"]) <= 16384:
            row = {"num_tokens": float(r["num_tokens"])}
            row.update({op: float(r[f"time_stats.{op}.median"]) for op in (*GEMMS, *ELEMENTWISE)})
            mlp.append(row)
    attn = []
    for f in sorted(glob.glob(f"{root}/attn/*.csv")):
        attn += [{k: float(v) for k, v in r.items()} for r in csv.DictReader(open(f))]
    gemms(mlp)
    elementwise(mlp)
    attention(attn)
    all_reduce(list(csv.DictReader(open(f"{root}/main/all_reduce_a100_dgx.csv"))))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/vidur-a100-llama3-8b")
