"""Fails unless each wheel given is the one abi3 wheel for CPython 3.10 and later, and runs
on manylinux2014 (glibc 2.17) or older: the newest policy ``auditwheel show`` allows it,
and each platform tag of its file name.

`make wheel` runs it on the zig-built Linux wheel, which should be the same as the one
release.yml's manylinux2014 container builds:

    python .github/check_manylinux.py dist/wheel/*.whl
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

NEWEST = (2, 17)  # manylinux2014
ALIASES = {"manylinux2014": (2, 17), "manylinux2010": (2, 12), "manylinux1": (2, 5)}


def glibc(tag: str) -> tuple[int, int] | None:
    """The glibc version a platform tag requires (``manylinux_2_17_x86_64`` or a legacy
    alias), or None if it is not a manylinux tag."""
    for alias, glibc_version in ALIASES.items():
        if tag.startswith(alias + "_"):
            return glibc_version
    found = re.match(r"manylinux_(\d+)_(\d+)_", tag)
    return (int(found[1]), int(found[2])) if found else None


def problems(wheel: Path) -> list[str]:
    """What keeps the wheel from manylinux2014, as auditwheel and its file name say."""
    shown = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)],
        capture_output=True,
        text=True,
        check=True,
    )
    audit = json.loads(shown.stdout)
    found = []
    if audit.get("error") or audit.get("pure"):
        return [f"auditwheel: {audit}"]
    allowed = glibc(audit["overall_tag"])
    print(f"{wheel.name}: auditwheel allows {audit['overall_tag']}")
    if allowed is None or allowed > NEWEST:
        found.append(f"auditwheel allows only {audit['overall_tag']}, newer than manylinux2014")
    python, abi, platform = wheel.name.removesuffix(".whl").split("-")[-3:]
    if (python, abi) != ("cp310", "abi3"):
        found.append(f"tagged {python}-{abi}, not cp310-abi3 (pyo3's abi3-py310)")
    platforms = platform.split(".")
    for tag in platforms:
        needs = glibc(tag)
        if needs is None or needs > NEWEST:
            found.append(f"the file name's platform tag {tag} is not manylinux2014 or older")
    return found


def main(wheels: list[str]) -> int:
    if not wheels:
        print("usage: check_manylinux.py WHEEL...", file=sys.stderr)
        return 2
    failed = [f"{w}: {p}" for w in wheels for p in problems(Path(w))]
    for line in failed:
        print(line, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
