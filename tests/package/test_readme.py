"""Every ``kvblocks simulate`` line of the README runs as written, from the repository root."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import kvblocks
import pytest
from paths import ROOT

README = ROOT / "README.md"

pytestmark = pytest.mark.skipif(
    not hasattr(kvblocks, "KVCacheManager"), reason="kvblocks manager not built"
)


def simulate_lines() -> list[str]:
    """The README's ``kvblocks simulate`` command lines, trailing comments dropped."""
    lines = []
    for raw in README.read_text().splitlines():
        line = raw.strip()
        if line.startswith("kvblocks simulate"):
            lines.append(re.sub(r"\s+#.*$", "", line))
    return lines


def test_the_readme_has_simulate_lines() -> None:
    lines = simulate_lines()
    assert len(lines) >= 5
    assert "kvblocks simulate" in lines


def _bin_dir(tmp_path: Path) -> Path:
    """A folder with a ``kvblocks`` command: the console script next to this Python, or
    (where the package was installed with ``pip --target``) one that runs ``-m kvblocks``."""
    here = Path(sys.executable).parent
    if (here / "kvblocks").exists():
        return here
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "kvblocks"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m kvblocks "$@"\n')
    script.chmod(0o755)
    return folder


def _jq_path(expr: str, doc: object) -> object:
    """The value of a jq path such as ``.runs[0].prefix_hit_rate``."""
    for name, index in re.findall(r"\.(\w+)|\[(\d+)\]", expr):
        doc = doc[name] if name else doc[int(index)]  # type: ignore[index]
    return doc


@pytest.mark.parametrize("line", simulate_lines())
def test_readme_line_runs_as_written(line: str, tmp_path: Path) -> None:
    if "--plot" in line:
        pytest.importorskip("matplotlib")
    # The repository root's files, but outputs (the plot) land in a scratch folder.
    for entry in ("docs",):
        (tmp_path / entry).symlink_to(ROOT / entry)
    env = {**os.environ, "PATH": f"{_bin_dir(tmp_path)}{os.pathsep}{os.environ['PATH']}"}
    command, _, jq_expr = line.partition(" | jq ")
    if jq_expr and shutil.which("jq") is None:  # no jq here: check its path with Python
        out = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
        assert out.returncode == 0, out.stderr
        value = _jq_path(jq_expr.strip("'\""), json.loads(out.stdout))
    else:
        out = subprocess.run(line, shell=True, cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "Traceback" not in out.stderr
        value = out.stdout.strip() if jq_expr else None
    if jq_expr:
        assert value not in (None, "null", "")
        assert 0.0 < float(str(value)) < 1.0
    elif "--sweep" in line:
        # the sweep table, then (a blank line before it) the per-tenant one, if any
        table = out.stdout.strip().split("\n\n")[0]
        assert len(table.splitlines()) == 1 + line.split("=", 1)[1].count(",") + 1
    else:
        assert "prefix hit rate" in out.stdout and "ideal (Belady)" in out.stdout
    if "--plot" in line:
        png = tmp_path / line.split("--plot ")[1].split()[0]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if "--compare-vllm" in line:
        from kvblocks.sim.backends import vllm_available

        if vllm_available() is None:
            assert "vLLM is not importable" in out.stderr
        else:
            assert "digests agree" in out.stdout
