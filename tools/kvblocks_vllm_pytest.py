"""pytest plugin: run vLLM's own tests with `kvblocks.vllm.install()` active.

Loaded by `tools/vllm_tests.py --kvblocks` as `-p kvblocks_vllm_pytest` (tools/ on
PYTHONPATH). vLLM's test modules import `get_request_block_hasher` and `Scheduler` by name
when they are imported, so install() runs before any conftest or test module is loaded:
`pytest_load_initial_conftests` is called for `-p` plugins before the initial conftests.
"""

from __future__ import annotations

from typing import Any

import pytest

_installed: list[str] = []


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: Any, parser: Any, args: Any) -> None:
    import kvblocks.vllm

    kvblocks.vllm.install()
    _installed.append(kvblocks.__file__ or "?")


def pytest_report_header(config: Any) -> str:
    import kvblocks.vllm
    import vllm.v1.core.kv_cache_utils as kcu
    import vllm.v1.core.sched.scheduler as sched

    manager = sched.KVCacheManager is kvblocks.vllm.KVCacheManager
    hasher = getattr(kcu.get_request_block_hasher, "__module__", "").startswith("kvblocks")
    return (
        f"kvblocks.vllm.install() active: manager={manager} hasher={hasher} "
        f"({_installed[0] if _installed else 'not installed'})"
    )


def pytest_unconfigure(config: Any) -> None:
    import kvblocks.vllm

    kvblocks.vllm.uninstall()
