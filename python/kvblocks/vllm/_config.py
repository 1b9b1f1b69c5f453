"""vLLM's `KVCacheConfig` and spec objects as kvblocks' own, or a clear refusal.

A configuration kvblocks cannot serve fails here, at construction, with an error that
names what is missing: never a wrong answer at step time.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import kvblocks as kb


class UnsupportedConfigError(kb.UnsupportedError):
    """A vLLM configuration (spec type, option) the kvblocks core does not implement (a
    `kvblocks.UnsupportedError`, so also a `NotImplementedError`)."""


#: The fields of vLLM's attention specs that every attention converter reads.
_ATTENTION = (
    "block_size",
    "num_kv_heads",
    "head_size",
    "dtype",
    "page_size_padded",
    "num_head_slots",
    "state_content_bytes",
    "tokens_per_state",
    "dcp_sharded",
)

#: vLLM's spec classes kvblocks converts, by class name: kvblocks' spec class and the
#: fields of vLLM's that the conversion reads, each passed to kvblocks' class by the same
#: name. The drift guard (`_drift.py`) checks these names against the installed vLLM.
SPECS: dict[str, tuple[Callable[..., kb.KVCacheSpec], tuple[str, ...]]] = {
    "FullAttentionSpec": (
        kb.FullAttentionSpec,
        (*_ATTENTION, "head_size_v", "sliding_window", "attention_chunk_size"),
    ),
    "MLAAttentionSpec": (kb.MLAAttentionSpec, (*_ATTENTION, "cache_dtype_str", "alignment")),
    # vLLM's marker subclass of MLA for extract_hidden_states: the same page, memory and
    # manager (full attention), and the same event kind ("mla_attention").
    "HiddenStateCacheSpec": (
        kb.MLAAttentionSpec,
        (*_ATTENTION, "cache_dtype_str", "alignment"),
    ),
    "SinkFullAttentionSpec": (
        kb.SinkFullAttentionSpec,
        (*_ATTENTION, "head_size_v", "sink_len", "sliding_window", "attention_chunk_size"),
    ),
    "RSWASpec": (
        kb.RSWASpec,
        (*_ATTENTION, "head_size_v", "rswa_window"),
    ),
    "SlidingWindowSpec": (
        kb.SlidingWindowSpec,
        (*_ATTENTION, "head_size_v", "sliding_window", "extra_retained_tokens"),
    ),
    "SlidingWindowMLASpec": (
        kb.SlidingWindowMLASpec,
        (
            *_ATTENTION,
            "sliding_window",
            "extra_retained_tokens",
            "cache_dtype_str",
            "alignment",
            "bounded_replay",
        ),
    ),
    "CircularBufferSpec": (kb.CircularBufferSpec, (*_ATTENTION, "head_size_v")),
    "ChunkedLocalAttentionSpec": (
        kb.ChunkedLocalAttentionSpec,
        (*_ATTENTION, "head_size_v", "attention_chunk_size"),
    ),
    "CrossAttentionSpec": (kb.CrossAttentionSpec, (*_ATTENTION, "head_size_v")),
    "MambaSpec": (
        kb.MambaSpec,
        (
            "block_size",
            "shapes",
            "dtypes",
            "page_size_padded",
            "mamba_type",
            "mamba_cache_mode",
            "num_speculative_blocks",
            "num_prefill_checkpoint_blocks",
            "prefill_checkpoint_alignment",
        ),
    ),
    "HiSparseHotSpec": (kb.HiSparseHotSpec, ("block_size", "page_size", "blocks_per_request")),
    "HiSparseResidentSpec": (kb.HiSparseResidentSpec, ("block_size", "page_size")),
}

#: The fields kvblocks reads of vLLM's other `kv_cache_interface` classes (here and in
#: `_manager.py`), checked by the drift guard like `SPECS`.
CONFIG_FIELDS: dict[str, tuple[str, ...]] = {
    "UniformTypeKVCacheSpecs": ("block_size", "kv_cache_specs"),
    "KVCacheGroupSpec": ("layer_names", "kv_cache_spec", "is_eagle_group"),
    "KVCacheConfig": (
        "num_blocks",
        "kv_cache_groups",
        "prefix_cache_retention_interval",
        "needs_kv_cache_zeroing",
    ),
}

#: Fields read where present only (a vLLM without them has nothing to convert), so the
#: drift guard does not require them: `host_resident` and `role` of a group,
#: `hisparse_host_num_blocks` of a config. (A spec's `is_draft` and `non_causal` are not
#: read: vLLM's manager never reads them either.)
OPTIONAL_FIELDS = ("host_resident", "role", "hisparse_host_num_blocks")


def _value(name: str, value: Any) -> Any:
    """A vLLM field's value as kvblocks' constructor takes it."""
    if name == "mamba_type":
        # vLLM 0.33 names the backend by an enum (`MambaAttentionBackendEnum.MAMBA2`).
        return getattr(value, "name", value).lower()
    if name == "shapes" and value and all(isinstance(dim, int) for dim in value):
        # vLLM's `MambaSpec` stores `shapes` unchecked, and its own tests pass one flat shape
        # (`shapes=(1, 1)`): it never reads it in the manager, and its `page_size_bytes`
        # raises `TypeError` for it. kvblocks takes it as the one shape it spells.
        return (tuple(value),)
    return value


def convert_spec(spec: Any) -> kb.KVCacheSpec:
    """kvblocks' spec for one of vLLM's (matched by exact class: vLLM's subclasses,
    e.g. `RSWASpec`, have rules of their own). A draft model's layer (`is_draft`) and a
    non-causal one (`non_causal`) convert as any other: vLLM's manager reads neither."""
    name = type(spec).__name__
    if name == "UniformTypeKVCacheSpecs":
        return kb.UniformTypeKVCacheSpecs(
            block_size=spec.block_size,
            kv_cache_specs={k: convert_spec(v) for k, v in spec.kv_cache_specs.items()},
        )
    if name not in SPECS:
        raise UnsupportedConfigError(
            f"kvblocks has no manager for vLLM's {name}; supported: "
            + ", ".join([*SPECS, "UniformTypeKVCacheSpecs"])
        )
    make, fields = SPECS[name]
    return make(**{f: _value(f, getattr(spec, f)) for f in fields})


def convert_config(config: Any) -> kb.KVCacheConfig:
    """kvblocks' `KVCacheConfig` for vLLM's (its groups, specs and block counts)."""
    groups = [
        kb.KVCacheGroupSpec(
            list(g.layer_names),
            convert_spec(g.kv_cache_spec),
            g.is_eagle_group,
            host_resident=getattr(g, "host_resident", False),
            # vLLM 0.33's `KVCacheGroupRole` is a `str` enum: its value is the role's name.
            role=getattr(getattr(g, "role", None), "value", "default"),
        )
        for g in config.kv_cache_groups
    ]
    return kb.KVCacheConfig(
        num_blocks=config.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=groups,
        prefix_cache_retention_interval=config.prefix_cache_retention_interval,
        hisparse_host_num_blocks=getattr(config, "hisparse_host_num_blocks", None),
    )


def plain_config(config: Any) -> dict[str, Any]:
    """vLLM's `KVCacheConfig` as plain data (dicts, lists, strings, numbers, None): the
    fields `convert_config` reads, each object a dict naming its class under ``"type"``,
    dtypes as strings (``"torch.bfloat16"``), enums by name, fractions as
    ``{"type": "Fraction", "value": "1/2"}``. What a vLLM process sends a
    router that has no vLLM to unpickle vLLM's classes (`kvblocks.router.ray`);
    `config_from_plain` reads it back."""
    plain = _plain(config)
    if not isinstance(plain, dict) or plain.get("type") != "KVCacheConfig":
        raise UnsupportedConfigError(f"not a vLLM KVCacheConfig: {type(config).__name__}")
    return plain


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value if isinstance(value, str) else value.name
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Fraction):  # a spec's `tokens_per_state`
        return {"type": "Fraction", "value": str(value)}
    cls = type(value)
    if cls.__module__ == "torch" and cls.__name__ == "dtype":
        return str(value)
    name = cls.__name__
    fields = SPECS[name][1] if name in SPECS else CONFIG_FIELDS.get(name)
    if fields is None:
        raise UnsupportedConfigError(f"no plain form for vLLM's {name}")
    out: dict[str, Any] = {"type": name}
    for f in (*fields, *OPTIONAL_FIELDS):
        if hasattr(value, f):
            out[f] = _plain(getattr(value, f))
    return out


#: Stand-ins for vLLM's classes, by name, for `convert_config` to read plain data with.
_STAND_INS: dict[str, type] = {}


def config_from_plain(plain: Any) -> kb.KVCacheConfig:
    """kvblocks' `KVCacheConfig` for the plain form of vLLM's (`plain_config`)."""
    if not isinstance(plain, dict) or plain.get("type") != "KVCacheConfig":
        raise UnsupportedConfigError(
            f"not the plain form of a vLLM KVCacheConfig (kvblocks.vllm plain_config): {plain!r}"
        )
    try:
        return convert_config(_unplain(plain))
    except (AttributeError, KeyError, TypeError) as err:
        raise UnsupportedConfigError(f"malformed plain KVCacheConfig: {err}") from err


def _unplain(value: Any, field: str = "") -> Any:
    if isinstance(value, list):
        return tuple(_unplain(v) for v in value)
    if isinstance(value, dict) and value.get("type") == "Fraction":
        return Fraction(str(value["value"]))
    if isinstance(value, dict) and "type" in value:
        name = str(value["type"])
        if name not in SPECS and name not in CONFIG_FIELDS:
            raise UnsupportedConfigError(f"unknown class in a plain KVCacheConfig: {name}")
        cls = _STAND_INS.setdefault(name, type(name, (types.SimpleNamespace,), {}))
        return cls(**{k: _unplain(v, k) for k, v in value.items() if k != "type"})
    if isinstance(value, dict):
        return {k: _unplain(v) for k, v in value.items()}
    if field == "role" and isinstance(value, str):
        return types.SimpleNamespace(value=value)  # vLLM's role is an enum read by value
    return value
