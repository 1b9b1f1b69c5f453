"""pytest plugin: run vLLM's own offload tests with kvblocks' host-tier cache policies
selected in place of vLLM's.

Loaded by `tools/vllm_tests.py run --offload --kvblocks` as `-p kvblocks_offload_pytest`
(tools/ on PYTHONPATH). Before any test module is imported it registers kvblocks'
policies (`kvblocks.vllm._offload.register()`, as the plugin does in vLLM) and makes
vLLM's `CachePolicyFactory` resolve its built-in names to them: `lru` to `kvblocks-lru`,
`arc` to `kvblocks-arc`. Every `CPUOffloadingManager` the tests build, directly or through
the offloading connector, then runs on kvblocks; the terminal summary counts the policy
classes built.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

#: vLLM's built-in policy names and the kvblocks policies that stand in for them.
SELECT = {"lru": "kvblocks-lru", "arc": "kvblocks-arc"}
_built: Counter[str] = Counter()


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: Any, parser: Any, args: Any) -> None:
    from kvblocks.vllm._offload import register
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    register()
    resolve = CachePolicyFactory.get_cache_policy_cls.__func__  # type: ignore[attr-defined]

    def selected(cls: Any, name: str, module_path: str | None = None) -> Any:
        policy = resolve(cls, SELECT.get(name, name), module_path)
        _built[f"{name} -> {policy.__module__}.{policy.__qualname__}"] += 1
        return policy

    CachePolicyFactory.get_cache_policy_cls = classmethod(selected)  # type: ignore[method-assign]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for what, n in sorted(_built.items()):
        terminalreporter.write_line(f"kvblocks: cache policy {what}: {n}")
