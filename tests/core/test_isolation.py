"""Tenant isolation: requests with different cache salts, or different LoRA adapters, never
share a block, even for identical tokens; the same tenant does share (so the property is
not vacuous). Checked on the block hashes and through a KVCacheManager serving every
tenant from one pool. (The scheduler-driven state machine in test_manager_model.py also
asserts that live requests of different tenants hold disjoint blocks after every step.)
"""

from __future__ import annotations

from typing import Any

import kvblocks as kb
from hypothesis import given, settings
from hypothesis import strategies as st

BS = 4
# A tenant: (cache_salt, LoRA adapter id or None).
Tenant = tuple[str | None, int | None]
tenants = st.tuples(
    st.sampled_from([None, "", "a", "b", "tenant-1"]), st.sampled_from([None, 1, 2, 7])
)
token_lists = st.lists(st.integers(0, 2**32 - 1), min_size=BS, max_size=12 * BS)


def request(rid: str, tokens: list[int], tenant: Tenant, algo: str = "sha256") -> kb.Request:
    salt, lora = tenant
    lora_kw: dict[str, Any] = {}
    if lora is not None:
        lora_kw = {"lora_name": f"adapter{lora}", "lora_path": f"/a/{lora}", "lora_id": lora}
    return kb.Request(rid, tokens, kb.BlockHasher(BS, algo), cache_salt=salt, **lora_kw)


def same_tenant(a: Tenant, b: Tenant) -> bool:
    # vLLM hashes a salt only when it is truthy; "" is the same tenant as None.
    return (a[0] or None, a[1]) == (b[0] or None, b[1])


@settings(max_examples=300, deadline=None)
@given(
    tokens=token_lists,
    a=tenants,
    b=tenants,
    algo=st.sampled_from(["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]),
)
def test_different_tenants_never_share_a_block_hash(
    tokens: list[int], a: Tenant, b: Tenant, algo: str
) -> None:
    ha = request("a", tokens, a, algo).block_hashes
    hb = request("b", tokens, b, algo).block_hashes
    if same_tenant(a, b):
        assert ha == hb
    else:
        assert not set(ha) & set(hb)


def manager(num_blocks: int) -> kb.KVCacheManager:
    spec = kb.FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    config = kb.KVCacheConfig(num_blocks, [], [kb.KVCacheGroupSpec(["l0"], spec)])
    return kb.KVCacheManager(config, 1024, BS)


@settings(max_examples=150, deadline=None)
@given(
    prompts=st.lists(
        st.tuples(st.sampled_from([0, 1]), st.integers(1, 4), tenants), min_size=2, max_size=8
    ),
)
def test_manager_serves_tenants_from_disjoint_blocks(
    prompts: list[tuple[int, int, Tenant]],
) -> None:
    """Prompts drawn from two shared texts, each under some tenant, admitted one after the
    other into one manager: a request hits only its own tenant's blocks, and no block is
    held by two tenants at once."""
    texts = [list(range(100, 100 + 4 * BS + 1)), [5] * (4 * BS + 1)]
    mgr = manager(256)
    holder: dict[int, Tenant] = {}
    admitted: list[tuple[Tenant, list[int], int]] = []
    for i, (text, _k, tenant) in enumerate(prompts):
        req = request(f"r{i}", texts[text], tenant)
        blocks, hit = mgr.get_computed_blocks(req)
        earlier = [t for t, _, tx in admitted if tx == text]
        if any(same_tenant(t, tenant) for t in earlier):
            assert hit == 4 * BS  # the same tenant reuses its cached prefix
        else:
            assert hit == 0
        new = mgr.allocate_slots(req, req.num_tokens - hit, hit, blocks)
        assert new is not None
        (table,) = mgr.get_block_ids(req.request_id)
        for b in table:
            owner = holder.setdefault(b, tenant)
            assert same_tenant(owner, tenant), f"block {b} held by {owner} and {tenant}"
        admitted.append((tenant, table, text))
