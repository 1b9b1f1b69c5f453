"""KV cache events for routers: a ZMQ publisher compatible with vLLM 0.33.0's.

Wire protocol (as `vllm.distributed.kv_events.ZmqEventPublisher`):

- PUB socket, three frames per batch: ``topic`` (utf-8), ``seq`` (8-byte big-endian,
  0, 1, 2, ... per batch) and the msgpack ``KVEventBatch`` payload;
- optional ROUTER replay socket: a request ``[identity, b"", start_seq (8B BE)]`` is
  answered with ``[identity, b"", topic, seq, payload]`` for every buffered batch with
  ``seq >= start_seq`` (the last ``buffer_steps`` batches), then the end marker
  ``[identity, b"", b"", (-1).to_bytes(8, "big", signed=True), b""]``.

Payloads use vLLM 0.33.0's event maps (``format="map"``) or the older tagged positional
arrays (``format="array"``); see `kvblocks._core.encode_event_batch`.

The scheduler thread calls `publish_from(manager)` each step (or `publish` /
`publish_events` with event objects): a non-blocking O(1) push into a bounded lock-free
queue (`kvblocks._core.EventSink`); when it is full the oldest batch is dropped and
counted. The publisher thread takes batches, numbers and encodes them in Rust
without the GIL, sends them and serves replay requests. `publish_snapshot` publishes the
whole cache so a late subscriber can rebuild its index: one batch, sequenced like any
other, of `AllBlocksCleared` followed by a `BlockStored` per cached block (parents first),
built from the publisher's mirror of the batches it has sent, so applying every batch in
order (snapshots included, any number of times) gives the publisher's cache exactly.
pyzmq is imported only when a publisher is created.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kvblocks._core import EventSink, InvalidArgumentError, encode_event_batch

if TYPE_CHECKING:
    import zmq

    from kvblocks._core import BlockPool, KVCacheManager

__all__ = ["END_SEQ", "ZmqEventPublisher", "encode_event_batch", "offset_endpoint_port"]

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The sequence frame that ends a replay."""

logger = logging.getLogger(__name__)


def offset_endpoint_port(endpoint: str | None, data_parallel_rank: int) -> str | None:
    """vLLM's per-rank endpoint: tcp port + rank (port 0 kept), ``_dp<rank>`` for inproc."""
    if not endpoint or data_parallel_rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{data_parallel_rank}"
    if "tcp" in endpoint:
        if ":" not in endpoint:
            return endpoint
        base, _, port = endpoint.rpartition(":")
        if int(port) == 0:
            return endpoint
        return f"{base}:{int(port) + data_parallel_rank}"
    raise InvalidArgumentError("Invalid endpoint: must contain 'inproc' or 'tcp'")


def _is_bind_endpoint(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqEventPublisher:
    """Publishes KV event batches over ZMQ, like vLLM's `ZmqEventPublisher`.

    Arguments match vLLM's; ``format`` picks the event encoding, ``bind`` overrides vLLM's
    bind-or-connect rule (``None``: bind wildcard/ipc/inproc endpoints, connect the rest).
    A bound tcp endpoint with port 0 gets an OS port; `endpoint` / `replay_endpoint`
    report the resolved addresses.
    """

    POLL_INTERVAL_S: float = 0.01
    SHUTDOWN_TIMEOUT_S: float = 1.0

    def __init__(
        self,
        data_parallel_rank: int = 0,
        endpoint: str = "tcp://*:5557",
        replay_endpoint: str | None = None,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        max_queue_size: int = 100_000,
        topic: str = "",
        *,
        format: str = "map",
        bind: bool | None = None,
    ) -> None:
        if buffer_steps < 0:
            raise InvalidArgumentError("buffer_steps must be >= 0")
        self._sink = EventSink(
            max_queue_size=max_queue_size, format=format, data_parallel_rank=data_parallel_rank
        )
        self._topic = topic.encode("utf-8")
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        # Bad arguments are refused above whether or not pyzmq (optional) is installed.
        import zmq

        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        endpoint_dp = offset_endpoint_port(endpoint, data_parallel_rank)
        assert endpoint_dp is not None
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            if bind if bind is not None else _is_bind_endpoint(endpoint_dp):
                self._endpoint = self._bind(self._pub, endpoint_dp)
            else:
                self._pub.connect(endpoint_dp)
                self._endpoint = endpoint_dp
            replay_dp = offset_endpoint_port(replay_endpoint, data_parallel_rank)
            self._replay_endpoint = replay_dp
            if replay_dp is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                # A full replay plus its end marker must fit (vLLM's 2 * (buffer_steps + 1)).
                self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
                self._replay_endpoint = self._bind(self._replay, replay_dp)
        except Exception:
            self._close_sockets()
            raise
        self._running = True
        self._thread = threading.Thread(
            target=self._run, daemon=True, name="kvblocks-zmq-publisher"
        )
        self._thread.start()

    @staticmethod
    def _bind(sock: zmq.Socket[bytes], endpoint: str) -> str:
        import zmq

        sock.bind(endpoint)
        if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
            return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))
        return endpoint

    @property
    def endpoint(self) -> str:
        """The PUB endpoint (resolved when bound to port 0)."""
        return self._endpoint

    @property
    def replay_endpoint(self) -> str | None:
        """The ROUTER replay endpoint, if any (resolved when bound to port 0)."""
        return self._replay_endpoint

    @property
    def sink(self) -> EventSink:
        """The queue and encoder behind this publisher."""
        return self._sink

    def publish(self, batch: Any) -> bool:
        """Queues a `KVEventBatch`-like object (``ts``, ``events``, ``data_parallel_rank``);
        ``False`` when the oldest queued batch was dropped to make room."""
        return self.publish_events(
            batch.events, ts=batch.ts, data_parallel_rank=batch.data_parallel_rank
        )

    def publish_events(
        self,
        events: Iterable[Any],
        ts: float | None = None,
        data_parallel_rank: int | None = None,
    ) -> bool:
        """Queues one batch of event objects without blocking (``ts`` defaults to now)."""
        if not self._running:
            raise RuntimeError("Publisher is closed")
        return self._sink.publish(events, ts, data_parallel_rank)

    def publish_from(self, source: KVCacheManager | BlockPool, ts: float | None = None) -> bool:
        """Moves the pending events of a `KVCacheManager` or `BlockPool` into the queue:
        O(1), no Python object per event, never blocks. ``False`` when the oldest queued
        batch was dropped to make room."""
        if not self._running:
            raise RuntimeError("Publisher is closed")
        return self._sink.publish_from(source, ts)

    def publish_snapshot(self) -> None:
        """Publishes the whole cache (`AllBlocksCleared`, then `BlockStored` per cached
        block, parents first), after the batches already taken. Refused (counted in
        ``stats()["snapshots_refused"]``) while dropped batches leave the publisher's cache
        mirror incomplete."""
        self._sink.request_snapshot()

    def stats(self) -> dict[str, int]:
        """Queue, drop, publish, snapshot and block counters."""
        return self._sink.stats()

    def shutdown(self) -> None:
        """Publishes what is queued (bounded wait), stops the thread, closes the sockets."""
        self._running = False
        self._sink.close()
        self._thread.join(timeout=self.SHUTDOWN_TIMEOUT_S)
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def _run(self) -> None:
        replay = self._replay
        while True:
            try:
                if replay is not None:
                    while replay.poll(0):
                        self._serve_replay(replay)
                item = self._sink.next_payload(self.POLL_INTERVAL_S)
                if item is None:
                    if self._sink.closed and self._sink.pending == 0:
                        break
                    continue
                seq, payload = item
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
                self._buffer.append((seq, payload))
            except Exception:
                if not self._running:
                    break
                # As vLLM: log, back off, keep serving (a batch that failed to send is lost).
                logger.exception("KV event publisher error")
                time.sleep(0.1)

    def _serve_replay(self, replay: zmq.Socket[bytes]) -> None:
        frames = replay.recv_multipart()
        if len(frames) != 3:
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in self._buffer:
            if seq >= start_seq:
                replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
        replay.send_multipart((client, b"", b"", END_SEQ, b""))
