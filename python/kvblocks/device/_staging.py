"""Block ids on their way to the device: checked by the core while they are written into
one persistent int64 host buffer (pinned for CUDA), and uploaded from there with one copy.

A call's ids never become a Python list or a fresh tensor: `kvblocks._core` reads a list
(or tuple, range, iterable) of ints, checks it (range, duplicates, the null block: the
rules are `src/device_ids.rs`) and writes it into the next free slots of the host buffer;
an id tensor or array is copied there by torch and checked in place. On CUDA a second,
device-side buffer of the same size receives each call's slots with one non-blocking copy.

Both buffers are rings. A call takes the next free slots; when they run out, the next lap
starts at slot 0 once the device has finished everything queued on the last lap (one event
per stream that uploaded in it, waited on by the host, about once per `capacity` ids).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

from kvblocks import _core
from kvblocks._core import InvalidArgumentError, InvalidTypeError

# Slots of a new ring (int64 each); a call needing more grows it.
CAPACITY = 1 << 16


class Span(NamedTuple):
    """`n` ids staged from slot `start` on."""

    start: int
    n: int


Run = tuple[int, int, int, int]
"""A run of consecutive ids: (position, length, first id, first id of the second column)."""


class Rule(NamedTuple):
    """One id list of a call: the ids, what they are (for messages) and what they must meet."""

    ids: object
    what: str
    limit: int
    unique: bool = False
    forbid_null: bool = False


class Staging:
    """The id rings of one device (one per KVPages). Not thread-safe, like KVPages."""

    def __init__(self, device: torch.device, capacity: int = CAPACITY) -> None:
        self.device = device
        self._cuda = device.type == "cuda"
        self._next = 0
        self._streams: dict[int, torch.cuda.Stream] = {}
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        self.capacity = capacity
        self._host = torch.zeros(capacity, dtype=torch.int64, pin_memory=self._cuda)
        self._host_address = self._host.data_ptr()
        self._device = (
            torch.zeros(capacity, dtype=torch.int64, device=self.device) if self._cuda else None
        )

    def stage(self, *rules: Rule) -> list[Span]:
        """Checks and writes each rule's ids into consecutive slots, and returns where they
        went. Raises (pages untouched) if any list breaks its rule."""
        lists = [_as_ids(rule) for rule in rules]
        total = sum(_length(ids) for ids in lists)
        start = self._take(total)
        spans = []
        at = start
        for rule, ids in zip(rules, lists, strict=True):
            address = self._host_address + 8 * at
            room = start + total - at
            if isinstance(ids, torch.Tensor):
                count = ids.numel()
                self._host[at : at + count].copy_(ids)
                _core._check_block_ids(
                    address, count, rule.limit, rule.unique, rule.forbid_null, rule.what
                )
            else:
                count = _core._stage_block_ids(
                    ids, address, room, rule.limit, rule.unique, rule.forbid_null, rule.what
                )
            spans.append(Span(at, count))
            at += count
        self._next = at
        return spans

    def one(
        self, ids: object, what: str, limit: int, unique: bool = False, forbid_null: bool = False
    ) -> Span:
        """`stage` of one list (a list of ints takes a shorter path)."""
        if type(ids) is not list:
            return self.stage(Rule(ids, what, limit, unique, forbid_null))[0]
        start = self._take(len(ids))
        address = self._host_address + 8 * start
        n = _core._stage_block_ids(ids, address, len(ids), limit, unique, forbid_null, what)
        self._next = start + n
        return Span(start, n)

    def _take(self, count: int) -> int:
        """The first of `count` free consecutive slots, starting a new lap if needed."""
        if self._next + count <= self.capacity:
            return self._next
        self._new_lap()
        if count > self.capacity:
            self._allocate(max(2 * self.capacity, count))
        return 0

    def _new_lap(self) -> None:
        """Wait until the device is done with every slot used so far, then start at 0."""
        for stream in self._streams.values():
            event = torch.cuda.Event()  # type: ignore[no-untyped-call, unused-ignore]
            event.record(stream)
            event.synchronize()  # type: ignore[no-untyped-call, unused-ignore]
        self._streams.clear()
        self._next = 0

    def host(self, span: Span) -> torch.Tensor:
        """The span's ids as a CPU int64 tensor (a view of the ring: read it before the next
        call stages ids, or clone it)."""
        return self._host[span.start : span.start + span.n]

    def address(self, span: Span) -> int:
        """The host address of the span's first id (for the core's readers)."""
        return self._host_address + 8 * span.start

    def values(self, span: Span) -> list[int]:
        """The span's ids as Python ints."""
        values: list[int] = self.host(span).tolist()
        return values

    def runs(self, first: Span, second: Span | None, most: int) -> list[Run] | None:
        """The runs where the ids of `first` (and `second` with them) advance by 1, or None
        when there are more than `most`."""
        other = None if second is None else self.address(second)
        runs: list[Run] | None = _core._block_id_runs(self.address(first), other, first.n, most)
        return runs

    @staticmethod
    def runs_in(ids: torch.Tensor, most: int) -> list[Run] | None:
        """`runs` of a contiguous CPU int64 tensor of ids that already passed the checks."""
        runs: list[Run] | None = _core._block_id_runs(ids.data_ptr(), None, ids.numel(), most)
        return runs

    def disjoint(self, first: Span, second: Span) -> bool:
        """Whether the two spans (of equal length) share no id."""
        return bool(_core._block_ids_disjoint(self.address(first), self.address(second), first.n))

    def on_device(self, first: Span, last: Span | None = None) -> torch.Tensor:
        """The ids from `first` through `last` (consecutive spans of one stage call) on the
        device: on CUDA one non-blocking copy into the device ring, on the current stream."""
        end = last or first
        stop = end.start + end.n
        if not self._cuda:
            ids = self._host[first.start : stop]
            return ids if self.device.type == "cpu" else ids.to(self.device)
        assert self._device is not None
        stream = torch.cuda.current_stream(self.device)
        self._streams.setdefault(stream.cuda_stream, stream)
        ids = self._device[first.start : stop]
        ids.copy_(self._host[first.start : stop], non_blocking=True)
        return ids


def _as_ids(rule: Rule) -> Any:
    """A rule's ids as the core reads them (a list, tuple or range of ints; an iterator is
    read into a list) or as a 1-D integer tensor (see `id_tensor`)."""
    ids = rule.ids
    if isinstance(ids, (list, tuple, range)):
        return ids
    if isinstance(ids, Iterator):
        return list(ids)
    return id_tensor(ids, rule.what)


def id_tensor(ids: object, what: str) -> torch.Tensor:
    """Ids that are not a Python sequence (tensors, numpy arrays, int32/int64 memoryviews,
    other sequences) as a 1-D integer tensor, without a copy where torch can view them;
    InvalidTypeError / InvalidArgumentError for anything that is not 1-D integers."""
    if isinstance(ids, memoryview) and ids.ndim == 1 and ids.format in _FORMATS and ids.nbytes:
        data = bytearray(ids) if ids.readonly or not ids.c_contiguous else ids
        tensor = torch.frombuffer(data, dtype=_FORMATS[ids.format])
    elif isinstance(ids, torch.Tensor):
        tensor = ids.detach()
    else:
        try:
            tensor = torch.as_tensor(ids)
        except (TypeError, ValueError, RuntimeError) as err:
            raise InvalidTypeError(
                f"{what}: block ids must be a sequence of ints ({err})"
            ) from None
        if tensor.numel() == 0:
            tensor = tensor.reshape(0).to(torch.int64)
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise InvalidTypeError(f"{what}: block ids must be integers, got {tensor.dtype}")
    if tensor.dim() != 1:
        raise InvalidArgumentError(
            f"{what}: block ids must be 1-D, got shape {tuple(tensor.shape)}"
        )
    return tensor


# memoryview formats of native ints taken without a copy (KVCacheManager's buffers are "i").
_FORMATS = {"i": torch.int32, "q": torch.int64}


def _length(ids: Any) -> int:
    return ids.numel() if isinstance(ids, torch.Tensor) else len(ids)
