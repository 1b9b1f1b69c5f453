"""``kvblocks simulate`` (kvblocks.sim.cli) and the model presets behind it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kvblocks
import pytest
from kvblocks.sim import cli
from kvblocks.sim.backends import make_backend, vllm_available
from kvblocks.sim.engine import replay
from kvblocks.sim.percentiles import nearest_rank, percentiles
from kvblocks.sim.presets import (
    MODEL_PRESETS,
    REPLAY_CONFIGS,
    GroupDesc,
    KVLayout,
    build_kvblocks_config,
    model_layout,
    parse_memory,
    replay_layout,
)
from kvblocks.sim.workloads import KINDS, WorkloadParams, generate

HAVE_KB = hasattr(kvblocks, "KVCacheManager")
HAVE_VLLM = vllm_available() is not None
needs_kb = pytest.mark.skipif(not HAVE_KB, reason="kvblocks manager not built")


def _impls() -> list[Any]:
    return [
        pytest.param("kvblocks", marks=needs_kb),
        pytest.param(
            "vllm",
            marks=[pytest.mark.vllm, pytest.mark.skipif(not HAVE_VLLM, reason="no vLLM")],
        ),
    ]


@pytest.fixture
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the CLI on the parametrized implementation (vLLM replaces kvblocks' backend)."""
    name: str = request.param
    if name == "vllm":
        monkeypatch.setattr(
            cli, "make_backend",
            lambda _impl, layout, algo, batch=False, events=False, retention=None: (
                make_backend("vllm", layout, algo, events=events, retention=retention)
            )
        )  # fmt: skip
    return name


def _simulate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["simulate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _error(capsys: pytest.CaptureFixture[str], *argv: str, status: int = 2) -> str:
    """The one-line error of a bad command line (argparse's or ours)."""
    try:
        code = cli.main(list(argv))
    except SystemExit as e:
        code = int(e.code or 0)
    assert code == status
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "usage:" not in out.err
    assert out.err.count("\n") == 1, out.err
    return out.err


# ------------------------------------------------------------------ presets
def test_gpu_memory_to_num_blocks() -> None:
    # Llama-3-8B: 32 layers x 16 tokens x 8 heads x (K+V) 2 x 128 x 2 bytes = 2 MiB a block.
    assert model_layout("llama-3-8b", gpu_memory=16 * 2**30).num_blocks == 8192
    # gpt-oss-20b: two groups of 12 layers share the pool: 12 x (16 x 8 x 2 x 64 x 2) bytes.
    gpt = model_layout("gpt-oss-20b", gpu_memory=40 * 2**30)
    assert gpt.bytes_per_block == 12 * 32768
    assert gpt.num_blocks == 42949672960 // 393216 == 109226
    assert [g.sliding_window for g in gpt.groups] == [None, 128]
    assert model_layout("gpt-oss-120b", num_blocks=8).bytes_per_block == 18 * 32768


def test_presets_name_their_model_and_context_length() -> None:
    for preset in MODEL_PRESETS.values():
        assert preset.model and preset.description
        assert model_layout(preset.name, num_blocks=8).max_model_len == preset.max_model_len
    assert MODEL_PRESETS["llama-3-8b"].model == "meta-llama/Meta-Llama-3-8B"
    assert MODEL_PRESETS["llama-3-8b"].max_model_len == 8192
    assert MODEL_PRESETS["gpt-oss-20b"].model == "openai/gpt-oss-20b"
    assert model_layout("llama-3-8b", num_blocks=8, max_model_len=100).max_model_len == 100


def test_hybrid_mamba_uses_vllm_align_mode_and_page_matching_block_size() -> None:
    lay = model_layout("hybrid-mamba", num_blocks=100)
    full, mamba = lay.groups
    # mamba state: 3*2048*2 + 32*64*128*4 = 1060864 bytes; attention: 4096 bytes a token;
    # 1060864 / 4096 = 259 tokens -> next multiple of 16 = 272.
    assert mamba.page_size_bytes == 1060864
    assert (full.block_size, mamba.block_size, lay.hash_block_size) == (272, 272, 272)
    assert mamba.mamba_cache_mode == "align"
    off = model_layout("hybrid-mamba", num_blocks=100, enable_caching=False, max_model_len=4096)
    assert off.groups[1].mamba_cache_mode == "none"
    # without caching: mode "none", one state block of max_model_len tokens; the scheduler
    # block size is lcm(272, 4096) = 69632 (hash block size too: nothing is cached).
    assert off.groups[1].block_size == 4096
    assert off.scheduler_block_size == off.hash_block_size == 69632
    assert [n.split(".")[2] for n in full.layer_names + mamba.layer_names] == [
        str(i) for i in range(16)
    ]


def test_overrides_and_errors() -> None:
    lay = model_layout(
        "gpt-oss-20b",
        num_blocks=10,
        overrides={"num_layers": 2, "sliding_window": 512, "dtype": "float32"},
    )
    assert [(g.num_layers, g.sliding_window, g.dtype) for g in lay.groups] == [
        (2, None, "float32"),
        (2, 512, "float32"),
    ]
    assert lay.groups[1].layer_names == ["model.layers.2.self_attn", "model.layers.3.self_attn"]
    with pytest.raises(ValueError, match="unknown model preset"):
        model_layout("gpt-5", num_blocks=10)
    with pytest.raises(ValueError, match="exactly one"):
        model_layout("llama-3-8b")
    with pytest.raises(ValueError, match="need at least 2"):
        model_layout("llama-3-8b", gpu_memory=2**21)
    with pytest.raises(ValueError, match="unknown dtype"):  # the core's own check
        model_layout("llama-3-8b", num_blocks=10, overrides={"dtype": "int4"})


def test_replay_configs() -> None:
    assert [g.block_size for g in replay_layout("bs32", num_blocks=10).groups] == [32, 16]
    bs32 = replay_layout("bs32", num_blocks=10)
    assert (bs32.hash_block_size, bs32.scheduler_block_size) == (16, 32)
    assert replay_layout("eagle", num_blocks=10).use_eagle
    assert [g.kind for g in replay_layout("chunked", num_blocks=10).groups] == [
        "full",
        "chunked_local",
    ]
    with pytest.raises(ValueError, match="unknown config"):
        replay_layout("nope", num_blocks=10)


@pytest.mark.parametrize(
    ("text", "value"),
    [("40GiB", 40 * 2**30), ("40GB", 40 * 2**30), ("40g", 40 * 2**30), ("512 MiB", 512 * 2**20),
     ("1.5G", 3 * 2**29), ("1000", 1000), ("2TB", 2 * 2**40)],
)  # fmt: skip
def test_parse_memory_units_are_binary(text: str, value: int) -> None:
    assert parse_memory(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "-1GiB", "12XB", "nanGiB"])
def test_parse_memory_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a memory size"):
        parse_memory(text)


@pytest.mark.vllm
def test_page_sizes_match_vllm() -> None:
    pytest.importorskip("vllm")
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    g = GroupDesc("full", 1, 16, 8, 64, "bfloat16")
    spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=64, dtype=torch.bfloat16)
    assert g.page_size_bytes == spec.page_size_bytes
    mamba = model_layout("hybrid-mamba", num_blocks=10).groups[1]
    mspec = MambaSpec(
        block_size=272,
        shapes=mamba.mamba_shapes,
        dtypes=tuple(getattr(torch, d) for d in mamba.mamba_dtypes),
    )
    assert mamba.page_size_bytes == mspec.page_size_bytes


def _all_layouts() -> list[Any]:
    out: list[Any] = []
    for caching in (True, False):
        for config in REPLAY_CONFIGS:
            lay = replay_layout(config, num_blocks=64, max_model_len=4096, enable_caching=caching)
            out.append(pytest.param(lay, id=f"{config}-caching{int(caching)}"))
        for preset in MODEL_PRESETS:
            lay = model_layout(preset, num_blocks=64, max_model_len=4096, enable_caching=caching)
            out.append(pytest.param(lay, id=f"{preset}-caching{int(caching)}"))
    return out


@needs_kb
@pytest.mark.parametrize("layout", _all_layouts())
def test_layouts_agree_with_kvblocks_specs(layout: KVLayout) -> None:
    cfg = build_kvblocks_config(layout)
    sched, hash_bs = cfg.resolve_block_sizes(enable_prefix_caching=layout.enable_caching)
    assert (sched, hash_bs) == (layout.scheduler_block_size, layout.hash_block_size)
    for group, desc in zip(cfg.kv_cache_groups, layout.groups, strict=True):
        assert group.kv_cache_spec.page_size_bytes == desc.page_size_bytes
        assert group.layer_names == desc.layer_names


# ------------------------------------------------------------------ percentiles
def test_one_percentile_rule_for_latencies_and_call_times() -> None:
    # nearest rank: the value of rank ceil(q * n), NaN (a one-token request's TPOT) left out
    values = [float(x) for x in range(100, 0, -1)] + [math.nan]
    assert percentiles(values) == {
        "p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p99.9": 100.0
    }  # fmt: skip
    assert set(percentiles([3.0]).values()) == {3.0}
    assert set(percentiles([math.nan]).values()) == {None}
    layout = replay_layout("full", num_blocks=2000)
    res = replay(generate("shared-prefix", 0, WorkloadParams(20)), make_backend("kvblocks", layout))
    for name, call in res.calls().items():
        v = sorted(res.samples.get(name, []))
        if v:
            assert [call["p50_ns"], call["p90_ns"], call["p99_ns"]] == [
                nearest_rank(v, q) for q in (0.5, 0.9, 0.99)
            ]


# ------------------------------------------------------------------ CLI errors
def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "simulate" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "gpt-5"], "unknown preset 'gpt-5'"),
        (["--model", "gpt-oss"], "unknown preset 'gpt-oss' (choose from"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--num-requests", "0"], "must be >= 1"),
        (["--workload", "chat"], "invalid choice: 'chat'"),
        (["--sweep", "colour=1,2"], "KEY one of num_blocks"),
        (["--sweep", "num_blocks=8,x"], "bad num_blocks value"),
        (["--gpu-memory", "12XB"], "not a memory size"),
        (["--gpu-memory", "1KiB"], "need at least 2"),
        (["--num-blocks", "8", "--gpu-memory", "1GiB"], "not allowed with argument"),
        (["--dtype", "int4", "--num-requests", "2"], 'unknown dtype "int4"'),
        (["--plot", "usage.txt"], "expected a .png"),
        (["--plot", "/nonexistent-dir/usage.png"], "no such directory: /nonexistent-dir"),
        (["--gpu", "h300"], "unknown GPU 'h300' (choose from h100-sxm (H100), h200"),
        (["--trace", "/nonexistent.jsonl"], "/nonexistent.jsonl: cannot read trace"),
    ],
)  # fmt: skip
def test_bad_flags_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    err = _error(capsys, "simulate", *argv)
    assert err.startswith("kvblocks simulate: error: ")
    assert message in err
    assert err.rstrip().endswith("(see kvblocks simulate --help)") or "--help" not in err


def test_unwritable_plot_fails_before_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    if os.access(folder, os.W_OK):  # root writes anywhere: make the target a directory
        (folder / "x.png").mkdir()
        err = _error(capsys, "simulate", "--plot", str(folder / "x.png"))
        assert "is a directory" in err
    else:
        err = _error(capsys, "simulate", "--plot", str(folder / "x.png"))
        assert "permission denied" in err


def test_plot_without_matplotlib_fails_before_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else find_spec(name, *a),
    )
    monkeypatch.setattr(cli, "replay", lambda *a: pytest.fail("ran before the check"))
    err = _error(capsys, "simulate", "--plot", str(tmp_path / "u.png"))
    assert "--plot needs matplotlib (pip install 'kvblocks[sim]')" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--version"], ["simulate", "--version"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 0
        assert capsys.readouterr().out == f"kvblocks {kvblocks.__version__}\n"


def test_malformed_trace_names_file_and_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 4, "output_length": 2, "hash_ids": [1]}\n'
        '{"timestamp": 1, "input_length": 4}\n'
    )
    err = _error(capsys, "simulate", "--trace", str(path))
    assert f"{path}:2: " in err and "'output_length'" in err


@needs_kb
def test_compare_vllm_without_vllm_still_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "vllm_available", lambda: None)
    code, out, err = _simulate(
        capsys, "--trace", _hand_trace(tmp_path), *SMALL, "--compare-vllm", "--json"
    )
    assert code == 0
    assert err.count("\n") == 1 and "vLLM is not importable" in err and "kvblocks only" in err
    assert "vllm" not in json.loads(out)["runs"][0]


def test_python_dash_m_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvblocks", "simulate", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--gpu-memory" in out.stdout and "kvblocks-simulate-v4" in out.stdout
    assert "meta-llama/Meta-Llama-3-8B" in out.stdout


# ------------------------------------------------------------------ runs
def _hand_trace(tmp_path: Path, salts: tuple[str | None, ...] = (None, None, None)) -> str:
    # A and B: two 4-token prompts with 3 outputs each, as test_replay's
    # test_preemption_and_resume (B is preempted at step 1 and resumes at step 3); C arrives
    # at step 5, after both finished, and repeats A's first block.
    path = tmp_path / "hand.jsonl"
    reqs = (("A", [1, 2, 3, 4], 0, 3), ("B", [5, 6, 7, 8], 0, 3), ("C", [1, 2, 3, 4, 9], 5, 1))
    lines = [{"format": "kvtrace-v1", "kind": "hand", "seed": 0, "vocab_size": 1000}] + [
        {"request_id": rid, "arrival_step": arrival, "after": None, "prompt_token_ids": ids,
         "out_seed": 5, "max_output_tokens": out, "cache_salt": salt}
        for (rid, ids, arrival, out), salt in zip(reqs, salts, strict=True)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


SMALL = ["--block-size", "4", "--num-blocks", "4", "--max-model-len", "64"]
RUN_FIELDS = {
    "value", "num_blocks", "block_size", "bytes_per_block", "kv_cache_bytes", "requests",
    "rejected_requests", "length_capped_requests", "prompt_tokens", "generated_tokens",
    "steps", "preemptions", "prefix_hit_rate",
    "queried_tokens", "hit_tokens", "preempted_hit_rate", "preempted_requests",
    "preempted_queried_tokens", "preempted_hit_tokens", "infinite_cache_hit_rate",
    "ideal_hit_rate", "infinite_cache_hit_tokens", "ideal_hit_tokens", "tenants", "peak_usage",
    "mean_usage", "kv_total_ns", "kv_ns_per_step", "kv_ns_per_generated_token",
    "request_hash_ns", "wall_s", "synth_s", "steps_per_s", "sim_requests_per_s", "simulated_s",
    "throughput_tokens_per_s", "step_time_shares", "latency", "slo_attainment", "fleet",
    "retention", "offload",
}  # fmt: skip


@pytest.mark.parametrize("impl", _impls(), indirect=True)
def test_hit_rate_split_of_a_hand_worked_replay(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, impl: str
) -> None:
    code, out, _ = _simulate(capsys, "--trace", _hand_trace(tmp_path), *SMALL, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["schema"] == "kvblocks-simulate-v4"
    assert set(doc) == {
        "schema", "kvblocks_version", "workload", "model", "scheduler", "hardware", "sweep",
        "runs",
    }  # fmt: skip
    assert doc["kvblocks_version"] == kvblocks.__version__
    assert doc["workload"] == {
        "kind": "hand", "seed": 0, "source": _hand_trace(tmp_path), "requests": 3,
        "prompt_tokens": 13, "params": {},
    }  # fmt: skip
    assert doc["model"]["preset"] == "llama-3.1-8b"
    assert doc["model"]["model"] == "meta-llama/Llama-3.1-8B"
    assert doc["model"]["groups"] == [
        {"kind": "full", "num_layers": 32, "block_size": 4, "page_size_bytes": 4 * 8 * 2 * 128 * 2}
    ]
    assert doc["scheduler"]["max_model_len"] == 64
    (run,) = doc["runs"]
    assert set(run) == RUN_FIELDS
    # Steps 0-4 as test_replay.test_preemption_and_resume; step 5 (C) is the next one run.
    assert run["steps"] == 6 and run["preemptions"] == 1
    # First admissions: A (4 tokens, no hit), B (4, no hit) at step 0, then C at step 5:
    # A's full block [1, 2, 3, 4] is still cached (B's resumption took the free queue's
    # head, an unhashed block), so C hits 4 of its 5 tokens.
    assert (run["queried_tokens"], run["hit_tokens"]) == (4 + 4 + 5, 4)
    assert run["prefix_hit_rate"] == round(4 / 13, 6)
    # B's re-admission at step 3 (5 tokens: its prompt and 1st output) hits its own block,
    # which stayed cached while B waited: reported apart, not in the hit rate above.
    assert run["preempted_requests"] == 1
    assert (run["preempted_queried_tokens"], run["preempted_hit_tokens"]) == (5, 4)
    assert run["preempted_hit_rate"] == 0.8
    # Both ceilings: A's block was stored at step 0 and 3 blocks hold every block stored.
    assert run["infinite_cache_hit_tokens"] == run["ideal_hit_tokens"] == 4
    assert run["infinite_cache_hit_rate"] == run["ideal_hit_rate"] == round(4 / 13, 6)
    assert run["tenants"] is None
    # Free blocks (of 3) after steps 0..5: 1, 1, 3, 1, 3, 3 -> usage 2/3, 2/3, 0, 2/3, 0, 0.
    assert run["peak_usage"] == round(2 / 3, 6)
    assert run["mean_usage"] == round(2 / 6, 6)
    assert run["generated_tokens"] == 7 and run["requests"] == 3
    assert run["num_blocks"] == 4 and run["value"] is None
    assert run["kv_cache_bytes"] == 4 * 32 * 4 * 8 * 2 * 128 * 2
    assert run["kv_total_ns"] > 0 and run["kv_ns_per_step"] == round(run["kv_total_ns"] / 6, 1)


@needs_kb
def test_tenants_are_reported_apart(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # C repeats A's first block but under another salt: no hit, for real or in a ceiling.
    trace = _hand_trace(tmp_path, ("t1", "t1", "t2"))
    code, out, _ = _simulate(capsys, "--trace", trace, *SMALL, "--json")
    assert code == 0
    run = json.loads(out)["runs"][0]
    assert run["hit_tokens"] == run["infinite_cache_hit_tokens"] == 0
    assert run["tenants"] == [
        {"cache_salt": "t1", "requests": 2, "queried_tokens": 8, "hit_tokens": 0,
         "prefix_hit_rate": 0.0, "infinite_cache_hit_rate": 0.0, "ideal_hit_rate": 0.0},
        {"cache_salt": "t2", "requests": 1, "queried_tokens": 5, "hit_tokens": 0,
         "prefix_hit_rate": 0.0, "infinite_cache_hit_rate": 0.0, "ideal_hit_rate": 0.0},
    ]  # fmt: skip
    code, out, _ = _simulate(capsys, "--trace", trace, *SMALL)
    assert "tenant t1" in out and "tenant t2" in out


@needs_kb
def test_generated_sessions_get_tenants(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _simulate(
        capsys, "--workload", "agentic", "--num-requests", "4", "--tenants", "2",
        "--model", "llama-3.1-8b", "--num-blocks", "4000", "--json",
    )  # fmt: skip
    assert code == 0
    run = json.loads(out)["runs"][0]
    tenants = run["tenants"]
    assert [t["cache_salt"] for t in tenants] == ["tenant-0", "tenant-1"]
    assert sum(t["hit_tokens"] for t in tenants) == run["hit_tokens"] > 0
    assert sum(t["queried_tokens"] for t in tenants) == run["queried_tokens"]
    for t in tenants:
        assert t["prefix_hit_rate"] <= t["infinite_cache_hit_rate"]


@pytest.mark.parametrize("impl", _impls(), indirect=True)
def test_summary_table(capsys: pytest.CaptureFixture[str], tmp_path: Path, impl: str) -> None:
    code, out, err = _simulate(capsys, "--trace", _hand_trace(tmp_path), *SMALL, "--progress")
    assert code == 0
    for row in ("requests", "prefix hit rate", "infinite cache", "ideal (Belady)", "preemptions",
                "preempted re-hits", "peak usage", "mean usage", "KV time / step",
                "KV time / token", "steps / s"):  # fmt: skip
        assert row in out
    assert "30.8% (4 of 13 prompt tokens at first admission)" in out
    assert "80.0% (4 of 5 tokens, 1 re-admissions; not in the hit rate)" in out
    assert "3/3" in err and "req" in err  # tqdm's last state: all requests finished


@pytest.mark.parametrize("impl", _impls(), indirect=True)
def test_sweep_prints_one_row_per_value(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, impl: str
) -> None:
    argv = ["--trace", _hand_trace(tmp_path), "--block-size", "4", "--max-model-len", "64"]
    code, out, _ = _simulate(capsys, *argv, "--sweep", "num_blocks=4,16")
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 3 and lines[0].split()[0] == "num_blocks"
    assert [ln.split()[0] for ln in lines[1:]] == ["4", "16"]
    code, out, _ = _simulate(capsys, *argv, "--sweep", "num_blocks=4,16", "--json")
    runs = json.loads(out)["runs"]
    assert [(r["value"], r["num_blocks"], r["preemptions"]) for r in runs] == [
        (4, 4, 1),
        (16, 16, 0),  # 15 free blocks hold both requests
    ]
    assert {r["prefix_hit_rate"] for r in runs} == {round(4 / 13, 6)}


@pytest.mark.parametrize("impl", _impls(), indirect=True)
def test_plot_writes_png(capsys: pytest.CaptureFixture[str], tmp_path: Path, impl: str) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "usage.png"
    code, out, err = _simulate(capsys, "--trace", _hand_trace(tmp_path), *SMALL, "--plot", str(png))
    assert code == 0 and "prefix hit rate" in out and str(png) in err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_kb
def test_plot_title_and_preemption_marks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    saved: list[matplotlib.figure.Figure] = []
    savefig = matplotlib.figure.Figure.savefig

    def keep(fig: matplotlib.figure.Figure, *a: Any, **kw: Any) -> None:
        saved.append(fig)
        savefig(fig, *a, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    png = tmp_path / "p.png"
    assert _simulate(capsys, "--trace", _hand_trace(tmp_path), *SMALL, "--plot", str(png))[0] == 0
    (fig,) = saved
    title = fig.get_suptitle()
    assert "hand.jsonl, 3 requests" in title
    assert "llama-3.1-8b (meta-llama/Llama-3.1-8B)" in title and "4 blocks x 4 tokens" in title
    assert "2.0 MiB" in title  # 4 blocks x 32 layers x 16 KiB
    usage_ax = fig.axes[0]
    labels = [line.get_label() for line in usage_ax.get_lines()]
    assert "preemptions (1)" in labels


def test_plot_write_failure_keeps_the_summary(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")

    def fail(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli, "plot", fail)
    png = tmp_path / "p.png"
    code, out, err = _simulate(capsys, "--trace", _hand_trace(tmp_path), *SMALL, "--plot", str(png))
    assert code == 1
    assert "prefix hit rate" in out  # printed before the plot was tried
    assert err.strip() == f"kvblocks simulate: error: cannot write the plot {png}: " \
        "No space left on device"  # fmt: skip


def test_ctrl_c_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupt(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "replay", interrupt)
    code, out, err = _simulate(capsys, "--trace", _hand_trace(tmp_path), *SMALL)
    assert (code, out, err) == (130, "", "kvblocks simulate: interrupted\n")


@needs_kb
@pytest.mark.parametrize("kind", KINDS)
def test_every_builtin_workload_runs_with_defaults(
    capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    # No flag but the size: the default model's context holds every built-in workload.
    code, out, err = _simulate(capsys, "--workload", kind, "--num-requests", "2", "--json")
    assert code == 0, err
    trace = generate(kind, 0, WorkloadParams(2))
    (run,) = json.loads(out)["runs"]
    assert (run["requests"], run["rejected_requests"]) == (len(trace.requests), 0)
    assert run["generated_tokens"] == sum(r.max_output_tokens for r in trace.requests)


def _long_trace(tmp_path: Path) -> str:
    # max_model_len 64: R's 64-token prompt leaves no room for an output token and W's 70
    # exceed it (vLLM refuses both); S follows R; C's 60 + 10 tokens stop at 64 (4 outputs).
    path = tmp_path / "long.jsonl"
    reqs = (("R", 64, 0, 3, None), ("S", 10, 2, 2, "R"), ("C", 60, 1, 10, None),
            ("W", 70, 3, 1, None))  # fmt: skip
    lines = [{"format": "kvtrace-v1", "kind": "long", "seed": 0, "vocab_size": 1000}] + [
        {"request_id": rid, "arrival_step": arrival, "after": after,
         "prompt_token_ids": list(range(1, n + 1)), "out_seed": 5, "max_output_tokens": out}
        for rid, n, arrival, out, after in reqs
    ]  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


@pytest.mark.parametrize("impl", _impls(), indirect=True)
@pytest.mark.parametrize("replicas", ["1", "2"])
def test_requests_longer_than_max_model_len_are_rejected_and_counted(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, impl: str, replicas: str
) -> None:
    if impl == "vllm" and replicas != "1":
        pytest.skip("a fleet runs kvblocks only")
    argv = ["--trace", _long_trace(tmp_path), "--block-size", "4", "--num-blocks", "40",
            "--max-model-len", "64", "--replicas", replicas]  # fmt: skip
    code, out, err = _simulate(capsys, *argv, "--json")
    assert code == 0, err
    (run,) = json.loads(out)["runs"]
    assert (run["requests"], run["rejected_requests"], run["length_capped_requests"]) == (4, 2, 1)
    assert run["generated_tokens"] == 2 + 4  # S whole, C up to the context
    code, out, _ = _simulate(capsys, *argv)
    assert code == 0
    assert "rejected        2 (prompt of max_model_len 64 tokens or more" in out
    assert "length capped   1 (output stopped at max_model_len 64)" in out


@pytest.mark.parametrize("impl", _impls(), indirect=True)
def test_generated_workload_and_mooncake(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, impl: str
) -> None:
    code, out, _ = _simulate(
        capsys, "--workload", "agentic", "--num-requests", "3", "--model", "llama-3.1-8b",
        "--num-blocks", "2000", "--json",
    )  # fmt: skip
    assert code == 0
    run = json.loads(out)["runs"][0]
    assert run["hit_tokens"] > 0  # later turns reuse earlier turns' blocks
    mc = tmp_path / "mc.jsonl"
    mc.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]}\n'
        '{"timestamp": 500, "input_length": 520, "output_length": 2, "hash_ids": [7, 9]}\n'
    )
    code, out, _ = _simulate(capsys, "--trace", str(mc), "--num-blocks", "200", "--json")
    run = json.loads(out)["runs"][0]
    # the second request arrives after the first finished and hits hash id 7's 512 tokens
    assert (run["hit_tokens"], run["queried_tokens"], run["steps"]) == (512, 1120, 5)


@pytest.mark.parametrize("impl", _impls(), indirect=True)
def test_too_small_cache_is_reported_without_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, impl: str
) -> None:
    code, _, err = _simulate(capsys, "--trace", _hand_trace(tmp_path), "--block-size", "2",
                             "--num-blocks", "2", "--max-model-len", "64")  # fmt: skip
    assert code == 1
    assert "cannot admit A" in err and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.vllm
@needs_kb
def test_compare_vllm_digests_agree(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    code, out, _ = _simulate(capsys, "--workload", "shared-prefix", "--num-requests", "20",
                             "--num-blocks", "600", "--compare-vllm", "--json")  # fmt: skip
    assert code == 0
    v = json.loads(out)["runs"][0]["vllm"]
    assert v["digests_agree"] and v["digest"] == v["kvblocks_digest"]
    assert v["speedup"] > 0


@pytest.mark.slow
@needs_kb
def test_default_run_prints_the_summary() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvblocks", "simulate"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "prefix hit rate" in out.stdout
