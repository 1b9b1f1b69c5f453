"""Generate tests/data/hash_goldens.json with vLLM 0.33.0 (run in its venv, .venv-vllm-0.33).

    .venv-vllm-0.33/bin/python tools/gen_hash_goldens.py tests/data/hash_goldens.json

Three sections, all computed by vLLM's own code:
* ``none_hash``: NONE_HASH per algorithm for several PYTHONHASHSEED values, and without it
  for the SHA-256 kinds (xxhash kinds are random per process then).
* ``chains``: ``hash_block_tokens`` chains (block sizes 1-64, token ids up to 2**32-1, every
  extra-key kind and combinations). ``env`` is the PYTHONHASHSEED the chain was made under
  (``null``: unset); ``parent`` is the first block's parent (``null``: NONE_HASH).
* ``requests``: ``Request`` + ``get_request_block_hasher`` block hashes (LoRA, multimodal,
  cache salt, appended output tokens).

Extra keys are stored as JSON: tuples as lists, bytes as ``{"b": hex}``. Strings other than
vLLM's tag literals are created fresh (as vLLM's runtime strings are), so pickle's memo
behaves as it does inside vLLM.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
from typing import Any

import vllm.v1.core.kv_cache_utils as kcu
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.request import Request

ALGOS = ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
SEEDS = ["0", "42", "12345", "random"]


def fresh(s: str) -> str:
    """A new str object equal to `s` (not interned), as vLLM's runtime strings are."""
    return "".join(list(s))


def set_seed(seed: str | None) -> None:
    if seed is None:
        os.environ.pop("PYTHONHASHSEED", None)
    else:
        os.environ["PYTHONHASHSEED"] = seed


def to_json(v: Any) -> Any:
    if isinstance(v, tuple):
        return [to_json(x) for x in v]
    if isinstance(v, bytes):
        return {"b": v.hex()}
    return v


def rand_token(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.25:
        return rng.randrange(256)
    if r < 0.5:
        return rng.randrange(256, 65536)
    if r < 0.9:
        return rng.randrange(65536, 150_000)
    if r < 0.98:
        return rng.randrange(150_000, 2**31)
    return rng.randrange(2**31, 2**32)


def rand_str(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.1:
        return fresh(rng.choice("ab\u00e9"))  # one character: a CPython singleton
    if kind < 0.15:
        return fresh("")
    if kind < 0.2:
        # Non-ASCII; around 255 UTF-8 bytes (SHORT_BINUNICODE vs BINUNICODE, 1- vs 2-byte
        # CBOR length).
        return fresh("é" + "x" * rng.randrange(248, 256) + "✓")
    return fresh(f"id-{rng.getrandbits(48):012x}")


def rand_extra_keys(rng: random.Random, start: int, end: int) -> tuple[Any, ...] | None:
    """A random extra-keys tuple in vLLM's order and tagged shapes (or None)."""
    if rng.random() < 0.2:
        return None
    keys: list[Any] = []
    if rng.random() < 0.4:
        keys.append(("lora", rand_str(rng), rand_str(rng)))
    for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
        keys.append(("mm", rand_str(rng), rng.randrange(start - 40, end) - start))
    if rng.random() < 0.3:
        keys.append(("cache_salt", rand_str(rng)))
    if rng.random() < 0.25:
        embeds = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 64)))
        keys.append(("prompt_embeds", hashlib.sha256(embeds).digest()))
    if not keys and rng.random() < 0.5:
        return None
    return tuple(keys)


def gen_none_hash() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for seed in [None, *SEEDS]:
        set_seed(seed)
        row = {}
        for algo in ALGOS:
            if seed is None and algo.startswith("xxhash"):
                continue
            kcu.init_none_hash(get_hash_fn_by_name(algo))
            row[algo] = kcu.NONE_HASH.hex()
        out["unset" if seed is None else seed] = row
    set_seed(None)
    return out


def gen_chains(rng: random.Random, n_chains: int) -> list[dict[str, Any]]:
    sizes = [1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 48, 63, 64]
    chains = []
    for i in range(n_chains):
        algo = ALGOS[i % 4]
        # Chains from NONE_HASH: SHA-256 kinds without PYTHONHASHSEED, any kind with it.
        env: str | None = rng.choice([None, "42"])
        if env is None and algo.startswith("xxhash"):
            env = "42"
        use_none = rng.random() < 0.6
        set_seed(env)
        hash_fn = get_hash_fn_by_name(algo)
        kcu.init_none_hash(hash_fn)
        width = 32 if algo.startswith("sha") else 16
        parent: bytes | None = None if use_none else rng.randbytes(width)
        first_parent = parent
        bs = rng.choice(sizes)
        blocks = []
        for b in range(rng.randrange(1, 7)):
            tokens = [rand_token(rng) for _ in range(bs)]
            keys = rand_extra_keys(rng, b * bs, (b + 1) * bs)
            h = kcu.hash_block_tokens(hash_fn, parent, tokens, keys)
            blocks.append([tokens, to_json(keys), h.hex()])
            parent = h
        chains.append(
            {
                "algo": algo,
                "env": env,
                "parent": None if first_parent is None else first_parent.hex(),
                "blocks": blocks,
            }
        )
    set_seed(None)
    return chains


def gen_special_chains() -> list[dict[str, Any]]:
    """Blocks whose pickle spans several frames (> 64 KiB) and edge-case extra keys."""
    set_seed("42")
    out = []
    for algo in ALGOS:
        hash_fn = get_hash_fn_by_name(algo)
        kcu.init_none_hash(hash_fn)
        cases: list[tuple[list[int], Any]] = [
            (list(range(40_000)), None),
            ([7] * 3, (("lora", fresh("x" * 70_000), fresh("p")),)),
            ([1], ()),
            ([2**32 - 1, 2**31, 0], ((None, True, False, -(2**63), 2**63 - 1, b"", b"z"),)),
        ]
        blocks, parent = [], None
        for tokens, keys in cases:
            h = kcu.hash_block_tokens(hash_fn, parent, tokens, keys)
            blocks.append([tokens, to_json(keys), h.hex()])
            parent = h
        out.append({"algo": algo, "env": "42", "parent": None, "blocks": blocks})
    set_seed(None)
    return out


def make_request(
    rid: str,
    prompt: list[int],
    hasher: Any,
    lora: tuple[str, str, int] | None,
    salt: str | None,
    mm: list[tuple[str, int, int]],
) -> Request:
    feats = [
        MultiModalFeatureSpec(
            data=None,
            modality="image",
            identifier=fresh(ident),
            mm_position=PlaceholderRange(offset=off, length=length),
        )
        for ident, off, length in mm
    ]
    lora_req = None if lora is None else LoRARequest(fresh(lora[0]), lora[2], fresh(lora[1]))
    return Request(
        request_id=rid,
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=16),
        pooling_params=None,
        mm_features=feats,
        lora_request=lora_req,
        cache_salt=None if salt is None else fresh(salt),
        block_hasher=hasher,
    )


def gen_requests(rng: random.Random, n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        algo = ALGOS[i % 4]
        env = "42" if algo.startswith("xxhash") or rng.random() < 0.3 else None
        set_seed(env)
        hash_fn = get_hash_fn_by_name(algo)
        kcu.init_none_hash(hash_fn)
        hbs = rng.choice([1, 2, 4, 5, 8, 16, 32])
        n_prompt = rng.randrange(0, 8 * hbs + 5)
        prompt = [rand_token(rng) for _ in range(n_prompt)]
        lora = None
        if rng.random() < 0.4:
            lora = (f"lora-{i}", f"/adapters/{i}", rng.randrange(1, 100))
        salt = rng.choice([None, None, "", f"salt-{i}"])
        mm: list[tuple[str, int, int]] = []
        pos = 0
        while n_prompt > 0 and rng.random() < 0.7:
            off = pos + rng.randrange(0, 2 * hbs + 1)
            length = rng.randrange(1, 3 * hbs + 2)
            if off + length > n_prompt:
                break
            mm.append((f"mm-{i}-{len(mm)}", off, length))
            pos = off + length
        hasher = kcu.get_request_block_hasher(hbs, hash_fn)
        req = make_request(f"req-{i}", prompt, hasher, lora, salt, mm)
        counts = [len(req.block_hashes)]
        appends = []
        for _ in range(rng.randrange(0, 4)):
            step = [rand_token(rng) for _ in range(rng.choice([1, 1, 2, hbs, 3 * hbs + 1]))]
            req.append_output_token_ids(step[0] if len(step) == 1 else step)
            appends.append(step)
            counts.append(len(req.block_hashes))
        out.append(
            {
                "algo": algo,
                "env": env,
                "hash_block_size": hbs,
                "prompt": prompt,
                "lora": lora,
                "cache_salt": salt,
                "mm": mm,
                "appends": appends,
                "counts": counts,
                "hashes": [h.hex() for h in req.block_hashes],
            }
        )
    set_seed(None)
    return out


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/hash_goldens.json"
    rng = random.Random(20260121)
    data = {
        "vllm": "0.33.0",
        "none_hash": gen_none_hash(),
        "chains": gen_chains(rng, 280) + gen_special_chains(),
        "requests": gen_requests(rng, 48),
    }
    # The 40000-token block is regenerated by the test from its marker, not stored.
    for chain in data["chains"]:
        for block in chain["blocks"]:
            if len(block[0]) == 40_000:
                block[0] = {"range": 40_000}
            keys = block[1]
            if keys and isinstance(keys[0], list) and keys[0][0] == "lora":
                if len(keys[0][1]) == 70_000:
                    keys[0][1] = {"repeat": "x", "n": 70_000}
    with open(path, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    n_blocks = sum(len(c["blocks"]) for c in data["chains"])
    n_req = sum(len(r["hashes"]) for r in data["requests"])
    print(f"wrote {path}: {n_blocks} chain blocks, {n_req} request blocks")


if __name__ == "__main__":
    main()
