"""KV cache specs: page sizes, max memory, merge rules, value semantics, class tree.

Expected numbers are worked out here from vLLM 0.33's formulas, not read back from kvblocks.
"""

from __future__ import annotations

import importlib
import itertools
import math
from fractions import Fraction
from typing import Any

import kvblocks as kb
import pytest


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def full(**kw: Any) -> kb.FullAttentionSpec:
    args: dict[str, Any] = dict(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    args.update(kw)
    return kb.FullAttentionSpec(**args)


def swa(sliding_window: int = 4096, **kw: Any) -> kb.SlidingWindowSpec:
    args: dict[str, Any] = dict(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    args.update(kw)
    return kb.SlidingWindowSpec(sliding_window=sliding_window, **args)


def chunked(chunk: int = 8192, **kw: Any) -> kb.ChunkedLocalAttentionSpec:
    args: dict[str, Any] = dict(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    args.update(kw)
    return kb.ChunkedLocalAttentionSpec(attention_chunk_size=chunk, **args)


def mla(**kw: Any) -> kb.MLAAttentionSpec:
    args: dict[str, Any] = dict(block_size=16, num_kv_heads=1, head_size=576, dtype="bfloat16")
    args.update(kw)
    return kb.MLAAttentionSpec(**args)


def sink(sink_len: int = 32, **kw: Any) -> kb.SinkFullAttentionSpec:
    args: dict[str, Any] = dict(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    args.update(kw)
    return kb.SinkFullAttentionSpec(sink_len=sink_len, **args)


class FakeTorchDtype:
    """Stands in for a torch dtype: kvblocks reads it through str() only."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


# --- page sizes -----------------------------------------------------------------------------


def test_attention_page_size_formula() -> None:
    assert full().page_size_bytes == 8 * 16 * (128 + 128) * 2 == 65536
    assert full(head_size_v=64, dtype="float32").page_size_bytes == 8 * 16 * (128 + 64) * 4
    assert swa().page_size_bytes == 65536
    assert chunked().page_size_bytes == 65536
    cross = kb.CrossAttentionSpec(block_size=32, num_kv_heads=4, head_size=64, dtype="int8")
    assert cross.page_size_bytes == 4 * 32 * 128 * 1
    assert full(page_size_padded=70000).page_size_bytes == 70000


def test_states_per_token_page_size() -> None:
    """vLLM's `tokens_per_state`: an int packs several tokens into one state, a
    `Fraction(1, k)` (Whisper's block pooling) stores k states per token; a page holds
    `block_size // tokens_per_state` states."""
    assert full(tokens_per_state=4).page_size_bytes == 8 * 4 * 256 * 2
    pooled = full(tokens_per_state=Fraction(2, 8))
    assert pooled.page_size_bytes == 8 * (16 * 4) * 256 * 2
    assert pooled.tokens_per_state == Fraction(1, 4)
    assert type(pooled.tokens_per_state) is Fraction
    assert pooled == full(tokens_per_state=Fraction(1, 4)) != full()
    assert full(tokens_per_state=Fraction(3, 2)).page_size_bytes == 8 * (16 * 2 // 3) * 256 * 2
    assert type(full(tokens_per_state=Fraction(4, 1)).tokens_per_state) is int
    with pytest.raises(kb.InvalidSpecError, match="tokens_per_state"):
        full(tokens_per_state=Fraction(0))
    with pytest.raises(kb.InvalidArgumentError):
        full(tokens_per_state=Fraction(-1, 2))
    with pytest.raises(kb.InvalidTypeError, match="tokens_per_state"):
        full(tokens_per_state="1/4")


def test_mla_page_is_single_latent_and_aligned() -> None:
    spec = mla()
    assert spec.head_size_v == 0
    assert spec.page_size_bytes == 1 * 16 * 576 * 2
    aligned = mla(alignment=1000)
    assert aligned.page_size_bytes == math.ceil(16 * 576 * 2 / 1000) * 1000
    assert aligned.page_size_padded == aligned.page_size_bytes
    # Already a multiple: no padding recorded.
    assert mla(alignment=512).page_size_padded is None


def test_mamba_page_size_sums_states() -> None:
    spec = kb.MambaSpec(block_size=16, shapes=((3, 4), (2, 5, 7)), dtypes=("float32", "half"))
    assert spec.page_size_bytes == 3 * 4 * 4 + 2 * 5 * 7 * 2
    assert spec.shapes == ((3, 4), (2, 5, 7))
    assert spec.dtypes == ("float32", "float16")
    padded = kb.MambaSpec(block_size=16, shapes=[[10]], dtypes=["float32"], page_size_padded=64)
    assert padded.page_size_bytes == 64


def test_uniform_type_page_is_sum() -> None:
    u = kb.UniformTypeKVCacheSpecs(
        block_size=16, kv_cache_specs={"a": full(), "b": full(num_kv_heads=4)}
    )
    assert u.page_size_bytes == 65536 + 32768
    assert list(u.kv_cache_specs) == ["a", "b"]
    assert u.kv_cache_specs["b"] == full(num_kv_heads=4)


# --- max memory -----------------------------------------------------------------------------


def test_full_attention_max_memory() -> None:
    assert full().max_memory_usage_bytes(max_model_len=1000) == cdiv(1000, 16) * 65536
    # DCP shards tokens for dcp_sharded specs only.
    assert full().max_memory_usage_bytes(max_model_len=1000, dcp_world_size=4) == (
        cdiv(cdiv(1000, 4), 16) * 65536
    )
    assert full(dcp_sharded=False).max_memory_usage_bytes(max_model_len=1000, dcp_world_size=4) == (
        cdiv(1000, 16) * 65536
    )
    assert sink().max_memory_usage_bytes(max_model_len=100) == cdiv(100, 16) * 65536
    assert mla().max_memory_usage_bytes(max_model_len=100) == cdiv(100, 16) * 16 * 576 * 2


def test_sliding_window_admission_example() -> None:
    spec = swa(4096)
    # cdiv(min(4096 - 1 + 8192, 32768), 16) + 1
    assert cdiv(min(4095 + 8192, 32768), 16) + 1 == 769
    assert spec.max_admission_blocks_per_request(8192, 32768) == 769
    assert (
        spec.max_memory_usage_bytes(max_model_len=32768, max_num_batched_tokens=8192) == 769 * 65536
    )
    # Two batches in flight and retained tokens count too; max_model_len caps.
    spec = swa(4096, extra_retained_tokens=7)
    got = spec.max_memory_usage_bytes(
        max_model_len=32768, max_num_batched_tokens=8192, max_concurrent_batches=2
    )
    assert got == (cdiv(min(4095 + 7 + 16384, 32768), 16) + 1) * 65536
    assert spec.max_admission_blocks_per_request(8192, 1000) == cdiv(1000, 16) + 1


def test_sliding_window_rejects_dcp() -> None:
    with pytest.raises(NotImplementedError):
        swa().max_memory_usage_bytes(max_model_len=1000, dcp_world_size=2)
    unsharded = swa(dcp_sharded=False)
    assert unsharded.max_memory_usage_bytes(max_model_len=1000, dcp_world_size=2) == (
        (cdiv(1000, 16) + 1) * 65536
    )


def test_chunked_local_max_memory() -> None:
    spec = chunked(8192)
    assert spec.max_admission_blocks_per_request(8192, 32768) == 1024
    assert spec.max_memory_usage_bytes(max_model_len=32768) == (
        cdiv(min(8192 + 2048, 32768), 16) * 65536
    )


def test_mamba_max_memory_by_mode() -> None:
    base: dict[str, Any] = dict(block_size=16, shapes=[(10,)], dtypes=["float32"])
    none = kb.MambaSpec(**base, num_speculative_blocks=2)
    assert none.max_memory_usage_bytes(max_model_len=4096) == 40 * (1 + 2)
    align = kb.MambaSpec(
        **base, mamba_cache_mode="align", num_speculative_blocks=2, num_prefill_checkpoint_blocks=1
    )
    assert align.max_memory_usage_bytes(max_model_len=4096) == 40 * (2 + 2 + 1)


def test_cross_attention_max_memory_uses_encoder_tokens() -> None:
    cross = kb.CrossAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    got = cross.max_memory_usage_bytes(max_model_len=10, max_num_encoder_input_tokens=1500)
    assert got == cdiv(1500, 16) * 65536
    # Defaults to max_num_batched_tokens.
    got = cross.max_memory_usage_bytes(max_model_len=10, max_num_batched_tokens=100)
    assert got == cdiv(100, 16) * 65536


def test_uniform_type_max_memory() -> None:
    a, b = swa(64), swa(64, num_kv_heads=2)
    u = kb.UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": a, "b": b})
    pages = cdiv(min(63 + 2048, 4096), 16) + 1
    assert u.max_memory_usage_bytes(max_model_len=4096) == pages * (65536 + 16384)


# --- merge ----------------------------------------------------------------------------------


def test_full_attention_merge_windows() -> None:
    plain, windowed = full(), full(sliding_window=128)
    merged = kb.FullAttentionSpec.merge([plain, windowed, plain])
    assert merged == windowed
    assert type(merged) is kb.FullAttentionSpec
    with pytest.raises(ValueError, match="window size"):
        kb.FullAttentionSpec.merge([windowed, full(sliding_window=256)])
    with pytest.raises(ValueError):
        kb.FullAttentionSpec.merge([windowed, full(attention_chunk_size=64)])
    merged = kb.FullAttentionSpec.merge([plain, full(attention_chunk_size=64)])
    assert isinstance(merged, kb.FullAttentionSpec) and merged.attention_chunk_size == 64


def test_full_attention_merge_rejects_mismatch() -> None:
    for other in (full(block_size=32), full(dtype="float16"), full(head_size_v=64)):
        with pytest.raises(ValueError, match="same attention spec"):
            kb.FullAttentionSpec.merge([full(), other])
    with pytest.raises(ValueError, match="MLAAttentionSpec"):
        kb.FullAttentionSpec.merge([full(), mla()])
    with pytest.raises(ValueError):
        kb.FullAttentionSpec.merge([full(), swa()])
    with pytest.raises(ValueError):
        kb.FullAttentionSpec.merge([])


def test_sink_and_mla_merge() -> None:
    merged = kb.SinkFullAttentionSpec.merge([sink(32), sink(48)])
    assert isinstance(merged, kb.SinkFullAttentionSpec)
    assert merged.sink_len == 32
    # FullAttentionSpec's rule accepts sink layers and drops sink_len.
    assert type(kb.FullAttentionSpec.merge([sink(32), full()])) is kb.FullAttentionSpec
    merged_mla = kb.MLAAttentionSpec.merge([mla(alignment=1000)] * 2)
    assert isinstance(merged_mla, kb.MLAAttentionSpec)
    assert merged_mla.alignment is None
    assert merged_mla.page_size_bytes == 19000
    with pytest.raises(ValueError):
        kb.MLAAttentionSpec.merge([mla(cache_dtype_str="fp8_ds_mla"), mla()])
    with pytest.raises(ValueError):
        kb.MLAAttentionSpec.merge([mla(), full()])


def test_base_merge_needs_equal_specs() -> None:
    assert kb.SlidingWindowSpec.merge([swa(), swa()]) == swa()
    with pytest.raises(ValueError, match="must be the same"):
        kb.SlidingWindowSpec.merge([swa(64), swa(128)])
    m = kb.MambaSpec(block_size=16, shapes=[(4,)], dtypes=["float32"])
    assert kb.MambaSpec.merge([m, m]) == m
    # The base class rule applies to any spec.
    assert kb.KVCacheSpec.merge([chunked(), chunked()]) == chunked()


# --- value semantics, class tree, dtypes ----------------------------------------------------


def test_equality_and_hash_by_value() -> None:
    assert full() == full()
    assert hash(full()) == hash(full())
    assert full() != full(block_size=32)
    assert full() != sink(16)
    assert {full(), full(), swa()} == {full(), swa()}
    a = kb.UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": full(), "b": mla()})
    b = kb.UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"b": mla(), "a": full()})
    assert a == b and hash(a) == hash(b)
    assert full() != "FullAttentionSpec"


def test_repr_reads_like_dataclass() -> None:
    text = repr(full(sliding_window=128))
    assert text.startswith("FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, ")
    assert "dtype=torch.bfloat16" in text and "sliding_window=128" in text
    assert "mamba_cache_mode='align'" in repr(
        kb.MambaSpec(block_size=16, shapes=[(4,)], dtypes=["int8"], mamba_cache_mode="align")
    )


def test_isinstance_hierarchy() -> None:
    assert isinstance(full(), kb.AttentionSpec) and isinstance(full(), kb.KVCacheSpec)
    for spec in (mla(), sink()):
        assert isinstance(spec, kb.FullAttentionSpec)
    for local in (swa(), chunked()):
        assert isinstance(local, kb.AttentionSpec)
        assert not isinstance(local, kb.FullAttentionSpec)
    m = kb.MambaSpec(block_size=16, shapes=[(4,)], dtypes=["float32"])
    assert isinstance(m, kb.KVCacheSpec) and not isinstance(m, kb.AttentionSpec)
    assert not isinstance(sink(), kb.MLAAttentionSpec)


def test_fields_are_readable() -> None:
    s = sink(48, head_size_v=64, sliding_window=100)
    assert (s.block_size, s.num_kv_heads, s.head_size, s.head_size_v) == (16, 8, 128, 64)
    assert (s.dtype, s.sliding_window, s.attention_chunk_size, s.sink_len) == (
        "bfloat16",
        100,
        None,
        48,
    )
    assert s.dcp_sharded is True and s.page_size_padded is None
    w = swa(77, extra_retained_tokens=3)
    assert (w.sliding_window, w.extra_retained_tokens) == (77, 3)
    assert chunked(512).attention_chunk_size == 512
    m = kb.MambaSpec(block_size=8, shapes=[(4,)], dtypes=["float32"], num_speculative_blocks=2)
    assert (m.mamba_type, m.mamba_cache_mode, m.num_speculative_blocks) == ("mamba2", "none", 2)
    assert mla(cache_dtype_str="fp8_ds_mla").cache_dtype_str == "fp8_ds_mla"


def test_dtype_from_names_aliases_and_torch_like_objects() -> None:
    assert full(dtype="half").dtype == "float16"
    assert full(dtype="torch.float32").dtype == "float32"
    assert full(dtype=FakeTorchDtype("float16")).dtype == "float16"
    assert full(dtype=FakeTorchDtype("float16")) == full(dtype="float16")
    assert full(dtype="float8_e4m3fn").page_size_bytes == 8 * 16 * 256 * 1
    m = kb.MambaSpec(block_size=8, shapes=[(2,), (2,)], dtypes=[FakeTorchDtype("bfloat16"), "int8"])
    assert m.dtypes == ("bfloat16", "int8")
    with pytest.raises(ValueError, match="unknown dtype"):
        full(dtype="float7")
    with pytest.raises(ValueError, match="unknown dtype"):
        full(dtype=FakeTorchDtype("complex_thing"))
    with pytest.raises(TypeError):
        full(dtype=3)


def test_uniform_type_rules() -> None:
    is_uniform = kb.UniformTypeKVCacheSpecs.is_uniform_type
    assert is_uniform({"a": full(), "b": mla(), "c": sink()})
    assert not is_uniform({"a": full(), "b": full(block_size=32)})
    assert not is_uniform({"a": swa(64), "b": swa(128)})
    assert not is_uniform({"a": full(), "b": swa()})
    assert not is_uniform({"a": full(), "b": full(dcp_sharded=False)})
    assert kb.UniformTypeKVCacheSpecs.from_specs({"a": full(), "b": swa()}) is None
    u = kb.UniformTypeKVCacheSpecs.from_specs({"a": swa(), "b": swa()})
    assert isinstance(u, kb.UniformTypeKVCacheSpecs) and u.block_size == 16


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        dict(block_size=0),
        dict(block_size=-16),
        dict(num_kv_heads=0),
        dict(head_size=0),
        dict(page_size_padded=100),
        dict(sliding_window=0),
    ],
)
def test_bad_values_raise_value_error(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        full(**kw)


def test_bad_spec_values() -> None:
    with pytest.raises(ValueError, match="multiple of block_size"):
        sink(24)
    with pytest.raises(ValueError):
        sink(0)
    with pytest.raises(ValueError):
        swa(0)
    with pytest.raises(ValueError):
        chunked(0)
    with pytest.raises(ValueError):
        mla(alignment=0)
    with pytest.raises(ValueError, match="one dtype per shape"):
        kb.MambaSpec(block_size=16, shapes=[(1,), (2,)], dtypes=["float32"])
    with pytest.raises(ValueError, match="mamba_cache_mode"):
        kb.MambaSpec(block_size=16, shapes=[(1,)], dtypes=["int8"], mamba_cache_mode="all")
    with pytest.raises(ValueError):
        kb.UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={})
    with pytest.raises(ValueError):
        kb.UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": full(), "b": swa()})
    with pytest.raises(ValueError):
        kb.UniformTypeKVCacheSpecs(block_size=32, kv_cache_specs={"a": full()})
    with pytest.raises(ValueError):
        full().max_memory_usage_bytes(max_model_len=-1)


def test_bad_types_raise_type_error() -> None:
    with pytest.raises(TypeError):
        full(block_size="16")
    with pytest.raises(TypeError):
        full(block_size=16.0)
    with pytest.raises(TypeError):
        kb.FullAttentionSpec(16, 8, 128, "bfloat16")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        kb.UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": 1})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        kb.FullAttentionSpec.merge([full(), "x"])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        kb.KVCacheSpec()


def test_huge_sizes_do_not_overflow_silently() -> None:
    with pytest.raises((ValueError, OverflowError)):
        full(block_size=2**62, num_kv_heads=2**10)
    with pytest.raises((ValueError, OverflowError)):
        full(block_size=2**70)


# --- parity with vLLM 0.33.0 (skipped unless vLLM is importable) ---------------------------


@pytest.fixture(scope="module")
def vk() -> Any:
    """vLLM's kv_cache_interface module, or skip."""
    pytest.importorskip("vllm")
    return importlib.import_module("vllm.v1.kv_cache_interface")


def _vllm_pair(vk: Any, kind: str, **kw: Any) -> tuple[Any, kb.KVCacheSpec]:
    """The same spec built in vLLM (with torch dtypes) and in kvblocks (with names)."""
    torch: Any = importlib.import_module("torch")

    ours = {
        "full": kb.FullAttentionSpec,
        "mla": kb.MLAAttentionSpec,
        "sink": kb.SinkFullAttentionSpec,
        "swa": kb.SlidingWindowSpec,
        "chunked": kb.ChunkedLocalAttentionSpec,
        "cross": kb.CrossAttentionSpec,
        "mamba": kb.MambaSpec,
    }[kind]
    theirs = {
        "full": vk.FullAttentionSpec,
        "mla": vk.MLAAttentionSpec,
        "sink": vk.SinkFullAttentionSpec,
        "swa": vk.SlidingWindowSpec,
        "chunked": vk.ChunkedLocalAttentionSpec,
        "cross": vk.CrossAttentionSpec,
        "mamba": vk.MambaSpec,
    }[kind]
    vkw = dict(kw)
    if "dtype" in kw:
        vkw["dtype"] = getattr(torch, kw["dtype"])
    if "dtypes" in kw:
        vkw["dtypes"] = tuple(getattr(torch, d) for d in kw["dtypes"])
    return theirs(**vkw), ours(**kw)


def _attention_grid() -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for bs, heads, head, dtype, hv in itertools.product(
        (1, 16, 64), (1, 8), (64, 128), ("bfloat16", "float32", "float8_e4m3fn"), (None, 32)
    ):
        base: dict[str, Any] = dict(block_size=bs, num_kv_heads=heads, head_size=head, dtype=dtype)
        with_v = dict(base, head_size_v=hv) if hv is not None else base
        out.append(("full", with_v))
        out.append(("full", dict(with_v, sliding_window=128)))
        out.append(("cross", with_v))
        out.append(("sink", dict(with_v, sink_len=bs * 2)))
        for sw in (1, 128, 5000):
            out.append(("swa", dict(with_v, sliding_window=sw)))
        out.append(("swa", dict(with_v, sliding_window=100, extra_retained_tokens=9)))
        for chunk in (16, 8192):
            out.append(("chunked", dict(with_v, attention_chunk_size=chunk)))
        for align in (None, 256, 1000):
            mla_kw = dict(base, alignment=align) if align is not None else base
            out.append(("mla", mla_kw))
    return out


def _mamba_grid() -> list[dict[str, Any]]:
    out = []
    for shapes, dtypes in (
        (((3, 4),), ("float32",)),
        (((2, 64), (8, 16, 16)), ("bfloat16", "float32")),
    ):
        for mode, spec, ckpt in itertools.product(("none", "align"), (0, 2), (0, 1)):
            out.append(
                dict(
                    block_size=16,
                    shapes=shapes,
                    dtypes=dtypes,
                    mamba_cache_mode=mode,
                    num_speculative_blocks=spec,
                    num_prefill_checkpoint_blocks=ckpt,
                )
            )
    return out


_MEMORY_GRID = [
    dict(
        max_model_len=mml,
        max_num_batched_tokens=mnbt,
        max_concurrent_batches=mcb,
        dcp_world_size=dcp,
        max_num_encoder_input_tokens=enc,
    )
    for mml, mnbt, mcb, dcp, enc in itertools.product(
        (1, 100, 32768), (1, 2048, 8192), (1, 2), (1, 3), (1500, 7)
    )
]


def _vllm_config(p: dict[str, int], mamba_cache_mode: str = "none") -> Any:
    from types import SimpleNamespace as NS

    return NS(
        model_config=NS(max_model_len=p["max_model_len"]),
        parallel_config=NS(decode_context_parallel_size=p["dcp_world_size"]),
        scheduler_config=NS(
            max_num_batched_tokens=p["max_num_batched_tokens"],
            max_num_encoder_input_tokens=p["max_num_encoder_input_tokens"],
        ),
        max_in_flight_tokens=p["max_concurrent_batches"] * p["max_num_batched_tokens"],
        cache_config=NS(mamba_cache_mode=mamba_cache_mode),
    )


def _memory_outcome(fn: Any, *args: Any, **kwargs: Any) -> int | str:
    try:
        return int(fn(*args, **kwargs))
    except Exception:
        return "error"


@pytest.mark.vllm
def test_page_size_and_max_memory_match_vllm(vk: Any) -> None:
    cases = [(k, kw) for k, kw in _attention_grid()] + [("mamba", kw) for kw in _mamba_grid()]
    for kind, kw in cases:
        theirs, ours = _vllm_pair(vk, kind, **kw)
        assert ours.page_size_bytes == theirs.page_size_bytes, (kind, kw)
        mode = kw.get("mamba_cache_mode", "none")
        for p in _MEMORY_GRID:
            want = _memory_outcome(theirs.max_memory_usage_bytes, _vllm_config(p, mode))
            got = _memory_outcome(ours.max_memory_usage_bytes, **p)
            assert got == want, (kind, kw, p)


def _signature(spec: Any) -> tuple[Any, ...]:
    names = (
        "block_size",
        "num_kv_heads",
        "head_size",
        "head_size_v",
        "page_size_padded",
        "sliding_window",
        "attention_chunk_size",
        "sink_len",
        "extra_retained_tokens",
        "alignment",
        "cache_dtype_str",
    )
    dtype = str(getattr(spec, "dtype", "")).removeprefix("torch.")
    fields = tuple(getattr(spec, n, None) for n in names)
    return (type(spec).__name__, spec.page_size_bytes, dtype, *fields)


@pytest.mark.vllm
def test_merge_equality_and_uniformity_match_vllm(vk: Any) -> None:
    pool = [
        ("full", dict(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")),
        (
            "full",
            dict(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", sliding_window=64),
        ),
        (
            "full",
            dict(
                block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", sliding_window=128
            ),
        ),
        (
            "full",
            dict(
                block_size=16,
                num_kv_heads=8,
                head_size=128,
                dtype="bfloat16",
                attention_chunk_size=256,
            ),
        ),
        ("full", dict(block_size=32, num_kv_heads=8, head_size=128, dtype="bfloat16")),
        ("full", dict(block_size=16, num_kv_heads=4, head_size=128, dtype="float16")),
        ("sink", dict(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", sink_len=32)),
        ("sink", dict(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", sink_len=16)),
        ("mla", dict(block_size=16, num_kv_heads=1, head_size=576, dtype="bfloat16")),
        (
            "mla",
            dict(block_size=16, num_kv_heads=1, head_size=576, dtype="bfloat16", alignment=1000),
        ),
        (
            "mla",
            dict(
                block_size=16,
                num_kv_heads=1,
                head_size=576,
                dtype="bfloat16",
                cache_dtype_str="fp8_ds_mla",
            ),
        ),
        (
            "swa",
            dict(
                block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", sliding_window=128
            ),
        ),
        (
            "swa",
            dict(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", sliding_window=64),
        ),
        (
            "chunked",
            dict(
                block_size=16,
                num_kv_heads=8,
                head_size=128,
                dtype="bfloat16",
                attention_chunk_size=256,
            ),
        ),
        ("cross", dict(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")),
        ("mamba", dict(block_size=16, shapes=((3, 4),), dtypes=("float32",))),
        ("mamba", dict(block_size=16, shapes=((6, 2),), dtypes=("float32",))),
        (
            "mamba",
            dict(block_size=16, shapes=((3, 4),), dtypes=("float32",), num_speculative_blocks=1),
        ),
    ]
    pairs = [_vllm_pair(vk, kind, **kw) for kind, kw in pool]
    for (ta, oa), (tb, ob) in itertools.product(pairs, repeat=2):
        assert (oa == ob) == (ta == tb), (ta, tb)
        assert kb.UniformTypeKVCacheSpecs.is_uniform_type({"a": oa, "b": ob}) == (
            vk.UniformTypeKVCacheSpecs.is_uniform_type({"a": ta, "b": tb})
        ), (ta, tb)
        for group in ([ta, tb], [ta, tb, ta]):
            ours_group = [ob if t is tb else oa for t in group]
            try:
                want: Any = _signature(type(ta).merge(group))
            except Exception:
                want = "error"
            try:
                got: Any = _signature(type(oa).merge(ours_group))
            except ValueError:
                got = "error"
            assert got == want, (ta, tb)


@pytest.mark.vllm
def test_uniform_type_memory_matches_vllm(vk: Any) -> None:
    kw = dict(block_size=16, head_size=64, dtype="bfloat16")
    groups = [
        {n: ("full", dict(kw, num_kv_heads=n)) for n in (1, 4)},
        {n: ("swa", dict(kw, num_kv_heads=n, sliding_window=300)) for n in (2, 8)},
        {1: ("full", dict(kw, num_kv_heads=1)), 2: ("mla", dict(kw, num_kv_heads=1))},
    ]
    for layers in groups:
        built = {f"l{n}": _vllm_pair(vk, kind, **args) for n, (kind, args) in layers.items()}
        theirs = vk.UniformTypeKVCacheSpecs.from_specs({k: t for k, (t, _) in built.items()})
        ours = kb.UniformTypeKVCacheSpecs.from_specs({k: o for k, (_, o) in built.items()})
        assert theirs is not None and ours is not None
        assert ours.page_size_bytes == theirs.page_size_bytes
        for p in _MEMORY_GRID:
            want = _memory_outcome(theirs.max_memory_usage_bytes, _vllm_config(p))
            got = _memory_outcome(ours.max_memory_usage_bytes, **p)
            assert got == want, (layers, p)
