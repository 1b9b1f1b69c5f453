"""The simulator behind ``kvblocks simulate``: trace replay through the real manager.

One module per job:

* :mod:`~kvblocks.sim.workloads`: built-in workload generators and trace readers
  (kvblocks' kvtrace-v1 and Mooncake's JSON lines);
* :mod:`~kvblocks.sim.presets`: model presets and KV cache layouts, built as a kvblocks or
  a vLLM ``KVCacheManager``;
* :mod:`~kvblocks.sim.backends`: the two managers a run can drive;
* :mod:`~kvblocks.sim.engine`: the vLLM-style scheduler loop, a class that takes one step
  at a time (:class:`Engine`);
* :mod:`~kvblocks.sim.ceilings`: the infinite-cache and Belady hit-rate ceilings;
* :mod:`~kvblocks.sim.timemodel`: GPU presets and the step-time model (a sum of kernels,
  calibrated per GPU by :mod:`~kvblocks.sim.calibration`);
* :mod:`~kvblocks.sim.offload`: the host-memory tier (vLLM 0.33's CPU offload) on
  ``kvblocks.OffloadManager`` (``docs/simulate-offload.md``);
* :mod:`~kvblocks.sim.fleet`: N engines behind a router (round robin, least loaded,
  prefix-aware from the engines' KV cache events);
* :mod:`~kvblocks.retention_spec`: ``--retention`` specs, read into a
  ``kvblocks.RetentionPolicy`` (``docs/retention.md``);
* :mod:`~kvblocks.sim.percentiles`: the one percentile rule (nearest rank);
* :mod:`~kvblocks.sim.report`: the JSON document, the summary, the sweep table, the plot;
* :mod:`~kvblocks.sim.cli`: the ``kvblocks simulate`` command line.

In a notebook::

    from kvblocks.sim import Engine, ReplayOptions, generate, make_backend, model_layout

    layout = model_layout("llama-3-8b", gpu_memory=16 * 2**30)
    engine = Engine(generate("agentic"), make_backend("kvblocks", layout),
                    ReplayOptions(ceilings=True), layout)
    while not engine.done:
        info = engine.step()
    result = engine.finish()
    print(result.hit_rate, result.ceilings.ideal_hit_rate)

Under a retention policy: ``make_backend("kvblocks", layout,
retention=parse_retention("session=30,quota=burst:0").build())`` (the engine then
advances the manager's clock every step).

In time (``ReplayOptions(time_model=StepTimeModel(layout, "llama-3-8b",
GPU_PRESETS["h100-sxm"]).step_time)``), ``result.ttft_s`` and ``result.simulated_s`` fill
in; ``Fleet(trace, backends, options, "prefix-aware", layout).run()`` runs N engines.

Only :mod:`~kvblocks.sim.report`'s plot needs an optional package (matplotlib, the
``kvblocks[sim]`` extra).
"""

from __future__ import annotations

from kvblocks.retention_spec import RetentionSpec, parse_retention
from kvblocks.sim.backends import Backend, make_backend, vllm_available
from kvblocks.sim.ceilings import CeilingResult
from kvblocks.sim.engine import Engine, ReplayError, ReplayOptions, ReplayResult, StepInfo, replay
from kvblocks.sim.fleet import ROUTERS, Fleet, FleetResult
from kvblocks.sim.presets import MODEL_PRESETS, KVLayout, model_layout, replay_layout
from kvblocks.sim.timemodel import GPU_PRESETS, StepTimeModel
from kvblocks.sim.workloads import KINDS, Trace, TraceError, WorkloadParams, generate, read_trace

__all__ = [
    "GPU_PRESETS",
    "KINDS",
    "MODEL_PRESETS",
    "ROUTERS",
    "Backend",
    "CeilingResult",
    "Engine",
    "Fleet",
    "FleetResult",
    "KVLayout",
    "ReplayError",
    "ReplayOptions",
    "ReplayResult",
    "RetentionSpec",
    "StepInfo",
    "StepTimeModel",
    "Trace",
    "TraceError",
    "WorkloadParams",
    "generate",
    "make_backend",
    "model_layout",
    "parse_retention",
    "read_trace",
    "replay",
    "replay_layout",
    "vllm_available",
]
