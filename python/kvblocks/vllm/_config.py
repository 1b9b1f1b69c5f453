"""vLLM's `KVCacheConfig` and spec objects as kvblocks' own, or a clear refusal.

A configuration kvblocks cannot serve fails here, at construction, with an error that
names what is missing: never a wrong answer at step time.
"""

from __future__ import annotations

from typing import Any

import kvblocks as kb


class UnsupportedConfigError(kb.UnsupportedError):
    """A vLLM configuration (spec type, option) the kvblocks core does not implement (a
    `kvblocks.UnsupportedError`, so also a `NotImplementedError`)."""


def _common(spec: Any) -> dict[str, Any]:
    return {
        "block_size": spec.block_size,
        "num_kv_heads": spec.num_kv_heads,
        "head_size": spec.head_size,
        "dtype": spec.dtype,
        "page_size_padded": spec.page_size_padded,
        "dcp_sharded": spec.dcp_sharded,
    }


def _head_size_v(spec: Any) -> dict[str, Any]:
    return {"head_size_v": spec.head_size_v}


def _full(spec: Any) -> kb.KVCacheSpec:
    return kb.FullAttentionSpec(
        **_common(spec),
        **_head_size_v(spec),
        sliding_window=spec.sliding_window,
        attention_chunk_size=spec.attention_chunk_size,
    )


def _mla(spec: Any) -> kb.KVCacheSpec:
    return kb.MLAAttentionSpec(
        **_common(spec), cache_dtype_str=spec.cache_dtype_str, alignment=spec.alignment
    )


def _sink(spec: Any) -> kb.KVCacheSpec:
    return kb.SinkFullAttentionSpec(
        **_common(spec),
        **_head_size_v(spec),
        sink_len=spec.sink_len,
        sliding_window=spec.sliding_window,
        attention_chunk_size=spec.attention_chunk_size,
    )


def _sliding(spec: Any) -> kb.KVCacheSpec:
    return kb.SlidingWindowSpec(
        **_common(spec),
        **_head_size_v(spec),
        sliding_window=spec.sliding_window,
        extra_retained_tokens=spec.extra_retained_tokens,
    )


def _chunked(spec: Any) -> kb.KVCacheSpec:
    return kb.ChunkedLocalAttentionSpec(
        **_common(spec), **_head_size_v(spec), attention_chunk_size=spec.attention_chunk_size
    )


def _cross(spec: Any) -> kb.KVCacheSpec:
    return kb.CrossAttentionSpec(**_common(spec), **_head_size_v(spec))


def _mamba(spec: Any) -> kb.KVCacheSpec:
    return kb.MambaSpec(
        block_size=spec.block_size,
        shapes=spec.shapes,
        dtypes=spec.dtypes,
        page_size_padded=spec.page_size_padded,
        # vLLM 0.33 names the backend by an enum (`MambaAttentionBackendEnum.MAMBA2`).
        mamba_type=getattr(spec.mamba_type, "name", spec.mamba_type).lower(),
        mamba_cache_mode=spec.mamba_cache_mode,
        num_speculative_blocks=spec.num_speculative_blocks,
        num_prefill_checkpoint_blocks=spec.num_prefill_checkpoint_blocks,
        prefill_checkpoint_alignment=spec.prefill_checkpoint_alignment,
    )


_CONVERTERS = {
    "FullAttentionSpec": _full,
    "MLAAttentionSpec": _mla,
    "SinkFullAttentionSpec": _sink,
    "SlidingWindowSpec": _sliding,
    "ChunkedLocalAttentionSpec": _chunked,
    "CrossAttentionSpec": _cross,
    "MambaSpec": _mamba,
}


def convert_spec(spec: Any) -> kb.KVCacheSpec:
    """kvblocks' spec for one of vLLM's (matched by exact class: vLLM's subclasses,
    e.g. `RSWASpec`, have rules of their own)."""
    name = type(spec).__name__
    if name == "UniformTypeKVCacheSpecs":
        return kb.UniformTypeKVCacheSpecs(
            block_size=spec.block_size,
            kv_cache_specs={k: convert_spec(v) for k, v in spec.kv_cache_specs.items()},
        )
    convert = _CONVERTERS.get(name)
    if convert is None:
        raise UnsupportedConfigError(
            f"kvblocks has no manager for vLLM's {name}; supported: "
            + ", ".join([*_CONVERTERS, "UniformTypeKVCacheSpecs"])
        )
    if getattr(spec, "is_draft", False):
        raise UnsupportedConfigError(f"draft-model KV cache groups ({name}, is_draft=True)")
    if getattr(spec, "non_causal", False):
        raise UnsupportedConfigError(f"non-causal attention ({name}, non_causal=True)")
    return convert(spec)


def convert_config(config: Any) -> kb.KVCacheConfig:
    """kvblocks' `KVCacheConfig` for vLLM's (its groups, specs and block count)."""
    groups = []
    for g in config.kv_cache_groups:
        if getattr(g, "host_resident", False):
            raise UnsupportedConfigError("host-resident KV cache groups")
        groups.append(
            kb.KVCacheGroupSpec(
                list(g.layer_names), convert_spec(g.kv_cache_spec), g.is_eagle_group
            )
        )
    return kb.KVCacheConfig(
        num_blocks=config.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=groups,
        prefix_cache_retention_interval=config.prefix_cache_retention_interval,
    )
