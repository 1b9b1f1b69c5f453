"""Where a small kvblocks.device call spends its time: the fixed per-call cost.

docs/device-bandwidth.md found that moving one small block costs 30-90 µs whatever its size.
This bench times each operation on 4 KiB pages for 1 and 100 blocks, two ways: with a device
synchronize around every call (what device_bandwidth.py measures) and pipelined (N calls, one
synchronize: the host-side cost per call once launches overlap). Beside them, the floor:
a synchronize alone and torch copying 4 KiB. With `--profile` it adds cProfile's top entries
for one call of `copy_blocks` and of `gather` (32 layers, one block).

`--host` needs no GPU: it measures the host-side work of a call before the kernel (ids,
checks, views, launch preparation) on CPU tensors, for this tree and for the module as it
was at `--base` (a git revision, loaded side by side from `git show`), in alternated rounds
in one process. In both, the Triton path is taken (KVBLOCKS_DEVICE_KERNEL=triton) with the
kernel launch replaced by a no-op at the same place: the launch of the jitted kernel in the
base (so Triton's own generic launch path, which the base pays on CUDA, is not counted), the
launch of the compiled kernel here. On CPU no ids are uploaded, in either. Ops: copy_blocks
(random disjoint ids), gather and scatter (random ids), ids as Python lists, and gather with
the ids as an int32 memoryview (the form of `KVCacheManager.block_table`). Times are the
thread's CPU time (`time.thread_time`), so that other work on a shared machine does not
count; torch runs no kernel here, so this is the whole of the call's work.

    python benches/python/device_call_overhead.py               # cuda if available, else cpu
    python benches/python/device_call_overhead.py --profile --calls 300
    python benches/python/device_call_overhead.py --host --base cac6599 --rounds 15
"""

from __future__ import annotations

import argparse
import array
import atexit
import cProfile
import importlib
import io
import os
import pstats
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "support"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import kvblocks.device
from device_bandwidth import spec_for_page
from device_configs import single_group
from kvblocks.device import KVPages

PAGE = 4096
ROOT = Path(__file__).resolve().parents[2]


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


def cpu_us(fn: Callable[[], object], calls: int) -> float:
    """µs of this thread's CPU time per call over `calls` calls (after one warm-up call):
    the work itself, without the time the thread spends descheduled on a shared machine."""
    fn()
    start = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - start) / calls * 1e6


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


class _NoLaunch:
    """Stands for a kernel: `kernel[grid](*args, **kwargs)` does nothing and returns a
    compiled kernel (itself), as Triton's jitted and compiled kernels do when launched."""

    def __getitem__(self, grid: object) -> Callable[..., object]:
        return lambda *args, **kwargs: self


def base_module(rev: str) -> ModuleType:
    """kvblocks.device as it was at `rev`, imported as `kvblocks_device_base`."""
    root = Path(tempfile.mkdtemp(prefix="kvblocks-device-base-"))
    atexit.register(shutil.rmtree, root, True)
    folder = root / "kvblocks_device_base"
    folder.mkdir()
    listing = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", rev, "python/kvblocks/device/"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for path in listing:
        text = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:{path}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        (folder / Path(path).name).write_text(text.replace("kvblocks.device", folder.name))
    sys.path.insert(0, str(folder.parent))
    return importlib.import_module(folder.name)


@contextmanager
def no_launch(module: ModuleType, tree: bool) -> Iterator[None]:
    """The Triton path of `module` with every kernel launch a no-op (see the docstring)."""
    kernels: Any = importlib.import_module(module.__name__ + "._kernels")
    saved = {name: getattr(kernels, name, None) for name in ("_kernel", "_direct", "_stream")}
    kernels._kernel = lambda: _NoLaunch()
    if tree:  # launch through the bound compiled kernel, as on CUDA
        kernels._direct = lambda src, dst: True
        kernels._stream = lambda device: 0
    os.environ["KVBLOCKS_DEVICE_KERNEL"] = "triton"
    try:
        yield
    finally:
        del os.environ["KVBLOCKS_DEVICE_KERNEL"]
        for name, value in saved.items():
            if value is not None:
                setattr(kernels, name, value)


def host_ops(module: ModuleType, layers: int, blocks: int) -> dict[str, Callable[[], object]]:
    """The calls timed by --host, on one KVPages of `module` (4 KiB pages, CPU)."""
    pages = module.KVPages(
        single_group(2 * blocks + 1, spec_for_page(PAGE), layers), "cpu", host_blocks=blocks
    )
    rng = random.Random(blocks * 31 + layers)
    perm = rng.sample(range(1, 2 * blocks + 1), 2 * blocks)
    src, dst = perm[:blocks], perm[blocks:]
    out = torch.empty((blocks, pages.block_bytes), dtype=torch.uint8)
    buffer = memoryview(array.array("i", src))  # as KVCacheManager.block_table's rows
    return {
        "copy_blocks": lambda: pages.copy_blocks(src, dst),
        "gather": lambda: pages.gather(src, out=out),
        "gather(int32 buffer)": lambda: pages.gather(buffer, out=out),
        "scatter": lambda: pages.scatter(dst, out),
    }


def host_main(args: argparse.Namespace) -> None:
    """--host: this tree against --base, alternated rounds, medians (see the docstring)."""
    impls = {"base": base_module(args.base), "tree": kvblocks.device}
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", args.base],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(
        f"# host-side CPU µs per call before the kernel (launch a no-op), CPU, torch "
        f"{torch.__version__}; base = {rev}; median of {args.rounds} alternated rounds of "
        f"{args.calls} calls"
    )
    print()
    print("| layers x blocks | op | base µs | this tree µs | tree / base |")
    print("|---|---|---:|---:|---:|")
    for layers, blocks in ((1, 1), (32, 1), (1, 100), (32, 100)):
        ops = {}
        for name, module in impls.items():
            with no_launch(module, name == "tree"):
                ops[name] = host_ops(module, layers, blocks)
        for op in ops["tree"]:
            times: dict[str, list[float]] = {name: [] for name in impls}
            ratios = []
            for r in range(args.rounds):
                order = list(impls) if r % 2 == 0 else list(reversed(impls))
                this_round = {}
                for name in order:
                    with no_launch(impls[name], name == "tree"):
                        this_round[name] = cpu_us(ops[name][op], args.calls)
                for name, value in this_round.items():
                    times[name].append(value)
                ratios.append(this_round["tree"] / this_round["base"])
            base, tree = (statistics.median(times[n]) for n in ("base", "tree"))
            print(
                f"| {layers} x {blocks} | {op} | {base:.1f} | {tree:.1f} | "
                f"{statistics.median(ratios):.2f} |",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=400, help="calls per measurement")
    parser.add_argument("--profile", action="store_true", help="add cProfile's top entries")
    parser.add_argument("--host", action="store_true", help="host-side cost, CPU (see above)")
    parser.add_argument("--base", default="HEAD", help="--host: the revision to compare with")
    parser.add_argument("--rounds", type=int, default=11, help="--host: alternated rounds")
    args = parser.parse_args()
    if args.host:
        host_main(args)
        return
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
