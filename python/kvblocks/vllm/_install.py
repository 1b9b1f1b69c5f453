"""`install()` / `uninstall()`: vLLM's scheduler and engine core on kvblocks, and the
`vllm.general_plugins` entry point that installs when `KVBLOCKS_VLLM=1`."""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any

logger = logging.getLogger("kvblocks.vllm")

#: The environment variable that makes the vLLM plugin call `install()`.
ENV_SWITCH = "KVBLOCKS_VLLM"
#: The environment variable holding the plugin's retention policy, as a spec
#: (`kvblocks.retention_spec`; docs/retention.md), e.g. `session=30;quota=burst:0`.
ENV_RETENTION = "KVBLOCKS_VLLM_RETENTION"

# (module, attribute) -> vLLM's own object, while installed.
_saved: dict[tuple[str, str], Any] = {}

#: Why each manager that fell back to vLLM's own was refused (with `fallback=True`).
fallbacks: list[str] = []


_TARGETS = (
    ("vllm.v1.core.sched.scheduler", "KVCacheManager"),
    ("vllm.v1.core.kv_cache_utils", "get_request_block_hasher"),
    ("vllm.v1.engine.core", "get_request_block_hasher"),
)


def _replacement(module: str, name: str) -> Any:
    """The kvblocks object that stands in for vLLM's `module.name` (saved in `_saved`)."""
    if name == "KVCacheManager":
        return _manager_factory
    from kvblocks.vllm._hashing import with_fallback
    from kvblocks.vllm._version_rules import rules

    # vLLM accepts any hash function here (its own tests pass the built-in `hash`):
    # kvblocks hashes vLLM's four algorithms and hands any other back to vLLM.
    return with_fallback(_saved[(module, name)], hash_lookahead=rules().hash_lookahead)


_fallback = True
_retention: Any = None


def _manager_factory(*args: Any, **kwargs: Any) -> Any:
    """Builds kvblocks' manager; for a configuration kvblocks refuses, vLLM's own (with a
    warning) when installed with `fallback=True`, else the refusal propagates.

    The arguments are bound to the installed vLLM's own `KVCacheManager.__init__`
    first: its parameters differ between releases (0.32 has no
    `num_hash_lookahead_tokens`, so positions after `use_eagle` shift), and a call it
    would refuse raises the same `TypeError`.
    """
    from kvblocks.vllm._config import UnsupportedConfigError
    from kvblocks.vllm._manager import KVCacheManager

    theirs = _saved[("vllm.v1.core.sched.scheduler", "KVCacheManager")]
    named = inspect.signature(theirs).bind(*args, **kwargs).arguments
    try:
        return KVCacheManager(**named, retention=_retention)
    except UnsupportedConfigError as e:
        if not _fallback:
            raise
        fallbacks.append(str(e))
        logger.warning("kvblocks cannot serve this KV cache configuration (%s); using vLLM's", e)
        return theirs(*args, **kwargs)


def install(*, fallback: bool = True, retention: Any = None) -> None:
    """From now on, vLLM's `Scheduler` and `AsyncScheduler` in this process build
    kvblocks' `KVCacheManager`, and vLLM's engine core hashes requests with kvblocks'
    hasher. Idempotent.

    Args:
        fallback: for a configuration kvblocks cannot serve (a spec type it lacks, say),
            log a warning and build vLLM's own manager (True), or raise
            `UnsupportedConfigError` from the scheduler's constructor (False).
        retention: a `kvblocks.RetentionPolicy` for the managers built from now on
            (docs/retention.md): vLLM's request `priority` maps to a class, its
            `session_id` to session retention, its `cache_salt` (else LoRA) to a tenant.
            None keeps vLLM's eviction order.
    """
    import importlib

    global _fallback, _retention
    _fallback = fallback
    _retention = retention
    modules = {m: importlib.import_module(m) for m, _ in _TARGETS}
    for module, name in _TARGETS:
        if (module, name) not in _saved:
            _saved[(module, name)] = getattr(modules[module], name)
    for module, name in _TARGETS:
        setattr(modules[module], name, _replacement(module, name))


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
    otherwise. `KVBLOCKS_VLLM_RETENTION` (a spec such as `session=30`) sets the
    retention policy; a bad spec raises `SpecError` (a `ValueError`) naming it."""
    if os.environ.get(ENV_SWITCH, "").strip().lower() in ("1", "true", "yes", "on"):
        spec = os.environ.get(ENV_RETENTION, "").strip()
        retention = None
        if spec:
            from kvblocks.retention_spec import parse_retention

            retention = parse_retention(spec).build()
        install(retention=retention)
