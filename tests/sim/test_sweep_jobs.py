"""`kvblocks simulate --sweep ... --jobs N` runs the sweep's configurations in N processes
and reports the same as running them one after another (the wall-clock measurements
aside)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kvblocks.sim.cli import main

#: What a run measures of the machine rather than simulates: differs from run to run.
MEASURED = {
    "kv_ns_per_generated_token",
    "kv_ns_per_step",
    "kv_total_ns",
    "request_hash_ns",
    "sim_requests_per_s",
    "steps_per_s",
    "synth_s",
    "wall_s",
}


def simulated(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: simulated(v) for k, v in doc.items() if k not in MEASURED}
    if isinstance(doc, list):
        return [simulated(v) for v in doc]
    return doc


def test_jobs_give_the_sequential_report(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "simulate",
        "--workload",
        "agentic",
        "--num-requests",
        "30",
        "--gpu-memory",
        "8GiB",
        "--router",
        "kv-aware",
        "--sweep",
        "replicas=1,2,3",
        "--json",
    ]
    docs = []
    for jobs in ("1", "3"):
        assert main([*args, "--jobs", jobs]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    assert [r["fleet"]["replicas"] for r in docs[1]["runs"]] == [1, 2, 3]
    assert simulated(docs[0]) == simulated(docs[1])
