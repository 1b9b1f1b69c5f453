"""The end-to-end comparison's trace, for Vidur and for kvblocks (docs/simulate-time.md).

    python tools/vidur/poisson_trace.py RATE N SEED STEM

writes STEM.csv (Vidur 0.0.26's trace_replay columns: Date, Time in seconds,
PromptTokenCount, CompletionTokenCount) and STEM.jsonl (kvtrace-v1, arrivals in steps of
0.1 ms: run it with ``--step-ms 0.1``): N requests of 512 distinct prompt tokens and 256
output tokens, Poisson arrivals at RATE per second from ``random.Random(SEED)``.
"""

from __future__ import annotations

import json
import random
import sys


def main(rate: float, n: int, seed: int, stem: str) -> None:
    rnd = random.Random(seed)
    t = 0.0
    times = []
    for _ in range(n):
        times.append(round(t, 4))
        t += rnd.expovariate(rate)
    with open(f"{stem}.csv", "w") as f:
        f.write("Date,Time,PromptTokenCount,CompletionTokenCount\n")
        f.writelines(f"2023-08-21,{x:.4f},512,256\n" for x in times)
    with open(f"{stem}.jsonl", "w") as f:
        f.write(json.dumps({"format": "kvtrace-v1", "kind": f"poisson-{rate:g}"}) + "\n")
        for i, x in enumerate(times):
            req = {
                "request_id": f"r{i}",
                "arrival_step": round(x * 10000),
                "prompt": [[1000 + i, 512]],
                "out_seed": 500000 + i,
                "max_output_tokens": 256,
            }
            f.write(json.dumps(req) + "\n")


if __name__ == "__main__":
    main(float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
