"""`kvblocks.router.ray` is optional: `import kvblocks` never imports Ray, and without Ray
the module says what to install."""

from __future__ import annotations

import subprocess
import sys


def printed(*lines: str) -> str:
    """What a fresh interpreter prints running `lines`."""
    argv = [sys.executable, "-c", "\n".join(lines)]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def test_importing_kvblocks_and_its_router_never_imports_ray() -> None:
    assert (
        printed("import sys, kvblocks, kvblocks.router", "print('ray' in sys.modules)") == "False"
    )


def test_the_ray_router_without_ray_says_what_to_install() -> None:
    assert printed(
        "import sys; sys.modules['ray'] = None",
        "try:\n    import kvblocks.router.ray",
        "except ModuleNotFoundError as e:\n    print(e.name, '|', e)",
    ) == (
        "ray | kvblocks.router.ray needs ray[serve], which is not installed: "
        "pip install 'kvblocks[ray]'"
    )
