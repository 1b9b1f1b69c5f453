"""Where a small kvblocks.device call spends its time: the fixed per-call cost.

docs/device-bandwidth.md found that moving one small block costs 30-90 µs whatever its size.
This bench times each operation on 4 KiB pages for 1 and 100 blocks, two ways: with a device
synchronize around every call (what device_bandwidth.py measures) and pipelined (N calls, one
synchronize: the host-side cost per call once launches overlap). Beside them, the floor:
a synchronize alone and torch copying 4 KiB. With `--profile` it adds cProfile's top entries
for one call of `copy_blocks` and of `gather` (32 layers, one block).

    python benches/python/device_call_overhead.py               # cuda if available, else cpu
    python benches/python/device_call_overhead.py --profile --calls 300
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "support"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from device_bandwidth import spec_for_page
from device_configs import single_group
from kvblocks.device import KVPages

PAGE = 4096


def per_call_us(fn: Callable[[], object], device: torch.device, calls: int, each: bool) -> float:
    """Median µs of one call synchronized alone (`each`), else the mean of `calls` pipelined."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    if each:
        times = []
        for _ in range(calls):
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def ops(pages: KVPages, blocks: int, device: torch.device) -> dict[str, Callable[[], object]]:
    """The operations timed, on disjoint source and destination ids."""
    src = list(range(1, blocks + 1))
    dst = list(range(2 * blocks, blocks, -1))
    src_on_device = torch.tensor(src, dtype=torch.int64, device=device)
    out = pages.gather(src)
    return {
        "copy_blocks(list)": lambda: pages.copy_blocks(src, dst),
        "gather(list)": lambda: pages.gather(src, out=out),
        "gather(device tensor)": lambda: pages.gather(src_on_device, out=out),
        "zero_blocks(list)": lambda: pages.zero_blocks(dst),
    }


def profile(fn: Callable[[], object], device: torch.device, calls: int) -> str:
    """cProfile's 18 entries with the most own time over `calls` calls."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
    return text.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=400, help="calls per measurement")
    parser.add_argument("--profile", action="store_true", help="add cProfile's top entries")
    args = parser.parse_args()
    device = torch.device(args.device)
    a = torch.empty(PAGE, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    floor = [
        ("synchronize alone", lambda: None),
        ("torch copy_ of 4 KiB", lambda: b.copy_(a)),
    ]
    print("| case | µs per call, synchronized each | µs per call, pipelined |")
    print("|---|---:|---:|")
    for name, fn in floor:
        each = per_call_us(fn, device, args.calls, True)
        piped = per_call_us(fn, device, args.calls, False)
        print(f"| floor: {name} | {each:.1f} | {piped:.1f} |")
    profiled: list[tuple[str, str]] = []
    for layers in (1, 32):
        for blocks in (1, 100):
            config = single_group(2 * blocks + 1, spec_for_page(PAGE), layers)
            pages = KVPages(config, device, host_blocks=blocks)
            for name, fn in ops(pages, blocks, device).items():
                each = per_call_us(fn, device, args.calls, True)
                piped = per_call_us(fn, device, args.calls, False)
                print(f"| {layers} layers, {blocks} blocks: {name} | {each:.1f} | {piped:.1f} |")
                if args.profile and layers == 32 and blocks == 1 and "list" in name:
                    profiled.append((name, profile(fn, device, args.calls)))
    for name, text in profiled:
        print(f"\ncProfile of {name}, 32 layers, 1 block, {args.calls} calls, by own time:")
        print(text)


if __name__ == "__main__":
    main()
