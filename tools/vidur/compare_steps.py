"""The step-time table of docs/simulate-time.md: kvblocks' A100 step times against the stored
Vidur figures (``tests/sim/data/vidur_a100_llama3_8b_steps.csv``), as markdown.

    python tools/vidur/compare_steps.py      # with kvblocks importable
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from kvblocks.sim.presets import model_layout
from kvblocks.sim.timemodel import GPU_PRESETS, StepTimeModel

DATA = Path(__file__).parents[2] / "tests" / "sim" / "data" / "vidur_a100_llama3_8b_steps.csv"


def main() -> None:
    m = StepTimeModel(
        model_layout("llama-3-8b", num_blocks=100), "llama-3-8b", GPU_PRESETS["a100-80gb"]
    )
    lines = [line for line in DATA.read_text().splitlines() if not line.startswith("#")]
    print(
        "| prefills (cached:new) | decodes @ context | in profile | Vidur ms | kvblocks ms ", end=""
    )
    print("| error |")
    print("|---|---|:-:|---:|---:|---:|")
    errs: dict[bool, list[float]] = {True: [], False: []}
    for r in csv.DictReader(lines):
        batch = [(int(c), int(n)) for c, n in (p.split(":") for p in r["prefills"].split())]
        b, c = int(r["decodes"]), int(r["decode_context"])
        ours = m.step_time(batch + [(c, 1)] * b) * 1e3
        vidur = float(r["vidur_ms"])
        inside = r["in_profile"] == "1"
        errs[inside].append(ours / vidur - 1)
        dec = f"{b} @ {c}" if b else "-"
        print(f"| {r['prefills'] or '-'} | {dec} | {'yes' if inside else 'no'} | {vidur:.2f} "
              f"| {ours:.2f} | {ours / vidur - 1:+.1%} |")  # fmt: skip
    for name, e in (("in profile", errs[True]), ("all", errs[True] + errs[False])):
        a = [abs(x) for x in e]
        print(f"\n{name}: {len(a)} steps, median |error| {statistics.median(a):.1%}, "
              f"worst {max(a):.1%}")  # fmt: skip


if __name__ == "__main__":
    main()
