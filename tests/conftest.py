"""Environment for the tests that import vLLM (skipped where it is absent): vLLM picks its
platform once, at first import, so the CPU target must be set before any test module
imports it."""

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
