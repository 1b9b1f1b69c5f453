"""``python -m kvblocks``: the ``kvblocks`` command line (see :mod:`kvblocks.sim.cli`)."""

from __future__ import annotations

import sys

from kvblocks.sim.cli import main

if __name__ == "__main__":
    sys.exit(main())
