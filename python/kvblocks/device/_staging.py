"""Block ids on their way to the device: checked by the core while they are written into
one persistent int64 host buffer (pinned for CUDA), and uploaded from there with one copy.

A call's ids never become a Python list or a fresh tensor: `kvblocks._core` reads a list
(or tuple, range, iterable) of ints, checks it (range, duplicates, the null block: the
rules are `src/device_ids.rs`) and writes it into the next free slots of the host buffer;
an int32 or int64 tensor, array or buffer (`KVCacheManager.block_table`'s rows) is read by
the core from its own memory. On CUDA a second, device-side buffer of the same size
receives each call's slots with one non-blocking copy.

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


class Staged(NamedTuple):
    """A span's ids where a kernel reads them: `n` int64 from slot `start` of `ring` (the
    host ring on CPU, the device ring on CUDA; a tensor of its own elsewhere), the first
    at `address`."""

    ring: torch.Tensor
    start: int
    n: int
    address: int

    def tensor(self) -> torch.Tensor:
        """The ids as a tensor (a view of the ring: use it before the next call)."""
        return self.ring[self.start : self.start + self.n]


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
        # The streams that uploaded this lap, by raw handle.
        self._streams: dict[int, torch.cuda.Stream] = {}
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        self.capacity = capacity
        self._host = torch.zeros(capacity, dtype=torch.int64, pin_memory=self._cuda)
        self._host_address = self._host.data_ptr()
        self._ring = _core._IdRing(self._host)
        self._device = (
            torch.zeros(capacity, dtype=torch.int64, device=self.device) if self._cuda else None
        )
        self._device_address = 0 if self._device is None else self._device.data_ptr()

    def stage(self, *rules: Rule) -> list[Span]:
        """Checks and writes each rule's ids into consecutive slots, and returns where they
        went. Raises (pages untouched) if any list breaks its rule."""
        lists = [_as_ids(rule.ids, rule.what) for rule in rules]
        sizes = [_size(ids) for ids in lists]
        at = self._take(sum(sizes))
        spans = []
        for rule, values, n in zip(rules, lists, sizes, strict=True):
            self._write(values, at, n, rule)
            spans.append(Span(at, n))
            at += n
        self._next = at
        return spans

    def one(
        self, ids: object, what: str, limit: int, unique: bool = False, forbid_null: bool = False
    ) -> Span:
        """`stage` of one list, in fewer steps."""
        values = ids if type(ids) is list else _as_ids(ids, what)
        n = _size(values)
        at = self._take(n)
        self._write(values, at, n, (ids, what, limit, unique, forbid_null))
        self._next = at + n
        return Span(at, n)

    def _write(
        self, values: Any, at: int, n: int, rule: tuple[object, str, int, bool, bool]
    ) -> None:
        """Check `n` ids (from `_as_ids`) and write them from slot `at` on."""
        _, what, limit, unique, null = rule
        if not isinstance(values, torch.Tensor):
            self._ring.stage(values, at, limit, unique, null, what)
            return
        if values.dtype not in (torch.int32, torch.int64) or values.device.type != "cpu":
            values = values.to("cpu", torch.int64)
        source = values.contiguous()
        self._ring.stage(source, at, limit, unique, null, what)

    def pair(self, src: Rule, dst: Rule) -> tuple[Span, Span]:
        """`stage` of a source list and a destination list (lists of ints take a shorter
        path)."""
        a, b = src.ids, dst.ids
        if type(a) is not list or type(b) is not list:
            first, second = self.stage(src, dst)
            return first, second
        start = self._take(len(a) + len(b))
        mid = start + len(a)
        self._ring.stage(a, start, *src[2:], src.what)
        self._ring.stage(b, mid, *dst[2:], dst.what)
        self._next = mid + len(b)
        return Span(start, len(a)), Span(mid, len(b))

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

    def runs(self, first: Span, second: Span | None, most: int) -> list[Run] | None:
        """The runs where the ids of `first` (and `second` with them) advance by 1, or None
        when there are more than `most`."""
        other = None if second is None else second.start
        runs: list[Run] | None = self._ring.runs(first.start, other, first.n, most)
        return runs

    @staticmethod
    def runs_in(ids: torch.Tensor, most: int) -> list[Run] | None:
        """`runs` of a contiguous CPU int64 tensor of ids that already passed the checks."""
        runs: list[Run] | None = _core._IdRing(ids).runs(0, None, ids.numel(), most)
        return runs

    def pairs(self, first: Span, second: Span, most: int) -> tuple[bool, list[Run] | None]:
        """For a copy from `first` to `second` (of equal length): whether they share no id,
        and if so their `runs` (None when more than `most`)."""
        pairs: tuple[bool, list[Run] | None] = self._ring.pairs(
            first.start, second.start, first.n, most
        )
        return pairs

    def on_device(self, *spans: Span) -> list[Staged]:
        """The ids of each span (consecutive spans of one stage call) on the device: on CUDA
        with one non-blocking copy into the device ring, on the current stream."""
        if self.device.type == "cpu":
            ring, base = self._host, self._host_address
        elif self._cuda:
            assert self._device is not None
            begin, stop = spans[0].start, spans[-1].start + spans[-1].n
            if _current_stream(self.device) not in self._streams:
                stream = torch.cuda.current_stream(self.device)
                self._streams[stream.cuda_stream] = stream
            self._device[begin:stop].copy_(self._host[begin:stop], non_blocking=True)
            ring, base = self._device, self._device_address
        else:
            own = [self.host(span).to(self.device) for span in spans]
            return [
                Staged(ids, 0, span.n, ids.data_ptr()) for ids, span in zip(own, spans, strict=True)
            ]
        if len(spans) == 1:
            (span,) = spans
            return [Staged(ring, span.start, span.n, base + 8 * span.start)]
        return [Staged(ring, span.start, span.n, base + 8 * span.start) for span in spans]


def _current_stream(device: torch.device) -> int:
    """The raw handle of `device`'s current CUDA stream (torch's own getter, as Triton's)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:
        return int(torch.cuda.current_stream(device).cuda_stream)
    handle: int = raw(device.index)
    return handle


def _as_ids(ids: object, what: str) -> Any:
    """Ids as the core reads them (a list, tuple or range of ints; an iterator is read into
    a list) or as a 1-D integer tensor (see `id_tensor`)."""
    if isinstance(ids, (list, tuple, range)):
        return ids
    if isinstance(ids, Iterator):
        return list(ids)
    return id_tensor(ids, what)


def _size(ids: Any) -> int:
    return ids.numel() if isinstance(ids, torch.Tensor) else len(ids)


def id_tensor(ids: object, what: str) -> torch.Tensor:
    """Ids that are not a Python sequence (tensors, numpy arrays, int32/int64 memoryviews,
    other sequences) as a 1-D integer tensor, without a copy where torch can view them;
    InvalidTypeError / InvalidArgumentError for anything that is not 1-D integers."""
    if isinstance(ids, memoryview) and ids.ndim == 1 and ids.format in _FORMATS and ids.nbytes:
        data = bytearray(ids) if ids.readonly or not ids.c_contiguous else ids
        return torch.frombuffer(data, dtype=_FORMATS[ids.format])  # 1-D ints by construction
    if isinstance(ids, torch.Tensor):
        tensor = ids  # integer tensors carry no autograd history
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
