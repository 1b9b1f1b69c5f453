"""Wire bytes of KV event batches against vLLM 0.33.0's encoder.

tests/data/events_{map,array}.bin were written by tools/gen_event_fixtures.py with the
oracle: vLLM's KVCacheManager over a small trace (hybrid full + sliding-window groups,
LoRA, cache salt, multimodal, evictions, a reset), encoded by msgspec.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import kvblocks

DATA = Path(__file__).parent / "data"


# Stand-ins with vLLM's class names and fields: the encoder reads events by attribute.
@dataclass
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


@dataclass
class BlockRemoved:
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


@dataclass
class AllBlocksCleared:
    pass


def _from_json(value: Any) -> Any:
    if isinstance(value, dict):
        return bytes.fromhex(value["bytes"])
    if isinstance(value, list):
        return tuple(_from_json(v) for v in value)
    return value


def _event(d: dict[str, Any]) -> object:
    fields = {k: v for k, v in d.items() if k != "type"}
    if d["type"] == "BlockStored" and fields["extra_keys"] is not None:
        fields["extra_keys"] = [
            None if keys is None else _from_json(keys) for keys in fields["extra_keys"]
        ]
    cls = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved}.get(d["type"])
    return AllBlocksCleared() if cls is None else cls(**fields)


def _payloads(name: str) -> list[bytes]:
    blob = (DATA / f"events_{name}.bin").read_bytes()
    out = []
    while blob:
        n = int.from_bytes(blob[:4], "big")
        out.append(blob[4 : 4 + n])
        blob = blob[4 + n :]
    return out


def _steps() -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = json.loads((DATA / "events_trace.json").read_text())["steps"]
    return steps


def test_fixture_covers_every_event_kind_and_field() -> None:
    events = [e for s in _steps() for e in s["events"]]
    assert {e["type"] for e in events} == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
    stored = [e for e in events if e["type"] == "BlockStored"]
    assert any(e["lora_name"] for e in stored)
    assert any(e["kv_cache_spec_sliding_window"] for e in stored)
    assert any(e["parent_block_hash"] is not None for e in stored)
    assert any(k is not None for e in stored for k in e["extra_keys"])
    assert {s["data_parallel_rank"] for s in _steps()} >= {None, 0}


@pytest.mark.parametrize("fmt", ["map", "array"])
def test_bytes_equal_vllm(fmt: str) -> None:
    steps = _steps()
    expected = _payloads(fmt)
    assert len(expected) == len(steps)
    for step, want in zip(steps, expected, strict=True):
        events = [_event(e) for e in step["events"]]
        got = kvblocks.encode_event_batch(
            step["ts"], events, step["data_parallel_rank"], format=fmt
        )
        assert got == want


def test_sink_payloads_equal_vllm() -> None:
    """The publisher path (queue, then encoder) produces the same bytes, seq 0, 1, ..."""
    sink = kvblocks.EventSink(format="map", data_parallel_rank=None)
    steps = _steps()
    for step in steps:
        sink.publish([_event(e) for e in step["events"]], step["ts"], step["data_parallel_rank"])
    got = []
    while (item := sink.next_payload(0.0)) is not None:
        got.append(item)
    assert [seq for seq, _ in got] == list(range(len(steps)))
    assert [p for _, p in got] == _payloads("map")


def test_decodes_with_msgpack() -> None:
    msgpack = pytest.importorskip("msgpack")
    stored = BlockStored([2**64 - 1], None, [1, 70000], 2, 5, "GPU", "lx", [("lx", b"\x01")], 0)
    ts, events, rank = msgpack.unpackb(
        kvblocks.encode_event_batch(3.5, [stored, AllBlocksCleared()], 4, format="array")
    )
    assert (ts, rank) == (3.5, 4)
    assert events[0][:10] == ["BlockStored", [2**64 - 1], None, [1, 70000], 2, 5, "GPU", "lx",
                              [["lx", b"\x01"]], 0]
    assert events[1] == ["AllBlocksCleared"]


@pytest.mark.parametrize(
    ("event", "exc"),
    [
        (BlockRemoved([-1], "GPU", 0), OverflowError),
        (BlockRemoved([1], "DISK", 0), ValueError),
        (BlockRemoved([1], "GPU", None), ValueError),
        (BlockStored([1], None, [1], 2, None, "GPU", None, session_id="s", group_idx=0), ValueError),
        (BlockStored([1], None, [1], 2, None, "GPU", None, [(1.5,)], 0), TypeError),
        (BlockStored([1], None, [1], 2, None, "GPU", None, None, 0, "bogus"), ValueError),
        (object(), TypeError),
    ],
)
def test_bad_events_raise(event: object, exc: type[Exception]) -> None:
    sink = kvblocks.EventSink()
    with pytest.raises(exc):
        kvblocks.encode_event_batch(0.0, [event])
    with pytest.raises(exc):
        sink.publish([AllBlocksCleared(), event])
    assert sink.stats()["pushed_batches"] == 0


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="format"):
        kvblocks.encode_event_batch(0.0, [], format="json")
    with pytest.raises(ValueError):
        kvblocks.EventSink(max_queue_size=0)
    with pytest.raises(ValueError):
        kvblocks.EventSink().next_payload(-1.0)
