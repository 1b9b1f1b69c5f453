"""Type stubs for the `kvblocks._core` extension module (checked with mypy.stubtest)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import final

__version__: str

# --- events (src/python/publish.rs) ---

def encode_event_batch(
    ts: float,
    events: Iterable[object],
    data_parallel_rank: int | None = None,
    *,
    format: str = "map",
) -> bytes: ...

@final
class EventSink:
    def __new__(
        cls,
        *,
        max_queue_size: int = 100_000,
        format: str = "map",
        data_parallel_rank: int | None = 0,
    ) -> EventSink: ...
    def publish(
        self,
        events: Iterable[object],
        ts: float | None = None,
        data_parallel_rank: int | None = None,
    ) -> bool: ...
    def request_snapshot(self) -> None: ...
    def next_payload(self, timeout: float) -> tuple[int, bytes] | None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def pending(self) -> int: ...
    @property
    def stale(self) -> bool: ...
    def stats(self) -> dict[str, int]: ...
    def cached_keys(self) -> set[tuple[int, int]]: ...
