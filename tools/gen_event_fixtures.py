"""Generate KV-event wire fixtures with the vLLM 0.33.0 oracle.

Run in the vLLM 0.33 venv, .venv-vllm-0.33 (it needs vllm, msgspec and torch):

    .venv-vllm-0.33/bin/python tools/gen_event_fixtures.py tests/data

It replays a small trace through vLLM's own KVCacheManager (a full-attention group and a
sliding-window group, few blocks so blocks get evicted, requests with LoRA, cache salt,
multimodal inputs and sessions, a prefix-cache reset), takes the events after every step,
adds one batch of a `BlockStored` as an offloading tier with hash lookahead publishes it
(`locality`, `ownership`, `session_id`, `lookahead_token_ids`), and writes:

- events_trace.json: per step, ts, data_parallel_rank and the events as plain JSON
  (bytes as {"bytes": hex}, tuples as lists);
- events_map.bin / events_array.bin: the payloads, each prefixed by its length as a
  4-byte big-endian integer. "map" is vLLM 0.33.0's own encoder on its KVEventBatch;
  "array" is msgspec on the same structs declared with array_like=True (the tagged
  positional form of vLLM before June 2026).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import torch
from vllm.distributed import kv_events as ke
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request

BLOCK_SIZE = 4


class _ArrayEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


def _array_twin(cls: type[msgspec.Struct]) -> type[msgspec.Struct]:
    """The same struct (name, fields, defaults) declared with array_like=True."""
    fields = []
    for f in msgspec.structs.fields(cls):
        if f.default is msgspec.NODEFAULT:
            fields.append((f.name, f.type))
        else:
            fields.append((f.name, f.type, f.default))
    return msgspec.defstruct(cls.__name__, fields, bases=(_ArrayEvent,), tag=cls.__name__)


ARRAY_TWINS = {
    c.__name__: _array_twin(c) for c in (ke.BlockStored, ke.BlockRemoved, ke.AllBlocksCleared)
}


def as_array_form(event: Any) -> Any:
    twin = ARRAY_TWINS[type(event).__name__]
    return twin(**msgspec.structs.asdict(event))


def to_json(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, str):  # str enums (KVCacheSpecKind) included
        return str(value.value) if hasattr(value, "value") else value
    return value


def event_json(event: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(event).__name__}
    for name, value in msgspec.structs.asdict(event).items():
        out[name] = to_json(value)
    return out


def main(out_dir: Path) -> None:
    init_none_hash(get_hash_fn_by_name("sha256"))
    hasher = get_request_block_hasher(BLOCK_SIZE, get_hash_fn_by_name("sha256"))
    common = dict(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8, dtype=torch.float16)
    config = KVCacheConfig(
        num_blocks=24,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["l0"], FullAttentionSpec(**common)),
            KVCacheGroupSpec(["l1"], SlidingWindowSpec(sliding_window=8, **common)),
        ],
    )
    km = KVCacheManager(
        kv_cache_config=config,
        max_model_len=256,
        scheduler_block_size=BLOCK_SIZE,
        hash_block_size=BLOCK_SIZE,
        enable_caching=True,
        enable_kv_cache_events=True,
    )

    def request(rid: str, tokens: list[int], **kw: Any) -> Request:
        return Request(
            request_id=rid,
            prompt_token_ids=tokens,
            sampling_params=SamplingParams(max_tokens=4),
            pooling_params=None,
            block_hasher=hasher,
            **kw,
        )

    mm = [
        MultiModalFeatureSpec(
            data=None,
            modality="image",
            identifier="img-abc",
            mm_position=PlaceholderRange(offset=2, length=6),
        )
    ]
    big = 70000  # a token id needing a uint32, hashes up to 2**64 - 1 come for free
    requests = [
        request("plain", list(range(1, 14)), session_id="chat-1"),
        request("shared", [*range(1, 9), big, 300, 301, 302], session_id="chat-2"),
        request("lora", list(range(1, 11)), lora_request=LoRARequest("adapter-x", 7, "/p")),
        request("salt", list(range(1, 10)), cache_salt="s" * 40),
        request("mm", [5] * 12, mm_features=mm),
        request("long", list(range(500, 540))),
    ]

    steps: list[dict[str, Any]] = []
    map_payloads: list[bytes] = []
    array_payloads: list[bytes] = []
    encoder = msgspec.msgpack.Encoder()

    def flush(dp_rank: int | None, events: list[Any] | None = None) -> None:
        events = km.take_events() if events is None else events
        if not events:
            return
        ts = 1_700_000_000.0 + len(steps) * 0.125
        batch = ke.KVEventBatch(ts=ts, events=events, data_parallel_rank=dp_rank)
        map_payloads.append(encoder.encode(batch))
        twin = ke.KVEventBatch(
            ts=ts, events=[as_array_form(e) for e in events], data_parallel_rank=dp_rank
        )
        array_payloads.append(encoder.encode(twin))
        steps.append(
            {"ts": ts, "data_parallel_rank": dp_rank, "events": [event_json(e) for e in events]}
        )

    for i, req in enumerate(requests):
        blocks, hit, _ = km.get_computed_blocks(req)
        out = km.allocate_slots(req, req.num_tokens - hit, hit, blocks)
        if out is None:
            raise RuntimeError(f"allocation failed for {req.request_id}")
        req.num_computed_tokens = req.num_tokens
        flush(None if i % 2 else 0)
        km.free(req)
        flush(3 if i % 3 == 0 else None)
    # a second round: prefix hits and evictions of earlier blocks
    again = request("again", [*range(1, 14), 9, 9, 9])
    blocks, hit, _ = km.get_computed_blocks(again)
    km.allocate_slots(again, again.num_tokens - hit, hit, blocks)
    flush(None)
    km.free(again)
    if not km.reset_prefix_cache():
        raise RuntimeError("reset failed")
    flush(None)
    after = request("after", list(range(800, 812)))
    blocks, hit, _ = km.get_computed_blocks(after)
    km.allocate_slots(after, after.num_tokens - hit, hit, blocks)
    flush(1)
    tier_event = ke.BlockStored(
        block_hashes=[2**64 - 1, 7],
        parent_block_hash=5,
        token_ids=list(range(8)),
        block_size=BLOCK_SIZE,
        lora_id=None,
        medium=ke.MEDIUM_CPU,
        lora_name=None,
        extra_keys=[None, None],
        group_idx=0,
        locality="REMOTE",
        ownership="kvcr",
        session_id="chat-3",
        lookahead_token_ids=[[4, 5], [big, 9]],
    )
    flush(None, [tier_event])

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "events_trace.json").write_text(json.dumps({"steps": steps}, indent=1) + "\n")
    for name, payloads in (("map", map_payloads), ("array", array_payloads)):
        blob = b"".join(len(p).to_bytes(4, "big") + p for p in payloads)
        (out_dir / f"events_{name}.bin").write_bytes(blob)
    kinds: dict[str, int] = {}
    for step in steps:
        for e in step["events"]:
            kinds[e["type"]] = kinds.get(e["type"], 0) + 1
    print(f"{len(steps)} batches, events by type: {kinds}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data"))
