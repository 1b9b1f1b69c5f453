"""The router's index: what every engine of a fleet caches, fed by the engines' KV event
streams, answering for a request how many leading tokens each engine would hit now, with
the engine's own rules (docs/router.md).

`KVIndex` is the Rust index (`kvblocks._core`); `Subscriber` feeds it from the engines'
ZMQ publishers (needs pyzmq), recovering gaps from their replay sockets; `RouterMetrics`
exports each engine's freshness and stream counters to Prometheus. `kvblocks.router.ray`
(optional: ``pip install 'kvblocks[ray]'``, imported only when asked for) routes a Ray
Serve deployment on the index.
"""

from __future__ import annotations

from kvblocks._core import (
    EngineHit,
    HashMismatchError,
    InvalidEventError,
    KVIndex,
    UnknownEngineError,
)
from kvblocks.router._metrics import RouterMetrics
from kvblocks.router._subscriber import Subscriber

__all__ = [
    "EngineHit",
    "HashMismatchError",
    "InvalidEventError",
    "KVIndex",
    "RouterMetrics",
    "Subscriber",
    "UnknownEngineError",
]
