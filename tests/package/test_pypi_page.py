"""The page PyPI shows (pyproject.toml's ``readme``) is a user's first page: it starts with
the install command, shows the one-liners, and links only to absolute URLs (PyPI renders a
relative link broken). The version is single-sourced: Cargo.toml's, in the installed
package's metadata and in ``kvblocks.__version__``."""

from __future__ import annotations

import re
from importlib.metadata import version

import kvblocks
from paths import ROOT

PAGE = ROOT / "README-pypi.md"


def test_pyproject_names_the_page() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^readme = "README-pypi\.md"$', pyproject, flags=re.M)


def test_the_page_starts_with_the_install_command() -> None:
    first_code = re.search(r"```\w*\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
    assert first_code is not None
    assert first_code.group(1).strip() == "pip install kvblocks"


def test_the_page_has_the_one_liners() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert "KVBLOCKS_VLLM=1 vllm serve" in text  # vLLM
    assert re.search(r"^kvblocks simulate ", text, flags=re.M)  # the planner
    assert "from kvblocks.router import KVIndex" in text  # the router


def test_every_link_of_the_page_is_absolute() -> None:
    text = PAGE.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)]*)\)", text) + re.findall(r"<([^>\s]+)>", text)
    assert links
    relative = [link for link in links if not link.startswith("https://")]
    assert not relative, f"relative links, broken on PyPI: {relative}"


def test_the_version_is_cargos() -> None:
    cargo = (ROOT / "Cargo.toml").read_text(encoding="utf-8")
    match = re.search(r'^version = "([^"]+)"$', cargo, flags=re.M)
    assert match is not None
    assert kvblocks.__version__ == version("kvblocks") == match.group(1)
