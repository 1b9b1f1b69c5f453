"""`KVRouter`: a Ray Serve request router that ranks replicas by what kvblocks' `KVIndex`
says each one's vLLM engine holds (docs/router.md, "Ray Serve").

    from ray import serve
    from ray.serve.config import RequestRouterConfig
    from kvblocks.router.ray import KVRouter
    from kvblocks.router.ray_replica import VLLMReplica

    app = serve.deployment(
        VLLMReplica,
        num_replicas=2,
        request_router_config=RequestRouterConfig(
            request_router_class=KVRouter,
            request_router_kwargs={"load_weight": 1.0},
            request_routing_stats_period_s=1.0,
        ),
    ).bind(model_dir)
    handle = serve.run(app)
    handle.generate.remote(request_token_ids=[...], max_tokens=16).result()

Each replica announces in its routing stats (`VLLMReplica.record_routing_stats`, under
``"kvblocks"``) its KV event and replay endpoints, its KV cache layout, its hashing and its
active blocks. The router registers every replica that announces itself in its index
(named by the replica's id, `ReplicaID.unique_id`) as started empty, subscribes to its
events (`Subscriber`: batches sent before the subscription come back from the replay
socket), and drops it from both when Ray drops the replica (dead or scaled down).

A request's prompt tokens are its ``request_token_ids`` keyword (as Ray Serve LLM passes
them to its router), or what the ``tokenize`` hook returns for the `PendingRequest`.
Among the replicas whose index state is ``exact``, each gets a score
(`kvblocks.router._policy.route_scores`, the rules the simulated fleet uses):

- ``load_weight > 0`` (default 1): Dynamo's cost, ``the request's blocks the replica does
  not hold + load_weight * its active blocks``, lowest first. Active blocks are, as
  Dynamo's router counts them, the prompt blocks of the requests this router sent the
  replica that have not completed (`active_blocks`): never stale, where the replica's own
  announcement lags by up to a stats period (a finished request still counted there
  pushed follow-up turns off their cache: hit rate 0.60 instead of 0.72 in the test);
- ``load_weight = 0``: SGLang's cache-threshold rule: the longest hit first when it covers
  more than ``cache_threshold`` of the request's blocks, else the least loaded.

The answer is Ray's ranks, best first; within a rank Ray takes the replica with the
shortest queue that accepts the request, so equal scores go to the least loaded (ties in
random order). A replica that is not ``exact`` (not announced yet, catching up, stale,
mismatched) falls back to its queue length alone: it joins the first rank, after the
best-scored ones. A request without tokens, or a fleet without an exact replica, goes to
the least loaded replica (every replica in one rank).

`routes` keeps, per routed request, the replica and the hit the index predicted there.
Importing this module needs ``ray[serve]`` (``pip install 'kvblocks[ray]'``) and pyzmq.
"""

from __future__ import annotations

import logging
import random
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

try:
    from ray.serve.request_router import RequestRouter
except ImportError:
    raise ModuleNotFoundError(
        "kvblocks.router.ray needs ray[serve], which is not installed: pip install 'kvblocks[ray]'",
        name="ray",
    ) from None

from kvblocks._core import EngineHit, InvalidArgumentError, KVIndex
from kvblocks.router._policy import (
    DEFAULT_CACHE_THRESHOLD,
    DEFAULT_KV_AWARE_WEIGHT,
    route_scores,
)
from kvblocks.router._subscriber import Subscriber
from kvblocks.router.ray_replica import STATS_KEY
from kvblocks.vllm._config import config_from_plain

__all__ = ["TOKENS_KWARG", "KVRouter", "Route", "routers"]

logger = logging.getLogger(__name__)

TOKENS_KWARG = "request_token_ids"
"""The keyword argument that carries a request's prompt token ids (Ray Serve LLM's)."""

_PENDING_MAX = 4096

_LIVE: list[weakref.ref[KVRouter]] = []


def routers() -> list[KVRouter]:
    """The `KVRouter`s alive in this process (one per deployment handle that routed)."""
    live = [r for r in (ref() for ref in _LIVE) if r is not None]
    _LIVE[:] = [weakref.ref(r) for r in live]
    return live


@dataclass(frozen=True)
class Route:
    """Where one request went and what the index predicted there."""

    request_id: str
    #: The replica's id (`ReplicaID.unique_id`), the engine's name in the index.
    replica: str
    #: The replica's freshness when the request was ranked (``"unindexed"``: not
    #: registered, or the request had no tokens).
    freshness: str
    #: The GPU tokens the index predicted the replica would hit; None unless ``exact``.
    predicted_tokens: int | None


class KVRouter(RequestRouter):  # type: ignore[misc]
    """Ray Serve request router on kvblocks' index (module docs)."""

    def initialize_state(
        self,
        *,
        load_weight: float = DEFAULT_KV_AWARE_WEIGHT,
        cache_threshold: float = DEFAULT_CACHE_THRESHOLD,
        tokenize: Callable[[Any], Sequence[int] | None] | None = None,
        replay_timeout_s: float = 2.0,
        max_routes: int = 10_000,
        seed: int | None = None,
    ) -> None:
        """Ray Serve calls this with `RequestRouterConfig.request_router_kwargs`.

        Args:
            load_weight: Dynamo's weight of active blocks; 0 = the cache-threshold rule.
            cache_threshold: The threshold rule's share of a request's blocks.
            tokenize: Returns a `PendingRequest`'s prompt token ids (None: route by load);
                by default its ``request_token_ids`` keyword.
            replay_timeout_s: How long a replica's replay may take (`Subscriber`).
            max_routes: How many `routes` are kept.
            seed: Seeds the order of equal scores.
        """
        route_scores(
            [], 0, load_weight=load_weight, cache_threshold=cache_threshold, active_blocks=[]
        )
        if tokenize is not None and not callable(tokenize):
            raise InvalidArgumentError(f"tokenize must be callable, got {tokenize!r}")
        if max_routes < 1 or replay_timeout_s <= 0:
            raise InvalidArgumentError("max_routes must be >= 1 and replay_timeout_s > 0")
        self.load_weight = float(load_weight)
        self.cache_threshold = float(cache_threshold)
        self.tokenize = tokenize
        self.index = KVIndex()
        self.subscriber = Subscriber(self.index, replay_timeout_s=replay_timeout_s)
        self.subscriber.start()
        #: Per routed request: the replica and the index's prediction there.
        self.routes: deque[Route] = deque(maxlen=max_routes)
        self._stats: dict[str, dict[str, Any]] = {}
        self._pending: dict[str, tuple[dict[str, EngineHit], int]] = {}
        #: Blocks of the requests this router sent and that have not completed, by
        #: replica, and the replica and blocks of each such request.
        self._active: dict[str, int] = {}
        self._in_flight: dict[str, tuple[str, int]] = {}
        self._rng = random.Random(seed)
        # Ray pickles this module by value into every router it makes
        # (`RequestRouterConfig`), so the registry is the imported module's, not this copy's.
        import kvblocks.router.ray as module

        module._LIVE.append(weakref.ref(self))

    # Replicas: registered when they announce themselves, dropped when Ray drops them.

    def update_replicas(self, replicas: list[Any]) -> None:
        super().update_replicas(replicas)
        self._sync()

    def on_replica_actor_died(self, replica_id: Any) -> None:
        super().on_replica_actor_died(replica_id)
        self._sync()

    def _sync(self) -> None:
        if not hasattr(self, "_stats"):  # before initialize_state
            return
        live = {r.replica_id.unique_id: r for r in self.curr_replicas.values()}
        for engine in [e for e in self._stats if e not in live]:
            self._drop(engine)
        for engine, replica in live.items():
            stats = (replica.routing_stats or {}).get(STATS_KEY)
            if not isinstance(stats, dict):
                continue
            if engine in self._stats:
                self._stats[engine] = stats
            else:
                self._register(engine, stats)

    def _register(self, engine: str, stats: dict[str, Any]) -> None:
        try:
            self.index.add_engine(
                engine,
                config_from_plain(stats["kv_cache_config"]),
                max_model_len=int(stats["max_model_len"]),
                hash_block_size=int(stats["hash_block_size"]),
                hash_algo=str(stats["hash_algo"]),
                python_hash_seed=stats.get("python_hash_seed"),
                # A replica's engine starts empty and numbers its batches from 0; those
                # sent before this subscription come back from its replay socket.
                started_empty=True,
            )
        except Exception:
            logger.exception("kvblocks router: replica %s announced a bad layout", engine)
            return
        try:
            self.subscriber.add(engine, str(stats["endpoint"]), stats.get("replay_endpoint"))
        except Exception:
            logger.exception("kvblocks router: cannot subscribe to replica %s", engine)
            self.index.remove_engine(engine)
            return
        self._stats[engine] = stats
        logger.info("kvblocks router: indexing replica %s", engine)

    def _drop(self, engine: str) -> None:
        del self._stats[engine]
        self._active.pop(engine, None)
        try:
            self.subscriber.remove(engine)
        except KeyError:
            pass
        self.index.remove_engine(engine)
        logger.info("kvblocks router: replica %s dropped from the index", engine)

    # Ranking.

    def _tokens(self, pending_request: Any) -> list[int] | None:
        if pending_request is None:
            return None
        if self.tokenize is not None:
            tokens = self.tokenize(pending_request)
        else:
            tokens = (pending_request.kwargs or {}).get(TOKENS_KWARG)
        if tokens is None:
            return None
        try:
            return [int(t) for t in tokens]
        except (TypeError, ValueError):
            logger.warning("kvblocks router: request tokens are not token ids; routing by load")
            return None

    async def choose_replicas(
        self, candidate_replicas: list[Any], pending_request: Any = None
    ) -> list[list[Any]]:
        self._sync()
        tokens = self._tokens(pending_request)
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        indexed = [e for e in by_id if e in self._stats]
        hits = self.index.hits(tokens, engines=indexed) if tokens and indexed else {}
        if pending_request is not None:
            self._remember(pending_request.metadata.request_id, hits, len(tokens or ()))
        exact = [e for e in indexed if e in hits and hits[e].freshness == "exact"]
        if not exact:
            return [list(candidate_replicas)]
        others = [by_id[e] for e in by_id if e not in exact]
        assert tokens is not None
        block = hits[exact[0]].block_size
        match = [hits[e].gpu_tokens // block for e in exact]
        active = [float(self._active.get(e, 0)) for e in exact]
        scores = route_scores(
            match,
            len(tokens) // block,
            load_weight=self.load_weight,
            cache_threshold=self.cache_threshold,
            active_blocks=active if self.load_weight > 0 else None,
        )
        tie = {e: self._rng.random() for e in exact}
        if scores is None:  # least loaded; the longer hit first among equal queues
            order = sorted(range(len(exact)), key=lambda i: (-match[i], tie[exact[i]]))
            return [[by_id[exact[i]] for i in order] + others]
        ranks: list[list[Any]] = []
        last: float | None = None
        for i in sorted(range(len(exact)), key=lambda i: (scores[i], tie[exact[i]])):
            if scores[i] != last:
                ranks.append([])
                last = scores[i]
            ranks[-1].append(by_id[exact[i]])
        ranks[0].extend(others)
        return ranks

    def _remember(self, request_id: str, hits: dict[str, EngineHit], num_tokens: int) -> None:
        self._pending.pop(request_id, None)
        self._pending[request_id] = (hits, num_tokens)
        while len(self._pending) > _PENDING_MAX:
            del self._pending[next(iter(self._pending))]

    def on_request_routed(self, pending_request: Any, replica_id: Any, result: Any) -> None:
        engine = replica_id.unique_id
        request_id = pending_request.metadata.request_id
        hits, num_tokens = self._pending.pop(request_id, ({}, 0))
        hit = hits.get(engine)
        if hit is None:
            self.routes.append(Route(request_id, engine, "unindexed", None))
            return
        exact = hit.freshness == "exact"
        self.routes.append(
            Route(request_id, engine, hit.freshness, hit.gpu_tokens if exact else None)
        )
        blocks = -(-num_tokens // hit.block_size)
        self._in_flight[pending_request.metadata.internal_request_id] = (engine, blocks)
        self._active[engine] = self._active.get(engine, 0) + blocks

    def on_request_completed(self, replica_id: Any, internal_request_id: str) -> None:
        engine, blocks = self._in_flight.pop(internal_request_id, ("", 0))
        if engine in self._active:
            self._active[engine] -= blocks

    def announced(self, replica: str) -> dict[str, Any] | None:
        """What ``replica`` last announced (its routing stats' ``"kvblocks"``), if it is
        indexed."""
        return self._stats.get(replica)

    def active_blocks(self, replica: str) -> int:
        """The prompt blocks of the requests this router sent to ``replica`` that have not
        completed: the load term of Dynamo's cost."""
        return self._active.get(replica, 0)

    def shutdown(self) -> None:
        """Stops the event subscription (the index stays readable)."""
        self.subscriber.stop()
        import kvblocks.router.ray as module

        module._LIVE[:] = [ref for ref in module._LIVE if ref() not in (None, self)]
