"""``python -m kvblocks``: the ``kvblocks`` command line (see :mod:`kvblocks.cli`)."""

from __future__ import annotations

import sys

from kvblocks.cli import main

if __name__ == "__main__":
    sys.exit(main())
