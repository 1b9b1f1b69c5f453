"""Capacity search: --find-max-rate, --find-min-replicas and --request-rate
(kvblocks.sim.capacity; docs/simulate-time.md, "Capacity search")."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from kvblocks.sim.capacity import (
    NEXT_RATE_FACTOR,
    Probe,
    at_rate,
    find_max_rate,
    find_min_replicas,
    trace_rate,
    wilson_interval,
)
from kvblocks.sim.cli import main
from kvblocks.sim.workloads import read_trace

SLO = ("--slo-ttft", "0.2", "--slo-tpot", "0.03")


def _poisson(tmp_path: Path, n: int = 120, rate: float = 4.0) -> str:
    """n requests of 512 distinct prompt tokens and 64 outputs, Poisson arrivals (0.1 ms
    steps: run with --step-ms 0.1)."""
    rnd = random.Random(1)
    t = 0.0
    lines = [json.dumps({"format": "kvtrace-v1", "kind": "poisson"})]
    for i in range(n):
        lines.append(json.dumps({"request_id": f"r{i}", "arrival_step": round(t * 1e4),
                                 "prompt": [[1000 + i, 512]], "out_seed": 9000 + i,
                                 "max_output_tokens": 64}))  # fmt: skip
        t += rnd.expovariate(rate)
    path = tmp_path / "poisson.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _simulate(capsys: pytest.CaptureFixture[str], trace: str, *argv: str) -> dict[str, Any]:
    base = ["simulate", "--trace", trace, "--step-ms", "0.1", "--model", "llama-3-8b"]
    assert main([*base, "--gpu", "a100", "--no-ceilings", "--json", *argv]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_the_max_rate_meets_the_slos_and_ten_percent_more_does_not(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = _poisson(tmp_path)
    cap = _simulate(capsys, trace, "--find-max-rate", *SLO)["capacity"]
    rate = cap["rate_per_s"]
    assert cap["search"] == "max_rate" and cap["attainment"] >= 0.99
    assert cap["next_rate_per_s"] == pytest.approx(rate * NEXT_RATE_FACTOR, rel=1e-5)
    lo, hi = cap["attainment_interval_95"]
    assert lo <= cap["attainment"] <= hi
    # the same runs, replayed independently at the rate and at the rate + 10 %
    at = _simulate(capsys, trace, "--request-rate", str(rate), *SLO)["runs"][0]
    above = _simulate(capsys, trace, "--request-rate", str(rate * 1.1), *SLO)["runs"][0]
    assert at["slo_attainment"] >= 0.99 > above["slo_attainment"]


def test_min_replicas_meet_a_rate_one_fewer_does_not(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = _poisson(tmp_path, n=80)
    cap = _simulate(capsys, trace, "--find-min-replicas", "40", *SLO)["capacity"]
    n = cap["replicas"]
    assert n > 1 and cap["attainment"] >= 0.99
    assert cap["next_replicas"] == n - 1 and cap["next_attainment"] < 0.99


def test_request_rate_rescales_first_arrivals(tmp_path: Path) -> None:
    trace = read_trace(_poisson(tmp_path), step_ms=0.1)
    scaled = at_rate(trace, 20.0, 1e-4)
    assert trace_rate(scaled, 1e-4) == pytest.approx(20.0)
    assert scaled.params["request_rate"] == 20.0
    assert [r.request_id for r in scaled.requests] == [r.request_id for r in trace.requests]


def test_the_search_brackets_a_step_function() -> None:
    def probe(rate: float) -> Probe[None]:
        return Probe(rate, 1.0 if rate <= 12.3 else 0.5, 100, None)

    for start in (0.5, 2.0, 100.0):
        s = find_max_rate(probe, start)
        assert s.best is not None and s.next is not None
        assert s.best.value <= 12.3 < s.next.value
        assert s.next.value == pytest.approx(s.best.value * NEXT_RATE_FACTOR)
    r = find_min_replicas(lambda n: Probe(n, 1.0 if n >= 11 else 0.0, 10, None))
    assert r.best is not None and r.best.value == 11
    assert r.next is not None and r.next.value == 10


def test_wilson_interval() -> None:
    lo, hi = wilson_interval(1.0, 200)
    assert hi == 1.0 and 0.98 < lo < 0.99
    assert wilson_interval(0.5, 0) == (0.0, 1.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--find-max-rate"], "needs --slo-ttft and/or --slo-tpot"),
        (["--find-max-rate", "--slo-ttft", "1", "--sweep", "num_blocks=100,200"],
         "runs alone"),
        (["--find-max-rate", "--find-min-replicas", "3"], "not allowed with"),
        (["--find-min-replicas", "0", "--slo-ttft", "1"], "must be > 0"),
        (["--request-rate", "-1"], "must be > 0"),
    ],
)  # fmt: skip
def test_bad_capacity_input_is_one_clear_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    try:
        code = main(["simulate", "--num-requests", "4", *argv])
    except SystemExit as e:  # argparse's own errors
        code = int(e.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_trace_without_a_rate_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--workload", "agentic", "--num-requests", "1", "--request-rate", "2"]
    assert main(argv) == 2
    assert "arrive over time" in capsys.readouterr().err
