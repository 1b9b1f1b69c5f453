"""``kvblocks simulate --requests-out FILE``: one record per finished request.

The file is CSV when its name ends in ``.csv``, JSON lines otherwise (``.jsonl``,
``.json``). Each record is a :class:`~kvblocks.sim.engine.FinishedRequest` (request id,
arrival, TTFT, TPOT, end-to-end latency in seconds; prompt and output tokens; the hit
tokens of its first admission in the GPU prefix cache and in the host tier; preemptions;
the fleet engine that served it), plus ``run``: the swept value (``--sweep``), else null.
TPOT is empty (CSV) or null (JSON) for a request with one output token.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable
from typing import Any

from kvblocks._core import InvalidArgumentError
from kvblocks.sim.engine import FinishedRequest

__all__ = ["FIELDS", "check_path", "write_requests"]

FIELDS = ("run", *FinishedRequest._fields)
"""The columns, in order."""


def check_path(path: str) -> None:
    """Fails before a run if ``path`` cannot be written.

    Raises:
        ValueError: A directory, a missing directory, or no permission.
    """
    if os.path.isdir(path):
        raise InvalidArgumentError(f"--requests-out: {path} is a directory")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InvalidArgumentError(f"--requests-out: no such directory: {folder}")
    if not os.access(path if os.path.exists(path) else folder, os.W_OK):
        raise InvalidArgumentError(f"--requests-out: cannot write {path} (permission denied)")


def _record(run: Any, f: FinishedRequest) -> dict[str, Any]:
    row: dict[str, Any] = {"run": run, **f._asdict()}
    for k in ("arrival_s", "ttft_s", "tpot_s", "e2e_s"):
        v = row[k]
        row[k] = None if math.isnan(v) else round(v, 9)
    return row


def write_requests(path: str, runs: Iterable[tuple[Any, list[FinishedRequest]]]) -> int:
    """Writes every run's finished requests (``(swept value, requests)`` pairs) to
    ``path``; returns the number of records."""
    n = 0
    with open(path, "w", newline="") as out:
        if path.lower().endswith(".csv"):
            w = csv.DictWriter(out, FIELDS)
            w.writeheader()
            for value, finished in runs:
                for f in finished:
                    w.writerow(_record(value, f))
                    n += 1
        else:
            for value, finished in runs:
                for f in finished:
                    out.write(json.dumps(_record(value, f)) + "\n")
                    n += 1
    return n
