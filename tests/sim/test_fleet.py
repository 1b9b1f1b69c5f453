"""The fleet: N engines behind a router, in simulated time (kvblocks.sim.fleet)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kvblocks._core import external_block_hashes
from kvblocks.sim.backends import make_backend
from kvblocks.sim.cli import main
from kvblocks.sim.engine import ReplayOptions
from kvblocks.sim.fleet import Fleet
from kvblocks.sim.presets import model_layout
from kvblocks.sim.timemodel import GPU_PRESETS, StepTimeModel
from kvblocks.sim.workloads import WorkloadParams, generate
from paths import ROOT

AGENTIC = ["--workload", "agentic", "--model", "llama-3.1-8b", "--json"]


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["simulate", *AGENTIC, *args]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


# The documented sweep (docs/simulate-time.md): the agentic workload, 8 GiB per engine.
SWEEP = ["--gpu-memory", "8GiB", "--no-ceilings"]


@pytest.mark.parametrize("replicas", [4, 8])
def test_prefix_aware_beats_round_robin_on_agentic(
    capsys: pytest.CaptureFixture[str], replicas: int
) -> None:
    common = [*SWEEP, "--replicas", str(replicas)]
    rr = _run(capsys, *common, "--router", "round-robin")["runs"][0]
    pa = _run(capsys, *common, "--router", "prefix-aware")["runs"][0]
    assert rr["fleet"]["router"] == "round-robin" and pa["fleet"]["replicas"] == replicas
    assert pa["fleet"]["cache_threshold"] == 0.3 and pa["fleet"]["load_weight"] == 0.0
    assert len(pa["fleet"]["per_replica"]) == replicas
    assert sum(p["requests"] for p in pa["fleet"]["per_replica"]) == pa["requests"]
    assert pa["prefix_hit_rate"] >= rr["prefix_hit_rate"] + 0.05
    ttft = [r["latency"]["ttft_s"]["p50"] for r in (pa, rr)]
    assert ttft[0] <= ttft[1], ttft
    assert rr["generated_tokens"] == pa["generated_tokens"]
    # every engine gets sessions: new ones go to the least loaded, not the system prompt's
    assert min(p["requests"] for p in pa["fleet"]["per_replica"]) > 0


def test_prefix_aware_at_two_replicas_reaches_one_engine_with_twice_the_memory(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Two overloaded engines: prefix-aware routing gets what one engine with both engines'
    # memory gets (within a point), above round robin, but not 5 points above it.
    rr = _run(capsys, *SWEEP, "--replicas", "2", "--router", "round-robin")["runs"][0]
    pa = _run(capsys, *SWEEP, "--replicas", "2", "--router", "prefix-aware")["runs"][0]
    one = _run(capsys, "--gpu-memory", "16GiB", "--no-ceilings")["runs"][0]
    assert pa["prefix_hit_rate"] > rr["prefix_hit_rate"]
    assert abs(pa["prefix_hit_rate"] - one["prefix_hit_rate"]) <= 0.01
    assert pa["latency"]["ttft_s"]["p50"] <= rr["latency"]["ttft_s"]["p50"]


def test_cache_threshold_zero_is_the_pure_longest_prefix_rule(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Every session follows its system prompt (the workload has 4): 8 engines run as 4.
    args = [*SWEEP, "--replicas", "8", "--router", "prefix-aware"]
    pure = _run(capsys, *args, "--router-cache-threshold", "0")["runs"][0]
    per = [p["requests"] for p in pure["fleet"]["per_replica"]]
    assert sum(1 for n in per if n) <= 4, per
    default = _run(capsys, *args)["runs"][0]
    assert default["prefix_hit_rate"] > pure["prefix_hit_rate"]


def test_prefix_aware_matches_one_engine_with_n_times_the_memory(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # one tenant per session: sessions share nothing, and each fits one engine
    common = ["--num-requests", "40", "--tenants", "40"]
    one = _run(capsys, *common, "--gpu-memory", "64GiB")["runs"][0]
    fleet = _run(
        capsys, *common, "--gpu-memory", "16GiB", "--replicas", "4", "--router", "prefix-aware"
    )["runs"][0]
    assert abs(fleet["prefix_hit_rate"] - one["prefix_hit_rate"]) <= 0.01


def test_ttft_does_not_rise_as_memory_grows(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _run(capsys, "--num-requests", "40", "--sweep", "gpu_memory=3GiB,4GiB,8GiB,16GiB,32GiB")
    p50 = [r["latency"]["ttft_s"]["p50"] for r in doc["runs"]]
    assert p50 == sorted(p50, reverse=True), p50
    assert doc["runs"][-1]["simulated_s"] <= doc["runs"][0]["simulated_s"]


def test_sweep_replicas_and_slo(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _run(
        capsys, "--num-requests", "20", "--gpu-memory", "4GiB", "--sweep", "replicas=1,2",
        "--router", "least-loaded", "--slo-ttft", "1", "--slo-tpot", "0.05",
    )  # fmt: skip
    assert doc["sweep"] == "replicas"
    assert [r["fleet"]["replicas"] for r in doc["runs"]] == [1, 2]
    for r in doc["runs"]:
        assert 0.0 <= r["slo_attainment"] <= 1.0
        lat = r["latency"]
        assert lat["ttft_s"]["p50"] <= lat["ttft_s"]["p90"] <= lat["ttft_s"]["p99"]
        assert lat["ttft_s"]["p50"] <= lat["e2e_s"]["p50"]
        assert r["throughput_tokens_per_s"] == pytest.approx(
            r["generated_tokens"] / r["simulated_s"], rel=1e-3
        )


def test_the_router_keys_a_request_as_the_events_key_its_blocks() -> None:
    layout = model_layout("llama-3.1-8b", num_blocks=64)
    backend = make_backend("kvblocks", layout, events=True)
    req, _ = backend.make_request("r", list(range(100)), 1)
    km = backend.manager
    km.allocate_slots(req, 100)
    stored = [h for ev in km.take_events() for h in getattr(ev, "block_hashes", [])]
    assert len(req.block_hashes) == 100 // layout.hash_block_size
    assert external_block_hashes(req.block_hashes) == stored
    assert all(0 <= h < 2**64 for h in stored)


@pytest.mark.parametrize("router", ["prefix-aware", "kv-aware"])
def test_the_router_index_answers_each_engines_own_hit_at_every_step(router: str) -> None:
    """The fleet's router reads `kvblocks.router.KVIndex`, fed only by the engines' events;
    after every step its hit for a prompt equals each engine's `get_computed_blocks`."""
    trace = generate("agentic", 1, WorkloadParams(12))
    layout = model_layout("llama-3.1-8b", num_blocks=1100, max_model_len=32768)
    tm = StepTimeModel(layout, "llama-3.1-8b", GPU_PRESETS["h100-sxm"])
    backends = [make_backend("kvblocks", layout, batch=True, events=True) for _ in range(3)]
    opts = ReplayOptions(time_model=tm.step_time, digest=False)
    fleet = Fleet(trace, backends, opts, router, layout)
    assert fleet.index is not None
    probes = [rec.prompt_ids(trace.vocab_size) for rec in trace.requests[::7]]
    steps = hits = 0
    while not fleet.done:
        fleet.step()
        steps += 1
        if steps % 5:
            continue
        for k, prompt in enumerate(probes):
            req, _ = backends[0].make_request(f"probe{k}", prompt, 1)
            got = fleet.index.hits_from_hashes(list(req.block_hashes), req.num_tokens)
            for e, b in enumerate(backends):
                want = b.manager.get_computed_blocks(req)[1]
                assert got[str(e)].gpu_tokens == want, (steps, k, e)
                assert got[str(e)].freshness == "exact"
                hits += want > 0
    res = fleet.run()
    assert steps > 100 and hits > 0
    assert sum(fleet.index.status(str(e))["batches"] for e in range(3)) > 0
    assert sum(r.requests for r in res.engines) == len(trace.requests)
    assert min(r.requests for r in res.engines) > 0


def test_mooncake_requests_arrive_at_their_timestamps(capsys: pytest.CaptureFixture[str]) -> None:
    sample = str(ROOT / "docs/examples/mooncake-sample.jsonl")
    args = ["simulate", "--trace", sample, "--model", "llama-3.1-8b", "--json"]
    assert main([*args, "--max-requests", "40"]) == 0
    run = json.loads(capsys.readouterr().out)["runs"][0]
    with open(sample) as f:
        last_ms = max(json.loads(line)["timestamp"] for line in list(f)[:40])
    # light load: the run ends shortly after the last arrival, and nobody waits long
    assert last_ms / 1000 < run["simulated_s"] < last_ms / 1000 + 30
    assert run["latency"]["ttft_s"]["p99"] < 1.0


def test_no_ceilings_reports_them_as_null(capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--num-requests", "10", "--gpu-memory", "4GiB"]
    full = _run(capsys, *common)["runs"][0]
    bare = _run(capsys, *common, "--no-ceilings")["runs"][0]
    assert bare["infinite_cache_hit_rate"] is None and bare["ideal_hit_tokens"] is None
    assert bare["prefix_hit_rate"] == full["prefix_hit_rate"]
    assert bare["latency"] == full["latency"]
