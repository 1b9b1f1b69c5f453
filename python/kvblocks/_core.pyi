"""Type stubs for the `kvblocks._core` extension module (checked with mypy.stubtest)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, final

__version__: str

# --- hashing -------------------------------------------------------------------------------

def hash_block_tokens(
    algo: str,
    parent_block_hash: bytes | None,
    token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
) -> bytes:
    """vLLM's `hash_block_tokens`: the hash of one full block chained to its parent."""

def none_hash(algo: str) -> bytes:
    """vLLM's NONE_HASH for `algo` in this process (honours PYTHONHASHSEED)."""

@final
class BlockHasher:
    """The block size and algorithm a `Request` hashes its full blocks with."""

    def __new__(cls, hash_block_size: int, algo: str = "sha256_cbor") -> BlockHasher: ...
    @property
    def hash_block_size(self) -> int: ...
    @property
    def algo(self) -> str: ...

# --- request -------------------------------------------------------------------------------

@final
class Request:
    """A request's tokens and block hashes (vLLM's `Request`, KV-cache-relevant parts)."""

    def __new__(
        cls,
        request_id: str,
        prompt_token_ids: Sequence[int],
        hasher: BlockHasher | None = None,
        *,
        lora_name: str | None = None,
        lora_path: str | None = None,
        lora_id: int | None = None,
        cache_salt: str | None = None,
        mm_features: Sequence[tuple[str, int, int]] | None = None,
    ) -> Request: ...
    @property
    def request_id(self) -> str: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_output_tokens(self) -> int: ...
    @property
    def num_computed_tokens(self) -> int: ...
    @num_computed_tokens.setter
    def num_computed_tokens(self, value: int) -> None: ...
    @property
    def num_in_flight_tokens(self) -> int: ...
    @num_in_flight_tokens.setter
    def num_in_flight_tokens(self, value: int) -> None: ...
    @property
    def num_preemptions(self) -> int: ...
    @num_preemptions.setter
    def num_preemptions(self, value: int) -> None: ...
    @property
    def skip_reading_prefix_cache(self) -> bool: ...
    @skip_reading_prefix_cache.setter
    def skip_reading_prefix_cache(self, value: bool) -> None: ...
    @property
    def lora_name(self) -> str | None: ...
    @property
    def lora_id(self) -> int | None: ...
    @property
    def cache_salt(self) -> str | None: ...
    @property
    def all_token_ids(self) -> list[int]: ...
    @property
    def block_hashes(self) -> list[bytes]: ...
    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None:
        """Appends output tokens and hashes the full blocks they complete."""
