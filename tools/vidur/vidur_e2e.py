"""TTFT p50, TPOT p50 and generated tokens/s of a Vidur run, from its request_metrics.csv.

    python tools/vidur/vidur_e2e.py TRACE.csv OUT/*/request_metrics.csv

TRACE.csv is the trace Vidur replayed (``Time`` = arrival in seconds, in request order).
Generated tokens/s is all decode tokens over the time from the first arrival to the last
completion, as ``kvblocks simulate``'s ``throughput_tokens_per_s``. Plain Python.
"""

from __future__ import annotations

import csv
import statistics
import sys


def main(trace: str, metrics: str) -> None:
    arrivals = [float(r["Time"]) for r in csv.DictReader(open(trace))]
    rows = sorted(csv.DictReader(open(metrics)), key=lambda r: int(r["Request Id"]))
    ttft = [float(r["prefill_e2e_time"]) for r in rows]
    tpot = [float(r["decode_time_execution_plus_preemption_normalized"]) for r in rows]
    end = max(a + float(r["request_e2e_time"]) for a, r in zip(arrivals, rows, strict=True))
    tokens = sum(int(float(r["request_num_decode_tokens"])) for r in rows)
    print(
        f"requests {len(rows)} ttft_p50_ms {statistics.median(ttft) * 1e3:.2f} "
        f"tpot_p50_ms {statistics.median(tpot) * 1e3:.3f} "
        f"tokens_per_s {tokens / (end - arrivals[0]):.1f} "
        f"restarts {sum(int(float(r['request_num_restarts'])) for r in rows)}"
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
