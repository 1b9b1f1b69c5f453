"""Wire bytes of KV event batches against vLLM 0.33.0's encoder.

tests/data/events_{map,array}.bin were written by tools/gen_event_fixtures.py with the
oracle: vLLM's KVCacheManager over a small trace (hybrid full + sliding-window groups,
LoRA, cache salt, multimodal, evictions, a reset), encoded by msgspec.
"""

from __future__ import annotations

from typing import Any

import kvblocks
import pytest
from event_fixtures import AllBlocksCleared, BlockRemoved, BlockStored, event, payloads, steps


def test_fixture_covers_every_event_kind_and_field() -> None:
    events = [e for s in steps() for e in s["events"]]
    assert {e["type"] for e in events} == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
    stored = [e for e in events if e["type"] == "BlockStored"]
    assert any(e["lora_name"] for e in stored)
    assert any(e["kv_cache_spec_sliding_window"] for e in stored)
    assert any(e["parent_block_hash"] is not None for e in stored)
    assert any(k is not None for e in stored for k in e["extra_keys"])
    assert {s["data_parallel_rank"] for s in steps()} >= {None, 0}


@pytest.mark.parametrize("classes", [None, kvblocks], ids=["stand-ins", "kvblocks"])
@pytest.mark.parametrize("fmt", ["map", "array"])
def test_bytes_equal_vllm(fmt: str, classes: Any) -> None:
    trace = steps()
    expected = payloads(fmt)
    assert len(expected) == len(trace)
    for step, want in zip(trace, expected, strict=True):
        events = [event(e, classes) for e in step["events"]]
        got = kvblocks.encode_event_batch(
            step["ts"], events, step["data_parallel_rank"], format=fmt
        )
        assert got == want


def test_sink_payloads_equal_vllm() -> None:
    """The publisher path (queue, then encoder) produces the same bytes, seq 0, 1, ..."""
    sink = kvblocks.EventSink(format="map", data_parallel_rank=None)
    trace = steps()
    for step in trace:
        sink.publish([event(e) for e in step["events"]], step["ts"], step["data_parallel_rank"])
    got = []
    while (item := sink.next_payload(0.0)) is not None:
        got.append(item)
    assert [seq for seq, _ in got] == list(range(len(trace)))
    assert [p for _, p in got] == payloads("map")


def test_decodes_with_msgpack() -> None:
    msgpack = pytest.importorskip("msgpack")
    stored = BlockStored([2**64 - 1], None, [1, 70000], 2, 5, "GPU", "lx", [("lx", b"\x01")], 0)
    ts, events, rank = msgpack.unpackb(
        kvblocks.encode_event_batch(3.5, [stored, AllBlocksCleared()], 4, format="array")
    )
    assert (ts, rank) == (3.5, 4)
    assert events[0][:10] == [
        "BlockStored",
        [2**64 - 1],
        None,
        [1, 70000],
        2,
        5,
        "GPU",
        "lx",
        [["lx", b"\x01"]],
        0,
    ]
    assert events[1] == ["AllBlocksCleared"]


@pytest.mark.parametrize(
    ("event", "exc"),
    [
        (BlockRemoved([-1], "GPU", 0), OverflowError),
        (BlockRemoved([1], "DISK", 0), ValueError),
        (BlockRemoved([1], "GPU", None), ValueError),
        (
            BlockStored([1], None, [1], 2, None, "GPU", None, session_id="s", group_idx=0),
            ValueError,
        ),
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


def _subscriber_decoder(array_like: bool) -> Any:
    """A decoder with the struct declarations of vLLM's example subscriber (only the first
    six BlockStored fields), for tagged arrays (before June 2026) or tagged maps (after)."""
    msgspec = pytest.importorskip("msgspec")
    opts = {"array_like": array_like, "omit_defaults": True, "tag": True}
    stored = msgspec.defstruct(
        "BlockStored",
        [
            ("block_hashes", list[int]),
            ("parent_block_hash", int | None),
            ("token_ids", list[int]),
            ("block_size", int),
            ("lora_id", int | None),
            ("medium", str | None),
        ],
        **opts,
    )
    removed = msgspec.defstruct(
        "BlockRemoved", [("block_hashes", list[int]), ("medium", str | None)], **opts
    )
    cleared = msgspec.defstruct("AllBlocksCleared", [], **opts)
    batch = msgspec.defstruct(
        "KVEventBatch",
        [("ts", float), ("events", list[stored | removed | cleared])],  # type: ignore[valid-type]
        array_like=True,
    )
    return msgspec.msgpack.Decoder(type=batch)


@pytest.mark.parametrize("fmt", ["map", "array"])
def test_example_subscriber_decodes(fmt: str) -> None:
    decoder = _subscriber_decoder(array_like=fmt == "array")
    for step in steps():
        events = [event(e) for e in step["events"]]
        batch = decoder.decode(kvblocks.encode_event_batch(step["ts"], events, format=fmt))
        assert batch.ts == step["ts"]
        assert [type(e).__name__ for e in batch.events] == [e["type"] for e in step["events"]]
        for got, want in zip(batch.events, step["events"], strict=True):
            assert getattr(got, "block_hashes", None) == want.get("block_hashes")
