"""kvblocks: vLLM-compatible KV-cache block manager with a Rust core.

`import kvblocks` never imports torch; `kvblocks.device` does.
"""

from __future__ import annotations

from kvblocks._core import (
    AllBlocksCleared,
    AttentionSpec,
    BlockHasher,
    BlockPool,
    BlockPoolView,
    BlockRemoved,
    BlockStored,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheBlocks,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    KVCacheSpec,
    KVCacheTensor,
    MambaSpec,
    MLAAttentionSpec,
    PrefixCacheStats,
    Request,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    __version__,
    hash_block_tokens,
    none_hash,
)

__all__ = [
    "AllBlocksCleared",
    "AttentionSpec",
    "BlockHasher",
    "BlockPool",
    "BlockPoolView",
    "BlockRemoved",
    "BlockStored",
    "ChunkedLocalAttentionSpec",
    "CrossAttentionSpec",
    "FullAttentionSpec",
    "KVCacheBlocks",
    "KVCacheConfig",
    "KVCacheGroupSpec",
    "KVCacheManager",
    "KVCacheSpec",
    "KVCacheTensor",
    "MLAAttentionSpec",
    "MambaSpec",
    "PrefixCacheStats",
    "Request",
    "SinkFullAttentionSpec",
    "SlidingWindowSpec",
    "UniformTypeKVCacheSpecs",
    "__version__",
    "hash_block_tokens",
    "none_hash",
]
