"""Block hashing against golden vectors made by vLLM 0.33.0 (tools/gen_hash_goldens.py).

NONE_HASH is computed once per process, from PYTHONHASHSEED, so every golden set made
under one PYTHONHASHSEED value is checked in a subprocess with that environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from typing import Any

import kvblocks as kb
import pytest
from paths import DATA

GOLDENS = DATA / "hash_goldens.json"
ALGOS = ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]


def load() -> dict[str, Any]:
    with open(GOLDENS) as f:
        data: dict[str, Any] = json.load(f)
    return data


def from_json(v: Any) -> Any:
    """Inverse of the generator's encoding: lists are tuples, {"b": hex} is bytes."""
    if isinstance(v, list):
        return tuple(from_json(x) for x in v)
    if isinstance(v, dict):
        if "b" in v:
            return bytes.fromhex(v["b"])
        if "repeat" in v:
            return v["repeat"] * v["n"]
        if "range" in v:
            return list(range(v["range"]))
    return v


def compute(payload: dict[str, Any]) -> dict[str, Any]:
    """Recomputes every golden of `payload` with kvblocks (runs in the subprocess)."""
    chains = []
    for chain in payload["chains"]:
        parent = None if chain["parent"] is None else bytes.fromhex(chain["parent"])
        got = []
        for tokens, keys, _ in chain["blocks"]:
            toks = from_json(tokens) if isinstance(tokens, dict) else tokens
            parent = kb.hash_block_tokens(chain["algo"], parent, toks, from_json(keys))
            got.append(parent.hex())
        chains.append(got)
    requests = []
    for r in payload["requests"]:
        hasher = kb.BlockHasher(r["hash_block_size"], r["algo"])
        lora = r["lora"] or [None, None, None]
        req = kb.Request(
            "r",
            r["prompt"],
            hasher,
            lora_name=lora[0],
            lora_path=lora[1],
            lora_id=lora[2],
            cache_salt=r["cache_salt"],
            mm_features=[tuple(m) for m in r["mm"]],
        )
        counts = [len(req.block_hashes)]
        for step in r["appends"]:
            req.append_output_token_ids(step[0] if len(step) == 1 else step)
            counts.append(len(req.block_hashes))
        requests.append({"counts": counts, "hashes": [h.hex() for h in req.block_hashes]})
    none = {a: kb.none_hash(a).hex() for a in ALGOS}
    return {"chains": chains, "requests": requests, "none_hash": none}


def run_with_seed(seed: str | None, payload: dict[str, Any]) -> dict[str, Any]:
    """`compute(payload)` in a fresh interpreter with PYTHONHASHSEED = seed (None: unset)."""
    env = dict(os.environ)
    env.pop("PYTHONHASHSEED", None)
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    # The child imports this module as pytest did, from this process's sys.path.
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    code = "import json, sys, test_hashing as t; print(json.dumps(t.compute(json.load(sys.stdin))))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def by_env(items: list[dict[str, Any]]) -> dict[str | None, list[dict[str, Any]]]:
    groups: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for item in items:
        groups[item["env"]].append(item)
    return groups


def test_goldens_cover_the_brief() -> None:
    data = load()
    blocks = [b for c in data["chains"] for b in c["blocks"]]
    assert len(blocks) + sum(len(r["hashes"]) for r in data["requests"]) >= 1000
    assert {c["algo"] for c in data["chains"]} == set(ALGOS)
    sizes = {len(b[0]) for b in blocks if isinstance(b[0], list)}
    assert 1 in sizes and 64 in sizes
    tags = {k[0] for b in blocks if b[1] for k in b[1] if isinstance(k, list) and k}
    assert {"lora", "mm", "cache_salt", "prompt_embeds"} <= tags


@pytest.mark.parametrize("seed", ["0", "42", "12345", "random"])
def test_none_hash_follows_pythonhashseed(seed: str) -> None:
    want = load()["none_hash"][seed]
    got = run_with_seed(seed, {"chains": [], "requests": []})["none_hash"]
    assert got == want


def test_none_hash_without_seed() -> None:
    want = load()["none_hash"]["unset"]
    a = run_with_seed(None, {"chains": [], "requests": []})["none_hash"]
    b = run_with_seed(None, {"chains": [], "requests": []})["none_hash"]
    for algo in ("sha256", "sha256_cbor"):
        assert a[algo] == b[algo] == want[algo]
    for algo in ("xxhash", "xxhash_cbor"):
        # Random per process, as vLLM: 16-byte digests that differ between processes.
        assert len(bytes.fromhex(a[algo])) == 16
        assert a[algo] != b[algo]


def test_none_hash_is_stable_within_a_process() -> None:
    for algo in ALGOS:
        assert kb.none_hash(algo) == kb.none_hash(algo)
        assert kb.hash_block_tokens(algo, None, [1, 2]) == kb.hash_block_tokens(
            algo, kb.none_hash(algo), [1, 2]
        )


@pytest.mark.parametrize("env", ["42", None])
def test_chains_match_vllm(env: str | None) -> None:
    chains = by_env(load()["chains"])[env]
    assert chains
    got = run_with_seed(env, {"chains": chains, "requests": []})["chains"]
    for i, (chain, hashes) in enumerate(zip(chains, got, strict=True)):
        want = [b[2] for b in chain["blocks"]]
        assert hashes == want, f"chain {i} ({chain['algo']}, env={env}) differs"


@pytest.mark.parametrize("env", ["42", None])
def test_requests_match_vllm(env: str | None) -> None:
    reqs = by_env(load()["requests"])[env]
    assert reqs
    got = run_with_seed(env, {"chains": [], "requests": reqs})["requests"]
    for i, (r, g) in enumerate(zip(reqs, got, strict=True)):
        assert g["counts"] == r["counts"], f"request {i} ({r['algo']}) counts differ"
        assert g["hashes"] == r["hashes"], f"request {i} ({r['algo']}) hashes differ"


def test_hash_lengths_and_extra_keys_matter() -> None:
    for algo in ALGOS:
        h = kb.hash_block_tokens(algo, None, [1, 2, 3])
        assert len(h) == (32 if algo.startswith("sha") else 16)
        assert kb.hash_block_tokens(algo, None, [1, 2, 3], ()) != h
        assert kb.hash_block_tokens(algo, h, [1, 2, 3]) != h
        # A falsy parent means NONE_HASH, as in vLLM.
        assert kb.hash_block_tokens(algo, b"", [1, 2, 3]) == h


@pytest.mark.parametrize(
    ("call", "exc"),
    [
        (lambda: kb.hash_block_tokens("md5", None, [1]), ValueError),
        (lambda: kb.none_hash("sha512"), ValueError),
        (lambda: kb.BlockHasher(16, "xxh64"), ValueError),
        (lambda: kb.hash_block_tokens("sha256", None, [-1]), OverflowError),
        (lambda: kb.hash_block_tokens("sha256", None, [2**32]), OverflowError),
        (lambda: kb.hash_block_tokens("sha256", None, ["1"]), TypeError),
        (lambda: kb.hash_block_tokens("sha256", None, "abc"), TypeError),
        (lambda: kb.hash_block_tokens("sha256", None, [1.0]), TypeError),
        (lambda: kb.hash_block_tokens("sha256", "ab", [1]), TypeError),
        (lambda: kb.hash_block_tokens("sha256", b"x" * 33, [1]), ValueError),
        (lambda: kb.hash_block_tokens("sha256", None, [1], (["lora"],)), TypeError),
        (lambda: kb.hash_block_tokens("sha256", None, [1], ("a", 1.5)), TypeError),
        (lambda: kb.hash_block_tokens("sha256", None, [1], ["lora"]), TypeError),
        (lambda: kb.hash_block_tokens("sha256", None, [1], (2**64,)), OverflowError),
        (lambda: kb.BlockHasher(0), ValueError),
        (lambda: kb.BlockHasher(-16), ValueError),
    ],
)
def test_bad_input_raises(call: Any, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        call()


def test_block_hasher_attributes() -> None:
    h = kb.BlockHasher(16)
    assert (h.hash_block_size, h.algo) == (16, "sha256_cbor")
    assert kb.BlockHasher(4, "xxhash").algo == "xxhash"


@pytest.mark.vllm
def test_live_against_vllm() -> None:
    """Random blocks with extra keys, hashed by vLLM and kvblocks in one process."""
    pytest.importorskip("vllm")
    import random

    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import hash_block_tokens

    rng = random.Random(7)
    for algo in ALGOS:
        if algo.startswith("xxhash"):
            pytest.importorskip("xxhash")
        fn = get_hash_fn_by_name(algo)
        parent = kb.none_hash(algo)
        for _ in range(50):
            toks = [rng.randrange(2**32) for _ in range(rng.randrange(1, 65))]
            keys = (("lora", "n" + str(rng.random()), "/p"), ("mm", "i" + str(rng.random()), -3))
            want = hash_block_tokens(fn, parent, toks, keys)
            assert kb.hash_block_tokens(algo, parent, toks, keys) == want
            parent = want
