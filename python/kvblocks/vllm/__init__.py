"""Run vLLM's own scheduler and request hashing on the kvblocks core (vLLM 0.32.x or 0.33.x,
each with its own rules: docs/vllm-versions.md).

`import kvblocks.vllm` imports no vLLM; the names below load it on first use.

    import kvblocks.vllm
    kvblocks.vllm.install()     # from here on vLLM's Scheduler builds kvblocks' manager,
                                # in this process and in the engine cores it spawns
    llm = vllm.LLM(...)
    kvblocks.vllm.manager_info(llm)["manager"]    # "kvblocks"

or, for a deployment without code, `KVBLOCKS_VLLM=1` in the environment of every vLLM
process (the `vllm.general_plugins` entry point calls `install()`).
"""

from __future__ import annotations

from typing import Any

from kvblocks.vllm._info import manager_info
from kvblocks.vllm._install import ENV_SWITCH, fallbacks, install, installed, uninstall

_LAZY = {
    "AssertedInputError": "kvblocks.vllm._manager",
    "KVCacheManager": "kvblocks.vllm._manager",
    "BlockPool": "kvblocks.vllm._manager",
    "UnsupportedConfigError": "kvblocks.vllm._config",
    "UnsupportedVLLMError": "kvblocks.vllm._drift",
    "get_request_block_hasher": "kvblocks.vllm._hashing",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvblocks.vllm' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "ENV_SWITCH",
    "AssertedInputError",
    "BlockPool",
    "KVCacheManager",
    "UnsupportedConfigError",
    "UnsupportedVLLMError",
    "fallbacks",
    "get_request_block_hasher",
    "install",
    "installed",
    "manager_info",
    "uninstall",
]
