"""Achieved bandwidth of kvblocks.device page operations against torch's own contiguous copy.

For each page size (bytes of one block of one layer) and block count, a KVPages with one
attention layer per `--layers` is built and every operation moves `blocks` random blocks. The
baseline ("peak") is torch copying the same number of bytes as one contiguous tensor on the
same path: device to device for copy/gather/scatter/zero, pinned device to host for swap_out
and host to device for swap_in (on CPU: a host memcpy). Bandwidth counts the bytes of the
pages moved once (not read + write), for the operation and the baseline alike.

Ops: copy (random disjoint src/dst: one kernel), copy_runs (one run of consecutive ids: slice
copies), gather/scatter/zero (random ids), swap_out/swap_in (random device ids, consecutive host
ids), swap_*_frag (host ids shuffled too). On CUDA, `op[torch]` rows repeat an op with torch
index ops instead of the Triton kernel and `op[kernel]` rows swap through the kernel on the
pinned host pool instead of the copy engines.

    python benches/python/device_bandwidth.py                  # cuda if available, else cpu
    python benches/python/device_bandwidth.py --device cpu --pages 4K,64K --blocks 1,100
    python benches/python/device_bandwidth.py --plot bandwidth.png
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "support"))

from device_configs import FullAttentionSpec, single_group
from kvblocks.device import KVPages

OPS = ["copy", "copy_runs", "gather", "scatter", "zero", "swap_out", "swap_in"]


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def spec_for_page(page: int) -> FullAttentionSpec:
    """A float16 attention spec of block size 16 whose page is `page` bytes."""
    per_token = page // (16 * 2 * 2)  # heads * head_size
    head = min(128, per_token)
    if per_token % head or page % 64:
        raise SystemExit(f"page size {page} is not a multiple of 64 bytes with head <= 128")
    return FullAttentionSpec(16, per_token // head, head, "float16")


def timed(fn: Callable[[], object], device: torch.device, repeat: int) -> float:
    """Median seconds of `fn` (after one warm-up call), the device synchronized around it."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    times = []
    for _ in range(repeat):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def peaks(nbytes: int, device: torch.device, repeat: int) -> tuple[float, float, float]:
    """Seconds for torch to copy `nbytes` contiguous bytes device->device, device->pinned host
    and pinned host->device (on a CPU device: all three are a host memcpy)."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    d2d = timed(lambda: b.copy_(a), device, repeat)
    if device.type == "cpu":
        return d2d, d2d, d2d
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    d2h = timed(lambda: host.copy_(a, non_blocking=True), device, repeat)
    h2d = timed(lambda: a.copy_(host, non_blocking=True), device, repeat)
    return d2d, d2h, h2d


def bench_case(
    page: int, blocks: int, layers: int, device: torch.device, repeat: int
) -> list[tuple[str, float, float]]:
    """(op, seconds, peak seconds) for each op at one size."""
    num_blocks = 2 * blocks + 1
    pages = KVPages(
        single_group(num_blocks, spec_for_page(page), layers), device, host_blocks=blocks
    )
    gen = torch.Generator().manual_seed(page * 7919 + blocks)
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    src, dst = perm[:blocks], perm[blocks : 2 * blocks]
    host_ids = list(range(blocks))
    host_frag = torch.randperm(blocks, generator=gen).tolist()
    blob = pages.gather(src)
    nbytes = blocks * pages.block_bytes

    peak_d2d, peak_d2h, peak_h2d = peaks(nbytes, device, repeat)
    out = torch.empty_like(blob)
    cases: dict[str, tuple[Callable[[], object], float]] = {
        "copy": (lambda: pages.copy_blocks(src, dst), peak_d2d),
        "copy_runs": (
            lambda: pages.copy_blocks(range(1, blocks + 1), range(blocks + 1, 2 * blocks + 1)),
            peak_d2d,
        ),
        "gather": (lambda: pages.gather(src, out=out), peak_d2d),
        "scatter": (lambda: pages.scatter(dst, blob), peak_d2d),
        "zero": (lambda: pages.zero_blocks(dst), peak_d2d),
        "swap_out": (lambda: pages.swap_out(src, host_ids).synchronize(), peak_d2h),
        "swap_in": (lambda: pages.swap_in(host_ids, dst).synchronize(), peak_h2d),
        "swap_out_frag": (lambda: pages.swap_out(src, host_frag).synchronize(), peak_d2h),
        "swap_in_frag": (lambda: pages.swap_in(host_frag, dst).synchronize(), peak_h2d),
    }
    results = [(op, timed(fn, device, repeat), peak) for op, (fn, peak) in cases.items()]
    if device.type == "cuda":
        # The alternatives to the default paths: torch index ops instead of the Triton
        # kernel, and swaps through the kernel on the pinned host pool instead of DMA.
        variants = [
            ("KVBLOCKS_DEVICE_KERNEL", "torch", ["copy", "gather", "scatter", "swap_out_frag"]),
            ("KVBLOCKS_DEVICE_SWAP", "kernel", [op for op in cases if op.startswith("swap")]),
        ]
        for key, value, ops in variants:
            os.environ[key] = value
            try:
                results += [
                    (f"{op}[{value}]", timed(cases[op][0], device, repeat), cases[op][1])
                    for op in ops
                ]
            finally:
                del os.environ[key]
    return results


def human(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--pages", default="4K,16K,64K,256K,2M", help="page sizes per layer")
    parser.add_argument("--blocks", default="1,10,100,1000,10000")
    parser.add_argument("--layers", type=int, default=1, help="layers (buffers) per block")
    parser.add_argument(
        "--max-bytes",
        default=None,
        help="skip sizes whose device pool exceeds this (default 1G cpu, 16G cuda)",
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--plot", default=None, metavar="PNG", help="also plot GB/s to this file")
    args = parser.parse_args()

    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    page_sizes = [parse_size(p) for p in args.pages.split(",")]
    block_counts = [int(n) for n in args.blocks.split(",")]
    limit = parse_size(args.max_bytes or ("1G" if device.type == "cpu" else "16G"))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"# kvblocks.device bandwidth on {name}, torch {torch.__version__}, "
        f"{args.layers} layer(s), median of {args.repeat}"
    )
    print("# GB/s = bytes of the moved pages / time; peak = torch contiguous copy of as many bytes")
    print()
    print("| op | page | blocks | MiB | op µs | op GB/s | peak GB/s | % of peak |")
    print("|---|---|---|---|---|---|---|---|")
    results: list[tuple[str, int, int, float]] = []
    for page in page_sizes:
        for blocks in block_counts:
            if (2 * blocks + 1) * page * args.layers > limit:
                continue
            nbytes = blocks * page * args.layers
            for op, secs, peak in bench_case(page, blocks, args.layers, device, args.repeat):
                gbs, peak_gbs = nbytes / secs / 1e9, nbytes / peak / 1e9
                results.append((op, page, blocks, gbs))
                print(
                    f"| {op} | {human(page)} | {blocks} | {nbytes / (1 << 20):.2f} | "
                    f"{secs * 1e6:.0f} | {gbs:.2f} | {peak_gbs:.2f} | "
                    f"{100 * gbs / peak_gbs:.0f}% |",
                    flush=True,
                )
    if args.plot:
        plot(results, args.plot, name)


def plot(results: list[tuple[str, int, int, float]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = [op for op in OPS if any(r[0] == op for r in results)]  # the default paths
    fig, axes = plt.subplots(1, len(ops), figsize=(4 * len(ops), 3.5), sharey=True)
    for ax, op in zip(axes, ops, strict=True):
        for blocks in sorted({r[2] for r in results}):
            pts = sorted((r[1], r[3]) for r in results if r[0] == op and r[2] == blocks)
            if pts:
                ax.plot([p for p, _ in pts], [g for _, g in pts], marker="o", label=f"{blocks}")
        ax.set_xscale("log", base=2)
        ax.set_title(op)
        ax.set_xlabel("page bytes")
    axes[0].set_ylabel("GB/s")
    axes[-1].legend(title="blocks")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    print(f"\nplot written to {path}")


if __name__ == "__main__":
    main()
