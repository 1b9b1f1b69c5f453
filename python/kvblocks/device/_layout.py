"""From a KVCacheConfig to byte geometry: which bytes of which buffer hold block b.

Only the attribute contract of the config is used (duck typing) and spec kinds are told
apart by class name, so the Rust-backed `kvblocks` classes and vLLM's own dataclasses both
work.

Vocabulary:
* a *buffer* is one KVCacheTensor: `size` raw bytes shared by the layers in `shared_by`;
* a *plane* is a part of a buffer viewed as `[rows, num_blocks, width]` bytes, with block `b`
  at `[:, b, :]`. Block-major buffers have one plane of one row (`width` = page); vLLM's
  `[2, num_blocks, ...]` attention layout has one plane of two rows (K and V), or two planes
  when `head_size_v != head_size`;
* a *batch* is a set of buffers with the same planes, laid out at a uniform stride in one
  allocation so that a single strided view `[buffers, rows, num_blocks, width]` covers them
  all and one index kernel moves a block of every layer in the batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from kvblocks._core import InvalidArgumentError, InvalidTypeError

Layout = Literal["NHD", "HND"]

ATTENTION_SPECS = frozenset(
    {
        "FullAttentionSpec",
        "SlidingWindowSpec",
        "ChunkedLocalAttentionSpec",
        "CrossAttentionSpec",
        "SinkFullAttentionSpec",
    }
)
MLA_SPEC = "MLAAttentionSpec"
MAMBA_SPEC = "MambaSpec"
UNIFORM_SPECS = "UniformTypeKVCacheSpecs"

# Every buffer starts at a multiple of this many bytes in the shared allocation.
ALIGN = 512


def torch_dtype(value: object) -> torch.dtype:
    """A torch dtype from a torch.dtype or its canonical name ("bfloat16", "torch.float16")."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        found = getattr(torch, value.removeprefix("torch."), None)
        if isinstance(found, torch.dtype):
            return found
    raise InvalidTypeError(f"unknown dtype {value!r}: expected a torch.dtype or a torch dtype name")


def dtype_size(dtype: torch.dtype) -> int:
    """Bytes per element of `dtype`."""
    size: int = torch.empty((), dtype=dtype).element_size()
    return size


@dataclass(frozen=True)
class LayerGeom:
    """One layer's typed view of its buffer, in bytes.

    kind: "attention" (K and V), "mla" (one latent) or "mamba" (state tensors).
    For attention, `k_width`/`v_width` are the bytes of one block's K/V.
    """

    name: str
    kind: str
    page: int
    buffer: int
    block_size: int
    num_kv_heads: int
    head_size: int
    head_size_v: int
    dtype: torch.dtype
    state_shapes: tuple[tuple[int, ...], ...]
    state_dtypes: tuple[torch.dtype, ...]

    @property
    def k_width(self) -> int:
        return self.block_size * self.num_kv_heads * self.head_size * dtype_size(self.dtype)

    @property
    def v_width(self) -> int:
        return self.block_size * self.num_kv_heads * self.head_size_v * dtype_size(self.dtype)


@dataclass(frozen=True)
class Plane:
    """Bytes `[offset, offset + rows * num_blocks * width)` of a buffer as `[rows, nb, width]`."""

    offset: int
    rows: int
    width: int


@dataclass(frozen=True)
class BufferGeom:
    """A buffer: its size, block count, planes, and where it lies in the allocation."""

    size: int
    num_blocks: int
    split: bool  # True: vLLM's [2, num_blocks, ...] K/V split; False: block-major pages
    planes: tuple[Plane, ...]
    base: int  # byte offset in the shared allocation


@dataclass(frozen=True)
class Batch:
    """Buffers with equal planes at a uniform stride: one strided view per plane moves them."""

    buffers: tuple[int, ...]
    base: int
    stride: int
    num_blocks: int
    planes: tuple[Plane, ...]
    word: int  # element size used to move bytes (8, 4, 2 or 1)
    host_offset: int  # byte offset of this batch in a host block

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across all buffers of the batch."""
        return len(self.buffers) * sum(p.rows * p.width for p in self.planes)


@dataclass(frozen=True)
class Geometry:
    """The whole plan for one config."""

    num_blocks: int
    layers: Mapping[str, LayerGeom]
    buffers: tuple[BufferGeom, ...]
    batches: tuple[Batch, ...]
    total_bytes: int

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across every buffer (the size of a host block)."""
        return sum(b.block_bytes for b in self.batches)


def _layer_specs(config: Any) -> dict[str, Any]:
    specs: dict[str, Any] = {}
    for group in config.kv_cache_groups:
        spec = group.kv_cache_spec
        members = spec.kv_cache_specs if type(spec).__name__ == UNIFORM_SPECS else None
        for name in group.layer_names:
            if name in specs:
                raise InvalidArgumentError(f"layer {name!r} is in more than one KV cache group")
            if members is not None:
                if name not in members:
                    raise InvalidArgumentError(
                        f"layer {name!r} missing from UniformTypeKVCacheSpecs"
                    )
                specs[name] = members[name]
            else:
                specs[name] = spec
    return specs


def _layer_geom(name: str, spec: Any, buffer: int) -> LayerGeom:
    kind_name = type(spec).__name__
    if kind_name in ATTENTION_SPECS or kind_name == MLA_SPEC:
        dtype = torch_dtype(spec.dtype)
        mla = kind_name == MLA_SPEC
        head_size_v = 0 if mla else int(spec.head_size_v)
        geom = LayerGeom(
            name=name,
            kind="mla" if mla else "attention",
            page=int(spec.page_size_bytes),
            buffer=buffer,
            block_size=int(spec.block_size),
            num_kv_heads=int(spec.num_kv_heads),
            head_size=int(spec.head_size),
            head_size_v=head_size_v,
            dtype=dtype,
            state_shapes=(),
            state_dtypes=(),
        )
        if mla and geom.num_kv_heads != 1:
            raise InvalidArgumentError(
                f"MLA layer {name!r} must have one latent head, not {geom.num_kv_heads}"
            )
        if geom.page % dtype_size(dtype):
            raise InvalidArgumentError(
                f"layer {name!r}: page_size_bytes {geom.page} is not a multiple of "
                f"the {dtype} element size"
            )
        if geom.k_width + geom.v_width > geom.page:
            raise InvalidArgumentError(
                f"layer {name!r}: page_size_bytes {geom.page} is smaller than "
                f"its K/V data ({geom.k_width + geom.v_width} bytes)"
            )
        return geom
    if kind_name == MAMBA_SPEC:
        shapes = tuple(tuple(int(d) for d in s) for s in spec.shapes)
        dtypes = tuple(torch_dtype(d) for d in spec.dtypes)
        if len(shapes) != len(dtypes):
            raise InvalidArgumentError(
                f"mamba layer {name!r}: {len(shapes)} shapes but {len(dtypes)} dtypes"
            )
        page = int(spec.page_size_bytes)
        used = 0
        for shape, dtype in zip(shapes, dtypes, strict=True):
            if page % dtype_size(dtype) or used % dtype_size(dtype):
                raise InvalidArgumentError(
                    f"mamba layer {name!r}: a {dtype} state is not aligned to its "
                    f"element size in a page of {page} bytes"
                )
            used += math.prod(shape) * dtype_size(dtype)
        if used > page:
            raise InvalidArgumentError(
                f"mamba layer {name!r}: page_size_bytes {page} is smaller than "
                f"its states ({used} bytes)"
            )
        return LayerGeom(
            name,
            "mamba",
            page,
            buffer,
            int(spec.block_size),
            0,
            0,
            0,
            torch.uint8,
            shapes,
            dtypes,
        )
    raise InvalidTypeError(f"layer {name!r}: unsupported KV cache spec kind {kind_name!r}")


def _buffer_planes(
    layers: Sequence[LayerGeom], num_blocks: int, block_major: bool
) -> tuple[bool, tuple[Plane, ...]]:
    page = layers[0].page
    widths = {(g.k_width, g.v_width) for g in layers}
    split = (
        not block_major
        and all(g.kind == "attention" for g in layers)
        and len(widths) == 1
        and sum(next(iter(widths))) == page
    )
    if not split:
        return False, (Plane(0, 1, page),)
    k_width, v_width = next(iter(widths))
    if k_width == v_width:
        return True, (Plane(0, 2, k_width),)
    return True, (Plane(0, 1, k_width), Plane(num_blocks * k_width, 1, v_width))


def _word(*values: int) -> int:
    for word in (8, 4, 2):
        if all(v % word == 0 for v in values):
            return word
    return 1


def _round_up(value: int, align: int) -> int:
    return -(-value // align) * align


def plan(config: Any, block_major: bool = False) -> Geometry:
    """Validate `config` and compute the byte geometry of every buffer and layer.

    Raises ValueError/TypeError for configs that cannot be laid out; nothing is allocated.
    """
    num_blocks = int(config.num_blocks)
    if num_blocks < 1:
        raise InvalidArgumentError(f"num_blocks must be >= 1, got {num_blocks}")
    specs = _layer_specs(config)
    layers: dict[str, LayerGeom] = {}
    raw: list[tuple[int, int, bool, tuple[Plane, ...]]] = []
    for index, tensor in enumerate(config.kv_cache_tensors):
        size = int(tensor.size)
        names = tuple(tensor.shared_by)
        if size <= 0 or not names:
            raise InvalidArgumentError(
                f"KV cache tensor {index}: needs a positive size and at least one "
                f"layer (size={size}, shared_by={list(names)})"
            )
        geoms = []
        for name in names:
            if name in layers:
                raise InvalidArgumentError(f"layer {name!r} is in more than one KV cache tensor")
            if name not in specs:
                raise InvalidArgumentError(
                    f"layer {name!r} of KV cache tensor {index} is in no group"
                )
            geoms.append(_layer_geom(name, specs[name], index))
        pages = {g.page for g in geoms}
        if len(pages) != 1:
            raise InvalidArgumentError(
                f"KV cache tensor {index} is shared by layers of different page "
                f"sizes {sorted(pages)}: a block id would not name one byte range"
            )
        page = pages.pop()
        if size % page:
            raise InvalidArgumentError(
                f"KV cache tensor {index}: size {size} is not a multiple of the page size {page}"
            )
        buf_blocks = size // page
        if buf_blocks < num_blocks:
            raise InvalidArgumentError(
                f"KV cache tensor {index} holds {buf_blocks} blocks, fewer than "
                f"num_blocks={num_blocks}"
            )
        split, planes = _buffer_planes(geoms, buf_blocks, block_major)
        for g in geoms:
            layers[g.name] = g
        raw.append((size, buf_blocks, split, planes))
    missing = sorted(set(specs) - set(layers))
    if missing:
        raise InvalidArgumentError(f"layers {missing} are in a group but in no KV cache tensor")

    # Buffers with equal geometry are placed back to back at one stride (a batch).
    signatures: dict[tuple[int, int, tuple[Plane, ...]], list[int]] = {}
    for index, (size, buf_blocks, _split, planes) in enumerate(raw):
        signatures.setdefault((size, buf_blocks, planes), []).append(index)
    bases: dict[int, int] = {}
    placed: list[tuple[tuple[int, ...], int, int, int, tuple[Plane, ...]]] = []
    offset = 0
    for (size, buf_blocks, planes), members in signatures.items():
        stride = _round_up(size, ALIGN)
        for i, index in enumerate(members):
            bases[index] = offset + i * stride
        placed.append((tuple(members), offset, stride, buf_blocks, planes))
        offset += stride * len(members)
    host_block = sum(len(m) * sum(p.rows * p.width for p in ps) for m, _, _, _, ps in placed)
    batches: list[Batch] = []
    host_offset = 0
    for buffer_ids, base, stride, buf_blocks, planes in placed:
        word = _word(
            stride, host_offset, host_block, *(v for p in planes for v in (p.offset, p.width))
        )
        batch = Batch(buffer_ids, base, stride, buf_blocks, planes, word, host_offset)
        batches.append(batch)
        host_offset += batch.block_bytes
    buffers = tuple(
        BufferGeom(size, nb, split, planes, bases[i])
        for i, (size, nb, split, planes) in enumerate(raw)
    )
    return Geometry(num_blocks, layers, buffers, tuple(batches), offset)
