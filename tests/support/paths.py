"""Where the tests find the repository's files: the root, and the oracle data the tools
write (tests/data/)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
