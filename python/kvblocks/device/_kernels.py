"""A Triton kernel that copies page segments addressed by block id, in one launch.

torch has no single op for `dst[d[i]] = src[s[i]]`: index_select + index_copy_ goes through a
temporary and moves every byte twice. This kernel reads each source segment once and writes it
once. It serves copy_blocks (when no block is both read and written), gather and scatter on
CUDA. Views are 4-D `[ids, buffers, rows, words]` with a contiguous last dimension.

KVBLOCKS_DEVICE_KERNEL selects the path: "auto" (default: Triton on CUDA when importable),
"torch" (never), "triton" (always; on CPU tensors this needs TRITON_INTERPRET=1, which is how
the tests check the kernel without a GPU). With KVBLOCKS_DEVICE_SWAP=kernel, swaps also run
through it, the host side being the pinned host pool (device-accessible under unified
addressing), with no staging copy.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any

import torch

from kvblocks._core import InvalidArgumentError

# Grid dimensions 1 and 2 are limited to 65535 programs.
_MAX_GRID_YZ = 65535


def mode() -> str:
    """The kernel path requested by KVBLOCKS_DEVICE_KERNEL."""
    value = os.environ.get("KVBLOCKS_DEVICE_KERNEL", "auto")
    if value not in ("auto", "torch", "triton"):
        raise InvalidArgumentError(
            f"KVBLOCKS_DEVICE_KERNEL must be auto, torch or triton, not {value!r}"
        )
    return value


def swap_mode() -> str:
    """How swaps move bytes, from KVBLOCKS_DEVICE_SWAP: "dma" (default: copy engines) or
    "kernel" (the kernel reads/writes pinned host memory directly; needs the kernel path)."""
    value = os.environ.get("KVBLOCKS_DEVICE_SWAP", "dma")
    if value not in ("dma", "kernel"):
        raise InvalidArgumentError(f"KVBLOCKS_DEVICE_SWAP must be dma or kernel, not {value!r}")
    return value


@functools.cache
def _kernel() -> Any:
    """The jitted kernel, or None when Triton cannot be imported."""
    try:
        import triton  # type: ignore[import-untyped, import-not-found, unused-ignore]
        import triton.language as tl  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError:
        return None

    @triton.jit  # type: ignore[untyped-decorator, unused-ignore]
    def copy_segments(  # type: ignore[no-untyped-def, unused-ignore]
        src,
        dst,
        src_ids,
        dst_ids,
        src_id_stride,
        src_buf_stride,
        src_row_stride,
        dst_id_stride,
        dst_buf_stride,
        dst_row_stride,
        rows,
        width,
        SRC_IDS: tl.constexpr,
        DST_IDS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        pair = tl.program_id(0).to(tl.int64)
        segment = tl.program_id(1)
        chunk = tl.program_id(2)
        if SRC_IDS:
            s = tl.load(src_ids + pair).to(tl.int64)
        else:
            s = pair
        if DST_IDS:
            d = tl.load(dst_ids + pair).to(tl.int64)
        else:
            d = pair
        buf = (segment // rows).to(tl.int64)
        row = (segment % rows).to(tl.int64)
        src_start = s * src_id_stride + buf * src_buf_stride + row * src_row_stride
        dst_start = d * dst_id_stride + buf * dst_buf_stride + row * dst_row_stride
        offsets = chunk * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < width
        values = tl.load(src + src_start + offsets, mask=mask)
        tl.store(dst + dst_start + offsets, values, mask=mask)

    return copy_segments


def usable(device: torch.device, segments: int) -> bool:
    """Whether copy() will run the kernel for views on `device` with this many segments."""
    chosen = mode()
    if chosen == "torch" or (chosen == "auto" and device.type != "cuda"):
        return False
    if segments > _MAX_GRID_YZ:
        return False
    if _kernel() is None:
        if chosen == "triton":
            raise RuntimeError("KVBLOCKS_DEVICE_KERNEL=triton but triton cannot be imported")
        return False
    return True


def copy(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_ids: torch.Tensor | None,
    dst_ids: torch.Tensor | None,
    count: int,
) -> None:
    """`dst[dst_ids[i]] = src[src_ids[i]]` for i < count (None: i itself), one launch.

    Both views are `[n, buffers, rows, words]` with equal trailing sizes and stride 1 last;
    no destination segment may be a source segment of the same call.
    """
    _, buffers, rows, width = src.shape
    if tuple(dst.shape[1:]) != (buffers, rows, width) or src.stride(3) != 1 or dst.stride(3) != 1:
        raise InvalidArgumentError(
            "copy: views must agree on [buffers, rows, words] with unit stride"
        )
    block = min(4096, 1 << max(width - 1, 1).bit_length())
    chunks = -(-width // block)
    if chunks > _MAX_GRID_YZ:
        raise InvalidArgumentError(f"copy: a segment of {width} words needs too many chunks")
    placeholder = src_ids if src_ids is not None else dst_ids
    cuda = next((t.device for t in (src, dst) if t.is_cuda), None)
    # Triton launches on the current device: make it the pages' device.
    with torch.cuda.device(cuda) if cuda is not None else contextlib.nullcontext():
        _kernel()[(count, buffers * rows, chunks)](
            src,
            dst,
            src_ids if src_ids is not None else placeholder,
            dst_ids if dst_ids is not None else placeholder,
            src.stride(0),
            src.stride(1),
            src.stride(2),
            dst.stride(0),
            dst.stride(1),
            dst.stride(2),
            rows,
            width,
            SRC_IDS=src_ids is not None,
            DST_IDS=dst_ids is not None,
            BLOCK=block,
            num_warps=8 if block >= 2048 else 4,
        )
