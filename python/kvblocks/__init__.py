"""kvblocks: vLLM-compatible KV-cache block manager with a Rust core.

`import kvblocks` never imports torch; `kvblocks.device` does.
"""

from __future__ import annotations

from kvblocks._core import (
    BlockHasher,
    Request,
    __version__,
    hash_block_tokens,
    none_hash,
)

__all__ = [
    "BlockHasher",
    "Request",
    "__version__",
    "hash_block_tokens",
    "none_hash",
]
