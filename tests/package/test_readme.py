"""Every ``kvblocks simulate`` line of the README and of the PyPI page (README-pypi.md) runs as
written, from the repository root."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import kvblocks
import pytest
from paths import ROOT

README = ROOT / "README.md"
PYPI_PAGE = ROOT / "README-pypi.md"

pytestmark = pytest.mark.skipif(
    not hasattr(kvblocks, "KVCacheManager"), reason="kvblocks manager not built"
)


def simulate_lines(page: Path = README) -> list[str]:
    """The page's ``kvblocks simulate`` command lines, trailing comments dropped."""
    lines = []
    for raw in page.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line.startswith("kvblocks simulate"):
            lines.append(re.sub(r"\s+#.*$", "", line))
    return lines


def test_the_readme_has_simulate_lines() -> None:
    lines = simulate_lines()
    assert len(lines) >= 5
    assert "kvblocks simulate" in lines


def _bin_dir(tmp_path: Path) -> Path:
    """A folder with a ``kvblocks`` command: the console script pip installed with this
    Python, or (where the package was installed with ``pip --target``) one that runs
    ``-m kvblocks``."""
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        if shutil.which("kvblocks", path=str(folder)):
            return folder
    folder = tmp_path / "bin"
    folder.mkdir()
    if os.name == "nt":
        (folder / "kvblocks.cmd").write_text(f'@"{sys.executable}" -m kvblocks %*\n')
    else:
        script = folder / "kvblocks"
        script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m kvblocks "$@"\n')
        script.chmod(0o755)
    return folder


def _run(line: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Runs a README line as a POSIX shell does. Where the shell is cmd.exe (Windows), which
    passes quotes on to the command (``jq '...'`` would get the quotes), each stage of the
    pipeline is split by POSIX rules (``shlex``) and run in turn on the previous one's
    output, without a shell."""
    if os.name != "nt":
        return subprocess.run(line, shell=True, cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
    out = None
    for stage in line.split(" | "):
        argv = shlex.split(stage)
        argv[0] = shutil.which(argv[0], path=env["PATH"]) or argv[0]
        out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                             timeout=600, input=None if out is None else out.stdout)  # fmt: skip
        if out.returncode != 0:
            break
    assert out is not None
    return out


def _jq_path(expr: str, doc: object) -> object:
    """The value of a jq path such as ``.runs[0].prefix_hit_rate``."""
    for name, index in re.findall(r"\.(\w+)|\[(\d+)\]", expr):
        doc = doc[name] if name else doc[int(index)]  # type: ignore[index]
    return doc


def test_the_pypi_page_has_a_simulate_line() -> None:
    assert simulate_lines(PYPI_PAGE)


# Each line once: the PyPI page repeats one of the README's.
@pytest.mark.parametrize("line", list(dict.fromkeys(simulate_lines() + simulate_lines(PYPI_PAGE))))
def test_readme_line_runs_as_written(line: str, tmp_path: Path) -> None:
    if "--plot" in line:
        pytest.importorskip("matplotlib")
    # The repository root's files, but outputs (the plot) land in a scratch folder.
    for entry in ("docs",):
        try:
            (tmp_path / entry).symlink_to(ROOT / entry, target_is_directory=True)
        except OSError:  # Windows without the right to make symbolic links
            shutil.copytree(ROOT / entry, tmp_path / entry)
    env = {**os.environ, "PATH": f"{_bin_dir(tmp_path)}{os.pathsep}{os.environ['PATH']}"}
    command, _, jq_expr = line.partition(" | jq ")
    if jq_expr and shutil.which("jq") is None:  # no jq here: check its path with Python
        out = _run(command, tmp_path, env)
        assert out.returncode == 0, out.stderr
        value = _jq_path(shlex.split(jq_expr)[0], json.loads(out.stdout))
    else:
        out = _run(line, tmp_path, env)
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
