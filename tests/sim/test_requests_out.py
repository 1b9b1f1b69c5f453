"""``kvblocks simulate --requests-out``: one record per finished request, consistent with
the run's own numbers (kvblocks.sim.requests_out)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from kvblocks.sim.cli import main
from kvblocks.sim.percentiles import nearest_rank

BASE = ["simulate", "--num-requests", "40", "--no-ceilings", "--json"]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main([*BASE, *argv]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc["runs"][0]


def test_csv_records_add_up_to_the_fleet_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "requests.csv"
    run = _run(capsys, "--replicas", "2", "--router", "least-loaded", "--requests-out", str(out))
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == run["requests"]
    assert sum(int(r["gpu_hit_tokens"]) for r in rows) == run["hit_tokens"]
    assert sum(int(r["output_tokens"]) for r in rows) == run["generated_tokens"]
    per_engine = [sum(r["engine"] == str(i) for r in rows) for i in range(2)]
    assert per_engine == [e["requests"] for e in run["fleet"]["per_replica"]]
    ttft = sorted(float(r["ttft_s"]) for r in rows)
    for name, q in (("p50", 0.5), ("p99.9", 0.999)):
        assert run["latency"]["ttft_s"][name] == pytest.approx(nearest_rank(ttft, q), abs=1e-6)


def test_json_lines_carry_the_host_tier_hits(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "requests.jsonl"
    argv = ["--workload", "agentic", "--num-requests", "6", "--gpu-memory", "3GiB"]
    run = _run(capsys, *argv, "--cpu-offload", "8GiB", "--requests-out", str(out))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == run["requests"]
    assert sum(r["host_hit_tokens"] for r in rows) == run["offload"]["host_hit_tokens"]
    assert sum(r["preemptions"] for r in rows) == run["preemptions"]
    assert all(r["e2e_s"] >= r["ttft_s"] > 0 for r in rows)


def test_an_unwritable_path_fails_before_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--requests-out", "/no/such/dir/r.csv"]) == 2
    assert "no such directory" in capsys.readouterr().err
