"""`kvblocks.vllm` converts vLLM 0.33's HiSparse configuration (as `tests/v1/core/
test_prefix_caching.py`'s `make_hisparse_kv_cache_config` builds it): the two HiSparse
spec classes with vLLM's page sizes, per-request memory and resident admission cap, the
groups' `host_resident` and `role`, and the host pool size. The manager then refuses the
configuration with `UnsupportedError` naming the missing `HiSparseCoordinator`, never a
`TypeError` or a wrong answer. Run in a vLLM 0.33 venv (`make test-vllm`).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

import kvblocks as kb  # noqa: E402
from kvblocks.vllm._config import convert_config, convert_spec  # noqa: E402
from vllm.v1 import kv_cache_interface as vi  # noqa: E402

if not hasattr(vi, "HiSparseHotSpec"):
    pytest.skip("this vLLM has no HiSparse", allow_module_level=True)

BS = 16


def _vllm_config(max_model_len: int, max_in_flight_tokens: int) -> SimpleNamespace:
    """The parts of a `VllmConfig` that the HiSparse specs' `max_memory_usage_bytes` read."""
    return SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=max_model_len),
        max_in_flight_tokens=max_in_flight_tokens,
    )


def _hisparse_config(host_num_blocks: int = 16) -> Any:
    """vLLM's HiSparse layout: host-resident source, indexer, resident pages, hot region."""
    source = vi.FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
    role = vi.KVCacheGroupRole
    return vi.KVCacheConfig(
        num_blocks=32,
        hisparse_host_num_blocks=host_num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            vi.KVCacheGroupSpec(["source"], source, role=role.HISPARSE_SOURCE, host_resident=True),
            vi.KVCacheGroupSpec(
                ["indexer"], source, enable_kv_transfer=False, role=role.HISPARSE_INDEXER
            ),
            vi.KVCacheGroupSpec(
                ["resident"], vi.HiSparseResidentSpec(block_size=BS, page_size=BS * 4)
            ),
            vi.KVCacheGroupSpec(
                ["hot"],
                vi.HiSparseHotSpec(block_size=BS, page_size=BS * 4, blocks_per_request=2),
                enable_kv_transfer=False,
            ),
        ],
    )


@pytest.mark.parametrize(("max_model_len", "in_flight"), [(128, 256), (4096, 256), (100, 8)])
def test_specs_page_size_memory_and_cap_equal_vllms(max_model_len: int, in_flight: int) -> None:
    cfg = _vllm_config(max_model_len, in_flight)
    for theirs in (
        vi.HiSparseHotSpec(block_size=BS, page_size=320, blocks_per_request=3),
        vi.HiSparseResidentSpec(block_size=BS, page_size=320),
    ):
        ours = convert_spec(theirs)
        assert type(ours).__name__ == type(theirs).__name__
        assert ours.page_size_bytes == theirs.page_size_bytes
        got = ours.max_memory_usage_bytes(
            max_model_len=max_model_len, max_num_batched_tokens=in_flight
        )
        assert got == theirs.max_memory_usage_bytes(cfg)
    resident = vi.HiSparseResidentSpec(block_size=BS, page_size=320)
    assert convert_spec(resident).max_admission_blocks_per_request(
        in_flight, max_model_len
    ) == resident.max_admission_blocks_per_request(in_flight, max_model_len)


def test_config_keeps_roles_host_groups_and_host_pool() -> None:
    theirs = _hisparse_config(host_num_blocks=24)
    ours = convert_config(theirs)
    assert ours.hisparse_host_num_blocks == 24
    assert [g.host_resident for g in ours.kv_cache_groups] == [
        g.host_resident for g in theirs.kv_cache_groups
    ]
    assert [g.role for g in ours.kv_cache_groups] == [g.role.value for g in theirs.kv_cache_groups]
    assert [type(g.kv_cache_spec).__name__ for g in ours.kv_cache_groups] == [
        type(g.kv_cache_spec).__name__ for g in theirs.kv_cache_groups
    ]


def test_manager_refuses_hisparse_with_the_missing_coordinator() -> None:
    from kvblocks.vllm import KVCacheManager

    with pytest.raises(kb.UnsupportedError, match="HiSparseCoordinator"):
        KVCacheManager(
            _hisparse_config(),
            max_model_len=128,
            enable_caching=False,
            hash_block_size=BS,
            scheduler_block_size=BS,
        )
