"""The per-release rules of `kvblocks.vllm._version_rules`: one set per supported vLLM
release, and, where vLLM is importable, the installed release's rules checked against
what that vLLM itself does, and followed by `install()`."""

from __future__ import annotations

import inspect
import os
from typing import Any

import kvblocks as kb
import pytest
from kvblocks.vllm._version_rules import RULES, rules, rules_for
from kvblocks.vllm._versions import SUPPORTED, supported_range
from paths import ROOT


def test_one_rule_set_per_supported_release() -> None:
    assert tuple(RULES) == SUPPORTED


def test_an_unsupported_release_has_no_rules() -> None:
    with pytest.raises(kb.UnsupportedError, match=r"vLLM 0\.31 is not supported"):
        rules_for((0, 31))


@pytest.fixture
def vllm() -> Any:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    return pytest.importorskip("vllm")


@pytest.mark.vllm
def test_the_installed_rules_are_what_vllm_does(vllm: Any) -> None:
    """Each rule, read off the installed vLLM: its hasher's parameters, and what its
    own pool does with a touch and a free of the null block."""
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher

    params = inspect.signature(get_request_block_hasher).parameters
    pool = BlockPool(4, True, 16)
    pool.touch([pool.null_block, pool.null_block])
    pool.free_blocks([pool.null_block])
    assert rules().hash_lookahead == ("num_hash_lookahead_tokens" in params)
    assert rules().count_null_block_refs == (pool.null_block.ref_cnt == 1)


@pytest.mark.vllm
def test_install_binds_manager_arguments_as_the_installed_vllm(vllm: Any) -> None:
    """vLLM 0.32's `KVCacheManager.__init__` has no `num_hash_lookahead_tokens`, so its
    later positions differ from 0.33's: the installed manager takes the installed
    release's positions, and counts the null block as that release does."""
    torch = pytest.importorskip("torch")
    import kvblocks.vllm as kv
    import vllm.v1.core.sched.scheduler as sched
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float16)
    cfg = KVCacheConfig(
        num_blocks=10, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)]
    )
    theirs = sched.KVCacheManager
    names = list(inspect.signature(theirs).parameters)
    given = {"kv_cache_config": cfg, "max_model_len": 256, "scheduler_block_size": 16}
    given |= {"hash_block_size": 16, "log_stats": True}
    positional = [given.get(n, inspect.signature(theirs).parameters[n].default) for n in names]
    positional = positional[: names.index("log_stats") + 1]
    kv.install(fallback=False)
    try:
        mgr = sched.KVCacheManager(*positional)
        with pytest.raises(TypeError):  # refused as vLLM's own refuses it
            sched.KVCacheManager(*positional, kv_cache_config=cfg)
    finally:
        kv.uninstall()
    assert isinstance(mgr, kv.KVCacheManager) and mgr.log_stats is True
    with pytest.raises(TypeError):
        theirs(*positional, kv_cache_config=cfg)
    counted = rules().count_null_block_refs
    assert mgr.block_pool.core.get_ref_cnt(0) == 0
    mgr.block_pool.touch([0])
    assert mgr.block_pool.null_block.ref_cnt == (1 if counted else 0)


def test_the_readme_table_and_the_extra_name_the_supported_releases() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| vLLM | kvblocks follows |") :].split("\n\n")[0]
    rows = [line.split("|")[1].split()[0] for line in table.splitlines()[2:]]
    assert rows == [f"{a}.{b}.x" for a, b in SUPPORTED]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'vllm = ["vllm{supported_range()}"]' in pyproject
