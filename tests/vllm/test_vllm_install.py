"""`install()` reaches every vLLM process and says so: the switch and its options in the
environment (for a spawned engine core), the utility method on vLLM's `EngineCore`, the
INFO line, `uninstall()` undoing all of it, and `manager_info()` without an engine.

Runs where vLLM is importable; skipped elsewhere. The real engine: test_vllm_engine.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

import kvblocks as kb  # noqa: E402
import kvblocks.vllm as kv  # noqa: E402
from kvblocks.retention_spec import parse_retention  # noqa: E402
from kvblocks.vllm import _info, _install  # noqa: E402
from vllm.v1.engine.core import EngineCore  # noqa: E402

ENV = (_install.ENV_SWITCH, _install.ENV_FALLBACK, _install.ENV_RETENTION)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No kvblocks switch in the environment before, and nothing installed after."""
    for key in ENV:
        monkeypatch.delenv(key, raising=False)
    yield
    kv.uninstall()


@pytest.mark.parametrize("fallback", [True, False])
def test_install_exports_its_switch_and_uninstall_removes_it(
    clean_env: None, fallback: bool
) -> None:
    kv.install(fallback=fallback)
    assert os.environ[_install.ENV_SWITCH] == "1"
    assert os.environ[_install.ENV_FALLBACK] == str(int(fallback))
    assert _install.ENV_RETENTION not in os.environ
    kv.uninstall()
    assert not any(key in os.environ for key in ENV)


def test_uninstall_restores_what_the_environment_held(
    clean_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_install.ENV_SWITCH, "yes")
    monkeypatch.setenv(_install.ENV_RETENTION, "session=5")
    kv.install(retention=kb.RetentionPolicy(ttl_s=2.5))
    kv.install(fallback=False)  # a second call replaces the options
    assert os.environ[_install.ENV_FALLBACK] == "0"
    assert _install.ENV_RETENTION not in os.environ
    kv.uninstall()
    assert os.environ[_install.ENV_SWITCH] == "yes"
    assert os.environ[_install.ENV_RETENTION] == "session=5"
    assert _install.ENV_FALLBACK not in os.environ


@pytest.mark.parametrize(
    "policy",
    [
        kb.RetentionPolicy(session_s=30.0),
        kb.RetentionPolicy(session_s=0.1234567891, tenant_quotas={"burst": 0}),
        kb.RetentionPolicy(
            classes=3, default_class=1, priority_classes={-1: 2, 5: 0}, ttl_s=[None, 7.5, 60.0]
        ),
        kb.RetentionPolicy(ttl_s=12.0, default_tenant_quota=40, tenant_quotas={"a": 1}),
    ],
)
def test_a_policy_reaches_the_child_identically(clean_env: None, policy: Any) -> None:
    """What the plugin in a spawned engine core builds from the environment equals the
    object given to install()."""
    kv.install(retention=policy)
    assert parse_retention(os.environ[_install.ENV_RETENTION]).build() == policy


def test_a_policy_without_a_spec_is_refused_before_anything_changes(clean_env: None) -> None:
    policy = kb.RetentionPolicy(tenant_quotas={"a,b": 3})
    with pytest.raises(kb.InvalidArgumentError, match="spawned vLLM engine core"):
        kv.install(retention=policy)
    assert not kv.installed()
    assert not any(key in os.environ for key in ENV)


def test_a_retention_that_is_not_a_policy_is_refused(clean_env: None) -> None:
    with pytest.raises(kb.InvalidTypeError, match="RetentionPolicy"):
        kv.install(retention="session=30")
    assert not kv.installed()


def test_the_engine_core_answers_while_installed(clean_env: None) -> None:
    kv.uninstall()
    assert not hasattr(EngineCore, _info.UTILITY)
    kv.install()
    assert getattr(EngineCore, _info.UTILITY) is _info.engine_core_info
    kv.uninstall()
    assert not hasattr(EngineCore, _info.UTILITY)


def engine_core(manager: Any) -> Any:
    return SimpleNamespace(scheduler=SimpleNamespace(kv_cache_manager=manager))


def test_engine_core_info_names_the_manager(clean_env: None) -> None:
    import vllm
    from kvblocks.vllm._manager import KVCacheManager

    kv.install()
    theirs = _info.engine_core_info(engine_core(object()))
    assert theirs == {
        "manager": "vllm",
        "manager_class": "builtins.object",
        "kvblocks_version": kb.__version__,
        "vllm_version": vllm.__version__,
        "pid": os.getpid(),
        "installed": True,
        "fallbacks": [],
    }
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float16)
    config = KVCacheConfig(
        num_blocks=10, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["f"], spec)]
    )
    init_none_hash(sha256)
    manager = KVCacheManager(config, max_model_len=256, scheduler_block_size=16, hash_block_size=16)
    ours = _info.engine_core_info(engine_core(manager))
    assert ours["manager"] == "kvblocks"
    assert ours["manager_class"] == "kvblocks.vllm._manager.KVCacheManager"


class SpawnedCore:
    """vLLM's `SyncMPClient` as far as `manager_info` uses it."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[str] = []

    def call_utility(self, method: str, *args: Any) -> Any:
        self.calls.append(method)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def llm(client: Any) -> Any:
    return SimpleNamespace(llm_engine=SimpleNamespace(engine_core=client))


def test_manager_info_asks_a_spawned_engine_core() -> None:
    client = SpawnedCore({"manager": "kvblocks", "pid": 7})
    assert kv.manager_info(llm(client)) == {"manager": "kvblocks", "pid": 7}
    assert kv.manager_info(llm(client).llm_engine)["pid"] == 7
    assert client.calls == [_info.UTILITY, _info.UTILITY]


def test_a_spawned_engine_core_without_kvblocks_runs_vllms_manager() -> None:
    """vLLM's message for a utility method the child lacks (vllm/v1/engine/core.py)."""
    missing = Exception(
        f"Call to {_info.UTILITY} method failed: "
        f"'EngineCoreProc' object has no attribute '{_info.UTILITY}'"
    )
    info = kv.manager_info(llm(SpawnedCore(missing)))
    assert info["manager"] == "vllm" and info["pid"] is None and not info["installed"]
    other = Exception("Call to kvblocks_manager_info method failed: engine dead")
    with pytest.raises(Exception, match="engine dead"):
        kv.manager_info(llm(SpawnedCore(other)))


def test_manager_info_answers_in_process(clean_env: None) -> None:
    inproc = SimpleNamespace(engine_core=engine_core(object()))
    info = kv.manager_info(llm(inproc))
    assert info["manager"] == "vllm" and info["pid"] == os.getpid()


@pytest.mark.parametrize("bad", [None, 3, SimpleNamespace(llm_engine=None)])
def test_manager_info_refuses_what_is_not_an_engine(bad: Any) -> None:
    with pytest.raises(kb.InvalidTypeError, match=r"vllm\.LLM"):
        kv.manager_info(bad)


def test_the_info_line_shows_with_vllms_default_logging() -> None:
    """In a fresh process whose logging only vLLM configured (its default configuration,
    which an engine applies when it starts), building the scheduler's manager prints
    kvblocks' INFO line through vLLM's handler (stdout by default)."""
    code = """
        import torch
        import vllm
        import vllm.logger
        import kvblocks, kvblocks.vllm as kv
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import init_none_hash
        from vllm.v1.core.sched import scheduler as sched
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

        spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float16)
        config = KVCacheConfig(
            num_blocks=10, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["f"], spec)]
        )
        vllm.logger._configure_vllm_root_logger()  # what an engine's start-up calls
        kv.install(fallback=False)
        init_none_hash(sha256)
        sched.KVCacheManager(config, max_model_len=256, scheduler_block_size=16, hash_block_size=16)
        line = f"kvblocks {kvblocks.__version__} KV cache manager in use (vLLM {vllm.__version__})"
        print("expect", line)
    """
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k not in ENV},
    )
    expect = out.stdout.strip().splitlines()[-1].removeprefix("expect ")
    lines = [line for line in out.stdout.splitlines() if line.endswith(expect)]
    assert len(lines) == 2, out.stdout + out.stderr  # the line itself and the expectation
    assert " INFO " in lines[0]


def _unservable_configs() -> list[Any]:
    """vLLM configurations kvblocks refuses: a spec type it lacks (refused by kvblocks.vllm)
    and a Mamba group without align mode under prefix caching (refused by the core under
    vLLM 0.33's rules; 0.32 serves it)."""
    from vllm.v1.kv_cache_interface import (
        EncoderOnlyAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
    )

    encoder = EncoderOnlyAttentionSpec(
        block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float16
    )
    mamba = MambaSpec(block_size=16, shapes=((4,),), dtypes=(torch.float16,))
    assert mamba.mamba_cache_mode == "none"
    return [
        KVCacheConfig(
            num_blocks=32, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], s)]
        )
        for s in (encoder, mamba)
    ]


def _outcome(build: Any) -> Any:
    """The type of what `build()` returns, or of what it raises."""
    try:
        return type(build())
    except Exception as e:
        return type(e)


@pytest.mark.parametrize("config", _unservable_configs(), ids=["encoder-only", "mamba-none"])
def test_a_refused_configuration_falls_back_to_vllms_manager(clean_env: None, config: Any) -> None:
    """With fallback=True the scheduler gets what stock vLLM gives it (its own manager, or
    on 0.33 its own refusal of Mamba prefix caching without align mode); with
    fallback=False kvblocks' refusal. vLLM 0.32 builds a manager for Mamba prefix caching
    without align mode, and kvblocks serves it under 0.32's rules."""
    import vllm.v1.core.sched.scheduler as sched
    from kvblocks.vllm._version_rules import rules

    args = dict(max_model_len=256, scheduler_block_size=16, hash_block_size=16)
    spec_name = type(config.kv_cache_groups[0].kv_cache_spec).__name__
    if spec_name == "MambaSpec" and rules().mamba_none_prefix_caching:
        kv.fallbacks.clear()
        kv.install(fallback=False)
        assert isinstance(sched.KVCacheManager(config, **args), kv.KVCacheManager)
        assert not kv.fallbacks
        return
    theirs = _install.vllm_original("vllm.v1.core.sched.scheduler", "KVCacheManager")
    stock = _outcome(lambda: theirs(config, **args))
    kv.fallbacks.clear()
    kv.install(fallback=True)
    assert _outcome(lambda: sched.KVCacheManager(config, **args)) is stock
    assert len(kv.fallbacks) == 1
    kv.install(fallback=False)
    with pytest.raises(kb.UnsupportedError):
        sched.KVCacheManager(config, **args)
    kv.fallbacks.clear()
