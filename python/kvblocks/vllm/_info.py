"""`manager_info()`: which KV cache manager a vLLM engine runs, asked from the parent.

vLLM builds its scheduler, and so its KV cache manager, in the engine core, which runs in
the caller's process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) or, by default, in a process
vLLM spawns. `install()` adds `engine_core_info` to vLLM's `EngineCore` class as the
method `UTILITY` in every process it runs in; vLLM's client of a spawned engine core calls
engine-core methods by name (`call_utility`), so the parent can ask the child.
"""

from __future__ import annotations

import os
from typing import Any

import kvblocks

#: The name of the method `install()` adds to vLLM's `EngineCore`.
UTILITY = "kvblocks_manager_info"


def engine_core_info(engine_core: Any) -> dict[str, Any]:
    """`manager_info()`'s answer, computed in the engine core's own process.

    Args:
        engine_core: vLLM's `EngineCore` (bound as its method `UTILITY`).

    Returns:
        The dict `manager_info()` documents.
    """
    import vllm

    from kvblocks.vllm import _install
    from kvblocks.vllm._manager import KVCacheManager

    manager = engine_core.scheduler.kv_cache_manager
    cls = type(manager)
    return {
        "manager": "kvblocks" if isinstance(manager, KVCacheManager) else "vllm",
        "manager_class": f"{cls.__module__}.{cls.__qualname__}",
        "kvblocks_version": kvblocks.__version__,
        "vllm_version": str(vllm.__version__),
        "pid": os.getpid(),
        "installed": _install.installed(),
        "fallbacks": list(_install.fallbacks),
    }


def manager_info(llm: Any) -> dict[str, Any]:
    """Which KV cache manager the scheduler of a vLLM engine runs, kvblocks' or vLLM's,
    asked from the process that made the engine: the engine core may run in that process
    or in one vLLM spawned.

        llm = vllm.LLM(model=...)
        kvblocks.vllm.manager_info(llm)["manager"]    # "kvblocks" or "vllm"

    A spawned engine core answers through vLLM's utility calls. Where kvblocks was never
    installed in it (neither `install()` in the parent before the engine was made nor
    `KVBLOCKS_VLLM=1`), it has no such method and vLLM logs the failed call there; the
    answer is then "vllm", with `manager_class` and `pid` None, since only `install()`
    makes vLLM's scheduler build kvblocks' manager.

    Args:
        llm: a `vllm.LLM`, or its `LLMEngine` (`llm.llm_engine`).

    Returns:
        A plain dict:
        `manager`: "kvblocks" or "vllm";
        `manager_class`: the manager's class, `module.qualname`;
        `kvblocks_version`, `vllm_version`: as installed where the engine core runs;
        `pid`: the engine core's process id (the caller's own for an in-process core);
        `installed`: whether `install()` is in effect in that process;
        `fallbacks`: why each manager built there fell back to vLLM's (`fallback=True`).

    Raises:
        kvblocks.InvalidTypeError: `llm` is neither, or its engine core client cannot be
            asked synchronously (`AsyncLLM`'s).
    """
    engine = getattr(llm, "llm_engine", llm)
    client = getattr(engine, "engine_core", None)
    in_process = getattr(client, "engine_core", None)
    if in_process is not None:
        return engine_core_info(in_process)
    call = getattr(client, "call_utility", None)
    if call is None:
        raise kvblocks.InvalidTypeError(
            f"manager_info() takes a vllm.LLM or its LLMEngine, got {type(llm).__name__}"
        )
    try:
        info: dict[str, Any] = call(UTILITY)
    except Exception as e:
        if f"has no attribute '{UTILITY}'" not in str(e):
            raise
        import vllm

        info = {
            "manager": "vllm",
            "manager_class": None,
            "kvblocks_version": kvblocks.__version__,
            "vllm_version": str(vllm.__version__),
            "pid": None,
            "installed": False,
            "fallbacks": [],
        }
    return info
