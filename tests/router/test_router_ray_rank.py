"""`KVRouter`'s ranking without a cluster: stand-in replicas announce themselves, engines'
events are fed to its index by hand, and its answers to Ray are checked (needs
``ray[serve]``; skipped without it)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

import kvblocks as kb
import pytest
from test_router_plain_config import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

pytest.importorskip("ray.serve")

from kvblocks.router.ray import KVRouter
from kvblocks.vllm._config import config_from_plain, plain_config

BLOCK = 32
PLAIN = plain_config(KVCacheConfig(48, [KVCacheGroupSpec(["l0"], FullAttentionSpec())]))


@dataclass(frozen=True)
class ReplicaID:
    unique_id: str


@dataclass
class Replica:
    replica_id: ReplicaID
    routing_stats: dict[str, Any]


@dataclass
class Metadata:
    request_id: str
    internal_request_id: str


@dataclass
class Pending:
    kwargs: dict[str, Any]
    metadata: Metadata
    args: list[Any] = field(default_factory=list)


def replica(name: str) -> Replica:
    stats = {
        "endpoint": "tcp://127.0.0.1:9",  # nothing listens: the test feeds the index itself
        "replay_endpoint": None,
        "kv_cache_config": PLAIN,
        "max_model_len": 1024,
        "hash_block_size": BLOCK,
        "hash_algo": "sha256_cbor",
        "python_hash_seed": os.environ.get("PYTHONHASHSEED"),
    }
    return Replica(ReplicaID(name), {"kvblocks": stats})


def pending(tokens: Any, rid: str = "r") -> Pending:
    return Pending({"request_token_ids": tokens}, Metadata(rid, rid + "-internal"))


def fleet(**kwargs: Any) -> tuple[KVRouter, list[Replica]]:
    """A router over replicas a (holds a 100-token prompt), b (empty) and c (a gap: not
    exact)."""
    router = object.__new__(KVRouter)  # Ray's constructor needs a cluster
    router._replicas = {}
    router.initialize_state(seed=0, **kwargs)
    replicas = [replica(n) for n in "abc"]
    router._replicas = {r.replica_id: r for r in replicas}
    router._sync()
    mgr = kb.KVCacheManager(config_from_plain(PLAIN), 1024, BLOCK, enable_kv_cache_events=True)
    hasher = kb.BlockHasher(BLOCK, "sha256_cbor")
    mgr.allocate_slots(kb.Request("r0", list(range(100)), hasher), 100)
    router.index.ingest("a", kb.encode_event_batch(0.0, mgr.take_events()), 0)
    router.index.ingest("c", kb.encode_event_batch(0.0, []), 5)
    return router, replicas


def choose(router: KVRouter, replicas: list[Replica], req: Pending | None) -> list[list[str]]:
    """The router's ranks for `req`, as replica names."""
    ranks = asyncio.run(router.choose_replicas(replicas, req))
    return [[r.replica_id.unique_id for r in rank] for rank in ranks]


def test_dynamo_cost_ranks_exact_replicas_and_lets_the_rest_compete_on_load() -> None:
    router, replicas = fleet()
    try:
        assert router.index.status("c")["freshness"] == "catching_up"
        # a holds 3 of the 4 blocks; c is not exact: by its queue, beside the best.
        assert choose(router, replicas, pending(list(range(128)))) == [["a", "c"], ["b"]]
        assert choose(router, replicas, pending(None)) == [["a", "b", "c"]]
        assert choose(router, replicas, pending(["x"])) == [["a", "b", "c"]]
    finally:
        router.shutdown()


def test_the_threshold_rule_and_the_tokenize_hook() -> None:
    router, replicas = fleet(load_weight=0, tokenize=lambda pr: pr.args[0])
    try:
        req = Pending({}, Metadata("t", "t-internal"), [list(range(128))])
        assert choose(router, replicas, req) == [["a", "c"], ["b"]]
        # 3 of 20 blocks is below 0.3: the least loaded, the longer hit listed first.
        req = Pending({}, Metadata("u", "u-internal"), [list(range(100)) + [7] * 540])
        (rank,) = choose(router, replicas, req)
        assert rank[0] == "a" and sorted(rank) == ["a", "b", "c"]
    finally:
        router.shutdown()


def test_routes_active_blocks_and_a_dropped_replica() -> None:
    router, replicas = fleet()
    try:
        req = pending(list(range(128)), "q")
        choose(router, replicas, req)
        router.on_request_routed(req, replicas[0].replica_id, None)
        (route,) = router.routes
        assert (route.replica, route.freshness, route.predicted_tokens) == ("a", "exact", 96)
        assert router.active_blocks("a") == 4
        router.on_request_completed(replicas[0].replica_id, "q-internal")
        assert router.active_blocks("a") == 0
        assert router.announced("a") == replicas[0].routing_stats["kvblocks"]
        del router._replicas[replicas[0].replica_id]
        router._sync()
        assert sorted(router.index.engines()) == ["b", "c"]
        assert router.announced("a") is None
    finally:
        router.shutdown()


@pytest.mark.parametrize(
    "kwargs",
    [{"load_weight": -1}, {"cache_threshold": 2}, {"tokenize": "no"}, {"max_routes": 0}],
)
def test_bad_router_options_are_refused(kwargs: dict[str, Any]) -> None:
    router = object.__new__(KVRouter)
    with pytest.raises(kb.InvalidArgumentError):
        router.initialize_state(**kwargs)
