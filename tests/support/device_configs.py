"""Stand-ins for the KVCacheConfig classes, mirroring the attribute contract kvblocks.device
relies on (the Rust-backed classes and vLLM's dataclasses have the same attributes and class
names). Used by tests/device/test_device.py and benches/python/device_bandwidth.py."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch


def _size(dtype: str | torch.dtype) -> int:
    d = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype)
    return torch.empty((), dtype=d).element_size()


@dataclass(frozen=True)
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: str | torch.dtype
    head_size_v: int = -1  # -1: same as head_size
    page_size_padded: int | None = None

    def __post_init__(self) -> None:
        if self.head_size_v < 0:
            object.__setattr__(self, "head_size_v", self.head_size)

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded:
            return self.page_size_padded
        return (
            self.block_size
            * self.num_kv_heads
            * (self.head_size + self.head_size_v)
            * _size(self.dtype)
        )


class SlidingWindowSpec(FullAttentionSpec):
    pass


class ChunkedLocalAttentionSpec(FullAttentionSpec):
    pass


class CrossAttentionSpec(FullAttentionSpec):
    pass


class SinkFullAttentionSpec(FullAttentionSpec):
    pass


@dataclass(frozen=True)
class MLAAttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: str | torch.dtype
    head_size_v: int = 0
    page_size_padded: int | None = None

    @property
    def page_size_bytes(self) -> int:
        real = self.block_size * self.num_kv_heads * self.head_size * _size(self.dtype)
        return self.page_size_padded or real


@dataclass(frozen=True)
class MambaSpec:
    block_size: int
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    page_size_padded: int | None = None

    @property
    def page_size_bytes(self) -> int:
        real = sum(math.prod(s) * _size(d) for s, d in zip(self.shapes, self.dtypes, strict=True))
        return self.page_size_padded or real


@dataclass(frozen=True)
class UniformTypeKVCacheSpecs:
    block_size: int
    kv_cache_specs: dict[str, Any]

    @property
    def page_size_bytes(self) -> int:
        return sum(s.page_size_bytes for s in self.kv_cache_specs.values())


@dataclass(frozen=True)
class KVCacheTensor:
    size: int
    shared_by: list[str]


@dataclass(frozen=True)
class KVCacheGroupSpec:
    layer_names: list[str]
    kv_cache_spec: Any


@dataclass(frozen=True)
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)


def single_group(
    num_blocks: int, spec: Any, num_layers: int, prefix: str = "layer"
) -> KVCacheConfig:
    """One group of `num_layers` layers with `spec`, one tensor per layer."""
    names = [f"{prefix}.{i}" for i in range(num_layers)]
    tensors = [KVCacheTensor(num_blocks * spec.page_size_bytes, [n]) for n in names]
    return KVCacheConfig(num_blocks, tensors, [KVCacheGroupSpec(names, spec)])


def hybrid(num_blocks: int, specs: list[Any], layers_per_group: int) -> KVCacheConfig:
    """vLLM's hybrid allocation: group g has `layers_per_group` layers; tensor i is shared by
    layer i of every group (all specs must have one page size)."""
    groups = [
        KVCacheGroupSpec([f"g{g}.{i}" for i in range(layers_per_group)], spec)
        for g, spec in enumerate(specs)
    ]
    page = specs[0].page_size_bytes
    tensors = [
        KVCacheTensor(num_blocks * page, [grp.layer_names[i] for grp in groups])
        for i in range(layers_per_group)
    ]
    return KVCacheConfig(num_blocks, tensors, groups)
