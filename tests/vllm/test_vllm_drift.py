"""The drift guard of `kvblocks.vllm.install()` (python/kvblocks/vllm/_drift.py).

The first part runs without vLLM: what the guard checks is what the code reads (the Rust
view and hasher read only the attributes `kvblocks._core` declares, the spec converters
only the fields `_config.py` declares). The second part needs vLLM (skipped where it is
absent) and runs in both vLLM environments: the real vLLM passes, and a faked drift of
each kind (version, Request attribute, RequestStatus value, swapped signatures, spec
field, manager method, event class) is refused with a message naming the version and the
mismatch, leaving vLLM untouched with `fallback=True` and raising with `fallback=False`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import importlib.util
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import kvblocks as kb
import pytest
from kvblocks import _core
from kvblocks.vllm import _config, _drift

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

ATTRIBUTES = dict(_core.VLLM_ATTRIBUTES_READ)


# --- Without vLLM: the declarations are what the code reads ------------------------------


def test_every_class_the_core_reads_has_a_home_in_the_guard() -> None:
    assert set(ATTRIBUTES) == set(_drift.CLASS_MODULES)
    assert all(isinstance(v, int) for _, v in _core.VLLM_REQUEST_STATUSES)


def look_alike(class_name: str, **values: Any) -> Any:
    """An object with exactly the attributes `kvblocks._core` declares for vLLM's
    `class_name` (slots: no instance dict, any other attribute is an AttributeError)."""
    names = ATTRIBUTES[class_name]
    assert set(values) == set(names)
    cls = type(class_name, (), {"__slots__": names})
    obj = cls()
    for name, value in values.items():
        setattr(obj, name, value)
    return obj


def vllm_like_request(rid: str, tokens: list[int]) -> Any:
    lora = look_alike("LoRARequest", lora_int_id=1, lora_name="a", lora_path="/a")
    position = look_alike("PlaceholderRange", offset=0, length=4)
    feature = look_alike("MultiModalFeatureSpec", identifier="img", mm_position=position)
    return look_alike(
        "Request",
        request_id=rid,
        _all_token_ids=list(tokens),
        block_hashes=[],
        status=1,
        skip_reading_prefix_cache=False,
        num_preemptions=0,
        num_prompt_tokens=len(tokens),
        num_computed_tokens=0,
        num_in_flight_tokens=0,
        shared_prefix_boundary=0,
        priority=0,
        session_id="s",
        cache_salt="salt",
        lora_request=lora,
        mm_features=[feature],
        prompt_embeds=None,
    )


def test_the_rust_view_and_hasher_read_only_the_declared_attributes() -> None:
    """A request exposing exactly the declared attributes (and LoRA and multimodal
    objects likewise) goes through hashing, lookup, allocation with events and a
    retention policy, and free: nothing else is read."""
    hasher = _core.RequestBlockHasher(16, "sha256_cbor")
    spec = kb.FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype="float16")
    config = kb.KVCacheConfig(20, [], [kb.KVCacheGroupSpec(["l"], spec)])
    manager = kb.KVCacheManager(
        config,
        1024,
        16,
        enable_kv_cache_events=True,
        log_stats=True,
        retention=kb.RetentionPolicy(session_s=30.0),
    )
    for rid in ("a", "b"):
        request = vllm_like_request(rid, list(range(40)))
        request.block_hashes.extend(hasher(request))
        assert len(request.block_hashes) == 2
        blocks, hit, _ = manager.find_cache_hit(request)
        assert hit == (0 if rid == "a" else 32)
        assert manager.allocate_slots(request, 40 - hit, hit, blocks) is not None
        request.num_computed_tokens = 40
        manager.free(request)
    assert any(isinstance(e, kb.BlockStored) for e in manager.take_events())


class Recorder:
    """A stand-in for one of vLLM's config objects, named `name`, recording the fields
    read: `values` for the names given, "x" for any other, and no optional field."""

    def __init__(self, name: str, read: list[tuple[str, str]], **values: Any) -> None:
        self.__class__ = type(name, (Recorder,), {})
        self._read = read
        self._values = values

    def __getattr__(self, field: str) -> Any:
        if field.startswith("_"):
            raise AttributeError(field)
        self._read.append((type(self).__name__, field))
        if field in _config.OPTIONAL_FIELDS:
            raise AttributeError(field)
        return self._values.get(field, "x")


@pytest.mark.parametrize("name", list(_config.SPECS))
def test_each_spec_converter_reads_its_declared_fields(name: str) -> None:
    read: list[tuple[str, str]] = []
    # "x" is no valid value: the conversion fails after reading every field.
    with pytest.raises((TypeError, ValueError)):
        _config.convert_spec(Recorder(name, read))
    fields = {f for _, f in read} - set(_config.OPTIONAL_FIELDS)
    assert fields == set(_config.SPECS[name][1])


def test_the_config_conversion_reads_only_declared_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read: list[tuple[str, str]] = []
    uniform = Recorder("UniformTypeKVCacheSpecs", read, block_size=16, kv_cache_specs={})
    with contextlib.suppress(ValueError):  # kvblocks may refuse an empty one
        _config.convert_spec(uniform)
    spec = kb.FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype="float16")
    monkeypatch.setattr(_config, "convert_spec", lambda _: spec)
    group = Recorder("KVCacheGroupSpec", read, layer_names=["l"], is_eagle_group=False)
    config = Recorder(
        "KVCacheConfig",
        read,
        kv_cache_groups=[group],
        num_blocks=8,
        prefix_cache_retention_interval=None,
    )
    _config.convert_config(config)
    for cls, field in read:
        assert field in _config.CONFIG_FIELDS[cls] or field in _config.OPTIONAL_FIELDS
    assert {c for c, _ in read} == set(_config.CONFIG_FIELDS)


def test_the_guard_checks_every_event_class_kvblocks_emits() -> None:
    emitted = {
        c for c in vars(_core).values() if isinstance(c, type) and hasattr(c, "__struct_fields__")
    }
    assert emitted == set(_drift._EVENTS)


def test_unsupported_vllm_error_is_in_the_exception_tree() -> None:
    import kvblocks.vllm

    cls = kvblocks.vllm.UnsupportedVLLMError
    assert issubclass(cls, kb.KVBlocksError)
    assert issubclass(cls, kb.UnsupportedError)
    assert issubclass(cls, NotImplementedError)


# --- With vLLM: the real one passes, each faked drift is refused -------------------------

vllm_only = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="needs vLLM importable"
)


@pytest.fixture
def fresh() -> Iterator[Any]:
    """kvblocks.vllm uninstalled, the guard's cached result and `fallbacks` cleared,
    before and after (monkeypatch restores vLLM's attributes afterwards)."""
    import kvblocks.vllm

    def clear() -> None:
        kvblocks.vllm.uninstall()
        _drift.mismatch.cache_clear()
        kvblocks.vllm.fallbacks.clear()

    clear()
    yield kvblocks.vllm
    clear()


@vllm_only
def test_the_installed_vllm_passes(fresh: Any) -> None:
    import vllm.v1.core.sched.scheduler as scheduler

    stock = scheduler.KVCacheManager
    assert _drift.mismatch() is None
    assert list(_drift._problems()) == []
    fresh.install(fallback=False)
    assert fresh.installed() and scheduler.KVCacheManager is not stock
    assert fresh.fallbacks == []


def fake_version(m: pytest.MonkeyPatch) -> str:
    import vllm
    from kvblocks.vllm._versions import SUPPORTED, supported_range

    major, minor = SUPPORTED[-1]
    m.setattr(vllm, "__version__", f"{major}.{minor + 1}.0")
    return f"vLLM {major}.{minor + 1}.0 is outside the supported range {supported_range()}"


def fake_old_version(m: pytest.MonkeyPatch) -> str:
    import vllm
    from kvblocks.vllm._versions import SUPPORTED, supported_range

    major, minor = SUPPORTED[0]
    m.setattr(vllm, "__version__", f"{major}.{minor - 1}.9+cpu")
    return f"vLLM {major}.{minor - 1}.9+cpu is outside the supported range {supported_range()}"


def version() -> str:
    import vllm

    return str(vllm.__version__)


def drop_request_attribute(m: pytest.MonkeyPatch) -> str:
    from vllm.v1.request import Request

    init = Request.__init__

    def renamed(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.num_computed_tokens_v2 = self.__dict__.pop("num_computed_tokens")

    m.setattr(Request, "__init__", renamed)
    return f"vLLM {version()}: Request has no attribute 'num_computed_tokens' (kvblocks reads it)"


def renumber_status(m: pytest.MonkeyPatch) -> str:
    import vllm.v1.request as request

    members = list(request.RequestStatus.__members__)
    members.insert(members.index("PREEMPTED"), "WAITING_FOR_SOMETHING_NEW")
    m.setattr(request, "RequestStatus", enum.IntEnum("RequestStatus", members))
    return f"vLLM {version()}: RequestStatus.PREEMPTED is 7, kvblocks compares with 6"


def extend_hasher(m: pytest.MonkeyPatch) -> str:
    import vllm.v1.core.kv_cache_utils as kv_cache_utils

    def get_request_block_hasher(
        hash_block_size: int, caching_hash_fn: Any, salt_all_blocks: bool = False
    ) -> Any:
        raise AssertionError("never called")

    m.setattr(kv_cache_utils, "get_request_block_hasher", get_request_block_hasher)
    return (
        f"vLLM {version()}: vllm.v1.core.kv_cache_utils.get_request_block_hasher takes "
        "'salt_all_blocks', which kvblocks' get_request_block_hasher does not accept"
    )


def rename_hasher_parameter(m: pytest.MonkeyPatch) -> str:
    import vllm.v1.engine.core as core

    def get_request_block_hasher(block_size: int, caching_hash_fn: Any) -> Any:
        raise AssertionError("never called")

    m.setattr(core, "get_request_block_hasher", get_request_block_hasher)
    return (
        f"vLLM {version()}: vllm.v1.engine.core.get_request_block_hasher takes 'block_size' "
        "at position 1, where kvblocks' get_request_block_hasher takes 'hash_block_size'"
    )


def drop_spec_field(m: pytest.MonkeyPatch) -> str:
    import vllm.v1.kv_cache_interface as interface

    real = interface.SlidingWindowSpec
    fields = [(f.name, Any) for f in dataclasses.fields(real) if f.name != "extra_retained_tokens"]
    m.setattr(interface, "SlidingWindowSpec", dataclasses.make_dataclass(real.__name__, fields))
    return (
        f"vLLM {version()}: SlidingWindowSpec has no field 'extra_retained_tokens' "
        "(kvblocks reads it)"
    )


def extend_manager_init(m: pytest.MonkeyPatch) -> str:
    import vllm.v1.core.sched.scheduler as scheduler

    class KVCacheManager(scheduler.KVCacheManager):  # type: ignore[misc]
        def __init__(
            self,
            kv_cache_config: Any,
            max_model_len: int,
            scheduler_block_size: int,
            hash_block_size: int,
            offload_tier: Any = None,
        ) -> None:
            raise AssertionError("never called")

    m.setattr(scheduler, "KVCacheManager", KVCacheManager)
    return (
        f"vLLM {version()}: vllm.v1.core.sched.scheduler.KVCacheManager.__init__ takes "
        "'offload_tier', which kvblocks' KVCacheManager does not accept"
    )


def extend_manager_method(m: pytest.MonkeyPatch) -> str:
    import vllm.v1.core.kv_cache_manager as kv_cache_manager

    class KVCacheManager(kv_cache_manager.KVCacheManager):  # type: ignore[misc]
        def free(self, request: Any, keep_blocks: bool = False) -> None:
            raise AssertionError("never called")

    m.setattr(kv_cache_manager, "KVCacheManager", KVCacheManager)
    return (
        f"vLLM {version()}: KVCacheManager.free takes 'keep_blocks', which kvblocks' "
        "KVCacheManager.free does not accept"
    )


def extend_coordinator_method(m: pytest.MonkeyPatch) -> str:
    import vllm.v1.core.kv_cache_coordinator as kv_cache_coordinator

    class KVCacheCoordinator(kv_cache_coordinator.KVCacheCoordinator):  # type: ignore[misc]
        def get_num_blocks_to_allocate(
            self,
            request_id: str,
            num_tokens: int,
            new_computed_blocks: Any,
            num_encoder_tokens: int,
            total_computed_tokens: int,
            num_local_computed_tokens: int,
            num_tokens_main_model: int,
            apply_admission_cap: bool = False,
            prefill_end: int = 0,
            pinned_blocks: int = 0,
        ) -> int:
            raise AssertionError("never called")

    m.setattr(kv_cache_coordinator, "KVCacheCoordinator", KVCacheCoordinator)
    return (
        f"vLLM {version()}: KVCacheCoordinator.get_num_blocks_to_allocate takes "
        "'pinned_blocks', which kvblocks' CoordinatorView.get_num_blocks_to_allocate does "
        "not accept"
    )


def require_event_field(m: pytest.MonkeyPatch) -> str:
    import msgspec
    import vllm.distributed.kv_events as kv_events

    class BlockRemoved(msgspec.Struct):  # type: ignore[misc]
        block_hashes: list[Any]
        evicted_by: str

    m.setattr(kv_events, "BlockRemoved", BlockRemoved)
    return (
        f"vLLM {version()}: kv_events.BlockRemoved requires 'evicted_by', which kvblocks' "
        "events lack"
    )


DRIFTS: list[Callable[[pytest.MonkeyPatch], str]] = [
    fake_version,
    fake_old_version,
    drop_request_attribute,
    renumber_status,
    extend_hasher,
    rename_hasher_parameter,
    drop_spec_field,
    extend_manager_init,
    extend_manager_method,
    extend_coordinator_method,
    require_event_field,
]


def vllm_objects() -> list[Any]:
    from kvblocks.vllm._install import _TARGETS

    return [getattr(importlib.import_module(m), n) for m, n in _TARGETS]


@vllm_only
@pytest.mark.parametrize("drift", DRIFTS, ids=lambda d: d.__name__)
def test_a_drift_is_refused_and_fallback_leaves_vllm_as_it_is(
    drift: Callable[[pytest.MonkeyPatch], str],
    fresh: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    message = drift(monkeypatch)
    before = vllm_objects()
    with caplog.at_level(logging.WARNING, logger="kvblocks.vllm"):
        fresh.install()
    assert not fresh.installed()
    assert all(a is b for a, b in zip(vllm_objects(), before, strict=True))
    assert fresh.fallbacks == [message]
    assert message in caplog.text
    with pytest.raises(fresh.UnsupportedVLLMError) as info:
        fresh.install(fallback=False)
    assert str(info.value) == message
    assert not fresh.installed()


@vllm_only
def test_the_plugin_falls_back_like_install(fresh: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvblocks.vllm import _install

    message = fake_version(monkeypatch)
    monkeypatch.setenv("KVBLOCKS_VLLM", "1")
    before = vllm_objects()
    _install.plugin()
    assert not fresh.installed()
    assert all(a is b for a, b in zip(vllm_objects(), before, strict=True))
    assert fresh.fallbacks == [message]


@vllm_only
def test_the_guard_runs_once_per_process(fresh: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its result is kept: a later install() does not look at vLLM again."""
    fresh.install()
    fresh.uninstall()
    fake_version(monkeypatch)
    fresh.install()
    assert fresh.installed() and fresh.fallbacks == []
