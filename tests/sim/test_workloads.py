"""Workload generators and trace readers (kvblocks.sim.workloads)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from kvblocks.sim import workloads
from kvblocks.sim.workloads import (
    KINDS,
    TRACE_PY_KINDS,
    Trace,
    TraceError,
    TraceRequest,
    WorkloadParams,
    expand_segment,
    generate,
    read_trace,
    splitmix64,
    tok,
)
from paths import ROOT

# The oracle tools sit in ../shared beside the checkout.
ORACLE_TRACE = ROOT.parent / "shared" / "tools" / "vllm-oracle" / "trace.py"


def _mix_reference(x: int) -> int:
    # SplitMix64 as published (Steele et al.), written out independently.
    m = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_splitmix64_known_answer() -> None:
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(12345) == _mix_reference(12345)


def test_expand_segment_matches_tok_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = expand_segment(99, 300, 1000)
    assert fast == [tok(99, i, 1000) for i in range(300)]
    monkeypatch.setattr(workloads, "_np", None)
    assert expand_segment(99, 300, 1000) == fast
    assert all(0 <= t < 1000 for t in fast)


@pytest.mark.parametrize("kind", KINDS)
def test_generate_is_deterministic_and_in_range(kind: str) -> None:
    p = WorkloadParams(num_requests=6, rate=0.5, num_system_prompts=3)
    a, b = generate(kind, 5, p), generate(kind, 5, p)
    assert a.requests == b.requests
    assert generate(kind, 6, p).requests != a.requests
    ids = [r.request_id for r in a.requests]
    assert len(set(ids)) == len(ids)
    for r in a.requests:
        assert r.max_output_tokens >= 50
        assert r.arrival_step >= (1 if r.after else 0)


def test_agentic_turn_quotes_previous_prompt_and_output() -> None:
    trace = generate("agentic", 1, WorkloadParams(num_requests=4))
    by_id = {r.request_id: r for r in trace.requests}
    follow_ups = [r for r in trace.requests if r.after is not None]
    assert follow_ups
    for r in follow_ups:
        prev = by_id[r.after or ""]
        quoted = prev.prompt_ids() + expand_segment(prev.out_seed, prev.max_output_tokens)
        assert r.prompt_ids()[: len(quoted)] == quoted
        assert r.prompt_len > len(quoted)


def test_shared_prefix_requests_share_system_prompts() -> None:
    trace = generate("shared-prefix", 0, WorkloadParams(num_requests=20, num_system_prompts=2))
    systems = {r.segments[0] for r in trace.requests}
    assert len(systems) == 2
    assert all(1024 <= n <= 4096 for _, n in systems)


def test_truncated_drops_follow_ups_of_removed_requests() -> None:
    def req(rid: str, after: str | None = None) -> TraceRequest:
        return TraceRequest(rid, 1, ((1, 5),), 2, 3, after)

    trace = Trace([req("a"), req("b", after="c"), req("c"), req("d", after="a")], "hand")
    assert [r.request_id for r in trace.truncated(2).requests] == ["a"]
    assert [r.request_id for r in trace.truncated(4).requests] == ["a", "b", "c", "d"]
    assert trace.truncated(0) is trace


def _load_oracle_trace() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvtrace_oracle", ORACLE_TRACE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["kvtrace_oracle"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not ORACLE_TRACE.exists(), reason="oracle trace.py absent")
@pytest.mark.parametrize("kind", TRACE_PY_KINDS)
def test_generators_match_oracle_trace_py(kind: str, tmp_path: Path) -> None:
    oracle = _load_oracle_trace()
    out = tmp_path / "t.jsonl"
    n_flag = "--num-sessions" if kind == "agentic" else "--num-requests"
    assert oracle.main(["--kind", kind, "--seed", "4", n_flag, "7", "-o", str(out)]) == 0
    theirs = read_trace(str(out))
    ours = generate(kind, 4, WorkloadParams(num_requests=7))
    assert ours.requests == theirs.requests
    assert theirs.kind == kind and theirs.seed == 4


# ------------------------------------------------------------------ trace files
def _write(path: Path, lines: list[object]) -> str:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


HEADER = {"format": "kvtrace-v1", "kind": "custom", "seed": 9, "vocab_size": 1000}


def _rec(rid: str, **kw: object) -> dict[str, object]:
    rec: dict[str, object] = {
        "request_id": rid, "arrival_step": 3, "after": None, "prompt": [[7, 20], [8, 5]],
        "out_seed": 11, "max_output_tokens": 4,
    }  # fmt: skip
    rec.update(kw)
    return rec


def test_read_kvtrace(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "t.jsonl",
        [HEADER, _rec("a"), _rec("b", after="a", prompt=None, prompt_token_ids=[1, 2, 3])],
    )
    trace = read_trace(path)
    a, b = trace.requests
    assert (trace.kind, trace.seed, trace.vocab_size) == ("custom", 9, 1000)
    assert a.segments == ((7, 20), (8, 5)) and a.prompt_len == 25
    assert a.prompt_ids(1000) == expand_segment(7, 20, 1000) + expand_segment(8, 5, 1000)
    assert (b.after, b.prompt_ids(), b.prompt_len) == ("a", [1, 2, 3], 3)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "Expecting property name"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps(_rec("x", arrival_step=-1)), "'arrival_step' must be an integer >= 0"),
        (json.dumps(_rec("x", max_output_tokens=0)), "'max_output_tokens'"),
        (json.dumps(_rec("x", prompt=[[1]])), "prompt segment"),
        (json.dumps(_rec("x", prompt=[])), "empty prompt"),
        (json.dumps(_rec("x", request_id=5)), "'request_id'"),
        (json.dumps(_rec("x", after="nobody")), "'after' names 'nobody'"),
        (json.dumps(_rec("a")), "duplicate request_id 'a'"),
        (json.dumps(_rec("x", prompt=None, prompt_token_ids=[1, -2])), "prompt_token_ids"),
    ],
)
def test_malformed_kvtrace_line_names_file_and_line(
    tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(HEADER) + "\n" + json.dumps(_rec("a")) + "\n\n" + line + "\n")
    with pytest.raises(TraceError, match=f"bad.jsonl:4: .*{message}"):
        read_trace(str(path))


def test_unknown_first_line_and_empty_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"x.jsonl:1: neither a kvtrace-v1 header"):
        read_trace(_write(tmp_path / "x.jsonl", [{"hello": 1}]))
    with pytest.raises(TraceError, match="unsupported trace format"):
        read_trace(_write(tmp_path / "y.jsonl", [{"format": "kvtrace-v9"}]))
    with pytest.raises(TraceError, match="no requests"):
        read_trace(_write(tmp_path / "z.jsonl", [HEADER]))
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(str(tmp_path / "missing.jsonl"))


def test_read_mooncake(tmp_path: Path) -> None:
    lines = [
        {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]},
        {"timestamp": 120, "input_length": 600, "output_length": 7, "hash_ids": [1, 4]},
    ]
    trace = read_trace(_write(tmp_path / "mc.jsonl", lines), mooncake_block=512, step_ms=50)
    a, b = trace.requests
    assert trace.kind == "mooncake"
    assert (a.arrival_step, b.arrival_step) == (0, 2)  # 120 ms // 50 ms
    assert (a.prompt_len, b.prompt_len) == (1100, 600)
    assert [n for _, n in a.segments] == [512, 512, 76]
    assert (a.max_output_tokens, b.max_output_tokens) == (5, 7)
    ta, tb = a.prompt_ids(), b.prompt_ids()
    assert ta[:512] == tb[:512]  # equal hash id 1 -> equal tokens
    assert ta[512:1024] != tb[512:1024]
    assert a.out_seed != b.out_seed


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2]},
         "needs 3 hash ids of 512 tokens, got 2"),
        ({"timestamp": -5, "input_length": 10, "output_length": 5, "hash_ids": [1]},
         "'timestamp'"),
        ({"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [1]},
         "'output_length'"),
        ({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": ["a"]},
         "'hash_ids'"),
    ],
)  # fmt: skip
def test_malformed_mooncake_line(tmp_path: Path, record: dict[str, object], message: str) -> None:
    good = {"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}
    path = _write(tmp_path / "mc.jsonl", [good, record])
    with pytest.raises(TraceError, match=f"mc.jsonl:2: .*{message}"):
        read_trace(path)


DOCS = ROOT / "docs"


@pytest.mark.parametrize(
    ("page", "kind", "n"),
    [("trace-kvtrace.md", "example", 4), ("trace-mooncake.md", "mooncake", 2)],
)
def test_the_format_pages_examples_read(tmp_path: Path, page: str, kind: str, n: int) -> None:
    text = (DOCS / page).read_text()
    example = text.split("```jsonl\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.jsonl"
    path.write_text(example)
    trace = read_trace(str(path))
    assert (trace.kind, len(trace.requests)) == (kind, n)


def test_mooncake_sample_is_synthetic_mooncake_seed_1() -> None:
    lines = (DOCS / "examples" / "mooncake-sample.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == workloads.synthetic_mooncake(seed=1, num_sessions=120)


def test_synthetic_mooncake_ids_stand_for_prefixes() -> None:
    records = workloads.synthetic_mooncake(seed=3, num_sessions=30)
    assert [r["timestamp"] for r in records] == sorted(r["timestamp"] for r in records)
    first_prefix: dict[int, tuple[int, ...]] = {}
    for r in records:
        ids = r["hash_ids"]
        assert len(ids) == -(-r["input_length"] // 512) and r["input_length"] % 512
        for i, h in enumerate(ids):
            assert first_prefix.setdefault(h, tuple(ids[:i])) == tuple(ids[:i])


def test_with_tenants_keeps_a_session_together() -> None:
    trace = generate("agentic", 2, WorkloadParams(num_requests=5)).with_tenants(2)
    by_id = {r.request_id: r for r in trace.requests}
    roots = [r for r in trace.requests if r.after is None]
    assert [r.cache_salt for r in roots] == ["tenant-0", "tenant-1"] * 2 + ["tenant-0"]
    for r in trace.requests:
        if r.after is not None:
            assert r.cache_salt == by_id[r.after].cache_salt
    assert trace.params["tenants"] == 2
