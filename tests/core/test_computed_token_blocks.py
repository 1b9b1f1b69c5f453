"""The block ids covering a request's computed tokens, and a lookup cut at a token end:
the core's `get_block_ids_for_computed_tokens` and `truncate_computed_blocks`, where each
attention type decides (vLLM 0.33: cross-attention and Mamba tables are whole)."""

from __future__ import annotations

import kvblocks as kb
import pytest

BS = 16
HASHER = kb.BlockHasher(BS, "sha256_cbor")


def full() -> kb.FullAttentionSpec:
    return kb.FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=8, dtype="float16")


def swa(window: int) -> kb.SlidingWindowSpec:
    return kb.SlidingWindowSpec(
        block_size=BS, num_kv_heads=2, head_size=8, dtype="float16", sliding_window=window
    )


def cross() -> kb.CrossAttentionSpec:
    return kb.CrossAttentionSpec(block_size=BS, num_kv_heads=2, head_size=8, dtype="float16")


def mamba() -> kb.MambaSpec:
    return kb.MambaSpec(block_size=BS, shapes=[[4]], dtypes=["float32"])


def manager(*specs: kb.KVCacheSpec, enable_caching: bool = True) -> kb.KVCacheManager:
    groups = [kb.KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)]
    config = kb.KVCacheConfig(64, [], groups)
    return kb.KVCacheManager(config, 1024, BS, enable_caching=enable_caching)


def test_attention_groups_keep_the_blocks_of_the_computed_tokens() -> None:
    mgr = manager(full(), swa(32))
    r = kb.Request("r", list(range(70)), HASHER)
    assert mgr.allocate_slots(r, 70) is not None
    tables = mgr.get_block_ids("r")
    assert [len(t) for t in tables] == [5, 5]
    for n, kept in [(0, 0), (1, 1), (16, 1), (17, 2), (70, 5), (500, 5)]:
        assert mgr.get_block_ids_for_computed_tokens("r", n) == tuple(t[:kept] for t in tables)
    assert mgr.get_block_ids_for_computed_tokens("unknown", 20) == ([], [])


def test_cross_attention_and_mamba_tables_are_whole() -> None:
    mgr = manager(full(), cross(), mamba(), enable_caching=False)
    r = kb.Request("r", list(range(40)), HASHER)
    assert mgr.allocate_slots(r, 40, num_encoder_tokens=50) is not None
    attention, encoder, state = mgr.get_block_ids("r")
    assert (len(attention), len(encoder), len(state)) == (3, 4, 3)
    got = mgr.get_block_ids_for_computed_tokens("r", 16)
    assert got == (attention[:1], encoder, state)


def test_a_lookup_is_cut_at_the_token_end() -> None:
    mgr = manager(full(), swa(32))
    prompt = list(range(80))
    first = kb.Request("a", prompt, HASHER)
    assert mgr.allocate_slots(first, 80) is not None
    blocks, hit = mgr.get_computed_blocks(kb.Request("b", [*prompt, 1], HASHER))
    ids = blocks.get_block_ids()
    assert hit == 80
    for n in (0, 16, 48, 80):
        cut = mgr.truncate_computed_blocks(blocks, n)
        assert cut.get_block_ids() == tuple(g[: n // BS] for g in ids)
    assert blocks.get_block_ids() == ids


@pytest.mark.parametrize("end", [8, 96])
def test_a_cut_off_the_block_grid_or_past_an_attention_hit_is_an_error(end: int) -> None:
    """vLLM 0.33 asserts that the end is a multiple of every block size and that every
    attention group's hit covers it."""
    mgr = manager(full(), swa(32))
    prompt = list(range(80))
    assert mgr.allocate_slots(kb.Request("a", prompt, HASHER), 80) is not None
    blocks, _ = mgr.get_computed_blocks(kb.Request("b", [*prompt, 1], HASHER))
    with pytest.raises(kb.InvalidArgumentError, match="group 0"):
        mgr.truncate_computed_blocks(blocks, end)


def test_a_lookup_of_another_group_count_is_an_error() -> None:
    one = manager(full())
    one.allocate_slots(kb.Request("a", list(range(40)), HASHER), 40)
    blocks, _ = one.get_computed_blocks(kb.Request("b", [*range(40), 1], HASHER))
    with pytest.raises(kb.InvalidArgumentError):
        manager(full(), swa(32)).truncate_computed_blocks(blocks, 16)
