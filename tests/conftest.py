"""Environment for the tests that import vLLM (skipped where it is absent): vLLM picks its
platform once, at first import, so the CPU target must be set before any test module
imports it.

`KVBLOCKS_REQUIRE_VLLM=1` (set by the Makefile's vLLM runs, and so in CI) makes a missing
vLLM an error instead of a silent skip of every vLLM test.
"""

import importlib
import os

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("KVBLOCKS_REQUIRE_VLLM") != "1":
        return
    try:
        importlib.import_module("vllm")
    except ImportError as e:
        raise pytest.UsageError(f"KVBLOCKS_REQUIRE_VLLM=1 but vLLM is not importable: {e}") from e
