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


def test_device_without_torch_says_what_to_install() -> None:
    import subprocess

    code = (
        "import sys; sys.modules['torch'] = None\n"  # torch absent
        "try:\n    import kvblocks.device\n"
        "except ModuleNotFoundError as e:\n    print(e.name, '|', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (
        "torch | kvblocks.device needs torch, which is not installed: pip install 'kvblocks[torch]'"
    )


def test_simulator_imports_without_torch_or_matplotlib() -> None:
    import subprocess

    code = (
        "import sys; sys.modules['torch'] = sys.modules['matplotlib'] = None\n"
        "import kvblocks.sim, kvblocks.sim.cli, kvblocks.sim.report\n"
        "print(sorted(m for m in ('torch', 'numpy', 'matplotlib') if sys.modules.get(m)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() in ("[]", "['numpy']")  # numpy only speeds token synthesis
