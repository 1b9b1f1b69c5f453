"""`install()` / `uninstall()`: vLLM's scheduler and engine core on kvblocks, and the
`vllm.general_plugins` entry point that installs when `KVBLOCKS_VLLM=1`."""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger("kvblocks.vllm")

#: The environment variable that makes the vLLM plugin call `install()`.
ENV_SWITCH = "KVBLOCKS_VLLM"

# (module, attribute) -> vLLM's own object, while installed.
_saved: dict[tuple[str, str], Any] = {}

#: Why each manager that fell back to vLLM's own was refused (with `fallback=True`).
fallbacks: list[str] = []


def _targets() -> dict[tuple[str, str], Any]:
    """What `install()` replaces, with the kvblocks object for each."""
    from kvblocks.vllm._hashing import get_request_block_hasher

    return {
        ("vllm.v1.core.sched.scheduler", "KVCacheManager"): _manager_factory,
        ("vllm.v1.core.kv_cache_utils", "get_request_block_hasher"): get_request_block_hasher,
        ("vllm.v1.engine.core", "get_request_block_hasher"): get_request_block_hasher,
    }


_fallback = True


def _manager_factory(*args: Any, **kwargs: Any) -> Any:
    """Builds kvblocks' manager; for a configuration kvblocks refuses, vLLM's own (with a
    warning) when installed with `fallback=True`, else the refusal propagates."""
    from kvblocks.vllm._config import UnsupportedConfigError
    from kvblocks.vllm._manager import KVCacheManager

    try:
        return KVCacheManager(*args, **kwargs)
    except UnsupportedConfigError as e:
        if not _fallback:
            raise
        fallbacks.append(str(e))
        logger.warning("kvblocks cannot serve this KV cache configuration (%s); using vLLM's", e)
        return _saved[("vllm.v1.core.sched.scheduler", "KVCacheManager")](*args, **kwargs)


def install(*, fallback: bool = True) -> None:
    """From now on, vLLM's `Scheduler` and `AsyncScheduler` in this process build
    kvblocks' `KVCacheManager`, and vLLM's engine core hashes requests with kvblocks'
    hasher. Idempotent.

    Args:
        fallback: for a configuration kvblocks cannot serve (a spec type it lacks, say),
            log a warning and build vLLM's own manager (True), or raise
            `UnsupportedConfigError` from the scheduler's constructor (False).
    """
    import importlib

    global _fallback
    _fallback = fallback
    for (module, name), ours in _targets().items():
        mod = importlib.import_module(module)
        if (module, name) not in _saved:
            _saved[(module, name)] = getattr(mod, name)
        setattr(mod, name, ours)


def uninstall() -> None:
    """Puts vLLM's own objects back. A no-op if not installed."""
    import importlib

    for (module, name), theirs in list(_saved.items()):
        setattr(importlib.import_module(module), name, theirs)
        del _saved[(module, name)]


def installed() -> bool:
    """Whether `install()` is in effect."""
    return bool(_saved)


def plugin() -> None:
    """vLLM general plugin (entry point `vllm.general_plugins`): installs kvblocks in
    this vLLM process when `KVBLOCKS_VLLM` is set to 1 / true / yes, and does nothing
    otherwise."""
    if os.environ.get(ENV_SWITCH, "").strip().lower() in ("1", "true", "yes", "on"):
        install()
