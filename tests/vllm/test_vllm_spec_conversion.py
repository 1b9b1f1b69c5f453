"""`kvblocks.vllm`'s spec conversion takes every spec the way vLLM's own tests
(`tests/v1/core/utils.py`, `test_prefix_caching.py`, `test_kv_cache_utils.py`,
`test_kv_cache_planning.py`) build it: kvblocks' page size and per-request memory equal
the installed vLLM's for each, and a spec type with no kvblocks manager is refused with
`UnsupportedError`, never a `TypeError`. Run in a vLLM venv (`make test-vllm`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from fractions import Fraction
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

import kvblocks as kb  # noqa: E402
from kvblocks.vllm._config import convert_spec  # noqa: E402
from vllm.v1 import kv_cache_interface as vi  # noqa: E402

MAX_MODEL_LEN = 1000
BATCHED_TOKENS = 256
ENCODER_TOKENS = 300


def _attention(cls: type, **kw: Any) -> Any:
    """An attention spec as `tests/v1/core/utils.py`'s `new_kv_cache_spec` builds it."""
    base: dict[str, Any] = {
        "block_size": 16,
        "num_kv_heads": 2,
        "head_size": 64,
        "dtype": torch.float32,
    }
    return cls(**{**base, **kw})


def _mamba(**kw: Any) -> Any:
    """A Mamba spec as `tests/v1/core/utils.py`'s `new_mamba_spec` builds it."""
    base: dict[str, Any] = {
        "block_size": 16,
        "shapes": ((2, 512), (3, 32, 32)),
        "dtypes": (torch.float32, torch.float32),
        "num_speculative_blocks": 2,
    }
    return vi.MambaSpec(**{**base, **kw})


def _align_mamba(shapes: Any) -> Any:
    """`test_prefix_caching.py`'s align-mode Mamba group."""
    return vi.MambaSpec(
        block_size=16, shapes=shapes, dtypes=(torch.float32,), mamba_cache_mode="align"
    )


SPECS: dict[str, Callable[[], Any]] = {
    "full": lambda: _attention(vi.FullAttentionSpec),
    "full_padded": lambda: _attention(vi.FullAttentionSpec, head_size=64, page_size_padded=65536),
    "full_recorded_window": lambda: _attention(vi.FullAttentionSpec, sliding_window=1024),
    "full_bf16_v": lambda: _attention(
        vi.FullAttentionSpec, dtype=torch.bfloat16, head_size=128, head_size_v=64
    ),
    "mla": lambda: vi.MLAAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16
    ),
    "mla_fp8_ds": lambda: vi.MLAAttentionSpec(
        block_size=16,
        num_kv_heads=1,
        head_size=576,
        dtype=torch.uint8,
        cache_dtype_str="fp8_ds_mla",
    ),
    "mla_aligned": lambda: vi.MLAAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16, alignment=4096
    ),
    # `test_contiguous_kv_packing.py`'s DeepSeek-V4 MLA: two tokens per stored state, its
    # page padded up to 576 bytes (kvblocks refused that padding as too small before).
    "mla_packed_aligned": lambda: vi.MLAAttentionSpec(
        block_size=128,
        num_kv_heads=1,
        head_size=584,
        dtype=torch.uint8,
        tokens_per_state=2,
        alignment=576,
    ),
    # `test_prefix_caching.py`'s compressed MLA group.
    "mla_packed": lambda: vi.MLAAttentionSpec(
        block_size=256, num_kv_heads=1, head_size=1, dtype=torch.uint8, tokens_per_state=4
    ),
    # `test_kv_cache_planning.py`'s fp8_ds_mla page: 656 bytes per state.
    "mla_state_content": lambda: vi.MLAAttentionSpec(
        block_size=64, num_kv_heads=1, head_size=576, dtype=torch.uint8, state_content_bytes=656
    ),
    "full_head_slots": lambda: _attention(vi.FullAttentionSpec, num_head_slots=1),
    # Causal Whisper's block pooling: four states per token, and its pooled window.
    "full_pooled": lambda: _attention(vi.FullAttentionSpec, tokens_per_state=Fraction(1, 4)),
    "sliding_window_pooled": lambda: _attention(
        vi.SlidingWindowSpec, sliding_window=33, tokens_per_state=Fraction(1, 4)
    ),
    "sliding_window": lambda: _attention(vi.SlidingWindowSpec, sliding_window=128),
    "sliding_window_padded": lambda: _attention(
        vi.SlidingWindowSpec, sliding_window=1024, page_size_padded=32 * 1024
    ),
    "chunked_local": lambda: _attention(vi.ChunkedLocalAttentionSpec, attention_chunk_size=64),
    "cross": lambda: _attention(vi.CrossAttentionSpec),
    # vLLM's manager asserts `sink_len % block_size == 0` (kvblocks checks it in the spec).
    "sink_full": lambda: _attention(vi.SinkFullAttentionSpec, sink_len=32),
    "mamba": lambda: _mamba(),
    "mamba_padded": lambda: _mamba(shapes=((2, 256), (3, 32, 32)), page_size_padded=16384),
    "mamba_align": lambda: _align_mamba(((1, 1),)),
    "mamba_align_1d": lambda: _align_mamba(((1,),)),
    "mamba_align_spec_blocks": lambda: vi.MambaSpec(
        block_size=16,
        shapes=((1, 1),),
        dtypes=(torch.float32,),
        mamba_cache_mode="align",
        num_speculative_blocks=2,
    ),
    "uniform_full": lambda: vi.UniformTypeKVCacheSpecs(
        block_size=16,
        kv_cache_specs={
            "a": _attention(vi.FullAttentionSpec),
            "b": _attention(vi.FullAttentionSpec, head_size=128),
        },
    ),
    # `test_kv_cache_utils.py`'s sliding-window MLA, and `test_contiguous_kv_packing.py`'s
    # DeepSeek-V4 one: two tokens per state, its page padded to a multiple of 576 bytes.
    "sliding_window_mla": lambda: vi.SlidingWindowMLASpec(
        block_size=16, num_kv_heads=1, head_size=576, dtype=torch.float32, sliding_window=128
    ),
    "sliding_window_mla_aligned": lambda: vi.SlidingWindowMLASpec(
        block_size=64,
        num_kv_heads=1,
        head_size=584,
        dtype=torch.uint8,
        sliding_window=128,
        tokens_per_state=2,
        alignment=576,
    ),
    # `test_prefix_replay.py`'s DeepSeek-V4.1 window: recomputed after a hit, not cached.
    "sliding_window_mla_bounded_replay": lambda: vi.SlidingWindowMLASpec(
        block_size=16,
        num_kv_heads=1,
        head_size=64,
        dtype=torch.bfloat16,
        sliding_window=32,
        bounded_replay=True,
    ),
    # `test_contiguous_kv_packing.py`'s DeepSeek-V4.1 compressor ring (one block a request).
    "circular_buffer": lambda: vi.CircularBufferSpec(
        block_size=8, num_kv_heads=1, head_size=1024, head_size_v=0, dtype=torch.float32
    ),
    # `test_kv_cache_planning.py`'s extract_hidden_states layer (an MLA page).
    "hidden_state_cache": lambda: vi.HiddenStateCacheSpec(
        block_size=16, num_kv_heads=3, head_size=1024, dtype=torch.bfloat16
    ),
    "rswa": lambda: _attention(vi.RSWASpec, rswa_window=64),
    # vLLM's manager reads neither flag: they convert as the plain spec.
    "full_non_causal": lambda: _attention(vi.FullAttentionSpec, non_causal=True),
    "uniform_sliding_window_mla": lambda: vi.UniformTypeKVCacheSpecs(
        block_size=64,
        kv_cache_specs={
            f"layers.{i}.swa": vi.SlidingWindowMLASpec(
                block_size=64,
                num_kv_heads=1,
                head_size=584,
                dtype=torch.uint8,
                sliding_window=128,
                alignment=576,
            )
            for i in range(3)
        },
    ),
    "uniform_mamba": lambda: vi.UniformTypeKVCacheSpecs(
        block_size=4,
        kv_cache_specs={
            "mamba": vi.MambaSpec(block_size=4, shapes=((4, 1),), dtypes=(torch.float32,))
        },
    ),
}
# vLLM 0.33 marks a draft model's layers (`is_draft`); 0.32's specs have no such field.
if "is_draft" in {f.name for f in dataclasses.fields(vi.FullAttentionSpec)}:
    SPECS["full_draft"] = lambda: _attention(vi.FullAttentionSpec, is_draft=True)


def _vllm_config(spec: Any) -> SimpleNamespace:
    """The parts of a `VllmConfig` that vLLM's `max_memory_usage_bytes` reads."""
    mode = getattr(spec, "mamba_cache_mode", "none")
    return SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=MAX_MODEL_LEN),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        cache_config=SimpleNamespace(mamba_cache_mode=mode),
        scheduler_config=SimpleNamespace(
            max_num_batched_tokens=BATCHED_TOKENS,
            max_num_encoder_input_tokens=ENCODER_TOKENS,
        ),
        max_in_flight_tokens=BATCHED_TOKENS,
    )


def _kvblocks_memory(spec: kb.KVCacheSpec) -> int:
    return spec.max_memory_usage_bytes(
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=BATCHED_TOKENS,
        max_num_encoder_input_tokens=ENCODER_TOKENS,
    )


@pytest.mark.parametrize("name", sorted(SPECS))
def test_page_size_and_memory_equal_vllms(name: str) -> None:
    theirs = SPECS[name]()
    ours = convert_spec(theirs)
    assert ours.page_size_bytes == theirs.page_size_bytes
    assert _kvblocks_memory(ours) == theirs.max_memory_usage_bytes(_vllm_config(theirs))


def _same_layers(name: str) -> list[Any]:
    """Three layers of spec `name` (vLLM's specs are frozen, so one object three times)."""
    spec = SPECS[name]()
    return [spec, spec, spec]


@pytest.mark.parametrize(
    "name",
    [
        "sliding_window_mla",
        "sliding_window_mla_aligned",
        "sliding_window_mla_bounded_replay",
        "hidden_state_cache",
        "rswa",
    ],
)
def test_merge_equals_vllms(name: str) -> None:
    theirs = _same_layers(name)
    merged = type(theirs[0]).merge(theirs)
    layers = [convert_spec(s) for s in theirs]
    ours = type(layers[0]).merge(layers)
    assert ours == convert_spec(merged)
    assert ours.page_size_bytes == merged.page_size_bytes


def test_sliding_window_mla_merge_refuses_other_windows() -> None:
    a = SPECS["sliding_window_mla"]()
    b = vi.SlidingWindowMLASpec(
        block_size=16, num_kv_heads=1, head_size=576, dtype=torch.float32, sliding_window=64
    )
    with pytest.raises(AssertionError):
        vi.SlidingWindowMLASpec.merge([a, b])
    with pytest.raises(kb.InvalidSpecError):
        kb.SlidingWindowMLASpec.merge([convert_spec(a), convert_spec(b)])


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("sliding_window", "sliding_window_mla"),
        ("sliding_window_mla", "sliding_window"),
        ("sliding_window_mla", "sliding_window_mla_aligned"),
        ("sliding_window_mla", "sliding_window_mla_bounded_replay"),
        ("circular_buffer", "circular_buffer"),
        ("circular_buffer", "cross"),
        ("hidden_state_cache", "mla"),
        ("rswa", "full"),
        ("full", "rswa"),
    ],
)
def test_uniform_type_rule_equals_vllms(first: str, second: str) -> None:
    a, b = SPECS[first](), SPECS[second]()
    if a.block_size != b.block_size:
        b = b.copy_with_new_block_size(a.block_size)
    theirs = vi.UniformTypeKVCacheSpecs.is_uniform_type({"a": a, "b": b})
    ours = kb.UniformTypeKVCacheSpecs.is_uniform_type({"a": convert_spec(a), "b": convert_spec(b)})
    assert ours == theirs


def test_flat_mamba_shape_converts_as_the_one_shape_it_spells() -> None:
    # `test_prefix_caching.py` builds `MambaSpec(shapes=(1, 1), ...)`: vLLM keeps it and
    # never reads its page size in the manager (reading it raises `TypeError`).
    flat = _align_mamba((1, 1))
    with pytest.raises(TypeError):
        _ = flat.page_size_bytes
    ours = convert_spec(flat)
    assert isinstance(ours, kb.MambaSpec)
    assert ours.shapes == ((1, 1),)
    nested = _align_mamba(((1, 1),))
    assert ours == convert_spec(nested)
    assert ours.page_size_bytes == nested.page_size_bytes


def test_states_per_token_keep_vllms_fraction() -> None:
    """vLLM's causal Whisper pools blocks (`tokens_per_state=Fraction(1, k)`): kvblocks'
    spec keeps the fraction; a `Fraction` with denominator 1 is the int."""
    theirs = _attention(vi.FullAttentionSpec, tokens_per_state=Fraction(2, 4))
    ours = convert_spec(theirs)
    assert ours.tokens_per_state == Fraction(1, 2) and type(ours.tokens_per_state) is Fraction
    assert "tokens_per_state=Fraction(1, 2)" in repr(ours)
    whole = convert_spec(_attention(vi.FullAttentionSpec, tokens_per_state=Fraction(4)))
    assert whole.tokens_per_state == 4 and type(whole.tokens_per_state) is int


#: Spec types with no kvblocks manager, built as vLLM's tests build them (vLLM 0.33
#: registers no manager for encoder-only layers either).
UNSUPPORTED: dict[str, Callable[[], Any]] = {
    "EncoderOnlyAttentionSpec": lambda: _attention(vi.EncoderOnlyAttentionSpec),
}


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_spec_types_without_a_manager_raise_unsupported(name: str) -> None:
    if not hasattr(vi, name):
        pytest.skip(f"this vLLM has no {name}")
    with pytest.raises(kb.UnsupportedError, match=name):
        convert_spec(UNSUPPORTED[name]())
