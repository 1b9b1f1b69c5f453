"""Step times from Vidur 0.0.26's trained predictor (A100, Llama-3-8B, TP 1) over a grid of
steps, written as the reference figures ``tests/sim/data/vidur_a100_llama3_8b_steps.csv``.

Development time only, in the Vidur venv, after one ``vidur.main`` run has trained the
random forests into CACHE (``docs/simulate-time.md``, "Against Vidur", has the command):

    python tools/vidur/vidur_steps.py CACHE > tests/sim/data/vidur_a100_llama3_8b_steps.csv

A step is ``prefills`` (``cached:chunk`` per prefilling request) plus ``decodes`` requests
decoding at context ``decode_context`` (tokens already in the KV cache). ``in_profile`` is 1
when every attention kernel of the step lies where Vidur's A100 attention profile has
measurements (decode contexts up to 1,344 with batches up to 128; prefill chunks with no
cached context, or of 1,024 tokens or more); elsewhere Vidur's random forests extrapolate
(a forest repeats its nearest profiled value).
"""

from __future__ import annotations

import sys

GRID_PREFILLS = [128, 256, 512, 1024, 2048, 4096, 8192]
GRID_DECODES = [1, 8, 32, 64, 128, 256]
GRID_CONTEXTS = [128, 512, 1024, 2048, 4096]
KV_CAPACITY = 420_000  # tokens an A100-80GB holds after Llama-3-8B's weights
MIXED = [  # (prefills, decodes, decode_context)
    ([(0, 512)], 31, 640),
    ([(0, 512)], 127, 640),
    ([(0, 1024)], 63, 1024),
    ([(0, 2048)], 127, 512),
    ([(0, 256)], 255, 640),
    ([(1024, 512)], 64, 2048),
    ([(0, 512), (0, 512)], 200, 700),
    ([(2048, 2048)], 16, 4096),
    ([(0, 4096)], 32, 1024),
    ([(0, 128)], 8, 128),
]


def grid() -> list[tuple[list[tuple[int, int]], int, int]]:
    steps: list[tuple[list[tuple[int, int]], int, int]] = []
    steps += [([(0, n)], 0, 0) for n in GRID_PREFILLS]
    steps += [([(4096, 1024)], 0, 0), ([(2048, 512)], 0, 0)]
    for b in GRID_DECODES:
        for c in GRID_CONTEXTS:
            if b * (c + 1) <= KV_CAPACITY:
                steps.append(([], b, c))
    return steps + MIXED


def in_profile(prefills: list[tuple[int, int]], b: int, c: int) -> bool:
    """Whether Vidur's attention profile covers the step (see the module docs)."""
    decode_ok = b == 0 or (b <= 128 and c + 1 <= 1344)
    return decode_ok and all(cached == 0 or n >= 1024 for cached, n in prefills)


def main(cache: str) -> None:
    from vidur.config import SimulationConfig
    from vidur.entities import Batch, Request
    from vidur.execution_time_predictor import ExecutionTimePredictorRegistry

    sys.argv = [
        "vidur", "--replica_config_model_name", "meta-llama/Llama-3-8B",
        "--replica_config_device", "a100", "--replica_config_network_device", "a100_dgx",
        "--replica_config_tensor_parallel_size", "1", "--replica_config_num_pipeline_stages", "1",
        "--execution_time_predictor_config_type", "random_forrest",
        "--random_forrest_execution_time_predictor_config_model_profiling_dataset",
        "local/llama-3-8b-a100",
        "--random_forrest_execution_time_predictor_config_network_profiling_dataset",
        "local/a100-dgx",
        "--random_forrest_execution_time_predictor_config_cache_dir", cache,
        "--random_forrest_execution_time_predictor_config_num_estimators", "250",
        "--random_forrest_execution_time_predictor_config_max_depth", "16",
        "--random_forrest_execution_time_predictor_config_min_samples_split", "2",
        "--random_forrest_execution_time_predictor_config_prediction_max_batch_size", "512",
        "--random_forrest_execution_time_predictor_config_prediction_max_prefill_chunk_size",
        "8192",
        "--random_forrest_execution_time_predictor_config_prediction_max_tokens_per_request",
        "16384",
        "--metrics_config_output_dir", "/tmp/vidur-steps",
    ]  # fmt: skip
    config = SimulationConfig.create_from_cli_args()
    pred = ExecutionTimePredictorRegistry.get(
        config.execution_time_predictor_config.get_type(),
        predictor_config=config.execution_time_predictor_config,
        replica_config=config.cluster_config.replica_config,
        cache_config=config.cluster_config.cache_config,
    )
    print("# Vidur 0.0.26 random_forrest predictor, A100-80GB, meta-llama/Llama-3-8B, TP 1,")
    print("# trained on ../shared/data/vidur-a100-llama3-8b (tools/vidur/vidur_steps.py)")
    print("prefills,decodes,decode_context,in_profile,vidur_ms")
    for prefills, b, c in grid():
        q = [n for _, n in prefills] + [1] * b
        # Vidur's num_kv_tokens: the context after this step's tokens
        kv = [cached + n for cached, n in prefills] + [c + 1] * b
        reqs = [Request(0.0, max(1, n), 1) for n in q]
        batch = Batch(0, reqs, q, kv)
        ms = pred.get_execution_time(batch, 0).total_time * 1e3
        spec = " ".join(f"{cached}:{n}" for cached, n in prefills)
        print(f"{spec},{b},{c},{int(in_profile(prefills, b, c))},{ms:.4f}")


if __name__ == "__main__":
    main(sys.argv[1])
