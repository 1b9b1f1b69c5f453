"""The trace-replay scheduler loop (kvblocks.sim.engine), on kvblocks and on vLLM 0.33.

The two small replays below are worked out by hand in the comments (block ids follow
vLLM's free queue: blocks 1..N-1 in order, freed blocks appended tail-first).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import kvblocks
import pytest
from kvblocks.sim.backends import make_backend, vllm_available
from kvblocks.sim.engine import Engine, ReplayError, ReplayOptions, StepInfo, replay
from kvblocks.sim.presets import replay_layout
from kvblocks.sim.workloads import Trace, TraceRequest, WorkloadParams, generate
from paths import ROOT

HAVE_KB = hasattr(kvblocks, "KVCacheManager")
# The oracle tools sit in ../shared beside the checkout.
ORACLE = ROOT / "tools" / "oracle"


def _impls() -> list[object]:
    return [
        pytest.param(
            "kvblocks",
            marks=pytest.mark.skipif(not HAVE_KB, reason="kvblocks manager not built"),
        ),
        pytest.param(
            "vllm",
            marks=[
                pytest.mark.vllm,
                pytest.mark.skipif(vllm_available() is None, reason="vLLM not importable"),
            ],
        ),
    ]


def _req(rid: str, ids: list[int], max_out: int, arrival: int = 0, after: str | None = None):
    return TraceRequest(rid, arrival, (), 1000 + len(rid), max_out, after, tuple(ids))


def _run(impl: str, trace: Trace, num_blocks: int, **kw: object):
    layout = replay_layout("full", num_blocks=num_blocks, block_size=4, max_model_len=64)
    out = io.StringIO()
    res = replay(trace, make_backend(impl, layout), ReplayOptions(events_out=out, **kw))  # type: ignore[arg-type]
    return res, out.getvalue().splitlines()


@pytest.mark.parametrize("impl", _impls())
def test_shared_prefix_and_follow_up(impl: str) -> None:
    # Pool of 6 blocks (1..5 usable), block size 4.
    # A = 1..8 (2 outputs), B shares A's first block (2 outputs), C follows A 2 steps after
    # A finished and repeats A's prompt plus one token (1 output).
    trace = Trace(
        [
            _req("A", [1, 2, 3, 4, 5, 6, 7, 8], 2),
            _req("B", [1, 2, 3, 4, 9, 10, 11, 12], 2),
            _req("C", [1, 2, 3, 4, 5, 6, 7, 8, 13], 1, arrival=2, after="A"),
        ],
        "hand",
    )
    res, ev = _run(impl, trace, 6)
    assert ev == [
        # step 0: A takes blocks 1, 2 (both full, cached at once); B hits block 1 (4 tokens)
        # and takes block 3. Free: 4, 5.
        "G A 0 ",
        "A A 8 0 1,2",
        "G B 4 1",
        "A B 4 4 3",
        "S 0 2",
        # step 1: each decodes its 9th token into a new block, then finishes (2nd output).
        # A's table is freed tail first: 4 (unhashed: to the queue's front), 2 (cached: to
        # its back); block 1 is still B's. B: 5 to the front, 3 and 1 to the back.
        # Queue: 5, 4, 2, 3, 1.
        "A A 1 0 4",
        "A B 1 0 5",
        "F A 1,2,4",
        "F B 1,3,5",
        "S 1 5",
        # step 2 is idle (skipped); C arrives at step 1 + 2 = 3 and hits A's two cached
        # blocks (8 of its 9 tokens); its new block is the free queue's head: 5.
        "G C 8 1,2",
        "A C 1 8 5",
        "F C 1,2,5",
        "S 3 5",
    ]
    assert (res.steps, res.last_step, res.preemptions, res.alloc_failures) == (3, 3, 0, 0)
    assert res.first_admission == [3, 8 + 8 + 9, 0 + 4 + 8]
    assert res.resumed == [0, 0, 0]
    assert res.generated_tokens == 5
    assert res.samples["get_computed_blocks"].__len__() == 3
    assert len(res.samples["alloc_admit"]) == 3
    assert len(res.samples["alloc_decode"]) == 2
    assert len(res.samples["free"]) == 3
    assert len(res.samples["new_step_starts"]) == 3


@pytest.mark.parametrize("impl", _impls())
def test_preemption_and_resume(impl: str) -> None:
    # Pool of 4 blocks (1..3 usable), block size 4; two 4-token prompts, 3 outputs each.
    trace = Trace([_req("A", [1, 2, 3, 4], 3), _req("B", [5, 6, 7, 8], 3)], "hand")
    res, ev = _run(impl, trace, 4)
    assert ev == [
        # step 0: a 4-token prompt can hit at most 3 tokens, so no hit; blocks 1 and 2.
        "G A 0 ",
        "A A 4 0 1",
        "G B 0 ",
        "A B 4 0 2",
        "S 0 1",
        # step 1: A's 5th token takes block 3; B finds no free block and preempts itself
        # (the most recently admitted); its full block 2 stays cached in the free queue.
        "A A 1 0 3",
        "A B 1 0 -",
        "P B 2",
        "S 1 1",
        # step 2: A's 6th token fits block 3. B hits its cached block 2 (4 of 5 tokens),
        # but the whole sequence needs that block plus a new one while only 1 is free.
        # A then finishes: 3 (unhashed) goes to the queue's front, 1 (cached) to its back.
        "A A 1 0 ",
        "G B 4 2",
        "A B 1 4 -",
        "F A 1,3",
        "S 2 3",
        # step 3: B resumes: block 2 from the cache, new block 3 (the queue's head).
        "G B 4 2",
        "A B 1 4 3",
        "S 3 1",
        # step 4: B's 6th token fits block 3; B finishes.
        "A B 1 0 ",
        "F B 2,3",
        "S 4 3",
    ]
    assert (res.steps, res.preemptions, res.alloc_failures) == (5, 1, 2)
    assert res.first_admission == [2, 8, 0]
    assert res.resumed == [1, 5, 4]
    assert res.generated_tokens == 6
    assert res.final_free_blocks == 3


@pytest.mark.parametrize("impl", _impls())
def test_request_that_never_fits_is_an_error(impl: str) -> None:
    trace = Trace([_req("A", list(range(20)), 1)], "hand")
    with pytest.raises(ReplayError, match="cannot admit A"):
        _run(impl, trace, 4)


@pytest.mark.parametrize("impl", _impls())
def test_max_steps(impl: str) -> None:
    trace = Trace([_req("A", [1, 2, 3, 4, 5], 10)], "hand")
    with pytest.raises(ReplayError, match="max_steps 3"):
        _run(impl, trace, 8, max_steps=3)


def _small(kind: str) -> Trace:
    n = 12 if kind == "agentic" else 60
    return generate(kind, 3, WorkloadParams(num_requests=n, rate=0.5))


@pytest.mark.skipif(not HAVE_KB, reason="kvblocks manager not built")
@pytest.mark.parametrize(
    ("config", "kind", "num_blocks"),
    # Pools small enough to force preemption, large enough for each trace's longest request.
    [("full", "shared-prefix", 700), ("full", "agentic", 1300), ("hybrid", "shared-prefix", 1500)],
)
def test_batched_decode_gives_the_same_digest(config: str, kind: str, num_blocks: int) -> None:
    trace = _small(kind)
    layout = replay_layout(config, num_blocks=num_blocks, sliding_window=256)
    one = replay(trace, make_backend("kvblocks", layout))
    many = replay(trace, make_backend("kvblocks", layout, batch=True))
    assert one.preemptions > 0  # the small pool forces the failure path of the batch
    assert many.digest == one.digest
    assert many.batched_requests > 0
    assert len(many.samples["alloc_decode"]) < len(one.samples["alloc_decode"])


@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_KB, reason="kvblocks manager not built")
@pytest.mark.parametrize(
    "config",
    ["full", "hybrid", "swa", "chunked", "mamba", "eagle", "bs32", "mtp", "spec-lookahead"],
)
def test_kvblocks_matches_vllm(config: str) -> None:
    pytest.importorskip("vllm")
    from kvblocks.vllm._version_rules import rules

    if config in ("mtp", "spec-lookahead") and not rules().hash_lookahead:
        pytest.skip("the installed vLLM (0.32) has no hash lookahead")
    trace = _small("shared-prefix")
    layout = replay_layout(config, num_blocks=800, sliding_window=256, chunk_size=512)
    ours = replay(trace, make_backend("kvblocks", layout, batch=True))
    theirs = replay(trace, make_backend("vllm", layout))
    assert ours.digest == theirs.digest
    assert ours.hit_tokens == theirs.hit_tokens


@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_KB, reason="kvblocks manager not built")
@pytest.mark.parametrize(
    ("config", "retention_interval"),
    [("hybrid", 0), ("hybrid", 64), ("mamba", 0), ("mamba-spec", 64), ("mamba-partial", 0)],
)
def test_kvblocks_matches_vllm_under_sparse_retention(config: str, retention_interval: int) -> None:
    pytest.importorskip("vllm")
    trace = _small("shared-prefix")
    layout = replay_layout(
        config, num_blocks=800, sliding_window=256, retention_interval=retention_interval
    )
    ours = replay(trace, make_backend("kvblocks", layout, batch=True))
    theirs = replay(trace, make_backend("vllm", layout))
    dense = replay(trace, make_backend("kvblocks", replace(layout, retention_interval=None)))
    assert ours.digest == theirs.digest
    assert ours.hit_tokens == theirs.hit_tokens
    if retention_interval == 0:  # keeping only the reachable states changes this trace's hits
        assert ours.digest != dense.digest


@pytest.mark.vllm
@pytest.mark.skipif(not (ORACLE / "driver_vllm.py").exists(), reason="oracle tools absent")
@pytest.mark.parametrize("config", ["full", "hybrid"])
def test_loop_matches_driver_vllm(tmp_path: Path, config: str) -> None:
    pytest.importorskip("vllm")
    trace_file = tmp_path / "t.jsonl"
    subprocess.run(
        [sys.executable, str(ORACLE / "trace.py"), "--kind", "shared-prefix", "--seed", "2",
         "--num-requests", "40", "-o", str(trace_file)],
        check=True,
    )  # fmt: skip
    out = subprocess.run(
        [sys.executable, str(ORACLE / "driver_vllm.py"), str(trace_file), "--config", config,
         "--num-blocks", "700", "--sliding-window", "256"],
        check=True, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"},
    )  # fmt: skip
    driver = json.loads(out.stdout)
    from kvblocks.sim.workloads import read_trace

    layout = replay_layout(config, num_blocks=700, sliding_window=256)
    ours = replay(read_trace(str(trace_file)), make_backend("vllm", layout))
    if config == "full":
        assert driver["preemptions"] > 0  # the loop's preemption path is exercised
    assert ours.digest == driver["digest"]
    assert ours.preemptions == driver["preemptions"]
    assert ours.steps == driver["steps"]


class _ReferenceBatch:
    """vLLM's manager with ``allocate_slots_batch`` written as its definition: one
    ``allocate_slots`` per request, in order, stopping after the first that fails."""

    def __init__(self, layout: object) -> None:
        self.inner = make_backend("vllm", layout)  # type: ignore[arg-type]
        self.name = "vllm-batch"
        self.manager = self.inner.manager
        self.make_request = self.inner.make_request
        self.release_block_copies = self.inner.release_block_copies
        self.layout = self.inner.layout
        self.partial_hash_hits = self.inner.partial_hash_hits
        self.append_batch = None
        self.hisparse = self.inner.hisparse
        self.free_finished = self.inner.free_finished
        self.free_preempted = self.inner.free_preempted

    def batch(self, reqs: list[object], ns: list[int]) -> list[object]:
        out: list[object] = []
        for req, n in zip(reqs, ns, strict=True):
            got = self.manager.allocate_slots(req, n)
            out.append(None if got is None else got.get_block_ids())
            if got is None:
                break
        return out


@pytest.mark.vllm
def test_batch_path_of_the_loop_gives_the_same_digest() -> None:
    pytest.importorskip("vllm")
    trace = _small("shared-prefix")
    layout = replay_layout("full", num_blocks=500)
    one = replay(trace, make_backend("vllm", layout))
    many = replay(trace, _ReferenceBatch(layout))  # type: ignore[arg-type]
    assert one.preemptions > 0  # batches that stop early are exercised
    assert many.digest == one.digest
    assert many.preemptions == one.preemptions
    assert len(many.samples["alloc_batch"]) > 0


BENCH = ROOT / "benches" / "python" / "replay.py"


def _bench(tmp_path: Path, *flags: str) -> dict[str, object]:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        json.dumps({"format": "kvtrace-v1", "kind": "hand", "seed": 0, "vocab_size": 1000})
        + "\n"
        + json.dumps({"request_id": "A", "arrival_step": 0, "after": None,
                      "prompt_token_ids": [1, 2, 3, 4], "out_seed": 5, "max_output_tokens": 3})
        + "\n"
        + json.dumps({"request_id": "B", "arrival_step": 0, "after": None,
                      "prompt_token_ids": [5, 6, 7, 8], "out_seed": 6, "max_output_tokens": 3})
        + "\n"
    )  # fmt: skip
    argv = [sys.executable, str(BENCH), str(trace), "--num-blocks", "4", "--block-size", "4",
            "--max-model-len", "64", *flags]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    doc: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


@pytest.mark.vllm
def test_bench_driver_on_vllm(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    doc = _bench(tmp_path, "--impl", "vllm")
    # the hand-worked replay of test_preemption_and_resume
    assert (doc["steps"], doc["preemptions"], doc["alloc_failures"]) == (5, 1, 2)
    assert doc["prefix_cache"] == {
        "queried_tokens": 13, "hit_tokens": 4, "hit_rate": round(4 / 13, 6),
        "first_admission": {"requests": 2, "queried_tokens": 8, "hit_tokens": 0},
        "resumed": {"requests": 1, "queried_tokens": 5, "hit_tokens": 4},
    }  # fmt: skip
    calls = doc["calls"]
    assert isinstance(calls, dict)
    assert calls["alloc_failed"]["count"] == 2 and calls["get_computed_blocks"]["count"] == 4
    assert isinstance(doc["digest"], str) and len(doc["digest"]) == 64


@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_KB, reason="kvblocks manager not built")
def test_bench_driver_compare(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    doc = _bench(tmp_path, "--compare", "--repeat", "3")
    compare = doc["compare"]
    assert isinstance(compare, dict) and compare["digests_agree"] is True
    assert set(doc["runs"]) == {"vllm", "kvblocks", "kvblocks-batch"}  # type: ignore[arg-type]
    rounds = doc["rounds"]
    assert isinstance(rounds, list) and len(rounds) == compare["rounds"] == 3
    for name in ("kvblocks", "kvblocks-batch"):
        for key, median in compare[name].items():
            values = sorted(r[name][key] for r in rounds)
            assert median == values[1], (name, key)


@pytest.mark.skipif(not HAVE_KB, reason="kvblocks manager not built")
def test_engine_steps_one_at_a_time() -> None:
    # test_preemption_and_resume, driven step by step as a notebook would.
    trace = Trace([_req("A", [1, 2, 3, 4], 3), _req("B", [5, 6, 7, 8], 3)], "hand")
    layout = replay_layout("full", num_blocks=4, block_size=4, max_model_len=64)
    engine = Engine(trace, make_backend("kvblocks", layout), ReplayOptions(ceilings=True), layout)
    infos = []
    while not engine.done:
        infos.append(engine.step())
    assert infos == [
        StepInfo(step=0, scheduled=2, admitted=2, preempted=0, finished=0, free_blocks=1),
        StepInfo(step=1, scheduled=1, admitted=0, preempted=1, finished=0, free_blocks=1),
        StepInfo(step=2, scheduled=1, admitted=0, preempted=0, finished=1, free_blocks=3),
        StepInfo(step=3, scheduled=1, admitted=1, preempted=0, finished=0, free_blocks=1),
        StepInfo(step=4, scheduled=1, admitted=0, preempted=0, finished=1, free_blocks=3),
    ]
    with pytest.raises(ReplayError, match="finished"):
        engine.step()
    res = engine.finish()
    whole = replay(trace, make_backend("kvblocks", layout))
    assert res.digest == whole.digest
    assert (res.hit_rate, res.preempted_hit_rate) == (0.0, 0.8)
    assert res.ceilings is not None and res.ceilings.queried_tokens == 8


@pytest.mark.skipif(not HAVE_KB, reason="kvblocks manager not built")
def test_engine_needs_the_layout_for_ceilings() -> None:
    trace = Trace([_req("A", [1, 2, 3, 4], 1)], "hand")
    layout = replay_layout("full", num_blocks=4, block_size=4, max_model_len=64)
    with pytest.raises(ValueError, match="layout"):
        Engine(trace, make_backend("kvblocks", layout), ReplayOptions(ceilings=True))
