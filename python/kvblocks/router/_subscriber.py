"""`Subscriber`: feeds a `KVIndex` from engines' ZMQ event publishers (vLLM's
`ZmqEventPublisher` or kvblocks' own), one SUB socket per engine.

Each message is ``[topic, seq (8B BE), payload]``; the payload goes to
`KVIndex.ingest` with its sequence number, which orders batches and reports the engine's
freshness. An engine added with a replay endpoint is caught up at once: the subscriber
subscribes, then asks for every batch from 0 (what its publisher still buffers), so the
batches sent before the subscription are not lost. When a gap opens (``catching_up``),
the subscriber asks the engine's replay socket (a ROUTER: ``[b"", start_seq]`` in,
``[b"", topic, seq, payload]`` out, ending with seq -1) for every batch from the first
missing one. If the replay cannot close the gap
(the engine has no replay socket, or its buffer no longer holds the batches), it gives the
gap up (`KVIndex.skip_gap`: the engine is ``stale``) and calls ``on_stale(engine_id)``,
where a deployment can make the engine publish a kvblocks snapshot
(`ZmqEventPublisher.publish_snapshot`), whose leading ``AllBlocksCleared`` makes it exact
again. A restarted engine (its sequence back to 0) is reset by the index itself. A hash
mismatch is logged as an error on every batch refused.

pyzmq is imported when the first engine is added.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvblocks._core import HashMismatchError, KVIndex

if TYPE_CHECKING:
    import zmq

__all__ = ["Subscriber"]

logger = logging.getLogger(__name__)

END_SEQ = -1


@dataclass
class _Engine:
    engine_id: str
    sub: zmq.Socket[bytes]
    replay_endpoint: str | None


class Subscriber:
    """Subscribes a `KVIndex` to engines' ZMQ publishers.

    Engines must be registered in the index (`KVIndex.add_engine`) before they are added
    here. Use `poll` from your own loop, or `start` a background thread (`stop` joins it).

    Args:
        index: The index to feed.
        replay_timeout_s: How long a replay may take before it is given up.
        on_stale: Called with an engine id when a gap could not be recovered.
    """

    def __init__(
        self,
        index: KVIndex,
        *,
        replay_timeout_s: float = 2.0,
        on_stale: Callable[[str], Any] | None = None,
    ) -> None:
        self.index = index
        self.replay_timeout_s = replay_timeout_s
        self.on_stale = on_stale
        self._engines: dict[str, _Engine] = {}
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._poller: zmq.Poller | None = None
        self._thread: threading.Thread | None = None
        #: Batches ingested from replays, by engine.
        self.replayed: dict[str, int] = {}
        self._running = threading.Event()
        self._lock = threading.Lock()

    def add(
        self, engine_id: str, endpoint: str, replay_endpoint: str | None = None, topic: str = ""
    ) -> None:
        """Subscribes to engine ``engine_id``'s publisher at ``endpoint`` (connect)."""
        import zmq

        self.index.status(engine_id)  # raises UnknownEngineError for an unregistered engine
        with self._lock:
            if self._ctx is None:
                self._ctx = zmq.Context()
                self._poller = zmq.Poller()
            sub = self._ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
            sub.setsockopt(zmq.RCVHWM, 100_000)
            sub.connect(endpoint)
            assert self._poller is not None
            self._poller.register(sub, zmq.POLLIN)
            e = _Engine(engine_id, sub, replay_endpoint)
            self._engines[engine_id] = e
            self.replayed[engine_id] = 0
            if replay_endpoint is not None:
                self._replay(e)

    def remove(self, engine_id: str) -> None:
        """Unsubscribes from engine ``engine_id`` (the index keeps it)."""
        with self._lock:
            e = self._engines.pop(engine_id)
            assert self._poller is not None
            self._poller.unregister(e.sub)
            e.sub.close(linger=0)

    def poll(self, timeout_ms: int = 0) -> int:
        """Ingests the messages that arrive within ``timeout_ms``; returns how many."""
        with self._lock:
            if self._poller is None:
                return 0
            ready = dict(self._poller.poll(timeout_ms))
            n = 0
            for e in list(self._engines.values()):
                if e.sub not in ready:
                    continue
                while True:
                    try:
                        frames = e.sub.recv_multipart(flags=1)  # zmq.NOBLOCK
                    except Exception:
                        break
                    if len(frames) == 3:
                        self._ingest(e, int.from_bytes(frames[1], "big"), frames[2])
                        n += 1
            return n

    def _ingest(self, e: _Engine, seq: int, payload: bytes) -> None:
        try:
            _, freshness = self.index.ingest(e.engine_id, payload, seq)
        except HashMismatchError as err:
            logger.error("kvblocks router: engine %s: %s", e.engine_id, err)
            return
        if freshness == "catching_up" and self.index.status(e.engine_id)["held"] > 0:
            self._recover(e)

    def _recover(self, e: _Engine) -> None:
        """Replays the gap from the engine's replay socket; gives it up if that fails."""
        if e.replay_endpoint is not None:
            self._replay(e)
        status = self.index.status(e.engine_id)
        if status["freshness"] == "catching_up" and status["held"] > 0:
            logger.warning(
                "kvblocks router: engine %s: gap after seq %s not recoverable; stale until "
                "its next AllBlocksCleared",
                e.engine_id,
                status["last_seq"],
            )
            self.index.skip_gap(e.engine_id)
            if self.on_stale is not None:
                self.on_stale(e.engine_id)

    def _replay(self, e: _Engine) -> None:
        import zmq

        assert self._ctx is not None and e.replay_endpoint is not None
        last = self.index.status(e.engine_id)["last_seq"]
        start = 0 if last is None else last + 1
        dealer = self._ctx.socket(zmq.DEALER)
        try:
            dealer.connect(e.replay_endpoint)
            dealer.send_multipart((b"", start.to_bytes(8, "big")))
            timeout_ms = int(self.replay_timeout_s * 1000)
            while dealer.poll(timeout_ms):
                frames = dealer.recv_multipart()
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq == END_SEQ:
                    break
                self.index.ingest(e.engine_id, frames[-1], seq)
                self.replayed[e.engine_id] += 1
        except HashMismatchError as err:
            logger.error("kvblocks router: engine %s: %s", e.engine_id, err)
        finally:
            dealer.close(linger=0)

    def start(self, poll_ms: int = 20) -> None:
        """Polls in a background thread until `stop`."""
        self._running.set()

        def run() -> None:
            while self._running.is_set():
                self.poll(poll_ms)

        self._thread = threading.Thread(target=run, name="kvblocks-router-subscriber", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the background thread and closes the sockets."""
        self._running.clear()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            for e in self._engines.values():
                e.sub.close(linger=0)
            self._engines.clear()
            if self._ctx is not None:
                self._ctx.term()
                self._ctx = None
                self._poller = None

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
