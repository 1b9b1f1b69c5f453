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
from typing import Any, NamedTuple

import torch

from kvblocks._core import InvalidArgumentError
from kvblocks.device._staging import Staged

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


def usable(device: torch.device) -> bool:
    """Whether copy() runs the kernel for views on `device` (see `fits` for their shape)."""
    chosen = mode()
    if chosen == "torch" or (chosen == "auto" and device.type != "cuda"):
        return False
    if _kernel() is None:
        if chosen == "triton":
            raise RuntimeError("KVBLOCKS_DEVICE_KERNEL=triton but triton cannot be imported")
        return False
    return True


class Segments(NamedTuple):
    """What one launch moves per id: `buffers * rows` segments of `width` words of `word`,
    and the launch shape that follows (chunks of BLOCK words, warps). Fixed per KVPages."""

    buffers: int
    rows: int
    width: int
    word: torch.dtype
    block: int
    chunks: int
    warps: int


def segments(buffers: int, rows: int, width: int, word: torch.dtype) -> Segments:
    """The Segments of a `[ids, buffers, rows, width]` word view."""
    block = min(4096, 1 << max(width - 1, 1).bit_length())
    chunks = -(-width // block)
    return Segments(buffers, rows, width, word, block, chunks, 8 if block >= 2048 else 4)


def fits(seg: Segments) -> bool:
    """Whether the kernel's grid can hold one program per segment and chunk (else torch's
    index ops move them)."""
    return seg.buffers * seg.rows <= _MAX_GRID_YZ and seg.chunks <= _MAX_GRID_YZ


class Side(NamedTuple):
    """One side of a copy, fixed per KVPages: it starts `offset` bytes after its tensor's
    data pointer, with word strides `strides` for [id, buffer, row] (and 1 within a row),
    and spans `extent` ids (None: the tensor's first dimension)."""

    offset: int
    strides: tuple[int, int, int]
    extent: int | None = None


def view(tensor: torch.Tensor, side: Side, seg: Segments) -> torch.Tensor:
    """`side` of `tensor` (whose storage offset and size are whole words) as the word view
    `[ids, buffers, rows, width]`."""
    words = tensor.view(seg.word)
    return words.as_strided(
        (tensor.shape[0] if side.extent is None else side.extent, *seg[:3]),
        (*side.strides, 1),
        words.storage_offset() + side.offset // words.element_size(),
    )


# Compiled kernels by launch key (device, segments, sides, pointer alignments, id flags).
_BOUND: dict[tuple[Any, ...], Any] = {}


def _stream(device: int) -> int:
    """The raw handle of `device`'s current stream (Triton's own getter)."""
    stream: int = _stream_getter()(device)
    return stream


@functools.cache
def _stream_getter() -> Any:
    import triton  # type: ignore[import-untyped, import-not-found, unused-ignore]

    return triton.runtime.driver.active.get_current_stream


def _direct(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """Whether a launch between these tensors may skip Triton's generic path: both on CUDA
    (not the interpreter), no launch hooks (profilers) installed."""
    if not (src.is_cuda and dst.is_cuda) or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    knobs = _knobs()
    if knobs is None:
        return False
    runtime = knobs.runtime
    return runtime.launch_enter_hook is None and runtime.launch_exit_hook is None


@functools.cache
def _knobs() -> Any:
    """Triton's runtime settings (None for a Triton without `triton.knobs`: launches then
    take the generic path)."""
    try:
        from triton import knobs  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError:
        return None
    return knobs


def copy(
    seg: Segments,
    src: torch.Tensor,
    src_side: Side,
    dst: torch.Tensor,
    dst_side: Side,
    src_ids: Staged | None,
    dst_ids: Staged | None,
    count: int,
) -> None:
    """`dst[dst_ids[i]] = src[src_ids[i]]` for i < count (None: i itself), one launch, over
    the word views `side` of each tensor (see `view`); ids are staged on the kernel's device.
    No destination segment may be a source segment of the same call.

    On CUDA, the kernel compiled for this key is launched directly with raw addresses:
    Triton's generic path (argument specialization, cache key) runs once per key, on the
    first call, and whenever launch hooks are installed. The key holds everything Triton
    specializes on: the fixed geometry (strides, widths) and each pointer's 16-byte
    alignment."""
    placeholder = src_ids if src_ids is not None else dst_ids
    assert placeholder is not None
    grid = (count, seg.buffers * seg.rows, seg.chunks)
    has_src, has_dst = src_ids is not None, dst_ids is not None
    direct = _direct(src, dst)
    if direct:
        index = src.get_device()
        src_at = src.data_ptr() + src_side.offset
        dst_at = dst.data_ptr() + dst_side.offset
        sid_at = (src_ids if has_src else placeholder).address  # type: ignore[union-attr]
        did_at = (dst_ids if has_dst else placeholder).address  # type: ignore[union-attr]
        aligned = (src_at & 15, dst_at & 15, sid_at & 15, did_at & 15)
        key = (index, seg, src_side.strides, dst_side.strides, has_src, has_dst, aligned)
        compiled = _BOUND.get(key)
        if compiled is not None:
            args = (src_at, dst_at, sid_at, did_at, *src_side.strides, *dst_side.strides)
            flags = (seg.rows, seg.width, has_src, has_dst, seg.block)
            if _current(index):
                compiled[grid](*args, *flags, stream=_stream(index))
            else:
                with torch.cuda.device(index):
                    compiled[grid](*args, *flags, stream=_stream(index))
            return
    with _on(src.get_device() if src.is_cuda else dst.get_device()):
        compiled = _kernel()[grid](
            view(src, src_side, seg),
            view(dst, dst_side, seg),
            (src_ids if has_src else placeholder).tensor(),  # type: ignore[union-attr]
            (dst_ids if has_dst else placeholder).tensor(),  # type: ignore[union-attr]
            *src_side.strides,
            *dst_side.strides,
            seg.rows,
            seg.width,
            SRC_IDS=has_src,
            DST_IDS=has_dst,
            BLOCK=seg.block,
            num_warps=seg.warps,
        )
    if direct and callable(getattr(compiled, "__getitem__", None)):
        _BOUND[key] = compiled


def _on(index: int) -> contextlib.AbstractContextManager[object]:
    """Make CUDA device `index` current for the launch (Triton launches on the current
    device); nothing for a CPU tensor (index -1)."""
    if _current(index):
        return contextlib.nullcontext()
    on: contextlib.AbstractContextManager[object] = torch.cuda.device(index)
    return on


def _current(index: int) -> bool:
    """Whether launches already go to device `index` (always, for a CPU tensor's -1)."""
    return index < 0 or torch.cuda.current_device() == index
