"""kvblocks: vLLM-compatible KV-cache block manager with a Rust core.

`import kvblocks` never imports torch; `kvblocks.device` does.
"""

from __future__ import annotations

from kvblocks._core import EventSink, __version__, encode_event_batch

__all__ = ["EventSink", "__version__", "encode_event_batch"]
