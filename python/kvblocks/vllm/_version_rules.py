"""What kvblocks does differently for each supported vLLM release.

vLLM 0.32 and 0.33 differ in a few rules that a KV cache manager and a request hasher
show (docs/vllm-versions.md has the whole table, with the ones that need no switch).
kvblocks follows the installed release: `rules()` gives its `Rules`, and the code that
applies each one reads it there, once, when it builds the hasher or the manager.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import kvblocks as kb
from kvblocks.vllm._versions import SUPPORTED, installed_minor


@dataclass(frozen=True)
class Rules:
    """The rules of one vLLM minor release that kvblocks must follow.

    Attributes:
        hash_lookahead: `get_request_block_hasher(hash_block_size, caching_hash_fn,
            num_hash_lookahead_tokens)` takes the third argument (0.33); 0.32 takes the
            first two only, and a third is a `TypeError`.
        count_null_block_refs: `BlockPool.touch` / `free_blocks` count the null block's
            `ref_cnt` up and down, and `pop_blocks_for_free` returns a table's leading
            null blocks too (0.32); 0.33 never counts the null block and trims them.
        flagged_eagle_groups_drop: the groups flagged `is_eagle_group` take the EAGLE
            last-block drop even when the manager is built with `use_eagle=False` (0.32's
            coordinator keys it on `eagle_group_ids` alone); 0.33 drops only with
            `use_eagle` (its `drop_eagle_group_ids`).
        mamba_none_prefix_caching: a Mamba group in `mamba_cache_mode="none"` is prefix
            cached when caching is on (0.32's `MambaManager`: every full block cached,
            hits by the same search as "align"); 0.33 asserts that configuration away.
    """

    hash_lookahead: bool
    count_null_block_refs: bool
    flagged_eagle_groups_drop: bool
    mamba_none_prefix_caching: bool


#: The rules of each release in `SUPPORTED`.
RULES: dict[tuple[int, int], Rules] = {
    (0, 32): Rules(
        hash_lookahead=False,
        count_null_block_refs=True,
        flagged_eagle_groups_drop=True,
        mamba_none_prefix_caching=True,
    ),
    (0, 33): Rules(
        hash_lookahead=True,
        count_null_block_refs=False,
        flagged_eagle_groups_drop=False,
        mamba_none_prefix_caching=False,
    ),
}


def rules_for(minor: tuple[int, int]) -> Rules:
    """The rules of vLLM `minor` (`(major, minor)`, e.g. `(0, 32)`).

    Raises:
        kvblocks.UnsupportedError: for a release outside `SUPPORTED`.
    """
    found = RULES.get(minor)
    if found is None:
        supported = ", ".join(f"{a}.{b}" for a, b in SUPPORTED)
        raise kb.UnsupportedError(
            f"vLLM {minor[0]}.{minor[1]} is not supported by kvblocks (supported: {supported})"
        )
    return found


@functools.cache
def rules() -> Rules:
    """The rules of the installed vLLM (imports it), read once per process, as the drift
    guard's verdict is: the vLLM of a process does not change.

    Raises:
        kvblocks.UnsupportedError: when the installed release is outside `SUPPORTED`.
    """
    return rules_for(installed_minor())
