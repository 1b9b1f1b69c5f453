"""The package imports without torch and reports the crate's version."""

from __future__ import annotations

import re
import sys

import kvblocks


def test_version_comes_from_cargo() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", kvblocks.__version__)


def test_import_does_not_pull_torch() -> None:
    # `import kvblocks` must work on machines without torch; it must never import it.
    import subprocess

    code = "import sys, kvblocks; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
