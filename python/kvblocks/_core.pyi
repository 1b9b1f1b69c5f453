"""Type stubs for the `kvblocks._core` extension module (checked with mypy.stubtest)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any, ClassVar, Literal, TypeAlias, final, overload

from typing_extensions import Self, disjoint_base

_DtypeLike: TypeAlias = object
"""A dtype name (`"bfloat16"`, `"half"`) or a torch dtype (read through `str()`)."""

# What the extension module exports (PyO3 writes its `__all__`; stubtest checks the names).
__all__ = [
    "HASH_ALGORITHMS",
    "VLLM_ATTRIBUTES_READ",
    "VLLM_REQUEST_STATUSES",
    "AllBlocksCleared",
    "AttentionSpec",
    "BlockHasher",
    "BlockIndexError",
    "BlockOutOfRangeError",
    "BlockPool",
    "BlockRemoved",
    "BlockStored",
    "CeilingLog",
    "ChunkedLocalAttentionSpec",
    "CircularBufferSpec",
    "CrossAttentionSpec",
    "DoubleFreeError",
    "EngineHit",
    "EventSink",
    "FullAttentionSpec",
    "HashMismatchError",
    "HiSparseHotSpec",
    "HiSparseResidentSpec",
    "IntOverflowError",
    "InvalidArgumentError",
    "InvalidEventError",
    "InvalidSpecError",
    "InvalidTypeError",
    "KVBlocksError",
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheConfig",
    "KVCacheGroupSpec",
    "KVCacheManager",
    "KVCacheSpec",
    "KVCacheTensor",
    "KVIndex",
    "MLAAttentionSpec",
    "MambaSpec",
    "NotPinnedError",
    "OffloadManager",
    "OffloadPolicy",
    "OffloadRequest",
    "OutOfBlocksError",
    "PrefixCacheStats",
    "RSWASpec",
    "Request",
    "RequestBlockHasher",
    "RetentionPolicy",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "UniformTypeKVCacheSpecs",
    "UnknownAlgorithmError",
    "UnknownEngineError",
    "UnknownLayerError",
    "UnknownRequestError",
    "UnsupportedError",
    "_IdRing",
    "__version__",
    "append_token_ids_batch",
    "ceiling_block_keys",
    "encode_event_batch",
    "external_block_hashes",
    "hash_block_tokens",
    "mamba_checkpoint_exportable",
    "mamba_checkpoint_position",
    "none_hash",
]

__version__: str

VLLM_ATTRIBUTES_READ: tuple[tuple[str, tuple[str, ...]], ...]
"""The attributes kvblocks reads on vLLM's objects, by the name of vLLM's class that holds
them (`Request`, `LoRARequest`, `MultiModalFeatureSpec`, `PlaceholderRange`): what
`kvblocks.vllm`'s drift guard checks against the installed vLLM."""

VLLM_REQUEST_STATUSES: tuple[tuple[str, int], ...]
"""The `RequestStatus` members kvblocks compares with, and the values it expects."""

HASH_ALGORITHMS: tuple[str, ...]
"""The names of the hash algorithms kvblocks hashes with (vLLM's), in vLLM's order."""

# --- Errors (src/python/errors.rs) ---------------------------------------------------
# One class per `KvError` variant, then four for input the binding layer and
# kvblocks.device check themselves. Each also derives from the builtin exception kvblocks
# raised there before (and vLLM raises in the same case), so `except ValueError`,
# `except KeyError`, `except TypeError` ... keep working.

class KVBlocksError(Exception):
    """The base class of every error kvblocks raises for bad input or a broken invariant."""

class InvalidArgumentError(KVBlocksError, ValueError):
    """An argument is out of its domain (negative count, zero tokens, bad size, ...)."""

class OutOfBlocksError(KVBlocksError, ValueError):
    """A block pool was asked for more blocks than are free."""

class BlockOutOfRangeError(KVBlocksError, ValueError):
    """A block id outside 0..num_blocks."""

class DoubleFreeError(KVBlocksError, ValueError):
    """Freeing a block whose ref count is already 0."""

class UnknownAlgorithmError(KVBlocksError, ValueError):
    """A hash algorithm name kvblocks does not know."""

class UnknownRequestError(KVBlocksError, KeyError):
    """A request id the manager does not know, where the call needs one."""

class InvalidSpecError(KVBlocksError, ValueError):
    """A KV cache spec or config that cannot be built or merged."""

class UnsupportedError(KVBlocksError, NotImplementedError):
    """A feature of vLLM 0.33 that kvblocks does not implement."""

class NotPinnedError(KVBlocksError, KeyError):
    """Unpinning a prefix that is not pinned."""

class InvalidTypeError(KVBlocksError, TypeError):
    """An argument of the wrong type, found by kvblocks' own checks."""

class IntOverflowError(KVBlocksError, OverflowError):
    """An int too large for the type kvblocks keeps it in."""

class BlockIndexError(KVBlocksError, IndexError):
    """A block id outside the pages of kvblocks.device."""

class UnknownLayerError(KVBlocksError, KeyError):
    """A layer name the KV cache pages do not hold (kvblocks.device)."""

class InvalidEventError(KVBlocksError, ValueError):
    """A KV event payload that cannot be decoded or applied; the router index is unchanged."""

class UnknownEngineError(KVBlocksError, KeyError):
    """An engine id the router index does not know."""

class HashMismatchError(KVBlocksError, ValueError):
    """An engine's events hash blocks otherwise than its registration says."""

# --- Retention (src/python/retention.rs; docs/retention.md) ---------------------------

@final
class RetentionPolicy:
    """A retention policy for the prefix cache (docs/retention.md); frozen."""

    FIELDS: ClassVar[tuple[str, ...]]
    """The fields' names, in order: the constructor's keywords and the attributes."""
    def __new__(
        cls,
        *,
        classes: int = 1,
        default_class: int = 0,
        priority_classes: Mapping[int, int] | None = None,
        ttl_s: float | Sequence[float | None] | None = None,
        session_s: float | None = None,
        tenant_quotas: Mapping[str, int] | None = None,
        default_tenant_quota: int | None = None,
    ) -> RetentionPolicy: ...
    @property
    def classes(self) -> int: ...
    @property
    def default_class(self) -> int: ...
    @property
    def priority_classes(self) -> dict[int, int]: ...
    @property
    def ttl_s(self) -> list[float | None]:
        """One TTL per class (`None`: none)."""
    @property
    def session_s(self) -> float | None: ...
    @property
    def tenant_quotas(self) -> dict[str, int]: ...
    @property
    def default_tenant_quota(self) -> int | None: ...
    def __eq__(self, other: object, /) -> bool: ...

# --- KV cache specs (src/python/spec.rs) ---------------------------------------------

@disjoint_base
class KVCacheSpec:
    """Base class of every KV cache spec: a frozen value, equal and hashable by value."""

    @property
    def block_size(self) -> int: ...
    @property
    def page_size_bytes(self) -> int:
        """Bytes of one page (one block of this layer or group)."""
    def max_memory_usage_bytes(
        self,
        *,
        max_model_len: int,
        max_num_batched_tokens: int = 2048,
        max_num_encoder_input_tokens: int | None = None,
        max_concurrent_batches: int = 1,
        dcp_world_size: int = 1,
    ) -> int:
        """The most bytes one request can hold (vLLM's formula for the spec type).

        `max_num_encoder_input_tokens` defaults to `max_num_batched_tokens`.
        """
    @classmethod
    def merge(cls, specs: Sequence[KVCacheSpec]) -> Self:
        """Merges a group's layer specs with `cls`'s rules; ValueError if they conflict."""
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

class AttentionSpec(KVCacheSpec):
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_size(self) -> int: ...
    @property
    def head_size_v(self) -> int: ...
    @property
    def dtype(self) -> str:
        """The canonical torch dtype name, e.g. `"bfloat16"`."""
    @property
    def page_size_padded(self) -> int | None: ...
    @property
    def num_head_slots(self) -> int | None:
        """Head slots of a packed page (`None`: one per KV head)."""
    @property
    def state_content_bytes(self) -> int | None:
        """Bytes of one (head slot, state) cell of a packed page (`None`: dense K/V)."""
    @property
    def tokens_per_state(self) -> int | Fraction:
        """Tokens one stored state covers (a page holds `block_size // tokens_per_state`
        states); a `Fraction(1, k)` stores `k` states per token (Whisper's block pooling)."""
    @property
    def dcp_sharded(self) -> bool: ...

class FullAttentionSpec(AttentionSpec):
    def __new__(
        cls,
        *,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        dtype: _DtypeLike,
        head_size_v: int | None = None,
        sliding_window: int | None = None,
        attention_chunk_size: int | None = None,
        page_size_padded: int | None = None,
        num_head_slots: int | None = None,
        state_content_bytes: int | None = None,
        tokens_per_state: int | Fraction = 1,
        dcp_sharded: bool = True,
    ) -> FullAttentionSpec: ...
    @property
    def sliding_window(self) -> int | None: ...
    @property
    def attention_chunk_size(self) -> int | None: ...

@final
class MLAAttentionSpec(FullAttentionSpec):
    def __new__(
        cls,
        *,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        dtype: _DtypeLike,
        cache_dtype_str: str | None = None,
        alignment: int | None = None,
        page_size_padded: int | None = None,
        num_head_slots: int | None = None,
        state_content_bytes: int | None = None,
        tokens_per_state: int | Fraction = 1,
        dcp_sharded: bool = True,
    ) -> MLAAttentionSpec: ...
    @property
    def cache_dtype_str(self) -> str | None: ...
    @property
    def alignment(self) -> int | None: ...

@final
class SinkFullAttentionSpec(FullAttentionSpec):
    def __new__(
        cls,
        *,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        dtype: _DtypeLike,
        sink_len: int,
        head_size_v: int | None = None,
        sliding_window: int | None = None,
        attention_chunk_size: int | None = None,
        page_size_padded: int | None = None,
        num_head_slots: int | None = None,
        state_content_bytes: int | None = None,
        tokens_per_state: int | Fraction = 1,
        dcp_sharded: bool = True,
    ) -> SinkFullAttentionSpec: ...
    @property
    def sink_len(self) -> int: ...

class SlidingWindowSpec(AttentionSpec):
    def __new__(
        cls,
        *,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        dtype: _DtypeLike,
        sliding_window: int,
        head_size_v: int | None = None,
        extra_retained_tokens: int = 0,
        page_size_padded: int | None = None,
        num_head_slots: int | None = None,
        state_content_bytes: int | None = None,
        tokens_per_state: int | Fraction = 1,
        dcp_sharded: bool = True,
    ) -> SlidingWindowSpec: ...
    @property
    def sliding_window(self) -> int: ...
    @property
    def extra_retained_tokens(self) -> int: ...
    def max_admission_blocks_per_request(
        self, max_in_flight_tokens: int, max_model_len: int
    ) -> int | None:
        """`cdiv(min(sliding_window - 1 + extra + T, max_model_len), block_size) + 1`."""

@final
class RSWASpec(FullAttentionSpec):
    def __new__(
        cls,
        *,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        dtype: _DtypeLike,
        rswa_window: int,
        head_size_v: int | None = None,
        page_size_padded: int | None = None,
        num_head_slots: int | None = None,
        state_content_bytes: int | None = None,
        tokens_per_state: int | Fraction = 1,
        dcp_sharded: bool = True,
    ) -> RSWASpec: ...
    @property
    def rswa_window(self) -> int: ...

@final
class SlidingWindowMLASpec(SlidingWindowSpec):
    def __new__(
        cls,
        *,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        dtype: _DtypeLike,
        sliding_window: int,
        extra_retained_tokens: int = 0,
        cache_dtype_str: str | None = None,
        alignment: int | None = None,
        bounded_replay: bool = False,
        page_size_padded: int | None = None,
        num_head_slots: int | None = None,
        state_content_bytes: int | None = None,
        tokens_per_state: int | Fraction = 1,
        dcp_sharded: bool = True,
    ) -> SlidingWindowMLASpec: ...
    @property
    def cache_dtype_str(self) -> str | None: ...
    @property
    def alignment(self) -> int | None: ...
    @property
    def bounded_replay(self) -> bool: ...

@final
class ChunkedLocalAttentionSpec(AttentionSpec):
    def __new__(
        cls,
        *,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        dtype: _DtypeLike,
        attention_chunk_size: int,
        head_size_v: int | None = None,
        page_size_padded: int | None = None,
        num_head_slots: int | None = None,
        state_content_bytes: int | None = None,
        tokens_per_state: int | Fraction = 1,
        dcp_sharded: bool = True,
    ) -> ChunkedLocalAttentionSpec: ...
    @property
    def attention_chunk_size(self) -> int: ...
    def max_admission_blocks_per_request(
        self, max_in_flight_tokens: int, max_model_len: int
    ) -> int | None:
        """`cdiv(min(attention_chunk_size + T, max_model_len), block_size)`."""

@final
class CrossAttentionSpec(AttentionSpec):
    def __new__(
        cls,
        *,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        dtype: _DtypeLike,
        head_size_v: int | None = None,
        page_size_padded: int | None = None,
        num_head_slots: int | None = None,
        state_content_bytes: int | None = None,
        tokens_per_state: int | Fraction = 1,
        dcp_sharded: bool = True,
    ) -> CrossAttentionSpec: ...

@final
class CircularBufferSpec(AttentionSpec):
    def __new__(
        cls,
        *,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        dtype: _DtypeLike,
        head_size_v: int | None = None,
        page_size_padded: int | None = None,
        num_head_slots: int | None = None,
        state_content_bytes: int | None = None,
        tokens_per_state: int | Fraction = 1,
        dcp_sharded: bool = True,
    ) -> CircularBufferSpec: ...

@final
class MambaSpec(KVCacheSpec):
    def __new__(
        cls,
        *,
        block_size: int,
        shapes: Sequence[Sequence[int]],
        dtypes: Sequence[_DtypeLike],
        page_size_padded: int | None = None,
        mamba_type: str = "mamba2",
        mamba_cache_mode: str = "none",
        num_speculative_blocks: int = 0,
        num_prefill_checkpoint_blocks: int = 0,
        prefill_checkpoint_alignment: int | None = None,
    ) -> MambaSpec: ...
    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]: ...
    @property
    def dtypes(self) -> tuple[str, ...]: ...
    @property
    def page_size_padded(self) -> int | None: ...
    @property
    def mamba_type(self) -> str: ...
    @property
    def mamba_cache_mode(self) -> str: ...
    @property
    def num_speculative_blocks(self) -> int: ...
    @property
    def num_prefill_checkpoint_blocks(self) -> int: ...
    @property
    def prefill_checkpoint_alignment(self) -> int | None: ...

@final
class HiSparseHotSpec(KVCacheSpec):
    def __new__(
        cls, *, block_size: int, page_size: int, blocks_per_request: int
    ) -> HiSparseHotSpec: ...
    @property
    def page_size(self) -> int: ...
    @property
    def blocks_per_request(self) -> int: ...

@final
class HiSparseResidentSpec(KVCacheSpec):
    def __new__(cls, *, block_size: int, page_size: int) -> HiSparseResidentSpec: ...
    @property
    def page_size(self) -> int: ...
    def max_admission_blocks_per_request(
        self, max_in_flight_tokens: int, max_model_len: int
    ) -> int | None:
        """`cdiv(min(T, max_model_len), block_size)`: the pages of the tokens in flight."""

@final
class UniformTypeKVCacheSpecs(KVCacheSpec):
    def __new__(
        cls, *, block_size: int, kv_cache_specs: Mapping[str, KVCacheSpec]
    ) -> UniformTypeKVCacheSpecs: ...
    @property
    def kv_cache_specs(self) -> dict[str, KVCacheSpec]: ...
    @classmethod
    def is_uniform_type(cls, kv_cache_specs: Mapping[str, KVCacheSpec]) -> bool: ...
    @classmethod
    def from_specs(cls, kv_cache_specs: Mapping[str, KVCacheSpec]) -> KVCacheSpec | None: ...

# --- Device ids (src/python/device_ids.rs; rules in src/device_ids.rs) -----------------

@final
class _IdRing:
    """Private: kvblocks.device's staging ring, a contiguous int64 CPU tensor whose slots
    the methods read and write within its length."""

    def __new__(cls, tensor: Any) -> Self: ...
    def stage(
        self,
        ids: Any,
        start: int,
        limit: int,
        unique: bool,
        forbid_null: bool,
        what: str,
    ) -> int: ...
    def runs(
        self, first: int, second: int | None, count: int, most: int
    ) -> list[tuple[int, int, int, int]] | None: ...
    def pairs(
        self, first: int, second: int, count: int, most: int
    ) -> tuple[bool, list[tuple[int, int, int, int]] | None]: ...

# --- KV cache config (src/python/config.rs) ------------------------------------------

@final
class KVCacheTensor:
    def __new__(
        cls,
        size: int,
        shared_by: Sequence[str] | None = None,
        *,
        layers: Sequence[str] | None = None,
    ) -> KVCacheTensor: ...
    @property
    def size(self) -> int: ...
    @property
    def shared_by(self) -> list[str]: ...
    @property
    def layers(self) -> list[str]: ...
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class KVCacheGroupSpec:
    def __new__(
        cls,
        layer_names: Sequence[str],
        kv_cache_spec: KVCacheSpec,
        is_eagle_group: bool = False,
        *,
        host_resident: bool = False,
        role: str = "default",
    ) -> KVCacheGroupSpec: ...
    @property
    def layer_names(self) -> list[str]: ...
    @property
    def kv_cache_spec(self) -> KVCacheSpec: ...
    @property
    def is_eagle_group(self) -> bool: ...
    @property
    def host_resident(self) -> bool: ...
    @property
    def role(self) -> str: ...
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class KVCacheConfig:
    def __new__(
        cls,
        num_blocks: int,
        kv_cache_tensors: Sequence[KVCacheTensor],
        kv_cache_groups: Sequence[KVCacheGroupSpec],
        prefix_cache_retention_interval: int | None = None,
        *,
        hisparse_host_num_blocks: int | None = None,
    ) -> KVCacheConfig: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def kv_cache_tensors(self) -> list[KVCacheTensor]: ...
    @property
    def kv_cache_groups(self) -> list[KVCacheGroupSpec]: ...
    @property
    def prefix_cache_retention_interval(self) -> int | None: ...
    @property
    def hisparse_host_num_blocks(self) -> int | None: ...
    def resolve_block_sizes(
        self,
        *,
        enable_prefix_caching: bool = True,
        connector_enabled: bool = False,
        dcp_world_size: int = 1,
        prefix_match_unit: int | None = None,
    ) -> tuple[int, int]:
        """`(scheduler_block_size, hash_block_size)`, as vLLM's `resolve_kv_cache_block_sizes`."""
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class KVCacheBlocks:
    """Block ids per KV cache group (vLLM's `KVCacheBlocks`)."""

    def __new__(cls, blocks: Sequence[Sequence[int]]) -> KVCacheBlocks: ...
    @overload
    def get_block_ids(
        self, allow_none: Literal[False] = False, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...]: ...
    @overload
    def get_block_ids(
        self, allow_none: bool, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...] | None:
        """Block ids per group (of `group_ids` only, if given); with `allow_none`, None
        when every selected group is empty."""
    @property
    def blocks(self) -> tuple[list[KVCacheBlock], ...]:
        """The block objects per group (only for blocks a manager returned)."""
    def get_unhashed_block_ids(self) -> list[int]: ...
    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]: ...
    def new_empty(self) -> KVCacheBlocks: ...
    def __add__(self, other: KVCacheBlocks, /) -> KVCacheBlocks: ...
    def __radd__(self, other: KVCacheBlocks, /) -> KVCacheBlocks: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __len__(self) -> int: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class KVCacheBlock:
    """vLLM's `KVCacheBlock`: one block of a manager's pool, read live."""

    @property
    def block_id(self) -> int: ...
    @property
    def ref_cnt(self) -> int:
        """Requests holding the block; the null block's is 0, or with
        `count_null_block_refs` vLLM 0.32's count, which may be negative."""
    @property
    def on_host(self) -> bool:
        """Whether the block is one of HiSparse's host pool."""
    @property
    def block_hash(self) -> bytes | None:
        """The hash followed by the group id (4 bytes, big-endian), or None."""
    @property
    def block_hash_num_tokens(self) -> int | None: ...
    @property
    def is_null(self) -> bool: ...

@final
class PrefixCacheStats:
    """vLLM 0.33's `PrefixCacheStats`."""

    reset: bool
    requests: int
    queries: int
    hits: int
    preempted_requests: int
    preempted_queries: int
    preempted_hits: int
    def __new__(cls) -> PrefixCacheStats: ...
    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None: ...

@disjoint_base
class KVCacheManager:
    """vLLM 0.33.0's `KVCacheManager`, with identical block tables. Request arguments are
    kvblocks' `Request` or vLLM's own, read in place."""

    def __new__(
        cls,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        hash_block_size: int,
        *,
        scheduler_block_size: int | None = None,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        watermark: float = 0.0,
        record_new_block_ids: bool = False,
        count_null_block_refs: bool = False,
        mamba_none_prefix_caching: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        retention: RetentionPolicy | None = None,
        num_prefill_lookahead: int = 0,
        num_hash_lookahead_tokens: int = 0,
        record_block_metrics: bool = False,
    ) -> Self:
        """With `count_null_block_refs`, references to the null block are counted as
        vLLM 0.32 does: `touch` and `free_blocks` count its `ref_cnt` up and down (it may
        go negative) and a table's leading nulls are freed and popped with it. Off, as
        vLLM 0.33, they are never counted (docs/vllm-versions.md).
        `mamba_none_prefix_caching` prefix caches Mamba groups in `mamba_cache_mode="none"`
        as vLLM 0.32 does (every full block); off, as vLLM 0.33, they are refused
        (`UnsupportedError`) with `enable_caching`.

        `num_prefill_lookahead` (multi-module MTP) keeps the last
        `num_prefill_lookahead - 1` computed tokens out of the cache; with prefix caching
        and an EAGLE group it must not exceed the scheduler block size.
        `num_hash_lookahead_tokens` is the request hasher's lookahead: each block's
        `BlockStored` then carries the tokens after it (`lookahead_token_ids`).
        `dcp_world_size` and `pcp_world_size` are vLLM's decode and prefill context
        parallelism: a DCP-sharded group's blocks hold `block_size * dcp_world_size`
        tokens (`group_block_sizes`). With `record_block_metrics`, the pool records the
        calls vLLM's pool makes on a KV cache metrics collector (`take_block_metrics`)."""
    def get_computed_blocks(
        self, request: Any, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int]: ...
    def find_cache_hit(
        self, request: Any, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        """vLLM 0.33's `get_computed_blocks` triple (with `shared_prefix_boundary`)."""
    def get_computed_blocks_for_connector(
        self, request: Any, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int, bool]: ...
    def find_longest_cache_hit_per_group(
        self, block_hashes: Sequence[bytes], max_cache_hit_length: int
    ) -> tuple[list[list[int]], list[int]]: ...
    def prefix_cache_lookup_enabled(self, request: Any) -> bool: ...
    @property
    def coordinator_kind(self) -> str:
        """vLLM's coordinator class name for this manager's coordinator."""
    @property
    def num_reprefillable_tokens(self) -> int:
        """Computed tokens multi-module MTP may re-prefill, never cached."""
    @property
    def enable_partial_hash_hits(self) -> bool:
        """Whether prefix hits may end on a hash boundary inside a block."""
    @property
    def cache_hit_alignment_tokens(self) -> int:
        """The granularity of prefix hits, in tokens."""
    def arm_mamba_shared_prefix_checkpoint(self) -> bool:
        """Arms vLLM's Mamba shared-prefix checkpoint where vLLM would; whether it is."""
    @property
    def retention_interval(self) -> int | None:
        """The `prefix_cache_retention_interval` in force (None: dense caching)."""
    @retention_interval.setter
    def retention_interval(self, value: int | None) -> None: ...
    @property
    def scheduler_block_size(self) -> int: ...
    @property
    def hash_block_size(self) -> int: ...
    def mamba_checkpoint(self, request_id: str, group_id: int) -> tuple[int, int] | None:
        """This step's prefill checkpoint in an align-mode Mamba group, `(position,
        table index)`, or None."""
    @property
    def num_hash_lookahead_tokens(self) -> int: ...
    @property
    def group_block_sizes(self) -> list[int]: ...
    @property
    def group_context_parallel_sizes(self) -> list[tuple[int, int]]: ...
    @property
    def full_attention_group_id(self) -> int | None: ...
    @property
    def spec_groups(self) -> list[tuple[list[int], bool]] | None:
        """The hybrid coordinator's spec groups in lookup order, `(group_ids, use_eagle)`
        each; `None` for the other coordinators."""
    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: object = None,
    ) -> KVCacheBlocks | None:
        """The blocks added, or None when they do not fit. Calls that add nothing (and
        lookups without a hit) return one shared, immutable empty KVCacheBlocks, as vLLM's
        `empty_kv_cache_blocks`."""
    def allocate_slots_batch(
        self, requests: Sequence[Request], num_new_tokens: Sequence[int]
    ) -> list[tuple[tuple[int, ...], ...] | None]:
        """Per pair, the block ids `allocate_slots(r, n)` adds, one tuple per group;
        stops after the first pair that does not fit (its entry is None)."""
    @property
    def retention(self) -> RetentionPolicy | None:
        """The retention policy, if one is set (docs/retention.md)."""
    @property
    def now(self) -> float:
        """The clock retention policies read (`advance_time`)."""
    def advance_time(self, now: float) -> None:
        """Advances the clock to `now` (seconds, or a step counter; it must not go back)."""
    def pin(self, request: Any) -> None:
        """Pins the cached blocks of the request's full prompt blocks, in every group, for
        as long as the pin holds; blocks cached later under them are pinned too."""
    def unpin(self, request: Any) -> None:
        """Drops a pin `pin(request)` took; `KeyError` (and no change) if there is none."""
    def pin_hashes(self, block_hashes: Sequence[bytes]) -> None:
        """`pin` for the prefix the hashes (at the hash block size) name."""
    def unpin_hashes(self, block_hashes: Sequence[bytes]) -> None:
        """`unpin` for the prefix the hashes name."""
    def free(self, request: Any) -> None: ...
    def pop_blocks_for_free(self, request: Any) -> list[int]:
        """Forgets the request; its block ids, to free later in reverse order."""
    def estimate_cached_tokens(self, request: Any) -> int: ...
    def get_blocks(self, request_id: str) -> KVCacheBlocks: ...
    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]: ...
    def get_block_ids_for_computed_tokens(
        self, request_id: str, num_computed_tokens: int
    ) -> tuple[list[int], ...]:
        """Block ids covering the computed tokens, per group (each attention type decides:
        cross-attention and Mamba groups whole)."""
    def truncate_computed_blocks(
        self, blocks: KVCacheBlocks, num_computed_tokens: int
    ) -> KVCacheBlocks:
        """The lookup result cut at `num_computed_tokens` (no ref count changes);
        `InvalidArgumentError` for an end off a prefix-cached group's block grid or past an
        attention group's hit (only a Mamba group's may end before it)."""
    def block_table(self, request_ids: Sequence[str], group_id: int = 0) -> memoryview:
        """The tables of `request_ids` in group `group_id` as one C-contiguous int32 buffer
        of shape `(len(request_ids), max_blocks)`, rows padded with the null block 0;
        `numpy.asarray` and `torch.frombuffer` view it without a copy. `max_blocks` is the
        longest of those tables, at least 1; an unknown request id gives a row of nulls."""
    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None: ...
    def new_step_starts(self) -> None: ...
    def take_block_copies(self) -> list[tuple[int, int]]:
        """Partial-hit copies queued since the last call, `[(src, dst), ...]`; each
        endpoint keeps a reference until freed with the pool's `free_blocks`."""
    def finalize_partial_tails(
        self, request_id: str, num_computed_tokens: int, num_in_flight_tokens: int
    ) -> list[tuple[int, int, int]]:
        """The align-mode Mamba partial tails a finishing request cached itself and did
        not overwrite, `[(group_id, block_id, boundary_tokens), ...]`."""
    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """Align-mode Mamba states cached since the last call, for a KV connector to
        offload: `{request_id: [(group_id, block_id, num_tokens), ...]}`."""
    def take_new_block_ids(self) -> list[int]:
        """Blocks allocated since the last call that the worker must zero."""
    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None: ...
    def evict_blocks(self, block_ids: Iterable[int]) -> None: ...
    def reset_prefix_cache(self) -> bool: ...
    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]: ...
    def take_block_metrics(self) -> list[tuple[int, int]]:
        """The calls vLLM's pool would have made on a KV cache metrics collector since the
        last call, oldest first, as `(op, block_id)`: op 0 `on_block_allocated`, 1
        `on_block_accessed`, 2 `on_block_evicted`. Empty unless built with
        `record_block_metrics=True`."""
    def take_events(self) -> list[BlockStored | BlockRemoved | AllBlocksCleared]: ...
    def record_prefix_cache_stats(self, request: Any, num_hits: int) -> None: ...
    def make_prefix_cache_stats(self) -> PrefixCacheStats | None: ...
    @property
    def current_prefix_cache_stats(self) -> PrefixCacheStats | None: ...
    @property
    def stats_mirror(self) -> object | None:
        """An object whose stats attributes are kept equal to the recorded stats."""
    @stats_mirror.setter
    def stats_mirror(self, value: object | None) -> None: ...
    def block_objects(self, block_ids: Sequence[int], host: bool = False) -> list[KVCacheBlock]: ...
    def pop_blocks_for_free_by_group(self, request_id: str, finished: bool) -> list[list[int]]: ...
    def kv_cache_blocks(self, blocks: Sequence[Sequence[int]]) -> KVCacheBlocks: ...
    def request_ids(self) -> list[str]: ...
    def num_cached_blocks(self, request_id: str, group_id: int) -> int | None: ...
    def get_group_num_blocks_to_allocate(
        self,
        group: int,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[int],
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """One group's share of `get_num_blocks_to_allocate` (vLLM's manager's own)."""
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Sequence[int]],
        num_encoder_tokens: int,
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        num_local_computed_tokens: int = 0,
        prefill_end: int = 0,
    ) -> int: ...
    def remove_skipped_blocks(
        self,
        request_id: str,
        processed_computed_tokens: int,
        num_prompt_tokens: int | None = None,
    ) -> None: ...
    @property
    def usage(self) -> float: ...
    @property
    def watermark_blocks(self) -> int: ...
    @property
    def num_kv_cache_groups(self) -> int: ...
    @property
    def block_pool(self) -> BlockPool:
        """The manager's own pool, with the whole `BlockPool` API."""
    @property
    def hisparse_host_pool(self) -> BlockPool | None:
        """HiSparse's host pool (`None` without a host-resident group); its events join
        the manager's queue after each call."""
    def free_request(self, request_id: str, finished: bool) -> None:
        """`free`, saying whether the request finished (vLLM's `is_finished()`)."""
    def hisparse_advance_scheduled(self, requests: Sequence[tuple[str, int]]) -> None: ...
    def hisparse_build_offload_command(
        self,
    ) -> list[tuple[int, int, list[int], bool, bool]] | None: ...
    def hisparse_update_spills(
        self, enqueued: Mapping[int, int], completed: Mapping[int, int]
    ) -> None: ...
    def hisparse_take_residency_updates(
        self, request_ids: Sequence[str]
    ) -> list[tuple[str, list[int], list[list[int]]]]: ...
    def hisparse_build_row_mirrors(
        self, requests: Sequence[tuple[str, int, int]]
    ) -> list[tuple[list[int], int, int]]: ...
    def hisparse_all_context_pages_resident(
        self, requests: Sequence[tuple[str, int, int]]
    ) -> bool: ...
    def hisparse_has_pending_work(self) -> bool: ...
    def hisparse_has_pending_reclamation(self) -> bool: ...
    def hisparse_finish_host_import(self, request_id: str, *, failed: bool) -> None: ...
    def hisparse_complete_host_import(self, request_id: str, num_computed_tokens: int) -> None: ...
    def hisparse_residency_row(self, request_id: str, group: int, start: int = 0) -> list[int]: ...
    def hisparse_require_hot(self, request_id: str) -> None: ...
    def hisparse_take_host_block_copies(self) -> list[tuple[int, int]]: ...
    def hisparse_release_completed_host_copies(self, dst_block_ids: Sequence[int]) -> None: ...
    def hisparse_allocate_hot(self, request_id: str, group: int) -> list[int]: ...
    def hisparse_plan_prefix_materialization(
        self, request_id: str, num_computed_tokens: int
    ) -> None: ...
    def hisparse_update_residency(self, request_id: str) -> None: ...
    def hisparse_layout(self) -> dict[str, Any] | None: ...
    def hisparse_set_max_spill_pages(self, pages: int) -> None: ...
    def hisparse_state_ids(self) -> list[str]: ...
    def hisparse_pending_spill_ids(self) -> list[int]: ...
    def hisparse_spills_to_send(self) -> list[tuple[int, int, list[int], bool, bool]]: ...
    def hisparse_hot(self, request_id: str) -> tuple[bool, bool]: ...
    def hisparse_request_state(self, request_id: str) -> dict[str, object] | None: ...
    def hisparse_copies(self) -> list[tuple[bytes, int, list[int]]]: ...

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
        *,
        count_null_block_refs: bool = False,
        retention: RetentionPolicy | None = None,
        medium: Literal["GPU", "CPU", "STORAGE"] = "GPU",
    ) -> BlockPool:
        """`count_null_block_refs`: `touch` and `free_blocks` count the null block's
        `ref_cnt` as vLLM 0.32 does (off: never counted, as vLLM 0.33). `medium`: what
        the pool's `BlockStored` and `BlockRemoved` events name (vLLM 0.33's `medium`; a
        host pool's is `"CPU"`)."""
    @property
    def num_gpu_blocks(self) -> int: ...
    @property
    def enable_caching(self) -> bool: ...
    @property
    def hash_block_size(self) -> int: ...
    @property
    def enable_kv_cache_events(self) -> bool: ...
    @property
    def medium(self) -> str:
        """The medium the pool's events name."""
    def get_new_blocks(self, n: int) -> list[int]:
        """Pops `n` blocks off the free queue head; ValueError if fewer are free."""
    def free_blocks(
        self,
        block_ids: Sequence[int],
        *,
        priority_class: int | None = None,
        session: bool = False,
        tenant: str | None = None,
    ) -> None:
        """Drops one reference per block, in the given order (pass a table reversed).

        Under a retention policy the freed cached blocks take `priority_class` (default:
        the policy's default class), the session window if `session`, and count against
        `tenant`'s quota. Without a policy these keywords have no effect, as a pool
        without one has no classes, sessions or quotas.
        """
    def touch(self, block_ids: Sequence[int]) -> None:
        """Takes one reference per block (a prefix-cache hit); the null block is skipped."""
    def unpin_blocks(self, block_ids: Sequence[int], on_reuse: Callable[[int], object]) -> None:
        """vLLM 0.33's `unpin_blocks`: drops one reference per block for a caller that
        goes on reading the blocks until the pool reuses them.

        Blocks reaching 0 join the tail of the free queue (cached or not) and count as
        free. `on_reuse(block_id)` is called when `get_new_blocks` hands the block out or
        `reset_prefix_cache` clears the cache, in vLLM's order; every callback runs, and
        the first exception one raises is raised after the pool call completed. Raises,
        changing nothing, for the null block, an unknown id, a block without a reference,
        a pool with a retention policy, and a manager's `block_pool`.
        """
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
    def cache_partial_block(
        self,
        request_block_hashes: Sequence[bytes],
        block_id: int,
        num_tokens: int,
        kv_cache_group_id: int,
        token_ids: Sequence[int] | None = None,
        replace_existing_hashes: bool = False,
    ) -> None:
        """Registers the prefix of `num_tokens` tokens as a partial cache entry of
        `block_id`; `replace_existing_hashes` first drops the block's keys."""
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
    @property
    def retention(self) -> RetentionPolicy | None:
        """The retention policy, if one is set."""
    @property
    def now(self) -> float:
        """The pool's clock (`advance_time`)."""
    def advance_time(self, now: float) -> None: ...
    def pin(
        self, block_hashes: Sequence[bytes], group_ids: Sequence[int] | None = None
    ) -> None: ...
    def unpin(
        self, block_hashes: Sequence[bytes], group_ids: Sequence[int] | None = None
    ) -> None: ...
    @property
    def num_pinned_blocks(self) -> int: ...
    def get_tenant_cached_blocks(self) -> dict[str, int]:
        """Tenants with a quota and how many unheld cached blocks each keeps."""
    def check_invariants(self) -> None:
        """Checks the free queue, ref counts and prefix map agree; RuntimeError if not."""
    def take_events(self) -> list[_KVCacheEvent]:
        """Returns and clears the recorded events."""

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

def external_block_hashes(block_hashes: Sequence[bytes]) -> list[int]:
    """Block hashes as KV cache events publish them (`BlockHash::external`): what a router
    that indexes the events looks a request's `block_hashes` up by."""

@final
class BlockHasher:
    """The block size and algorithm a `Request` hashes its full blocks with."""

    def __new__(
        cls, hash_block_size: int, algo: str = "sha256_cbor", num_hash_lookahead_tokens: int = 0
    ) -> BlockHasher:
        """With `num_hash_lookahead_tokens` L > 0, each block's hash also covers the L
        tokens after it (vLLM 0.33's lookahead hashes): a request hashes a block once
        those tokens exist."""
    @property
    def hash_block_size(self) -> int: ...
    @property
    def algo(self) -> str: ...
    @property
    def num_hash_lookahead_tokens(self) -> int: ...

@final
class RequestBlockHasher:
    """vLLM's request block hasher: `hasher(request)` gives the hashes of the full blocks a
    vLLM `Request` completed since its last call (see `kvblocks.vllm`)."""

    def __new__(
        cls,
        hash_block_size: int,
        algo: str,
        num_hash_lookahead_tokens: int = 0,
        *,
        none_hash_from: object | None = None,
        tensor_data: Callable[[Any], Any] | None = None,
    ) -> RequestBlockHasher: ...
    @property
    def hash_block_size(self) -> int: ...
    @property
    def algo(self) -> str: ...
    @property
    def num_hash_lookahead_tokens(self) -> int: ...
    def __call__(self, request: Any, /) -> list[bytes]:
        """The new hashes of `request` (vLLM's `Request`, read in place), as `bytes`."""

# --- request -------------------------------------------------------------------------------

def append_token_ids_batch(requests: Sequence[Request], token_ids: Sequence[int]) -> None:
    """Appends `token_ids[i]` to `requests[i]` for every i, hashing completed blocks.

    One call per scheduler step instead of one `append_output_token_ids` per request.
    Raises ValueError on a length mismatch and a RuntimeError (already borrowed) if a
    request is listed twice, before any request changes.
    """

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
        priority: int = 0,
        session_id: str | None = None,
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
    def priority(self) -> int:
        """vLLM's scheduling priority (lower is more urgent); a retention policy maps it to
        a class."""
    @property
    def session_id(self) -> str | None:
        """The session the request belongs to, if any."""
    @property
    def all_token_ids(self) -> list[int]: ...
    @property
    def block_hashes(self) -> list[bytes]: ...
    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None:
        """Appends output tokens and hashes the full blocks they complete."""

# --- events (src/python/publish.rs) ---

def encode_event_batch(
    ts: float,
    events: Iterable[object],
    data_parallel_rank: int | None = None,
    *,
    format: str = "map",
) -> bytes: ...

@final
class EventSink:
    def __new__(
        cls,
        *,
        max_queue_size: int = 100_000,
        format: str = "map",
        data_parallel_rank: int | None = 0,
    ) -> EventSink: ...
    def publish(
        self,
        events: Iterable[object],
        ts: float | None = None,
        data_parallel_rank: int | None = None,
    ) -> bool: ...
    def publish_from(self, source: KVCacheManager | BlockPool, ts: float | None = None) -> bool: ...
    def request_snapshot(self) -> None: ...
    def next_payload(self, timeout: float) -> tuple[int, bytes] | None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def pending(self) -> int: ...
    @property
    def stale(self) -> bool: ...
    def stats(self) -> dict[str, int]: ...
    def cached_keys(self) -> set[tuple[int, int]]: ...

# --- align-mode Mamba's prefill checkpoints (src/python/mamba.rs) --------------------------

def mamba_checkpoint_position(
    num_tokens: int, alignment: int, drop_eagle: bool, hash_lookahead_tokens: int
) -> int:
    """vLLM's `get_mamba_prefill_checkpoint_position`: the reusable state boundary of a
    prefill of `num_tokens` tokens."""

def mamba_checkpoint_exportable(
    start: int, end: int, position: int, hash_block_size: int, block_size: int, alignment: int
) -> bool:
    """vLLM's `is_mamba_prefill_checkpoint_valid`: whether the kernel can export the state at
    `position` from a query `[start, end)`."""

# --- the simulator's hit-rate ceilings (src/python/ceilings.rs) ---------------------------

def ceiling_block_keys(
    token_ids: Sequence[int], block_size: int, salt: str | None = None
) -> list[int]:
    """One key per full block of `token_ids`; equal keys mean equal prefixes (and salts)."""

@final
class CeilingLog:
    """A run's stores and lookups, in order; the infinite cache's hits as it goes and
    Belady's at the end."""

    def __new__(cls) -> CeilingLog: ...
    def __len__(self) -> int: ...
    def store(self, keys: Sequence[int]) -> None:
        """Blocks that entered the cache, in block order (an empty store is not recorded)."""
    def lookup(self, keys: Sequence[int]) -> int:
        """A lookup of `keys` (distinct, in block order); returns how many leading keys the
        infinite cache holds."""
    def belady(self, capacity: int) -> list[int]:
        """Hit blocks of every lookup so far under Belady's rule with `capacity` blocks."""

# --- The host-memory tier (src/python/offload.rs; docs/offload.md) ---------------------

@final
class OffloadManager:
    """vLLM 0.33's CPU offload tier (`CPUOffloadingManager`) with its decisions exactly,
    under vLLM's `"lru"` or `"arc"` policy or kvblocks' retention order (a
    `RetentionPolicy` without TTLs or session windows). Keys are vLLM's `OffloadKey`
    bytes: a block hash followed by the KV cache group index as 4 big-endian bytes.

    Requests are named by id; a request id must not be used again after
    `on_request_finished`.
    """

    def __new__(
        cls,
        num_chunks: int,
        policy: str | RetentionPolicy,
        *,
        enable_events: bool = False,
        store_threshold: int = 0,
        max_tracker_size: int = 64000,
    ) -> OffloadManager:
        """A tier of `num_chunks` chunks. With `store_threshold >= 2` a key is stored once
        it was offered that many times (vLLM's tracker of `max_tracker_size` keys)."""
    @property
    def num_chunks(self) -> int: ...
    @property
    def num_free(self) -> int:
        """Chunks neither held nor allocated."""
    @property
    def num_evictable(self) -> int:
        """Chunks held with no transfer in flight."""
    @property
    def num_write_pending(self) -> int:
        """Chunks whose store is in flight."""
    @property
    def stores_skipped(self) -> int:
        """Store candidates the threshold skipped so far."""
    def set_positions(self, req_id: str, keys: Sequence[bytes], positions: Sequence[int]) -> None:
        """The end-token position of each key in the request (vLLM's
        `ReqContext.set_offload_key_position`)."""
    def set_hints(self, req_id: str, *, priority: int = 0, tenant: str | None = None) -> None:
        """The priority (mapped to a class) and tenant the request's chunks are stored under
        (retention orders only)."""
    def on_new_request(self, req_id: str) -> None: ...
    def lookup(self, key: bytes) -> Literal["miss", "hit", "hit_pending"]:
        """Whether `key` is in the tier: `hit_pending` while its store is in flight."""
    def prepare_load(self, keys: Sequence[bytes], req_id: str) -> list[int]:
        """Pins ready chunks for reading; returns their chunk slots."""
    def touch(self, keys: Sequence[bytes]) -> None:
        """Marks `keys` recently used."""
    def complete_load(self, keys: Sequence[bytes]) -> None:
        """Ends reads started by `prepare_load`."""
    def prepare_store(
        self, keys: Sequence[bytes], req_id: str
    ) -> tuple[list[bytes], list[int], list[bytes]] | None:
        """(keys to store, their chunk slots, keys evicted for them), or None when the
        tier cannot make room."""
    def complete_store(self, keys: Sequence[bytes], success: bool = True) -> None:
        """Ends stores: the chunks become readable, or, on failure, are dropped."""
    def on_request_finished(self, req_id: str) -> None:
        """Applies the request's accesses to the policy once, and forgets the request."""
    def reset_cache(self) -> None:
        """Drops every chunk (the store-threshold tracker is kept)."""
    def take_events(self) -> list[tuple[list[bytes], bool, bool]]:
        """(keys, removed, metadata_only) of each event since the last call."""
    def pin(self, key: bytes) -> None:
        """Keeps `key` from eviction (retention orders only; counts)."""
    def unpin(self, key: bytes) -> None:
        """Drops one pin (`NotPinnedError` when there is none)."""

@final
class OffloadRequest:
    """A request's state in an `OffloadPolicy`: its shared recency rank and hints."""

    def __new__(cls, *, priority: int = 0, tenant: str | None = None) -> OffloadRequest: ...

@final
class OffloadPolicy:
    """vLLM 0.33's `CachePolicy` interface on the core (`kvblocks.vllm`'s offload
    policies): holds the caller's chunk objects (with `chunk_id`, `ref_cnt`) by slot and
    follows their reference counts through `mark_evictable` / `mark_non_evictable`."""

    def __new__(cls, policy: str | RetentionPolicy, capacity: int) -> OffloadPolicy: ...
    @property
    def generation(self) -> int: ...
    def get(self, key: bytes) -> Any | None: ...
    def insert(self, key: bytes, chunk: Any, position: int | None, req: OffloadRequest) -> None: ...
    def remove(self, key: bytes) -> None: ...
    def touch(self, keys: Iterable[bytes]) -> None: ...
    def on_store_miss(self, keys: Iterable[bytes]) -> None: ...
    def on_request_access(
        self, keys: Iterable[bytes], positions: Sequence[int | None], req: OffloadRequest
    ) -> None: ...
    def on_request_finished(
        self,
        keys: Iterable[bytes],
        positions: Sequence[int | None],
        insertion_only: Iterable[bytes],
        reused: Iterable[bytes],
    ) -> None: ...
    def evict(self, n: int, protected: Iterable[bytes]) -> list[tuple[bytes, Any]] | None: ...
    def clear(self) -> None: ...
    def mark_evictable(self, key: bytes) -> None: ...
    def mark_non_evictable(self, key: bytes) -> None: ...
    def pin(self, key: bytes) -> None: ...
    def unpin(self, key: bytes) -> None: ...
    def lists(self) -> dict[str, list[bytes]]:
        """The policy's ordered lists by name, oldest first (ARC: t1, t2, b1, b2)."""
    def heap(self) -> list[tuple[tuple[int, int], bytes]]:
        """The lazy eviction heap's entries, stale ones included (LRU)."""
    @property
    def target_t1_size(self) -> float | None:
        """ARC's adaptive target size of T1 (None for other policies)."""
    @target_t1_size.setter
    def target_t1_size(self, target: float) -> None: ...

# --- the router index (src/python/router.rs) -----------------------------------------

@final
class EngineHit:
    """One engine's hit for a request: GPU tokens (its `get_computed_blocks` now), host
    tokens past them (CPU offloading), blocks of `block_size` tokens, and freshness
    (`"exact"`, `"catching_up"`, `"stale"` or `"mismatched"`)."""

    @property
    def engine(self) -> str: ...
    @property
    def gpu_tokens(self) -> int: ...
    @property
    def gpu_blocks(self) -> int: ...
    @property
    def host_tokens(self) -> int: ...
    @property
    def host_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def freshness(self) -> str: ...

@final
class KVIndex:
    """What every engine of a fleet caches, from their KV event streams (docs/router.md)."""

    def __new__(cls) -> KVIndex: ...
    def add_engine(
        self,
        engine_id: str,
        kv_cache_config: KVCacheConfig | Any,
        *,
        max_model_len: int,
        hash_block_size: int,
        hash_algo: str = "sha256_cbor",
        python_hash_seed: str | None = None,
        data_parallel_rank: int | None = None,
        host_tier: bool = False,
        host_block_size: int | None = None,
        started_empty: bool = False,
        scheduler_block_size: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        mamba_none_prefix_caching: bool = False,
        num_hash_lookahead_tokens: int = 0,
    ) -> None:
        """Registers an engine: its layout (kvblocks' `KVCacheConfig`, or vLLM's, read by
        `kvblocks.vllm` without importing vLLM), hashing and manager options. `host_tier`:
        it runs vLLM's CPU `OffloadingConnector` (full-attention layouts), whose chunks
        are `host_block_size` tokens (its `block_size`; default: the block size)."""
    def remove_engine(self, engine_id: str) -> None: ...
    def engines(self) -> list[str]: ...
    def ingest(self, engine_id: str, payload: bytes, seq: int | None = None) -> tuple[int, str]:
        """Applies one payload (`seq`: its sequence number, `None`: the next); returns
        the batches applied and the engine's freshness."""
    def skip_gap(self, engine_id: str) -> str: ...
    def reset_engine(self, engine_id: str) -> str: ...
    def status(self, engine_id: str) -> dict[str, Any]: ...
    def memory(self) -> tuple[int, int]:
        """Bytes of residency tables (both copies) and the residencies they hold."""
    def hits(
        self,
        tokens: Sequence[int],
        *,
        cache_salt: str | None = None,
        lora_name: str | None = None,
        lora_path: str | None = None,
        mm_features: Sequence[tuple[str, int, int]] | None = None,
        engines: Sequence[str] | None = None,
    ) -> dict[str, EngineHit]: ...
    def hits_from_hashes(
        self,
        block_hashes: Sequence[bytes],
        num_tokens: int,
        *,
        engines: Sequence[str] | None = None,
    ) -> dict[str, EngineHit]: ...
