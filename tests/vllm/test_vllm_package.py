"""`kvblocks.vllm` as a package: importing it loads neither vLLM nor torch, and the vLLM
plugin installs only when `KVBLOCKS_VLLM` asks for it. Runs without vLLM."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from paths import ROOT


def run(code: str, **env: str) -> str:
    import os

    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
    )
    return out.stdout.strip()


def test_import_kvblocks_and_kvblocks_vllm_load_neither_vllm_nor_torch() -> None:
    loaded = run(
        """
        import sys
        import kvblocks, kvblocks.vllm
        print(sorted(m for m in ("vllm", "torch") if m in sys.modules))
        """
    )
    assert loaded == "[]"


@pytest.mark.parametrize(("value", "installs"), [("", False), ("0", False), ("1", True)])
def test_the_plugin_installs_only_when_asked(value: str, installs: bool) -> None:
    """The `vllm.general_plugins` entry point: with vLLM absent, an install attempt is
    what fails (ImportError of vLLM); without the switch nothing is tried."""
    out = run(
        """
        import importlib.util, sys
        from kvblocks.vllm import _install
        calls = []
        _install.install = lambda **kw: calls.append(kw)
        _install.plugin()
        print(len(calls), "vllm" in sys.modules)
        """,
        KVBLOCKS_VLLM=value,
    )
    assert out == f"{int(installs)} False"


def test_the_entry_point_is_declared() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the wheel also runs on 3.10

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    plugins = project["project"]["entry-points"]["vllm.general_plugins"]
    assert plugins == {"kvblocks": "kvblocks.vllm._install:plugin"}


@pytest.mark.parametrize(
    ("spec", "printed"),
    [
        ("", "None"),
        ("session=30;quota=burst:0", "30.0 {'burst': 0}"),
        ("lru", "None"),
    ],
)
def test_the_plugin_reads_its_retention_policy(spec: str, printed: str) -> None:
    """`KVBLOCKS_VLLM_RETENTION` holds a retention spec: the plugin installs with it."""
    out = run(
        """
        from kvblocks.vllm import _install
        calls = []
        _install.install = lambda **kw: calls.append(kw)
        _install.plugin()
        p = calls[0]["retention"]
        print(None if p is None else f"{p.session_s} {p.tenant_quotas}")
        """,
        KVBLOCKS_VLLM="1",
        KVBLOCKS_VLLM_RETENTION=spec,
    )
    assert out == printed


def test_a_bad_retention_spec_is_named() -> None:
    with pytest.raises(subprocess.CalledProcessError) as info:
        run(
            """
            from kvblocks.vllm import _install
            _install.install = lambda **kw: None
            _install.plugin()
            """,
            KVBLOCKS_VLLM="1",
            KVBLOCKS_VLLM_RETENTION="session=soon",
        )
    assert "session" in info.value.stderr


@pytest.mark.parametrize(("value", "fallback"), [("", True), ("1", True), ("0", False)])
def test_the_plugin_reads_its_fallback_option(value: str, fallback: bool) -> None:
    """`KVBLOCKS_VLLM_FALLBACK`, which `install(fallback=...)` exports for a spawned
    engine core, reaches the plugin's `install()`."""
    out = run(
        """
        from kvblocks.vllm import _install
        calls = []
        _install.install = lambda **kw: calls.append(kw)
        _install.plugin()
        print(calls[0]["fallback"])
        """,
        KVBLOCKS_VLLM="1",
        KVBLOCKS_VLLM_FALLBACK=value,
    )
    assert out == str(fallback)


def test_a_bad_fallback_option_is_named() -> None:
    with pytest.raises(subprocess.CalledProcessError) as info:
        run(
            """
            from kvblocks.vllm import _install
            _install.install = lambda **kw: None
            _install.plugin()
            """,
            KVBLOCKS_VLLM="1",
            KVBLOCKS_VLLM_FALLBACK="maybe",
        )
    assert "InvalidArgumentError" in info.value.stderr
    assert "KVBLOCKS_VLLM_FALLBACK='maybe'" in info.value.stderr
