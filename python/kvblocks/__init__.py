"""kvblocks: vLLM-compatible KV-cache block manager with a Rust core.

`import kvblocks` never imports torch; `kvblocks.device` does.
"""

from __future__ import annotations

from kvblocks._core import (
    AllBlocksCleared,
    AttentionSpec,
    BlockHasher,
    BlockPool,
    BlockRemoved,
    BlockStored,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    EventSink,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    MambaSpec,
    MLAAttentionSpec,
    Request,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    __version__,
    encode_event_batch,
    hash_block_tokens,
    none_hash,
)

__all__ = [
    "AllBlocksCleared",
    "AttentionSpec",
    "BlockHasher",
    "BlockPool",
    "BlockRemoved",
    "BlockStored",
    "ChunkedLocalAttentionSpec",
    "CrossAttentionSpec",
    "EventSink",
    "FullAttentionSpec",
    "KVCacheConfig",
    "KVCacheGroupSpec",
    "KVCacheSpec",
    "KVCacheTensor",
    "MLAAttentionSpec",
    "MambaSpec",
    "Request",
    "SinkFullAttentionSpec",
    "SlidingWindowSpec",
    "UniformTypeKVCacheSpecs",
    "__version__",
    "encode_event_batch",
    "hash_block_tokens",
    "none_hash",
]
