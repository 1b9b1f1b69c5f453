"""`kvblocks simulate --sweep ... --jobs N` runs the sweep's configurations in N processes,
and `--ray ADDRESS` as tasks on a Ray cluster; both report the same as running them one
after another (the wall-clock measurements aside). Ray is imported only under `--ray`."""

from __future__ import annotations

import json
import subprocess
import sys
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


#: One small sweep: two configurations (a local Ray cluster of two CPUs), a few seconds each.
SMALL = [
    "simulate", "--workload", "agentic", "--num-requests", "12", "--gpu-memory", "8GiB",
    "--router", "kv-aware", "--sweep", "replicas=1,2", "--json",
]  # fmt: skip


def test_ray_and_jobs_give_the_sequential_report(capsys: pytest.CaptureFixture[str]) -> None:
    # a guard for checkouts without Ray; `make test-python`'s .venv has it (Makefile DEPS)
    pytest.importorskip("ray")
    docs = []
    for extra in ([], ["--jobs", "2"], ["--ray", "local"]):
        assert main([*SMALL, *extra]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    assert [r["fleet"]["replicas"] for r in docs[2]["runs"]] == [1, 2]
    assert simulated(docs[1]) == simulated(docs[0])
    assert simulated(docs[2]) == simulated(docs[0])


def test_without_ray_the_ray_flag_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails, as without Ray
    assert main([*SMALL, "--ray", "local"]) == 2
    err = capsys.readouterr().err
    assert "--ray needs Ray" in err and "pip install" in err


def test_a_run_without_ray_flag_never_imports_ray() -> None:
    code = (
        "import sys, kvblocks\n"
        "from kvblocks.sim.cli import main\n"
        "assert main(['simulate', '--num-requests', '5', '--sweep', "
        "'replicas=1,2', '--jobs', '2', '--json']) == 0\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
