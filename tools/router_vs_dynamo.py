"""kvblocks.router.KVIndex beside Dynamo's standalone KV indexer (`ai-dynamo` 1.6.1,
`python -m dynamo.indexer`), on the same ZMQ event streams and the same prompts.

    python tools/router_vs_dynamo.py --dynamo-python /path/to/py310-venv/bin/python

N engines (kvblocks managers, events on) publish through kvblocks' `ZmqEventPublisher`
(vLLM's wire format) on loopback; Dynamo's indexer and a `KVIndex` + `Subscriber`
subscribe to every one. Then:

1. speed: every engine caches a 32k-token prompt (2,048 blocks of 16); the median time of
   a query of that prompt, `KVIndex.hits` (a Python call) against Dynamo's HTTP `/query`
   (which adds an HTTP round trip: timed alone on `/health` and reported);
2. exactness, each case against the engines' own `get_computed_blocks`: a hash cached in
   two blocks and removed once; a salted prompt queried without its salt; a prompt cached
   in a sliding-window group only.

A development tool (not part of the tests): it needs the Dynamo venv (Python 3.10).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
import urllib.request
from typing import Any

import kvblocks as kb
from kvblocks.events import ZmqEventPublisher
from kvblocks.router import KVIndex, Subscriber

BS = 16


def spec() -> kb.FullAttentionSpec:
    return kb.FullAttentionSpec(block_size=BS, num_kv_heads=8, head_size=128, dtype="bfloat16")


def post(port: int, path: str, body: Any) -> Any:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def dynamo_scores(port: int, tokens: list[int], **kw: Any) -> dict[int, int]:
    """Dynamo's score per worker, in tokens."""
    out = post(port, "/query", {"token_ids": tokens, "model_name": "default", **kw})
    scores = out.get("scores", out)
    flat: dict[int, int] = {}
    for k, v in scores.items():
        while isinstance(v, dict):  # {worker: {dp_rank: score}}
            v = max(v.values(), default=0)
        flat[int(str(k).split(":")[0])] = int(v)
    return flat


def median_us(fn: Any, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dynamo-python", required=True)
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--port", type=int, default=18090)
    ap.add_argument("--zmq-port", type=int, default=18500)
    ap.add_argument("--rounds", type=int, default=21)
    args = ap.parse_args()

    n = args.engines
    config = kb.KVCacheConfig(4096, [], [kb.KVCacheGroupSpec(["a"], spec())])
    pubs, mgrs = [], []
    index = KVIndex()
    sub = Subscriber(index)
    for i in range(n):
        ep = f"tcp://127.0.0.1:{args.zmq_port + i}"
        pubs.append(ZmqEventPublisher(0, ep, bind=True))
        mgrs.append(kb.KVCacheManager(config, 40_000, BS, enable_kv_cache_events=True))
        index.add_engine(f"{i + 1}", config, max_model_len=40_000, hash_block_size=BS)
        sub.add(f"{i + 1}", ep)
    workers = ",".join(f"{i + 1}=tcp://127.0.0.1:{args.zmq_port + i}" for i in range(n))
    dyn = subprocess.Popen(
        [
            args.dynamo_python,
            "-m",
            "dynamo.indexer",
            "--block-size",
            str(BS),
            "--port",
            str(args.port),
            "--workers",
            workers,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=1)
                break
            except Exception:
                time.sleep(0.2)
        time.sleep(1.0)
        hasher = kb.BlockHasher(BS, "sha256_cbor")
        prompt = [(t * 7919) % 50_000 for t in range(32 * 1024 + 1)]

        def serve(i: int, rid: str, tokens: list[int], **kw: Any) -> None:
            req = kb.Request(rid, tokens, hasher, **kw)
            blocks, hit = mgrs[i].get_computed_blocks(req)
            mgrs[i].allocate_slots(req, len(tokens) - hit, hit, blocks)
            pubs[i].publish_from(mgrs[i])
            req.num_computed_tokens = len(tokens)
            mgrs[i].free(req)

        def settle() -> None:
            quiet = time.monotonic()
            while time.monotonic() - quiet < 1.0:
                if sub.poll(50):
                    quiet = time.monotonic()

        for i in range(n):
            serve(i, f"big{i}", prompt)
        settle()
        time.sleep(2.0)
        ours = index.hits(prompt)
        theirs = dynamo_scores(args.port, prompt)
        print(f"{n} engines; 32k-token prompt held by all:")
        print(f"  kvblocks hits (tokens):  {sorted({h.gpu_tokens for h in ours.values()})}")
        print(f"  Dynamo scores (tokens):  {sorted(set(theirs.values()))}")
        t_ours = median_us(lambda: index.hits(prompt), args.rounds)
        t_theirs = median_us(lambda: dynamo_scores(args.port, prompt), args.rounds)
        t_http = median_us(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health").read(),
            args.rounds,
        )
        print(
            f"  query: kvblocks {t_ours:.0f} us, Dynamo /query {t_theirs:.0f} us "
            f"(its HTTP round trip alone: {t_http:.0f} us)"
        )

        # Exactness cases, on engine 1 (index "1", Dynamo worker 1).
        cases = []
        salted = [(t * 31) % 50_000 for t in range(200)]
        serve(0, "salted", salted, cache_salt="tenant-a")
        settle()
        time.sleep(1.0)
        want = mgrs[0].get_computed_blocks(kb.Request("q", salted, hasher))[1]
        cases.append(
            (
                "salted prompt queried without its salt",
                want,
                index.hits(salted)["1"].gpu_tokens,
                dynamo_scores(args.port, salted).get(1, 0),
            )
        )
        dup = [(t * 13) % 50_000 for t in range(4 * BS)]
        serve(1, "d1", dup)  # caches 4 blocks
        serve(1, "d2", dup)  # hit capped at 63 tokens: the last block is cached again
        settle()
        time.sleep(1.0)
        # evict the first copy of the last block: vLLM still holds the second
        pool = mgrs[1].block_pool
        last = kb.Request("x", dup, hasher).block_hashes[3]
        copies = [b for b in range(1, 4096) if pool.get_block_hash(b) == last]
        assert len(copies) == 2, copies
        mgrs[1].evict_blocks([copies[0]])
        pubs[1].publish_from(mgrs[1])
        settle()
        time.sleep(1.0)
        probe = [*dup, 2]
        want = mgrs[1].get_computed_blocks(kb.Request("q2", probe, hasher))[1]
        cases.append(
            (
                "a hash in two blocks, one evicted",
                want,
                index.hits(probe)["2"].gpu_tokens,
                dynamo_scores(args.port, probe).get(2, 0),
            )
        )
        print("exactness (tokens: engine's get_computed_blocks / kvblocks / Dynamo):")
        for name, want, got, dyn_got in cases:
            print(f"  {name}: {want} / {got} / {dyn_got}")
    finally:
        dyn.terminate()
        sub.stop()
        for p in pubs:
            p.shutdown()


if __name__ == "__main__":
    main()
