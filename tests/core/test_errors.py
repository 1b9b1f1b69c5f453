"""One exception tree: every error kvblocks raises for bad input is a `kvblocks.KVBlocksError`
and still an instance of the builtin it raised before (vLLM's type in the same case)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kvblocks as kb
import pytest
from test_bad_input import BS, TABLE, World, config, full

# Each class of the tree and the builtin it also derives from.
CLASSES: list[tuple[type[kb.KVBlocksError], type[Exception]]] = [
    (kb.InvalidArgumentError, ValueError),
    (kb.OutOfBlocksError, ValueError),
    (kb.BlockOutOfRangeError, ValueError),
    (kb.DoubleFreeError, ValueError),
    (kb.UnknownAlgorithmError, ValueError),
    (kb.UnknownRequestError, KeyError),
    (kb.InvalidSpecError, ValueError),
    (kb.UnsupportedError, NotImplementedError),
    (kb.NotPinnedError, KeyError),
    (kb.InvalidTypeError, TypeError),
    (kb.IntOverflowError, OverflowError),
    (kb.BlockIndexError, IndexError),
    (kb.UnknownLayerError, KeyError),
]

# Rows of the bad-input table whose error Python or PyO3 raises before the core sees the
# call: argument conversion (wrong type, out of an integer range), read-only attributes,
# a request borrowed twice by one call.
CONVERSION_ERRORS = (TypeError, OverflowError, AttributeError, RuntimeError)


def test_base_class() -> None:
    assert issubclass(kb.KVBlocksError, Exception)
    assert not issubclass(
        kb.KVBlocksError,
        (ValueError, KeyError, NotImplementedError, TypeError, OverflowError, IndexError),
    )
    assert kb.KVBlocksError.__module__ == "kvblocks._core"
    assert kb.KVBlocksError.__doc__


@pytest.mark.parametrize(("cls", "builtin"), CLASSES, ids=[c.__name__ for c, _ in CLASSES])
def test_class_bases(cls: type[kb.KVBlocksError], builtin: type[Exception]) -> None:
    assert cls.__bases__ == (kb.KVBlocksError, builtin)
    assert issubclass(cls, kb.KVBlocksError) and issubclass(cls, builtin)
    assert cls.__module__ == "kvblocks._core" and cls.__doc__
    assert getattr(kb, cls.__name__) is cls
    assert cls.__name__ in kb.__all__
    err = cls("message")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and back.args == ("message",)
    with pytest.raises(builtin):
        raise err


def test_one_class_per_variant() -> None:
    """Every exported subclass is in CLASSES (one per `KvError` variant, and the binding
    layer's four)."""
    exported = {
        v
        for v in vars(kb).values()
        if isinstance(v, type) and issubclass(v, kb.KVBlocksError) and v is not kb.KVBlocksError
    }
    assert exported == {c for c, _ in CLASSES}


@pytest.mark.parametrize(("label", "call", "exc"), TABLE, ids=[row[0] for row in TABLE])
def test_bad_input_errors_are_kvblocks_errors(
    label: str, call: Callable[[World], Any], exc: type[Exception]
) -> None:
    """The bad-input table, swept: each row still raises its builtin type, and every error
    that is not an argument conversion is a KVBlocksError."""
    with pytest.raises(exc) as info:
        call(World())
    if exc in CONVERSION_ERRORS:
        return
    assert isinstance(info.value, kb.KVBlocksError), f"{label}: {info.value!r}"


def test_specific_classes() -> None:
    world = World()
    with pytest.raises(kb.OutOfBlocksError):
        world.pool.get_new_blocks(5)
    with pytest.raises(kb.DoubleFreeError):
        world.pool.free_blocks([world.free])
    with pytest.raises(kb.BlockOutOfRangeError):
        world.pool.touch([99])
    with pytest.raises(kb.UnknownAlgorithmError):
        kb.BlockHasher(BS, "md5")
    mgr = kb.KVCacheManager(config(full()), 64, BS)
    with pytest.raises(kb.UnknownRequestError):
        mgr.cache_blocks(kb.Request("stranger", list(range(2 * BS)), kb.BlockHasher(BS)), 2 * BS)
    with pytest.raises(kb.InvalidArgumentError):
        mgr.block_table(["x"], group_id=1)


def test_vllm_unsupported_config_error_is_in_the_tree() -> None:
    from kvblocks.vllm import UnsupportedConfigError

    assert issubclass(UnsupportedConfigError, kb.UnsupportedError)
    assert issubclass(UnsupportedConfigError, kb.KVBlocksError)
    assert issubclass(UnsupportedConfigError, NotImplementedError)


# --- Errors raised outside the core: the binding layer's own checks, kvblocks.device,
# kvblocks.events, kvblocks.metrics and kvblocks.sim.


def _vllm_like_request(**fields: Any) -> SimpleNamespace:
    """The attributes `RequestBlockHasher` reads from a vLLM `Request`."""
    base: dict[str, Any] = {
        "_all_token_ids": list(range(2 * BS)),
        "block_hashes": [],
        "lora_request": None,
        "cache_salt": None,
        "mm_features": [],
        "prompt_embeds": None,
    }
    return SimpleNamespace(**{**base, **fields})


def test_request_hasher_errors() -> None:
    from kvblocks._core import RequestBlockHasher

    with pytest.raises(kb.InvalidArgumentError, match="num_hash_lookahead_tokens"):
        RequestBlockHasher(BS, "sha256", -1)
    hasher = RequestBlockHasher(BS, "sha256")
    position = SimpleNamespace(offset=-1, length=2)
    feature = SimpleNamespace(mm_position=position, identifier="image")
    with pytest.raises(kb.InvalidArgumentError, match="mm_position"):
        hasher(_vllm_like_request(mm_features=[feature]))
    embeds = [[0.0]] * (2 * BS)
    with pytest.raises(kb.InvalidArgumentError, match="without tensor_data"):
        hasher(_vllm_like_request(prompt_embeds=embeds))
    odd = RequestBlockHasher(BS, "sha256", tensor_data=lambda _: b"odd")
    with pytest.raises(kb.InvalidArgumentError, match="rows"):
        odd(_vllm_like_request(prompt_embeds=embeds))
    with pytest.raises(kb.InvalidTypeError, match="cache_salt"):
        hasher(_vllm_like_request(cache_salt=3))
    with pytest.raises(kb.IntOverflowError):
        hasher(_vllm_like_request(_all_token_ids=[2**70] * (2 * BS)))


def test_binding_type_and_overflow_checks() -> None:
    mgr = kb.KVCacheManager(config(full()), 64, BS)
    request = kb.Request("r", list(range(2 * BS)), kb.BlockHasher(BS))
    with pytest.raises(kb.InvalidTypeError, match="new_computed_blocks"):
        mgr.allocate_slots(request, BS, 0, "not blocks")  # type: ignore[arg-type]
    with pytest.raises(kb.IntOverflowError, match="u32"):
        kb.Request("big", [2**40] * BS, kb.BlockHasher(BS))


def test_events_errors() -> None:
    from kvblocks.events import ZmqEventPublisher, offset_endpoint_port

    with pytest.raises(kb.InvalidArgumentError, match="endpoint"):
        offset_endpoint_port("ipc:///tmp/x", 1)
    with pytest.raises(kb.InvalidArgumentError, match="buffer_steps"):
        ZmqEventPublisher(buffer_steps=-1)


def test_metrics_errors() -> None:
    from kvblocks.metrics import KVCacheMetrics

    metrics = KVCacheMetrics()
    with pytest.raises(kb.InvalidArgumentError, match="usage"):
        metrics.observe(usage=2.0)
    counts = dict.fromkeys(
        ("queries", "hits", "preempted_requests", "preempted_queries", "preempted_hits"), 0
    )
    stats = SimpleNamespace(requests=-1, **counts)
    with pytest.raises(kb.InvalidArgumentError, match="non-negative"):
        metrics.observe(stats)


def test_sim_errors(tmp_path: Path) -> None:
    from kvblocks.sim import presets, workloads
    from kvblocks.sim.engine import ReplayError

    with pytest.raises(kb.InvalidArgumentError, match="unknown workload"):
        workloads.generate("nonsense")
    with pytest.raises(kb.InvalidArgumentError, match="memory size"):
        presets.parse_memory("lots")
    assert issubclass(workloads.TraceError, kb.InvalidArgumentError)
    assert issubclass(ReplayError, kb.KVBlocksError) and issubclass(ReplayError, RuntimeError)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[1, 2]\n")
    with pytest.raises(workloads.TraceError) as info:
        workloads.read_trace(str(bad))
    assert isinstance(info.value, kb.KVBlocksError) and isinstance(info.value, ValueError)


def test_device_errors() -> None:
    torch = pytest.importorskip("torch")
    from kvblocks.device import KVPages, block_table, slot_mapping

    spec = full()
    names = ["layer.0"]
    num_blocks = 8
    tensors = [kb.KVCacheTensor(num_blocks * spec.page_size_bytes, names)]
    cfg = kb.KVCacheConfig(num_blocks, tensors, [kb.KVCacheGroupSpec(names, spec)])
    pages = KVPages(cfg)
    with pytest.raises(kb.BlockIndexError, match="out of range"):
        pages.zero_blocks([num_blocks])
    with pytest.raises(kb.InvalidTypeError, match="integers"):
        pages.zero_blocks(torch.tensor([1.0]))
    with pytest.raises(kb.InvalidArgumentError, match="duplicate"):
        pages.copy_blocks([1, 2], [3, 3])
    with pytest.raises(kb.UnknownLayerError, match="no layer"):
        pages.kv_cache("nonsense")
    with pytest.raises(kb.InvalidArgumentError, match="layout"):
        KVPages(cfg, layout="XYZ")  # type: ignore[arg-type]
    with pytest.raises(kb.InvalidArgumentError, match="max_blocks"):
        block_table([[1]], -1)
    with pytest.raises(kb.IntOverflowError, match="int32"):
        block_table([[2**40]], 1)
    with pytest.raises(kb.InvalidTypeError, match="2-D"):
        slot_mapping(torch.zeros(3, dtype=torch.int32), [0], [1], BS)
