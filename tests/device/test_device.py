"""kvblocks.device against naive per-block references on random data.

Views are checked against vLLM's own construction of each layout; every page operation is
checked block by block against a snapshot of each layer's typed views. Runs on CPU, and also
on CUDA when a GPU is present.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from device_configs import (  # noqa: E402
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    hybrid,
    single_group,
)
from kvblocks.device import KVPages, _kernels, block_table, slot_mapping  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = ["float32", "float16", "bfloat16"] + (
    ["float8_e4m3fn"] if hasattr(torch, "float8_e4m3fn") else []
)
NB = 12


@pytest.fixture(params=["torch", "triton"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test with torch's index ops, then with the Triton kernel: compiled on CUDA, and
    under Triton's interpreter on CPU tensors (no GPU needed)."""
    monkeypatch.setenv("KVBLOCKS_DEVICE_KERNEL", request.param)
    if request.param == "triton":
        pytest.importorskip("triton")
        device = request.node.callspec.params.get("device", "cpu")
        if device == "cpu":
            if torch.cuda.is_available():
                pytest.skip("the Triton interpreter is used only on machines without CUDA")
            monkeypatch.setenv("TRITON_INTERPRET", "1")
        _kernels._kernel.cache_clear()
        request.addfinalizer(_kernels._kernel.cache_clear)
    return str(request.param)


@pytest.fixture(params=["dma", "kernel"])
def swap_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, kernel: str) -> str:
    """Swaps through the copy engines, or through the kernel on the pinned host pool (taken
    only when the kernel fixture enabled it)."""
    if request.param == "kernel" and kernel == "torch":
        pytest.skip("the swap kernel needs the Triton path")
    monkeypatch.setenv("KVBLOCKS_DEVICE_SWAP", request.param)
    return str(request.param)


def attn(dtype: str = "float16", **kw: Any) -> FullAttentionSpec:
    args: dict[str, Any] = {"block_size": 4, "num_kv_heads": 2, "head_size": 8, "dtype": dtype}
    args.update(kw)
    return FullAttentionSpec(**args)


MAMBA = MambaSpec(block_size=4, shapes=((3, 4), (2, 2, 2)), dtypes=("float32", "bfloat16"))


def configs() -> dict[str, KVCacheConfig]:
    """Named configs covering every spec kind and sharing pattern."""
    mla = MLAAttentionSpec(block_size=4, num_kv_heads=1, head_size=24, dtype="bfloat16")
    # Attention page = 4*2*(8+8)*2 = 256 bytes; the mamba page is padded to match.
    mamba_padded = MambaSpec(MAMBA.block_size, MAMBA.shapes, MAMBA.dtypes, page_size_padded=256)
    uniform = UniformTypeKVCacheSpecs(
        block_size=4,
        kv_cache_specs={"u.0": attn(num_kv_heads=1), "u.1": attn(head_size=4, num_kv_heads=4)},
    )
    return {
        "full": single_group(NB, attn(), 3),
        "diffkv": single_group(NB, attn(head_size=8, head_size_v=4), 2),
        "mla": single_group(NB, mla, 2),
        "mamba": single_group(NB, MAMBA, 2),
        "swa+full shared": hybrid(NB, [attn(), SlidingWindowSpec(4, 2, 8, "float16")], 2),
        "attn+mamba shared": hybrid(NB, [attn(), mamba_padded], 2),
        "all attention kinds": KVCacheConfig(
            NB,
            [KVCacheTensor(NB * 256, [f"k{i}"]) for i in range(4)],
            [
                KVCacheGroupSpec(["k0"], ChunkedLocalAttentionSpec(4, 2, 8, "float16")),
                KVCacheGroupSpec(["k1"], CrossAttentionSpec(4, 2, 8, "float16")),
                KVCacheGroupSpec(["k2"], SinkFullAttentionSpec(4, 2, 8, "float16")),
                KVCacheGroupSpec(["k3"], attn()),
            ],
        ),
        "uniform": KVCacheConfig(
            NB,
            [KVCacheTensor(2 * NB * 128, ["u.0"]), KVCacheTensor(NB * 256, ["u.1"])],
            [KVCacheGroupSpec(["u.0", "u.1"], uniform)],
        ),
        "slack blocks": KVCacheConfig(
            NB, [KVCacheTensor((NB + 3) * 256, ["s.0"])], [KVCacheGroupSpec(["s.0"], attn())]
        ),
    }


CONFIGS = configs()


def parts(pages: KVPages, name: str) -> list[torch.Tensor]:
    """Every typed view of a layer, block dimension first."""
    kind = pages.geometry.layers[name].kind
    if kind == "attention":
        return [pages.key_cache(name), pages.value_cache(name)]
    if kind == "mla":
        return [pages.kv_cache(name)]
    return list(pages.mamba_states(name))


def snapshot(pages: KVPages) -> dict[tuple[str, int], torch.Tensor]:
    """Bytes of every block of every layer view: key -> uint8 [blocks, bytes] on CPU."""
    snap = {}
    for name in pages.layer_names():
        for j, view in enumerate(parts(pages, name)):
            blocks = view.contiguous().view(torch.uint8).reshape(view.shape[0], -1)
            snap[(name, j)] = blocks.cpu().clone()
    return snap


def randomize(pages: KVPages, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    for buf in pages.buffers():
        buf.copy_(torch.randint(0, 256, buf.shape, dtype=torch.uint8, generator=gen))


def assert_same(actual: dict[Any, torch.Tensor], expected: dict[Any, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        diff = (actual[key] != expected[key]).any(dim=1).nonzero().flatten().tolist()
        assert not diff, f"{key}: blocks {diff} differ from the reference"


def make(name: str, device: str, **kw: Any) -> KVPages:
    pages = KVPages(CONFIGS[name], device, **kw)
    randomize(pages)
    return pages


# ----------------------------------------------------------------------------- views


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_view_is_vllm_layout(layout: str, dtype: str) -> None:
    spec = attn(dtype)
    pages = KVPages(single_group(NB, spec, 2), "cpu", layout=layout)  # type: ignore[arg-type]
    randomize(pages)
    d = getattr(torch, dtype)
    for name, raw in zip(pages.layer_names(), pages.buffers(), strict=True):
        typed = raw.view(d)
        if layout == "NHD":
            expected = typed.view(2, NB, 4, 2, 8)
        else:  # vLLM's HND: physical [2, nb, heads, block, dim], permuted to logical order
            expected = typed.view(2, NB, 2, 4, 8).permute(0, 1, 3, 2, 4)
        kv = pages.kv_cache(name)
        assert kv.shape == expected.shape and kv.stride() == expected.stride()
        assert kv.data_ptr() == expected.data_ptr() and kv.dtype == d
        assert pages.key_cache(name).data_ptr() == expected[0].data_ptr()
        assert pages.value_cache(name).data_ptr() == expected[1].data_ptr()


def test_diffkv_views_are_two_planes() -> None:
    pages = make("diffkv", "cpu")
    raw = pages.buffers()[0]
    k_bytes = NB * 4 * 2 * 8 * 2
    flat = lambda t: t.contiguous().view(torch.uint8).flatten()  # noqa: E731
    assert torch.equal(flat(pages.key_cache("layer.0")), raw[:k_bytes])
    assert torch.equal(flat(pages.value_cache("layer.0")), raw[k_bytes:])
    assert pages.value_cache("layer.0").shape == (NB, 4, 2, 4)
    with pytest.raises(ValueError, match="key_cache"):
        pages.kv_cache("layer.0")


def test_mla_view_is_single_latent() -> None:
    pages = make("mla", "cpu")
    raw = pages.buffers()[1]
    latent = pages.kv_cache("layer.1")
    assert latent.shape == (NB, 4, 24) and latent.is_contiguous()
    assert torch.equal(latent.view(torch.uint8).flatten(), raw)
    with pytest.raises(TypeError, match="mla"):
        pages.key_cache("layer.1")


def test_mamba_states_packed_in_page() -> None:
    pages = make("mamba", "cpu")
    raw = pages.buffers()[0]
    page = MAMBA.page_size_bytes
    conv, ssm = pages.mamba_states("layer.0")
    assert conv.shape == (NB, 3, 4) and conv.dtype == torch.float32
    assert ssm.shape == (NB, 2, 2, 2) and ssm.dtype == torch.bfloat16
    for b in range(NB):
        chunk = raw[b * page : (b + 1) * page]
        assert torch.equal(conv[b].contiguous().view(torch.uint8).flatten(), chunk[:48])
        assert torch.equal(ssm[b].contiguous().view(torch.uint8).flatten(), chunk[48:64])


def test_shared_buffer_aliases_and_goes_block_major() -> None:
    pages = make("attn+mamba shared", "cpu")
    raw = pages.buffers()[0]
    # Tensor 0 is shared by g0.0 (attention) and g1.0 (mamba): block b is bytes [b*256, ..).
    k = pages.key_cache("g0.0")
    v = pages.value_cache("g0.0")
    conv, _ = pages.mamba_states("g1.0")
    for b in (0, 5, NB - 1):
        chunk = raw[b * 256 : (b + 1) * 256]
        assert torch.equal(k[b].contiguous().view(torch.uint8).flatten(), chunk[:128])
        assert torch.equal(v[b].contiguous().view(torch.uint8).flatten(), chunk[128:])
        assert torch.equal(conv[b].contiguous().view(torch.uint8).flatten(), chunk[:48])
    swa = make("swa+full shared", "cpu")
    assert swa.key_cache("g0.1").data_ptr() == swa.key_cache("g1.1").data_ptr()


def test_uniform_type_specs_resolve_per_layer() -> None:
    pages = make("uniform", "cpu")
    assert pages.key_cache("u.0").shape == (2 * NB, 4, 1, 8)
    assert pages.key_cache("u.1").shape == (NB, 4, 4, 4)


# ------------------------------------------------------------------------ operations

OPS_CONFIGS = list(CONFIGS)


def ref_copy(snap: dict[Any, torch.Tensor], src: list[int], dst: list[int]) -> dict[Any, Any]:
    out = {k: v.clone() for k, v in snap.items()}
    for s, d in zip(src, dst, strict=True):
        for k in out:
            out[k][d] = snap[k][s]
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", OPS_CONFIGS)
@pytest.mark.parametrize("block_major", [False, True])
def test_copy_blocks_matches_reference(
    device: str, config: str, block_major: bool, kernel: str
) -> None:
    gen = torch.Generator().manual_seed(hash(config) % 1000)
    pages = make(config, device, block_major=block_major)
    cases = [
        ([], []),
        ([3], [4]),
        ([1, 2, 3, 4], [6, 7, 8, 9]),  # one run: slice copy
        ([2, 3, 4], [3, 4, 5]),  # overlapping: sources read before writes
        ([5, 1, 9, 0], [1, 9, 5, 11]),  # a permutation cycle plus the null block as source
        ([1, 3, 5, 7, 9], [2, 4, 6, 8, 10]),  # disjoint, scattered: one kernel, no temporary
    ]
    perm = torch.randperm(NB - 1, generator=gen) + 1
    cases.append((torch.randint(0, NB, (6,), generator=gen).tolist(), perm[:6].tolist()))
    for src, dst in cases:
        before = snapshot(pages)
        pages.copy_blocks(src, dst)
        assert_same(snapshot(pages), ref_copy(before, src, dst))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", OPS_CONFIGS)
def test_zero_gather_scatter(device: str, config: str, kernel: str) -> None:
    pages = make(config, device)
    before = snapshot(pages)
    pages.zero_blocks([4, 2, 7])
    pages.zero_blocks([])
    expected = {k: v.clone() for k, v in before.items()}
    for k in expected:
        expected[k][[4, 2, 7]] = 0
    assert_same(snapshot(pages), expected)

    blob = pages.gather([5, 0, 5, 11])
    assert blob.shape == (4, pages.block_bytes) and blob.dtype == torch.uint8
    assert pages.gather([]).shape == (0, pages.block_bytes)
    state = snapshot(pages)
    pages.scatter([1, 2, 3, 4], blob)
    assert_same(snapshot(pages), ref_copy(state, [5, 0, 5, 11], [1, 2, 3, 4]))
    # The rows are the layer bytes and nothing else: rows of equal blocks are equal.
    assert torch.equal(blob[0], blob[2]) and not torch.equal(blob[0], blob[3])
    out = torch.empty((4, pages.block_bytes), dtype=torch.uint8, device=device)
    assert pages.gather([5, 0, 5, 11], out=out) is out
    assert torch.equal(out, blob)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", ["full", "diffkv", "attn+mamba shared", "uniform", "mla"])
def test_swap_out_and_in(device: str, config: str, swap_path: str) -> None:
    pages = make(config, device, host_blocks=20)
    assert pages.host_pool is not None
    pages.host_pool.copy_(torch.randint(0, 256, pages.host_pool.shape, dtype=torch.uint8))
    host_before = pages.host_pool.clone()
    state = snapshot(pages)
    cases = [([3, 4, 5], [10, 11, 12]), ([9, 1, 6, 2], [0, 19, 7, 3]), ([], [])]
    for dev_ids, host_ids in cases:
        pages.swap_out(dev_ids, host_ids).synchronize()
    untouched = [i for i in range(20) if i not in (10, 11, 12, 0, 19, 7, 3)]
    assert torch.equal(pages.host_pool[untouched], host_before[untouched])
    assert_same(snapshot(pages), state)  # swap_out reads only
    back = pages.swap_in([10, 11, 12, 0, 19, 7, 3], [1, 2, 3, 4, 5, 6, 7])
    back.wait()
    back.synchronize()
    assert back.done()
    src = [3, 4, 5, 9, 1, 6, 2]
    assert_same(snapshot(pages), ref_copy(state, src, [1, 2, 3, 4, 5, 6, 7]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fragmented", [False, True])
def test_swap_paths_on_cuda(fragmented: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    import kvblocks.device._pages as impl

    # Force the staged path (host index copy) or the per-run DMA path.
    monkeypatch.setattr(impl, "DMA_MAX_RUNS", 0 if fragmented else 1 << 30)
    monkeypatch.setattr(impl, "DMA_MIN_RUN_BYTES", 1 << 60 if fragmented else 1)
    pages = make("full", "cuda", host_blocks=30)
    state = snapshot(pages)
    host_ids = [29, 3, 17, 4, 5, 0]
    pages.swap_out([1, 2, 3, 4, 5, 6], host_ids).synchronize()
    pages.swap_in(host_ids, [11, 10, 9, 8, 7, 6]).synchronize()
    assert_same(snapshot(pages), ref_copy(state, [1, 2, 3, 4, 5, 6], [11, 10, 9, 8, 7, 6]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_write_slots_matches_reshape_and_cache(device: str, dtype: str, layout: str) -> None:
    spec = attn(dtype, head_size_v=6)
    pages = KVPages(single_group(NB, spec, 1), device, layout=layout)  # type: ignore[arg-type]
    randomize(pages)
    d = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(1)
    slots = torch.tensor([4, 5, -1, 47, 20, -1, 6])
    key = torch.randn(7, 2, 8, generator=gen).to(d).to(device)
    value = torch.randn(7, 2, 6, generator=gen).to(d).to(device)
    expected_k = pages.key_cache("layer.0").cpu().clone()
    expected_v = pages.value_cache("layer.0").cpu().clone()
    for i, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected_k[slot // 4, slot % 4] = key[i].cpu()
            expected_v[slot // 4, slot % 4] = value[i].cpu()
    pages.write_slots("layer.0", key, value, slots.to(device))
    bytes_of = lambda t: t.cpu().contiguous().view(torch.uint8)  # noqa: E731
    assert torch.equal(bytes_of(pages.key_cache("layer.0")), bytes_of(expected_k))
    assert torch.equal(bytes_of(pages.value_cache("layer.0")), bytes_of(expected_v))


def test_write_slots_mla() -> None:
    pages = make("mla", "cpu")
    latent = torch.randn(3, 24).to(torch.bfloat16)
    expected = pages.kv_cache("layer.0").clone()
    for i, slot in enumerate([9, 10, 33]):
        expected[slot // 4, slot % 4] = latent[i]
    pages.write_slots("layer.0", latent, None, [9, 10, 33])
    assert torch.equal(pages.kv_cache("layer.0").view(torch.uint8), expected.view(torch.uint8))


def test_block_table_and_slot_mapping() -> None:
    reqs = [[3, 1, 4], [], [5, 9, 2, 6, 11]]
    table = block_table(reqs, 6)
    assert table.dtype == torch.int32 and table.shape == (3, 6)
    for r, ids in enumerate(reqs):
        assert table[r].tolist() == ids + [0] * (6 - len(ids))
    computed, scheduled = [2, 0, 13], [7, 0, 3]
    slots = slot_mapping(table, computed, scheduled, block_size=4, pad_to=12)
    expected = []
    for r, (c, n) in enumerate(zip(computed, scheduled, strict=True)):
        for pos in range(c, c + n):
            expected.append(reqs[r][pos // 4] * 4 + pos % 4)
    assert slots.tolist() == [*expected, -1, -1]
    assert block_table([], 4).shape == (0, 4)
    with pytest.raises(ValueError, match="max_blocks"):
        block_table([[1, 2, 3]], 2)
    with pytest.raises(ValueError, match="negative"):
        block_table([[1, -2]], 2)
    with pytest.raises(ValueError, match="beyond"):
        slot_mapping(table, [0, 0, 20], [1, 0, 5], block_size=4)
    with pytest.raises(ValueError, match="pad_to"):
        slot_mapping(table, computed, scheduled, block_size=4, pad_to=3)


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda p: p.copy_blocks([1], [NB]), IndexError, "out of range"),
        (lambda p: p.copy_blocks([-1], [2]), IndexError, "out of range"),
        (lambda p: p.copy_blocks([1, 2], [3, 3]), ValueError, "duplicate"),
        (lambda p: p.copy_blocks([1, 2], [3]), ValueError, "source ids"),
        (lambda p: p.copy_blocks([1], [0]), ValueError, "null block"),
        (lambda p: p.copy_blocks([1.5], [2]), TypeError, "integers"),
        (lambda p: p.copy_blocks([[1]], [[2]]), ValueError, "1-D"),
        (lambda p: p.zero_blocks([0]), ValueError, "null block"),
        (lambda p: p.zero_blocks([4, 4]), ValueError, "duplicate"),
        (lambda p: p.gather([NB + 1]), IndexError, "out of range"),
        (lambda p: p.scatter([1], torch.zeros(1, 3, dtype=torch.uint8)), ValueError, "shape"),
        (lambda p: p.scatter([1], torch.zeros(1, p.block_bytes)), TypeError, "uint8"),
        (lambda p: p.scatter([1, 1], p.gather([2, 3])), ValueError, "duplicate"),
        (lambda p: p.swap_out([1], [0]), ValueError, "host pool"),
        (
            lambda p: p.gather([1], out=torch.empty(2, p.block_bytes, dtype=torch.uint8)),
            ValueError,
            "shape",
        ),
        (lambda p: p.scatter([1], p.gather([2]).tolist()), TypeError, "torch.Tensor"),
        (lambda p: p.key_cache("nope"), KeyError, "nope"),
        (
            lambda p: p.write_slots("layer.0", torch.zeros(1, 2, 8), torch.zeros(1, 2, 8), [4]),
            TypeError,
            "float16",
        ),
        (
            lambda p: p.write_slots(
                "layer.0", torch.zeros(2, 2, 8).half(), torch.zeros(2, 2, 8).half(), [4]
            ),
            ValueError,
            "shape",
        ),
        (
            lambda p: p.write_slots(
                "layer.0", torch.zeros(1, 2, 8).half(), torch.zeros(1, 2, 8).half(), [1]
            ),
            ValueError,
            "null block",
        ),
        (
            lambda p: p.write_slots(
                "layer.0", torch.zeros(2, 2, 8).half(), torch.zeros(2, 2, 8).half(), [5, 5]
            ),
            ValueError,
            "duplicate",
        ),
        (
            lambda p: p.write_slots(
                "layer.0", torch.zeros(1, 2, 8).half(), torch.zeros(1, 2, 8).half(), [NB * 4]
            ),
            IndexError,
            "out of range",
        ),
    ],
)
def test_bad_input_raises_before_touching_pages(call: Any, error: type, match: str) -> None:
    pages = make("full", "cpu")
    before = snapshot(pages)
    with pytest.raises(error, match=match):
        call(pages)
    assert_same(snapshot(pages), before)


def test_swap_errors_leave_host_pool_alone() -> None:
    pages = make("full", "cpu", host_blocks=4)
    assert pages.host_pool is not None
    host = pages.host_pool.clone()
    before = snapshot(pages)
    for call, error in [
        (lambda: pages.swap_out([1, 2], [3, 3]), ValueError),
        (lambda: pages.swap_out([1], [4]), IndexError),
        (lambda: pages.swap_in([4], [1]), IndexError),
        (lambda: pages.swap_in([1], [0]), ValueError),
        (lambda: pages.swap_in([1, 2], [5]), ValueError),
    ]:
        with pytest.raises(error):
            call()
    assert torch.equal(pages.host_pool, host)
    assert_same(snapshot(pages), before)


def test_null_block_writable_when_unprotected() -> None:
    pages = make("full", "cpu", protect_null_block=False)
    before = snapshot(pages)
    pages.copy_blocks([3], [0])
    assert_same(snapshot(pages), ref_copy(before, [3], [0]))


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (
            KVCacheConfig(4, [KVCacheTensor(1000, ["a"])], [KVCacheGroupSpec(["a"], attn())]),
            "multiple of the page",
        ),
        (
            KVCacheConfig(4, [KVCacheTensor(3 * 256, ["a"])], [KVCacheGroupSpec(["a"], attn())]),
            "fewer than",
        ),
        (
            KVCacheConfig(
                4,
                [KVCacheTensor(4 * 256, ["a", "b"])],
                [KVCacheGroupSpec(["a"], attn()), KVCacheGroupSpec(["b"], attn(head_size=4))],
            ),
            "different page sizes",
        ),
        (
            KVCacheConfig(
                4, [KVCacheTensor(4 * 256, ["a"])], [KVCacheGroupSpec(["a", "b"], attn())]
            ),
            "in no KV cache tensor",
        ),
        (
            KVCacheConfig(4, [KVCacheTensor(4 * 256, ["a"])], []),
            "in no group",
        ),
        (
            KVCacheConfig(
                1 << 40, [KVCacheTensor(256 << 40, ["a"])], [KVCacheGroupSpec(["a"], attn())]
            ),
            "available",
        ),
        (
            KVCacheConfig(
                4,
                [KVCacheTensor(4 * 64, ["a"])],
                [KVCacheGroupSpec(["a"], MLAAttentionSpec(4, 2, 4, "float16"))],
            ),
            "one latent head",
        ),
    ],
)
def test_bad_config_raises(config: KVCacheConfig, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        KVPages(config, "cpu")


def test_unknown_spec_and_dtype() -> None:
    class EncoderOnlyAttentionSpec(FullAttentionSpec):
        pass

    odd = EncoderOnlyAttentionSpec(4, 2, 8, "float16")
    config = KVCacheConfig(4, [KVCacheTensor(4 * 256, ["a"])], [KVCacheGroupSpec(["a"], odd)])
    with pytest.raises(TypeError, match="EncoderOnlyAttentionSpec"):
        KVPages(config, "cpu")
    with pytest.raises(TypeError, match="dtype"):
        KVPages(single_group(4, attn("half_precision", page_size_padded=256), 1), "cpu")


def test_torch_dtype_objects_accepted() -> None:
    pages = KVPages(single_group(4, attn(torch.bfloat16), 1), "cpu")  # type: ignore[arg-type]
    assert pages.kv_cache("layer.0").dtype == torch.bfloat16
    assert math.prod(pages.kv_cache("layer.0").shape) * 2 == pages.block_bytes * 4


# ------------------------------------------------------------- random op sequences


def mixed_config() -> KVCacheConfig:
    """Split K/V buffers, a two-plane diffkv buffer, an MLA buffer, and attention + mamba
    layers sharing buffers, in one config (one id space)."""
    full, diff = attn(), attn(head_size_v=4)
    mla = MLAAttentionSpec(block_size=4, num_kv_heads=1, head_size=64, dtype="float16")
    mamba = MambaSpec(MAMBA.block_size, MAMBA.shapes, MAMBA.dtypes, page_size_padded=256)
    groups = [
        KVCacheGroupSpec(["f.0", "f.1"], full),
        KVCacheGroupSpec(["d.0"], diff),
        KVCacheGroupSpec(["m.0"], mla),
        KVCacheGroupSpec(["s.0", "s.1"], mamba),
    ]
    tensors = [
        KVCacheTensor(NB * 256, ["f.0", "s.0"]),
        KVCacheTensor(NB * 256, ["f.1", "s.1"]),
        KVCacheTensor(NB * diff.page_size_bytes, ["d.0"]),
        KVCacheTensor(NB * mla.page_size_bytes, ["m.0"]),
    ]
    return KVCacheConfig(NB, tensors, groups)


@pytest.mark.parametrize("device", [DEVICES[-1]])
def test_random_op_sequences_match_reference(device: str, swap_path: str) -> None:
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    ids = st.lists(st.integers(1, NB - 1), unique=True, max_size=6)
    host = st.lists(st.integers(0, 7), unique=True, max_size=6)
    op = st.one_of(
        st.tuples(st.just("copy"), st.lists(st.integers(0, NB - 1), max_size=6), ids),
        st.tuples(st.just("zero"), ids, st.just([])),
        st.tuples(st.just("move"), st.lists(st.integers(0, NB - 1), max_size=6), ids),
        st.tuples(st.just("out"), st.lists(st.integers(0, NB - 1), max_size=6), host),
        st.tuples(st.just("in"), host, ids),
    )

    @hypothesis.settings(max_examples=60, deadline=None)
    @hypothesis.given(st.lists(op, max_size=8), st.booleans())
    def run(ops: list[tuple[str, list[int], list[int]]], block_major: bool) -> None:
        pages = KVPages(mixed_config(), device, host_blocks=8, block_major=block_major)
        randomize(pages, seed=len(ops))
        model = snapshot(pages)
        host_model: dict[int, dict[Any, torch.Tensor]] = {}
        for kind, a, b in ops:
            n = min(len(a), len(b))
            a, b = a[:n] if kind != "zero" else a, b[:n]
            if kind == "copy":
                pages.copy_blocks(a, b)
                model = ref_copy(model, a, b)
            elif kind == "zero":
                pages.zero_blocks(a)
                for key in model:
                    model[key][a] = 0
            elif kind == "move":
                pages.scatter(b, pages.gather(a))
                model = ref_copy(model, a, b)
            elif kind == "out":
                pages.swap_out(a, b).synchronize()
                for src, dst in zip(a, b, strict=True):
                    host_model[dst] = {key: rows[src].clone() for key, rows in model.items()}
            else:
                known = [(h, d) for h, d in zip(a, b, strict=True) if h in host_model]
                if known:
                    pages.swap_in([h for h, _ in known], [d for _, d in known]).synchronize()
                for h, d in known:
                    for key in model:
                        model[key][d] = host_model[h][key]
            assert_same(snapshot(pages), model)

    run()


@pytest.mark.parametrize("device", DEVICES)
def test_long_id_lists(device: str, swap_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lists longer than the builtin fast path go through the tensor checks and run finder;
    index copies without the kernel go through a temporary of 3 blocks at a time."""
    import kvblocks.device._pages as impl

    monkeypatch.setattr(impl, "COPY_CHUNK_BYTES", 3 * 256)
    nb = 300
    pages = KVPages(single_group(nb, attn(), 1), device, host_blocks=nb)
    randomize(pages)
    gen = torch.Generator().manual_seed(7)
    perm = (torch.randperm(nb - 1, generator=gen) + 1).tolist()
    runs_src, runs_dst = list(range(1, 101)), list(range(150, 250))
    cases = [
        (perm[:100], perm[100:200]),  # scattered, disjoint
        (perm[:100], perm[50:150]),  # scattered, overlapping
        (runs_src, runs_dst),  # one long run
        (torch.tensor(perm[:120]), torch.tensor(perm[120:240])),  # tensors
    ]
    for src, dst in cases:
        before = snapshot(pages)
        pages.copy_blocks(src, dst)
        assert_same(snapshot(pages), ref_copy(before, list(src), list(dst)))
    before = snapshot(pages)
    pages.swap_out(perm[:100], list(range(100, 200))).synchronize()
    pages.swap_in(list(range(100, 200)), perm[100:200]).synchronize()
    assert_same(snapshot(pages), ref_copy(before, perm[:100], perm[100:200]))
    long_dup = [*perm[:99], perm[0]]
    for call, error in [
        (lambda: pages.copy_blocks(perm[:100], long_dup), ValueError),
        (lambda: pages.copy_blocks([*perm[:99], nb], perm[:100]), IndexError),
        (lambda: pages.zero_blocks([*perm[:99], 0]), ValueError),
        (lambda: pages.copy_blocks([0.5] * 100, perm[:100]), TypeError),
    ]:
        with pytest.raises(error):
            call()


def test_module_docstring_example_runs_on_cpu() -> None:
    """The usage example of kvblocks.device, on CPU with a stand-in config."""
    config = single_group(64, attn(block_size=16), 2, prefix="model.layers")
    pages = KVPages(config, "cpu", host_blocks=16)
    name = "model.layers.0"
    assert pages.kv_cache(name).shape == (2, 64, 16, 2, 8)
    pages.zero_blocks([1, 2, 3, 4])
    table = block_table([[1, 2, 3], [4]], max_blocks=8)
    slots = slot_mapping(
        table, num_computed_tokens=[40, 0], num_scheduled_tokens=[1, 7], block_size=16
    )
    assert slots.tolist() == [3 * 16 + 8, *range(4 * 16, 4 * 16 + 7)]
    key = torch.ones(8, 2, 8, dtype=torch.float16)
    pages.write_slots(name, key, 2 * key, slots)
    assert bool((pages.key_cache(name)[3, 8] == 1).all())
    assert bool((pages.value_cache(name)[4, :7] == 2).all())
    pages.copy_blocks(src=[3, 4], dst=[7, 8])
    pages.swap_out([7, 8], [0, 1]).synchronize()
    back = pages.swap_in([0, 1], [9, 10])
    back.wait()
    blob = pages.gather([9, 10])
    pages.scatter([11, 12], blob)
    assert torch.equal(pages.kv_cache(name)[:, 12], pages.kv_cache(name)[:, 4])
    assert bool((pages.value_cache(name)[12, :7] == 2).all())


def test_other_devices_get_ids_on_their_device() -> None:
    """A device that is neither CPU nor CUDA ("meta": shapes without data) takes every
    device-side operation; ids and slots are moved to it."""
    pages = KVPages(single_group(NB, attn(), 2), "meta")
    assert pages.kv_cache("layer.1").device.type == "meta"
    pages.copy_blocks([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    pages.copy_blocks([1, 3], [3, 4])
    pages.zero_blocks([3])
    blob = pages.gather([1, 2])
    assert blob.device.type == "meta" and blob.shape == (2, pages.block_bytes)
    pages.scatter([3, 4], blob)
    kv = torch.zeros(2, 2, 8, dtype=torch.float16, device="meta")
    pages.write_slots("layer.0", kv, kv, [4, 9])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_ops_every_dtype_and_layout(device: str, dtype: str, layout: str) -> None:
    spec = attn(dtype, num_kv_heads=3)
    pages = KVPages(single_group(NB, spec, 2), device, layout=layout, host_blocks=4)  # type: ignore[arg-type]
    randomize(pages, seed=3)
    state = snapshot(pages)
    pages.copy_blocks([1, 2, 9], [2, 3, 4])  # overlapping
    state = ref_copy(state, [1, 2, 9], [2, 3, 4])
    pages.scatter([5, 6], pages.gather([4, 0]))
    state = ref_copy(state, [4, 0], [5, 6])
    pages.swap_out([3, 5], [2, 0]).synchronize()
    pages.swap_in([0, 2], [7, 8]).synchronize()
    state = ref_copy(state, [5, 3], [7, 8])
    pages.zero_blocks([11])
    for key in state:
        state[key][11] = 0
    assert_same(snapshot(pages), state)


@pytest.mark.vllm
def test_vllm_spec_classes_work_unchanged() -> None:
    """vLLM 0.33's own spec dataclasses (torch dtypes, kw-only fields) drive KVPages through
    the attribute contract; pages are vLLM's page_size_bytes."""
    kv = pytest.importorskip("vllm.v1.kv_cache_interface")
    full = kv.FullAttentionSpec(16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    swa = kv.SlidingWindowSpec(
        16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16, sliding_window=128
    )
    mla = kv.MLAAttentionSpec(16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    mamba = kv.MambaSpec(
        16,
        shapes=((3, 64), (4, 8, 8)),
        dtypes=(torch.float32, torch.float32),
        page_size_padded=full.page_size_bytes,
    )
    config = KVCacheConfig(
        8,
        [
            KVCacheTensor(8 * full.page_size_bytes, ["f", "s", "m"]),
            KVCacheTensor(8 * mla.page_size_bytes, ["l"]),
        ],
        [
            KVCacheGroupSpec(["f"], full),
            KVCacheGroupSpec(["s"], swa),
            KVCacheGroupSpec(["m"], mamba),
            KVCacheGroupSpec(["l"], mla),
        ],
    )
    pages = KVPages(config, "cpu", host_blocks=2)
    randomize(pages)
    assert pages.block_bytes == full.page_size_bytes + mla.page_size_bytes
    assert pages.key_cache("s").shape == (8, 16, 2, 64)
    assert pages.kv_cache("l").shape == (8, 16, 576)
    assert [t.shape for t in pages.mamba_states("m")] == [(8, 3, 64), (8, 4, 8, 8)]
    before = snapshot(pages)
    pages.copy_blocks([1, 2], [3, 4])
    assert_same(snapshot(pages), ref_copy(before, [1, 2], [3, 4]))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_kernel_compiles_for_hopper_with_16_byte_accesses() -> None:
    """The page-copy kernel compiles for sm_90 without a GPU, and pages whose word count is a
    multiple of 16 are moved with 16-byte vector loads and stores."""
    triton = pytest.importorskip("triton")
    compiler = pytest.importorskip("triton.compiler")
    backends = pytest.importorskip("triton.backends.compiler")
    kernel = _kernels._kernel()
    ints = ["src_id_stride", "src_buf_stride", "src_row_stride"]
    ints += ["dst_id_stride", "dst_buf_stride", "dst_row_stride"]
    signature = {"src": "*i64", "dst": "*i64", "src_ids": "*i64", "dst_ids": "*i64"}
    signature |= {name: "i64" for name in ints}
    signature |= {"rows": "i32", "width": "i32"}
    signature |= {"SRC_IDS": "constexpr", "DST_IDS": "constexpr", "BLOCK": "constexpr"}
    aligned = {(i,): [["tt.divisibility", 16]] for i in [*range(10), 11]}
    source = compiler.ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={"SRC_IDS": True, "DST_IDS": True, "BLOCK": 1024},
        attrs=aligned,
    )
    compiled = triton.compile(source, target=backends.GPUTarget("cuda", 90, 32))
    ptx = compiled.asm["ptx"]
    assert "ld.global.v2.b64" in ptx and "st.global.v2.b64" in ptx


def test_manager_block_table_goes_in_as_is() -> None:
    """`KVCacheManager.block_table(ids)` (a 2-D int32 buffer) is taken by block_table and
    slot_mapping without conversion: on the CPU the tensor views the buffer's memory."""
    import kvblocks as kb

    spec = kb.FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")
    mgr = kb.KVCacheManager(kb.KVCacheConfig(32, [], [kb.KVCacheGroupSpec(["l"], spec)]), 64, 4)
    reqs = {"a": 9, "b": 3, "c": 14}
    for rid, n in reqs.items():
        assert mgr.allocate_slots(kb.Request(rid, list(range(n)), None), n) is not None
    ids = ["c", "x", "a", "b"]
    lists = [mgr.get_block_ids(r)[0] for r in ids]
    buf = mgr.block_table(ids)
    width = memoryview(buf).shape[1]
    assert width == 4
    table = block_table(buf, width)
    assert table.dtype == torch.int32 and table.shape == (4, width)
    assert torch.equal(table, block_table(lists, width))
    memoryview(buf)[0, 0] = 31  # the tensor is a view of the buffer: no copy
    assert int(table[0, 0]) == 31
    memoryview(buf)[0, 0] = lists[0][0]
    # Wider: padded with nulls; narrower: cut where only nulls are cut.
    assert torch.equal(block_table(buf, 6), block_table(lists, 6))
    assert torch.equal(block_table(mgr.block_table(["x", "y"]), 0), torch.zeros((2, 0)).int())
    with pytest.raises(ValueError, match="max_blocks"):
        block_table(buf, 3)
    computed, scheduled = [12, 0, 8, 2], [2, 0, 1, 1]
    slots = slot_mapping(buf, computed, scheduled, block_size=4)
    assert torch.equal(slots, slot_mapping(table, computed, scheduled, block_size=4))
    expected = [
        lists[r][pos // 4] * 4 + pos % 4
        for r, (c, n) in enumerate(zip(computed, scheduled, strict=True))
        for pos in range(c, c + n)
    ]
    assert slots.tolist() == expected
    # A table without rows, and a read-only int32 buffer (copied, never written).
    assert block_table(mgr.block_table([]), 2).shape == (0, 2)
    frozen = memoryview(bytes(memoryview(buf))).cast("i", (4, width))
    assert torch.equal(block_table(frozen, width), table)
    for device in DEVICES:
        assert torch.equal(block_table(buf, width, device).cpu(), table)


# ------------------------------------------------------------------- the per-call path


def raw_pages(pages: KVPages) -> list[torch.Tensor]:
    """Every plane of every batch as `[num_blocks, bytes]` rows of CPU bytes (the reference
    is torch's own index ops on these)."""
    out = []
    for move in pages._moves:
        view = move.device.cpu()
        out.append(view.reshape(view.shape[0], -1).view(torch.uint8).clone())
    return out


@pytest.mark.parametrize("config", ["full", "diffkv", "attn+mamba shared", "uniform"])
def test_kernel_variants_match_torch_index_ops(config: str, kernel: str) -> None:
    """Each kernel variant (both ids, source ids only, destination ids only, through a
    scratch tensor) against torch's index ops on random ids, repeated sources included;
    bad ids (out of range, repeated destinations, the null block) raise and touch nothing."""
    rng = torch.Generator().manual_seed(11)
    pages = make(config, DEVICES[-1])
    for _ in range(4):
        n = int(torch.randint(1, NB - 1, (1,), generator=rng))
        src = torch.randint(0, NB, (n,), generator=rng).tolist()  # repeats allowed
        dst = (torch.randperm(NB - 1, generator=rng)[:n] + 1).tolist()
        before = raw_pages(pages)
        blob = pages.gather(src)
        expect = [plane.index_select(0, torch.tensor(src)) for plane in before]
        got = [rows.reshape(n, -1) for rows in split_rows(pages, blob.cpu())]
        assert all(torch.equal(g, e) for g, e in zip(got, expect, strict=True))
        pages.copy_blocks(src, dst)  # overlapping sets go through the scratch variant
        after = [p.clone() for p in before]
        for plane, old in zip(after, before, strict=True):
            plane.index_copy_(0, torch.tensor(dst), old.index_select(0, torch.tensor(src)))
        assert all(torch.equal(a, b) for a, b in zip(raw_pages(pages), after, strict=True))
        pages.scatter(dst[::-1], blob)
        for plane, rows in zip(after, split_rows(pages, blob.cpu()), strict=True):
            plane.index_copy_(0, torch.tensor(dst[::-1]), rows.reshape(n, -1))
        assert all(torch.equal(a, b) for a, b in zip(raw_pages(pages), after, strict=True))
    before = raw_pages(pages)
    for call, error in [
        (lambda: pages.gather([1, NB]), IndexError),
        (lambda: pages.copy_blocks([1, 2], [3, -1]), IndexError),
        (lambda: pages.copy_blocks([1, 2], [3, 3]), ValueError),
        (lambda: pages.scatter([2, 0], pages.gather([1, 1])), ValueError),
        (lambda: pages.zero_blocks([5, 5]), ValueError),
    ]:
        with pytest.raises(error):
            call()
    assert all(torch.equal(a, b) for a, b in zip(raw_pages(pages), before, strict=True))


def split_rows(pages: KVPages, rows: torch.Tensor) -> list[torch.Tensor]:
    """Gathered rows cut into each plane's part, `[n, buffers, rows, words]`, as bytes."""
    return [
        pages._rows_view(rows, move).contiguous().view(torch.uint8).reshape(rows.shape[0], -1)
        for move in pages._moves
    ]


def test_ids_in_every_form_and_bad_ones() -> None:
    """Lists, tuples, ranges, int32/int64 tensors, numpy arrays and int32 buffers (what
    `KVCacheManager.block_table` returns, a row at a time) all move the same blocks; bad
    forms raise the module's errors before any page moves."""
    import array

    np = pytest.importorskip("numpy")
    pages = make("full", "cpu")
    want = pages.gather([3, 5, 7])
    forms = [
        (3, 5, 7),
        range(3, 9, 2),
        torch.tensor([3, 5, 7], dtype=torch.int32),
        np.array([3, 5, 7], dtype=np.int64),
        memoryview(array.array("i", [3, 5, 7])),
        memoryview(bytes(array.array("i", [3, 5, 7]))).cast("i"),  # read-only
        iter([3, 5, 7]),
        [np.int64(3), 5, True + 6],
    ]
    for ids in forms:
        assert torch.equal(pages.gather(ids), want), ids
    before = snapshot(pages)
    for bad, error, match in [
        ([3, 2.0], TypeError, "integers"),
        ([3, "4"], TypeError, "integers"),
        ([[3]], ValueError, "1-D"),
        (torch.ones(2, 2, dtype=torch.int64), ValueError, "1-D"),
        (torch.tensor([1.0]), TypeError, "integers"),
        ([2**64], IndexError, "int64"),
        (np.array([NB]), IndexError, "out of range"),
        (memoryview(array.array("i", [4, 4])), ValueError, "duplicate"),
        (iter([2, 0]), ValueError, "null block"),
    ]:
        with pytest.raises(error, match=match):
            pages.zero_blocks(bad)
    assert_same(snapshot(pages), before)


def test_staging_ring_wraps_and_grows() -> None:
    from kvblocks.device._staging import Rule, Staging

    ring = Staging(torch.device("cpu"), capacity=8)
    a, b = ring.stage(Rule([1, 2, 3], "a", 10), Rule(torch.tensor([4, 5]), "b", 10))
    assert (a.start, a.n, b.start, b.n) == (0, 3, 3, 2)
    assert ring.host(a).tolist() + ring.host(b).tolist() == [1, 2, 3, 4, 5]
    assert [t.tensor().tolist() for t in ring.on_device(a, b)] == [[1, 2, 3], [4, 5]]
    with pytest.raises(ValueError, match="duplicate"):
        ring.stage(Rule([9], "c", 10), Rule([6, 6], "d", 10, unique=True))
    (c,) = ring.stage(Rule([6, 7, 8, 9], "e", 10))  # does not fit after slot 5: a new lap
    assert (c.start, ring.host(c).tolist()) == (0, [6, 7, 8, 9])
    (d,) = ring.stage(Rule(list(range(20)), "f", 20))  # more than the ring holds: it grows
    assert ring.capacity >= 20 and ring.host(d).tolist() == list(range(20))
    assert ring.runs(d, None, 4) == [(0, 20, 0, 0)]
    (e, f) = ring.stage(Rule([5, 6, 1, 2, 3], "g", 20), Rule([7, 8, 9, 10, 11], "h", 20))
    assert ring.runs(e, None, 4) == [(0, 2, 5, 5), (2, 3, 1, 1)]
    assert ring.runs(e, f, 4) == [(0, 2, 5, 7), (2, 3, 1, 9)] and ring.runs(e, None, 1) is None


def test_direct_launch_passes_what_the_generic_launch_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bound (direct) launch used on CUDA, checked without a GPU: after the first call
    of a key has gone through the jitted kernel with tensor views, later calls hand the
    compiled kernel the same addresses, strides and flags as raw ints."""
    calls: list[tuple[str, tuple[int, int, int], tuple[Any, ...]]] = []

    class Compiled:
        def __getitem__(self, grid: tuple[int, int, int]) -> Any:
            return lambda *args, stream: calls.append(("direct", grid, args))

    class Jitted:
        def __getitem__(self, grid: tuple[int, int, int]) -> Any:
            def launch(*args: Any, SRC_IDS: bool, DST_IDS: bool, BLOCK: int, **kw: Any) -> Any:
                flat = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
                calls.append(("jit", grid, (*flat, SRC_IDS, DST_IDS, BLOCK)))
                return Compiled()

            return launch

    monkeypatch.setenv("KVBLOCKS_DEVICE_KERNEL", "triton")
    monkeypatch.setattr(_kernels, "_kernel", lambda: Jitted())
    monkeypatch.setattr(_kernels, "_direct", lambda src, dst: True)
    monkeypatch.setattr(_kernels, "_stream", lambda device: 0)
    monkeypatch.setattr(_kernels, "_BOUND", {})
    pages = make("diffkv", "cpu")  # two planes: two launches per call
    out = torch.empty((3, pages.block_bytes), dtype=torch.uint8)
    for _ in range(2):
        pages.gather([1, 4, 2], out=out)
        pages.scatter([5, 6, 7], out)
        pages.copy_blocks([1, 2, 3], [8, 9, 10])
        pages.copy_blocks([1, 2, 3], [2, 3, 11])  # overlapping: through a scratch tensor
    first, second = calls[: len(calls) // 2], calls[len(calls) // 2 :]
    assert [c[0] for c in first[:6]] == ["jit"] * 6 and all(c[0] == "direct" for c in second)
    for (_, grid_a, args_a), (_, grid_b, args_b) in zip(first, second, strict=True):
        assert grid_a == grid_b
        # The ids and the scratch tensor live elsewhere on the second call; the rest agrees.
        assert args_a[4:] == args_b[4:]
        assert (args_a[0] == args_b[0]) or (args_a[1] == args_b[1])


def test_fragmented_host_ids_coalesce_into_runs() -> None:
    """Swaps through the copy engines sort fragmented host ids so that consecutive host
    blocks move as one copy; each (device, host) pair stays together."""
    import kvblocks.device._pages as impl

    pages = make("full", "cpu", host_blocks=NB)
    device_ids = [7, 3, 9, 1, 4, 11]
    host_ids = [5, 2, 3, 0, 4, 1]  # 0..5, shuffled: five runs as given, one once sorted
    src, dst = pages._staging.stage(
        pages._src(device_ids, "device"), pages._dst(host_ids, "host", host_side=True)
    )
    assert pages._staging.runs(dst, None, impl.DMA_MAX_RUNS) is not None  # few: kept as is
    host, device, runs = pages._dma_order(dst, src)
    assert (host.tolist(), device.tolist()) == (host_ids, device_ids) and len(runs or ()) == 5
    # With at most one run allowed, the ids are sorted by host id: one run of six.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(impl, "DMA_MAX_RUNS", 1)
        host, device, runs = pages._dma_order(dst, src)
    assert host.tolist() == sorted(host_ids) and runs == [(0, 6, 0, 0)]
    assert dict(zip(host.tolist(), device.tolist(), strict=True)) == dict(
        zip(host_ids, device_ids, strict=True)
    )


def test_core_reads_and_writes_only_inside_its_tensors() -> None:
    """The core's staging ring finds memory through the tensor it wraps and refuses slots
    outside it, non-contiguous or non-CPU tensors, items of other sizes, and a tensor
    whose memory moved."""
    from kvblocks import _core

    host = torch.zeros(8, dtype=torch.int64)
    ring = _core._IdRing(host)
    rule = (10, False, False, "ids")
    for call in [
        lambda: ring.stage([1, 2, 3], 6, *rule),
        lambda: ring.stage(torch.ones(2, dtype=torch.int16), 0, *rule),
        lambda: ring.stage(torch.ones(9, dtype=torch.int32), 0, *rule),
        lambda: ring.stage(torch.ones(4, dtype=torch.int32)[::2], 0, *rule),
        lambda: ring.runs(7, None, 2, 4),
        lambda: ring.pairs(0, 7, 2, 4),
        lambda: _core._IdRing(host[::2]),
        lambda: _core._IdRing(torch.zeros(4, dtype=torch.int32)),
    ]:
        with pytest.raises(ValueError):
            call()
    assert host.tolist() == [0] * 8
    assert ring.stage(torch.tensor([3, 4], dtype=torch.int32), 6, *rule) == 2
    assert host.tolist() == [0] * 6 + [3, 4]
    host.resize_(1 << 16)  # new memory: the ring refuses to touch it
    with pytest.raises(ValueError, match="outside"):
        ring.stage([1], 0, *rule)
    if torch.cuda.is_available():
        with pytest.raises(ValueError):
            _core._IdRing(torch.zeros(4, dtype=torch.int64, device="cuda"))
