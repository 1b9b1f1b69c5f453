"""What publishing KV events costs the scheduler thread, and how fast events encode.

    python benches/python/bench_publish.py [--steps 200]

Each step admits a new 999-block request (16 tokens a block) into a kvblocks
KVCacheManager (events on) whose free blocks are all cached, so it evicts 999 cached
blocks (one BlockRemoved each) and caches its own (one BlockStored); then it finishes:
1,000 events per step, a scheduler step of heavy cache churn. Reported, per step (median
and p99):

- publish_from: the scheduler thread moves the manager's pending events into the
  publisher queue (no Python object per event);
- baseline, same events: take_events() (Python event objects) + publish(list), the path a
  Python scheduler would take without publish_from.

Then the network side's throughput: next_payload (pop, encode in Rust without the GIL,
copy into bytes) in events/s; and encode_event_batch over Python event objects, next to
msgspec on vLLM's own structs when vLLM is importable (baseline, same events).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import kvblocks as kb

BS = 16
BLOCKS_PER_STEP = 999


class Traffic:
    """A manager whose free blocks are all cached; each step evicts and re-caches 999."""

    def __init__(self) -> None:
        spec = kb.FullAttentionSpec(block_size=BS, num_kv_heads=8, head_size=128, dtype="bfloat16")
        config = kb.KVCacheConfig(BLOCKS_PER_STEP + 2, [], [kb.KVCacheGroupSpec(["l0"], spec)])
        self.mgr = kb.KVCacheManager(config, 1 << 20, BS, enable_kv_cache_events=True)
        self.hasher = kb.BlockHasher(BS, "sha256")
        self.n = 0

    def step(self) -> None:
        base = self.n * BLOCKS_PER_STEP * BS
        self.n += 1
        # one trailing token so all 999 blocks are full and computed
        tokens = [(base + t) % 100_000 for t in range(BLOCKS_PER_STEP * BS + 1)]
        req = kb.Request(f"r{self.n}", tokens, self.hasher)
        blocks, hit = self.mgr.get_computed_blocks(req)
        if self.mgr.allocate_slots(req, req.num_tokens - hit, hit, blocks) is None:
            raise RuntimeError("allocation failed")
        self.mgr.free(req)


def _time_steps(steps: int, traffic: Traffic, publish: Callable[[], Any]) -> list[float]:
    out = []
    for _ in range(steps):
        traffic.step()
        t0 = time.perf_counter_ns()
        publish()
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


def _summary(name: str, us: list[float], events: int) -> None:
    us = sorted(us)
    p99 = us[min(len(us) - 1, round(0.99 * (len(us) - 1)))]
    print(
        f"{name:<44} median {statistics.median(us):9.2f} us  p99 {p99:9.2f} us  "
        f"({events} events/step)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()

    traffic = Traffic()
    traffic.step()
    traffic.step()
    traffic.mgr.take_events()

    sink = kb.EventSink(max_queue_size=args.steps * 2 + 8)
    fast = _time_steps(args.steps, traffic, lambda: sink.publish_from(traffic.mgr))
    per_step = sink.stats()["pushed_events"] // args.steps
    _summary("publish_from(manager)", fast, per_step)

    base_sink = kb.EventSink(max_queue_size=args.steps * 2 + 8)
    slow = _time_steps(args.steps, traffic, lambda: base_sink.publish(traffic.mgr.take_events()))
    _summary("baseline: publish(manager.take_events())", slow, per_step)
    print(
        f"publish_from is {statistics.median(slow) / statistics.median(fast):.0f}x cheaper "
        "than the baseline (medians)"
    )

    for fmt in ("map", "array"):
        enc = kb.EventSink(max_queue_size=args.steps + 8, format=fmt)
        for _ in range(args.steps):
            traffic.step()
            enc.publish_from(traffic.mgr)
        t0 = time.perf_counter()
        n_bytes = 0
        while (item := enc.next_payload(0.0)) is not None:
            n_bytes += len(item[1])
        dt = time.perf_counter() - t0
        n = enc.stats()["published_events"]
        print(
            f"network side next_payload ({fmt}): {n / dt / 1e6:6.2f} M events/s, "
            f"{n_bytes / n:.0f} B/event"
        )

    traffic.step()
    events = traffic.mgr.take_events()
    reps = 20
    t0 = time.perf_counter()
    for _ in range(reps):
        kb.encode_event_batch(1.0, events, 0)
    ours = reps * len(events) / (time.perf_counter() - t0)
    print(f"encode_event_batch(Python events):        {ours / 1e6:6.2f} M events/s")
    try:
        import msgspec
        from vllm.distributed import kv_events as ke
    except ImportError:
        print("(vLLM not importable: no msgspec baseline)")
        return
    theirs_events = [_vllm_event(ke, e) for e in events]
    batch = ke.KVEventBatch(ts=1.0, events=theirs_events, data_parallel_rank=0)
    encoder = msgspec.msgpack.Encoder()
    if encoder.encode(batch) != kb.encode_event_batch(1.0, events, 0):
        raise AssertionError("bytes differ from vLLM's")
    t0 = time.perf_counter()
    for _ in range(reps):
        encoder.encode(batch)
    theirs = reps * len(events) / (time.perf_counter() - t0)
    print(f"baseline msgspec on vLLM structs:         {theirs / 1e6:6.2f} M events/s")


def _vllm_event(ke: Any, e: Any) -> Any:
    name = type(e).__name__
    if name == "AllBlocksCleared":
        return ke.AllBlocksCleared()
    cls = getattr(ke, name)
    fields = cls.__struct_fields__
    return cls(**{f: getattr(e, f) for f in fields})


if __name__ == "__main__":
    main()
