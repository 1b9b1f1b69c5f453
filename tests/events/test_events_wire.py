"""Wire bytes of KV event batches against vLLM 0.33.0's encoder (and, live, the installed
vLLM's: byte for byte on 0.33, decoded events on 0.32, whose `BlockStored` has one field
less).

tests/data/events_{map,array}.bin were written by tools/gen_event_fixtures.py with the
oracle: vLLM's KVCacheManager over a small trace (hybrid full + sliding-window groups,
LoRA, cache salt, multimodal, sessions, evictions, a reset) and one offloading tier's
`BlockStored` with locality, ownership and lookahead tokens, encoded by msgspec.
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
    for name in ("locality", "ownership", "session_id", "lookahead_token_ids"):
        assert any(e[name] is not None for e in stored), name
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
        (BlockRemoved([1], "GPU", 0, locality="LOCAL"), ValueError),
        (
            BlockStored([1], None, [1], 2, None, "GPU", None, group_idx=0, session_id=3),
            TypeError,
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


def test_live_trace_bytes_equal_vllm() -> None:
    """The fixture trace, replayed on vLLM's KVCacheManager and on kvblocks': every step's
    events encode to the same bytes as vLLM's encoder gives for its own events."""
    pytest.importorskip("vllm")
    torch = pytest.importorskip("torch")
    import msgspec
    from vllm.distributed import kv_events as ke
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1 import kv_cache_interface as vi
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    bs, sw = 4, 8
    init_none_hash(get_hash_fn_by_name("sha256"))
    vhasher = get_request_block_hasher(bs, get_hash_fn_by_name("sha256"))
    common = {"block_size": bs, "num_kv_heads": 1, "head_size": 8, "dtype": torch.float16}
    vm = KVCacheManager(
        kv_cache_config=vi.KVCacheConfig(
            num_blocks=24,
            kv_cache_tensors=[],
            kv_cache_groups=[
                vi.KVCacheGroupSpec(["l0"], vi.FullAttentionSpec(**common)),
                vi.KVCacheGroupSpec(["l1"], vi.SlidingWindowSpec(sliding_window=sw, **common)),
            ],
        ),
        max_model_len=256,
        scheduler_block_size=bs,
        hash_block_size=bs,
        enable_kv_cache_events=True,
    )
    kcommon: dict[str, Any] = {
        "block_size": bs,
        "num_kv_heads": 1,
        "head_size": 8,
        "dtype": "float16",
    }
    kconfig = kvblocks.KVCacheConfig(
        24,
        [],
        [
            kvblocks.KVCacheGroupSpec(["l0"], kvblocks.FullAttentionSpec(**kcommon)),
            kvblocks.KVCacheGroupSpec(
                ["l1"], kvblocks.SlidingWindowSpec(sliding_window=sw, **kcommon)
            ),
        ],
    )
    km = kvblocks.KVCacheManager(kconfig, 256, bs, enable_kv_cache_events=True)
    khasher = kvblocks.BlockHasher(bs, "sha256")
    mm = MultiModalFeatureSpec(
        data=None, modality="image", identifier="img-abc", mm_position=PlaceholderRange(2, 6)
    )
    big = 70000
    specs: list[tuple[str, list[int], dict[str, Any], dict[str, Any]]] = [
        ("plain", list(range(1, 14)), {"session_id": "chat-1"}, {"session_id": "chat-1"}),
        ("shared", [*range(1, 9), big, 300, 301, 302], {}, {}),
        (
            "lora",
            list(range(1, 11)),
            {"lora_request": LoRARequest("adapter-x", 7, "/p")},
            {"lora_name": "adapter-x", "lora_path": "/p", "lora_id": 7},
        ),
        ("salt", list(range(1, 10)), {"cache_salt": "s" * 40}, {"cache_salt": "s" * 40}),
        ("mm", [5] * 12, {"mm_features": [mm]}, {"mm_features": [("img-abc", 2, 6)]}),
        ("long", list(range(500, 540)), {}, {}),
        ("again", [*range(1, 14), 9, 9, 9], {}, {}),
    ]
    encoder = msgspec.msgpack.Encoder()
    twins = {
        c.__name__: msgspec.defstruct(
            c.__name__,
            [
                (f.name, f.type) if f.default is msgspec.NODEFAULT else (f.name, f.type, f.default)
                for f in msgspec.structs.fields(c)
            ],
            array_like=True,
            omit_defaults=True,
            tag=True,
        )
        for c in (ke.BlockStored, ke.BlockRemoved, ke.AllBlocksCleared)
    }
    compared = sessions = 0
    # kvblocks' encoder writes vLLM 0.33's `BlockStored` (15 fields, `lookahead_token_ids`
    # last). vLLM 0.32's has 14: msgspec gives it a fixmap header instead of a map16, and
    # one array element less; its decoder reads kvblocks' map bytes as the same events.
    same_layout = "lookahead_token_ids" in ke.BlockStored.__struct_fields__
    decoder = msgspec.msgpack.Decoder(ke.KVEventBatch)

    def compare(ts: float) -> None:
        nonlocal compared, sessions
        vev, kev = vm.take_events(), km.take_events()
        assert len(vev) == len(kev)
        if not vev:
            return
        sessions += sum(getattr(e, "session_id", None) is not None for e in kev)
        want_map = encoder.encode(ke.KVEventBatch(ts=ts, events=vev))
        arr = [twins[type(e).__name__](**msgspec.structs.asdict(e)) for e in vev]
        want_array = encoder.encode(ke.KVEventBatch(ts=ts, events=arr))
        got_map = kvblocks.encode_event_batch(ts, kev)
        if same_layout:
            assert got_map == want_map
            assert kvblocks.encode_event_batch(ts, kev, format="array") == want_array
        else:  # what a consumer of this vLLM reads from kvblocks' bytes: the same events
            assert decoder.decode(got_map) == decoder.decode(want_map)
        compared += len(vev)

    for i, (rid, tokens, vkw, kkw) in enumerate(specs):
        v = Request(rid, tokens, SamplingParams(max_tokens=4), None, block_hasher=vhasher, **vkw)
        k = kvblocks.Request(rid, tokens, khasher, **kkw)
        vblocks, vhit, _ = vm.get_computed_blocks(v)
        kblocks, khit = km.get_computed_blocks(k)
        assert vhit == khit
        assert vm.allocate_slots(v, v.num_tokens - vhit, vhit, vblocks) is not None
        assert km.allocate_slots(k, k.num_tokens - khit, khit, kblocks) is not None
        compare(float(i))
        vm.free(v)
        km.free(k)
        compare(i + 0.5)
    assert vm.reset_prefix_cache() and km.reset_prefix_cache()
    compare(100.0)
    assert compared > 40
    assert sessions > 0
