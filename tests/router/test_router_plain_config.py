"""The plain form of vLLM's KVCacheConfig that Ray Serve replicas announce
(`kvblocks.vllm._config.plain_config`), read back by a router without vLLM."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from fractions import Fraction

import pytest
from kvblocks.router import KVIndex
from kvblocks.vllm._config import (
    UnsupportedConfigError,
    config_from_plain,
    convert_config,
    plain_config,
)


# Stand-ins for vLLM's classes (their names and the fields kvblocks reads).
class KVCacheGroupRole(str, enum.Enum):
    DEFAULT = "default"


@dataclass
class FullAttentionSpec:
    block_size: int = 32
    num_kv_heads: int = 2
    head_size: int = 32
    dtype: str = "float32"
    page_size_padded: int | None = None
    num_head_slots: int | None = None
    state_content_bytes: int | None = None
    tokens_per_state: int | Fraction = 1
    dcp_sharded: bool = False
    head_size_v: int | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None


@dataclass
class SlidingWindowSpec(FullAttentionSpec):
    extra_retained_tokens: int = 0


@dataclass
class KVCacheGroupSpec:
    layer_names: list[str]
    kv_cache_spec: object
    is_eagle_group: bool = False
    role: KVCacheGroupRole = KVCacheGroupRole.DEFAULT


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)
    prefix_cache_retention_interval: int | None = None
    needs_kv_cache_zeroing: bool = False


def vllm_like_config() -> KVCacheConfig:
    return KVCacheConfig(
        48,
        [
            KVCacheGroupSpec(["layers.0"], FullAttentionSpec()),
            KVCacheGroupSpec(
                ["layers.1"], SlidingWindowSpec(sliding_window=64, tokens_per_state=Fraction(1, 1))
            ),
        ],
    )


def test_plain_config_reads_back_as_the_converted_config() -> None:
    config = vllm_like_config()
    plain = plain_config(config)
    assert plain["type"] == "KVCacheConfig"
    assert plain["kv_cache_groups"][0]["role"] == "default"
    spec = plain["kv_cache_groups"][1]["kv_cache_spec"]
    assert spec["tokens_per_state"] == {"type": "Fraction", "value": "1"}
    back, direct = config_from_plain(plain), convert_config(config)
    assert back.num_blocks == direct.num_blocks == 48
    for a, b in zip(back.kv_cache_groups, direct.kv_cache_groups, strict=True):
        assert a.layer_names == b.layer_names
        assert type(a.kv_cache_spec) is type(b.kv_cache_spec)
        assert a.kv_cache_spec.block_size == b.kv_cache_spec.block_size
        assert a.kv_cache_spec.sliding_window == b.kv_cache_spec.sliding_window
    KVIndex().add_engine("e", back, max_model_len=1024, hash_block_size=32)


@pytest.mark.parametrize(
    "plain",
    [
        None,
        {"type": "KVCacheConfig"},
        {"type": "Nope"},
        {"type": "KVCacheConfig", "num_blocks": 4, "kv_cache_groups": [{"type": "Evil"}]},
    ],
)
def test_a_malformed_plain_config_is_refused(plain: object) -> None:
    with pytest.raises(UnsupportedConfigError):
        config_from_plain(plain)


def test_plain_config_refuses_what_it_does_not_know() -> None:
    with pytest.raises(UnsupportedConfigError):
        plain_config(object())
