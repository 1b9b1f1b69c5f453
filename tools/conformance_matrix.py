"""Issue-3 conformance matrix: kvblocks vs vLLM 0.33.0 digests on every trace kind and config.

Run inside the vLLM 0.33 venv (V=.venv-vllm-0.33) with this build of kvblocks importable
(see `make test-vllm`):
    PYTHONPATH=.oracle-site.0.33 $V/bin/python tools/conformance_matrix.py --seeds 1 2 3

For each trace kind of the oracle's trace.py and each seed it writes a trace, then runs
`benches/python/replay.py --compare` (vLLM, kvblocks, kvblocks with the batched decode call,
all in one process) for every config and prints one row per run: whether the three digests
agree and the KV+hash speed-up of each kvblocks variant. Exit status 1 if any digest differs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE_PY = ROOT / "tools" / "oracle" / "trace.py"
REPLAY_PY = ROOT / "benches" / "python" / "replay.py"

KINDS = {  # kind -> (size flags, num_blocks)
    "shared-prefix": (["--num-requests", "150"], 4096),
    "no-reuse": (["--num-requests", "150"], 4096),
    "agentic": (["--num-sessions", "20"], 4096),
    "long-context": (["--num-requests", "4"], 32768),
}
CONFIGS = {  # name -> replay.py flags
    "full": ["--config", "full"],
    "full+swa1024": ["--config", "hybrid", "--sliding-window", "1024"],
    "full+swa1024/retain0": [
        "--config",
        "hybrid",
        "--sliding-window",
        "1024",
        "--retention-interval",
        "0",
    ],
    "full+swa1024/retain256": [
        "--config",
        "hybrid",
        "--sliding-window",
        "1024",
        "--retention-interval",
        "256",
    ],
    "swa1024": ["--config", "swa", "--sliding-window", "1024"],
    "full+chunked8192": ["--config", "chunked", "--chunk-size", "8192"],
    "full+mamba": ["--config", "mamba"],
    "mamba-align-spec": ["--config", "mamba-spec"],
    "mamba-partial": ["--config", "mamba-partial"],
    "full+mamba/retain0": ["--config", "mamba", "--retention-interval", "0"],
    "mamba-align-spec/retain64": ["--config", "mamba-spec", "--retention-interval", "64"],
    "mamba-partial/retain0": ["--config", "mamba-partial", "--retention-interval", "0"],
    "full+eagle": ["--config", "eagle"],
    "bs32/hash16": ["--config", "bs32"],
    "caching-off": ["--config", "full", "--no-prefix-caching"],
    "mtp": ["--config", "mtp"],
    "spec-lookahead": ["--config", "spec-lookahead", "--sliding-window", "1024"],
    "dcp2": ["--config", "full", "--dcp-world-size", "2"],
    "dcp4": ["--config", "full", "--dcp-world-size", "4"],
    # vLLM 0.33's newer spec types: MLA + sliding-window MLA + a compressor ring, and
    # MLA + a compressed MLA indexer + a tail ring.
    "deepseek-v4": ["--config", "deepseek-v4", "--sliding-window", "128"],
    "glm5-next": ["--config", "glm5-next"],
    # HiSparse: the MLA source in a host pool, its indexer, resident pages and hot region,
    # with the connector's calls each step; the host pool as large as the GPU's, and the
    # smallest vLLM lays out for the trace's longest sequence (host evictions).
    "hisparse": ["--config", "hisparse"],
    "hisparse/host-min": ["--config", "hisparse", "--hisparse-host-blocks", "min"],
    "hisparse-mamba": ["--config", "hisparse-mamba"],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--small", action="store_true", help="smaller traces (about 3x faster)")
    a = ap.parse_args()
    failures = 0
    print(f"{'kind':14} {'seed':>4} {'config':17} {'digest':>7} {'steps':>6} {'preempt':>7} "
          f"{'copies':>6} {'x(1by1)':>8} {'x(batch)':>8}", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for kind in a.kinds:
            size, num_blocks = KINDS[kind]
            if a.small:
                size = [size[0], str(max(2, int(size[1]) * 2 // 5))]
            for seed in a.seeds:
                trace = Path(tmp) / f"{kind}-{seed}.jsonl"
                subprocess.run(
                    [sys.executable, str(TRACE_PY), "--kind", kind, "--seed", str(seed),
                     *size, "-o", str(trace)],
                    check=True,
                )  # fmt: skip
                for name in a.configs:
                    cmd = [sys.executable, str(REPLAY_PY), str(trace), "--compare",
                           "--num-blocks", str(num_blocks), *CONFIGS[name]]  # fmt: skip
                    out = subprocess.run(cmd, capture_output=True, text=True)
                    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
                    if out.returncode != 0 or not lines:
                        failures += 1
                        err = (out.stderr.strip().splitlines() or ["?"])[-1]
                        print(f"{kind:14} {seed:>4} {name:17} ERROR {err}", flush=True)
                        continue
                    res = json.loads(lines[-1])
                    cmp, vllm = res["compare"], res["runs"]["vllm"]
                    ok = cmp["digests_agree"]
                    failures += not ok
                    print(
                        f"{kind:14} {seed:>4} {name:17} {'same' if ok else 'DIFF':>7} "
                        f"{vllm['steps']:>6} {vllm['preemptions']:>7} {vllm['block_copies']:>6} "
                        f"{cmp['kvblocks']['kv_plus_hash_speedup']:>7.1f}x "
                        f"{cmp['kvblocks-batch']['kv_plus_hash_speedup']:>7.1f}x",
                        flush=True,
                    )
    print(f"{'all digests agree' if not failures else f'{failures} runs differ or failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
