"""vLLM's `get_request_block_hasher` on the kvblocks core.

vLLM's engine core makes one hasher per engine and hands it to every `Request`, which
calls it from `__init__` and `append_output_token_ids` and extends `request.block_hashes`
with what it returns. The hasher here returns the same `bytes`, bit for bit, for vLLM's
four hash algorithms, every extra key (LoRA, cache salt, multimodal features, prompt
embeddings) and lookahead (vLLM 0.33); the hashing runs in Rust, without the GIL on long prompts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from kvblocks._core import HASH_ALGORITHMS, RequestBlockHasher

#: vLLM's `prefix_caching_hash_algo` names, which are also the names of its hash
#: functions in `vllm.utils.hashing`: the core's algorithms (`HashAlgo::ALL`).
ALGORITHMS = HASH_ALGORITHMS


def hash_algorithm(caching_hash_fn: Callable[[Any], bytes]) -> str:
    """The name of the vLLM hash algorithm `caching_hash_fn` is.

    Args:
        caching_hash_fn: one of `vllm.utils.hashing`'s `sha256`, `sha256_cbor`, `xxhash`,
            `xxhash_cbor` (what vLLM's `get_hash_fn_by_name` returns).

    Returns:
        The algorithm's name, as in `ALGORITHMS`.

    Raises:
        ValueError: for any other function (kvblocks cannot reproduce its hashes).
    """
    hashing = importlib.import_module("vllm.utils.hashing")
    for name in ALGORITHMS:
        if caching_hash_fn is getattr(hashing, name, None):
            return name
    # The same function from a reloaded vllm.utils.hashing.
    fn_name = getattr(caching_hash_fn, "__name__", None)
    if getattr(caching_hash_fn, "__module__", None) == hashing.__name__ and fn_name in ALGORITHMS:
        return str(fn_name)
    raise ValueError(
        f"kvblocks cannot hash with {caching_hash_fn!r}: it knows vLLM's "
        f"{', '.join(ALGORITHMS)} from vllm.utils.hashing only"
    )


def get_request_block_hasher(
    hash_block_size: int,
    caching_hash_fn: Callable[[Any], bytes],
    num_hash_lookahead_tokens: int = 0,
) -> RequestBlockHasher:
    """vLLM's `get_request_block_hasher`, hashing in Rust.

    Args:
        hash_block_size: tokens per hashed block.
        caching_hash_fn: vLLM's hash function (`vllm.utils.hashing.sha256_cbor`, ...);
            it names the algorithm and is never called.
        num_hash_lookahead_tokens: with L > 0, a block's hash also covers the L tokens
            after it and is emitted once they exist.

    Returns:
        A callable `hasher(request) -> list[bytes]` giving the hashes of the full blocks a
        vLLM `Request` completed since its last call, chained from its last hash or from
        vLLM's `NONE_HASH` (read from `vllm.v1.core.kv_cache_utils` at each call, so
        `init_none_hash` after this call still applies).

    Raises:
        ValueError: for a hash function other than vLLM's four, a block size < 1 or a
            negative lookahead.
    """
    algo = hash_algorithm(caching_hash_fn)
    kv_cache_utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
    tensor_data = importlib.import_module("vllm.v1.utils").tensor_data
    return RequestBlockHasher(
        hash_block_size,
        algo,
        num_hash_lookahead_tokens,
        none_hash_from=kv_cache_utils,
        tensor_data=tensor_data,
    )


def with_fallback(
    vllm_get_request_block_hasher: Callable[..., Callable[[Any], list[bytes]]],
    *,
    hash_lookahead: bool,
) -> Callable[..., Callable[[Any], list[bytes]]]:
    """A `get_request_block_hasher` for vLLM's own name: kvblocks' hasher for vLLM's four
    algorithms, `vllm_get_request_block_hasher` (vLLM's original) for any other hash
    function, since vLLM accepts any callable there (its own tests pass the built-in
    `hash`).

    Args:
        vllm_get_request_block_hasher: vLLM's `get_request_block_hasher`, saved before
            it is replaced.
        hash_lookahead: whether the installed vLLM's signature has the third parameter,
            `num_hash_lookahead_tokens` (0.33; `_version_rules.Rules.hash_lookahead`).
            Without it the function takes two arguments, as vLLM 0.32's does.

    Returns:
        A function with the installed vLLM's signature.
    """

    def hasher(
        hash_block_size: int, caching_hash_fn: Callable[[Any], bytes], *lookahead: int
    ) -> Callable[[Any], list[bytes]]:
        try:
            hash_algorithm(caching_hash_fn)
        except ValueError:
            return vllm_get_request_block_hasher(hash_block_size, caching_hash_fn, *lookahead)
        return get_request_block_hasher(hash_block_size, caching_hash_fn, *lookahead)

    if hash_lookahead:

        def get(
            hash_block_size: int,
            caching_hash_fn: Callable[[Any], bytes],
            num_hash_lookahead_tokens: int = 0,
        ) -> Callable[[Any], list[bytes]]:
            return hasher(hash_block_size, caching_hash_fn, num_hash_lookahead_tokens)

    else:

        def get(  # type: ignore[misc]
            hash_block_size: int, caching_hash_fn: Callable[[Any], bytes]
        ) -> Callable[[Any], list[bytes]]:
            return hasher(hash_block_size, caching_hash_fn)

    get.__doc__ = get_request_block_hasher.__doc__
    return get
