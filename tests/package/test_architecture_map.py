"""docs/ARCHITECTURE.md's "File by file" table names every source file, and only those."""

from __future__ import annotations

import re

import pytest
from paths import ROOT

ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
SECTION = "## File by file"

pytestmark = pytest.mark.skipif(
    not (ROOT / "src").is_dir(), reason="needs the source tree (src/), not an installed wheel"
)


def mapped_files() -> list[str]:
    """The paths in the first column of the section's table, in order."""
    text = ARCHITECTURE.read_text()
    assert SECTION in text, f"{ARCHITECTURE} has no {SECTION!r} section"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, flags=re.M)


def source_files() -> list[str]:
    """Every Rust file of the crate and Python file of the package, as repo paths."""
    files = [*(ROOT / "src").rglob("*.rs"), *(ROOT / "python").rglob("*.py")]
    return sorted(p.relative_to(ROOT).as_posix() for p in files)


def test_every_source_file_is_on_the_map() -> None:
    missing = sorted(set(source_files()) - set(mapped_files()))
    assert not missing, f"not in {ARCHITECTURE.name}'s {SECTION!r}: {missing}"


def test_every_file_on_the_map_exists() -> None:
    stale = sorted(set(mapped_files()) - set(source_files()))
    assert not stale, f"{ARCHITECTURE.name}'s {SECTION!r} names files that do not exist: {stale}"


def test_each_file_is_on_the_map_once() -> None:
    mapped = mapped_files()
    repeated = sorted({f for f in mapped if mapped.count(f) > 1})
    assert not repeated, f"listed more than once: {repeated}"
