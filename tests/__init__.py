"""kvblocks' tests (tests/README.md says where each kind goes).

This file makes `tests` a package so that pytest puts the repository root, not tests/, on
sys.path for tests/conftest.py: with tests/ there, the folder tests/vllm/ would be importable
as a namespace package `vllm` wherever vLLM is not installed. The area folders are not
packages; pytest puts each on sys.path for its own test files.
"""
