"""Block tables and slot mappings for attention kernels, built with tensor ops only."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from kvblocks._core import IntOverflowError, InvalidArgumentError, InvalidTypeError
from kvblocks.device._pages import Ids, _host_ids

if TYPE_CHECKING:
    from typing_extensions import Buffer

# The struct formats of a native 4-byte signed int (memoryview writes "i"; ctypes and
# numpy may spell the byte order out).
_INT32_FORMATS = {"i", "@i", "=i", "<i" if sys.byteorder == "little" else ">i"}


def _on(device: torch.device, tensor: torch.Tensor) -> torch.Tensor:
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def _int32_matrix(obj: object) -> torch.Tensor | None:
    """A C-contiguous 2-D int32 buffer (`KVCacheManager.block_table`'s result, a numpy
    array) as a tensor viewing the same memory (a copy only for a read-only buffer), or
    None for anything else."""
    if isinstance(obj, (torch.Tensor, list, tuple, range)):
        return None
    try:
        view = memoryview(obj)  # type: ignore[arg-type]
    except TypeError:
        return None
    if (
        view.ndim != 2
        or view.itemsize != 4
        or view.format not in _INT32_FORMATS
        or not view.c_contiguous
    ):
        return None
    shape = tuple(view.shape or ())
    if view.nbytes == 0:
        return torch.zeros(shape, dtype=torch.int32)
    if view.readonly:  # torch would warn, and a write through the tensor would corrupt it
        view = memoryview(bytearray(view)).cast("i", shape)
    return torch.frombuffer(view, dtype=torch.int32).view(shape)


def block_table(
    block_ids_per_request: Sequence[Ids] | Buffer,
    max_blocks: int,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """An int32 `[num_requests, max_blocks]` table, row r = request r's block ids padded with
    0 (the null block), as vLLM's BlockTable.

    `block_ids_per_request` is one id sequence per request, or a whole 2-D int32 table
    with the buffer protocol (`KVCacheManager.block_table(ids)`), taken as it is: on the
    CPU at `max_blocks` columns the result views its memory; narrower tables are padded
    with nulls, wider ones cut where the extra columns hold only nulls."""
    if max_blocks < 0:
        raise InvalidArgumentError(f"max_blocks must be >= 0, got {max_blocks}")
    matrix = _int32_matrix(block_ids_per_request)
    if matrix is not None:
        if matrix.numel() and int(matrix.min()) < 0:
            raise InvalidArgumentError(f"block_table: negative block id {int(matrix.min())}")
        return _on(torch.device(device), _fit_width(matrix, max_blocks))
    block_ids_per_request = cast("Sequence[Ids]", block_ids_per_request)
    parts = [
        _host_ids(ids, f"block_table request {r}").tensor
        for r, ids in enumerate(block_ids_per_request)
    ]
    lengths = torch.tensor([p.numel() for p in parts], dtype=torch.int64)
    table = torch.zeros((len(parts), max_blocks), dtype=torch.int32)
    if parts and int(lengths.max()) > max_blocks:
        row = int(torch.argmax(lengths))
        raise InvalidArgumentError(
            f"block_table: request {row} has {int(lengths[row])} blocks, more than "
            f"max_blocks={max_blocks}"
        )
    flat = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
    if flat.numel():
        if int(flat.min()) < 0:
            raise InvalidArgumentError(f"block_table: negative block id {int(flat.min())}")
        if int(flat.max()) > torch.iinfo(torch.int32).max:
            raise IntOverflowError(f"block_table: block id {int(flat.max())} does not fit int32")
        table[torch.arange(max_blocks) < lengths[:, None]] = flat.to(torch.int32)
    return _on(torch.device(device), table)


def _fit_width(table: torch.Tensor, max_blocks: int) -> torch.Tensor:
    """`table` at `max_blocks` columns: padded with nulls, or cut where the columns cut hold
    only nulls (the table itself when it has that width)."""
    rows, width = table.shape
    if width < max_blocks:
        wide = torch.zeros((rows, max_blocks), dtype=torch.int32)
        wide[:, :width] = table
        return wide
    if width > max_blocks:
        extra = torch.nonzero(table[:, max_blocks:])
        if extra.numel():
            row = int(extra[0, 0])
            raise InvalidArgumentError(
                f"block_table: request {row} has more blocks than max_blocks={max_blocks}"
            )
        return table[:, :max_blocks].contiguous()
    return table


def slot_mapping(
    table: torch.Tensor | Buffer,
    num_computed_tokens: Ids,
    num_scheduled_tokens: Ids,
    block_size: int,
    pad_to: int | None = None,
) -> torch.Tensor:
    """int64 slots for the scheduled tokens of every request, in request order, on the
    table's device: token at position p of request r goes to
    `table[r, p // block_size] * block_size + p % block_size`. Positions run from
    num_computed_tokens[r] for num_scheduled_tokens[r] tokens. Padded with -1 to `pad_to`.
    """
    matrix = _int32_matrix(table)
    if matrix is not None:
        table = matrix
    if not isinstance(table, torch.Tensor) or table.dim() != 2:
        raise InvalidTypeError("slot_mapping: table must be a 2-D tensor (see block_table)")
    if table.dtype.is_floating_point or table.dtype == torch.bool:
        raise InvalidTypeError(f"slot_mapping: table must hold integers, got {table.dtype}")
    if block_size < 1:
        raise InvalidArgumentError(f"block_size must be >= 1, got {block_size}")
    computed = _host_ids(num_computed_tokens, "slot_mapping num_computed_tokens").tensor
    scheduled = _host_ids(num_scheduled_tokens, "slot_mapping num_scheduled_tokens").tensor
    rows = table.shape[0]
    if computed.numel() != rows or scheduled.numel() != rows:
        raise InvalidArgumentError(
            f"slot_mapping: table has {rows} rows but {computed.numel()} computed "
            f"and {scheduled.numel()} scheduled counts"
        )
    if rows and (int(computed.min()) < 0 or int(scheduled.min()) < 0):
        raise InvalidArgumentError("slot_mapping: token counts must be >= 0")
    capacity = table.shape[1] * block_size
    ends = computed + scheduled
    if rows and int(ends.max()) > capacity:
        row = int(torch.argmax(ends))
        raise InvalidArgumentError(
            f"slot_mapping: request {row} reaches token {int(ends[row])}, beyond "
            f"its {table.shape[1]} blocks of {block_size}"
        )
    total = int(scheduled.sum())
    if pad_to is not None and pad_to < total:
        raise InvalidArgumentError(f"slot_mapping: pad_to={pad_to} < {total} scheduled tokens")
    request = torch.repeat_interleave(torch.arange(rows), scheduled)
    starts = torch.cumsum(scheduled, 0) - scheduled
    positions = computed[request] + torch.arange(total) - starts[request]
    index: Any = (_on(table.device, request), _on(table.device, positions // block_size))
    slots = table[index].to(torch.int64) * block_size + _on(table.device, positions % block_size)
    if pad_to is not None and pad_to > total:
        pad = torch.full((pad_to - total,), -1, dtype=torch.int64, device=table.device)
        slots = torch.cat([slots, pad])
    return slots
