"""Type stubs for the `kvblocks._core` extension module (checked with mypy.stubtest)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar, TypeAlias, final

__version__: str

# An extra key value as published in events: None, bool, int, str, bytes or a tuple of those.
_ExtraKey: TypeAlias = bool | int | str | bytes | tuple["_ExtraKey", ...] | None

@final
class BlockStored:
    """vLLM's `BlockStored` KV cache event (same fields, same order)."""

    __struct_fields__: ClassVar[list[str]]
    @property
    def block_hashes(self) -> list[int]: ...
    @property
    def parent_block_hash(self) -> int | None: ...
    @property
    def token_ids(self) -> list[int]: ...
    @property
    def block_size(self) -> int: ...
    @property
    def lora_id(self) -> int | None: ...
    @property
    def medium(self) -> str | None: ...
    @property
    def lora_name(self) -> str | None: ...
    @property
    def extra_keys(self) -> list[tuple[_ExtraKey, ...] | None] | None: ...
    @property
    def group_idx(self) -> int | None: ...
    @property
    def kv_cache_spec_kind(self) -> str | None: ...
    @property
    def kv_cache_spec_sliding_window(self) -> int | None: ...
    @property
    def locality(self) -> str | None: ...
    @property
    def ownership(self) -> str | None: ...
    @property
    def session_id(self) -> str | None: ...
    @property
    def lookahead_token_ids(self) -> list[list[int]] | None: ...
    def __new__(
        cls,
        block_hashes: Sequence[int],
        parent_block_hash: int | None,
        token_ids: Sequence[int],
        block_size: int,
        lora_id: int | None,
        medium: str | None,
        lora_name: str | None,
        extra_keys: Sequence[tuple[_ExtraKey, ...] | None] | None = None,
        group_idx: int | None = None,
        kv_cache_spec_kind: str | None = None,
        kv_cache_spec_sliding_window: int | None = None,
        locality: str | None = None,
        ownership: str | None = None,
        session_id: str | None = None,
        lookahead_token_ids: Sequence[Sequence[int]] | None = None,
    ) -> BlockStored: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class BlockRemoved:
    """vLLM's `BlockRemoved` KV cache event."""

    __struct_fields__: ClassVar[list[str]]
    @property
    def block_hashes(self) -> list[int]: ...
    @property
    def medium(self) -> str | None: ...
    @property
    def group_idx(self) -> int | None: ...
    @property
    def locality(self) -> str | None: ...
    @property
    def ownership(self) -> str | None: ...
    def __new__(
        cls,
        block_hashes: Sequence[int],
        medium: str | None,
        group_idx: int | None = None,
        locality: str | None = None,
        ownership: str | None = None,
    ) -> BlockRemoved: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class AllBlocksCleared:
    """vLLM's `AllBlocksCleared` KV cache event (no fields)."""

    __struct_fields__: ClassVar[list[str]]
    def __new__(cls) -> AllBlocksCleared: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

_KVCacheEvent: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared

@final
class BlockPool:
    """vLLM 0.33's `BlockPool` over block ids; block 0 is the null block."""

    def __new__(
        cls,
        num_gpu_blocks: int,
        enable_caching: bool = True,
        hash_block_size: int = 16,
        enable_kv_cache_events: bool = False,
    ) -> BlockPool: ...
    @property
    def num_gpu_blocks(self) -> int: ...
    @property
    def enable_caching(self) -> bool: ...
    @property
    def hash_block_size(self) -> int: ...
    @property
    def enable_kv_cache_events(self) -> bool: ...
    def get_new_blocks(self, n: int) -> list[int]:
        """Pops `n` blocks off the free queue head; ValueError if fewer are free."""
    def free_blocks(self, block_ids: Sequence[int]) -> None:
        """Drops one reference per block, in the given order (pass a table reversed)."""
    def touch(self, block_ids: Sequence[int]) -> None:
        """Takes one reference per block (a prefix-cache hit); the null block is skipped."""
    def cache_full_blocks(
        self,
        request_block_hashes: Sequence[bytes],
        block_ids: Sequence[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        token_ids: Sequence[int] | None = None,
    ) -> None:
        """Caches `block_ids[num_cached_blocks:num_full_blocks]` under the request's hashes.

        `token_ids` (the request's tokens) are used only for `BlockStored` events.
        """
    def get_cached_block(
        self, block_hash: bytes, kv_cache_group_ids: Sequence[int]
    ) -> list[int] | None:
        """One cached block per group, or None if any group misses."""
    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drops the cache entries of the blocks, in iteration order."""
    def reset_prefix_cache(self) -> bool:
        """Clears the prefix cache if no block is in use; returns whether it did."""
    def get_num_free_blocks(self) -> int: ...
    def get_usage(self) -> float: ...
    def get_free_block_ids(self) -> list[int]:
        """The free queue, head (next allocated) to tail."""
    def get_ref_cnt(self, block_id: int) -> int: ...
    def get_block_hash(self, block_id: int) -> bytes | None:
        """The block's bare hash digest, or None if it is not cached."""
    def take_events(self) -> list[_KVCacheEvent]:
        """Returns and clears the recorded events."""
