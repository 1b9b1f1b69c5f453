"""Type stubs for the `kvblocks._core` extension module (checked with mypy.stubtest)."""

from __future__ import annotations

__version__: str
