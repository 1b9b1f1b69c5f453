"""`install()` / `uninstall()`: vLLM's scheduler and engine core on kvblocks, and the
`vllm.general_plugins` entry point that installs when `KVBLOCKS_VLLM=1`.

vLLM builds its scheduler in the engine-core process, which it usually spawns: a spawned
child does not inherit the parent's patched modules. So `install()` also writes its
switch and options into the environment, which the child inherits, and vLLM's loading of
general plugins in the child (`EngineCore.__init__`) installs kvblocks there the same way.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
from typing import Any

from kvblocks import InvalidArgumentError, InvalidTypeError, RetentionPolicy, UnsupportedError
from kvblocks.vllm._info import UTILITY, engine_core_info

logger = logging.getLogger("kvblocks.vllm")

#: The environment variable that makes the vLLM plugin call `install()`.
ENV_SWITCH = "KVBLOCKS_VLLM"
#: The environment variable holding the plugin's retention policy, as a spec
#: (`kvblocks.retention_spec`; docs/retention.md), e.g. `session=30;quota=burst:0`.
ENV_RETENTION = "KVBLOCKS_VLLM_RETENTION"
#: The environment variable holding the plugin's `fallback` option (`0`: refuse loudly).
ENV_FALLBACK = "KVBLOCKS_VLLM_FALLBACK"
_ENV = (ENV_SWITCH, ENV_FALLBACK, ENV_RETENTION)
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

# The environment's values of `_ENV` before `install()` wrote them, while installed.
_saved_env: dict[str, str | None] = {}

# (module, attribute) -> vLLM's own object, while installed.
_saved: dict[tuple[str, str], Any] = {}

#: Why each manager that fell back to vLLM's own was refused, and why each `install()`
#: the drift guard refused left vLLM untouched (with `fallback=True`).
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
    from kvblocks.vllm._manager import KVCacheManager

    _follow_vllm_logging()
    theirs = _saved[("vllm.v1.core.sched.scheduler", "KVCacheManager")]
    named = inspect.signature(theirs).bind(*args, **kwargs).arguments
    try:
        manager = KVCacheManager(**named, retention=_retention)
    except UnsupportedError as e:  # UnsupportedConfigError, or a refusal of the core
        if not _fallback:
            raise
        fallbacks.append(str(e))
        logger.warning("kvblocks cannot serve this KV cache configuration (%s); using vLLM's", e)
        return theirs(*args, **kwargs)
    import vllm

    import kvblocks

    logger.info(
        "kvblocks %s KV cache manager in use (vLLM %s)", kvblocks.__version__, vllm.__version__
    )
    return manager


def _follow_vllm_logging() -> None:
    """Shows kvblocks' records the way vLLM shows its own where nothing else would show
    them: vLLM's default logging configures only the `vllm` logger (its own handler, no
    propagation) and leaves the root without handlers, so Python would drop an INFO
    record of `kvblocks.vllm`. Then the `kvblocks` logger gets the `vllm` logger's
    handlers and level. A logging setup of the user's (any handler on the way to the
    root) is left alone."""
    if logger.hasHandlers():
        return
    theirs = logging.getLogger("vllm")
    ours = logging.getLogger("kvblocks")
    for handler in theirs.handlers:
        ours.addHandler(handler)
    if ours.level == logging.NOTSET:
        ours.setLevel(theirs.getEffectiveLevel())
    ours.propagate = False


def install(*, fallback: bool = True, retention: Any = None) -> None:
    """From now on, vLLM's `Scheduler` and `AsyncScheduler` build kvblocks'
    `KVCacheManager` and vLLM's engine core hashes requests with kvblocks' hasher: in this
    process, and in the vLLM processes started from it (a spawned engine core included),
    through the environment (`KVBLOCKS_VLLM=1`, with the options below in
    `KVBLOCKS_VLLM_FALLBACK` and `KVBLOCKS_VLLM_RETENTION`) and kvblocks' vLLM plugin.
    Each kvblocks manager built logs one INFO line on the `kvblocks.vllm` logger naming
    kvblocks' and vLLM's versions; `manager_info()` tells which manager an engine runs.
    Idempotent; a second call replaces the options.

    First, once per process, the drift guard checks that the installed vLLM is in the
    supported range and has the shape kvblocks was built for (`_drift.py`).

    Args:
        fallback: for a vLLM the drift guard refuses, log a warning, record why in
            `fallbacks` and leave vLLM untouched (True), or raise `UnsupportedVLLMError`
            (False). For a configuration kvblocks cannot serve (a spec type it lacks,
            say), log a warning and build vLLM's own manager (True), or raise
            `UnsupportedConfigError` from the scheduler's constructor (False).
        retention: a `kvblocks.RetentionPolicy` for the managers built from now on
            (docs/retention.md): vLLM's request `priority` maps to a class, its
            `session_id` to session retention, its `cache_salt` (else LoRA) to a tenant.
            None keeps vLLM's eviction order.

    Raises:
        kvblocks.InvalidArgumentError: `retention` has no retention spec that builds it
            back identically (so a spawned engine core could not get the same policy);
            nothing is installed then.
        kvblocks.InvalidTypeError: `retention` is not a `kvblocks.RetentionPolicy`.
    """
    import importlib

    from kvblocks.vllm import _drift

    try:
        _drift.check()
    except _drift.UnsupportedVLLMError as e:
        if not fallback:
            raise
        fallbacks.append(str(e))
        logger.warning(
            "kvblocks is not installed, vLLM runs its own KV cache manager and hasher: %s", e
        )
        return
    global _fallback, _retention
    spec = _retention_spec(retention)
    _fallback = fallback
    _retention = retention
    modules = {m: importlib.import_module(m) for m, _ in _TARGETS}
    for module, name in _TARGETS:
        if (module, name) not in _saved:
            _saved[(module, name)] = getattr(modules[module], name)
    for module, name in _TARGETS:
        setattr(modules[module], name, _replacement(module, name))
    setattr(modules["vllm.v1.engine.core"].EngineCore, UTILITY, engine_core_info)
    _export(fallback, spec)


def _retention_spec(retention: Any) -> str | None:
    """The spec text that gives a child process `retention` (None for no policy)."""
    if retention is None:
        return None
    if not isinstance(retention, RetentionPolicy):
        raise InvalidTypeError(
            f"install(retention=...) takes a kvblocks.RetentionPolicy, got {type(retention)!r}"
        )
    from kvblocks.retention_spec import RetentionSpec, SpecError

    try:
        return RetentionSpec.from_policy(retention).spec
    except SpecError as e:
        raise InvalidArgumentError(
            f"install(retention=...): a spawned vLLM engine core could not get this policy: {e}"
        ) from None


def _export(fallback: bool, spec: str | None) -> None:
    """Writes the switch and options into this process's environment, for its children."""
    if not _saved_env:
        _saved_env.update({k: os.environ.get(k) for k in _ENV})
    os.environ[ENV_SWITCH] = "1"
    os.environ[ENV_FALLBACK] = "1" if fallback else "0"
    if spec is None:
        os.environ.pop(ENV_RETENTION, None)
    else:
        os.environ[ENV_RETENTION] = spec


def vllm_original(module: str, name: str) -> Any:
    """vLLM's own `module.name`, also while kvblocks' stands in for it."""
    import importlib

    if (module, name) in _saved:
        return _saved[(module, name)]
    return getattr(importlib.import_module(module), name)


def uninstall() -> None:
    """Puts vLLM's own objects back and the environment as `install()` found it. A no-op
    if not installed."""
    import importlib

    for (module, name), theirs in list(_saved.items()):
        setattr(importlib.import_module(module), name, theirs)
        del _saved[(module, name)]
    core = sys.modules.get("vllm.v1.engine.core")
    if core is not None and UTILITY in vars(core.EngineCore):
        delattr(core.EngineCore, UTILITY)
    for key, value in _saved_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _saved_env.clear()


def installed() -> bool:
    """Whether `install()` is in effect."""
    return bool(_saved)


def _register_offload_policies() -> None:
    """Registers kvblocks' host-tier cache policies in vLLM's CachePolicyFactory
    (`kvblocks.vllm._offload`). Only inside a vLLM process (vLLM already imported: vLLM
    calls its plugins), so the plugin imports no vLLM of its own; a vLLM without the
    factory (before 0.33) is left alone."""
    import importlib.util

    if "vllm" not in sys.modules:
        return
    if importlib.util.find_spec("vllm.v1.kv_offload.cpu.policies.factory") is None:
        return
    from kvblocks.vllm._offload import register

    register()


def plugin() -> None:
    """vLLM general plugin (entry point `vllm.general_plugins`): registers kvblocks'
    host-tier cache policies (`kvblocks-lru`, `kvblocks-arc`, `kvblocks`) in vLLM's
    CachePolicyFactory, and installs kvblocks in this vLLM process when `KVBLOCKS_VLLM` is
    set to 1 / true / yes / on (and nothing more otherwise). `KVBLOCKS_VLLM_RETENTION` (a
    spec such as `session=30`) sets the retention policy; `KVBLOCKS_VLLM_FALLBACK=0`
    installs with `fallback=False`.

    Raises:
        SpecError: a bad retention spec (a `ValueError` naming it).
        kvblocks.InvalidArgumentError: a `KVBLOCKS_VLLM_FALLBACK` that is not a boolean.
    """
    _register_offload_policies()
    if os.environ.get(ENV_SWITCH, "").strip().lower() not in _TRUE:
        return
    spec = os.environ.get(ENV_RETENTION, "").strip()
    retention = None
    if spec:
        from kvblocks.retention_spec import parse_retention

        retention = parse_retention(spec).build()
    fallback = os.environ.get(ENV_FALLBACK, "").strip().lower() or "1"
    if fallback not in _TRUE + _FALSE:
        raise InvalidArgumentError(f"{ENV_FALLBACK}={fallback!r}: expected 1 or 0")
    install(fallback=fallback in _TRUE, retention=retention)
