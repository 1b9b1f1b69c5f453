"""`kvblocks.vllm.get_request_block_hasher` against the installed vLLM's own hasher.

Each case builds the same vLLM `Request` twice, once with vLLM's hasher and once with
kvblocks', appends the same outputs (one token at a time and in batches), and compares
`request.block_hashes` after every step, for vLLM's four hash algorithms, every extra
key (LoRA, cache salt, multimodal features, prompt embeddings) and lookahead 0, 1 and 2
(vLLM 0.33; 0.32 has no lookahead, so those cases skip there). Run in a vLLM venv
(`make test-vllm VLLM_TESTS=vllm/test_vllm_hasher.py`); skipped where vLLM is not importable.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

import kvblocks.vllm as kv  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from kvblocks._core import RequestBlockHasher  # noqa: E402
from kvblocks.vllm._hashing import with_fallback  # noqa: E402
from kvblocks.vllm._version_rules import rules  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.multimodal.inputs import (  # noqa: E402
    MultiModalFeatureSpec,
    MultiModalKwargsItem,
    PlaceholderRange,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils import hashing as vh  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

pytestmark = pytest.mark.vllm

HashFn = Callable[[Any], bytes]
ALGOS: dict[str, HashFn] = {
    "sha256_cbor": vh.sha256_cbor,
    "sha256": vh.sha256,
    "xxhash_cbor": vh.xxhash_cbor,
    "xxhash": vh.xxhash,
}
# vLLM's xxhash algorithms need the `xxhash` package (the Makefile's test-vllm installs it).
HAVE_XXHASH = vh._xxhash is not None
ALGO_PARAMS = [
    pytest.param(
        a, marks=pytest.mark.skipif(a.startswith("xxhash") and not HAVE_XXHASH, reason="no xxhash")
    )
    for a in ALGOS
]


#: Whether the installed vLLM hashes with lookahead (0.33; not 0.32).
HASH_LOOKAHEAD = rules().hash_lookahead


def lookaheads(*values: int) -> list[Any]:
    """Lookahead parameters; those above 0 skip on a vLLM without lookahead (0.32)."""
    no_lookahead = pytest.mark.skipif(not HASH_LOOKAHEAD, reason="this vLLM has no lookahead")
    return [pytest.param(v, marks=[no_lookahead] if v else []) for v in values]


def vllm_hasher(hash_block_size: int, fn: Any, lookahead: int) -> Callable[[Request], list[bytes]]:
    """vLLM's own hasher, called with the installed release's signature."""
    if not HASH_LOOKAHEAD:
        assert lookahead == 0, "no lookahead in this vLLM"
        return kv_cache_utils.get_request_block_hasher(hash_block_size, fn)
    return kv_cache_utils.get_request_block_hasher(hash_block_size, fn, lookahead)


@pytest.fixture(autouse=True)
def _restore_none_hash() -> Any:
    """NONE_HASH is process-global: put back what other test modules expect."""
    yield
    kv_cache_utils.init_none_hash(vh.sha256_cbor)


@dataclass
class Extras:
    """The extra-key inputs of a request."""

    lora: LoRARequest | None = None
    cache_salt: str | None = None
    mm: Sequence[tuple[str, int, int]] = ()
    prompt_embeds: Any = None
    prompt_is_token_ids: list[bool] | None = None


def mm_features(items: Sequence[tuple[str, int, int]]) -> list[MultiModalFeatureSpec] | None:
    """vLLM's multimodal features as its scheduler tests build them."""
    return [
        MultiModalFeatureSpec(
            data=MultiModalKwargsItem.dummy(),
            mm_position=PlaceholderRange(offset=offset, length=length),
            identifier=identifier,
            modality="image",
        )
        for identifier, offset, length in items
    ] or None


def make_request(
    prompt: list[int] | None, extras: Extras, hasher: Callable[[Request], list[bytes]]
) -> Request:
    return Request(
        request_id="r",
        prompt_token_ids=None if prompt is None else list(prompt),
        sampling_params=SamplingParams(max_tokens=10_000),
        pooling_params=None,
        prompt_embeds=extras.prompt_embeds,
        prompt_is_token_ids=extras.prompt_is_token_ids,
        mm_features=mm_features(extras.mm),
        lora_request=extras.lora,
        cache_salt=extras.cache_salt,
        block_hasher=hasher,
    )


def check_same(
    algo: str,
    hash_block_size: int,
    lookahead: int,
    prompt: list[int] | None,
    outputs: Sequence[int | list[int]],
    extras: Extras | None = None,
) -> int:
    """Runs one request through both hashers; returns the number of hashes compared."""
    extras = extras or Extras()
    fn = ALGOS[algo]
    kv_cache_utils.init_none_hash(fn)
    theirs = make_request(prompt, extras, vllm_hasher(hash_block_size, fn, lookahead))
    ours = make_request(prompt, extras, kv.get_request_block_hasher(hash_block_size, fn, lookahead))
    assert ours.block_hashes == theirs.block_hashes
    assert all(type(h) is bytes for h in ours.block_hashes)
    for out in outputs:
        theirs.append_output_token_ids(out)
        ours.append_output_token_ids(out)
        assert ours.block_hashes == theirs.block_hashes, (algo, hash_block_size, lookahead)
    expected = max(0, theirs.num_tokens - lookahead) // hash_block_size
    assert len(ours.block_hashes) == expected
    return expected


def tokens(rng: random.Random, n: int) -> list[int]:
    # Every pickle and CBOR int width: < 24, < 256, < 65536, < 2**31, >= 2**31.
    widths = (23, 255, 65_535, 200_000, 2**31 - 1, 2**32 - 1)
    return [rng.randint(0, rng.choice(widths)) for _ in range(n)]


def outputs(rng: random.Random, n: int) -> list[int | list[int]]:
    """n tokens as appends: single ints, then lists of 1 to 40 tokens."""
    out: list[int | list[int]] = []
    left = n
    while left > 0:
        if rng.random() < 0.5:
            out.append(tokens(rng, 1)[0])
            left -= 1
        else:
            k = min(left, rng.randint(1, 40))
            out.append(tokens(rng, k))
            left -= k
    return out


LORA = LoRARequest(lora_name="adapter-a", lora_int_id=3, lora_path="/loras/a")

EXTRAS = {
    "plain": Extras(),
    "lora": Extras(lora=LORA),
    "cache_salt": Extras(cache_salt="tenant-7"),
    "empty_salt": Extras(cache_salt=""),
    "mm": Extras(mm=[("img-a", 3, 10), ("img-b", 16, 16), ("img-c", 40, 2), ("img-d", 47, 9)]),
    "all": Extras(
        lora=LORA,
        cache_salt="s",
        mm=[("img-a", 0, 5), ("img-b", 17, 30), ("img-c", 48, 1)],
    ),
}


@pytest.mark.parametrize("algo", ALGO_PARAMS)
@pytest.mark.parametrize("lookahead", lookaheads(0, 1, 2))
@pytest.mark.parametrize("extras", list(EXTRAS))
def test_matches_vllm(algo: str, lookahead: int, extras: str) -> None:
    rng = random.Random(f"{algo}-{lookahead}-{extras}")
    for hbs in (1, 4, 16):
        prompt = tokens(rng, 57)
        n = check_same(algo, hbs, lookahead, prompt, outputs(rng, 90), EXTRAS[extras])
        assert n > 0


@pytest.mark.parametrize("algo", ALGO_PARAMS)
@pytest.mark.parametrize("lookahead", lookaheads(0, 2))
def test_one_string_object_twice_in_a_block(algo: str, lookahead: int) -> None:
    """Pickle writes a str object repeated within a block as a memo reference: a LoRA
    whose name object is its path object, one identifier object for two items in a block
    (as vLLM's tests write `["image", "image"]`), equal but distinct objects apart."""
    same = "image"
    other = "".join(["ima", "ge"])
    assert other == same and other is not same
    rng = random.Random(algo)
    cases = [
        Extras(lora=LoRARequest(lora_name="same", lora_int_id=1, lora_path="same")),
        Extras(mm=[(same, 2, 3), (same, 6, 2), (other, 9, 3), (same, 20, 4)]),
        Extras(cache_salt=same, mm=[(same, 0, 2), (other, 2, 2)]),
        Extras(lora=LoRARequest(lora_name=same, lora_int_id=1, lora_path=other)),
    ]
    for extras in cases:
        check_same(algo, 16, lookahead, tokens(rng, 40), outputs(rng, 20), extras)


@pytest.mark.parametrize("algo", ALGO_PARAMS)
def test_long_prompt_releases_and_matches(algo: str) -> None:
    """Prompts long enough to hash with the GIL released, and a long batch append."""
    rng = random.Random(algo)
    check_same(algo, 16, 0, tokens(rng, 5000), [tokens(rng, 3000), 5, tokens(rng, 17)])
    lookahead = 2 if HASH_LOOKAHEAD else 0
    check_same(algo, 16, lookahead, tokens(rng, 4099), [tokens(rng, 1000)], EXTRAS["all"])


@pytest.mark.parametrize("algo", ALGO_PARAMS)
@pytest.mark.parametrize("lookahead", lookaheads(0, 1, 2))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prompt_embeds(algo: str, lookahead: int, dtype: Any) -> None:
    gen = torch.Generator().manual_seed(7)
    embeds = torch.randn(45, 6, generator=gen).to(dtype)
    rng = random.Random(algo)
    check_same(algo, 4, lookahead, None, outputs(rng, 30), Extras(prompt_embeds=embeds))
    # Mixed prompt: token ids and embeddings, positions interleaved.
    mask = [i % 3 != 0 for i in range(45)]
    mixed = Extras(prompt_embeds=embeds, prompt_is_token_ids=mask, mm=[("x", 9, 11)])
    check_same(algo, 4, lookahead, tokens(rng, 45), outputs(rng, 30), mixed)


def test_none_hash_is_read_at_call_time() -> None:
    """`init_none_hash` after the hasher was made applies to the requests after it."""
    kv_cache_utils.init_none_hash(vh.sha256_cbor)
    ours = kv.get_request_block_hasher(4, vh.sha256_cbor)
    theirs = kv_cache_utils.get_request_block_hasher(4, vh.sha256_cbor)
    for seed_fn in (vh.sha256, vh.xxhash if HAVE_XXHASH else vh.sha256, vh.sha256_cbor):
        kv_cache_utils.init_none_hash(seed_fn)
        a = make_request(list(range(12)), Extras(), ours)
        b = make_request(list(range(12)), Extras(), theirs)
        assert a.block_hashes == b.block_hashes


def test_falsy_last_hash_chains_from_none_hash() -> None:
    """vLLM treats an empty parent hash as none and chains from NONE_HASH."""
    kv_cache_utils.init_none_hash(vh.sha256)
    req = make_request([1, 2, 3], Extras(), kv.get_request_block_hasher(2, vh.sha256))
    assert len(req.block_hashes) == 1
    req.block_hashes[0] = b""
    theirs = kv_cache_utils.get_request_block_hasher(2, vh.sha256)
    req.append_output_token_ids(4)
    ours_new = req.block_hashes[1]
    req.block_hashes.pop()
    assert theirs(req) == [ours_new]


def test_algorithm_is_read_from_the_function() -> None:
    for name, fn in ALGOS.items():
        h = kv.get_request_block_hasher(16, fn, 2)
        assert isinstance(h, RequestBlockHasher)
        assert (h.algo, h.hash_block_size, h.num_hash_lookahead_tokens) == (name, 16, 2)
        assert vh.get_hash_fn_by_name(name) is fn
        assert repr(h) == (
            f"RequestBlockHasher(hash_block_size=16, algo={name!r}, num_hash_lookahead_tokens=2)"
        ).replace("'", '"')


def test_unknown_hash_function_is_refused() -> None:
    def md5(x: Any) -> bytes:
        return b""

    with pytest.raises(ValueError, match=r"md5"):
        kv.get_request_block_hasher(16, md5)
    with pytest.raises(ValueError):
        kv.get_request_block_hasher(0, vh.sha256)
    with pytest.raises(ValueError, match="num_hash_lookahead_tokens"):
        kv.get_request_block_hasher(16, vh.sha256, -1)


def test_with_fallback_hands_other_functions_to_vllm() -> None:
    get = with_fallback(kv_cache_utils.get_request_block_hasher, hash_lookahead=HASH_LOOKAHEAD)
    assert isinstance(get(16, vh.sha256_cbor), RequestBlockHasher)
    kv_cache_utils.init_none_hash(vh.sha256)
    theirs = make_request(
        list(range(9)), Extras(), kv_cache_utils.get_request_block_hasher(3, hash)
    )
    ours = make_request(list(range(9)), Extras(), get(3, hash))
    assert len(ours.block_hashes) == 3 and ours.block_hashes == theirs.block_hashes


def test_with_fallback_has_the_installed_signature() -> None:
    """What install() puts in vLLM's place takes the parameters vLLM's own takes."""
    theirs = kv_cache_utils.get_request_block_hasher
    ours = with_fallback(theirs, hash_lookahead=HASH_LOOKAHEAD)
    assert list(inspect.signature(ours).parameters) == list(inspect.signature(theirs).parameters)


@pytest.mark.parametrize("hash_lookahead", [False, True])
def test_with_fallback_follows_the_lookahead_rule(hash_lookahead: bool) -> None:
    """Without the lookahead parameter (vLLM 0.32) a third argument is a TypeError, as
    vLLM 0.32's own; with it (0.33) it reaches the hasher."""
    calls: list[tuple[Any, ...]] = []

    def vllm_get(*args: Any) -> Callable[[Any], list[bytes]]:
        calls.append(args)
        return lambda request: []

    get = with_fallback(vllm_get, hash_lookahead=hash_lookahead)
    get(4, hash)
    if hash_lookahead:
        assert get(4, vh.sha256, 2).num_hash_lookahead_tokens == 2
        get(4, hash, 3)
        assert calls == [(4, hash, 0), (4, hash, 3)]
    else:
        with pytest.raises(TypeError):
            get(4, vh.sha256, 2)
        assert calls == [(4, hash)]


def test_no_new_block_returns_an_empty_list() -> None:
    kv_cache_utils.init_none_hash(vh.sha256_cbor)
    h = kv.get_request_block_hasher(16, vh.sha256_cbor, 1)
    req = make_request(list(range(16)), Extras(), h)
    assert req.block_hashes == []
    assert h(req) == []
    req.append_output_token_ids(99)
    assert len(req.block_hashes) == 1
    assert h(req) == []


@pytest.mark.parametrize("algo", ALGO_PARAMS)
@pytest.mark.parametrize("lookahead", lookaheads(0, 1))
def test_any_int_tokens_match_vllm(algo: str, lookahead: int) -> None:
    """vLLM's own tests put -1 placeholders in prompts (test_mm_prefix_caching); vLLM
    hashes any Python int, and so does kvblocks within 64 bits."""
    prompt = list(range(10)) + [-1] * 10 + list(range(10, 20)) + [-1] * 8 + [2**40, -(2**40)]
    extras = Extras(mm=[("aaa", 10, 10), ("bbb", 30, 8)])
    check_same(algo, 16, lookahead, prompt, [-1, [5, -7, 2**33], *range(20)], extras)


def test_bad_tokens_raise() -> None:
    kv_cache_utils.init_none_hash(vh.sha256_cbor)
    h = kv.get_request_block_hasher(2, vh.sha256_cbor)
    with pytest.raises(OverflowError):
        make_request([1, 2**70, 3], Extras(), h)
    with pytest.raises(TypeError):
        make_request([1, "x", 3], Extras(), h)  # type: ignore[list-item]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    algo=st.sampled_from([a for a in ALGOS if HAVE_XXHASH or not a.startswith("xxhash")]),
    hbs=st.integers(1, 9),
    lookahead=st.integers(0, 3 if HASH_LOOKAHEAD else 0),
    prompt_len=st.integers(1, 80),
    n_out=st.integers(0, 40),
    seed=st.integers(0, 2**32 - 1),
    use_lora=st.booleans(),
    salt=st.sampled_from([None, "", "salt"]),
    n_mm=st.integers(0, 4),
)
def test_random_requests_match_vllm(
    algo: str,
    hbs: int,
    lookahead: int,
    prompt_len: int,
    n_out: int,
    seed: int,
    use_lora: bool,
    salt: str | None,
    n_mm: int,
) -> None:
    rng = random.Random(seed)
    # Sorted, non-overlapping placeholders within the prompt.
    cuts = sorted(rng.sample(range(prompt_len + 1), min(2 * n_mm, prompt_len + 1)))
    mm = [
        (f"m{i}", a, b - a)
        for i, (a, b) in enumerate(zip(cuts[::2], cuts[1::2], strict=False))
        if b > a
    ]
    extras = Extras(lora=LORA if use_lora else None, cache_salt=salt, mm=mm)
    check_same(algo, hbs, lookahead, tokens(rng, prompt_len), outputs(rng, n_out), extras)
