"""KVPages: the KV cache memory of one worker, and page operations by block id."""

from __future__ import annotations

import array
import collections
import contextlib
import math
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Union

import torch

from kvblocks._core import (
    BlockIndexError,
    InvalidArgumentError,
    InvalidTypeError,
    UnknownLayerError,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

from kvblocks.device import _kernels
from kvblocks.device._layout import (
    Batch,
    Geometry,
    LayerGeom,
    Layout,
    Plane,
    dtype_size,
    plan,
)
from kvblocks.device._staging import Rule, Run, Span, Staged, Staging, id_tensor

Ids = Union[Sequence[int], torch.Tensor, "npt.NDArray[np.integer[Any]]"]
"""Block ids: a sequence of ints, a 1-D integer tensor (host preferred) or a numpy array."""

# copy_blocks moves runs of consecutive (src, dst) ids with plain slice copies instead of an
# index gather + scatter when there are at most this many runs per plane...
SLICE_COPY_MAX_RUNS = 4
# ...or when the average run is at least this many bytes (per plane).
SLICE_COPY_MIN_RUN_BYTES = 4 << 20
# Host transfers use one DMA per run of consecutive host ids when the average run is at least
# this many bytes (or there are few runs); otherwise they go through a pinned staging buffer
# and a host-side index copy.
DMA_MIN_RUN_BYTES = 256 << 10
DMA_MAX_RUNS = 8
# Temporaries of index copies without the kernel are cut to this size (cache-resident).
COPY_CHUNK_BYTES = 2 << 20


@dataclass(frozen=True, eq=False)
class _Move:
    """One plane of one batch, with everything a call needs to move it, built once: the
    device view `[num_blocks, buffers, rows, words]`, its segments, and the kernel's sides
    for the pages, for `[n, block_bytes]` rows (gather/scatter/host pool) and for a
    `[n, buffers, rows, words]` scratch tensor."""

    batch: Batch
    plane: Plane
    prefix: int  # bytes of the batch's earlier planes within one buffer's block
    device: torch.Tensor
    seg: _kernels.Segments
    pages: _kernels.Side
    rows: _kernels.Side
    scratch: _kernels.Side
    fits: bool  # the kernel can move it (else torch's index ops do)


class HostIds(NamedTuple):
    """Validated block ids: a 1-D int64 CPU tensor and the same ids as Python ints (checks on
    the host run on the list: set/min/max are C loops, cheaper than torch ops)."""

    tensor: torch.Tensor
    values: list[int]


def _host_ids(ids: Ids, what: str) -> HostIds:
    """Ids as a HostIds; TypeError/ValueError for anything that is not 1-D integers."""
    if isinstance(ids, (list, tuple, range)):
        try:
            buffer = array.array("q", ids)  # ints only (C loop); anything else: torch's checks
        except OverflowError:
            raise BlockIndexError(f"{what}: block id out of the int64 range") from None
        except TypeError:
            pass
        else:
            if not buffer:
                return HostIds(torch.empty(0, dtype=torch.int64), [])
            return HostIds(torch.frombuffer(buffer, dtype=torch.int64), buffer.tolist())
    tensor = id_tensor(ids, what).to("cpu", torch.int64)
    return HostIds(tensor, tensor.tolist())


def _check_range(values: list[int], limit: int, what: str) -> None:
    if values and (min(values) < 0 or max(values) >= limit):
        bad = min(values) if min(values) < 0 else max(values)
        raise BlockIndexError(f"{what}: block id {bad} out of range [0, {limit})")


def _check_unique(values: list[int], what: str) -> None:
    if len(set(values)) != len(values):
        dup = next(v for v, count in collections.Counter(values).items() if count > 1)
        raise InvalidArgumentError(f"{what}: duplicate destination block id {dup}")


def _copy_indexed(
    src: torch.Tensor, src_ids: torch.Tensor, dst: torch.Tensor, dst_ids: torch.Tensor
) -> None:
    """`dst[dst_ids[i]] = src[src_ids[i]]` with torch index ops, through a temporary of at
    most COPY_CHUNK_BYTES that stays in cache. No destination may be a source."""
    per_id = src[0].numel() * src.element_size()
    chunk = max(1, COPY_CHUNK_BYTES // per_id)
    scratch = torch.empty(
        (min(chunk, len(src_ids)), *src.shape[1:]), dtype=src.dtype, device=src.device
    )
    for start in range(0, len(src_ids), chunk):
        part = scratch[: len(src_ids[start : start + chunk])]
        torch.index_select(src, 0, src_ids[start : start + chunk], out=part)
        dst.index_copy_(0, dst_ids[start : start + chunk], part)


def _available_bytes(device: torch.device) -> int | None:
    """Free memory on `device` (None when unknown)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as meminfo:
                for line in meminfo:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return None
    return None


def _allocate(nbytes: int, device: torch.device, pin: bool, what: str) -> torch.Tensor:
    available = _available_bytes(device)
    if available is not None and nbytes > available:
        raise InvalidArgumentError(
            f"{what} needs {nbytes} bytes but {device} has {available} available"
        )
    try:
        return torch.zeros(nbytes, dtype=torch.uint8, device=device, pin_memory=pin)
    except (RuntimeError, torch.OutOfMemoryError) as err:
        raise InvalidArgumentError(
            f"{what}: cannot allocate {nbytes} bytes on {device}: {err}"
        ) from None


def _event() -> torch.cuda.Event:
    return torch.cuda.Event()  # type: ignore[no-untyped-call, unused-ignore]


class Transfer:
    """A host<->device page transfer in flight.

    `event` is recorded on the side stream after the last device-side step (for swap_out:
    after the device pages were read, so they may be reused; for swap_in: after the pages were
    written). It is None when the work ran synchronously (CPU pools). Call `wait()` before a
    stream reads swapped-in pages, and `synchronize()` before the host reads swapped-out data.
    KVPages itself orders its later swaps after earlier ones.
    """

    def __init__(
        self,
        event: torch.cuda.Event | None = None,
        device: torch.device | None = None,
        keep: tuple[torch.Tensor, ...] = (),
        finish: Callable[[], object] | None = None,
    ) -> None:
        self.event = event
        self._device = device
        self._keep = keep
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        if finish is not None:
            self._thread = threading.Thread(target=self._finish, args=(finish,), daemon=True)
            self._thread.start()

    def _finish(self, finish: Callable[[], object]) -> None:
        try:
            if self.event is not None:
                self.event.synchronize()
            finish()
        except BaseException as err:  # re-raised by synchronize()
            self._error = err

    def wait(self, stream: torch.cuda.Stream | None = None) -> None:
        """Make `stream` (default: the current one) wait on the device side; no host block."""
        if self.event is not None:
            (stream or torch.cuda.current_stream(self._device)).wait_event(self.event)

    def synchronize(self) -> None:
        """Block the host until the transfer, including any host-side step, is complete."""
        if self._thread is not None:
            self._thread.join()
        elif self.event is not None:
            self.event.synchronize()
        self._keep = ()
        if self._error is not None:
            raise self._error

    @property
    def has_host_step(self) -> bool:
        """True when part of the transfer runs on the host after the device part."""
        return self._thread is not None

    def done(self) -> bool:
        """True once the whole transfer is complete (never blocks)."""
        if self._thread is not None:
            return not self._thread.is_alive()
        return self.event is None or bool(self.event.query())  # type: ignore[no-untyped-call, unused-ignore]


class KVPages:
    """KV cache pages for every layer of a KVCacheConfig, moved by block id.

    One allocation holds every KVCacheTensor (each a raw byte buffer shared by the layers it
    names, as vLLM); per-layer views are typed. With `host_blocks`, a host pool of that many
    blocks (pinned when the device is CUDA) backs swap_out/swap_in; a host block holds one
    block of every buffer, contiguously (`block_bytes` bytes), which is also the row format of
    `gather`/`scatter`.

    `layout`: "NHD" (vLLM FlashAttention: physical `[2, num_blocks, block_size, heads, head]`)
    or "HND" (physical `[2, num_blocks, heads, block_size, head]`); attention views are always
    indexed `[.., block, slot, head, dim]`. `block_major=True` stores each block's K and V
    together (vLLM's hybrid attention+mamba layout); buffers shared with mamba or MLA layers,
    or with attention layers of other K/V widths, are block-major anyway.

    Destination ids must be unique and in range; block 0 (the null block) may not be written
    unless `protect_null_block=False`. Every check runs before any page is touched. Ids are
    checked on the host by the core while they are written into this KVPages' staging ring
    (`_staging`), then uploaded with one copy: pass Python lists (the manager's own), numpy
    arrays, int32 buffers or CPU tensors (a CUDA tensor of ids costs a device sync).

    On CUDA, copy_blocks/gather/scatter run one Triton kernel per group of same-shaped
    buffers (see `_kernels`; the first call of each variant compiles it and binds it, later
    calls launch the compiled kernel directly), copy_blocks with overlapping source and
    destination sets goes through a temporary, and swaps run on a side stream through the
    copy engines, fragmented host ids sorted into runs first. Not thread-safe: one owner
    thread per KVPages.
    """

    def __init__(
        self,
        config: Any,
        device: torch.device | str | None = None,
        *,
        layout: Layout = "NHD",
        block_major: bool = False,
        host_blocks: int | None = None,
        pin_memory: bool | None = None,
        protect_null_block: bool = True,
    ) -> None:
        if layout not in ("NHD", "HND"):
            raise InvalidArgumentError(f"layout must be 'NHD' or 'HND', got {layout!r}")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if host_blocks is not None and host_blocks < 1:
            raise InvalidArgumentError(f"host_blocks must be >= 1, got {host_blocks}")
        self.layout: Layout = layout
        self.geometry: Geometry = plan(config, block_major)
        self.num_blocks = self.geometry.num_blocks
        self.block_bytes = self.geometry.block_bytes
        self.host_blocks = host_blocks or 0
        self._null = 1 if protect_null_block else 0
        self._protect = bool(protect_null_block)
        pin = self.device.type == "cuda" if pin_memory is None else pin_memory
        host_bytes = self.host_blocks * self.block_bytes
        cpu = torch.device("cpu")
        if host_bytes and self.device.type == "cpu":
            available = _available_bytes(cpu)
            if available is not None and self.geometry.total_bytes + host_bytes > available:
                raise InvalidArgumentError(
                    f"the device pool and host pool need "
                    f"{self.geometry.total_bytes + host_bytes} bytes but the host "
                    f"has {available} available"
                )
        self._storage = _allocate(self.geometry.total_bytes, self.device, False, "the KV cache")
        self.host_pool: torch.Tensor | None = None
        if host_bytes:
            self.host_pool = _allocate(host_bytes, cpu, pin, "the host pool").view(
                self.host_blocks, self.block_bytes
            )
        self._moves = tuple(self._make_moves())
        # Bytes of one id in the largest plane (copy_blocks' slice-copy threshold).
        self._widest = max(m.plane.rows * m.plane.width * len(m.batch.buffers) for m in self._moves)
        self._staging = Staging(self.device)
        self._row_word = _WORDS[math.gcd(8, self.block_bytes)]
        self._swap_outs: list[Transfer] = []
        self._side: torch.cuda.Stream | None = (
            torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call, unused-ignore]
            if self.device.type == "cuda"
            else None
        )

    # ------------------------------------------------------------------ views

    def _make_moves(self) -> list[_Move]:
        moves = []
        for batch in self.geometry.batches:
            prefix = 0
            per_buffer = sum(p.rows * p.width for p in batch.planes)
            for plane in batch.planes:
                w, width, buffers = batch.word, plane.width // batch.word, len(batch.buffers)
                seg = _kernels.segments(buffers, plane.rows, width, _WORDS[w])
                pages = _kernels.Side(
                    batch.base + plane.offset,
                    (width, batch.stride // w, batch.num_blocks * width),
                    batch.num_blocks,
                )
                rows = _kernels.Side(
                    batch.host_offset + prefix,
                    (self.block_bytes // w, per_buffer // w, width),
                )
                scratch = _kernels.Side(
                    0, (buffers * plane.rows * width, plane.rows * width, width)
                )
                view = _kernels.view(self._storage, pages, seg)
                fits = _kernels.fits(seg)
                moves.append(_Move(batch, plane, prefix, view, seg, pages, rows, scratch, fits))
                prefix += plane.rows * plane.width
        return moves

    def _rows_view(self, rows: torch.Tensor, move: _Move) -> torch.Tensor:
        """`move`'s part of a contiguous `[n, block_bytes]` byte tensor, shaped like the device
        view (`[n, buffers, rows, words]`)."""
        return _kernels.view(rows, move.rows, move.seg)

    def _words(self, rows: torch.Tensor) -> torch.Tensor:
        """A contiguous uint8 `[n, block_bytes]` tensor as wide words, for fast index ops."""
        return rows.view(self._row_word)

    def layer_names(self) -> list[str]:
        """Every layer with pages, in config order."""
        return list(self.geometry.layers)

    def buffers(self) -> list[torch.Tensor]:
        """One raw uint8 tensor per KVCacheTensor, in config order."""
        return [self._storage[b.base : b.base + b.size] for b in self.geometry.buffers]

    def _layer(self, name: str, *kinds: str) -> LayerGeom:
        try:
            geom = self.geometry.layers[name]
        except KeyError:
            raise UnknownLayerError(f"no layer {name!r} in this KV cache") from None
        if geom.kind not in kinds:
            raise InvalidTypeError(
                f"layer {name!r} is a {geom.kind} layer, expected {' or '.join(kinds)}"
            )
        return geom

    def _attention_view(self, geom: LayerGeom, value: bool, stacked: bool) -> torch.Tensor:
        buf = self.geometry.buffers[geom.buffer]
        size = dtype_size(geom.dtype)
        heads, bs = geom.num_kv_heads, geom.block_size
        dim = geom.head_size_v if value else geom.head_size
        if buf.split:
            block_stride = (geom.v_width if value else geom.k_width) // size
            v_offset = buf.num_blocks * geom.k_width
        else:
            block_stride = geom.page // size
            v_offset = geom.k_width
        inner = (heads * dim, dim, 1) if self.layout == "NHD" else (dim, bs * dim, 1)
        typed = self._storage.view(geom.dtype)
        offset = (buf.base + (v_offset if value else 0)) // size
        if stacked:
            return typed.as_strided(
                (2, buf.num_blocks, bs, heads, dim),
                (v_offset // size, block_stride, *inner),
                offset,
            )
        return typed.as_strided((buf.num_blocks, bs, heads, dim), (block_stride, *inner), offset)

    def kv_cache(self, name: str) -> torch.Tensor:
        """The layer's cache as vLLM's backends see it.

        Attention: `[2, num_blocks, block_size, num_kv_heads, head_size]` (K then V; needs
        `head_size_v == head_size`, else use key_cache/value_cache). MLA:
        `[num_blocks, block_size, head_size]`. `num_blocks` is the buffer's block count.
        """
        geom = self._layer(name, "attention", "mla")
        buf = self.geometry.buffers[geom.buffer]
        if geom.kind == "mla":
            size = dtype_size(geom.dtype)
            return self._storage.view(geom.dtype).as_strided(
                (buf.num_blocks, geom.block_size, geom.head_size),
                (geom.page // size, geom.head_size, 1),
                buf.base // size,
            )
        if geom.head_size_v != geom.head_size:
            raise InvalidArgumentError(
                f"layer {name!r} has head_size {geom.head_size} != head_size_v "
                f"{geom.head_size_v}: use key_cache() and value_cache()"
            )
        return self._attention_view(geom, value=False, stacked=True)

    def key_cache(self, name: str) -> torch.Tensor:
        """An attention layer's K: `[num_blocks, block_size, num_kv_heads, head_size]`."""
        return self._attention_view(self._layer(name, "attention"), value=False, stacked=False)

    def value_cache(self, name: str) -> torch.Tensor:
        """An attention layer's V: `[num_blocks, block_size, num_kv_heads, head_size_v]`."""
        return self._attention_view(self._layer(name, "attention"), value=True, stacked=False)

    def mamba_states(self, name: str) -> tuple[torch.Tensor, ...]:
        """A mamba layer's states, one `[num_blocks, *shape]` tensor per spec shape, packed
        in order within each page (as vLLM)."""
        geom = self._layer(name, "mamba")
        buf = self.geometry.buffers[geom.buffer]
        states = []
        offset = 0
        for shape, dtype in zip(geom.state_shapes, geom.state_dtypes, strict=True):
            size = dtype_size(dtype)
            inner = torch.empty(shape, device="meta").stride()
            states.append(
                self._storage.view(dtype).as_strided(
                    (buf.num_blocks, *shape),
                    (geom.page // size, *inner),
                    (buf.base + offset) // size,
                )
            )
            offset += torch.Size(shape).numel() * size
        return tuple(states)

    # ------------------------------------------------------------ validation

    def _src(self, ids: Ids, what: str, limit: int | None = None) -> Rule:
        return Rule(ids, what, self.num_blocks if limit is None else limit)

    def _dst(self, ids: Ids, what: str, host_side: bool = False) -> Rule:
        if host_side:
            return Rule(ids, what, self.host_blocks, True)
        return Rule(ids, what, self.num_blocks, True, self._protect)

    @staticmethod
    def _same_length(a: Span, b: Span, what: str) -> None:
        if a.n != b.n:
            raise InvalidArgumentError(f"{what}: {a.n} source ids but {b.n} destination ids")

    def _need_host_pool(self, what: str) -> torch.Tensor:
        if self.host_pool is None:
            raise InvalidArgumentError(
                f"{what} needs a host pool: create KVPages with host_blocks=N"
            )
        return self.host_pool

    def _to_device(self, ids: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return ids
        if self.device.type == "cuda":
            return ids.pin_memory().to(self.device, non_blocking=True)
        return ids.to(self.device)

    # ------------------------------------------------------------- operations

    def copy_blocks(self, src: Ids, dst: Ids) -> None:
        """Copy block `src[i]` to block `dst[i]` in every buffer. All sources are read before
        any destination is written (as vLLM's copy_kv_cache_blocks_inplace)."""
        ids = self._staging
        s, d = ids.pair(self._src(src, "copy_blocks src"), self._dst(dst, "copy_blocks dst"))
        self._same_length(s, d, "copy_blocks")
        n = s.n
        if n == 0:
            return
        # Runs of consecutive (src, dst) pairs go as slice copies where they are few or long;
        # they are counted only up to where no plane would take that path.
        most = max(SLICE_COPY_MAX_RUNS, n * self._widest // SLICE_COPY_MIN_RUN_BYTES)
        disjoint, runs = ids.pairs(s, d, most)
        sliced: tuple[_Move, ...] = ()
        if runs is not None:
            sliced = tuple(m for m in self._moves if len(runs) <= self._slice_runs(n, m))
        for move in sliced:
            for _, length, a, b in runs or ():
                move.device[b : b + length].copy_(move.device[a : a + length])
        rest = [m for m in self._moves if m not in sliced] if sliced else self._moves
        if rest:
            s_dev, d_dev = ids.on_device(s, d)
            kernel = _kernels.usable(self.device)
            for move in rest:
                if kernel and move.fits and disjoint:
                    pages, side = self._storage, move.pages
                    _kernels.copy(move.seg, pages, side, pages, side, s_dev, d_dev, n)
                elif kernel and move.fits:  # all sources read (into tmp) before any write
                    tmp = move.device.new_empty((n, *move.device.shape[1:]))
                    _kernels.copy(
                        move.seg, self._storage, move.pages, tmp, move.scratch, s_dev, None, n
                    )
                    _kernels.copy(
                        move.seg, tmp, move.scratch, self._storage, move.pages, None, d_dev, n
                    )
                elif disjoint:
                    _copy_indexed(move.device, s_dev.tensor(), move.device, d_dev.tensor())
                else:
                    chosen: torch.Tensor = move.device.index_select(0, s_dev.tensor())
                    move.device.index_copy_(0, d_dev.tensor(), chosen)

    @staticmethod
    def _slice_runs(num_ids: int, move: _Move) -> int:
        """The most runs for which slice copies beat the index path on `move`."""
        plane_bytes = num_ids * move.plane.rows * move.plane.width * len(move.batch.buffers)
        return max(SLICE_COPY_MAX_RUNS, plane_bytes // SLICE_COPY_MIN_RUN_BYTES)

    def zero_blocks(self, ids: Ids) -> None:
        """Fill the given blocks of every buffer with zero bytes."""
        d = self._staging.one(ids, "zero_blocks", self.num_blocks, True, self._protect)
        if not d.n:
            return
        d_dev = self._staging.on_device(d)[0].tensor()
        for move in self._moves:
            move.device.index_fill_(0, d_dev, 0)

    def gather(self, ids: Ids, out: torch.Tensor | None = None) -> torch.Tensor:
        """The given blocks of every buffer as one contiguous uint8 `[len(ids), block_bytes]`
        tensor on the device (the host-pool row format), written to `out` if given."""
        s = self._staging.one(ids, "gather", self.num_blocks)
        n = s.n
        if out is None:
            out = torch.empty((n, self.block_bytes), dtype=torch.uint8, device=self.device)
        else:
            self._check_rows(out, n, "gather out")
            if not out.is_contiguous():
                raise InvalidArgumentError("gather out must be contiguous")
        if n:
            self._gather_into(out, *self._staging.on_device(s))
        return out

    def _check_rows(self, rows: object, n: int, what: str) -> None:
        if not isinstance(rows, torch.Tensor):
            raise InvalidTypeError(f"{what} must be a torch.Tensor, got {type(rows).__name__}")
        if rows.dtype != torch.uint8:
            raise InvalidTypeError(f"{what} must be uint8, got {rows.dtype}")
        if tuple(rows.shape) != (n, self.block_bytes):
            raise InvalidArgumentError(
                f"{what} must have shape ({n}, {self.block_bytes}), got {tuple(rows.shape)}"
            )
        if rows.device != self.device:
            raise InvalidArgumentError(f"{what} is on {rows.device}, the pages on {self.device}")

    def _gather_into(self, out: torch.Tensor, ids: Staged) -> None:
        kernel = _kernels.usable(self.device)
        for move in self._moves:
            if kernel and move.fits:
                n = out.shape[0]
                _kernels.copy(move.seg, self._storage, move.pages, out, move.rows, ids, None, n)
            else:
                torch.index_select(move.device, 0, ids.tensor(), out=self._rows_view(out, move))

    def scatter(self, ids: Ids, data: torch.Tensor) -> None:
        """Write `data` (as returned by gather: uint8 `[len(ids), block_bytes]` on the
        device) into the given blocks."""
        d = self._staging.one(ids, "scatter", self.num_blocks, True, self._protect)
        self._check_rows(data, d.n, "scatter data")
        if d.n:
            self._scatter_from(data.contiguous(), *self._staging.on_device(d))

    def _scatter_from(self, data: torch.Tensor, ids: Staged) -> None:
        kernel = _kernels.usable(self.device)
        for move in self._moves:
            if kernel and move.fits:
                n = data.shape[0]
                _kernels.copy(move.seg, data, move.rows, self._storage, move.pages, None, ids, n)
            else:
                move.device.index_copy_(0, ids.tensor(), self._rows_view(data, move))

    def _dma_order(
        self, host: Span, other: Span
    ) -> tuple[torch.Tensor, torch.Tensor, list[Run] | None]:
        """The ids of a swap (`host` side, `other` side, as CPU tensors of their own) in the
        order that makes the fewest runs of consecutive host ids (ascending, unless already
        few), and those runs when few or long enough for one DMA each (else None)."""
        n = host.n
        most = max(DMA_MAX_RUNS, n * self.block_bytes // DMA_MIN_RUN_BYTES)
        host_ids, other_ids = self._staging.host(host).clone(), self._staging.host(other).clone()
        runs = self._staging.runs(host, None, most)
        if runs is None:  # coalesce: consecutive host ids side by side
            host_ids, order = torch.sort(host_ids)
            other_ids = other_ids[order]
            runs = self._staging.runs_in(host_ids, most)
        return host_ids, other_ids, runs

    def swap_out(self, device_ids: Ids, host_ids: Ids) -> Transfer:
        """Copy device blocks to host-pool blocks on a side stream; returns the Transfer.

        The side stream first waits for the current stream, so the pages hold everything
        queued before the call. The device pages may be reused once `event` completes; the
        host rows are valid after `synchronize()`.
        """
        host = self._need_host_pool("swap_out")
        src, dst = self._staging.stage(
            self._src(device_ids, "swap_out device ids"),
            self._dst(host_ids, "swap_out host ids", host_side=True),
        )
        self._same_length(src, dst, "swap_out")
        n = src.n
        if n == 0:
            return Transfer()
        self._settle(all_swap_outs=False)
        if self._swap_by_kernel():
            with self._on_side():
                s_dev, d_dev = self._staging.on_device(src, dst)
                for move in self._moves:
                    pages = self._storage
                    _kernels.copy(move.seg, pages, move.pages, host, move.rows, s_dev, d_dev, n)
                return self._track(self._transfer(()))
        if self.device.type == "cpu":
            s_ids, d_ids = self._staging.host(src), self._staging.host(dst)
            for move in self._moves:
                _copy_indexed(move.device, s_ids, self._rows_view(host, move), d_ids)
            return Transfer()
        if self._side is None:  # another accelerator: synchronous, through host memory
            rows = torch.empty((n, self.block_bytes), dtype=torch.uint8, device=self.device)
            self._gather_into(rows, *self._staging.on_device(src))
            self._words(host).index_copy_(0, self._staging.host(dst), self._words(rows.cpu()))
            return Transfer()
        host_order, device_order, runs = self._dma_order(dst, src)
        with self._on_side():
            staging = torch.empty((n, self.block_bytes), dtype=torch.uint8, device=self.device)
            (ordered,) = self._staging.stage(self._src(device_order, "swap_out device ids"))
            self._gather_into(staging, *self._staging.on_device(ordered))
            if runs is not None:
                for pos, length, first, _ in runs:
                    host[first : first + length].copy_(
                        staging[pos : pos + length], non_blocking=True
                    )
                return self._track(self._transfer((staging,)))
            pinned = torch.empty_like(staging, device="cpu", pin_memory=True)
            pinned.copy_(staging, non_blocking=True)
            transfer = self._transfer(
                (staging, pinned),
                lambda: self._words(host).index_copy_(0, host_order, self._words(pinned)),
            )
        return self._track(transfer)

    def _swap_by_kernel(self) -> bool:
        """Swaps run as one kernel per plane reading/writing the pinned host pool directly
        (over unified addressing) when KVBLOCKS_DEVICE_SWAP=kernel and the kernel is usable;
        by default they use the copy engines (DMA)."""
        if _kernels.swap_mode() != "kernel" or not _kernels.usable(self.device):
            return False
        return all(m.fits for m in self._moves)

    def _on_side(self) -> contextlib.AbstractContextManager[object]:
        """Run on the side stream after the work queued so far (no-op off CUDA)."""
        if self._side is None:
            return contextlib.nullcontext()
        self._side.wait_stream(torch.cuda.current_stream(self.device))
        on_side: contextlib.AbstractContextManager[object] = torch.cuda.stream(self._side)
        return on_side

    def _transfer(
        self, keep: tuple[torch.Tensor, ...], finish: Callable[[], object] | None = None
    ) -> Transfer:
        """A Transfer for the work just queued on the side stream (complete off CUDA)."""
        if self._side is None:
            if finish is not None:
                finish()
            return Transfer()
        event = _event()
        event.record(self._side)
        return Transfer(event, self.device, keep, finish)

    def _track(self, transfer: Transfer) -> Transfer:
        self._swap_outs.append(transfer)
        return transfer

    def _settle(self, all_swap_outs: bool) -> None:
        """Finish earlier swap_outs that could race with a new host-pool access: those with a
        host-side step (it writes host rows outside any stream), or all of them before the host
        itself reads the pool. Device-side steps are already ordered on the side stream."""
        pending = []
        for transfer in self._swap_outs:
            if transfer.done():
                continue
            if all_swap_outs or transfer.has_host_step:
                transfer.synchronize()
            else:
                pending.append(transfer)
        self._swap_outs = pending

    def swap_in(self, host_ids: Ids, device_ids: Ids) -> Transfer:
        """Copy host-pool blocks into device blocks on a side stream; returns the Transfer.

        The side stream first waits for the current stream (earlier readers of the target
        pages finish first). Call `wait()` on the Transfer before reading the pages.
        """
        host = self._need_host_pool("swap_in")
        src, dst = self._staging.stage(
            self._src(host_ids, "swap_in host ids", self.host_blocks),
            self._dst(device_ids, "swap_in device ids"),
        )
        self._same_length(src, dst, "swap_in")
        n = src.n
        if n == 0:
            return Transfer()
        if self._swap_by_kernel():
            self._settle(all_swap_outs=False)
            with self._on_side():
                s_dev, d_dev = self._staging.on_device(src, dst)
                for move in self._moves:
                    pages = self._storage
                    _kernels.copy(move.seg, host, move.rows, pages, move.pages, s_dev, d_dev, n)
                return self._transfer(())
        if self.device.type == "cpu":
            s_ids, d_ids = self._staging.host(src), self._staging.host(dst)
            for move in self._moves:
                _copy_indexed(self._rows_view(host, move), s_ids, move.device, d_ids)
            return Transfer()
        if self._side is None:  # another accelerator: synchronous, through host memory
            rows = self._words(host).index_select(0, self._staging.host(src)).view(torch.uint8)
            self._scatter_from(rows.to(self.device), *self._staging.on_device(dst))
            return Transfer()
        host_order, device_order, runs = self._dma_order(src, dst)
        self._settle(all_swap_outs=runs is None)  # the host reads the pool below if None
        with self._on_side():
            staging = torch.empty((n, self.block_bytes), dtype=torch.uint8, device=self.device)
            keep: tuple[torch.Tensor, ...] = (staging,)
            if runs is not None:
                for pos, length, first, _ in runs:
                    staging[pos : pos + length].copy_(
                        host[first : first + length], non_blocking=True
                    )
            else:
                source = torch.empty((n, self.block_bytes), dtype=torch.uint8, pin_memory=True)
                torch.index_select(self._words(host), 0, host_order, out=self._words(source))
                staging.copy_(source, non_blocking=True)
                keep = (staging, source)
            (ordered,) = self._staging.stage(self._dst(device_order, "swap_in device ids"))
            self._scatter_from(staging, *self._staging.on_device(ordered))
            return self._transfer(keep)

    def write_slots(
        self,
        name: str,
        key: torch.Tensor,
        value: torch.Tensor | None,
        slot_mapping: Ids,
    ) -> None:
        """Store new tokens' K/V (vLLM's reshape_and_cache): token i goes to block
        `slot // block_size`, offset `slot % block_size`; negative slots are padding.

        Attention: key `[T, num_kv_heads, head_size]`, value `[T, num_kv_heads, head_size_v]`.
        MLA: key `[T, head_size]` (the latent and rope parts concatenated), value None.
        Tensors must already be in the cache dtype (no fp8 scaling here). Slots are validated
        on the host (a device slot_mapping costs one sync); valid slots must be unique.
        """
        geom = self._layer(name, "attention", "mla")
        slots = _host_ids(slot_mapping, "write_slots slot_mapping").tensor
        if geom.kind == "mla":
            if value is not None:
                raise InvalidArgumentError(f"MLA layer {name!r} stores one latent: pass value=None")
            pairs: list[tuple[torch.Tensor, tuple[int, ...], torch.Tensor]] = [
                (key, (geom.head_size,), self.kv_cache(name))
            ]
        else:
            if value is None:
                raise InvalidArgumentError(f"attention layer {name!r} needs a value tensor")
            heads = geom.num_kv_heads
            pairs = [
                (key, (heads, geom.head_size), self.key_cache(name)),
                (value, (heads, geom.head_size_v), self.value_cache(name)),
            ]
        for tensor, inner, _cache in pairs:
            if not isinstance(tensor, torch.Tensor):
                raise InvalidTypeError(
                    f"write_slots: expected a torch.Tensor, got {type(tensor).__name__}"
                )
            if tuple(tensor.shape) != (slots.numel(), *inner):
                raise InvalidArgumentError(
                    f"write_slots {name!r}: expected shape "
                    f"{(slots.numel(), *inner)}, got {tuple(tensor.shape)}"
                )
            if tensor.dtype != geom.dtype:
                raise InvalidTypeError(
                    f"write_slots {name!r}: expected {geom.dtype}, got {tensor.dtype}"
                )
            if tensor.device != self.device:
                raise InvalidArgumentError(
                    f"write_slots {name!r}: tensor on {tensor.device}, pages on {self.device}"
                )
        valid = slots >= 0
        kept = slots[valid]
        bs = geom.block_size
        kept_values = kept.tolist()
        _check_range(kept_values, self.num_blocks * bs, "write_slots slot")
        _check_unique(kept_values, "write_slots slot_mapping")
        if self._null and kept_values and min(kept_values) < bs:
            raise InvalidArgumentError("write_slots: a slot falls in block 0, the null block")
        if kept.numel() == 0:
            return
        rows = None if bool(valid.all()) else self._to_device(torch.nonzero(valid).flatten())
        index = (self._to_device(kept // bs), self._to_device(kept % bs))
        for tensor, _inner, cache in pairs:
            cache.index_put_(index, tensor if rows is None else tensor.index_select(0, rows))


_WORDS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
