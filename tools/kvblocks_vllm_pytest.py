"""pytest plugin: run vLLM's own tests with `kvblocks.vllm.install()` active.

Loaded by `tools/vllm_tests.py --kvblocks` as `-p kvblocks_vllm_pytest` (tools/ on
PYTHONPATH). vLLM's test modules import `get_request_block_hasher` and `Scheduler` by name
when they are imported, so install() runs before any conftest or test module is loaded:
`pytest_load_initial_conftests` is called for `-p` plugins before the initial conftests.

By default the install is strict (`fallback=False`): a configuration kvblocks refuses
fails its test instead of quietly running on vLLM's own manager. With
`KVBLOCKS_VLLM_TESTS_FALLBACK=1` it falls back as a deployment would, and the terminal
summary counts the fallbacks.

With `KVBLOCKS_VLLM_TESTS_EVERYWHERE=1` (`tools/vllm_tests.py --core`) kvblocks' manager also
stands in for `vllm.v1.core.kv_cache_manager.KVCacheManager`, where vLLM's own manager tests
import it from, so they test kvblocks' manager too.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

FALLBACK = os.environ.get("KVBLOCKS_VLLM_TESTS_FALLBACK", "") == "1"
EVERYWHERE = os.environ.get("KVBLOCKS_VLLM_TESTS_EVERYWHERE", "") == "1"
# vLLM's own manager class in vllm.v1.core.kv_cache_manager, while EVERYWHERE replaced it.
_vllm_manager: list[Any] = []
_installed: list[str] = []
# What the tests built through the installed names: manager classes, hasher modules.
_built: Counter[str] = Counter()


def _counting(module: Any, name: str, what: Callable[[Any], str]) -> None:
    """Wrap what install() put at module.name so each call is counted by what it gives."""
    inner = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        out = inner(*args, **kwargs)
        _built[what(out)] += 1
        return out

    setattr(module, name, counted)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: Any, parser: Any, args: Any) -> None:
    import kvblocks.vllm
    import vllm.v1.core.kv_cache_utils as kcu
    import vllm.v1.core.sched.scheduler as sched

    kvblocks.vllm.install(fallback=FALLBACK)
    _installed.append(kvblocks.__file__ or "?")
    # uninstall() puts vLLM's own objects back over these wrappers.
    _counting(sched, "KVCacheManager", lambda m: f"manager {type(m).__module__}")
    _counting(kcu, "get_request_block_hasher", lambda h: f"hasher {type(h).__module__}")
    if EVERYWHERE:
        import vllm.v1.core.kv_cache_manager as kcm

        _vllm_manager.append(kcm.KVCacheManager)
        kcm.KVCacheManager = sched.KVCacheManager


def pytest_report_header(config: Any) -> str:
    import kvblocks.vllm
    import vllm.v1.core.kv_cache_utils as kcu
    import vllm.v1.engine.core as core

    hashers = {
        m.__name__: getattr(m.get_request_block_hasher, "__module__", "?") for m in (kcu, core)
    }
    return (
        f"kvblocks.vllm.install(fallback={FALLBACK}) active: {kvblocks.vllm.installed()}; "
        f"hashers: {hashers}; kvblocks from {_installed[0] if _installed else '?'}"
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    import kvblocks.vllm

    for what, n in sorted(_built.items()):
        terminalreporter.write_line(f"kvblocks: {n} x {what} built")
    fallbacks = Counter(kvblocks.vllm.fallbacks)
    terminalreporter.write_line(
        f"kvblocks: {sum(fallbacks.values())} manager(s) fell back to vLLM's own"
    )
    for reason, n in fallbacks.most_common():
        terminalreporter.write_line(f"  {n} x {reason}")


def pytest_unconfigure(config: Any) -> None:
    import kvblocks.vllm

    kvblocks.vllm.uninstall()
    if _vllm_manager:
        import vllm.v1.core.kv_cache_manager as kcm

        kcm.KVCacheManager = _vllm_manager.pop()
