"""kb.Request: token bookkeeping, incremental block hashes, extra keys, bad input."""

from __future__ import annotations

from typing import Any

import kvblocks as kb
import pytest


def chain(algo: str, tokens: list[int], bs: int, keys: list[Any]) -> list[bytes]:
    """Block hashes computed one block at a time with kb.hash_block_tokens."""
    out: list[bytes] = []
    parent = None
    for i in range(len(tokens) // bs):
        parent = kb.hash_block_tokens(algo, parent, tokens[i * bs : (i + 1) * bs], keys[i])
        out.append(parent)
    return out


def test_tokens_and_counters() -> None:
    req = kb.Request("r1", [1, 2, 3], kb.BlockHasher(2))
    assert (req.request_id, req.num_tokens, req.num_prompt_tokens) == ("r1", 3, 3)
    assert (req.num_output_tokens, req.num_computed_tokens, req.num_preemptions) == (0, 0, 0)
    assert req.skip_reading_prefix_cache is False
    req.append_output_token_ids(4)
    req.append_output_token_ids([5, 6])
    req.append_output_token_ids(())
    assert req.all_token_ids == [1, 2, 3, 4, 5, 6]
    assert (req.num_tokens, req.num_output_tokens) == (6, 3)
    req.num_computed_tokens = 5
    req.num_preemptions = 2
    req.skip_reading_prefix_cache = True
    req.num_in_flight_tokens = 1
    assert (req.num_computed_tokens, req.num_preemptions) == (5, 2)
    assert req.skip_reading_prefix_cache is True
    assert req.num_in_flight_tokens == 1


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"])
def test_block_hashes_grow_incrementally(algo: str) -> None:
    prompt = list(range(100, 111))
    req = kb.Request("r", prompt, kb.BlockHasher(4, algo))
    assert len(req.block_hashes) == 2
    outputs = [7, 8, 9, 10, 11, 12, 13]
    for t in outputs:
        req.append_output_token_ids(t)
        assert len(req.block_hashes) == req.num_tokens // 4
    tokens = prompt + outputs
    assert req.block_hashes == chain(algo, tokens, 4, [None] * 5)


def test_no_hasher_means_no_hashes() -> None:
    req = kb.Request("r", list(range(64)))
    req.append_output_token_ids(list(range(64)))
    assert req.block_hashes == []


def test_extra_keys_follow_vllm_order() -> None:
    # LoRA on every block, mm on overlapping blocks with offsets relative to the block,
    # the salt on block 0 only.
    prompt = list(range(12))
    req = kb.Request(
        "r",
        prompt,
        kb.BlockHasher(4),
        lora_name="L",
        lora_path="/p",
        lora_id=3,
        cache_salt="s",
        mm_features=[("img", 2, 4), ("aud", 6, 1)],
    )
    lora = ("lora", "L", "/p")
    keys = [
        (lora, ("mm", "img", 2), ("cache_salt", "s")),
        (lora, ("mm", "img", -2), ("mm", "aud", 2)),
        (lora,),
    ]
    assert req.block_hashes == chain("sha256_cbor", prompt, 4, list(keys))
    assert (req.lora_name, req.lora_id, req.cache_salt) == ("L", 3, "s")


def test_empty_salt_adds_no_key() -> None:
    a = kb.Request("a", [1, 2, 3, 4], kb.BlockHasher(4), cache_salt="")
    b = kb.Request("b", [1, 2, 3, 4], kb.BlockHasher(4))
    assert a.block_hashes == b.block_hashes


def test_long_prompt_matches_block_by_block() -> None:
    prompt = [(i * 7919) % 150_000 for i in range(4096 + 5)]
    req = kb.Request("r", prompt, kb.BlockHasher(16, "sha256"))
    assert req.block_hashes == chain("sha256", prompt, 16, [None] * 256)
    req.append_output_token_ids(list(range(1000)))
    assert len(req.block_hashes) == (4101 + 1000) // 16


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"prompt_token_ids": [1, -2]}, OverflowError),
        ({"prompt_token_ids": [2**32]}, OverflowError),
        ({"prompt_token_ids": ["a"]}, TypeError),
        ({"prompt_token_ids": None}, TypeError),
        ({"hasher": "sha256"}, TypeError),
        ({"mm_features": [("a", 0, 0)]}, ValueError),  # empty
        ({"mm_features": [("a", 2, 2), ("b", 0, 1)]}, ValueError),  # unsorted
        ({"mm_features": [("a", 0, 3), ("b", 2, 1)]}, ValueError),  # overlapping
        ({"mm_features": [("a", -1, 2)]}, ValueError),
        ({"mm_features": [("a", 0)]}, ValueError),
        ({"lora_name": "L", "lora_path": "/p", "lora_id": 0}, ValueError),
        ({"lora_path": "/p", "lora_id": 1}, ValueError),  # needs a name
        ({"prompt_token_ids": []}, ValueError),  # empty prompt
    ],
)
def test_bad_constructor_input(kwargs: dict[str, Any], exc: type[Exception]) -> None:
    args: dict[str, Any] = {"request_id": "r", "prompt_token_ids": [1, 2, 3, 4, 5]}
    args.update(kwargs)
    with pytest.raises(exc):
        kb.Request(**args)


@pytest.mark.parametrize("bad", [[1, -1], [2**32], ["x"], 2**40, -1, 1.5, None])
def test_bad_append_changes_nothing(bad: Any) -> None:
    req = kb.Request("r", [1, 2, 3], kb.BlockHasher(2))
    before = (req.all_token_ids, req.block_hashes)
    with pytest.raises((OverflowError, TypeError)):
        req.append_output_token_ids(bad)
    assert (req.all_token_ids, req.block_hashes) == before


def test_bad_setters() -> None:
    req = kb.Request("r", [1])
    with pytest.raises(OverflowError):
        req.num_computed_tokens = -1
    with pytest.raises(TypeError):
        req.num_preemptions = "1"  # type: ignore[assignment]
    assert req.num_computed_tokens == 0


@pytest.mark.vllm
def test_request_against_live_vllm() -> None:
    """A multimodal LoRA request with appended tokens, built by vLLM and by kvblocks."""
    pytest.importorskip("vllm")
    import vllm.v1.core.kv_cache_utils as kcu
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.request import Request

    fn = get_hash_fn_by_name("sha256_cbor")
    kcu.init_none_hash(fn)
    if kcu.NONE_HASH != kb.none_hash("sha256_cbor"):
        pytest.skip("PYTHONHASHSEED changed after kvblocks computed NONE_HASH")
    prompt = [(i * 31) % 1000 for i in range(70)]
    feats = [
        MultiModalFeatureSpec(None, "image", "".join(["i", "m"]), PlaceholderRange(3, 20)),
        MultiModalFeatureSpec(None, "image", "".join(["i", "2"]), PlaceholderRange(30, 5)),
    ]
    want = Request(
        "r",
        prompt,
        SamplingParams(max_tokens=8),
        None,
        mm_features=feats,
        lora_request=LoRARequest("lo", 1, "/x"),
        cache_salt="salt",
        block_hasher=kcu.get_request_block_hasher(8, fn),
    )
    got = kb.Request(
        "r",
        prompt,
        kb.BlockHasher(8),
        lora_name="lo",
        lora_path="/x",
        lora_id=1,
        cache_salt="salt",
        mm_features=[("im", 3, 20), ("i2", 30, 5)],
    )
    for step in ([1], [2, 3, 4, 5, 6, 7, 8], list(range(20))):
        want.append_output_token_ids(step)
        got.append_output_token_ids(step)
        assert got.block_hashes == want.block_hashes


def test_reads_during_a_long_append_see_before_after_or_busy() -> None:
    """A long append hashes with the GIL released; another thread reading the request
    meanwhile gets the old count, the new count, or RuntimeError (busy), never a torn
    state, and the request ends consistent."""
    import threading

    bs, n0, n_add = 16, 64, 200_000
    req = kb.Request("r", list(range(n0)), kb.BlockHasher(bs))
    tokens = list(range(n_add))
    seen: set[int] = set()
    busy = 0
    done = threading.Event()

    def append() -> None:
        req.append_output_token_ids(tokens)
        done.set()

    t = threading.Thread(target=append)
    t.start()
    while not done.is_set():
        try:
            seen.add(req.num_tokens)
        except RuntimeError:
            busy += 1
    t.join()
    assert seen <= {n0, n0 + n_add}
    assert req.num_tokens == n0 + n_add
    assert len(req.block_hashes) == (n0 + n_add) // bs
    full = (n0 + n_add) // bs
    assert req.block_hashes == chain("sha256_cbor", req.all_token_ids, bs, [None] * full)


def test_lora_by_name_alone_hashes_with_vllms_default_path() -> None:
    """vLLM keys a LoRA block with `("lora", lora_name, lora_path)`, `lora_path` defaulting
    to ""; a name alone hashes so, and its events carry no adapter id."""
    tokens = list(range(8))
    req = kb.Request("a", tokens, kb.BlockHasher(4, "sha256_cbor"), lora_name="adapter")
    first = kb.hash_block_tokens(
        "sha256_cbor", kb.none_hash("sha256_cbor"), tokens[:4], (("lora", "adapter", ""),)
    )
    assert req.block_hashes[0] == first
    assert (req.lora_name, req.lora_id) == ("adapter", None)
    plain = kb.Request("b", tokens, kb.BlockHasher(4, "sha256_cbor"))
    assert plain.block_hashes[0] != first


def test_mm_placeholder_may_end_past_the_prompt() -> None:
    """Encoder-decoder prompts: vLLM accepts a placeholder that ends past the prompt; the
    blocks it overlaps are keyed by it, as any other feature's."""
    h = kb.BlockHasher(4, "sha256_cbor")
    req = kb.Request("enc", list(range(8)), h, mm_features=[("audio", 2, 500)])
    inside = kb.Request("enc2", list(range(8)), h, mm_features=[("audio", 2, 6)])
    plain = kb.Request("p", list(range(8)), h)
    assert len(req.block_hashes) == 2
    assert req.block_hashes[0] != plain.block_hashes[0]
    assert req.block_hashes[0] == inside.block_hashes[0]
